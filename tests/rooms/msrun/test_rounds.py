"""The rounds of a job whose nodes start again together (mslaunch.msrun.rounds),
driven by any sequence of what nodes do: whatever happens, every round's ranks
are 0..N-1 node after node, in the nodes' order, within MIN..MAX nodes;
failures are counted and only they; the job ends once, with a line."""

from __future__ import annotations

from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from mslaunch.core.spec import NodeRounds
from mslaunch.msrun.rounds import Rounds


class Timer:
    def __init__(self, fn) -> None:
        self.fn, self.cancelled = fn, False

    def cancel(self) -> None:
        self.cancelled = True


class Service:
    """What rounds need of the node service, recorded."""

    def __init__(self) -> None:
        self.sent: list = []
        self.stopped: list = []
        self.refused: list = []
        self.timers: list = []
        self.master_port = 5000
        self.loop = SimpleNamespace(call_later=self._later)

    def _later(self, _seconds, fn) -> Timer:
        self.timers.append(Timer(fn))
        return self.timers[-1]

    def fire(self) -> None:
        for timer in list(self.timers):
            if not timer.cancelled:
                timer.cancelled = True
                timer.fn()

    def send(self, peer, message) -> None:
        self.sent.append((peer, message))

    def stop(self, code, text, exclude=None) -> None:
        self.stopped.append((code, text))

    def refuse(self, peer, text) -> None:
        self.refused.append((peer, text))

    def began(self, _workers) -> None:
        pass


class _Peer(SimpleNamespace):
    def become(self, state: str) -> None:
        self.state = state


def _peer(i: int, workers: int):
    return _Peer(info={"pid": 100 + i, "workers": workers, "host": f"n{i}"},
                           order=f"10.0.0.{i}", store=(f"10.0.0.{i}", 6000 + i), state="new",
                           ranks=[], rank_given=None, name=lambda i=i: f"n{i}")


events = st.lists(st.tuples(st.sampled_from(["come", "fail", "lose", "done", "time"]),
                            st.integers(0, 5)), max_size=40)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 3), st.integers(0, 2), st.integers(0, 2), events)
def test_every_round_is_whole_and_only_failures_are_counted(low, extra, limit, happenings):
    high = low + extra
    service = Service()
    rounds = Rounds(service, NodeRounds(low, high, limit, 1.0), 10.0)
    peers = [_peer(i, 1 + i % 2) for i in range(6)]
    linked = set()
    fails = 0
    for what, i in happenings:
        peer = peers[i]
        before = len(service.sent)
        if what == "come" and i not in linked:
            linked.add(i)
            rounds.register(peer, {"node_rank": -1})
        elif what == "come" and peer.state == "held" and peer not in rounds.waiting:
            rounds.register(peer, {"node_rank": -1})          # back after a restart
        elif what == "fail" and i in linked:
            was = rounds.failures
            rounds.failed(peer, 7, "rank failed", True)
            fails += rounds.failures - was
        elif what == "lose" and i in linked:
            linked.discard(i)
            rounds.lost(peer, "gone", 255)
        elif what == "done" and i in linked and peer in rounds.members:
            rounds.done(peer)
        elif what == "time":
            service.fire()
        news = service.sent[before:]
        given = [m for _, m in news if m["op"] == "ranks"]
        if given:
            # a round began: its nodes, in order, hold ranks 0..world-1
            assert low <= len(given) <= high
            ranks = [r for m in given for r in m["ranks"]]
            assert ranks == list(range(len(ranks)))
            assert [m["group"] for m in given] == list(range(len(given)))
            assert all(m["world"] == len(ranks) and m["nodes"] == len(given) for m in given)
            members = [p for p, m in news if m["op"] == "ranks"]
            assert members == sorted(members, key=lambda p: (p.order, p.info["pid"]))
            assert all(m["master_addr"] == members[0].store[0] for m in given)
        for _, m in news:
            if m["op"] == "restart":
                assert m["counted"] == ("failure" in m["message"])
        if rounds.phase == "over":
            break
    assert rounds.failures == fails <= limit
    assert len(service.stopped) <= 1
    assert all(text for _, text in service.stopped)


# -- the looks a node service relays (mslaunch.msrun.looks) ---------------------------
json_like = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                         lambda inner: st.lists(inner, max_size=3)
                         | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=8)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.sampled_from(["ask", "answer", "gone", "time"]),
                          json_like, json_like), max_size=25))
def test_a_look_is_answered_once_with_rows_of_the_nodes_asked(happenings):
    from mslaunch.msrun.looks import MAX_ROWS, Looks
    service = Service()
    class Node:                          # (hashable, as the service's peers are)
        authenticated, state = True, "joined"
    nodes = [Node() for _ in range(4)]
    service.peers = {i: p for i, p in enumerate(nodes)}
    looks = Looks(service)
    asked = 0
    for who, what, a, b in happenings:
        node = nodes[who]
        if what == "ask":
            asked += 1
            looks.ask(node, {"id": asked, "timeout": a if isinstance(a, int) else 5})
        elif what == "answer":
            looks.answered(node, {"ask": b if isinstance(b, int) else 1, "rows": a})
        elif what == "gone":
            looks.gone(node)
        else:
            service.fire()
    service.fire()
    answers = [m for _, m in service.sent if m["op"] == "looked"]
    assert sorted(m["id"] for m in answers) == list(range(1, asked + 1))
    for m in answers:
        assert len(m["rows"]) <= MAX_ROWS and all(isinstance(r, dict) for r in m["rows"])
    # every question went to the other nodes only
    for peer, m in service.sent:
        if m["op"] == "look":
            assert peer.state == "joined"
    assert not looks.asks
