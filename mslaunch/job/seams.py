"""The seams of the job layer, named as ``typing.Protocol`` classes.

Modules import this one only inside ``if TYPE_CHECKING:`` blocks: it costs
nothing at run time, and the pieces around the supervisor (the fleet of
remote hosts, the PMI job set, the reports) name what they use of it here
instead of importing it.
"""

from __future__ import annotations

from typing import Any, Container, Dict, List, Optional, Protocol, Sequence, Set, Tuple

from ..machine.guard import Watchdog
from ..machine.loop import Loop
from ..machine.output import RankOutput
from ..machine.terminal import Console
from ..spec import JobSpec, Plan, RankSpec


class RankHandle(Protocol):
    """Ranks of one place: this machine (:class:`~mslaunch.machine.local.LocalRanks`),
    one remote host's agent (:class:`~mslaunch.remote.host.RemoteHost`), or Open
    MPI's mpirun standing for all of them (:class:`~mslaunch.job.openmpi.MpirunHandle`)."""

    @property
    def ranks(self) -> Container[int]:
        """The keys of its ranks."""

    @property
    def busy(self) -> bool:
        """A rank runs, or output or an exit is still to come."""

    def start(self) -> None:
        """Start the ranks (a remote host: those its agent was prepared with)."""

    def signal(self, sig: int, ranks: Optional[Sequence[int]] = None) -> None:
        """Send ``sig`` to the process groups of ``ranks`` (default: all)."""

    def release(self) -> None:
        """The job is over: let go without waiting (an agent is told BYE)."""

    def close(self, deadline: float) -> None:
        """Nothing of these ranks may survive; wait until ``deadline`` at most."""


class ModeHooks(Protocol):
    """What a mode built on the supervisor adds to it: one node of an msrun-mode
    job (:class:`mslaunch.msrun.node.Cluster`), or the Open MPI-backed mode's
    mpirun (:class:`mslaunch.job.openmpi.Delegate`)."""

    restarts: int               # per process, on failure (msrun's recovery)
    takes_all: bool             # its handle starts every rank, remote ones too (srun's)

    def local_handle(self, sup: JobView, specs: Sequence[RankSpec]) -> Optional[RankHandle]:
        """The handle of this machine's processes ``specs``, started by the mode
        itself; None: the supervisor's own (:class:`~mslaunch.machine.local.LocalRanks`)."""

    def started(self, pids: Dict[str, int]) -> None:
        """Every process runs (by label)."""

    def failed(self, code: int, message: str) -> None:
        """The job ends here with ``code`` (msrun: the other nodes must stop too)."""

    def finished(self, code: int) -> None:
        """This machine's part ended with ``code``."""


class RankState(Protocol):
    """The supervisor's bookkeeping of one rank."""

    spec: RankSpec
    pid: int
    outputs: List[RankOutput]
    code: Optional[int]
    signal: Optional[int]
    reason: str
    ended: bool
    pmi_lost: bool
    discarded: bool
    restarts: int
    last_end: str
    started_at: float           # monotonic; 0.0 until it runs
    ended_at: float
    last_output: Optional[float]   # when its output last grew, to a few seconds

    @property
    def failed(self) -> bool: ...

    @property
    def tail(self) -> bytes: ...


class JobView(Protocol):
    """What the fleet, the PMI job set and the reports use of the supervisor."""

    job: JobSpec
    plan: Plan
    console: Console
    loop: Loop
    ending: Optional[str]
    launched: bool
    stop_signal: Optional[int]
    restarts: int
    watchdog: Optional[Watchdog]
    mpi_jobs: Any
    failures: Any           # .failures.Failures: the cause, and what followed
    control: Optional[Tuple[Any, str]]    # the control socket and its path, if any
    # what the attempts of a job run with --max-restarts share (None: one attempt)
    carry: Optional[Dict[str, Any]]

    @property
    def ranks(self) -> Sequence[RankState]: ...

    @property
    def hosts(self) -> Dict[str, Any]: ...

    @property
    def lookers(self) -> Dict[str, Any]: ...

    @property
    def spoken_for(self) -> Set[int]: ...

    def log(self, message: str) -> None: ...

    def make_sinks(self, spec: RankSpec) -> Any: ...

    def replanned(self, plan: Plan) -> None: ...

    def fail(self, rank: RankState, reason: str, code: int, *, abort: bool,
             at: Optional[float] = None, mpi_abort: bool = False) -> None: ...

    def rank_started(self, key: int, pid: int) -> None: ...

    def rank_exited(self, key: int, code: Optional[int], sig: Optional[int],
                    at: Optional[float] = None) -> None: ...

    def ranks_lost(self, keys: Any, reason: str, at: Optional[float] = None,
                   blameless: bool = False) -> None: ...

    def host_paused(self, name: str) -> None: ...

    def add_ranks(self, specs: Sequence[RankSpec]) -> None: ...

    def abandon(self, keys: Sequence[int]) -> None: ...

    def start_local(self, specs: Sequence[RankSpec], pmi: Any, pmi_env: Any) -> None: ...
