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
    from typing import Any, Callable, Dict, Optional, Sequence

    from ..core.spec import HostEntry, JobResult, Plan
    from ..core.states import BackendName
    from ..seams import JobView

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

    def connect(self, sup: JobView) -> None:
        link = self.session.nodes.link
        self.other_nodes = link
        if link is not None:
            link.on_stop = sup.remote_stop
            # (a job of rounds) the service starts every node again: this
            # node's processes end, whatever their code
            link.on_restart = lambda text: sup.remote_stop(1, text)
            link.on_look = sup.look_here

    def started(self, sup: JobView) -> None:
        announce = self.session.nodes.announce
        if announce is not None:
            announce({r.spec.label or f"rank {r.spec.rank}": r.pid for r in sup.ranks})

    def outcome(self, result: JobResult) -> JobResult:
        link = self.session.nodes.link
        if link is not None and result.exit_code == 0:
            link.done()
        return result
