"""The pure parts of mslaunch's PMIx: the fence exchange, its codec on the link,
the job data a namespace registers, the choice of library, and the frames an
agent or a launcher refuses."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from mslaunch.mpi.pmix import lib as L
from mslaunch.mpi.pmix.exchange import FenceExchange, decode_blob, encode_blob
from mslaunch.mpi.pmix.layout import Layout


@given(st.binary(max_size=4096))
def test_fence_data_survives_the_link(blob):
    assert decode_blob(encode_blob(blob)) == blob


@given(st.one_of(st.none(), st.integers(), st.text(max_size=40)))
def test_anything_else_is_refused_as_fence_data_with_a_value_error(value):
    try:
        decode_blob(value)
    except ValueError:
        return
    assert isinstance(value, str)   # some text is base64 (possibly empty)


@given(st.lists(st.binary(max_size=64), min_size=1, max_size=6), st.randoms())
def test_every_host_gets_the_whole_once_all_have_given(parts, rnd):
    hosts = [f"h{i}" for i in range(len(parts))]
    got = {}
    ex = FenceExchange(lambda kvs, sig: frozenset(hosts))
    order = list(range(len(parts)))
    rnd.shuffle(order)
    for n, i in enumerate(order):
        ex.contribute("kvs", "kvs:*", 0, hosts[i], parts[i],
                      lambda whole, h=hosts[i]: got.setdefault(h, whole))
        assert bool(got) == (n == len(order) - 1)
    assert set(got) == set(hosts)
    assert len(set(got.values())) == 1
    assert got["h0"] == b"".join(parts)       # host order, whatever the arrival order
    assert ex.rounds == {}


def test_rounds_are_kept_apart_by_sequence_and_signature():
    ex = FenceExchange(lambda kvs, sig: frozenset(["a", "b"]))
    done = []
    ex.contribute("k", "k:*", 0, "a", b"1", done.append)
    ex.contribute("k", "k:*", 1, "a", b"2", done.append)
    ex.contribute("k", "k:0,k:1", 0, "a", b"3", done.append)
    assert done == [] and len(ex.waiting()) == 3
    ex.contribute("k", "k:*", 1, "b", b"x", done.append)
    assert done == [b"2x", b"2x"]
    with pytest.raises(ValueError):
        ex.contribute("k", "k:*", 0, "a", b"again", done.append)
    with pytest.raises(ValueError):
        ex.contribute("k", "k:*", 0, "stranger", b"", done.append)


def test_published_names_wait_go_first_read_and_stay_their_publishers():
    from mslaunch.mpi.pmix.names import NameBoard
    board = NameBoard()
    got = []
    board.lookup(["a", "b"], True, got.append)
    board.lookup(["a"], False, got.append)
    assert got == [{}]
    assert board.publish({"a": "s:1"}, "ns", 0) is None
    assert got == [{}]                                   # "b" still missing
    assert board.publish({"b": "b:AA=="}, "ns", 1, first_read=True) is None
    assert got[1] == {"a": ("s:1", "ns", 0), "b": ("b:AA==", "ns", 1)}
    assert "b" not in board.names and board.waiting == []   # read once: gone
    assert board.publish({"a": "s:2"}, "ns", 1) is not None  # taken
    board.unpublish(["a"], "ns", 1)                          # not its own
    assert board.names["a"] == ("s:1", "ns", 0)
    board.unpublish(["a"], "ns", 0)
    assert board.names == {}


def test_the_namespace_data_says_where_every_rank_is():
    layout = Layout("ns", ["n0", "n1"], [0, 0, 1, 1, 1], [0] * 5, 8, here=1)
    layout.tmpdir = "/t"
    info = layout.job_info()
    job = {k: v for k, t, v in info if k != "pmix.pdata"}
    assert job["pmix.job.size"] == 5 and job["pmix.univ.size"] == 8
    assert job["pmix.nmap"] == "n0,n1" and job["pmix.pmap"] == "0,1;2,3,4"
    assert job["pmix.lpeers"] == "2,3,4" and job["pmix.local.size"] == 3
    assert job["pmix.lldr"] == 2 and job["pmix.nsdir"] == "/t/ns"
    pdata = [dict((k, v) for k, _, v in d) for k, _, d in info if k == "pmix.pdata"]
    assert [(p["pmix.rank"], p["pmix.lrank"], p["pmix.nodeid"], p["pmix.hname"])
            for p in pdata] == [(0, 0, 0, "n0"), (1, 1, 0, "n0"), (2, 0, 1, "n1"),
                                (3, 1, 1, "n1"), (4, 2, 1, "n1")]
    L.InfoList(info)          # every item has a type the array builder knows


def _open_mpi_4_job_id(name: str) -> int:
    """Open MPI 4's job id of a namespace it did not name (Jenkins' one-at-a-time
    hash, bit 15 cleared), written out here as its opal/util/string_hash does:
    a rank under mslaunch reported ``[[35005,8767],0]`` in namespace
    ``kvs_2407_a5d59b680506``."""
    h = 0
    for byte in name.encode():
        h = (h + byte) & 0xFFFFFFFF
        h = (h + (h << 10)) & 0xFFFFFFFF
        h ^= h >> 6
    h = (h + (h << 3)) & 0xFFFFFFFF
    h ^= h >> 11
    h = (h + (h << 15)) & 0xFFFFFFFF
    return h & ~0x8000


def test_the_job_id_of_the_reference_rank():
    assert _open_mpi_4_job_id("kvs_2407_a5d59b680506") == (35005 << 16) | 8767


@settings(max_examples=20, deadline=None)     # a fraction of a second each
@given(st.text(alphabet="abcdef0123456789_", min_size=1, max_size=24))
def test_spawned_namespaces_are_of_their_parents_open_mpi_4_job_family(suffix):
    from mslaunch.mpi.pmix import sibling_names
    parent = f"kvs_1_{suffix}"
    found = list(sibling_names(f"{parent}_2", parent, size=1000))
    child = found[-1]
    # None after each thousand suffixes tried, then the name (the search in slices)
    assert found[:-1] == [None] * (len(found) - 1) and child is not None
    assert child.startswith(f"{parent}_2.")
    assert len(found) - 1 == int(child.rsplit(".", 1)[1], 16) // 1000
    assert _open_mpi_4_job_id(child) >> 16 == _open_mpi_4_job_id(parent) >> 16


def test_the_library_is_chosen_by_the_variable_first():
    assert L.candidates({"MSLAUNCH_PMIX_LIBRARY": "/x/libpmix.so.2"}) == ["/x/libpmix.so.2"]
    assert L.candidates({"MSLAUNCH_PMIX_LIBRARY": "None"}) == []
    assert L.candidates({})[0] == "libpmix.so.2"
    with pytest.raises(L.Unavailable, match="turns PMIx off"):
        L.load({"MSLAUNCH_PMIX_LIBRARY": "off"})
    with pytest.raises(L.Unavailable, match="/no/such/libpmix"):
        L.load({"MSLAUNCH_PMIX_LIBRARY": "/no/such/libpmix.so.2"})


# -- frames a peer may send -------------------------------------------------------------

class _Host:
    name = "h1"
    ranks = {1}

    def __init__(self):
        self.sent = []

    def send_pmi(self, message):
        self.sent.append(message)


def _launcher_side():
    from types import SimpleNamespace

    from mslaunch.serve.pmixjobs import LauncherPMIx
    from mslaunch.core.spec import Host
    here, h1 = Host(name="vm", slots=1, max_slots=None, local=True, node_id=0), \
        Host(name="h1", slots=1, max_slots=None, local=False, node_id=1)
    ranks = [SimpleNamespace(spec=SimpleNamespace(host=h)) for h in (here, h1)]
    pj = SimpleNamespace(keys={0: 0, 1: 1})
    return LauncherPMIx(SimpleNamespace(ranks=ranks), {"kvs": pj})  # type: ignore[arg-type]


@given(st.dictionaries(st.sampled_from(["kvs", "sig", "seq", "blob", "op"]),
                       st.one_of(st.none(), st.integers(-2, 3), st.text(max_size=12),
                                 st.sampled_from(["kvs", "kvs:*", "kvs:1", "kvs:9"]))))
@example({"kvs": "kvs", "sig": "kvs:1", "seq": 0, "blob": ""})
@example({"kvs": "kvs", "sig": "kvs:*", "seq": 0, "blob": ""})
def test_a_bad_fence_from_an_agent_is_a_link_error_never_a_crash(message):
    from mslaunch.wire.link import LinkError
    side = _launcher_side()
    host = _Host()
    try:
        side.from_agent(host, message)            # type: ignore[arg-type]
    except LinkError:
        return
    # accepted: a well-formed part of a fence with a rank on h1
    assert message["kvs"] == "kvs" and message["sig"] in ("kvs:*", "kvs:1")
    if message["sig"] == "kvs:*":                 # ... now waiting for rank 0, here
        assert host.sent == [] and len(side.exchange.rounds) == 1
    else:                                         # ... of h1's rank alone: done at once
        assert [m["op"] for m in host.sent] == ["pmix_fence_done"]
        assert not side.exchange.rounds


def test_an_agent_refuses_a_fence_result_it_did_not_ask_for():
    from mslaunch.serve.agentpmi import AgentPMI
    from mslaunch.wire.link import LinkError
    agent = AgentPMI(None, None, lambda job: None)          # type: ignore[arg-type]
    got = []
    agent.fences[("kvs", "kvs:*", 0)] = got.append
    with pytest.raises(LinkError):
        agent.from_launcher({"op": "pmix_fence_done", "kvs": "kvs", "sig": "kvs:*", "seq": 1,
                             "blob": ""})
    with pytest.raises(LinkError):
        agent.from_launcher({"op": "pmix_fence_done", "kvs": "kvs", "sig": "kvs:*", "seq": 0,
                             "blob": 7})
    agent.fences[("kvs", "kvs:*", 0)] = got.append
    agent.from_launcher({"op": "pmix_fence_done", "kvs": "kvs", "sig": "kvs:*", "seq": 0,
                         "blob": encode_blob(b"all")})
    assert got == [b"all"] and agent.fences == {}


def test_a_namespace_keeps_its_data_alive_for_a_library_that_reads_it_later(tmp_path, monkeypatch):
    # PMIx before 4 registers a namespace on its own thread after the call returns,
    # reading the caller's array then (it copies the pointer, not the data).
    import gc
    import weakref
    from types import SimpleNamespace

    from mslaunch.mpi.pmix.server import Namespace
    built = []

    class Recorded(L.InfoList):
        def __init__(self, items):
            super().__init__(items)
            built.append(weakref.ref(self))
    monkeypatch.setattr(L, "InfoList", Recorded)
    calls = SimpleNamespace(PMIx_server_register_nspace=lambda *args: L.SUCCESS)
    server = SimpleNamespace(tmpdir=str(tmp_path), topology_xml=lambda: "",
                             lib=SimpleNamespace(lib=calls))
    ns = Namespace(server, Layout("job-1", ["a"], [0, 0], [0, 0], 2, 0),  # type: ignore[arg-type]
                   None, lambda *a: None, lambda rank: None)
    ns.register()
    gc.collect()
    assert built and all(ref() is not None for ref in built)
    ns.registered = False      # nothing to deregister in this stand-in


# -- a spawned Open MPI job on other hosts: guests, direct modex, the spawn frame ----------

_WIRE_VALUES = st.one_of(st.none(), st.integers(-2, 3), st.text(max_size=8),
                         st.lists(st.one_of(st.integers(-1, 3), st.text(max_size=4)),
                                  max_size=3))


@given(st.dictionaries(st.sampled_from(["pmix_nodes", "pmix_node_of", "appnums",
                                        "pmix_universe"]), _WIRE_VALUES))
def test_a_guest_job_frame_is_read_or_refused_as_a_link_error(message):
    from mslaunch.wire.jobframe import read_guest
    from mslaunch.wire.link import LinkError
    try:
        nodes, node_of, appnums, universe = read_guest(message)
    except LinkError:
        return
    assert nodes and len(node_of) == len(appnums) > 0
    assert all(0 <= n < len(nodes) for n in node_of) and universe >= 0


@given(st.dictionaries(st.sampled_from(["pmix_nodes", "pmix_node_of", "pmix_parent",
                                        "pmix_universe"]), _WIRE_VALUES))
def test_a_spawned_jobs_pmix_layout_is_read_or_refused(message):
    from mslaunch.wire.jobframe import _spawned_pmix
    from mslaunch.wire.link import LinkError
    try:
        got = _spawned_pmix(message, 2)
    except LinkError:
        return
    if message.get("pmix_nodes") is None:
        assert got == {}
    else:
        assert len(got["pmix_node_of"]) == 2 and isinstance(got["pmix_parent"][1], int)


@given(st.one_of(_WIRE_VALUES, st.lists(st.lists(st.text(max_size=6), max_size=3),
                                        max_size=3)))
def test_a_spawned_applications_variables_are_read_or_refused(env):
    from mslaunch.wire.jobframe import read_spawn_env
    from mslaunch.wire.link import LinkError
    try:
        got = read_spawn_env({"env": env})
    except LinkError:
        return
    assert all(k and "=" not in k for k, _ in got)


def test_modex_answers_nobody_asked_for_are_refused_on_both_sides():
    from mslaunch.serve.agentpmi import AgentPMI
    from mslaunch.wire.link import LinkError
    agent = AgentPMI(None, None, lambda job: None)          # type: ignore[arg-type]
    with pytest.raises(LinkError):
        agent.from_launcher({"op": "pmix_modex_done", "ask": 5, "blob": ""})
    got = []
    agent.modex.waiting[5] = got.append
    with pytest.raises(LinkError):
        agent.from_launcher({"op": "pmix_modex_done", "ask": 5, "blob": 7})
    agent.modex.waiting[5] = got.append
    agent.from_launcher({"op": "pmix_modex_done", "ask": 5, "blob": encode_blob(b"data")})
    agent.modex.waiting[6] = got.append
    agent.from_launcher({"op": "pmix_modex_done", "ask": 6, "blob": None})
    assert got == [b"data", None]
    side = _launcher_side()
    with pytest.raises(LinkError):
        side.modex_from_agent(_Host(), {"op": "pmix_modex_done", "ask": 1})  # type: ignore[arg-type]
    host = _Host()
    side.modex_from_agent(host, {"op": "pmix_modex", "ask": 3, "kvs": "other", "rank": 0})  # type: ignore[arg-type]
    assert host.sent == [{"op": "pmix_modex_done", "ask": 3, "blob": None}]  # nobody has it


def test_a_guest_is_never_the_job_a_fence_is_served_through():
    from types import SimpleNamespace

    from mslaunch.mpi.pmix.server import PMIxServer
    guest, mine = SimpleNamespace(local=set()), SimpleNamespace(local={0})
    fake = SimpleNamespace(namespaces={"parent": guest, "child": mine})
    assert PMIxServer.serving(fake, [("parent", 0), ("child", 0)]) is mine  # type: ignore[arg-type]
    assert PMIxServer.serving(fake, [("parent", 1)]) is None  # type: ignore[arg-type]
