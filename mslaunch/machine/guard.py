"""The guard against orphans: no rank, and nothing a rank started, outlives the job.

Three mechanisms, strongest first:

* **A cgroup of the job** (cgroup v2, where this process may create one
  under its own): the launcher forks its watchdog, then moves itself into
  a new cgroup, so every process started from then on -- ranks, their
  children, daemons that called ``setsid`` and cleared their environment --
  is in it and cannot leave it.  Each move between cgroups waits for the
  kernel (an RCU grace period, milliseconds): the watchdog makes the first
  while the launcher plans, and once the job's processes are started the
  launcher leaves again while they run (:mod:`.cgroups`: it comes back
  before it starts anything more).  At the job's end the launcher, out,
  removes the job's cgroup, now empty; what is left there the watchdog
  empties with ``cgroup.kill`` and removes.  So the cgroup is gone with the
  job even where the watchdog is killed with the launcher (a scheduler
  ending a whole step).
* **Child subreaper** (when no cgroup can be made): descendants orphaned
  during the job are re-parented to the launcher instead of init, so it
  sees and stops them; the watchdog keeps a list of them in case the
  launcher is killed.
* **The guard's marker** ``MSLAUNCH_GUARD`` in each rank's environment
  and the rank process groups, as a last net.  The marker names one guard
  (the launcher's, or one host's agent), not the job, so that the agent of
  one host never sweeps another host's ranks, even where hosts share a
  process table.

The watchdog is a small fork of the launcher in its own session, made before
the first rank starts.  The launcher tells it, over a pipe, the process
group of every rank, and what its owner keeps for a clean-up (the
kvsname of every PMI job, say).  When the pipe reaches end-of-file without
the final ``done`` line, the launcher died abruptly (SIGKILL, say): the
watchdog terminates everything of the job (SIGCONT and SIGTERM, SIGKILL
after the grace period) and then calls its owner's ``on_death`` hook with
what was kept, and with what its ``on_stop`` hook found in the job's
processes while they were stopped (before any of them was told to end).
After ``done`` it only empties and removes the cgroup (if the launcher did
not) and sweeps the marker, off the job's critical path.  The owner may also hand it
named tasks to run off that path (its ``tasks`` hook).

The guard knows no MPI: those hooks are passed in by its owner.  Finding
and stopping the processes (``/proc``, signals) is done by :mod:`.procs`.
"""

from __future__ import annotations

import os
from ..core import signal
import time

from .cgroups import FOREIGN_EMPTY, JobCgroup, remove_stale
from .procs import alive, children_of, descendants, marked_pids, send_signal, start_time
from .procs import remove_private, terminate, wait_gone

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Set

    from .cgroups import Outside

    #: Named tasks the watchdog runs when told (``Watchdog.task``).
    Tasks = Mapping[str, Callable[[str], object]]
    #: Called in the watchdog after the job was stopped because the launcher
    #: died, with what was kept (``Watchdog.keep``) and the guard's marker.
    OnDeath = Callable[[Sequence[str], str], None]
    #: Called in the watchdog with the job's processes, all stopped (SIGSTOP),
    #: when the launcher died and before they are terminated; what it returns
    #: is kept too, for ``OnDeath``.
    OnStop = Callable[[Set[int]], Sequence[str]]

_IGNORED = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGPIPE",
            "SIGTSTP", "SIGTTIN", "SIGTTOU", "SIGALRM")
_PR_SET_CHILD_SUBREAPER = 36


def set_subreaper() -> bool:
    """Make this process the child subreaper of its descendants."""
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


_PR_SET_PDEATHSIG = 1


def end_with(caller: int) -> None:
    """This process gets SIGTERM when ``caller``, its parent, dies (the Python
    API's caller: a job must not outlive it); at once if it has died already."""
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if os.getppid() != caller:      # (gone before the call above could see it go)
        os.kill(os.getpid(), signal.SIGTERM)


# ---------------------------------------------------------------------------
# the watchdog process

def _settle(parent: int, marker: str, answer_fd: int) -> Optional[JobCgroup]:
    """Put the launcher into a new job cgroup (the watchdog itself stays out) and
    tell it where, or that there is none, through ``answer_fd``.

    The first move of a process into a new cgroup waits for the kernel (an
    RCU grace period: 5 to 20 ms), as long as a small job's whole launch;
    the launcher goes on planning meanwhile and waits for the answer only
    before its first rank starts.
    """
    cgroup = JobCgroup.create(marker, parent, os.getpid())
    if cgroup is not None and os.getppid() != parent:
        # The launcher is gone already (a line that asked for no job): its pid
        # could name another process by now, which must not be moved.
        cgroup.remove()
        cgroup = None
    if cgroup is not None and not cgroup.enter(parent):
        cgroup = None
    try:
        os.write(answer_fd, (cgroup.path if cgroup is not None else "").encode() + b"\n")
    except OSError:
        pass
    os.close(answer_fd)
    return cgroup


