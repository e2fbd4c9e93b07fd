"""Starting ranks on this machine.

Each rank leads its own process group, so signals reach its children too
and a terminal's Ctrl-C reaches only the launcher (the foreground group),
which forwards it.  Ranks stay in the launcher's session: with a session
each, the kernel's autogroup scheduler gives every rank a scheduling group
of its own, which made MPI start-up of 16 ranks on 2 cores about 25% slower.
As background process groups, ranks never read the terminal themselves: a
terminal stdin is relayed through a pipe (see the supervisor).  Exits are
watched through a pidfd, which the event loop polls like any other
descriptor; where there is none (:func:`open_pidfd`), the owner looks for
the exit every :data:`POLL_EXIT` seconds.

Ranks start with ``os.posix_spawn`` (vfork and exec in one call), which
spares the launcher the import of :mod:`subprocess`, a large part of a
short job's cost; a rank whose working directory is not the launcher's
starts through :mod:`.spawndir`, which has the child change directory (the
launcher never changes its own: its threads share it).  The child gets
exactly stdin, stdout, stderr and the descriptors the caller made
inheritable, and the write end of its life pipe (:func:`life_pipe`) at
:data:`LIFE_FD`; everything else the launcher holds is close-on-exec (see
:func:`seal_inherited_fds`).
"""

from __future__ import annotations

import os
from ..core import signal

from ..core.errors import SpawnError, os_error_reason  # both also re-exported

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Mapping, Optional, Sequence, Set, Tuple

    from ..core.spec import RankSpec

# Python ignores SIGPIPE (and SIGXFSZ); an ignored signal stays ignored across
# exec, so the ranks get the default actions back.
RESET_SIGNALS = tuple(getattr(signal, n) for n in ("SIGPIPE", "SIGXFSZ", "SIGXFZ")
                       if hasattr(signal, n))

#: The descriptor at which a rank holds its life pipe's write end (see
#: :func:`life_pipe`): high, so that the kernel closes it first at the exit.
LIFE_FD = 1023


def find_program(name: str, env: Mapping[str, str], cwd: str,
                 search: Sequence[str] = ()) -> Optional[str]:
    """Resolve ``name`` as exec would with the rank's PATH; None if not found.

    As Open MPI does, ``search`` (``-path``) is tried first and the rank's
    working directory last, so ``mpirun -n 2 prog`` runs ``./prog``.
    """
    if "/" in name:
        path = os.path.join(cwd, name)
        return path if os.access(path, os.X_OK) and not os.path.isdir(path) else None
    for d in list(search) + env.get("PATH", os.defpath).split(":") + [cwd]:
        path = os.path.join(cwd, d or ".", name)
        if os.access(path, os.X_OK) and not os.path.isdir(path):
            return path
    return None


def _not_a_directory(path: str) -> str:
    """Why ``path``, not a directory, cannot be a rank's working directory."""
    return "is not a directory" if os.path.lexists(path) else "does not exist"


def check_startable(ranks: Sequence[RankSpec]) -> None:
    """Fail before anything starts if a program or working directory is missing."""
    seen = set()
    for r in ranks:
        program = r.program or r.argv[0]
        key = (program, r.cwd, r.env.get("PATH"), r.search)
        if key in seen or not r.host.local:
            continue
        seen.add(key)
        whose = r.label or f"rank {r.rank}"      # (msrun mode's: "scheduler", "worker N")
        if not r.session_dir and not os.path.isdir(r.cwd):
            raise SpawnError(f"working directory {r.cwd!r} of {whose} "
                             f"{_not_a_directory(r.cwd)}")
        path = find_program(program, r.env, r.cwd, r.search)
        if path is None:
            raise SpawnError(f"program {program!r} of {whose} "
                             f"{_why_not_found(program, r.cwd)}")
        problem = _interpreter_problem(path, program)
        if problem:
            raise SpawnError(f"program {r.argv[0]!r} of {whose} {problem}")


def file_head(path: str) -> Optional[bytes]:
    """The first bytes of a file, as many as the kernel reads of a ``#!`` line (None
    when it cannot be read)."""
    try:
        with open(path, "rb") as f:
            return f.read(256)
    except OSError:
        return None


