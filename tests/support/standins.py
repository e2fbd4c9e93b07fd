"""Stand-ins for the parts of a job that tests run in process without the real thing."""

from __future__ import annotations

from typing import List


class StandInGuard:
    """The orphan guard (:mod:`mslaunch.machine.guard`) without its watchdog's fork:
    what the supervisor and Open MPI mode's mpirun handle call on it.  It notes the
    process groups it was given and whether it was closed."""

    marker = "test"
    mechanism = "stand-in"

    def __init__(self) -> None:
        self.groups: List[int] = []
        self.closed = False

    def ready(self) -> None:
        pass

    def private(self, path: str) -> None:
        pass

    def add(self, pgid: int) -> None:
        self.groups.append(pgid)

    def flush(self) -> None:
        pass

    def step_out(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True