def _collector_back() -> None:
    """The watchdog lives as long as the job: Python's garbage collector, which the
    launch may hold off (:func:`mslaunch.machine.loop.hold_collector`), runs in it."""
    from .loop import release_collector
    release_collector()


def _detach(read_fd: int, answer_fd: int) -> None:
    """The watchdog lets go of what it shares with the launcher, the pipes apart."""
    # Still in the launcher's process group until the setsid that follows: a ^C
    # meant for the launcher must not end its watchdog meanwhile.
    for name in _IGNORED:
        signal.signal(getattr(signal, name), signal.SIG_IGN)
    # The launcher's descriptors go first: a reader of its output (``$(mslaunch
    # --version)``) waits for the end of every copy, and the move into the
    # cgroup waits for the kernel.
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    for low, high in sorted(((3, min(read_fd, answer_fd)),
                             (min(read_fd, answer_fd) + 1, max(read_fd, answer_fd)),
                             (max(read_fd, answer_fd) + 1, 1 << 16))):
        os.closerange(low, high)


class _Heard:
    """What the launcher has told its watchdog so far, line by line."""

    def __init__(self, grace: float, tasks: Tasks) -> None:
        self.grace = grace
        self.tasks = tasks
        self.done = False
        self.poll_children = False
        self.groups: Set[int] = set()
        self.kept: List[str] = []
        self.private: List[str] = []    # the job's control socket and dump directories
        self.adopted: Dict[int, Optional[int]] = {}   # pid -> start time, orphans adopted

    def take(self, line: bytes) -> None:
        kind, arg = line[:1], line[1:]
        if line == b"done":
            self.done = True
        elif kind == b"+":
            self.groups.add(int(arg))
        elif kind == b"-":
            self.groups.discard(int(arg))
        elif kind == b"k":
            self.kept.append(arg.decode())
        elif kind == b"c":
            self.private.append(arg.decode())
        elif kind == b"g":
            self.grace = float(arg)
        elif kind == b"s":
            self.poll_children = True
        elif kind == b"t":
            name, _, value = arg.decode().partition(" ")
            if name in self.tasks:
                self.tasks[name](value)
        elif kind == b"p":
            number, _, started = arg.partition(b" ")
            self.adopted[int(number)] = int(started) if started.isdigit() else None


def _listen(read_fd: int, parent: int, cgroup: Optional[JobCgroup], heard: _Heard) -> None:
    """Read the launcher's lines until ``done`` or the pipe's end (the launcher died)."""
    import select
    buf = b""
    while not heard.done:
        if heard.poll_children:
            # Without a cgroup, remember what the launcher adopted as a
            # subreaper, so that it can be found should the launcher die.
            for pid in children_of(parent):
                if pid not in heard.adopted and pid not in heard.groups:
                    heard.adopted[pid] = start_time(pid)
            ready, _, _ = select.select([read_fd], [], [], 0.25)
            if not ready:
                continue
        elif cgroup is not None:
            ready, _, _ = select.select([read_fd], [], [], FOREIGN_EMPTY / 3)
            if not ready:
                # The job's cgroup may be empty a while (see remove_stale).
                try:
                    os.utime(cgroup.path)
                except OSError:
                    pass
                continue
        try:
            data = os.read(read_fd, 4096)
        except OSError:
            data = b""
        if not data:
            return
        buf += data
        *lines, buf = buf.split(b"\n")
        for line in lines:
            heard.take(line)


