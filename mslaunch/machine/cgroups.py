"""The job's cgroup (cgroup v2): made beside the launcher's own, moved into and
out of, emptied and removed; the cgroups of dead jobs found and removed; and
the launcher out of its job's cgroup while the ranks run (:class:`Outside`).

The launcher enters the job's cgroup so that whatever it starts is born
inside (:mod:`.guard`), and it must leave it before it can remove it.  Each
move of a process between cgroups waits for the kernel (an RCU grace period:
6 to 23 ms on 2 cores, 15 to 31 ms on 16; longer the more CPUs), and the
last one was on the launcher's way out, after its last rank.  So once a
job's processes are started, the launcher leaves on a thread of its own,
while they run, and comes back before it starts anything more (a restart, a
spawned job's ranks, a host's agent, a helper):

- its own thread that asked it to leave (the loop's) starts processes after
  an audit hook of this interpreter's saw them coming (``os.posix_spawn``,
  ``os.fork``, ``subprocess.Popen`` and their kin; :mod:`.spawndir`'s C
  library spawn says it is one), and the hook brings it back first;
- a start on another thread (a spare host's agent, a look at the stacks)
  is inside :func:`starting`, which brings it back and keeps it in
  until that start is made: a move out never runs beside it.

A move back that fails (the cgroup gone: a launcher of another pid
namespace took it for stale) leaves the start outside; the guard's other
nets (the marker, the rank groups) still hold it.  A process forked from
the launcher forgets all this: it is not the launcher.
"""

from __future__ import annotations

import _thread
import os
import sys
import time

from ..core import signal
from ..core.switches import switch
from .procs import exists, send_signal

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Optional, Set, Tuple


def _cgroup2_mount() -> Optional[str]:
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                if right.split(" ", 1)[0] == "cgroup2":
                    return left.split()[4]
    except OSError:
        pass
    return None


def _own_cgroup() -> Optional[str]:
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                if line.startswith("0::"):
                    return line[3:].strip()
    except OSError:
        pass
    return None


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


class JobCgroup:
    """A cgroup v2 directory holding every process of the job (but the watchdog)."""

    def __init__(self, path: str, home: str) -> None:
        self.path = path
        self.home = home          # the cgroup the launcher came from

    @classmethod
    def create(cls, marker: str, launcher: int, watchdog: int) -> Optional[JobCgroup]:
        """Make the job's cgroup beside this process's own, or None if not allowed.

        Its name, ``mslaunch-<launcher pid>-w<watchdog pid>-n<pid namespace>-<marker>``,
        tells a stale cgroup from a live job's (see :func:`remove_stale`).
        """
        if not switch("MSLAUNCH_CGROUP"):
            return None
        mount, own = _cgroup2_mount(), _own_cgroup()
        if mount is None or own is None:
            return None
        home = os.path.normpath(mount + "/" + own)
        path = os.path.join(home, f"mslaunch-{launcher}-w{watchdog}-n{_pid_namespace()}-"
                                  f"{marker}")
        try:
            os.mkdir(path, 0o755)
        except OSError:
            return None
        return cls(path, home)

    def move(self, pid: int, into: bool) -> bool:
        """Move process ``pid`` into the cgroup (its future children follow), or
        back to the one the job's came from; whether it could."""
        try:
            _write(os.path.join(self.path if into else self.home, "cgroup.procs"), str(pid))
            return True
        except OSError:
            return False

    def leave(self, pid: int) -> bool:
        """Move process ``pid`` back to the cgroup the job's came from."""
        return self.move(pid, False)

    def enter(self, pid: int) -> bool:
        """Move process ``pid`` into the new cgroup; it is removed if that fails."""
        if self.move(pid, True):
            return True
        self.remove()
        return False

    def pids(self) -> Set[int]:
        try:
            with open(os.path.join(self.path, "cgroup.procs")) as f:
                return {int(p) for p in f.read().split()}
        except (OSError, ValueError):
            return set()

    def kill(self) -> None:
        try:
            _write(os.path.join(self.path, "cgroup.kill"), "1")
        except OSError:
            for pid in self.pids():
                send_signal(pid, signal.SIGKILL)

    def remove(self, wait: float = 0.0) -> None:
        deadline = time.monotonic() + wait
        while True:
            try:
                os.rmdir(self.path)
                return
            except FileNotFoundError:
                return
            except OSError:
                if time.monotonic() >= deadline:
                    return
                time.sleep(0.02)


def _pid_namespace() -> int:
    """This process's pid namespace (its inode): pids mean something only inside it."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def _stale_name(name: str) -> Optional[Tuple[int, int, int]]:
    """(creator pid, watchdog pid, pid namespace) of a job cgroup's name, or None."""
    parts = name.split("-", 4)
    if len(parts) < 5 or parts[0] != "mslaunch" or not parts[4] or not parts[1].isdigit() \
            or parts[2][:1] != "w" or not parts[2][1:].isdigit() \
            or parts[3][:1] != "n" or not parts[3][1:].isdigit():
        return None
    return int(parts[1]), int(parts[2][1:]), int(parts[3][1:])


