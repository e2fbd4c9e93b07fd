"""What the supervisor lends, and nothing else of it: to a backend
(:class:`Lent`, a :class:`~mslaunch.backends.backend.LaunchView`) the job and its
plan as they stand, how it is ending, where the rank handles report, and the
few things only the supervisor does (the plan made again, the answers while
the places are reached, this machine's ranks' handle); to the job's MPI
services (:class:`Served`, a :class:`~mslaunch.seams.ServedJob`) the job, its
ranks and hosts, and what they ask the supervisor to do."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Mapping, Optional, Sequence, Set

    from ..core.spec import JobSpec, Plan, RankSpec
    from ..core.states import Ending
    from ..machine.guard import Watchdog
    from ..machine.local import LocalRanks, PMIEnv
    from ..serve.mpijobs import MPIJobs
    from ..seams import AgentHost, JobView, Looker, RankState, SharedByAttempts


class _View:
    """What both views hold: the job, its loop, console and session, and its plan and
    ending as they stand."""

    __slots__ = ("job", "loop", "console", "session", "_sup")

    def __init__(self, sup: JobView) -> None:
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


class Lent(_View):
    """The backend's view of one supervisor (see the module docstring)."""

    __slots__ = ("events", "stop_requested", "answer_while_starting", "host_paused")

    def __init__(self, sup: JobView) -> None:
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


class Served(_View):
    """The MPI services' view of one supervisor (see the module docstring)."""

    __slots__ = ("watchdog", "log", "fail", "add_ranks", "abandon", "start_local")

    def __init__(self, sup: JobView) -> None:
        super().__init__(sup)
        self.watchdog: Watchdog = sup.watchdog
        self.log, self.fail = sup.log, sup.fail
        self.add_ranks, self.abandon, self.start_local = \
            sup.add_ranks, sup.abandon, sup.start_local

    @property
    def ranks(self) -> Sequence[RankState]:
        return self._sup.ranks

    @property
    def hosts(self) -> Mapping[str, AgentHost]:
        return self._sup.hosts

    @property
    def lookers(self) -> Mapping[str, Looker]:
        return self._sup.lookers

    @property
    def spoken_for(self) -> Set[int]:
        return self._sup.spoken_for


__all__ = ["Lent", "Served"]