def _interpreter_problem(path: str, program: str) -> Optional[str]:
    """Why a script's ``#!`` line cannot start it, or None (not a script, or fine)."""
    head = file_head(path)
    if head is None:
        return None
    if not head.startswith(b"#!"):
        if program.endswith(".py") and not head.startswith(b"\x7fELF"):
            # The kernel refuses it (ENOEXEC); only a shell would try it, as sh.
            return (f"has no '#!' line to run it with: add '#!/usr/bin/env python3' as its "
                    f"first line, or name python (mslaunch [options] python {_quote(program)})")
        return None
    line = head[2:].split(b"\n", 1)[0]
    if line.endswith(b"\r"):
        # The kernel looks for an interpreter whose name ends in CR: "No such file".
        return (f"has a '#!' line ending in a carriage return (Windows line ends): "
                f"convert it (dos2unix {_quote(program)}) or name its interpreter")
    line = line.strip()
    if not line:
        return "has an empty '#!' line"
    interpreter = os.fsdecode(line.split()[0])
    if not os.access(interpreter, os.X_OK) or os.path.isdir(interpreter):
        return f"names the interpreter {interpreter!r} in its '#!' line, which does not exist"
    return None


def _quote(word: str) -> str:
    import shlex            # for error messages only: a job that starts never pays for it
    return shlex.quote(word)


def _why_not_found(program: str, cwd: str) -> str:
    """Why ``program`` cannot be run, and what to type, for the error line."""
    there = os.path.join(cwd, program)
    if os.path.isdir(there):
        return "is a directory"
    if not os.path.isfile(there):
        where = "" if "/" in program else " in PATH or the working directory"
        return f"not found{where} (or not executable)"
    import shlex
    try:
        with open(there, "rb") as f:
            binary = f.read(4) == b"\x7fELF"
    except OSError:
        binary = False
    word = shlex.quote(program)
    # A compiled program only needs its bit; a text file without '#!' is a shell script.
    return f"is not executable: chmod +x {word}" + (
        "" if binary else f", or name its interpreter (mslaunch [options] sh {word})")


def seal_inherited_fds() -> None:
    """Make descriptors above 2 that mslaunch inherited close-on-exec.

    posix_spawn passes every inheritable descriptor on; ranks should get only
    their standard streams and their PMI socket, as under mpirun.
    """
    try:
        fds = [int(fd) for fd in os.listdir("/proc/self/fd")]
    except OSError:
        return
    for fd in fds:
        if fd > 2:
            try:
                if os.get_inheritable(fd):
                    os.set_inheritable(fd, False)
            except OSError:
                pass


_sealed = False       # seal_inherited_fds has run for the helpers
_helpers: Set[int] = set()   # the helpers not yet reaped


def helper_pids() -> Set[int]:
    """The processes :class:`Helper` started that its waiter has not reaped."""
    return set(_helpers)


def wait_in_background(pid: int) -> None:
    """A child forked to work for the launcher: reaped by a thread of its own, and
    one of :func:`helper_pids` until then."""
    import threading

    def wait() -> None:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
        finally:
            _helpers.discard(pid)

    _helpers.add(pid)
    threading.Thread(target=wait, daemon=True, name=f"reap-{pid}").start()


def exec_path(name: str, env: Mapping[str, str]) -> Optional[str]:
    """``name`` as exec finds it: a name with a slash as it is, else the first
    executable along the environment's PATH (empty entries: here)."""
    if "/" in name:
        return name
    for folder in env.get("PATH", os.defpath).split(":"):
        path = os.path.join(folder or ".", name)
        if os.access(path, os.X_OK) and not os.path.isdir(path):
            return path
    return None


