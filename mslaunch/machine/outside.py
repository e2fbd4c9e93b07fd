"""The launcher out of its job's cgroup while the ranks run, back in before it
starts any process.

The launcher enters the job's cgroup so that whatever it starts is born
inside (:mod:`.guard`), and at the job's end it must leave it before it can
remove it.  Each move of a process between cgroups waits for the kernel (an
RCU grace period: 6 to 23 ms on 2 cores, 15 to 31 ms on 16, longer the more
CPUs), and the last one was on the launcher's way out, after its last rank.
So once a job's processes are started, the launcher leaves on a thread of
its own, while the ranks run.  Should it start anything later (a restart, a
spawned job's ranks, a host's agent, a helper), it first comes back: an
audit hook sees every process start of this interpreter's (``os.posix_spawn``,
``os.fork``, ``subprocess.Popen`` and their kin, and :mod:`.spawndir`'s
C-library spawn, which says it is one) before it happens, and waits for the
move back in.  No process of the launcher's is born outside the cgroup.
"""

from __future__ import annotations

import _thread
import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Optional, Tuple

#: The audit events of a process start: what comes before it in the interpreter.
STARTS = frozenset({"os.posix_spawn", "os.posix_spawnp", "os.fork", "os.forkpty",
                    "subprocess.Popen", "os.system", "os.exec", "os.spawn", "pty.spawn"})


class Outside:
    """The launcher's way out of the job's cgroup and back.  ``move(pid,
    into)`` moves a process into the job's cgroup (``into``) or back to the
    one it came from, and says whether it could."""

    def __init__(self, move: Callable[[int, bool], bool]) -> None:
        self.move = move
        self.lock = _thread.allocate_lock()
        self.out = False              # the launcher left (the last move out ended)
        self._leaving: Optional[Tuple[object, list]] = None  # (its end, its outcome)

    def leave(self) -> None:
        """Begin leaving, on a thread of its own; at once."""
        with self.lock:
            if self.out or self._leaving is not None:
                return
            _watch(self)
            ended = _thread.allocate_lock()
            ended.acquire()
            outcome: list = []

            def run() -> None:
                try:
                    outcome.append(self.move(os.getpid(), False))
                finally:
                    ended.release()
            try:
                _thread.start_new_thread(run, ())
            except RuntimeError:          # no thread to be had: stay inside
                return
            self._leaving = (ended, outcome)

    def settle(self) -> bool:
        """Wait for a move out begun; whether the launcher is out."""
        with self.lock:
            self._settle()
            return self.out

    def _settle(self) -> None:
        if self._leaving is not None:
            ended, outcome = self._leaving
            ended.acquire()           # type: ignore[attr-defined]
            self._leaving = None
            self.out = bool(outcome and outcome[0])

    def stay_out(self) -> bool:
        """The move out waited for, and no move back in from now on (the
        cgroup is about to go); whether the launcher is out."""
        with self.lock:
            self._settle()
            out, self.out = self.out, False
            return out

    def back(self) -> None:
        """Be inside again, before a process starts."""
        with self.lock:
            self._settle()
            if self.out and self.move(os.getpid(), True):
                self.out = False


_current: Optional[Outside] = None     # the one whose launcher may be out


def _watch(outside: Outside) -> None:
    global _current
    if _current is None:
        sys.addaudithook(_before_start)
    _current = outside


def _before_start(event: str, args: object) -> None:
    if event in STARTS and _current is not None and (_current.out or _current._leaving):
        _current.back()
