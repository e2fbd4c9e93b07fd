"""Tests for mslaunch.hosts: hostfiles, -H lists, Slurm/PBS allocations."""

from __future__ import annotations

import _socket
import os
import re
import socket
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import REPO
from mslaunch.core.errors import HostfileError, UsageError
from mslaunch.hosts import local as hf
from mslaunch.hosts.allocations import allocation_hosts
from mslaunch.hosts.allocations.slurm import expand_nodelist, expand_tasks_per_node
from mslaunch.hosts.hostfile import parse_host_list, parse_hostfile, parse_hostfile_text
from mslaunch.hosts.local import is_local_host
from mslaunch.core.spec import HostEntry

FAST = settings(max_examples=150, deadline=None,
                suppress_health_check=[HealthCheck.too_slow])


def parse(text: str) -> list:
    """Parse as if from hosts.txt; return (name, slots, max_slots, origin)."""
    return [(e.name, e.slots, e.max_slots, e.origin)
            for e in parse_hostfile_text(text, "hosts.txt")]


def error_of(func, *args) -> str:
    with pytest.raises(Exception) as info:
        func(*args)
    message = str(info.value)
    assert "\n" not in message and len(message.splitlines()) == 1
    return message


# ---------------------------------------------------------------------------
# hostfile: valid input

VALID = [
    # --- Open MPI grammar
    ("a slots=4\n", [("a", 4, None, "hosts.txt:1")]),
    ("a slots=4 max_slots=8\n", [("a", 4, 8, "hosts.txt:1")]),
    ("a max_slots=8 slots=4\n", [("a", 4, 8, "hosts.txt:1")]),
    ("a slots=4 max_slots=4\n", [("a", 4, 4, "hosts.txt:1")]),
    ("a max_slots=3\n", [("a", None, 3, "hosts.txt:1")]),
    ("a max-slots=3\n", [("a", None, 3, "hosts.txt:1")]),
    ("a count=3\n", [("a", 3, None, "hosts.txt:1")]),
    ("a cpu=2\n", [("a", 2, None, "hosts.txt:1")]),
    ("a SLOTS=2\n", [("a", 2, None, "hosts.txt:1")]),
    ("a slots=04\n", [("a", 4, None, "hosts.txt:1")]),
    # spacing around '='
    ("a slots = 4\n", [("a", 4, None, "hosts.txt:1")]),
    ("a slots =4\n", [("a", 4, None, "hosts.txt:1")]),
    ("a slots= 4\n", [("a", 4, None, "hosts.txt:1")]),
    ("a\tslots\t=\t4   max_slots =  6\n", [("a", 4, 6, "hosts.txt:1")]),
    # comments and blank lines
    ("# header\n\n   \n\t\na slots=2 # trailing comment\n", [("a", 2, None, "hosts.txt:5")]),
    ("a#comment right after the name\n", [("a", None, None, "hosts.txt:1")]),
    ("a slots=2#x\n", [("a", 2, None, "hosts.txt:1")]),
    ("  # indented comment\n  a   \n", [("a", None, None, "hosts.txt:2")]),
    ("a slots=2 # slots=99 in a comment\n", [("a", 2, None, "hosts.txt:1")]),
    ("a\r\nb slots=2\r\n", [("a", None, None, "hosts.txt:1"), ("b", 2, None, "hosts.txt:2")]),
    ("a", [("a", None, None, "hosts.txt:1")]),  # no final newline
    # --- Hydra grammar
    ("a:4\n", [("a", 4, None, "hosts.txt:1")]),
    ("a:4 max_slots=6\n", [("a", 4, 6, "hosts.txt:1")]),
    ("a:4 # c\nb:1\n", [("a", 4, None, "hosts.txt:1"), ("b", 1, None, "hosts.txt:2")]),
    # both grammars in one file, and both for the same host (explicit counts add)
    ("a:2\nb slots=3\na slots=1\nc\n",
     [("a", 3, None, "hosts.txt:1"), ("b", 3, None, "hosts.txt:2"), ("c", None, None, "hosts.txt:4")]),
    # --- repeats
    ("a\na\n", [("a", 2, None, "hosts.txt:1")]),
    ("a\nb\na\na\n", [("a", 3, None, "hosts.txt:1"), ("b", None, None, "hosts.txt:2")]),
    ("a slots=2\nb\na count=3\n", [("a", 5, None, "hosts.txt:1"), ("b", None, None, "hosts.txt:2")]),
    ("a slots=2 max_slots=6\na slots=4\n", [("a", 6, 6, "hosts.txt:1")]),
    ("a slots=2\na slots=1 max_slots=5\n", [("a", 3, 5, "hosts.txt:1")]),
    ("a slots=2 max_slots=6\na slots=1 max_slots=6\n", [("a", 3, 6, "hosts.txt:1")]),
    ("a max_slots=2\na\n", [("a", 2, 2, "hosts.txt:1")]),
    # --- names
    ("node01.example.com slots=2\n", [("node01.example.com", 2, None, "hosts.txt:1")]),
    ("10.1.2.3:2\n", [("10.1.2.3", 2, None, "hosts.txt:1")]),
    ("[::1]:2\n", [("::1", 2, None, "hosts.txt:1")]),
    ("[fe80::1%eth0] slots=2\n", [("fe80::1%eth0", 2, None, "hosts.txt:1")]),
    ("[::1]\n[::1]\n", [("::1", 2, None, "hosts.txt:1")]),
    ("my_host-2\n", [("my_host-2", None, None, "hosts.txt:1")]),
    ("A\na\n", [("A", None, None, "hosts.txt:1"), ("a", None, None, "hosts.txt:2")]),
]