def _watch(read_fd: int, parent: int, marker: str, grace: float, answer_fd: int,
           tasks: Tasks, on_death: Optional[OnDeath], on_stop: Optional[OnStop]) -> None:
    _detach(read_fd, answer_fd)
    cgroup: Optional[JobCgroup] = _settle(parent, marker, answer_fd)
    # After the move, which the launcher waits for: where the scheduler groups
    # each session of its own (autogroup), a new session waits for the kernel too
    # (up to some milliseconds).
    os.setsid()
    if cgroup is not None:
        remove_stale(cgroup.home)       # (of dead launchers: not on the launcher's way)
    heard = _Heard(grace, tasks)
    _listen(read_fd, parent, cgroup, heard)
    live = [pid for pid, started in heard.adopted.items() if start_time(pid) == started]
    if heard.done:
        # The launcher saw every rank end; group ids may already name someone
        # else's group, so only the cgroup, the marker and the leftovers the
        # launcher handed over count now.  A launcher that could not leave the
        # cgroup is waited for first.
        if cgroup is not None and parent in cgroup.pids():
            wait_gone(parent, 30.0)
        if cgroup is not None and not cgroup.pids() - {parent}:
            cgroup.remove(wait=2.0)       # the usual end: nothing left inside
        else:
            terminate((), marker, heard.grace, cgroup, live, spare=(parent,))
    else:
        # The pipe's end comes as the launcher's files close, before the kernel
        # hands its children on; a rank stopped below before that would make its
        # process group an orphaned one with a stopped member, which the kernel
        # sends SIGHUP (and SIGCONT): wait until the launcher is gone.
        wait_gone(parent, 5.0)
        kept = heard.kept
        terminate(heard.groups, marker, heard.grace, cgroup, live,
                  stopped=None if on_stop is None else lambda pids: kept.extend(on_stop(pids)))
    if cgroup is not None:
        # Job cgroups beside this one whose launcher and watchdog both died (killed
        # together, as a scheduler kills a whole step) go too, as a new job's
        # guard removes them when it makes its own.
        remove_stale(cgroup.home)
    # The job's control socket and its Python ranks' dumps go at its end too,
    # here rather than on the launcher's way out: removing a directory waits for
    # the file system (milliseconds while another process writes to the disk).
    for path in heard.private:
        remove_private(path)
    if not heard.done and on_death is not None:
        on_death(heard.kept, marker)


