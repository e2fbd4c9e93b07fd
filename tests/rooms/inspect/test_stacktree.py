"""The merged stack report and the stack readers' parsers (properties, and examples)."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from mslaunch.machine import native, pydump
from mslaunch.inspect.stacktree import (
    RankStacks,
    from_json,
    label,
    merge,
    rank_ranges,
    render,
    to_json,
)

FRAMES = st.sampled_from(["main (a.py:3)", "step (a.py:9)", "load_batch (a.py:5)",
                          "PMPI_Allreduce (libmpi.so.12)", "?? (libmpi.so.12)", "poll (libc.so.6)"])
THREAD = st.lists(FRAMES, min_size=1, max_size=6).map(tuple)
RANK = st.builds(lambda threads, host, answered, note: (threads, host, answered, note),
                 st.lists(THREAD, max_size=3).map(tuple), st.sampled_from(["h1", "h2", "h3"]),
                 st.booleans(), st.sampled_from(["", "no native frames: not permitted"]))


def stacks_of(items):
    return [RankStacks(rank=i, host=h, pid=1000 + i, threads=t if a else (), note=n, answered=a)
            for i, (t, h, a, n) in enumerate(items)]


@given(st.lists(RANK, min_size=1, max_size=24))
def test_every_rank_is_in_one_class_and_outliers_are_outside_the_biggest(items):
    report = merge(stacks_of(items))
    seen = sorted(r for c in report.classes for r in c)
    assert seen == list(range(len(items)))
    if report.outliers:
        assert not set(report.outliers) & set(report.classes[0])
        assert len(report.classes[0]) > len(report.classes[1])
    assert set(report.silent) == {i for i, it in enumerate(items) if not it[2]}
    assert not set(report.outliers) & set(report.silent)


@given(st.lists(RANK, min_size=1, max_size=24))
def test_json_round_trips_and_text_names_every_rank(items):
    report = merge(stacks_of(items), "title")
    data = json.loads(json.dumps(to_json(report)))
    assert to_json(from_json(data)) == data
    text = render(report)
    assert text.startswith("title\n") and text.endswith("\n")


@given(st.sets(st.integers(0, 200), min_size=1))
def test_rank_ranges_cover_exactly_the_ranks(ranks):
    got = set()
    for part in rank_ranges(ranks).split(","):
        a, _, b = part.partition("-")
        got |= set(range(int(a), int(b or a) + 1))
    assert got == ranks


def test_labels_read_as_documented():
    assert label({0: "h1", 1: "h1", 2: "h2"}) == "ranks 0-2 (3) on h1,h2"
    assert label({3: "h2"}) == "rank 3 on h2"
    assert rank_ranges([5, 0, 1, 2, 7, 8]) == "0-2,5,7-8"


@given(st.text())
def test_the_parsers_take_any_text(text):
    pydump.parse(text)
    native.parse(text)
    native.refusal(text)


def test_a_faulthandler_dump_parses_main_thread_first_innermost_last():
    dump = ('Thread 0x00007f0000000001 (most recent call first):\n'
            '  File "/usr/lib/python3.11/threading.py", line 320 in wait\n'
            '  File "/x/t.py", line 4 in worker\n\n'
            'Current thread 0x00007f0000000002 (most recent call first):\n'
            '  File "/x/t.py", line 9 in load_batch\n'
            '  File "<frozen importlib._bootstrap>", line 241 in _call\n'
            '  File "/x/t.py", line 12 in <module>\n')
    assert pydump.parse(dump) == [("<module> (t.py:12)", "load_batch (t.py:9)"),
                                  ("worker (t.py:4)", "wait (threading.py:320)")]


def test_cython_names_read_as_python_names():
    assert native.cython_name("__pyx_pw_6mpi4py_3MPI_4Comm_293allreduce") == \
        "mpi4py.MPI.Comm.allreduce"
    assert native.cython_name("__pyx_f_6mpi4py_3MPI_PyMPI_Commctx_INTRA.constprop.0") == \
        "mpi4py.MPI.PyMPI_Commctx_INTRA"
    assert native.cython_name("PMPI_Recv") == "PMPI_Recv"


@given(st.text())
def test_any_name_demangles_to_a_string(name):
    assert isinstance(native.cython_name("__pyx_pw_" + name), str)


def test_native_frames_below_python_stop_at_the_mpi_call():
    text = ("PID 1 - process\nTID 1:\n"
            "#0  0x1 __sched_yield - /lib/libc.so.6\n"
            "#1  0x2 - /v/lib/libmpi.so.12\n"
            "#2  0x3 ucp_worker_progress - /v/lib/libucp.so.0\n"
            "#3  0x4 PMPI_Allreduce - /v/lib/libmpi.so.12\n"
            "#4  0x5 __pyx_pw_allreduce - /v/MPI.so\n"
            "#5  0x6 _PyEval_EvalFrameDefault - /v/libpython3.11.so\n"
            "#6  0x7 main - /v/python3.11\n")
    [frames] = native.parse(text).values()
    assert native.labels(frames, below_python=True) == (
        "allreduce (MPI.so)", "PMPI_Allreduce (libmpi.so.12)")
    assert native.labels(frames, below_python=False)[0] == "main (python3.11)"


def test_a_stripped_interpreters_own_frames_are_not_what_a_rank_waits_in():
    """Debian's python3.11 has the interpreter inside and no names for its static
    functions: below the Python frames, time.sleep's libc call is shown, not
    ``?? (python3.11)`` (eu-stack's frames of a real sleeping rank)."""
    text = ("PID 1 - process\nTID 1:\n"
            "#0  0x7f7faf086503 clock_nanosleep@GLIBC_2.2.5 - /lib/x86_64-linux-gnu/libc.so.6\n"
            "#1  0x5d64b4 - /usr/bin/python3.11\n"
            "#2  0x545963 - /usr/bin/python3.11\n"
            "#3  0x53acbc PyObject_Vectorcall - /usr/bin/python3.11\n"
            "#4  0x52b9e0 _PyEval_EvalFrameDefault - /usr/bin/python3.11\n")
    [frames] = native.parse(text).values()
    assert native.labels(frames, below_python=True) == ("clock_nanosleep (libc.so.6)",)
    for name in ("python3", "python", "python3.12d", "libpython3.11.so.1.0"):
        assert native._interpreter_module(name), name
    for name in ("python-foo", "pythonista", "libmpi.so.12", ""):
        assert not native._interpreter_module(name), name


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
                    | st.text(max_size=20),
                    lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=20)