@pytest.mark.parametrize("text,expected", VALID)
def test_valid_hostfiles(text, expected):
    assert parse(text) == expected


# ---------------------------------------------------------------------------
# hostfile: errors (exact messages)

ERRORS = [
    ("a slots=abc\n", "hosts.txt:1: slots must be a positive integer, got 'abc'"),
    ("a\n\na slots=0\n", None),  # mixing; checked precisely below
    ("x\n\nb slots=0\n", "hosts.txt:3: slots must be a positive integer, got '0'"),
    ("a slots=-1\n", "hosts.txt:1: slots must be a positive integer, got '-1'"),
    ("a slots=+1\n", "hosts.txt:1: slots must be a positive integer, got '+1'"),
    ("a slots=1.5\n", "hosts.txt:1: slots must be a positive integer, got '1.5'"),
    ("a slots=\n", "hosts.txt:1: slots must be a positive integer, got ''"),
    ("a slots = \n", "hosts.txt:1: slots must be a positive integer, got ''"),
    ("a count=x\n", "hosts.txt:1: count must be a positive integer, got 'x'"),
    ("a cpu=0\n", "hosts.txt:1: cpu must be a positive integer, got '0'"),
    ("a slots=\u0664\n", "hosts.txt:1: slots must be a positive integer, got '\u0664'"),
    ("a slots=99999999999\n",
     "hosts.txt:1: slots must be a positive integer no larger than 2147483647, got '99999999999'"),
    ("a max_slots=0\n", "hosts.txt:1: max_slots must be a positive integer, got '0'"),
    ("a slots\n", "hosts.txt:1: missing value for 'slots' (expected slots=N)"),
    ("a max_slots\n", "hosts.txt:1: missing value for 'max_slots' (expected max_slots=N)"),
    ("a foo=1\n", "hosts.txt:1: unknown token 'foo=1' (expected slots=N or max_slots=M)"),
    ("# c\n\n\n\na slots=1 foo=1\n",
     "hosts.txt:5: unknown token 'foo=1' (expected slots=N or max_slots=M)"),
    ("a b\n", "hosts.txt:1: unknown token 'b' (expected slots=N or max_slots=M)"),
    ("a : 4\n", "hosts.txt:1: unknown token ':' (expected slots=N or max_slots=M)"),
    ("a slots=2 slots=3\n", "hosts.txt:1: slot count given twice ('slots=2' and 'slots=3')"),
    ("a:2 slots=3\n", "hosts.txt:1: slot count given twice ('a:2' and 'slots=3')"),
    ("a slots=2 cpu=3\n", "hosts.txt:1: slot count given twice ('slots=2' and 'cpu=3')"),
    ("a max_slots=2 max_slots=3\n", "hosts.txt:1: max_slots given twice (second: 'max_slots=3')"),
    ("a slots=5 max_slots=4\n",
     "hosts.txt:1: max_slots must be >= slots, got slots=5 max_slots=4"),
    ("a:5 max_slots=4\n", "hosts.txt:1: max_slots must be >= slots, got slots=5 max_slots=4"),
    # repeats
    ("a slots=2\nb\na\n",
     "hosts.txt:3: host 'a' has no slot count here but a count at hosts.txt:1 "
     "(list a host once per slot or give its slots=N, not both)"),
    ("a\na slots=2\n",
     "hosts.txt:2: host 'a' has a slot count here but no count at hosts.txt:1 "
     "(list a host once per slot or give its slots=N, not both)"),
    ("a:2\na\n",
     "hosts.txt:2: host 'a' has no slot count here but a count at hosts.txt:1 "
     "(list a host once per slot or give its slots=N, not both)"),
    ("a max_slots=4\na\na max_slots=5\n",
     "hosts.txt:3: conflicting max_slots for host 'a': 5 here, 4 at hosts.txt:1"),
    ("a slots=2 max_slots=3\na slots=2\n",
     "hosts.txt:2: host 'a' has 4 slots in total, more than max_slots=3 (set at hosts.txt:1)"),
    ("a slots=1 max_slots=3\na slots=1 max_slots=3\na slots=2\n",
     "hosts.txt:3: host 'a' has 4 slots in total, more than max_slots=3 (set at hosts.txt:1)"),
    ("a max_slots=1\na\n",
     "hosts.txt:2: host 'a' has 2 slots in total, more than max_slots=1 (set at hosts.txt:1)"),
    ("a slots=2147483647\na slots=1\n",
     "hosts.txt:2: host 'a' has more than 2147483647 slots in total"),
    # Hydra grammar
    ("a:0\n", "hosts.txt:1: slot count after ':' must be a positive integer, got '0'"),
    ("a:abc\n", "hosts.txt:1: slot count after ':' must be a positive integer, got 'abc'"),
    ("a:\n", "hosts.txt:1: slot count after ':' must be a positive integer, got ''"),
    ("a:4 user=bob\n",
     "hosts.txt:1: token 'user=bob' is not supported (set a per-host user in ~/.ssh/config)"),
    ("a:4 binding=user:0,1\n",
     "hosts.txt:1: token 'binding=user:0,1' is not supported (use --bind-to)"),
    # names
    ("slots=4\n", "hosts.txt:1: expected a host name before 'slots=4'"),
    ("= 4\n", "hosts.txt:1: expected a host name before '=4'"),
    (":4\n", "hosts.txt:1: empty host name"),
    ("-oProxyCommand=x\n", "hosts.txt:1: expected a host name before '-oProxyCommand=x'"),
    ("-a\n", "hosts.txt:1: invalid host name '-a' "
             "(use letters, digits, '-', '_', '.', or [IPv6] in brackets)"),
    ("user@a\n", "hosts.txt:1: 'user@a': a user in a host's name is not served; set a "
                 "per-host user in ~/.ssh/config (Host a / User ...)"),
    ("@a\n", "hosts.txt:1: invalid host name '@a' "
              "(use letters, digits, '-', '_', '.', or [IPv6] in brackets)"),
    ("h\u00e9\n", "hosts.txt:1: invalid host name 'h\u00e9' "
                  "(use letters, digits, '-', '_', '.', or [IPv6] in brackets)"),
    ("a\x00b\n", "hosts.txt:1: invalid host name 'a\\x00b' "
                 "(use letters, digits, '-', '_', '.', or [IPv6] in brackets)"),
    ("::1\n", "hosts.txt:1: IPv6 addresses must be written in brackets, e.g. '[::1]:2'; got '::1'"),
    ("[::1\n", "hosts.txt:1: missing ']' in '[::1'"),
    ("[::1]x\n", "hosts.txt:1: unexpected text after ']' in '[::1]x'"),
    ("[127.0.0.1]\n", "hosts.txt:1: invalid IPv6 address '[127.0.0.1]'"),
    ("[zz::1]\n", "hosts.txt:1: invalid IPv6 address '[zz::1]'"),
    ("[]:2\n", "hosts.txt:1: empty host name"),
    ("a" * 254 + "\n", f"hosts.txt:1: host name is longer than 253 characters: {'a' * 40!r}..."),
    # whole file
    ("", "hostfile hosts.txt: contains no hosts"),
    ("# only\n\n  # comments\n", "hostfile hosts.txt: contains no hosts"),
]


