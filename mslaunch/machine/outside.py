"""The launcher out of its job's cgroup while the ranks run, back in before it
starts a process.

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

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Optional

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
