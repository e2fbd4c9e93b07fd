"""Properties of the process-mapping reader and the msrun option reader.

Random mapping strings from the grammar's tokens (triplets, ``[``,
``]xK``, base-0 numbers, whitespace, junk) must give a list of ``size``
node ids or a ValueError, and a shorter size must read a prefix of a
longer one.  An msrun option reads the same as ``--name=value`` and as
``--name value``.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mslaunch.cli.msrun import parse_msrun
from mslaunch.core.errors import UsageError
from mslaunch.core import procmap as mapping

NUMBER = st.one_of(st.integers(0, 20).map(str), st.integers(0, 40).map(hex),
                   st.integers(0, 20).map(lambda v: "0%o" % v),
                   st.sampled_from(["-1", "+2", "08", "0x", "2147483648"]))
SPACE = st.sampled_from(["", "", " ", "\t", "\n"])
TOKEN = st.one_of(
    st.builds(lambda a, b, c, w: f"({w}{a},{b}{w},{c})", NUMBER, NUMBER, NUMBER, SPACE),
    NUMBER, SPACE, st.builds(lambda k: "]x" + k, NUMBER),
    st.sampled_from(["[", "]x", ")", ",", ",", "(", ";", "vector"]),
)
MAPPING = st.builds(lambda w, items, end: f"{w}({w}vector," + "".join(items) + end,
                    SPACE, st.lists(TOKEN, max_size=10), st.sampled_from([")", "", " )"]))


def _parse(text: str, size: int):
    try:
        return mapping.parse_process_mapping(text, size)
    except ValueError as err:
        assert str(err).startswith("bad process mapping "), err
        return None


@given(MAPPING, st.integers(0, 64), st.integers(0, 64))
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_mapping_reader_total_and_prefix(text, size, other):
    small, big = sorted((size, other))
    longer = _parse(text, big)
    if longer is None:
        return
    assert len(longer) == big
    assert all(0 <= node <= 2**31 - 1 for node in longer)
    assert _parse(text, small) == longer[:small]


def test_mapping_reader_examples():
    parse = mapping.parse_process_mapping
    assert parse("(vector,[0,(1,2,1)]x2,4)", 7) == [0, 1, 2, 0, 1, 2, 4]
    assert parse("(vector,1,[(0,1,2)]x3)", 8) == [1] + [0] * 7     # ")" wraps to the group
    assert parse("(vector,0x1f)", 1) == [31]
    assert parse("(vector,017)", 1) == [15]
    assert parse("junk", 0) == []
    for bad, why in [("(vector,0 1)", "expected ',' at 10"), ("(vector,1]x3)", "bad ']x'"),
                     ("(vector-,0)", "expected 'vector'"), ("(vector,[(1,0,1)]x2)", "assigns no ranks"),
                     ("(vector,1)", "covers 1 of 2 ranks"), ("(vector,(0, 1 2))", "bad triplet at 8")]:
        try:
            parse(bad, 2)
        except ValueError as err:
            assert why in str(err), (bad, err)
        else:
            raise AssertionError(bad)


OPTION_VALUES = {
    "worker_num": ["4", "x"], "local_worker_num": ["2", "9"], "master_port": ["9000", "0"],
    "node_rank": ["1", "-2"], "join": ["True", "maybe"], "tail_worker_log": ["0,1", "7"],
    "master_addr": ["[::1]", " "], "max_restarts": ["0", "-1"],
}


@given(st.lists(st.sampled_from(sorted(OPTION_VALUES)), unique=True, max_size=5), st.data())
@settings(max_examples=100, deadline=None)
def test_msrun_option_forms_agree(names, data):
    pairs = [(name, data.draw(st.sampled_from(OPTION_VALUES[name]))) for name in names]
    joined = [f"--{n}={v}" for n, v in pairs] + ["net.py", "--x"]
    split = [w for n, v in pairs for w in (f"--{n}", v)] + ["net.py", "--x"]
    results = []
    for argv in (joined, split):
        try:
            results.append(parse_msrun(argv))
        except UsageError as err:
            results.append(str(err))
    assert results[0] == results[1]
    if not isinstance(results[0], str):
        assert results[0].argv == ("python", "net.py", "--x")
