"""Which failure of a job is its cause, and what followed it.

Every end of a rank that fails the job (a non-zero exit or a signal,
``MPI_Abort``, a rank gone without ``MPI_Finalize``, a lost host) comes with
the time it happened: when the loop that watches it (here, or a remote
host's agent) was woken by it, less the time the loop then waited for a CPU
(:meth:`mslaunch.machine.loop.Loop.events_at`), or when the rank's
descriptors began to close, if that came first
(:func:`mslaunch.machine.spawn.life_pipe`); an ``MPI_Abort`` of Open MPI
when the PMIx library took it, before the rank could go.  A remote host's
times are put on the launcher's clock with the offset read from the link
(:func:`mslaunch.backends.agents.host.clock_offset`); a lost host's time is
when its loss was noticed, not when it was last heard from: a silent host
may have lived on until then, and a death another agent reported meanwhile
came first.  The reports of several hosts arrive in
any order: a rank killed on one host is often reported after the
``MPI_Abort`` of a peer on another host that lost its connection to it.

So the job's cause is the earliest failure that happened before the job was
stopped, whenever its report came; those after the stop are its doing and
are not counted; the others are what followed, named after it.  One more
rule for what a clock cannot settle: a rank's death or exit is seen by its
own host only when that host's agent runs, and on a busy host a peer's
``MPI_Abort`` over its broken connection (the usual way an MPI rank reacts
to a dead peer) has been seen to be stamped up to 11 ms before the death it
reacts to.  An ``MPI_Abort`` less than :data:`VICTIM_WINDOW` before another
rank's death, exit or loss is taken for that rank's victim, not its cause;
so is one before a death its host saw after the job's stop was sent and
before that stop reached it.  Such a death was seen late (its host's agent
was not running, and reads its ranks' ends before it heeds the stop), and
its time says only that it came before the stop.  A death by SIGPIPE is a
reaction as an ``MPI_Abort`` is: a write to a pipe or socket whose reader, a
peer, has just died, often seen in the same wake-up as that death.
"""

from __future__ import annotations

from ..core import signal

from ..core.errors import STALL_EXIT, TIMEOUT_EXIT
from ..core.states import OUTPUT, REMOTE, SIGNAL, STALL, TIMEOUT
from ..machine.spawn import signal_name
from ..core.spec import JobResult

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import List, Optional, Tuple

    from ..core.spec import RankResult
    from ..core.states import Ending
    from ..seams import RankState

    #: (when, rank, exit code, a reaction (MPI_Abort, SIGPIPE), may be the cause, seen late)
    Seen = Tuple[float, RankState, int, bool, bool, bool]

#: How many of the failures that followed the cause are named.
FOLLOWED_SHOWN = 3
#: An MPI_Abort this much (seconds) or less before another rank's death is its victim's.
VICTIM_WINDOW = 0.25


class Failures:
    """The failures of one job, by the time they happened."""

    __slots__ = ("seen", "root", "root_code", "root_at", "stopped_at")

    def __init__(self) -> None:
        self.seen: List[Seen] = []
        self.root: Optional[RankState] = None
        self.root_code = 0
        self.root_at = 0.0
        self.stopped_at: Optional[float] = None

    def note(self, rank: RankState, code: int, at: float, counts: bool,
             abort: bool = False, stop_reached: Optional[float] = None,
             grace: float = 0.0, lost: bool = False) -> None:
        """``rank`` failed at ``at`` (by ``MPI_Abort``: ``abort``); with ``counts``
        it may be the job's cause (it ends the job, or any does: keep-going).
        ``stop_reached``: when the job's stop reached the rank's host (None: not
        yet); a failure after that may be the stop's doing, and is not noted,
        unless it is a death by a signal the stop had not sent (SIGKILL comes
        ``grace`` seconds after SIGTERM): that one was only seen late.
        ``lost``: the rank was lost with its host, at when that was noticed,
        which is never a late sight of an earlier end."""
        sig = rank.signal
        if stop_reached is not None and at >= stop_reached and (
                sig is None or sig == signal.SIGTERM
                or (sig == signal.SIGKILL and at >= stop_reached + grace)):
            return
        # A rank's end after its own MPI_Abort is still that abort.
        abort = abort or sig == signal.SIGPIPE or any(s[1] is rank and s[3] for s in self.seen)
        late = stop_reached is None and self.stopped_at is not None and not lost
        self.seen.append((at, rank, code, abort, counts, late))
        self._choose()

    def _choose(self) -> None:
        counted = sorted((s for s in self.seen if s[4]), key=lambda s: s[0])
        if not counted:
            return
        first = counted[0]
        # the death an abort first may have been the victim of (see the module's text)
        death = next((s for s in counted if not s[3]
                      and (s[0] - first[0] < VICTIM_WINDOW or s[5])), None)
        if first[3] and death is not None:
            first = death
        self.root, self.root_at, self.root_code = first[1], first[0], first[2]

    def stopped(self, at: float) -> None:
        """The job was stopped at ``at``: what fails after that is its doing."""
        if self.stopped_at is None:
            self.stopped_at = at

    def followed(self) -> List[Tuple[float, RankState]]:
        """The other ranks that failed before the stop, each once, in order, with
        how long after the cause (seconds; negative for a victim seen before it)."""
        firsts: List[Tuple[float, RankState]] = []
        for at, rank, *_ in sorted(self.seen, key=lambda s: s[0]):
            if rank is not self.root and all(r is not rank for _, r in firsts):
                firsts.append((at - self.root_at, rank))
        return firsts


def ended_result(ending: Optional[Ending], stop_signal: Optional[int],
                 remote: Optional[Tuple[int, str]], results: Tuple[RankResult, ...]) -> JobResult:
    """The result of a job whose end was not a rank's failure: its exit status
    by how it ended (none: it ran to its end), and mslaunch's line, if any."""
    message = ""
    if ending == SIGNAL and stop_signal is not None:
        code, message = 128 + stop_signal, f"mslaunch: stopped by {signal_name(stop_signal)}"
    elif ending == REMOTE and remote is not None:
        code = remote[0]
    elif ending in (TIMEOUT, OUTPUT):
        code = TIMEOUT_EXIT if ending == TIMEOUT else 1
    elif ending == STALL:
        code = STALL_EXIT
    else:
        code, ending = 0, None
    return JobResult(exit_code=code, ranks=results, message=message, ending=ending)
