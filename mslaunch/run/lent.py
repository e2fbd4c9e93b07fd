"""What the supervisor lends, and nothing else of it: to a backend
(:class:`Lent`, a :class:`~mslaunch.backends.backend.LaunchView`) the job and its
plan as they stand, how it is ending, where the rank handles report, and the
few things only the supervisor does (the plan made again, the answers while
the places are reached, this machine's ranks' handle); to the job's MPI
services (:class:`Served`, a :class:`~mslaunch.seams.ServedJob`) the job, its
ranks and hosts, and what they ask the supervisor to do; to the rank handles
(:class:`Events`, a :class:`~mslaunch.seams.RankEvents`) where they report; to
the looks inside the job (:class:`Looked`, a :class:`~mslaunch.seams.LookedAt`)
its ranks and lookers; to the reports (:class:`Reported`) what they tell."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import (Any, Callable, Collection, Dict, List, Mapping, Optional, Protocol,
                        Sequence, Set, Tuple)

    from ..core.spec import JobSpec, Plan, RankSpec
    from ..core.states import Ending
    from ..machine.guard import Watchdog
    from ..machine.local import LocalRanks, PMIEnv
    from ..machine.output import RankOutput
    from ..mpi.early import Services
    from ..serve.mpijobs import MPIJobs
    from ..seams import (AgentHost, Closable, LookedAt, Looker, RankEvents, RankState,
                         ServedJob, SharedByAttempts)
    from .failures import Failures

    class Lender(ServedJob, LookedAt, Protocol):
        """What the views read of :class:`~.supervise.Supervisor` (which imports
        this module: named here, its type is checked where each view is made):
        what the MPI services and the looks are lent, and what the others are."""

        stop_signal: Optional[int]
        launched: bool
        mpi_jobs: Optional[MPIJobs]
        mpi: Optional[Services]
        events: RankEvents
        failures: Failures

        @property
        def restarts(self) -> int: ...

        def stop_requested(self) -> bool: ...

        def answer_while_starting(self, status: Callable[[], str]) -> Optional[Closable]: ...

        def host_paused(self, name: str) -> None: ...

        def replanned(self, plan: Plan) -> None: ...

        def local_ranks(self, specs: Sequence[RankSpec], pmi: object,
                        pmi_env: Optional[PMIEnv], stdin_fd: Optional[int]) -> LocalRanks: ...

        def rank_started(self, key: int, pid: int) -> None: ...

        def rank_exited(self, key: int, code: Optional[int], sig: Optional[int],
                        at: Optional[float] = None) -> None: ...

        def ranks_lost(self, keys: Collection[int], reason: str, at: Optional[float] = None,
                       blameless: bool = False) -> None: ...

        def make_sinks(self, spec: RankSpec) -> Tuple[RankOutput, Optional[RankOutput]]: ...


class _View:
    """What every view holds: the job, its loop, console and session, and its plan,
    ending and ranks as they stand."""

    __slots__ = ("job", "loop", "console", "session", "_sup")

    def __init__(self, sup: Lender) -> None:
        self.job: JobSpec = sup.job
        self.loop, self.console = sup.loop, sup.console
        self.session: SharedByAttempts = sup.session
        self._sup = sup

    @property
    def plan(self) -> Plan:
        return self._sup.plan

    @property
    def ending(self) -> Optional[Ending]:
        return self._sup.ending

    @property
    def ranks(self) -> Sequence[RankState]:
        return self._sup.ranks


class _Lookers(_View):
    """A view that also holds who answers looks inside the job, and for which ranks."""

    __slots__ = ()

    @property
    def lookers(self) -> Mapping[str, Looker]:
        return self._sup.lookers

    @property
    def spoken_for(self) -> Set[int]:
        return self._sup.spoken_for


class Lent(_View):
    """The backend's view of one supervisor (see the module docstring)."""

    __slots__ = ("events", "stop_requested", "answer_while_starting", "host_paused")

    def __init__(self, sup: Lender) -> None:
        super().__init__(sup)
        self.events = sup.events
        self.stop_requested = sup.stop_requested
        self.answer_while_starting = sup.answer_while_starting
        self.host_paused = sup.host_paused

    @property
    def stop_signal(self) -> Optional[int]:
        return self._sup.stop_signal

    @property
    def launched(self) -> bool:
        return self._sup.launched

    @property
    def mpi_jobs(self) -> Optional[MPIJobs]:
        return self._sup.mpi_jobs

    def replanned(self, plan: Plan) -> None:
        self._sup.replanned(plan)

    def local_ranks(self, specs: Sequence[RankSpec], pmi: object, pmi_env: Optional[PMIEnv],
                    stdin_fd: Optional[int]) -> LocalRanks:
        return self._sup.local_ranks(specs, pmi, pmi_env, stdin_fd)


class Served(_Lookers):
    """The MPI services' view of one supervisor (see the module docstring)."""

    __slots__ = ("watchdog", "log", "fail", "add_ranks", "abandon", "start_local")

    def __init__(self, sup: Lender) -> None:
        super().__init__(sup)
        self.watchdog: Watchdog = sup.watchdog
        self.log, self.fail = sup.log, sup.fail
        self.add_ranks, self.abandon, self.start_local = \
            sup.add_ranks, sup.abandon, sup.start_local

    @property
    def hosts(self) -> Mapping[str, AgentHost]:
        return self._sup.hosts


class Looked(_Lookers):
    """What the looks inside the job see of it (see the module docstring)."""

    __slots__ = ("elsewhere", "end_stalled")

    def __init__(self, sup: Lender) -> None:
        super().__init__(sup)
        self.elsewhere: Callable[[float, Callable[[List[Dict[str, Any]]], None]], bool] = \
            sup.elsewhere
        self.end_stalled: Callable[[], None] = sup.end_stalled

    @property
    def started(self) -> float:
        return self._sup.started

    @property
    def dumps(self) -> Optional[str]:
        return self._sup.dumps


class Reported(_View):
    """What the reports of a job (:mod:`.report`) tell of it."""

    __slots__ = ()

    @property
    def restarts(self) -> int:
        return self._sup.restarts

    @property
    def failures(self) -> Failures:
        return self._sup.failures

    @property
    def mpi(self) -> Optional[Services]:
        return self._sup.mpi


class Events:
    """The supervisor's side of the rank-handle seam (:class:`~mslaunch.seams.RankEvents`):
    its rank events and what it lends, and nothing else of it."""

    __slots__ = ("loop", "watchdog", "rank_started", "rank_exited", "ranks_lost",
                 "make_sinks", "log", "say", "_sup")

    def __init__(self, sup: Lender) -> None:
        self.loop, self.watchdog = sup.loop, sup.watchdog
        self.rank_started, self.rank_exited = sup.rank_started, sup.rank_exited
        self.ranks_lost, self.make_sinks = sup.ranks_lost, sup.make_sinks
        self.log, self.say = sup.log, sup.console.message
        self._sup = sup

    def rank_refused(self, key: int, reason: str) -> None:
        sup = self._sup
        sup.fail(sup.ranks[key], reason, 1, abort=True)


__all__ = ["Events", "Lent", "Looked", "Reported", "Served"]
