"""What every attempt of one mslaunch run shares: its orphan guard, its console,
the agents kept between attempts, the PMIx server, and what the attempt loop
tells each attempt's supervisor of what may follow it.

A run of one attempt has a session too (nothing is kept then); so have the
nodes of an msrun job, whose link to the other nodes is the session's.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, Literal, Optional

    from ..machine.guard import Watchdog
    from ..machine.loop import Loop
    from ..machine.terminal import Console
    from ..core.states import Ending
    from .agents.keptagents import KeptAgents
    from .allocationend import AllocationEnd

    #: What may follow the attempt running: nothing, the job itself after its
    #: health check, or another attempt should it fail.
    Follows = Literal["none", "health", "restart"]

from ..core.states import RESTARTED_ENDINGS


class Session:
    """See the module docstring."""

    def __init__(self, guard: Watchdog, console: Console, *, loop: Optional[Loop] = None,
                 kept: Optional[KeptAgents] = None, attempts: bool = False,
                 rank_restarts: int = 0, wants_control: bool = True,
                 nodes: Any = None, allocation_end: Optional[AllocationEnd] = None) -> None:
        self.guard = guard
        self.console = console
        self.loop = loop                      # a caller's own loop (msrun's rendezvous ran on it)
        self.kept = kept                      # agents kept between attempts (None: one attempt)
        self.attempts = attempts              # more than one attempt may run
        #: The PMIx server the attempts share (see .pmixjobs): started by the first
        #: that serves PMIx, taken over by the next.
        self.pmix: Any = None
        self.follows: Follows = "none"
        self.rank_restarts = rank_restarts    # per process, on failure (msrun's recovery)
        self.wants_control = wants_control    # mslaunch-stacks and mslaunch-top may attach
        #: This node's link to the other nodes of a job run one command per node
        #: (msrun's), and its node service if it runs one: see .nodes.
        self.nodes = nodes
        #: Asks whether the job's allocation was ended by its workload manager
        #: (see .allocationend), at a lost host and at a stop signal.
        self.allocation_end = allocation_end
        #: Hydra's -outfile-pattern/-errfile-pattern files by path, made new once for
        #: the run and written by every attempt (see mslaunch.machine.output).
        self.shared_files: Dict[str, int] = {}

    def keeps_agents(self, ending: Optional[Ending], stop_signal: Optional[int]) -> bool:
        """Whether an attempt that ended so is followed by another (the job after its
        health check, or the next attempt): its agents wait for it."""
        if stop_signal is not None:
            return False
        return self.follows == "health" or (self.follows == "restart"
                                             and ending in RESTARTED_ENDINGS)

    def close(self) -> None:
        """The run is over: the kept agents go, and the shared PMIx server."""
        if self.kept is not None:
            self.kept.close()
        if self.pmix is not None:
            self.pmix.close()
            self.pmix = None
        for fd in self.shared_files.values():
            os.close(fd)
        self.shared_files.clear()
