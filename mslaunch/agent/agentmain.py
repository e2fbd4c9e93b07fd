"""The agent's entry, as the bootstrap calls it: the host's guard first, then
the rest of the agent.

The guard moves the agent into a cgroup of the job's own, whose first entry
waits for the kernel (an RCU grace period: 5 to 20 ms, more on a busy host),
and the ranks' start waits for that.  Begun before the agent's other modules
are imported (some 5 ms of a host's CPU), it is ready that much sooner.  Only
what the guard needs is imported here; the rest of the agent, when it runs
from the host's own copy of the package, from that copy's code cache
(:mod:`mslaunch.machine.codecache`).
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, List, Optional

from ..mpi.pmi.files import is_kvsname, job_guard, public_id

if TYPE_CHECKING:
    from ..machine.guard import Watchdog


def new_guard(kvsname: str, grace: float) -> Watchdog:
    """This host's guard for the job ``kvsname``; its marker names the job and
    this agent."""
    return job_guard(f"{public_id(kvsname)}.{os.getpid()}", grace)


def begin(job: str, kept: List[Watchdog]) -> Callable[[str], int]:
    """Start the guard of the job ``job`` (its greeting's name, if any), then
    import the agent; what runs it.

    An agent that does not import (the host's copy of the package) leaves its
    guard in ``kept``, the bootstrap's, for the next :func:`begin` (from the
    launcher's package): a second guard of the same marker would, once the
    first was closed, end the job's ranks with it."""
    guard: Optional[Watchdog] = kept.pop() if kept else None
    if guard is None and is_kvsname(job):
        guard = new_guard(job, 5.0)
    from ..machine import codecache
    if os.path.isfile(codecache.__file__):     # (the host's copy, not the bundle in memory)
        codecache.start()
    try:
        from .agent import main
        from ..machine.loop import at_first_wait
    except BaseException:
        codecache.stop()
        if guard is not None:
            kept.append(guard)
        raise
    at_first_wait(codecache.stop)
    return lambda named: main(named, guard, new_guard, codecache.save)
