"""The seams of the job layer, named as ``typing.Protocol`` classes.

Modules import this one only inside ``if TYPE_CHECKING:`` blocks: it costs
nothing at run time, and the pieces around the supervisor (the fleet of
remote hosts, the PMI job set, the reports) name what they use of it here
instead of importing it.
"""

from __future__ import annotations

from typing import (Any, Callable, Collection, Container, Dict, List, Mapping, Optional, Protocol,
                    Sequence, Set, Tuple)

from .machine.guard import Watchdog
from .machine.loop import Loop
from .machine.output import RankOutput
from .machine.stdin import StdinFanout
from .machine.terminal import Console
from .core.spec import JobSpec, Plan, RankSpec
from .core.states import Ending

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .machine.local import PMIEnv


class Closable(Protocol):
    def close(self) -> None: ...


class RankHandle(Protocol):
    """Ranks of one place: this machine (:class:`~mslaunch.machine.local.LocalRanks`),
    one remote host's agent (:class:`~mslaunch.backends.agents.host.RemoteHost`), srun's step
    (:class:`~mslaunch.backends.srunsteps.srunranks.SrunRanks`) or Open MPI's mpirun standing for
    all of them (:class:`~mslaunch.backends.mpirun.openmpi.MpirunHandle`)."""

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


class RankEvents(Protocol):
    """A rank handle's one way back to the supervisor (which is never handed out):
    what it reports of its ranks, and what it is lent to run them.  A handle
    reports each rank's start and end once; a handle that feeds output sinks
    finishes each of them (the job ends only when every sink is finished)."""

    @property
    def loop(self) -> Loop:
        """The job's event loop, where the handle watches its descriptors."""

    @property
    def watchdog(self) -> Watchdog:
        """The orphan guard, told of every process the handle starts, at once."""

    def rank_started(self, key: int, pid: int) -> None:
        """Rank ``key`` runs, as process ``pid`` (0: not known here)."""

    def rank_exited(self, key: int, code: Optional[int], sig: Optional[int],
                    at: Optional[float] = None) -> None:
        """Rank ``key`` ended with exit ``code`` or signal ``sig``, at ``at`` (now if None)."""

    def ranks_lost(self, keys: Collection[int], reason: str, at: Optional[float] = None,
                   blameless: bool = False) -> None:
        """Ranks ``keys`` ended unseen (their host, or their launcher, is gone)."""

    def rank_refused(self, key: int, reason: str) -> None:
        """Rank ``key`` cannot run as it is (``reason``): the job stops, its fault."""

    def make_sinks(self, spec: RankSpec) -> Tuple[RankOutput, Optional[RankOutput]]:
        """The output sinks of a rank the handle starts: stdout (or both), stderr."""

    def log(self, message: str) -> None:
        """One line of mslaunch's own, unless ``--quiet``."""

    def say(self, message: str) -> None:
        """One line, as it is, always."""


class RemoteHosts(Protocol):
    """A backend's remote hosts, once reached (the agents' fleet,
    :class:`~mslaunch.backends.agents.fleet.Fleet`): what the supervisor asks of them."""

    @property
    def hosts(self) -> Dict[str, Any]:
        """Each host's handle (a ``RemoteHost``), by name."""

    @property
    def left_out(self) -> Dict[str, str]:
        """The hosts the job went on without (spares that could not be reached), and why."""

    def let_go(self, keep: bool) -> None:
        """Before the handles are released: ``keep``, the agents wait for the next attempt."""

    def relay_stdin(self, local_pipes: Dict[int, int]) -> Optional[StdinFanout]:
        """Once every rank started: the launcher's stdin to the ranks that read it,
        here (``local_pipes``, by key) and on the hosts; None when none does."""


class OtherNodes(Protocol):
    """The other nodes of a job run one command per node, each with its own part
    (their link, :class:`~mslaunch.msrun.nodelink.NodeLink`)."""

    def ask_look(self, timeout: float, reply: Callable[[List[Any]], None]) -> bool:
        """Ask them for their processes' stacks (rows); False if they cannot be asked."""

    def stop(self, code: int, text: str, restart: bool = False) -> None:
        """This node ends the job with ``code`` (for ``text``); ``restart``: to start again."""

    def listen(self, stop: Callable[[int, str], None],
               look: Callable[[float, Callable[[List[Any]], None]], None]) -> None:
        """Where the other nodes' news goes: ``stop(code, text)`` ends the job here,
        ``look(timeout, reply)`` answers their look at this node's processes."""


class Looker(Protocol):
    """What answers a look inside ranks this machine cannot read itself: a remote
    host's agent, or srun's step (a step of its own that reads every node's)."""

    @property
    def ranks(self) -> Collection[int]:
        """The keys of the ranks it answers for."""

    def look(self, kind: int, body: Dict[str, Any], done: Any) -> bool:
        """Ask for the stacks (``link.STACKS``) or the usage (``link.TOP``) of its
        ranks (``body``: ``timeout``, and ``main``: the main threads' Python frames
        only); ``done(ranks or None)`` when it answers; False if it cannot ask."""

    def end_singletons(self) -> None:
        """Refused Open MPI singletons: end them, noting what they leave."""