@given(st.dictionaries(st.sampled_from(["threads", "note", "answered", "state", "cpu", "x"]),
                       JSON, max_size=5))
def test_an_agents_answer_for_a_rank_never_breaks_the_report(entry):
    """Whatever a (lying) agent says of a rank becomes a RankStacks or a note."""
    from types import SimpleNamespace

    from mslaunch.inspect.control import _rank_stacks
    rank = SimpleNamespace(spec=SimpleNamespace(rank=3, host=SimpleNamespace(name="h2")), pid=9)
    got = _rank_stacks(rank, entry)  # type: ignore[arg-type]
    assert all(isinstance(f, str) for t in got.threads for f in t)
    render(merge([got]))


@given(st.dictionaries(st.sampled_from(["id", "timeout", "x"]), JSON, max_size=3))
def test_an_agent_takes_a_malformed_look_request_as_a_link_error(message):
    from mslaunch.machine.loop import Loop
    from mslaunch.wire import link
    from mslaunch.agent.agentlook import AgentLook

    class Sent:
        closed = False
        frames: list = []

        def send(self, data: bytes) -> None:
            self.frames.append(data)

    import json
    from mslaunch.wire import frames
    loop = Loop()
    try:
        look = AgentLook(loop, Sent())  # type: ignore[arg-type]
        try:
            request = frames.from_launcher(link.TOP, json.dumps(message).encode())
        except link.LinkError:
            return
        assert isinstance(request, frames.Look)
        look.on_frame(request, {})
    finally:
        loop.close()


@given(st.dictionaries(st.integers(0, 50), st.lists(THREAD, max_size=2), max_size=12))
def test_stacks_merged_on_a_host_expand_to_the_same_stacks(threads_by_rank):
    from mslaunch.agent.agentlook import same_as_earlier
    rows = {k: {"threads": [list(t) for t in v], "note": ""} for k, v in threads_by_rank.items()}
    sent = json.loads(json.dumps({str(k): v for k, v in same_as_earlier(rows).items()}))
    for key, row in sent.items():
        if "threads_of" in row:
            assert "threads" not in row
            row["threads"] = sent[str(row["threads_of"])]["threads"]
        assert row["threads"] == rows[int(key)]["threads"]