@pytest.mark.parametrize("text,message", [e for e in ERRORS if e[1] is not None])
def test_hostfile_errors(text, message):
    assert error_of(parse_hostfile_text, text, "hosts.txt") == message


def test_mixing_names_the_later_line():
    message = error_of(parse_hostfile_text, "a\n\nb\na slots=1\n", "hosts.txt")
    assert message.startswith("hosts.txt:4: host 'a' has a slot count here but no count at hosts.txt:1")


def test_errors_are_hostfile_errors_and_usage_errors():
    with pytest.raises(HostfileError) as info:
        parse_hostfile_text("a slots=x", "f")
    assert isinstance(info.value, UsageError)


def test_parse_hostfile_reads_file(tmp_path, monkeypatch):
    (tmp_path / "hosts.txt").write_text("# c\nn1 slots=2\nn2:3\nn1 slots=1\n")
    monkeypatch.chdir(tmp_path)
    assert parse_hostfile("hosts.txt") == [
        HostEntry("n1", 3, None, "hosts.txt:2"),
        HostEntry("n2", 3, None, "hosts.txt:3"),
    ]
    (tmp_path / "bad.txt").write_text("n1\n\nn2 slots=zz\n")
    assert error_of(parse_hostfile, "bad.txt") == \
        "bad.txt:3: slots must be a positive integer, got 'zz'"
    full = str(tmp_path / "bad.txt")
    assert error_of(parse_hostfile, full).startswith(full + ":3: ")


def test_parse_hostfile_non_utf8(tmp_path):
    path = tmp_path / "h"
    path.write_bytes(b"# caf\xe9 comment\nn1 slots=2 # \xff\xfe\n")
    assert parse_hostfile(str(path)) == [HostEntry("n1", 2, None, f"{path}:2")]
    path.write_bytes(b"n\xe91\n")
    assert "invalid host name 'n\ufffd1'" in error_of(parse_hostfile, str(path))


