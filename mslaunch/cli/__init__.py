"""The command line: dialects of the launchers mslaunch replaces.

:mod:`.mpirun` reads Open MPI's and MPICH Hydra's spellings into a
:class:`~mslaunch.core.spec.JobSpec`, :mod:`.msrun` MindSpore's msrun's; which
one reads a command line is said once, in :data:`DIALECTS`.  :func:`main` is the only place that catches
:class:`~mslaunch.core.errors.LaunchError`: it prints one line and exits with the
error's code.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Optional, Sequence, Tuple, Union

    from ..core.spec import JobSpec
    from ..machine.guard import Watchdog

    #: A job's name and its orphan guard, made before its command line was read.
    Guarded = Tuple[str, Watchdog]

from ..core.errors import LaunchError, one_line, os_error_reason
from .common import Exit, is_deepspeed, is_msrun, is_torchrun_like


def _ensure_std_fds() -> None:
    """Open /dev/null on any of fds 0-2 that mslaunch was started without.

    Otherwise the first pipe mslaunch creates would land on, say, fd 1, and
    its output or a rank's stdin would go to the wrong place.  Python, started
    so, has no ``sys.stdout`` (or ``sys.stderr``): it gets one, on /dev/null.
    """
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
    if sys.stdout is None:
        sys.stdout = open(1, "w", closefd=False)
    if sys.stderr is None:
        sys.stderr = open(2, "w", closefd=False)


def _say(done: Exit) -> int:
    """What a line that asks for no job prints (its help, the version) and its
    status.  Into a closed pipe (``mslaunch --help | true``) it ends quietly, as
    a process that SIGPIPE ended would."""
    try:
        sys.stdout.write(done.text)
        sys.stdout.flush()
    except BrokenPipeError:
        from ..core import signal
        return 128 + signal.SIGPIPE
    return done.status


def _print_error(message: str) -> None:
    # One line, whatever the input held: control characters are escaped.
    text = one_line(message, len(message))
    try:
        sys.stderr.write(f"mslaunch: error: {text}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def _anything(argv: Sequence[str]) -> bool:
    return True


def _torchrun(argv: Sequence[str]) -> bool:
    if not is_torchrun_like(argv):       # (the dialect's module is not imported)
        return False
    from .torchrun import is_torchrun
    return is_torchrun(argv)


#: The dialects, asked in this order whether a command line is theirs:
#: (name, whose, module, always a job).  Each module has ``command(argv)``: the
#: job to run, or the exit status of a job it ran itself; it is imported only
#: when chosen.  "Always a job": it never runs one itself, so the command's
#: orphan guard may start before the line is read (:func:`_guard_first`).  A
#: new dialect is one module and its line here.
DIALECTS: Tuple[Tuple[str, Callable[[Sequence[str]], bool], str, bool], ...] = (
    ("deepspeed", is_deepspeed, "mslaunch.cli.deepspeed", True),
    ("torchrun", _torchrun, "mslaunch.cli.torchrun", False),
    ("msrun", is_msrun, "mslaunch.cli.msrun", False),
    ("mpirun", _anything, "mslaunch.cli.mpirun", True),
)


def _dialect(argv: Sequence[str]) -> Tuple[str, bool]:
    """The module of the first dialect that takes the command line, and whether it
    always gives a job to run."""
    return next((module, job) for _name, whose, module, job in DIALECTS if whose(argv))


def _read(module: str, argv: Sequence[str]) -> Union[JobSpec, int]:
    """The dialect's ``module`` reads the command line (and may run its job)."""
    command: Callable[[Sequence[str]], Union[JobSpec, int]] = __import__(
        module, fromlist=["command"]).command
    return command(argv)


def _guard_first() -> Optional[Guarded]:
    """The job's name and its orphan guard, started before the command line is read:
    the guard's watchdog moves this process into the job's cgroup, which waits for
    the kernel (an RCU grace period: 1 to 30 ms, more with more CPUs), while the
    line is read and the job planned, rather than after."""
    from ..mpi.pmi.files import job_guard, new_kvsname, public_id
    kvsname = new_kvsname()
    try:
        # (the grace is the job's once its line is read, before anything starts)
        return kvsname, job_guard(public_id(kvsname), 0.0)
    except OSError:
        return None        # (no process to be had now: a job's own start says so)


def main(argv: Optional[Sequence[str]] = None,
         run: Optional[Callable[[JobSpec], int]] = None, command: bool = False) -> int:
    """Entry point of the ``mslaunch`` command; returns the exit status.  ``command``:
    called as the command itself, which exits once this returns."""
    argv = sys.argv[1:] if argv is None else argv
    _ensure_std_fds()
    early: Optional[Guarded] = None
    try:
        try:
            from ..core.switches import check_switches
            check_switches(os.environ)
            module, always_a_job = _dialect(argv)
            if command and always_a_job and run is None:
                early = _guard_first()
            job = _read(module, argv)
            if isinstance(job, int):
                return job
        except Exit as done:
            return _say(done)
        if job.verbose >= 2 or "mslaunch.core.liblogs" in sys.modules:   # (a job run before)
            from ..core.liblogs import set_verbosity
            set_verbosity(job.verbose)
        if run is None:
            from ..run.launch import run_job
            return run_job(job, early)
        return run(job)
    except LaunchError as err:
        _print_error(str(err))
        return err.exit_code
    except KeyboardInterrupt:
        return 130
    except OSError as err:
        # The machine said no (descriptors, memory, a vanished directory):
        # one line, not a traceback.
        where = f" ({err.filename})" if err.filename else ""
        _print_error(f"{os_error_reason(err)}{where}")
        return 1
    except Exception as err:
        # A bug of mslaunch's: still one line (MSLAUNCH_TRACEBACK=1 shows where).
        if os.environ.get("MSLAUNCH_TRACEBACK") == "1":
            raise
        _print_error(f"internal error: {type(err).__name__}: {err} (a bug in mslaunch; "
                     f"MSLAUNCH_TRACEBACK=1 shows where)")
        return 1
    finally:
        if early is not None:
            # (closed if its job ran; else the line asked for none: the command exits)
            early[1].forgo()
