"""Agents started on a job's spare hosts in a thread, while its ranks start.

A spare host (no rank in this attempt) of a job that may start again never
delays the start: its agent starts here, beside the ranks, through the job's
starter (one whose :meth:`start` may run in a thread), and the fleet hands it
the job when it answers (:meth:`~.fleet.Fleet.start_spares`).  One still
starting when an attempt ends goes on starting, kept with the waiting agents
(:mod:`.keptagents`), for the next attempt.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Optional

    from ...machine.loop import Loop
    from .starters.starter import Starter

from ...core.errors import HostsFailed
from .starters.starter import let_go


class Spares:
    """Agents being started on spare hosts in a thread (see :meth:`Fleet.start_spares`),
    across attempts if need be."""

    __slots__ = ("names", "thread", "read_end", "halted", "conns", "failed", "_loop")

    def __init__(self, starter: Starter, names: List[str], cancelled: Callable[[], bool]) -> None:
        import threading
        self.names = list(names)
        self.read_end, write_end = os.pipe()      # readable (its end) once done
        self.halted = False
        self.conns: Dict[str, Any] = {}
        self.failed: Dict[str, str] = {}
        self._loop: Optional[Loop] = None

        def run() -> None:
            try:
                conns = dict(starter.start(names, cancelled=lambda: self.halted or cancelled()))
                if self.halted:          # (given up on meanwhile: nobody takes them)
                    for conn in conns.values():
                        let_go(conn)
                else:
                    self.conns = conns
            except HostsFailed as err:
                self.conns, err.started = dict(err.started), {}
                self.failed = dict(err.failed)
            except BaseException as err:       # stopped, or the starter's own failure
                if not self.halted:
                    self.failed = {name: str(err) for name in names}
            finally:
                os.close(write_end)

        self.thread = threading.Thread(target=run, name="mslaunch-spares", daemon=True)
        self.thread.start()

    def watch(self, loop: Loop, done: Callable[[], None]) -> None:
        """Call ``done`` on ``loop`` once the agents are started (or not)."""
        if self.read_end >= 0:
            self._loop = loop
            loop.add_reader(self.read_end, done)

    def unwatch(self) -> None:
        if self._loop is not None and self.read_end >= 0:
            self._loop.forget(self.read_end)
        self._loop = None

    def finish(self) -> Dict[str, Any]:
        """Wait for the agents (at most the starter's own timeout); those started."""
        self.thread.join()
        return self._taken()

    def halt(self) -> Dict[str, Any]:
        """Stop starting (the starter gives up within its poll); the agents started."""
        self.halted = True
        self.thread.join(5.0)
        return self._taken()

    def _taken(self) -> Dict[str, Any]:
        self.unwatch()
        if self.read_end >= 0:
            os.close(self.read_end)
            self.read_end = -1
        conns, self.conns = self.conns, {}
        return conns