def test_unreadable_hostfile(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert error_of(parse_hostfile, "missing.txt") == \
        "hostfile missing.txt: cannot read: No such file or directory"
    os.mkdir("adir")
    assert error_of(parse_hostfile, "adir") == "hostfile adir: cannot read: Is a directory"
    assert error_of(parse_hostfile, "a\x00b").startswith("hostfile 'a\\x00b': cannot read: ")
    assert error_of(parse_hostfile, "new\nline") == \
        "hostfile 'new\\nline': cannot read: No such file or directory"
    with pytest.raises(HostfileError):
        parse_hostfile("")


@pytest.mark.skipif(os.geteuid() == 0, reason="root can read any file")
def test_unreadable_permission(tmp_path):
    path = tmp_path / "h"
    path.write_text("a\n")
    path.chmod(0)
    assert error_of(parse_hostfile, str(path)) == f"hostfile {path}: cannot read: Permission denied"


# ---------------------------------------------------------------------------
# example hostfiles: they parse to what their "# =>" comments say

EXPECT_RE = re.compile(r"^# => (\S+) slots=(\d+|unspecified)(?: max_slots=(\d+))?$")


@pytest.mark.parametrize("name", ["openmpi.txt", "hydra.txt"])
def test_example_hostfiles(name):
    path = os.path.join(REPO, "hostfiles", name)
    expected = []
    with open(path) as fh:
        for line in fh:
            m = EXPECT_RE.match(line.rstrip("\n"))
            if m:
                slots = None if m.group(2) == "unspecified" else int(m.group(2))
                maxs = int(m.group(3)) if m.group(3) else None
                expected.append((m.group(1), slots, maxs))
    assert len(expected) >= 3
    got = [(e.name, e.slots, e.max_slots) for e in parse_hostfile(path)]
    assert got == expected


def test_example_hydra_has_no_trailing_comments():
    # Hydra rejects comments after an entry; the example must stay valid for it.
    with open(os.path.join(REPO, "hostfiles", "hydra.txt")) as fh:
        for line in fh:
            assert "#" not in line or line.lstrip().startswith("#")


# ---------------------------------------------------------------------------
# property: generated valid hostfiles

HOSTNAMES = st.from_regex(r"[a-z][a-z0-9]{0,6}(-[a-z0-9]{1,3})?(\.[a-z]{1,4})?", fullmatch=True)
SP = st.sampled_from(["", " ", "  ", "\t"])
SP1 = st.sampled_from([" ", "  ", "\t", " \t "])
COMMENT = st.sampled_from(["", "# c", "#", "#slots=3 x:y", "# a b = c"])


@st.composite
def hostfiles(draw):
    names = draw(st.lists(HOSTNAMES, min_size=1, max_size=6, unique=True))
    plans = {}
    lines = []  # (name, rendered entry)
    for name in names:
        if draw(st.booleans()):  # explicit counts, one or more lines
            counts = draw(st.lists(st.integers(1, 50), min_size=1, max_size=3))
            total = sum(counts)
            max_slots = draw(st.none() | st.integers(total, total + 5))
            max_line = draw(st.integers(0, len(counts) - 1))
            for i, count in enumerate(counts):
                form = draw(st.sampled_from(["slots", "count", "cpu", "hydra"]))
                if form == "hydra":
                    entry = f"{name}:{count}"
                else:
                    entry = f"{name}{draw(SP1)}{form}{draw(SP)}={draw(SP)}{count}"
                if max_slots is not None and i == max_line:
                    entry += f"{draw(SP1)}max_slots{draw(SP)}={draw(SP)}{max_slots}"
                lines.append((name, entry))
            plans[name] = (total, max_slots)
        else:  # k lines without counts
            k = draw(st.integers(1, 4))
            lines.extend((name, name) for _ in range(k))
            plans[name] = (k if k > 1 else None, None)
    order = draw(st.permutations(lines))
    text_lines = []
    first_line = {}
    for name, entry in order:
        for _ in range(draw(st.integers(0, 2))):  # filler before the entry
            text_lines.append(draw(st.sampled_from(["", "   ", "\t", "# comment", "  # x = y"])))
        comment = draw(COMMENT)
        sep = draw(SP1) if comment else ""
        text_lines.append(f"{draw(SP)}{entry}{sep}{comment}{draw(SP)}")
        first_line.setdefault(name, len(text_lines))
    ending = draw(st.sampled_from(["", "\n", "\n\n# end\n"]))
    eol = draw(st.sampled_from(["\n", "\r\n"]))
    text = eol.join(text_lines) + ending
    appearance = sorted(first_line, key=first_line.get)
    expected = [(n, plans[n][0], plans[n][1], f"hosts.txt:{first_line[n]}") for n in appearance]
    return text, expected


@FAST
@given(hostfiles())
def test_property_valid_hostfiles(case):
    text, expected = case
    assert parse(text) == expected


HOSTFILE_ALPHABET = st.sampled_from(list("ab01:=# \t\n[].-_,@%xslotmaxcpun")
                                    + ["slots", "max_slots", "count", "::1", "\r"])


@FAST
@given(st.one_of(st.text(), st.lists(HOSTFILE_ALPHABET, max_size=40).map("".join)))
def test_property_hostfile_text_only_raises_hostfile_error(text):
    try:
        entries = parse_hostfile_text(text, "f")
    except HostfileError as exc:
        assert len(str(exc).splitlines()) == 1
        assert str(exc).startswith("f:") or str(exc).startswith("hostfile f:")
    else:
        assert entries and len({e.name for e in entries}) == len(entries)
        for e in entries:
            assert e.slots is None or e.slots >= 1
            assert e.max_slots is None or e.slots is None or e.max_slots >= e.slots


@pytest.fixture(scope="module")
def scratch_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("hostfile-bytes")


@settings(max_examples=60, deadline=None)
@given(data=st.binary(max_size=200))
def test_property_hostfile_bytes_only_raise_hostfile_error(scratch_dir, data):
    path = os.path.join(scratch_dir, "h")
    with open(path, "wb") as fh:
        fh.write(data)
    try:
        parse_hostfile(path)
    except HostfileError:
        pass


# ---------------------------------------------------------------------------
# -H lists

HOST_LISTS = [
    ("a", [("a", 1)]),
    ("a:4", [("a", 4)]),
    ("a:4,b", [("a", 4), ("b", 1)]),
    ("a,a", [("a", 2)]),
    ("a,b,a:3", [("a", 4), ("b", 1)]),
    (" a , b:2 ", [("a", 1), ("b", 2)]),
    ("[::1]:2,localhost", [("::1", 2), ("localhost", 1)]),
    ("10.0.0.1:02", [("10.0.0.1", 2)]),
]


@pytest.mark.parametrize("text,expected", HOST_LISTS)
def test_host_list(text, expected):
    got = parse_host_list(text)
    assert [(e.name, e.slots) for e in got] == expected
    assert all(e.origin == "-H" and e.max_slots is None for e in got)


HOST_LIST_ERRORS = [
    ("a:x", "-H", "-H: bad slot count 'x' for host 'a'"),
    ("a:0", "-H", "-H: bad slot count '0' for host 'a'"),
    ("a:-1", "-H", "-H: bad slot count '-1' for host 'a'"),
    ("a:", "-hosts", "-hosts: bad slot count '' for host 'a'"),
    ("a,,b", "-H", "-H: empty item in host list 'a,,b'"),
    ("a,", "-H", "-H: empty item in host list 'a,'"),
    (",a", "--host", "--host: empty item in host list ',a'"),
    ("", "-H", "-H: empty host list"),
    ("  ", "-H", "-H: empty host list"),
    (":4", "-H", "-H: empty host name"),
    ("a b", "-H", "-H: invalid host name 'a b' (use letters, digits, '-', '_', '.', or [IPv6] in brackets)"),
    ("a:4:5", "-H", "-H: IPv6 addresses must be written in brackets, e.g. '[::1]:2'; got 'a:4:5'"),
    ("[::1", "-H", "-H: missing ']' in '[::1'"),
    ("a:2147483647,a", "-H", "-H: host 'a' has more than 2147483647 slots in total"),
]


@pytest.mark.parametrize("text,flag,message", HOST_LIST_ERRORS)
def test_host_list_errors(text, flag, message):
    with pytest.raises(UsageError) as info:
        parse_host_list(text, flag)
    assert type(info.value) is UsageError
    assert str(info.value) == message


@FAST
@given(st.lists(st.tuples(HOSTNAMES, st.none() | st.integers(1, 1000)), min_size=1, max_size=8))
def test_property_host_list_round_trip(items):
    text = ",".join(name if n is None else f"{name}:{n}" for name, n in items)
    expected = {}
    for name, n in items:
        expected[name] = expected.get(name, 0) + (1 if n is None else n)
    assert [(e.name, e.slots) for e in parse_host_list(text)] == list(expected.items())


@FAST
@given(st.one_of(st.text(), st.lists(HOSTFILE_ALPHABET, max_size=30).map("".join)))
def test_property_host_list_only_raises_usage_error(text):
    try:
        entries = parse_host_list(text, "-H")
    except UsageError as exc:
        assert type(exc) is UsageError
        assert str(exc).startswith("-H: ") and len(str(exc).splitlines()) == 1
    else:
        assert all(e.slots >= 1 for e in entries)


# ---------------------------------------------------------------------------
# Slurm nodelists

NODELISTS = [
    ("node01", ["node01"]),
    ("node[01-04,07]", ["node01", "node02", "node03", "node04", "node07"]),
    ("node[1-3]", ["node1", "node2", "node3"]),
    ("node[8-11]", ["node8", "node9", "node10", "node11"]),
    ("node[08-11]", ["node08", "node09", "node10", "node11"]),
    ("n[098-101]", ["n098", "n099", "n100", "n101"]),
    ("n[5]", ["n5"]),
    ("n[005]", ["n005"]),
    ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
    ("r[1-2]-n[3,5]-x", ["r1-n3-x", "r1-n5-x", "r2-n3-x", "r2-n5-x"]),
    ("a[1-2],b,c[5]", ["a1", "a2", "b", "c5"]),
    ("a,b.example.com", ["a", "b.example.com"]),
    ("[1-2]x", ["1x", "2x"]),
    (" node[1-2] ", ["node1", "node2"]),
    ("a[1-1]", ["a1"]),
]


@pytest.mark.parametrize("expr,expected", NODELISTS)
def test_expand_nodelist(expr, expected):
    assert expand_nodelist(expr) == expected


NODELIST_ERRORS = [
    ("node[1-2", "SLURM_JOB_NODELIST: unbalanced '[' in 'node[1-2'"),
    ("node1-2]", "SLURM_JOB_NODELIST: unbalanced ']' in 'node1-2]'"),
    ("a[1[2]]", "SLURM_JOB_NODELIST: nested '[' in 'a[1[2]]'"),
    ("node[3-1]", "SLURM_JOB_NODELIST: reversed range '3-1' in 'node[3-1]'"),
    ("node[a-c]", "SLURM_JOB_NODELIST: bad range 'a-c' in 'node[a-c]' (expected N or N-M, digits only)"),
    ("node[1-2-3]",
     "SLURM_JOB_NODELIST: bad range '1-2-3' in 'node[1-2-3]' (expected N or N-M, digits only)"),
    ("node[1,]", "SLURM_JOB_NODELIST: bad range '' in 'node[1,]' (expected N or N-M, digits only)"),
    ("node[ 1]", "SLURM_JOB_NODELIST: bad range ' 1' in 'node[ 1]' (expected N or N-M, digits only)"),
    ("node[]", "SLURM_JOB_NODELIST: empty brackets in 'node[]'"),
    ("a,,b", "SLURM_JOB_NODELIST: empty host name in 'a,,b'"),
    ("a,", "SLURM_JOB_NODELIST: empty host name in 'a,'"),
    ("", "SLURM_JOB_NODELIST: empty node list"),
    ("a b", "SLURM_JOB_NODELIST: invalid host name 'a b' "
            "(use letters, digits, '-', '_', '.', or [IPv6] in brackets) in 'a b'"),
    ("-[1-2]", "SLURM_JOB_NODELIST: invalid host name '-1' "
               "(use letters, digits, '-', '_', '.', or [IPv6] in brackets) in '-[1-2]'"),
    ("n[0-1000000]", "SLURM_JOB_NODELIST: 'n[0-1000000]' expands to more than 100000 hosts"),
    ("n[1-100001]", "SLURM_JOB_NODELIST: 'n[1-100001]' expands to more than 100000 hosts"),
    ("a[0-999]b[0-999]c[0-9]",
     "SLURM_JOB_NODELIST: 'a[0-999]b[0-999]c[0-9]' expands to more than 100000 hosts"),
    ("n[" + "9" * 30 + "]", "SLURM_JOB_NODELIST: bad range '" + "9" * 30 + "' in 'n[" + "9" * 30
     + "]' (expected N or N-M, digits only)"),
]


@pytest.mark.parametrize("expr,message", NODELIST_ERRORS)
def test_expand_nodelist_errors(expr, message):
    with pytest.raises(HostfileError) as info:
        expand_nodelist(expr)
    assert str(info.value) == message


def test_expand_nodelist_names_variable():
    with pytest.raises(HostfileError, match=r"^SLURM_NODELIST: unbalanced"):
        expand_nodelist("a[", "SLURM_NODELIST")


@st.composite
def nodelists(draw):
    """A structure of names → (Slurm text, expected expansion)."""
    rendered, expected = [], []
    for _ in range(draw(st.integers(1, 4))):
        text, names = "", [""]
        n_parts = draw(st.integers(1, 4))
        for i in range(n_parts):
            if draw(st.booleans()) or (i == 0 and n_parts == 1):
                lit = draw(st.from_regex(r"[a-z][a-z0-9.-]{0,4}" if not text else r"[a-z0-9.-]{1,4}",
                                         fullmatch=True))
                text += lit
                names = [h + lit for h in names]
            else:
                items, values = [], []
                for _ in range(draw(st.integers(1, 3))):
                    lo = draw(st.integers(0, 120))
                    width = draw(st.integers(1, 4))
                    lo_text = str(lo).zfill(width)
                    if draw(st.booleans()):
                        items.append(lo_text)
                        values.append(lo_text)
                    else:
                        hi = lo + draw(st.integers(0, 4))
                        items.append(f"{lo_text}-{str(hi).zfill(width)}")
                        values.extend(str(v).zfill(len(lo_text)) for v in range(lo, hi + 1))
                text += "[" + ",".join(items) + "]"
                names = [h + v for h in names for v in values]
        rendered.append(text)
        expected.extend(names)
    return ",".join(rendered), expected


@FAST
@given(nodelists())
def test_property_nodelist_expansion(case):
    text, expected = case
    assert expand_nodelist(text) == expected


@FAST
@given(st.one_of(st.text(max_size=40),
                 st.lists(st.sampled_from(list("ab019[],-x ") + ["[1-3]", "0-", "-9"]),
                          max_size=20).map("".join)))
def test_property_nodelist_only_raises_hostfile_error(text):
    try:
        names = expand_nodelist(text)
    except HostfileError as exc:
        assert str(exc).startswith("SLURM_JOB_NODELIST: ") and len(str(exc).splitlines()) == 1
    else:
        assert names and all(names)


# ---------------------------------------------------------------------------
# Slurm task counts

@pytest.mark.parametrize("expr,expected", [
    ("2(x3),1", [2, 2, 2, 1]),
    ("4", [4]),
    ("1,2,3", [1, 2, 3]),
    ("8(x1)", [8]),
    ("2(x2), 1", [2, 2, 1]),
])
def test_expand_tasks_per_node(expr, expected):
    assert expand_tasks_per_node(expr) == expected


@pytest.mark.parametrize("expr,message", [
    ("", "SLURM_TASKS_PER_NODE: empty count list"),
    ("2(x0)", "SLURM_TASKS_PER_NODE: bad item '2(x0)' in '2(x0)' (expected N or N(xM), N and M >= 1)"),
    ("0", "SLURM_TASKS_PER_NODE: bad item '0' in '0' (expected N or N(xM), N and M >= 1)"),
    ("2(3)", "SLURM_TASKS_PER_NODE: bad item '2(3)' in '2(3)' (expected N or N(xM), N and M >= 1)"),
    ("1,,2", "SLURM_TASKS_PER_NODE: bad item '' in '1,,2' (expected N or N(xM), N and M >= 1)"),
    ("x", "SLURM_TASKS_PER_NODE: bad item 'x' in 'x' (expected N or N(xM), N and M >= 1)"),
    ("1(x2000000)", "SLURM_TASKS_PER_NODE: '1(x2000000)' expands to more than 100000 counts"),
])
def test_expand_tasks_per_node_errors(expr, message):
    with pytest.raises(HostfileError) as info:
        expand_tasks_per_node(expr)
    assert str(info.value) == message


@FAST
@given(st.lists(st.tuples(st.integers(1, 64), st.integers(1, 5), st.booleans()), min_size=1, max_size=8))
def test_property_tasks_round_trip(runs):
    parts, expected = [], []
    for value, times, compress in runs:
        if compress:
            parts.append(f"{value}(x{times})")
        else:
            parts.extend([str(value)] * times)
        expected.extend([value] * times)
    assert expand_tasks_per_node(",".join(parts)) == expected


@FAST
@given(st.text(alphabet="0123(x),a ", max_size=20))
def test_property_tasks_only_raise_hostfile_error(text):
    try:
        counts = expand_tasks_per_node(text)
    except HostfileError as exc:
        assert str(exc).startswith("SLURM_TASKS_PER_NODE: ")
    else:
        assert counts and all(c >= 1 for c in counts)


# ---------------------------------------------------------------------------
# allocations

def hosts_of(result):
    entries, _source = result
    return [(e.name, e.slots, e.origin) for e in entries]


def test_allocation_none():
    assert allocation_hosts({}) is None
    assert allocation_hosts({"PATH": "/bin", "SLURM_JOB_NODELIST": "", "PBS_NODEFILE": ""}) is None


def test_allocation_slurm_tasks():
    env = {"SLURM_JOB_NODELIST": "node[01-02,07]", "SLURM_JOB_NUM_NODES": "3",
           "SLURM_TASKS_PER_NODE": "2(x2),1", "SLURM_JOB_CPUS_PER_NODE": "8(x3)"}
    result = allocation_hosts(env)
    assert hosts_of(result) == [("node01", 2, "SLURM_JOB_NODELIST"),
                                ("node02", 2, "SLURM_JOB_NODELIST"),
                                ("node07", 1, "SLURM_JOB_NODELIST")]
    assert "Slurm" in result[1] and "SLURM_TASKS_PER_NODE=2(x2),1" in result[1]


def test_allocation_slurm_fallbacks():
    env = {"SLURM_NODELIST": "n[1-2]", "SLURM_JOB_CPUS_PER_NODE": "4(x2)"}
    result = allocation_hosts(env)
    assert hosts_of(result) == [("n1", 4, "SLURM_NODELIST"), ("n2", 4, "SLURM_NODELIST")]
    assert "SLURM_JOB_CPUS_PER_NODE" in result[1]
    assert hosts_of(allocation_hosts({"SLURM_JOB_NODELIST": "n[1-2]"})) == [
        ("n1", 1, "SLURM_JOB_NODELIST"), ("n2", 1, "SLURM_JOB_NODELIST")]
    # the newer variable wins over the older one
    env = {"SLURM_JOB_NODELIST": "a", "SLURM_NODELIST": "b", "SLURM_TASKS_PER_NODE": "3"}
    assert hosts_of(allocation_hosts(env)) == [("a", 3, "SLURM_JOB_NODELIST")]


def test_allocation_slurm_duplicates_merge():
    env = {"SLURM_JOB_NODELIST": "a,b,a", "SLURM_TASKS_PER_NODE": "1,2,3"}
    assert hosts_of(allocation_hosts(env)) == [("a", 4, "SLURM_JOB_NODELIST"),
                                               ("b", 2, "SLURM_JOB_NODELIST")]


def test_allocation_slurm_length_mismatch():
    env = {"SLURM_JOB_NODELIST": "node[1-3]", "SLURM_TASKS_PER_NODE": "2(x2)"}
    with pytest.raises(HostfileError) as info:
        allocation_hosts(env)
    assert str(info.value) == ("SLURM_TASKS_PER_NODE='2(x2)' gives 2 counts but "
                               "SLURM_JOB_NODELIST='node[1-3]' lists 3 hosts")
    env = {"SLURM_JOB_NODELIST": "node[1-3]", "SLURM_JOB_CPUS_PER_NODE": "2(x4)"}
    with pytest.raises(HostfileError, match=r"^SLURM_JOB_CPUS_PER_NODE='2\(x4\)' gives 4 counts"):
        allocation_hosts(env)


def test_allocation_slurm_bad_values():
    with pytest.raises(HostfileError, match=r"^SLURM_NODELIST: reversed range"):
        allocation_hosts({"SLURM_NODELIST": "n[2-1]"})
    with pytest.raises(HostfileError, match=r"^SLURM_TASKS_PER_NODE: bad item"):
        allocation_hosts({"SLURM_JOB_NODELIST": "n1", "SLURM_TASKS_PER_NODE": "x"})


def test_allocation_pbs(tmp_path):
    path = tmp_path / "nodes"
    path.write_text("node01\nnode01\nnode02\n\nnode01\n")
    result = allocation_hosts({"PBS_NODEFILE": str(path)})
    assert hosts_of(result) == [("node01", 3, f"{path}:1"), ("node02", 1, f"{path}:3")]
    assert result[1] == f"PBS allocation (PBS_NODEFILE={path})"


def test_allocation_pbs_errors(tmp_path):
    missing = tmp_path / "missing"
    with pytest.raises(HostfileError) as info:
        allocation_hosts({"PBS_NODEFILE": str(missing)})
    assert str(info.value) == f"PBS_NODEFILE={missing}: cannot read: No such file or directory"
    empty = tmp_path / "empty"
    empty.write_text("\n\n")
    with pytest.raises(HostfileError) as info:
        allocation_hosts({"PBS_NODEFILE": str(empty)})
    assert str(info.value) == f"PBS_NODEFILE={empty}: lists no hosts"
    bad = tmp_path / "bad"
    bad.write_text("n1\nn 2\n")
    with pytest.raises(HostfileError) as info:
        allocation_hosts({"PBS_NODEFILE": str(bad)})
    assert str(info.value).startswith(f"{bad}:2: invalid host name 'n 2'")
    assert str(info.value).endswith("(from PBS_NODEFILE)")


def test_allocation_slurm_wins_over_pbs(tmp_path):
    path = tmp_path / "nodes"
    path.write_text("p1\n")
    env = {"PBS_NODEFILE": str(path), "SLURM_JOB_NODELIST": "s1", "SLURM_TASKS_PER_NODE": "2"}
    assert hosts_of(allocation_hosts(env)) == [("s1", 2, "SLURM_JOB_NODELIST")]


# ---------------------------------------------------------------------------
# local host detection

@pytest.fixture
def fake_host(monkeypatch, tmp_path):
    """Pretend the machine is called 'vm' and /etc/hosts names it vm.example.com."""
    etc = tmp_path / "hosts"
    etc.write_text("127.0.0.1 localhost\n127.0.1.1 vm.example.com vm  # me\n"
                   "10.0.0.9 other.example.com other\n")
    monkeypatch.setattr(_socket, "gethostname", lambda: "vm")
    monkeypatch.setattr(os, "uname", lambda: os.uname_result(("Linux", "vm", "", "", "")))
    monkeypatch.setattr(hf, "_ETC_HOSTS", str(etc))
    hf._local_names.cache_clear()
    yield
    hf._local_names.cache_clear()


@pytest.mark.parametrize("name,local", [
    ("localhost", True), ("LOCALHOST", True), ("localhost.", True),
    ("localhost.localdomain", True), ("ip6-localhost", True),
    ("127.0.0.1", True), ("127.1.2.3", True), ("127.255.255.255", True),
    ("::1", True), ("[::1]", True), ("0:0:0:0:0:0:0:1", True), ("::ffff:127.0.0.1", True),
    ("vm", True), ("VM", True), ("vm.example.com", True), ("vm.example.com.", True),
    ("node01", False), ("other", False), ("other.example.com", False),
    ("vm.other.org", False), ("128.0.0.1", False), ("127.0.0.256", False),
    ("127.0.0", False), ("1127.0.0.1", False), ("::2", False), ("::", False),
    ("", False), ("[", False), ("not:an:addr", False), ("10.0.0.9", False),
])
def test_is_local_host(fake_host, name, local):
    assert is_local_host(name) is local


def test_is_local_host_fqdn_hostname(monkeypatch, tmp_path):
    monkeypatch.setattr(_socket, "gethostname", lambda: "Box.Lab.Example")
    monkeypatch.setattr(os, "uname", lambda: os.uname_result(("Linux", "Box.Lab.Example", "", "", "")))
    monkeypatch.setattr(hf, "_ETC_HOSTS", str(tmp_path / "none"))
    hf._local_names.cache_clear()
    try:
        assert is_local_host("box") and is_local_host("box.lab.example")
        assert not is_local_host("box.lab")
    finally:
        hf._local_names.cache_clear()


def test_is_local_host_caches_and_never_resolves(monkeypatch):
    calls = []
    hf._local_names.cache_clear()

    def fake():
        calls.append(1)
        return "cachedhost"

    def forbidden(*args, **kwargs):
        raise AssertionError("DNS lookup attempted")

    # mslaunch asks the C module (the socket module costs a launch milliseconds)
    monkeypatch.setattr(_socket, "gethostname", fake)
    for module in (socket, _socket):
        for name in ("getaddrinfo", "getfqdn", "gethostbyname", "gethostbyname_ex",
                     "gethostbyaddr"):
            if hasattr(module, name):
                monkeypatch.setattr(module, name, forbidden)
    try:
        assert is_local_host("cachedhost")
        assert not is_local_host("elsewhere")
        assert is_local_host("cachedhost")
        assert len(calls) == 1
    finally:
        hf._local_names.cache_clear()


def test_real_hostname_is_local():
    hf._local_names.cache_clear()
    assert is_local_host(socket.gethostname())


def test_import_is_cheap():
    # Only modules that the import itself adds count (site may preload some).
    code = ("import sys; sys.path.insert(0, %r); before = set(sys.modules); "
            "import mslaunch.hosts.hostfile, mslaunch.hosts.allocations, mslaunch.hosts.local; "
            "bad = {'socket', 'ipaddress', 'subprocess', 'asyncio'} & (set(sys.modules) - before); "
            "print(sorted(bad))" % REPO)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# -- the hand-written checks hold to the regular expressions they replace ------------------

_GRAMMAR_TEXT = st.text(alphabet="aZ09_.-:%fF[]()x,\n é٣", max_size=14)


@given(_GRAMMAR_TEXT)
def test_name_checks_match_their_regular_expressions(text):
    from mslaunch.hosts import hostfile as h
    assert h._is_hostname(text) == bool(re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*", text))
    assert h._is_ipv6_text(text) == bool(
        re.fullmatch(r"[0-9A-Fa-f:.]+(?:%[A-Za-z0-9_.\-]+)?", text))
    assert h._is_digits(text) == bool(re.fullmatch(r"[0-9]+", text))


@given(_GRAMMAR_TEXT)
def test_slurm_list_pieces_match_their_regular_expressions(text):
    from mslaunch.hosts.allocations import slurm as a
    m = re.fullmatch(r"([0-9]+)(?:-([0-9]+))?", text)
    assert a.range_parts(text) == (m.groups() if m else None)
    m = re.fullmatch(r"([0-9]+)(?:\(x([0-9]+)\))?", text)
    assert a.task_parts(text) == (m.groups() if m else None)
    assert a.bracket_split(text) == re.split(r"\[([^\]]*)\]", text)
