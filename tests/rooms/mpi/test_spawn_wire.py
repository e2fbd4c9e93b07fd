"""The spawn request on the PMI wires and on the agents' link: property tests."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from mslaunch.mpi.pmi.spawn import spawn_from_v1, spawn_from_v2, v2_pairs
from mslaunch.wire.jobframe import read_spawn, spawn_request_body
from mslaunch.wire.link import LinkError
from mslaunch.core.spec import SpawnCommand, SpawnRequest

text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\n\0;"),
               max_size=12)
nonempty = text.filter(bool)
pairs = st.lists(st.tuples(nonempty, text), max_size=3).map(tuple)
commands = st.builds(SpawnCommand, program=nonempty, args=st.lists(text, max_size=4).map(tuple),
                     nprocs=st.integers(1, 5), info=pairs)
requests = st.builds(SpawnRequest, commands=st.lists(commands, min_size=1, max_size=3).map(tuple),
                     preput=pairs)


def v1_segments(req: SpawnRequest):
    """The segments MPICH's PMI-1 client writes for ``req`` (its PMIU_msg_set_query_spawn)."""
    segs = []
    for i, c in enumerate(req.commands):
        seg = [("nprocs", str(c.nprocs)), ("execname", c.program),
               ("totspawns", str(len(req.commands))), ("spawnssofar", str(i + 1)),
               ("argcnt", str(len(c.args)))]
        seg += [(f"arg{j + 1}", a) for j, a in enumerate(c.args)]
        if i == 0:
            seg.append(("preput_num", str(len(req.preput))))
            for j, (k, v) in enumerate(req.preput):
                seg += [(f"preput_key_{j}", k), (f"preput_val_{j}", v)]
        seg.append(("info_num", str(len(c.info))))
        for j, (k, v) in enumerate(c.info):
            seg += [(f"info_key_{j}", k), (f"info_val_{j}", v)]
        segs.append(seg)
    return segs


def v2_body(req: SpawnRequest, base: int) -> str:
    """A PMI-2 spawn frame's body (``base``: 0 as MPICH numbers argv, 1 as the document)."""
    parts = [("cmd", "spawn"), ("ncmds", str(len(req.commands))),
             ("preputcount", str(len(req.preput)))]
    for j, (k, v) in enumerate(req.preput):
        parts += [(f"ppkey{j}", k), (f"ppval{j}", v)]
    for c in req.commands:
        parts += [("subcmd", c.program), ("maxprocs", str(c.nprocs)),
                  ("argc", str(len(c.args)))]
        parts += [(f"argv{j + base}", a) for j, a in enumerate(c.args)]
        parts.append(("infokeycount", str(len(c.info))))
        for j, (k, v) in enumerate(c.info):
            parts += [(f"infokey{j}", k), (f"infoval{j}", v)]
    return "".join(f"{k}={v};" for k, v in parts)


@given(requests)
def test_v1_spawn_reads_back(req):
    assert spawn_from_v1(v1_segments(req)) == req


@given(requests, st.sampled_from([0, 1]))
def test_v2_spawn_reads_back(req, base):
    pairs_ = v2_pairs(v2_body(req, base))
    assert pairs_[0] == ("cmd", "spawn")
    assert spawn_from_v2(pairs_[1:]) == req


@given(requests)
def test_relayed_spawn_reads_back(req):
    import json
    body = json.loads(json.dumps(spawn_request_body(req)))
    assert read_spawn(body) == req


junk_pairs = st.lists(st.tuples(st.sampled_from(
    ["nprocs", "execname", "totspawns", "spawnssofar", "argcnt", "arg1", "arg2", "info_num",
     "info_key_0", "info_val_0", "preput_num", "preput_key_0", "preput_val_0", "mcmd",
     "ncmds", "preputcount", "subcmd", "maxprocs", "argc", "argv0", "argv1", "infokeycount",
     "infokey0", "infoval0", "ppkey0", "ppval0", "x"]),
    st.one_of(st.integers(-3, 200000).map(str), text)), max_size=14)


@settings(max_examples=400)
@given(st.lists(junk_pairs, min_size=0, max_size=4), junk_pairs)
def test_malformed_spawns_are_value_errors(segments, pairs_):
    for parse, arg in ((spawn_from_v1, segments), (spawn_from_v2, pairs_)):
        try:
            req = parse(arg)
        except ValueError:
            continue
        assert isinstance(req, SpawnRequest) and req.commands
        assert all(c.nprocs >= 1 for c in req.commands)


@given(st.recursive(st.none() | st.booleans() | st.integers() | text,
                    lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(text, inner, max_size=3), max_leaves=12))
def test_a_lying_agent_spawn_is_a_link_error(body):
    if not isinstance(body, dict):
        body = {"commands": body}
    try:
        read_spawn(body)
    except LinkError:
        pass