class Watchdog:
    """Launcher side of the guard; see the module docstring."""

    def __init__(self, marker: str, grace: float, *, background: bool = False,
                 tasks: Optional[Tasks] = None, on_death: Optional[OnDeath] = None,
                 on_stop: Optional[OnStop] = None) -> None:
        self.marker = marker
        read_fd, self._fd = os.pipe()
        answer_r, answer_w = os.pipe()
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(answer_r)
                _collector_back()
                _watch(read_fd, parent, marker, grace, answer_w, tasks or {}, on_death,
                       on_stop)
            finally:
                os._exit(0)
        os.close(read_fd)
        os.close(answer_w)
        self.pid = pid
        self._pending: List[str] = []
        self.cgroup: Optional[JobCgroup] = None
        self.subreaper = False
        self._answer = answer_r
        self._outside: Optional[Outside] = None
        if not background:
            self.ready()

    def ready(self) -> None:
        """Return once this process is in the job's cgroup (or a subreaper): before
        the first rank starts, so that it starts inside (see :func:`_settle`)."""
        if self._answer < 0:
            return
        answer = b""
        while not answer.endswith(b"\n"):
            try:
                chunk = os.read(self._answer, 4096)
            except InterruptedError:
                continue
            except OSError:
                chunk = b""
            if not chunk:
                break
            answer += chunk
        os.close(self._answer)
        self._answer = -1
        path = answer.strip().decode()
        if path:
            self.cgroup = JobCgroup(path, os.path.dirname(path))
        else:
            self.subreaper = set_subreaper()
            if self.subreaper:
                self._pending.append("s\n")
        self.flush()

    @property
    def mechanism(self) -> str:
        self.ready()
        return "cgroup" if self.cgroup else ("subreaper" if self.subreaper else "marker")

    def add(self, pgid: int) -> None:
        """Note a rank group; sent at the next :meth:`flush` (one write, one wake-up)."""
        self._pending.append(f"+{pgid}\n")

    def remove(self, pgid: int) -> None:
        self._pending.append(f"-{pgid}\n")

    def task(self, name: str, arg: str) -> None:
        """Have the watchdog run its task ``name`` with ``arg`` (off the job's path)."""
        self._pending.append(f"t{name} {arg}\n")

    def set_grace(self, grace: float) -> None:
        """The grace between SIGTERM and SIGKILL from now on (a guard made before
        its job said what the job's is)."""
        # Written at once, not with the next flush: that one waits for the cgroup.
        if self._fd >= 0:
            try:
                os.write(self._fd, f"g{float(grace)!r}\n".encode())
            except OSError:
                pass

    def keep(self, item: str) -> None:
        """Keep ``item`` for the ``on_death`` hook, should the launcher die."""
        self._pending.append(f"k{item}\n")

    def private(self, path: str) -> None:
        """Have the watchdog remove ``path`` (a socket, or a directory of this
        user's) once the job is over, or should the launcher die (see
        :func:`mslaunch.run.attempt.open_control`)."""
        # Written at once: a launcher may die before its first flush.
        if self._fd >= 0:
            try:
                os.write(self._fd, f"c{path}\n".encode())
            except OSError:
                pass

    def flush(self) -> None:
        # Groups not yet sent when the launcher dies are still found by the
        # cgroup or the environment marker, so batching costs no safety.
        self.ready()
        if self._fd >= 0 and self._pending:
            try:
                os.write(self._fd, "".join(self._pending).encode())
            except OSError:
                pass
        self._pending.clear()

    def leftovers(self, ranks: Iterable[int] = ()) -> Set[int]:
        """Processes of the job other than this one, its watchdog, ``ranks`` and the
        launcher's helpers (an rsh agent, an SSH helper) with what they started."""
        from .spawn import helper_pids
        self.ready()
        me = os.getpid()
        helpers = helper_pids()
        skip = {me, self.pid, *ranks, *helpers}
        if self.cgroup is not None:
            found = self.cgroup.pids()
        else:
            found = set(children_of(me)) - helpers | marked_pids(self.marker)
            found |= descendants(found)
        if helpers:
            skip |= descendants(helpers)
        return {p for p in found - skip if alive(p)}

    def reap_adopted(self, ranks: Iterable[int]) -> None:
        """Collect the exit status of adopted orphans (as a subreaper) so no zombie stays."""
        from .spawn import helper_pids
        skip = {self.pid, *ranks, *helper_pids()}     # helpers have a waiter of their own
        for pid in children_of(os.getpid()):
            if pid not in skip:
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass

    def sweep(self, grace: float) -> None:
        """End what a finished run of the job left behind (see :meth:`leftovers`):
        SIGCONT and SIGTERM, SIGKILL after ``grace`` s.  A job started again
        (``--max-restarts``) keeps its guard, and with it its cgroup, for every
        attempt: what one attempt left must be gone before the next starts."""
        pids = self.leftovers()
        if not pids:
            return
        for pid in pids:
            send_signal(pid, signal.SIGCONT)
            send_signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while pids and time.monotonic() < deadline:
            time.sleep(0.02)
            self.reap_adopted(())
            pids = self.leftovers()
        for pid in pids:
            send_signal(pid, signal.SIGKILL)
        if pids:
            deadline = time.monotonic() + 2.0
            while self.leftovers() and time.monotonic() < deadline:
                time.sleep(0.02)
                self.reap_adopted(())
        self.reap_adopted(())

    def step_out(self) -> None:
        """The job's processes are started: this process leaves the job's cgroup
        while they run, and comes back before it starts another (:mod:`.cgroups`)."""
        self.ready()
        if self.cgroup is None:
            return
        if self._outside is None:
            from .cgroups import Outside
            self._outside = Outside(self.cgroup.move)
        self._outside.leave()

    def _out(self) -> bool:
        """This process out of the job's cgroup, for good (it is about to go)."""
        assert self.cgroup is not None
        if self._outside is not None and self._outside.stay_out():
            return True
        return self.cgroup.leave(os.getpid())

    def release(self, pid: int) -> None:
        """A helper of the launcher that is to outlive the job's end (a question
        still out) leaves the job's cgroup, which is emptied at the end, with
        what it started; helpers are never the subreaper's leftovers."""
        if self.cgroup is not None:
            for each in (pid, *descendants([pid])):
                self.cgroup.leave(each)

    def forgo(self) -> None:
        """No job runs under this guard, and this process is about to exit
        (a guard started before the command line was read, which then asked for
        no job): the watchdog removes the cgroup once this process is gone.
        Nothing is waited for here, where :meth:`close` would wait for both moves."""
        if self._fd < 0:
            return
        try:
            os.write(self._fd, b"done\n")
        except OSError:
            pass
        os.close(self._fd)
        self._fd = -1
        if self._answer >= 0:
            os.close(self._answer)
            self._answer = -1

    def close(self) -> None:
        """Normal end: this process leaves the job's cgroup and removes it, or the
        watchdog empties it of what is left and removes it.

        It is not waited for; if the launcher outlives it, the zombie goes
        with the launcher's own exit.
        """
        if self._fd < 0:
            return
        self.ready()
        if self.cgroup is None:
            # Without a cgroup, what the launcher adopted as a subreaper would
            # be re-parented to init when it exits: hand it over.
            self._pending = [f"p{pid} {start_time(pid)}\n" for pid in self.leftovers()]
        elif self._out() and not self.cgroup.pids():
            self.cgroup.remove()         # (what is left, the watchdog ends and removes)
        self._pending.append("done\n")
        self.flush()
        os.close(self._fd)
        self._fd = -1