def remove_stale(home: str) -> None:
    """Empty and remove job cgroups whose creator and watchdog both died.

    Such a cgroup (``mslaunch-<creator pid>-w<watchdog pid>-n<namespace>-<marker>``)
    has nobody left to stop what is in it; while either pid lives it is
    someone's, so it is left alone.  The pids are checked only for cgroups
    made in this pid namespace: a launcher in another one (a container, an
    ``unshare --pid``) shares the cgroup tree but not the pids, and its job
    must not look dead from here -- unless its cgroup has stayed empty for
    :data:`FOREIGN_EMPTY` seconds: a live job's watchdog renews its cgroup's
    time of change more often than that (its ranks may all have ended, its
    launcher out, while other hosts' still run), but a launcher that was pid 1 of its namespace
    takes its watchdog with it when it exits, and nobody is left to remove
    what the watchdog would have.
    """
    try:
        names = os.listdir(home)
    except OSError:
        return
    namespace = _pid_namespace()
    for name in names:
        found = _stale_name(name)
        if found is None or not namespace:
            continue
        stale = JobCgroup(os.path.join(home, name), home)
        if found[2] != namespace:
            if not _empty_for(stale, FOREIGN_EMPTY):
                continue
        elif exists(found[0]) or exists(found[1]):
            continue
        _remove_tree(stale)


#: Seconds a job cgroup made in another pid namespace stays empty before it is
#: taken for stale (see :func:`remove_stale`).
FOREIGN_EMPTY = 60.0


def _empty_for(cgroup: JobCgroup, seconds: float) -> bool:
    """Whether ``cgroup`` and those inside it hold no process, and it was made (or
    last changed) ``seconds`` ago or more."""
    try:
        if time.time() - os.stat(cgroup.path).st_mtime < seconds:
            return False
        inner = [e.path for e in os.scandir(cgroup.path) if e.is_dir(follow_symlinks=False)]
    except OSError:
        return False
    return not cgroup.pids() and not any(JobCgroup(path, cgroup.path).pids() for path in inner)


def _remove_tree(stale: JobCgroup) -> None:
    """Empty and remove a stale job cgroup and the cgroups inside it (an older
    mslaunch made each restart's cgroup inside the previous attempt's)."""
    try:
        inner = [e.name for e in os.scandir(stale.path) if e.is_dir(follow_symlinks=False)]
    except OSError:
        inner = []
    for name in inner:
        _remove_tree(JobCgroup(os.path.join(stale.path, name), stale.path))
    if stale.pids():
        stale.kill()
        stale.remove(wait=0.5)
    else:
        stale.remove()


# ---------------------------------------------------------------------------
# out while the ranks run

#: The audit events of a process start: what comes before it in the interpreter
#: (``os.posix_spawnp`` says ``os.posix_spawn``).
STARTS = frozenset({"os.posix_spawn", "os.fork", "os.forkpty", "subprocess.Popen",
                    "os.system", "os.spawn", "pty.spawn"})


class Outside:
    """The launcher's way out of the job's cgroup and back.  ``move(pid,
    into)`` moves a process into the job's cgroup (``into``) or back to the
    one it came from, and says whether it could."""

    def __init__(self, move: Callable[[int, bool], bool]) -> None:
        self.move = move
        # Reentrant: a signal handler that starts a process, run while a move
        # holds it on the same thread, would wait for itself otherwise.
        self.lock = _thread.RLock()
        self.out = False           # the launcher is out
        self.pending = False       # a move out is asked for and not made yet
        self.starts = 0            # starts being made on other threads (starting)
        self.closed = False        # the cgroup is about to go: no move from now on

    def leave(self) -> None:
        """Have a thread of its own move the launcher out; returns at once."""
        with self.lock:
            if self.out or self.pending or self.closed:
                return
            self.pending = True
        _watch(self)
        try:
            _thread.start_new_thread(self._leave, ())
        except RuntimeError:          # no thread to be had: stay inside
            with self.lock:
                self.pending = False

    def _leave(self) -> None:
        with self.lock:
            if self.pending and not self.starts and not self.closed:
                self.out = self.move(os.getpid(), False)
            self.pending = False

    def back(self) -> None:
        """Be inside again before a start: a move out not yet made is called
        off, one being made is waited for and undone."""
        with self.lock:
            self.pending = False
            if self.out and not self.closed and self.move(os.getpid(), True):
                self.out = False

    def enter_start(self) -> None:
        """Before a start made on a thread other than the one that asks the
        launcher to leave: inside, and no move out until :meth:`end_start`."""
        with self.lock:
            self.back()
            self.starts += 1

    def end_start(self) -> None:
        with self.lock:
            self.starts -= 1

    def stay_out(self) -> bool:
        """No move from now on (the cgroup is about to go); whether the
        launcher is out."""
        with self.lock:
            self.closed = True
            return self.out


_current: Optional[Outside] = None     # the one whose launcher may leave


def _watch(outside: Outside) -> None:
    global _current
    if _current is None:
        sys.addaudithook(_before_start)
        os.register_at_fork(after_in_child=_forget)
    _current = outside


def _forget() -> None:
    global _current
    _current = None


def _before_start(event: str, args: object) -> None:
    if event in STARTS and _current is not None and (_current.out or _current.pending):
        _current.back()


class _Starting:
    """See :func:`starting`."""

    def __init__(self, outside: Optional[Outside]) -> None:
        self.outside = outside

    def __enter__(self) -> None:
        if self.outside is not None:
            self.outside.enter_start()

    def __exit__(self, *exc: object) -> None:
        if self.outside is not None:
            self.outside.end_start()


def starting() -> _Starting:
    """Around a start made off the launcher's own thread (see the module
    docstring): the launcher inside, and kept there until the start is made."""
    return _Starting(_current)
