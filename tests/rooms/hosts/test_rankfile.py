"""Tests for mslaunch.hosts.rankfile: Open MPI rankfiles and slot specs."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import DATA
from mslaunch.core.errors import HostfileError
from mslaunch.hosts.rankfile import (
    MAX_FILE_BYTES,
    MAX_INDEX,
    MAX_RANKS,
    RankEntry,
    SlotPart,
    SlotSpec,
    missing_ranks,
    parse_rankfile,
    parse_rankfile_text,
    parse_slot,
    slot_cpus,
)
from mslaunch.core.cputopo import make_topology
from mslaunch.machine.topology import read_topology

TREES = os.path.join(DATA, "topology")
FAST = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def topo(name: str):
    return read_topology(os.path.join(TREES, name), allowed=range(1024))


def parse(text: str) -> list:
    """(rank, host, relative, canonical slot, origin) of each entry of rf."""
    return [(e.rank, e.host, e.relative, str(e.slot), e.origin)
            for e in parse_rankfile_text(text, "rf")]


def error_of(text: str) -> str:
    with pytest.raises(HostfileError) as info:
        parse_rankfile_text(text, "rf")
    message = str(info.value)
    assert "\n" not in message
    return message


def cpu(*ranges):
    return SlotPart("cpu", tuple(ranges))


def sock(ids, cores=None):
    return SlotPart("socket", ids, cores)


# ---------------------------------------------------------------------------
# grammar


@pytest.mark.parametrize("text, expected", [
    # the forms measured with Open MPI 4.1.4
    ("rank 0=localhost slot=1\n", [(0, "localhost", None, "1", "rf:1")]),
    ("rank 0 = localhost slot = 1\n", [(0, "localhost", None, "1", "rf:1")]),
    ("rank 0=vm slot=0,1", [(0, "vm", None, "0-1", "rf:1")]),
    ("rank 0=vm slot=0:0-1", [(0, "vm", None, "0:0-1", "rf:1")]),
    ("rank 0=vm slot=0:1", [(0, "vm", None, "0:1", "rf:1")]),
    ("rank 0=vm slot=0:*", [(0, "vm", None, "0:*", "rf:1")]),
    ("rank 0=vm slot=p0", [(0, "vm", None, "0:*", "rf:1")]),
    ("rank 0=vm slot=s0:c1", [(0, "vm", None, "0:1", "rf:1")]),
    ("rank 0=+n0 slot=1", [(0, "+n0", 0, "1", "rf:1")]),
    # comments, blank lines, spacing, case, CRLF
    ("# a rankfile\n\nrank 1=b slot=0 # trailing\n   # indented\nrank 0=a slot=1\n",
     [(0, "a", None, "1", "rf:5"), (1, "b", None, "0", "rf:3")]),
    ("\trank\t2 =node01\tslot= 3\r\n", [(2, "node01", None, "3", "rf:1")]),
    ("RANK 0=a SLOT=1\nRank 1=a slots=2",
     [(0, "a", None, "1", "rf:1"), (1, "a", None, "2", "rf:2")]),
    ("rank 007=a slot=1#x", [(7, "a", None, "1", "rf:1")]),
    # more slot forms
    ("rank 0=a slot=p0:1", [(0, "a", None, "0:1", "rf:1")]),
    ("rank 0=a slot=S1:C0-2", [(0, "a", None, "1:0-2", "rf:1")]),
    ("rank 0=a slot=0,1:0", [(0, "a", None, "0-1:0", "rf:1")]),
    ("rank 0=a slot=*:0", [(0, "a", None, "*:0", "rf:1")]),
    ("rank 0=a slot=s*", [(0, "a", None, "*:*", "rf:1")]),
    ("rank 0=a slot=s0-1", [(0, "a", None, "0-1:*", "rf:1")]),
    ("rank 0=a slot=3,1-2,0", [(0, "a", None, "0-3", "rf:1")]),
    ("rank 0=a slot=0:0;1:0", [(0, "a", None, "0:0;1:0", "rf:1")]),
    # hosts
    ("rank 0=[::1] slot=0", [(0, "::1", None, "0", "rf:1")]),
    ("rank 0=10.0.0.7 slot=0", [(0, "10.0.0.7", None, "0", "rf:1")]),
    ("rank 0=+n12 slot=0", [(0, "+n12", 12, "0", "rf:1")]),
])
def test_valid(text, expected):
    assert parse(text) == expected


def test_out_of_order_is_fine():
    # Open MPI 4.1.4 says "rank 0 is already assigned" here.
    assert [e.rank for e in parse_rankfile_text("rank 1=a slot=0\nrank 0=a slot=1\n", "rf")] \
        == [0, 1]


def test_entry_record():
    (entry,) = parse_rankfile_text("rank 3=+n1 slot=1:0-1;4", "f.rf")
    assert entry == RankEntry(3, "+n1", 1, SlotSpec((sock(((1, 1),), ((0, 1),)), cpu((4, 4)))),
                              "f.rf:1")


@pytest.mark.parametrize("text, wanted", [
    ("bogus line here", "rf:1: expected 'rank N=HOST slot=SPEC', got 'bogus line here'"),
    ("\n\nrank 0=localhost", "rf:3: rank 0 has no slot=SPEC (mslaunch requires one"),
    ("rank 0=a slot=0\nrank 0=a slot=1", "rf:2: rank 0 is already assigned at rf:1"),
    ("rank 1=a slot=0\n#\nrank 0=a slot=1\nrank 1=b slot=1",
     "rf:4: rank 1 is already assigned at rf:1"),
    ("rank x=a slot=0", "rf:1: rank must be a number, got 'x'"),
    ("rank -1=a slot=0", "rf:1: rank must be a number, got '-1'"),
    ("rank 100000=a slot=0", "rf:1: rank '100000' is too large (at most 99999)"),
    ("rank 0 a slot=0", "rf:1: missing host after 'rank 0'"),
    ("rank 0= slot=0", "rf:1: missing host after 'rank 0'"),
    ("rank 0=slot=0", "rf:1: missing host after 'rank 0'"),
    ("rank", "rf:1: expected 'rank N=HOST slot=SPEC', got 'rank'"),
    ("rank=0 a slot=0", "rf:1: expected 'rank N=HOST slot=SPEC'"),
    ("rank0=a slot=0", "rf:1: expected 'rank N=HOST slot=SPEC'"),
    ("rank 0=a slot", "rf:1: unexpected 'slot'"),
    ("rank 0=a slot=", "rf:1: bad slot spec '': empty slot spec"),
    ("rank 0=a slot=1 slot=2", "rf:1: slot= given twice for rank 0"),
    ("rank 0=a slot=1 extra", "rf:1: unexpected 'extra'"),
    ("rank 0=a slot=1 max_slots=2", "rf:1: unexpected 'max_slots=2'"),
    ("rank 0=u@a slot=1", "rf:1: user@host is not supported ('u@a'): set a per-host user"),
    ("rank 0=a slot=1 username=u", "rf:1: token 'username=u' is not supported"),
    ("rank 0=+n slot=1", "rf:1: relative host must be +nN"),
    ("rank 0=+e0 slot=1", "rf:1: relative host must be +nN"),
    ("rank 0=+n100000 slot=1", "rf:1: relative host must be +nN"),
    ("rank 0=a:2 slot=1", "rf:1: invalid host name 'a:2'"),
    ("rank 0=[::1 slot=1", "rf:1: invalid host name '[::1'"),
    ("rank 0=[a] slot=1", "rf:1: invalid IPv6 address '[a]'"),
    ("rank 0=a slot=x", "rf:1: bad slot spec 'x': cpu 'x' is not a number"),
    ("rank 0=a slot=*", "rf:1: bad slot spec '*': cpu '*' is not a number"),
    ("rank 0=a slot=3-1", "rf:1: bad slot spec '3-1': reversed cpu range '3-1'"),
    ("rank 0=a slot=0:", "rf:1: bad slot spec '0:': missing core number"),
    ("rank 0=a slot=:1", "rf:1: bad slot spec ':1': missing socket number"),
    ("rank 0=a slot=0:c0,c1", "rf:1: bad slot spec '0:c0,c1': core 'c1' is not a number"),
    ("rank 0=a slot=0:1:2", "rf:1: bad slot spec '0:1:2': more than one ':'"),
    ("rank 0=a slot=0;", "rf:1: bad slot spec '0;': empty part"),
    ("rank 0=a slot=0,", "rf:1: bad slot spec '0,': cpu '' is not a number"),
    ("rank 0=a slot=65536", "rf:1: bad slot spec '65536': cpu '65536' is out of range"),
    ("rank 0=a slot=0:1-99999999999", "out of range (at most 65535)"),
    ("", "rankfile rf: contains no ranks"),
    ("# nothing\n\n", "rankfile rf: contains no ranks"),
])
def test_errors(text, wanted):
    assert wanted in error_of(text)


def test_errors_show_short_excerpts():
    message = error_of("x" * 5000)
    assert message.startswith("rf:1: ") and len(message) < 120
    message = error_of("rank 0=a slot=" + "1," * 3000)
    assert len(message) < 160
    message = error_of("rank 0=" + "h" * 300 + " slot=1")
    assert len(message) < 160


def test_file(tmp_path):
    path = tmp_path / "rf"
    path.write_text("rank 0=a slot=0\nrank 2=a slot=1\n")
    entries = parse_rankfile(str(path))
    assert [(e.rank, e.origin) for e in entries] == [(0, f"{path}:1"), (2, f"{path}:2")]
    assert missing_ranks(entries, 3) == [1]
    assert missing_ranks(entries, 1) == []
    assert missing_ranks(entries, 5) == [1, 3, 4]
    path.write_text("rank 0=a slot=0\nrank 0=a slot=1\n")
    with pytest.raises(HostfileError, match=f"^{path}:2: rank 0 is already assigned at {path}:1$"):
        parse_rankfile(str(path))


def test_unreadable_and_huge_files(tmp_path):
    with pytest.raises(HostfileError, match="^rankfile /nonexistent/rf: cannot read"):
        parse_rankfile("/nonexistent/rf")
    with pytest.raises(HostfileError, match="cannot read"):
        parse_rankfile(str(tmp_path))
    huge = tmp_path / "huge"
    with open(huge, "wb") as fh:
        fh.truncate(MAX_FILE_BYTES + 1)
    with pytest.raises(HostfileError, match="larger than"):
        parse_rankfile(str(huge))


# ---------------------------------------------------------------------------
# slot specs on topologies


@pytest.mark.parametrize("spec, cpus", [
    ("0", (0,)), ("1", (1,)), ("0,1", (0, 1)), ("0-1", (0, 1)), ("0:0-1", (0, 1)),
    ("0:1", (1,)), ("0:*", (0, 1)), ("p0", (0, 1)), ("s0:c1", (1,)), ("*:*", (0, 1)),
    ("1;0:0", (0, 1)),
])
def test_slot_cpus_this_shape(spec, cpus):
    assert slot_cpus(parse_slot(spec), topo("vm")) == cpus
    assert slot_cpus(parse_slot(spec), topo("vm"), hwthread_cpus=True) == cpus


@pytest.mark.parametrize("spec, cores, hwthreads", [
    # plain numbers count cores (as Open MPI 4 does), or hardware threads on request
    ("0", (0, 8), (0,)),
    ("1", (1, 9), (8,)),
    ("4-5", (4, 5, 12, 13), (2, 10)),
    ("1:0", (4, 12), (4,)),                    # core numbers count within the socket
    ("1:1-2", (5, 6, 13, 14), (5, 12)),
    ("0:*", (0, 1, 2, 3, 8, 9, 10, 11), (0, 1, 2, 3, 8, 9, 10, 11)),
    ("s1", (4, 5, 6, 7, 12, 13, 14, 15), (4, 5, 6, 7, 12, 13, 14, 15)),
    ("*:3", (3, 7, 11, 15), (9, 13)),
    ("0,1:0", (0, 4, 8, 12), (0, 4)),
])
def test_slot_cpus_two_sockets(spec, cores, hwthreads):
    two = topo("2s4c2t")
    assert slot_cpus(parse_slot(spec), two) == cores
    assert slot_cpus(parse_slot(spec), two, hwthread_cpus=True) == hwthreads


@pytest.mark.parametrize("name, spec, hw, wanted", [
    # Open MPI 4.1.4 fails with no message at all for slot=5 on a 2-core host.
    ("vm", "5", False, "no cpu 5 (slot numbers count cores; the host has 0-1)"),
    ("vm", "0-2", False, "no cpu 2 (slot numbers count cores; the host has 0-1)"),
    ("vm", "1:0", False, "no socket 1 (the host has 1 socket)"),
    ("vm", "0:2", False, "socket 0 has no core 2 (it has 0-1)"),
    ("vm", "0,3:0", False, "no socket 3 (the host has 1 socket)"),
    ("2s4c2t", "8", False, "no cpu 8 (slot numbers count cores; the host has 0-7)"),
    ("2s4c2t", "16", True, "no cpu 16 (slot numbers count hwthreads; the host has 0-15)"),
    ("2s4c2t", "1:4", False, "socket 1 has no core 4 (it has 0-3)"),
    ("2s4c2t", "1:8", True, "socket 1 has no hwthread 8 (it has 0-7)"),
    ("2s4c2t", "2-5:0", False, "no socket 2 (the host has 2 sockets)"),
])
def test_slot_cpus_errors(name, spec, hw, wanted):
    with pytest.raises(ValueError) as info:
        slot_cpus(parse_slot(spec), topo(name), hwthread_cpus=hw)
    assert str(info.value) == wanted


def test_slot_cpus_single_cpu_host():
    one = make_topology([(3, 0, 0, 0, 0)])
    assert slot_cpus(parse_slot("0"), one) == (3,)
    with pytest.raises(ValueError,
                       match=r"^no cpu 1 \(slot numbers count cores; the host has only 0\)$"):
        slot_cpus(parse_slot("1"), one)


def test_huge_ranges_are_not_expanded():
    spec = parse_slot(f"0-{MAX_INDEX - 1}")
    assert spec == SlotSpec((cpu((0, MAX_INDEX - 1)),))
    with pytest.raises(ValueError, match="no cpu 2"):
        slot_cpus(spec, topo("vm"))


# ---------------------------------------------------------------------------
# properties

ids = st.integers(0, 40)


def ranges_of(values) -> tuple:
    out = []
    for v in sorted(set(values)):
        if out and v == out[-1][1] + 1:
            out[-1][1] = v
        else:
            out.append([v, v])
    return tuple((a, b) for a, b in out)


id_sets = st.sets(ids, min_size=1, max_size=6)
parts = st.one_of(
    id_sets.map(lambda s: SlotPart("cpu", ranges_of(s))),
    st.tuples(st.none() | id_sets, st.none() | id_sets).map(
        lambda p: SlotPart("socket", None if p[0] is None else ranges_of(p[0]),
                           None if p[1] is None else ranges_of(p[1]))),
)
specs = st.lists(parts, min_size=1, max_size=3).map(lambda ps: SlotSpec(tuple(ps)))
hosts = st.one_of(
    st.sampled_from(["localhost", "vm", "node-01", "a.b.c", "10.1.2.3", "n_1"]),
    st.integers(0, 99).map(lambda n: f"+n{n}"),
    st.just("[fe80::1]"),
)


def render_list(ranges, data) -> str:
    """Ranges as text, split and shuffled at random (same set of numbers)."""
    if ranges is None:
        return "*"
    items = []
    for a, b in ranges:
        cut = data.draw(st.integers(a, b))
        for lo, hi in ((a, cut), (cut + 1, b)):
            if lo <= hi:
                items.append(str(lo) if lo == hi and data.draw(st.booleans()) else f"{lo}-{hi}")
    return ",".join(data.draw(st.permutations(items)))


def render_part(part: SlotPart, data) -> str:
    if part.kind == "cpu":
        return render_list(part.ids, data)
    letter = data.draw(st.sampled_from(["", "s", "S", "p", "P"]))
    sockets = render_list(part.ids, data)
    if part.cores is None and letter and data.draw(st.booleans()):
        return letter + sockets
    return f"{letter}{sockets}:{data.draw(st.sampled_from(['', 'c', 'C']))}" \
           f"{render_list(part.cores, data)}"


space = st.sampled_from(["", " ", "\t", "  "])
gap = st.sampled_from([" ", "\t", "  "])
comments = st.text(st.characters(blacklist_characters="\n\r"), max_size=10)
fillers = st.lists(st.sampled_from(["", "   ", "#", "# rank 0=x slot=1"]), max_size=2)
styles = st.tuples(space, st.sampled_from(["rank", "RANK", "Rank"]), gap, space, space, gap,
                   st.sampled_from(["slot", "slots", "SLOT"]), space, space, space,
                   st.just("") | comments.map(lambda c: "#" + c))


@given(st.lists(st.tuples(hosts, specs), min_size=1, max_size=8), st.data())
@settings(max_examples=100, deadline=None,   # rendering draws many small choices per line
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.large_base_example])
def test_rendered_entries_parse_back(items, data):
    ranks = data.draw(st.lists(st.integers(0, 20) | st.integers(0, MAX_RANKS - 1),
                               min_size=len(items), max_size=len(items), unique=True))
    wanted = {}
    lines = []
    order = data.draw(st.permutations(range(len(items))))
    for i in order:
        host, spec = items[i]
        rank = ranks[i]
        lines.extend(data.draw(fillers))
        slot = ";".join(render_part(p, data) for p in spec.parts)
        s = data.draw(styles)
        line = (f"{s[0]}{s[1]}{s[2]}{rank}{s[3]}={s[4]}{host}{s[5]}{s[6]}{s[7]}={s[8]}{slot}"
                f"{s[9]}{s[10]}")
        lines.append(line)
        name = host[1:-1] if host.startswith("[") else host
        relative = int(host[2:]) if host.startswith("+n") else None
        wanted[rank] = RankEntry(rank, name, relative, spec, f"rf:{len(lines)}")
    newline = data.draw(st.sampled_from(["\n", "\r\n"]))
    got = parse_rankfile_text(newline.join(lines), "rf")
    assert got == [wanted[r] for r in sorted(wanted)]
    for entry in got:
        assert parse_slot(str(entry.slot)) == entry.slot


@given(st.one_of(
    st.text(max_size=200),
    st.text("rank slot=+n0123456789:,-;*#@[]psc \t\r\n", max_size=120),
    st.lists(st.sampled_from(["rank", " ", "=", "0", "1", "a", "slot", "+n1", ":", ";", ",",
                              "-", "*", "s", "p", "c", "#", "\n", "@", "[::1]", "99999999"]),
             max_size=30).map("".join),
))
@FAST
def test_any_text_raises_only_hostfile_error(text):
    try:
        entries = parse_rankfile_text(text, "rf")
    except HostfileError as exc:
        assert "\n" not in str(exc)
        return
    assert entries and all(isinstance(e, RankEntry) for e in entries)
    assert len({e.rank for e in entries}) == len(entries)


@given(st.text(max_size=40) | st.text("0123456789,-:;*sSpPcC", max_size=40))
@FAST
def test_any_slot_text_raises_only_value_error(text):
    try:
        spec = parse_slot(text)
    except ValueError as exc:
        assert "\n" not in str(exc)
        return
    assert parse_slot(str(spec)) == spec
    two = topo("2s4c2t")
    try:
        cpus = slot_cpus(spec, two)
    except ValueError:
        return
    assert cpus and set(cpus) <= set(two.cpu_ids())