class AllocationWatch(Protocol):
    """What asks whether the job's allocation was ended by its workload manager
    (:class:`~mslaunch.backends.allocationend.AllocationEnd`)."""

    def ask(self, loop: Optional[Loop], stop: bool = False) -> None:
        """Ask now, without waiting; the answer is read on ``loop`` (``stop``: the
        job is being stopped)."""


class SharedByAttempts(Protocol):
    """What the attempts of one run share, as the MPI services and the hosts see
    it (the whole of it is :class:`~mslaunch.backends.session.Session`)."""

    pmix: Any               # the PMIx server every attempt serves from, once made
    attempts: bool          # more than one attempt may run

    @property
    def allocation_end(self) -> Optional[AllocationWatch]:
        """Asked at a lost host and at a stop signal (None: no allocation to ask)."""


class AgentHost(Protocol):
    """A remote host's agent, as the MPI services speak to it
    (:class:`~mslaunch.backends.agents.host.RemoteHost`)."""

    name: str

    @property
    def ranks(self) -> Container[int]:
        """The keys of its ranks."""

    def send_pmi(self, message: Dict[str, Any]) -> None:
        """An answer or a notice of the job's MPI for its ranks."""

    def beat_now(self) -> None:
        """A heartbeat to it now (this process holds its loop for a while)."""

    def local_time(self, at: Any) -> float:
        """The wall-clock time the host reported as ``at``, on this machine's clock
        (now if ``at`` is not a time)."""

    def spawn(self, pj: Any, specs: Sequence[RankSpec], mapping: str,
              done: Callable[[Optional[str]], None],
              pmix: Optional[Dict[str, Any]] = None) -> None:
        """Start processes of the job ``pj`` spawned (a ``PMIJob``) on this host;
        ``done(problem or None)``; ``pmix``: the layout of one Open MPI spawned."""


class RankState(Protocol):
    """The supervisor's bookkeeping of one rank."""

    spec: RankSpec
    pid: int
    outputs: List[RankOutput]
    code: Optional[int]
    signal: Optional[int]
    reason: str
    ended: bool
    end: Optional[float]        # wall clock, where it was seen to end
    pmi_lost: Optional[float]   # when its PMI connection closed before MPI_Finalize
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


class ServedJob(Protocol):
    """What the job's MPI services (the PMI job set and its PMIx,
    :mod:`mslaunch.serve`) use of the job they serve, lent by its supervisor
    (:class:`~mslaunch.run.lent.Served`): the job and its plan as they stand,
    its ranks and remote hosts, and what only the supervisor does (fail a rank,
    take in or forget a spawned job's ranks, start them here)."""

    @property
    def job(self) -> JobSpec: ...

    @property
    def plan(self) -> Plan: ...

    @property
    def loop(self) -> Loop: ...

    @property
    def console(self) -> Console: ...

    @property
    def ending(self) -> Optional[Ending]: ...

    @property
    def watchdog(self) -> Watchdog: ...

    @property
    def session(self) -> SharedByAttempts: ...

    @property
    def ranks(self) -> Sequence[RankState]: ...

    @property
    def hosts(self) -> Mapping[str, AgentHost]: ...

    @property
    def lookers(self) -> Mapping[str, Looker]: ...

    @property
    def spoken_for(self) -> Set[int]:
        """The keys of the ranks a looker answers for."""

    def log(self, message: str) -> None: ...

    def fail(self, rank: RankState, reason: str, code: int, *, abort: bool,
             at: Optional[float] = None, mpi_abort: bool = False,
             lost: bool = False) -> None: ...

    def add_ranks(self, specs: Sequence[RankSpec]) -> None: ...

    def abandon(self, keys: Sequence[int]) -> None: ...

    def start_local(self, specs: Sequence[RankSpec], pmi: object,
                    pmi_env: Optional[PMIEnv]) -> None: ...


class LookedAt(Protocol):
    """What the looks inside a running job (:mod:`mslaunch.inspect`: the control
    socket, the stall watch, the stacks at a timeout) are lent of it, through
    :class:`mslaunch.run.lent.Looked`: the job, its plan, ranks and lookers as
    they stand, how it is ending, and the two things only the supervisor does."""

    @property
    def job(self) -> JobSpec: ...

    @property
    def plan(self) -> Plan: ...

    @property
    def loop(self) -> Loop: ...

    @property
    def console(self) -> Console: ...

    @property
    def ending(self) -> Optional[Ending]: ...

    @property
    def started(self) -> float:
        """When the job started (``time.monotonic()``)."""

    @property
    def dumps(self) -> Optional[str]:
        """Where this machine's Python ranks write their stacks (see mslaunch.machine.pydump)."""

    @property
    def ranks(self) -> Sequence[RankState]: ...

    @property
    def lookers(self) -> Mapping[str, Looker]: ...

    @property
    def spoken_for(self) -> Set[int]:
        """The ranks that a looker speaks for (not read on this machine)."""

    def elsewhere(self, timeout: float, reply: Callable[[List[Dict[str, Any]]], None]) -> bool:
        """Ask the job's other nodes for their ranks' stacks; False if it has none."""

    def end_stalled(self) -> None:
        """``--stall-exit``: end the job as stalled."""
