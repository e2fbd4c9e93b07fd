"""Tests for mslaunch.machine.topology: sysfs reading, objects, wire form, binding text."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import DATA, REPO
from mslaunch.plan.bindings import binding_map, binding_words, describe_binding, report_binding
from mslaunch.core.cputopo import (
    KINDS,
    MAX_CPUS,
    Topology,
    count,
    from_wire,
    make_topology,
    objects,
    parse_cpulist,
    to_wire,
)
from mslaunch.machine.topology import read_topology

TREES = os.path.join(DATA, "topology")
FAST = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
EVERY_CPU = range(1024)


def tree(name: str, allowed=EVERY_CPU) -> Topology:
    return read_topology(os.path.join(TREES, name), allowed=allowed)


def table(topo: Topology) -> dict:
    return {kind: objects(topo, kind) for kind in KINDS}


# ---------------------------------------------------------------------------
# fake sysfs trees


def test_tree_of_this_shape():
    # 1 package, 2 cores, 1 thread per core, 1 NUMA node, one L3; L1i is skipped.
    topo = tree("vm")
    assert topo.cpus == ((0, 0, 0, 0, 0), (1, 1, 0, 0, 0))
    assert topo.l2 == () and topo.l1 == ()
    assert table(topo) == {
        "hwthread": ((0,), (1,)), "core": ((0,), (1,)), "l1cache": ((0,), (1,)),
        "l2cache": ((0,), (1,)), "l3cache": ((0, 1),), "numa": ((0, 1),),
        "socket": ((0, 1),), "package": ((0, 1),), "board": ((0, 1),), "node": ((0, 1),),
    }
    assert [count(topo, k) for k in ("hwthread", "core", "l3cache", "numa", "socket", "board")] \
        == [2, 2, 1, 1, 1, 1]
    assert topo.hwthreads_per_core() == 1
    assert topo.cpu_ids() == (0, 1)


def test_tree_two_sockets_in_logical_order():
    # Linux numbers the second hardware threads 8-15: logical order pairs them with 0-7.
    topo = tree("2s4c2t")
    assert topo.cpu_ids() == (0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15)
    assert objects(topo, "core") == ((0, 8), (1, 9), (2, 10), (3, 11),
                                     (4, 12), (5, 13), (6, 14), (7, 15))
    assert objects(topo, "l2cache") == objects(topo, "l1cache") == objects(topo, "core")
    socket0, socket1 = (0, 8, 1, 9, 2, 10, 3, 11), (4, 12, 5, 13, 6, 14, 7, 15)
    for kind in ("socket", "package", "numa", "l3cache"):
        assert objects(topo, kind) == (socket0, socket1), kind
    assert objects(topo, "board") == objects(topo, "node") == (socket0 + socket1,)
    assert objects(topo, "hwthread") == tuple((c,) for c in topo.cpu_ids())
    assert [count(topo, k) for k in ("hwthread", "core", "l2cache", "l3cache", "numa",
                                     "socket", "node")] == [16, 8, 8, 2, 2, 2, 1]
    assert topo.hwthreads_per_core() == 2
    assert (4, 4, 1, 1, 1) in topo.cpus       # cores numbered across the host


def test_tree_restricted_to_allowed_cpus():
    topo = tree("2s4c2t", allowed={1, 9, 4, 6, 200})
    assert topo.cpu_ids() == (1, 9, 4, 6)
    assert objects(topo, "core") == ((1, 9), (4,), (6,))
    assert objects(topo, "socket") == ((1, 9), (4, 6))
    assert topo.hwthreads_per_core() == 2


def test_broken_tree_falls_back_to_defaults():
    # No cpu/online (the cpuN directories count), no node/, missing or garbage files:
    # one package, one L3, each cpu its own core; cpu3's node1 link still counts.
    topo = tree("broken")
    assert topo.cpu_ids() == (0, 1, 2, 3)
    assert objects(topo, "core") == ((0,), (1,), (2,), (3,))
    assert objects(topo, "socket") == objects(topo, "l3cache") == ((0, 1, 2, 3),)
    assert objects(topo, "numa") == ((0, 1, 2), (3,))


def test_missing_tree_uses_allowed_cpus():
    topo = read_topology(os.path.join(TREES, "no-such-tree"), allowed={3, 1})
    assert topo.cpus == ((1, 0, 0, 0, 0), (3, 1, 0, 0, 0))


def test_allowed_outside_online_uses_allowed():
    topo = tree("vm", allowed={5})
    assert topo.cpu_ids() == (5,)


@given(st.dictionaries(
    st.sampled_from(["cpu/online", "node/node0/cpulist", "node/node1/cpulist",
                     "cpu/cpu0/topology/physical_package_id", "cpu/cpu0/topology/core_id",
                     "cpu/cpu1/topology/core_id", "cpu/cpu1/cache/index0/level",
                     "cpu/cpu1/cache/index0/type", "cpu/cpu1/cache/index0/shared_cpu_list",
                     "cpu/cpu2/cache/index3/level", "cpu/cpu2/cache/index3/shared_cpu_list"]),
    st.one_of(st.binary(max_size=12),
              st.text("0123-,:x \n", max_size=12).map(str.encode)),
    max_size=11))
@FAST
def test_any_file_contents_give_a_topology(files):
    with tempfile.TemporaryDirectory() as root:
        for path, data in files.items():
            os.makedirs(os.path.join(root, os.path.dirname(path)), exist_ok=True)
            with open(os.path.join(root, path), "wb") as fh:
                fh.write(data)
        topo = read_topology(root, allowed={0, 1, 2})
    assert topo.cpu_ids() and set(topo.cpu_ids()) <= {0, 1, 2}
    assert from_wire(to_wire(topo)) == topo


def test_this_machine_matches_affinity():
    topo = read_topology()
    allowed = os.sched_getaffinity(0)
    assert set(topo.cpu_ids()) == allowed
    assert len(topo.cpus) <= (os.cpu_count() or 1)
    assert count(topo, "core") * topo.hwthreads_per_core() >= len(topo.cpus)
    assert sorted(c for group in objects(topo, "socket") for c in group) == sorted(allowed)
    for kind in KINDS:
        groups = objects(topo, kind)
        assert sorted(c for g in groups for c in g) == sorted(allowed), kind
    assert from_wire(json.loads(json.dumps(to_wire(topo)))) == topo


def test_unknown_kind():
    with pytest.raises(ValueError, match="unknown object kind"):
        objects(tree("vm"), "l4cache")
    with pytest.raises(ValueError):
        count(tree("vm"), "")


def test_import_is_cheap():
    # Only modules the import itself adds count.  site may preload some (__future__
    # among them, or not): the baseline has __future__ and os either way, and the
    # probe runs with site and without it (-S) to the same end.
    code = ("import sys, os, __future__; sys.path.insert(0, %r); before = set(sys.modules); "
            "import mslaunch.machine.topology; "
            "added = set(sys.modules) - before; "
            "print(sorted(m for m in added if m.split('.')[0] != 'mslaunch'))"
            % REPO)
    for flags in ([], ["-S"]):
        out = subprocess.run([sys.executable, *flags, "-c", code], capture_output=True,
                             text=True, check=True)
        assert out.stdout.strip() == "[]", (flags, out.stdout)


# ---------------------------------------------------------------------------
# make_topology


def test_make_topology_orders_depth_first():
    # Packages interleave in OS numbering: logical order keeps each package together.
    topo = make_topology([(c, ("core", c), c % 2, 0, c % 2) for c in range(4)])
    assert topo.cpu_ids() == (0, 2, 1, 3)
    assert topo.cpus == ((0, 0, 0, 0, 0), (2, 1, 0, 0, 0), (1, 2, 1, 0, 1), (3, 3, 1, 0, 1))
    assert make_topology(list(topo.cpus)[::-1]) == topo


def test_make_topology_shared_l2():
    # Two cores per L2 (modules): l2 ids are kept; L1 is per core and left empty.
    rows = [(c, c, 0, 0, 0, c // 2) for c in range(4)]
    topo = make_topology(rows)
    assert topo.l2 == (0, 0, 1, 1) and topo.l1 == ()
    assert objects(topo, "l2cache") == ((0, 1), (2, 3))
    assert objects(topo, "l1cache") == objects(topo, "core") == ((0,), (1,), (2,), (3,))
    assert count(topo, "l2cache") == 2
    assert from_wire(to_wire(topo)) == topo


def test_make_topology_rejects_duplicates():
    with pytest.raises(ValueError, match="twice"):
        make_topology([(0, 0, 0, 0, 0), (0, 1, 0, 0, 0)])


# ---------------------------------------------------------------------------
# parse_cpulist


@pytest.mark.parametrize("text, cpus", [
    ("0", (0,)), ("0-3", (0, 1, 2, 3)), ("0-3,8,10-11\n", (0, 1, 2, 3, 8, 10, 11)),
    ("5,0-1", (0, 1, 5)), ("1,1,0-1", (0, 1)), (" 2 , 4-5 ", (2, 4, 5)), ("7-7", (7,)),
    ("007", (7,)),
])
def test_parse_cpulist(text, cpus):
    assert parse_cpulist(text) == cpus


@pytest.mark.parametrize("text", ["", " ", ",", "0,", ",1", "1-", "-1", "3-1", "a", "0x1",
                                  "1 2", "0-1-2", "1:2", "0-15:2", "65536", "99999999999",
                                  "١", "+1", "1.0"])
def test_parse_cpulist_rejects(text):
    with pytest.raises(ValueError) as info:
        parse_cpulist(text)
    assert "\n" not in str(info.value) and len(str(info.value)) < 80


def test_parse_cpulist_empty_allowed():
    assert parse_cpulist("\n", allow_empty=True) == ()


def _render(cpus, data) -> str:
    """A cpu set as a list of single numbers and ranges, in random order."""
    ordered = sorted(cpus)
    items, i = [], 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1 \
                and data.draw(st.booleans()):
            j += 1
        items.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(data.draw(st.permutations(items)))


@given(st.sets(st.integers(0, MAX_CPUS - 1), min_size=1, max_size=40), st.data())
@FAST
def test_parse_cpulist_round_trip(cpus, data):
    assert parse_cpulist(_render(cpus, data)) == tuple(sorted(cpus))


@given(st.text(max_size=30) | st.text("0123456789-, \n", max_size=30))
@FAST
def test_parse_cpulist_raises_only_value_error(text):
    try:
        result = parse_cpulist(text)
    except ValueError:
        return
    assert result == tuple(sorted(set(result))) and all(0 <= c < MAX_CPUS for c in result)


# ---------------------------------------------------------------------------
# wire form


@pytest.mark.parametrize("name", ["vm", "2s4c2t", "broken"])
def test_wire_round_trip(name):
    topo = tree(name)
    wire = json.loads(json.dumps(to_wire(topo)))
    assert from_wire(wire) == topo


# Rows for make_topology (hypothesis cannot print the package's records, so tests
# build the Topology themselves).
topology_rows = st.lists(
    st.tuples(st.integers(0, 300), st.integers(0, 8), st.integers(0, 3), st.integers(0, 3),
              st.integers(0, 3), st.none() | st.integers(0, 3), st.none() | st.integers(0, 3)),
    min_size=1, max_size=24, unique_by=lambda r: r[0])


def build(rows) -> Topology:
    # cores nest in packages and caches: make the core key carry them
    return make_topology((c, (core, pkg, l2, l1), pkg, numa, l3, l2, l1)
                         for c, core, pkg, numa, l3, l2, l1 in rows)


@given(topology_rows)
@FAST
def test_wire_round_trip_any(rows):
    topo = build(rows)
    wire = to_wire(topo)
    assert from_wire(json.loads(json.dumps(wire))) == topo
    # canonical already: building it again from its own rows changes nothing
    assert make_topology(
        tuple(r) + (topo.l2[i] if topo.l2 else None, topo.l1[i] if topo.l1 else None)
        for i, r in enumerate(topo.cpus)) == topo
    for kind in KINDS:
        groups = objects(topo, kind)
        assert sorted(c for g in groups for c in g) == sorted(topo.cpu_ids())
        assert count(topo, kind) == len(groups)


@pytest.mark.parametrize("data", [
    None, [], "x", {}, {"cpus": []}, {"cpus": [[0, 0, 0, 0]]}, {"cpus": [[0, 0, 0, 0, 0, 0]]},
    {"cpus": [[0, 0, 0, 0, -1]]}, {"cpus": [[0, 0, 0, 0, True]]}, {"cpus": [[0, 0, 0, 0, 1.0]]},
    {"cpus": [[MAX_CPUS, 0, 0, 0, 0]]}, {"cpus": [(0, 0, 0, 0, 0)]}, {"cpus": "0-1"},
    {"cpus": [[0, 0, 0, 0, 0], [0, 1, 0, 0, 0]]},
    {"cpus": [[0, 0, 0, 0, 0], [1, 0, 1, 0, 0]]},              # core 0 in two packages
    {"cpus": [[0, 0, 0, 0, 0]], "l2": [0, 1]}, {"cpus": [[0, 0, 0, 0, 0]], "l1": "x"},
    {"cpus": [[0, 0, 0, 0, 0], [1, 0, 0, 0, 0]], "l2": [0, 1]},  # core 0 in two L2s
    {"cpus": [[0, 0, 0, 0, 0]], "extra": 1}, {"cpus": [[0, 0, 0, 0, 0]], 1: 2},
    {"cpus": [[0, 0, 0, 0, 0]] * (MAX_CPUS + 1)},
])
def test_from_wire_rejects(data):
    with pytest.raises(ValueError) as info:
        from_wire(data)
    assert "\n" not in str(info.value)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-3, MAX_CPUS + 2) | st.floats() | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(
        st.sampled_from(["cpus", "l2", "l1", "x"]) | st.text(max_size=3), inner, max_size=4),
    max_leaves=40)


@given(json_values | st.fixed_dictionaries(
    {"cpus": st.lists(st.lists(st.integers(-1, 40), min_size=4, max_size=6), max_size=8)},
    optional={"l2": st.lists(st.integers(-1, 4), max_size=8),
              "l1": st.lists(st.integers(-1, 4), max_size=8)}))
@FAST
def test_from_wire_fuzz(data):
    try:
        topo = from_wire(data)
    except ValueError:
        return
    assert from_wire(to_wire(topo)) == topo


# ---------------------------------------------------------------------------
# --report-bindings text


def test_binding_text_on_this_shape():
    topo = tree("vm")
    assert describe_binding(topo, {0}) == "socket 0[core 0[hwt 0]]: [B/.]"
    assert describe_binding(topo, [1]) == "socket 0[core 1[hwt 0]]: [./B]"
    assert describe_binding(topo, {0, 1}) is None          # all: "not bound"
    assert describe_binding(topo, ()) is None
    assert describe_binding(topo, {1, 7}) == "socket 0[core 1[hwt 0]]: [./B]"
    assert report_binding(0, topo, {0}) == "MCW rank 0 bound to socket 0[core 0[hwt 0]]: [B/.]"
    assert report_binding(3, topo, {0, 1}) == \
        "MCW rank 3 is not bound (or bound to all available processors)"


def test_binding_text_two_sockets():
    topo = tree("2s4c2t")
    assert describe_binding(topo, {0, 8}) == \
        "socket 0[core 0[hwt 0-1]]: [BB/../../..][../../../..]"
    assert describe_binding(topo, {9}) == "socket 0[core 1[hwt 1]]: [../.B/../..][../../../..]"
    # core numbers run across the host; items come in socket then core order
    assert describe_binding(topo, {13, 4, 0}) == (
        "socket 0[core 0[hwt 0]], socket 1[core 4[hwt 0]], socket 1[core 5[hwt 1]]: "
        "[B./../../..][B./.B/../..]")
    socket1 = objects(topo, "socket")[1]
    assert binding_words(topo, socket1) == ", ".join(
        f"socket 1[core {c}[hwt 0-1]]" for c in range(4, 8))
    assert binding_map(topo, socket1) == "[../../../..][BB/BB/BB/BB]"
    assert describe_binding(topo, topo.cpu_ids()) is None


def test_binding_text_hwt_ranges():
    # four threads per core: hwt lists are ranges of positions within the core
    topo = make_topology([(c, c // 4, 0, 0, 0) for c in range(8)])
    assert binding_words(topo, {0, 2, 3}) == "socket 0[core 0[hwt 0,2-3]]"
    assert binding_map(topo, {0, 2, 3, 5}) == "[B.BB/.B..]"


def test_binding_text_of_a_restricted_topology():
    topo = tree("2s4c2t", allowed={1, 9, 4, 6})
    assert describe_binding(topo, {9}) == "socket 0[core 0[hwt 1]]: [.B][./.]"


def test_the_topology_cache_is_used_and_survives_garbage(tmp_path):
    import marshal
    import subprocess
    from helpers import clean_env, cmd
    env = clean_env(XDG_CACHE_HOME=str(tmp_path))
    show = cmd("--display-topo", "-n", "1", "true")
    first = subprocess.run(show, capture_output=True, env=env, timeout=60)
    assert first.returncode == 0, first.stderr
    [cache] = list((tmp_path / "mslaunch").glob("topology-*"))
    key, wire = marshal.loads(cache.read_bytes())
    assert wire["cpus"]
    # A cache that lies about this host is not believed: its key does not match
    cache.write_bytes(marshal.dumps((b"another boot", {"cpus": [[0, 0, 0, 0, 0]]})))
    again = subprocess.run(show, capture_output=True, env=env, timeout=60)
    assert again.stdout == first.stdout
    for junk in (b"", b"\x00garbage", marshal.dumps((key, {"cpus": "nonsense"}))):
        cache.write_bytes(junk)
        r = subprocess.run(show, capture_output=True, env=env, timeout=60)
        assert r.returncode == 0 and r.stdout == first.stdout, r.stderr