class Helper:
    """A process that works for the launcher (srun, an rsh command), in a session
    of its own: stdin from /dev/null (or a pipe that gives ``stdin``, then its
    end), stdout and stderr into one pipe, whose read end is :attr:`stdout`.
    Started with ``posix_spawn`` as the ranks are, so the launcher imports no
    :mod:`subprocess` before it.

    One thread waits for it (:meth:`wait`, which reaps it); :meth:`poll` only
    tells what that thread saw.  ``env`` None is this process's environment.
    """

    def __init__(self, argv: Sequence[str], env: Optional[Mapping[str, str]],
                 stdin: bytes = b"") -> None:
        global _sealed
        env = os.environ if env is None else env
        path = exec_path(argv[0], env) if argv else None
        if path is None:
            raise FileNotFoundError(2, "No such file or directory", argv[0] if argv else "")
        if not _sealed:
            # As subprocess's close_fds: nothing the launcher inherited goes on
            # (what it opens itself is close-on-exec already).
            seal_inherited_fds()
            _sealed = True
        r, w = os.pipe()
        if stdin:
            null, feed = os.pipe()
        else:
            null, feed = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC), -1
        try:
            from .cgroups import starting
            with starting():          # (a spare host's agent starts on a thread of its own)
                self.pid = os.posix_spawn(path, list(argv), env, setsid=True,
                                          setsigdef=RESET_SIGNALS, file_actions=[
                                              (os.POSIX_SPAWN_DUP2, null, 0),
                                              (os.POSIX_SPAWN_DUP2, w, 1),
                                              (os.POSIX_SPAWN_DUP2, w, 2)])
        except BaseException:
            os.close(r)
            if feed >= 0:
                os.close(feed)
            raise
        finally:
            os.close(w)
            os.close(null)
        if feed >= 0:
            try:
                os.write(feed, stdin)      # (a few bytes: within the pipe's buffer)
            except OSError:
                pass                       # it ended already: its end tells why
            os.close(feed)
        self.stdout = open(r, "rb")
        self.returncode: Optional[int] = None
        _helpers.add(self.pid)

    def wait(self) -> int:
        """Wait for its end: its exit status, or minus the signal that ended it."""
        try:
            _, status = os.waitpid(self.pid, 0)
        except ChildProcessError:
            # Reaped by someone else (the guard's sweep skips helpers): its
            # status is gone, as subprocess also takes it.
            status = 0
        finally:
            _helpers.discard(self.pid)
        self.returncode = -os.WTERMSIG(status) if os.WIFSIGNALED(status) \
            else os.WEXITSTATUS(status)
        return self.returncode

    def poll(self) -> Optional[int]:
        return self.returncode


#: Seconds between two looks for the exit of a process without a pidfd.
POLL_EXIT = 0.05


def open_pidfd(pid: int) -> int:
    """A pidfd of ``pid``, a child of this process not yet reaped; -1 where there is
    none to be had: Python 3.8 (an agent's), a kernel before 5.3 (ENOSYS), or a
    sandbox whose system-call filter predates the call (EPERM, as older
    container runtimes' default profiles answer). The child is still this
    process's to wait for, so its owner then polls :func:`os.waitpid`."""
    if not hasattr(os, "pidfd_open"):
        return -1
    try:
        return os.pidfd_open(pid)
    except OSError:
        return -1


def life_pipe() -> Optional[Tuple[int, int]]:
    """A pipe (read end, write end) whose write end a rank holds at :data:`LIFE_FD`;
    None where the open-file limit is below it.

    A dying process's descriptors are released after its memory, in the
    reverse of their order (the kernel queues each last close and runs the
    queue last first, yielding the CPU between two), and its parent hears of
    its exit only after all of them: on a busy machine the sockets of a rank
    that crashed may close milliseconds before its exit is seen, and a peer
    on another host that died of it may be seen to die first.  The end of
    this pipe, closed before every descriptor below it (all of a rank's but
    for one that holds over a thousand), dates its death."""
    limit = os.sysconf("SC_OPEN_MAX")
    if 0 <= limit <= LIFE_FD:
        return None
    r, w = os.pipe()
    if w == LIFE_FD:             # the copy must be a new descriptor to lose close-on-exec
        w, old = os.dup(w), w
        os.close(old)
    return r, w


