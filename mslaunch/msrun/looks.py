"""Looks inside a job run one command per node, relayed by its node service:
a node's ``mslaunch-stacks`` (or ``--stall-report``) asks the service, which
asks every other node that runs workers and answers the asking node once all
have answered or the time is up, with every node's rows (one per worker:
:func:`mslaunch.inspect.stacktree.row`).  What a node answers is its own
business: rows that are not objects are dropped, at most :data:`MAX_ROWS`
in all, and an answer to a question not asked of it is ignored."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, List, Set

from ..core.states import NODE_JOINED

#: Rows an asking node gets at most (a worker's row is a few kilobytes).
MAX_ROWS = 4096
#: Seconds past the asked timeout the service waits for the nodes' answers.
SLACK = 2.0


class _Ask:
    def __init__(self, asker: Any, ask_id: int, waiting: Set[Any]) -> None:
        self.asker, self.ask_id, self.waiting = asker, ask_id, waiting
        self.rows: List[Any] = []
        self.timer: Any = None


class Looks:
    """The looks a node service relays (``service``: its loop, peers and send)."""

    def __init__(self, service: Any) -> None:
        self.service = service
        self.asks: Dict[int, _Ask] = {}
        self.next = 1

    def ask(self, peer: Any, message: Dict[str, Any]) -> None:
        ask_id, timeout = message.get("id"), message.get("timeout")
        if type(ask_id) is not int or isinstance(timeout, bool) \
                or not isinstance(timeout, (int, float)) or not 0 < timeout <= 60:
            self.service.send(peer, {"op": "looked", "id": ask_id, "rows": []})
            return
        others = {p for p in self.service.peers.values()
                  if p is not peer and p.authenticated and p.state == NODE_JOINED}
        number, self.next = self.next, self.next + 1
        ask = self.asks[number] = _Ask(peer, ask_id, others)
        for p in others:
            self.service.send(p, {"op": "look", "ask": number, "timeout": timeout})
        ask.timer = self.service.loop.call_later(float(timeout) + SLACK,
                                                 lambda: self._answer(number))
        if not others:
            self._answer(number)

    def answered(self, peer: Any, message: Dict[str, Any]) -> None:
        number = message.get("ask")
        if type(number) is not int:
            return
        ask = self.asks.get(number)
        if ask is None or peer not in ask.waiting:
            return
        ask.waiting.discard(peer)
        rows = message.get("rows")
        if isinstance(rows, list):
            room = MAX_ROWS - len(ask.rows)
            ask.rows.extend(r for r in rows[:max(room, 0)] if isinstance(r, dict))
        if not ask.waiting:
            self._answer(number)

    def gone(self, peer: Any) -> None:
        """A node left: no answer is awaited from it."""
        for number, ask in list(self.asks.items()):
            if peer in ask.waiting:
                ask.waiting.discard(peer)
                if not ask.waiting:
                    self._answer(number)

    def _answer(self, number: int) -> None:
        ask = self.asks.pop(number, None)
        if ask is None:
            return
        if ask.timer is not None:
            ask.timer.cancel()
        self.service.send(ask.asker, {"op": "looked", "id": ask.ask_id, "rows": ask.rows})
