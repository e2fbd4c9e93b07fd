"""The ranks of the ``JOB`` frame and of a spawned job's message: one codec,
written from the :class:`RankSpec` record's own fields and rebuilt from them."""

from __future__ import annotations

from typing import Any, Dict, List

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mslaunch.wire import link
from mslaunch.wire.jobframe import RANK_FIELDS, rank_entries, read_job, read_spawned, spawn_frame
from mslaunch.core.spec import Host, RankSpec, replace

text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"),
               max_size=10)
nonempty = text.filter(bool)
names = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0="),
                min_size=1, max_size=8)
envs = st.dictionaries(names, text, max_size=4)


@st.composite
def rank_specs(draw, size: int) -> List[RankSpec]:
    """``size`` ranks of one host as the launcher plans them (any host name, any
    output paths, label and console: the launcher's own)."""
    specs = []
    numbers = draw(st.lists(st.integers(size, 1 << 40), min_size=size, max_size=size,
                            unique=True))
    for rank, number in zip(draw(st.permutations(range(size))), numbers):
        host = Host(name=draw(nonempty), slots=draw(st.integers(1, 64)),
                    max_slots=draw(st.none() | st.integers(1, 64)),
                    local=draw(st.booleans()), node_id=draw(st.integers(0, 1000)))
        specs.append(RankSpec(
            rank=rank, app=draw(st.integers(0, 5)), host=host,
            local_rank=draw(st.integers(0, 63)), local_size=draw(st.integers(1, 64)),
            argv=tuple(draw(st.lists(text, min_size=1, max_size=4))), env=draw(envs),
            cwd=draw(nonempty), stdout_path=draw(st.none() | text),
            stderr_path=draw(st.none() | text),
            cpus=draw(st.none() | st.lists(st.integers(0, 1 << 20), min_size=1,
                                            max_size=4).map(tuple)),
            stdin=draw(st.sampled_from(["null", "pipe", "inherit"])),
            inherit=draw(st.sampled_from(["remote", "launcher", "none"])),
            path_prefix=draw(st.none() | text), program=draw(st.none() | nonempty),
            search=tuple(draw(st.lists(text, max_size=3))), session_dir=draw(st.booleans()),
            job=draw(st.integers(1, 9)),
            index=draw(st.sampled_from([None, number, rank])),
            label=draw(st.none() | text), console=draw(st.none() | st.booleans())))
    return specs


def on_the_wire(body: Dict[str, Any]) -> Dict[str, Any]:
    """``body`` as the agent reads it: encoded and decoded as a link frame."""
    frame = link.encode(link.JOB, body)
    return link.decode_json(link.JOB, frame[link.HEAD.size:])


def as_read(spec: RankSpec, host: str, slots: int, env: Dict[str, str]) -> RankSpec:
    """What the agent gets back: the same record, but the host is its own, the
    output paths, label and console are the launcher's, and ``env`` is what the
    entry carried (the agent composes the rest)."""
    return replace(spec, host=Host(host, slots, None, True, spec.host.node_id), env=env,
                   stdout_path=None, stderr_path=None, label=None, console=None)


@settings(max_examples=150, deadline=None, database=None)
@given(st.integers(1, 4).flatmap(lambda n: rank_specs(n)), envs, st.none() | nonempty)
def test_a_job_frame_s_ranks_are_read_back_as_they_were_written(specs, common, host):
    body = {"kvsname": "kvs_1", "size": len(specs), "host": host, "common_env": common,
            "ranks": rank_entries(specs, common)}
    job = read_job(on_the_wire(body), "here")
    assert job["common_env"] == common
    assert len(job["ranks"]) == len(specs)
    for sent, got in zip(specs, job["ranks"]):
        assert isinstance(got, RankSpec)
        assert {**common, **got.env} == {**common, **sent.env}
        assert got == as_read(sent, host or "here", len(specs), got.env)


@settings(max_examples=150, deadline=None, database=None)
@given(st.integers(1, 4).flatmap(lambda n: rank_specs(n)), st.integers(2, 99),
       st.booleans())
def test_a_spawned_job_s_ranks_are_read_back_as_they_were_written(specs, number, tcp):
    size = len(specs)
    body = spawn_frame(number, "kvs_2", "kvs_1", specs, size, "(vector,(0,1,1))",
                       [s.app for s in sorted(specs, key=lambda s: s.rank)], size, tcp)
    job = read_spawned(on_the_wire(body), "h1", 7)
    assert (job["kvs"], job["spawner"], job["number"], job["size"]) == \
        ("kvs_2", "kvs_1", number, size)
    assert job["pmi"] == ("port" if tcp else "fd")
    for sent, got in zip(specs, job["ranks"]):
        assert got == as_read(sent, "h1", 7, dict(sent.env))


def test_the_entries_carry_the_record_s_own_field_names():
    spec = RankSpec(rank=0, app=0, host=Host("a", 1, None, False, 3), local_rank=0,
                    local_size=1, argv=("x",), env={"A": "1"}, cwd="/", stdout_path="out",
                    stderr_path=None, session_dir=True, index=5)
    entry = rank_entries([spec], {})[0]
    assert set(entry) == set(RANK_FIELDS) | {"node_id", "env"}
    assert (entry["node_id"], entry["session_dir"], entry["index"]) == (3, True, 5)


@pytest.mark.parametrize("field, value", [
    ("node_id", -1), ("node_id", 1.5), ("index", "five"), ("index", True), ("rank", 9),
    ("argv", ["a\0b"]), ("cwd", ""), ("env", {"A=B": "1"}), ("cpus", ["0"]),
    ("inherit", "nobody"), ("job", 0),
])
def test_a_bad_rank_entry_is_a_link_error(field, value):
    spec = RankSpec(rank=0, app=0, host=Host("a", 1, None, False, 0), local_rank=0,
                    local_size=1, argv=("x",), env={}, cwd="/", stdout_path=None,
                    stderr_path=None)
    entry = dict(rank_entries([spec], {})[0], **{field: value})
    with pytest.raises(link.LinkError, match=f"JOB: {field}"):
        read_job({"kvsname": "k", "size": 1, "ranks": [entry]}, "here")


@settings(max_examples=200, deadline=None, database=None)
@given(st.none() | st.lists(st.integers(-3, 70000) | st.booleans() | st.floats() | text,
                            max_size=3))
def test_the_port_range_is_read_back_or_refused(value):
    body = {"kvsname": "k", "size": 1, "ranks": [], "port_range": value}
    good = value is None or (
        len(value) == 2 and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        and 1 <= value[0] <= value[1] <= 65535)
    if good:
        got = read_job(on_the_wire(body), "here")["port_range"]
        assert got == (None if value is None else tuple(value))
    else:
        with pytest.raises(link.LinkError, match="JOB: port_range"):
            read_job(on_the_wire(body), "here")
