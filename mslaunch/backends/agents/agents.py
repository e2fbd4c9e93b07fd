"""The ranks of remote hosts run under agents of mslaunch's, this machine's as
its own processes: the :class:`~mslaunch.backends.backend.Backend` of every job with remote hosts
(but ``--launcher srun``'s).

The agents are started by the job's starter (:mod:`mslaunch.backends.agents.starters.starter`:
paramiko's SSH, an rsh agent, srun), which the :class:`~.fleet.Fleet` drives;
with ``--max-restarts`` the agents of the attempt before come first
(:mod:`.keptagents`).  When the plan depends on the hosts' cpus, every remote
host is reached first and the job planned again with their topologies, as
Open MPI starts its daemons first.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

    from .starters.starter import Starter
    from ...core.spec import HostEntry, JobSpec, Plan, RankSpec
    from ...core.states import BackendName
    from ..backend import Planning
    from .fleet import Fleet
    from ...machine.local import PMIEnv
    from ...seams import Looker, RankHandle
    from ..backend import LaunchView
    from ..session import Session
    from .keptagents import KeptAgents

from ...hosts import is_local
from ...machine.spawn import raise_fd_limit
from ...plan import agent_hosts
from ..backend import Backend


class AgentsBackend(Backend):
    """See the module docstring."""

    name: BackendName = "agents"

    def __init__(self, job: JobSpec, environ: Mapping[str, str], session: Session,
                 planning: Planning) -> None:
        super().__init__(job, environ, session, planning)
        plan = planning.plan()
        self.names = agent_hosts(plan, job)
        self.ranked = {r.host.name for r in plan.ranks}
        #: The spares whose agents start beside the job, not before it (see begin),
        #: and those still starting since the attempt before.
        self.late: List[str] = []
        self.carried: List[Any] = []
        self.replan: Optional[Callable[..., Plan]] = None
        entries = planning.entries
        if _needs_topologies(job, entries):
            # Slots and placement depend on the remote hosts' cpus: connect to
            # every remote host first, as Open MPI starts its daemons first.
            self.names = list(dict.fromkeys(e.name for e in entries if not is_local(e.name)))
            self.replan = planning.plan
        self.pmi_early = self.replan is None
        self.starter: Optional[Starter] = None
        self.fleet: Optional[Fleet] = None

    def begin(self) -> None:
        from .starters.starter import starter_for
        job, kept = self.job, self.session.kept
        # the one choice of the job's starter
        make = lambda: starter_for(job.ssh, self.environ,  # noqa: E731
                                   port_range=job.port_range)
        self.starter = kept.starter(make) if kept is not None else make()
        if kept is not None:
            self._carry(kept)
        if self.replan is None and job.max_job_restarts and self.starter.spares_later:
            # The spares of a job that may start again (hosts of no rank) never
            # delay its start; those with an agent kept from the attempt before
            # are taken at once.  (Without restarts, spares are there for spawned
            # jobs, which place ranks on hosts that answer: started first, as Open
            # MPI starts its daemons.)
            idle = kept.idle if kept is not None else {}
            self.late = [n for n in self._first() if n not in self.ranked and n not in idle]
        # In the background, while the supervisor is built (srun's step starts here).
        self.starter.prepare(self._first(), self.session.guard.marker)

    def _carry(self, kept: KeptAgents) -> None:
        """Spares still starting since the attempt before join this attempt as they
        answer; where it puts ranks, those started already wait with the kept
        agents and the rest are given up (this attempt's starter starts them
        anew rather than wait on a start that may hang)."""
        carried, kept.starting = kept.starting, []
        for spares in carried:
            if self.replan is None and not self.ranked & set(spares.names):
                self.carried.append(spares)
                continue
            for conn in spares.halt().values():
                kept.put(conn, fresh=True)

    def _first(self) -> List[str]:
        """The hosts whose agents start before the ranks."""
        starting = {n for spares in self.carried for n in spares.names}
        return [n for n in self.names if n not in self.late and n not in starting]

    def connect(self, view: LaunchView) -> None:
        from .fleet import Fleet
        assert self.starter is not None            # (begin made it)
        self.fleet = Fleet(view, self.session.kept)
        self.remote_hosts = self.fleet
        # Each host's link and connections are open before its ranks start.
        raise_fd_limit(8 * len(view.plan.ranks) + 8 * len(self.names) + 64)
        self.fleet.connect(self._first(), self.starter, self.replan)
        if self.late or self.carried:
            self.fleet.start_spares(self.late, self.starter, self.carried)

    def handles(self, view: LaunchView, here: Sequence[RankSpec], pmi: object,
                pmi_env: Optional[PMIEnv]) -> List[RankHandle]:
        fleet = self.fleet
        assert fleet is not None
        remote: Dict[str, List[RankSpec]] = {}
        for r in view.plan.ranks:
            if not r.host.local:
                remote.setdefault(r.host.name, []).append(r)
        # Hosts left after the re-plan (the plan may have sent every agent away).
        active = bool(fleet.conns)
        raise_fd_limit(8 * len(here) + 8 * len(self.names) + 64)
        if active:
            fleet.prepare(remote)
        if here:
            fleet.handles.insert(0, view.local_ranks(here, pmi, pmi_env,
                                                     stdin_fd=None if active else 0))
        return fleet.handles

    def started(self, view: LaunchView) -> None:
        fleet = self.fleet
        if fleet is not None:
            fleet.watch_spares()
        if fleet is not None and fleet.hosts and self.job.attempt == 0 and \
                not self.job.is_check and view.console.status_in_place():
            from ...machine.topology import cache_path
            from .forwarding import tell_once
            tell_once(self.job, self.environ, view.console.message, cache_path)

    def lookers(self) -> Dict[str, Looker]:
        return dict(self.fleet.hosts) if self.fleet is not None else {}

    def close(self) -> None:
        if self.fleet is not None:
            self.fleet.let_go_all()       # (spares still starting, if the job never started)
            self.fleet.close_listener()
        if self.starter is not None:
            self.starter.close()      # what prepare began, if the job failed before using it


def _needs_topologies(job: JobSpec, entries: Sequence[HostEntry]) -> bool:
    """Whether a plan depends on what the remote hosts' agents report (their cpus)."""
    counts_missing = any(e.slots is None and e.max_slots is None and not is_local(e.name)
                         for e in entries)
    return counts_missing or job.map_by not in ("slot", "node") or bool(
        job.ppr or job.pe or job.bind_to != "none" or job.use_hwthreads or job.rankfile
        or job.report_bindings or job.rank_by not in (None, "slot", "node"))


__all__ = ["AgentsBackend"]
