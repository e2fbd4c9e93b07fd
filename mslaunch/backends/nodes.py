"""This node's part of a job run one command per node (msrun's way): its ranks
are this machine's processes, and the other nodes hear of it through its link.

The link to the other nodes (and, on the node that holds it, the node service
that gathered them) is made before the job, by the dialect that ran the
rendezvous (:mod:`mslaunch.msrun.node`), and handed over in the session.  The
other nodes hear when every process here runs, when this node ends the job
(with its code, so that they stop too), and when its part ended well; a stop
that comes from another node ends this node's part (``remote``).
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Optional, Sequence

    from ..core.spec import HostEntry, JobResult, Plan, RankSpec
    from ..core.states import BackendName
    from ..machine.local import LocalRanks, PMIEnv
    from ..seams import RankHandle
    from .backend import LaunchView

from .backend import Backend


class NodePart:
    """What the session of one node of such a job holds: its ``link`` to the
    others (:class:`~mslaunch.msrun.nodelink.NodeLink`, None for a job of one
    node), the node ``service`` it runs (the node that gathered the others), and
    who hears, once every process here runs, their pids by label (``announce``)."""

    def __init__(self, link: Any, service: Any,
                 announce: Optional[Callable[[Dict[str, int]], None]] = None) -> None:
        self.link = link
        self.service = service
        self.announce = announce

    def planning(self, plan: Plan) -> Planned:
        """The node's processes, planned by the dialect, as the registry takes them."""
        return Planned(plan)

    def close(self) -> None:
        if self.link is not None:
            self.link.close()
        if self.service is not None:
            self.service.close()


class Planned:
    """A plan made before the job (a node's processes): no host list to read."""

    def __init__(self, plan: Plan) -> None:
        self._plan = plan

    @property
    def entries(self) -> Sequence[HostEntry]:
        return ()

    def plan(self, topologies: object = None) -> Plan:
        return self._plan


class NodesBackend(Backend):
    """See the module docstring; ``session.nodes`` is the node's :class:`NodePart`."""

    name: BackendName = "nodes"
    #: This node's processes, once handed them (their pids are announced).
    processes: Optional[LocalRanks] = None

    def connect(self, view: LaunchView) -> None:
        self.other_nodes = self.session.nodes.link

    def handles(self, view: LaunchView, here: Sequence[RankSpec], pmi: object,
                pmi_env: Optional[PMIEnv]) -> List[RankHandle]:
        self.processes = view.local_ranks(here, pmi, pmi_env, stdin_fd=0) if here else None
        return [self.processes] if self.processes is not None else []

    def started(self, view: LaunchView) -> None:
        announce = self.session.nodes.announce
        if announce is not None:
            pids = self.processes.started_pids() if self.processes is not None else []
            announce({spec.label or f"rank {spec.rank}": pid for spec, pid in pids})

    def outcome(self, result: JobResult) -> JobResult:
        link = self.session.nodes.link
        if link is not None and result.exit_code == 0:
            link.done()
        return result