class LocalProcess:
    """One rank running on this machine."""

    def __init__(self, spec: RankSpec, env: Mapping[str, str], *, stdin: int, stdout: int,
                 stderr: int, life: Optional[int] = None) -> None:
        """``life``: the write end of the rank's :func:`life_pipe`, if any."""
        program = spec.program or spec.argv[0]
        path = find_program(program, env, spec.cwd, spec.search) or program
        dup2s: Tuple[Tuple[int, int], ...] = ((stdin, 0), (stdout, 1), (stderr, 2))
        if life is not None:
            dup2s += ((life, LIFE_FD),)
        try:
            if spec.cpus:
                self.pid = _spawn_bound(spec, path, env, dup2s)
            else:
                self.pid = _spawn(spec, path, env, dup2s)
        except OSError as err:
            if not os.path.isdir(spec.cwd):      # gone since check_startable
                raise SpawnError(f"working directory {spec.cwd!r} of rank {spec.rank} "
                                 f"{_not_a_directory(spec.cwd)}") from None
            raise SpawnError(f"cannot start rank {spec.rank} ({spec.argv[0]}): "
                             f"{os_error_reason(err)}") from None
        self.pgid = self.pid
        self._status: Optional[int] = None
        self.pidfd = open_pidfd(self.pid)     # (-1: the owner polls exited())

    def signal(self, sig: int) -> bool:
        """Send ``sig`` to the rank's process group; False if the group is gone."""
        try:
            os.killpg(self.pgid, sig)
            return True
        except (ProcessLookupError, PermissionError):
            return False

    def group_alive(self) -> bool:
        """Whether a process of the rank's group still runs (zombies do not count).

        A zombie left by an exited rank stays in the group until init reaps
        it, which can take a while; the slow check runs only in that case.
        """
        if not self.signal(0):
            return False
        return any_live_member(self.pgid)

    def exited(self) -> bool:
        """Collect the exit status if the rank has exited (without waiting)."""
        if self._status is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self._status = status
        return self._status is not None

    def reap(self) -> Tuple[Optional[int], Optional[int]]:
        """Collect the exit status: (exit code, None) or (None, signal number)."""
        status = self._status
        if status is None:
            _, status = os.waitpid(self.pid, 0)
        if self.pidfd >= 0:
            os.close(self.pidfd)
            self.pidfd = -1
        return exit_of(status)


def exit_of(status: int) -> Tuple[Optional[int], Optional[int]]:
    """A wait status as (exit code, None) or (None, signal number)."""
    if os.WIFSIGNALED(status):
        return None, os.WTERMSIG(status)
    return os.WEXITSTATUS(status), None


def _spawn(spec: RankSpec, path: str, env: Mapping[str, str],
           dup2s: Tuple[Tuple[int, int], ...]) -> int:
    if not is_launch_dir(spec.cwd):
        # os.posix_spawn cannot start a child elsewhere, and the launcher's own
        # directory is its threads' too: the child changes directory itself.
        from .spawndir import spawn_in
        return spawn_in(spec.cwd, path, spec.argv, env, dup2s=dup2s, session=spec.session,
                        sigdef=RESET_SIGNALS)
    actions = [(os.POSIX_SPAWN_DUP2, fd, target) for fd, target in dup2s]
    # A new session is a new process group as well (both: setpgid fails, EPERM).
    group = {"setsid": True} if spec.session else {"setpgroup": 0}
    return os.posix_spawn(path, list(spec.argv), env, file_actions=actions,
                          setsigdef=RESET_SIGNALS, **group)


def is_launch_dir(cwd: str) -> bool:
    """Whether ``cwd`` is the launcher's working directory, as named (False when
    the launcher's has been removed)."""
    try:
        return os.getcwd() == cwd
    except OSError:
        return False


def _spawn_bound(spec: RankSpec, path: str, env: Mapping[str, str],
                 dup2s: Tuple[Tuple[int, int], ...]) -> int:
    """Like :func:`_spawn`, with the rank's CPU affinity set before it runs.

    A child inherits the affinity of the thread that creates it, so the
    spawning thread takes the rank's CPU set for the instant of the spawn
    (the launcher's other threads keep theirs: affinity is a thread's own).
    """
    saved = os.sched_getaffinity(0)
    os.sched_setaffinity(0, spec.cpus)  # type: ignore[arg-type]
    try:
        return _spawn(spec, path, env, dup2s)
    finally:
        os.sched_setaffinity(0, saved)


def any_live_member(pgid: int) -> bool:
    """True if a process of group ``pgid`` is alive and not a zombie."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return True
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != b"Z":
            return True
    return False


def signal_name(sig: int) -> str:
    """``SIGTERM`` for 15 (without the signal module's enum)."""
    for name in dir(signal):
        if name.startswith("SIG") and not name.startswith("SIG_") \
                and getattr(signal, name) == sig:
            return name
    return f"signal {sig}"


def how_ended(code: Optional[int], sig: Optional[int]) -> str:
    """``exited with code N`` or ``was killed by signal N (NAME)``."""
    if sig is not None:
        return f"was killed by signal {sig} ({signal_name(sig)})"
    return f"exited with code {code}"


def raise_fd_limit(needed: int) -> None:
    """Lift the soft open-file limit towards ``needed`` (each rank holds ~6 fds)."""
    # sysconf says the soft limit (-1: none) without the resource module, a C
    # module of its own to load: most jobs need no more than they have.
    if not 0 <= os.sysconf("SC_OPEN_MAX") < needed:
        return
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            pass
