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

from ..core.errors import LaunchError, one_line, os_error_reason
from .common import Exit, is_deepspeed, is_msrun, is_torchrun_like


def _ensure_std_fds() -> None:
    """Open /dev/null on any of fds 0-2 that mslaunch was started without.

    Otherwise the first pipe mslaunch creates would land on, say, fd 1, and
    its output or a rank's stdin would go to the wrong place.
    """
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)


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
#: (name, whose, module).  Each module has ``command(argv)``: the job to run,
#: or the exit status of a job it ran itself; it is imported only when chosen.
#: A new dialect is one module and its line here.
DIALECTS: Tuple[Tuple[str, Callable[[Sequence[str]], bool], str], ...] = (
    ("deepspeed", is_deepspeed, "mslaunch.cli.deepspeed"),
    ("torchrun", _torchrun, "mslaunch.cli.torchrun"),
    ("msrun", is_msrun, "mslaunch.cli.msrun"),
    ("mpirun", _anything, "mslaunch.cli.mpirun"),
)


def _read(argv: Sequence[str]) -> Union[JobSpec, int]:
    """The first dialect that takes the command line reads it (and may run it)."""
    module = next(module for _name, whose, module in DIALECTS if whose(argv))
    command: Callable[[Sequence[str]], Union[JobSpec, int]] = __import__(
        module, fromlist=["command"]).command
    return command(argv)


def main(argv: Optional[Sequence[str]] = None,
         run: Optional[Callable[[JobSpec], int]] = None) -> int:
    """Entry point of the ``mslaunch`` command; returns the exit status."""
    argv = sys.argv[1:] if argv is None else argv
    _ensure_std_fds()
    try:
        try:
            from ..core.switches import check_switches
            check_switches(os.environ)
            job = _read(argv)
            if isinstance(job, int):
                return job
        except Exit as done:
            sys.stdout.write(done.text)
            return done.status
        if job.verbose >= 2 or "mslaunch.core.liblogs" in sys.modules:   # (a job run before)
            from ..core.liblogs import set_verbosity
            set_verbosity(job.verbose)
        if run is None:
            from ..run.launch import run_job
            return run_job(job)
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
