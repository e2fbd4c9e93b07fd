"""Rounds of a torchrun job over several nodes that start again together
(``--max-restarts N``, ``--nnodes MIN:MAX``): the node service's policy.

A round gathers nodes and gives them their ranks.  It begins at once when
MAX nodes have come; with at least MIN, after ``last_call`` seconds in which
no other came (torchrun's ``last_call_timeout``); a round after a restart
begins as soon as every node of the round before that is still linked has
come back.  Nodes are ordered by ``--node-rank`` when they give one (static),
else by their sort keys (addresses) and pids, as torchrun's c10d rendezvous
orders them; worker ranks follow, node after node.  Rank 0's node names the
workers' ``MASTER_ADDR`` and ``MASTER_PORT`` (a free port of its own).

While a round runs:

- a node's failure (a worker's exit, a stall) starts the next round if
  restarts are left, counted; else the job ends with its code on every node;
- a node lost (its link ended or silent): the next round on the others if at
  least MIN are left, not counted (torchrun counts failures only); else the
  job ends, the node named;
- a new node, while fewer than MAX run: the next round, with it, not
  counted; beyond MAX it waits for a round with room;
- a stop (a signal, a timeout, an output error) ends the job;
- every node done: the job is over, and the nodes hear it.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, List, Literal, Optional

    from ..core.spec import NodeRounds
    from ..machine.loop import Timer

    #: Nodes gathered for a round; its workers running; the job over.
    Phase = Literal["gathering", "running", "over"]
else:
    Phase = str

from ..core.states import NODE_DONE, NODE_HELD, NODE_JOINED

GATHERING: Phase = "gathering"
ROUND_RUNNING: Phase = "running"
OVER: Phase = "over"


class Rounds:
    """The rounds of one job, kept by its node service (``service``: sends to
    its peers, ends the job, reads each peer's ``info``, ``order``, ``store``)."""

    def __init__(self, service: Any, rounds: NodeRounds, join: float) -> None:
        self.service = service
        self.join = join                     # seconds a round after a restart may gather
        self.min, self.max = rounds.min_nodes, rounds.max_nodes
        self.limit, self.last_call = rounds.max_restarts, rounds.last_call
        self.round = 0
        self.failures = 0
        self.phase: Phase = GATHERING
        self.members: List[Any] = []         # the round's nodes, in rank order
        self.waiting: List[Any] = []         # nodes that came for the next round
        self.expected: List[Any] = []        # the last round's nodes still linked
        self.timer: Optional[Timer] = None
        self.join_timer: Optional[Timer] = None

    # -- what the nodes say -----------------------------------------------------------
    def register(self, peer: Any, message: Dict[str, Any]) -> None:
        peer.become(NODE_HELD)
        peer.rank_given = message.get("node_rank") if type(
            message.get("node_rank")) is int and message["node_rank"] >= 0 else None
        if any(p.rank_given is not None and p.rank_given == peer.rank_given
               for p in self.waiting + self.members if p is not peer):
            self.service.refuse(peer, f"--node-rank={peer.rank_given} is another node's "
                                      f"already; give each node its own --node-rank")
            return
        self.waiting.append(peer)
        if self.phase == ROUND_RUNNING and peer not in self.members and len(self.members) < self.max:
            self._next(f"node {peer.name()} joined", counted=False)
        elif self.phase == GATHERING:
            self._maybe_begin()

    def failed(self, peer: Any, code: int, text: str, restart: bool) -> None:
        """A node's job ended badly (``restart``: a failure, not a stop)."""
        if self.phase != ROUND_RUNNING or peer not in self.members:
            return
        if restart and self.failures < self.limit:
            self.failures += 1
            self._next(f"restart {self.failures} of {self.limit} after a failure on "
                       f"{peer.name()}: {text}", counted=True)
            return
        self.phase = OVER
        if restart and self.limit:
            text += f" (no restart left: {self.limit} of {self.limit} used)"
        self.service.stop(code, f"on {peer.name()}: {text}")

    def lost(self, peer: Any, why: str, exit_code: int) -> None:
        if peer in self.waiting:
            self.waiting.remove(peer)
        if peer in self.expected:
            self.expected.remove(peer)
            self._maybe_begin()
        if peer not in self.members or self.phase != ROUND_RUNNING:
            return
        self.members.remove(peer)
        left = len(self.members)
        if left >= self.min:
            self._next(f"lost node {peer.name()} ({why}): the job goes on on the "
                       f"{left} node(s) left", counted=False)
            return
        self.phase = OVER
        below = f"; {left} node(s) left, fewer than --nnodes' minimum {self.min}" \
            if self.min > 1 else ""
        self.service.stop(exit_code, f"lost node {peer.name()}: {why}{below}")

    def done(self, peer: Any) -> None:
        peer.become(NODE_DONE)
        if self.phase == ROUND_RUNNING and all(p.state == NODE_DONE for p in self.members):
            self.phase = OVER
            for p in self.members + self.waiting:
                self.service.send(p, {"op": "over"})

    def settled(self) -> bool:
        return self.phase == OVER

    # -- rounds -----------------------------------------------------------------------
    def _maybe_begin(self) -> None:
        if self.phase != GATHERING:
            return
        come = len(self.waiting)
        back = bool(self.expected) and all(p in self.waiting for p in self.expected)
        if come >= self.max or (come >= self.min and back):
            self._begin()
        elif come >= self.min and self.timer is None:
            self.timer = self.service.loop.call_later(self.last_call, self._last_call)

    def _last_call(self) -> None:
        self.timer = None
        if self.phase == GATHERING and len(self.waiting) >= self.min:
            self._begin()

    def _begin(self) -> None:
        for timer in (self.timer, self.join_timer):
            if timer is not None:
                timer.cancel()
        self.timer = self.join_timer = None
        order = sorted(self.waiting, key=_node_key)
        self.members, self.waiting = order[:self.max], order[self.max:]
        self.expected = []
        self.phase = ROUND_RUNNING
        master = self.members[0].store
        world = sum(p.info["workers"] for p in self.members)
        first = 0
        for group, p in enumerate(self.members):
            workers = p.info["workers"]
            p.become(NODE_JOINED)
            p.ranks = list(range(first, first + workers))
            message: Dict[str, Any] = {
                "op": "ranks", "ranks": p.ranks, "round": self.round, "group": group,
                "nodes": len(self.members), "world": world, "restarts": self.failures,
                "master_port": self.service.master_port}
            if master is not None:
                message["master_addr"], message["master_port"] = master
            self.service.send(p, message)
            first += workers
        self.service.began(world)

    def _next(self, cause: str, counted: bool) -> None:
        """Every node of the round stops its workers and comes back for the next."""
        self.round += 1
        self.expected = list(self.members)
        for p in self.members:
            p.become(NODE_HELD)
            self.service.send(p, {"op": "restart", "round": self.round, "message": cause,
                                  "counted": counted})
        self.members = []
        self.waiting = [p for p in self.waiting if p not in self.expected]
        self.phase = GATHERING
        if self.join >= 0:
            self.join_timer = self.service.loop.call_later(self.join, self._join_timeout)

    def _join_timeout(self) -> None:
        self.join_timer = None
        if self.phase == GATHERING:
            self.phase = OVER
            self.service.stop(1, f"round {self.round}: {len(self.waiting)} node(s) came back, "
                                 f"fewer than --nnodes' minimum {self.min}, within "
                                 f"{self.join:g} s (--rdzv-conf join_timeout)")


def _node_key(peer: Any) -> tuple:
    pid = peer.info.get("pid")
    given = peer.rank_given if peer.rank_given is not None else -1
    return (given, peer.order, pid if isinstance(pid, int) else 0)
