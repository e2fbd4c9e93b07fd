"""Tests of mslaunch.mpi.pmi: codecs, process mapping, both wires, hostile peers, real MPICH ranks."""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pytest

import helpers
from requires import require
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mslaunch.core import procmap as mapping
from mslaunch.mpi.pmi import files as shm, wire
from mslaunch.mpi.pmi import server as pmiserver
from mslaunch.machine.loop import Loop

PROGRAMS = Path(helpers.PROGRAMS)


# ---------------------------------------------------------------------------
# harness for protocol-level tests
# ---------------------------------------------------------------------------

class Recorder:
    def __init__(self) -> None:
        self.aborts: List[Tuple[int, int, str]] = []
        self.lost: List[int] = []
        self.logs: List[str] = []

    def pmi_abort(self, rank: int, code: int, message: str, at: float) -> None:
        assert at > 0
        self.aborts.append((rank, code, message))

    def pmi_lost(self, rank: int, at: Optional[float] = None) -> None:
        self.lost.append(rank)

    def pmi_log(self, message: str) -> None:
        self.logs.append(message)


class Peer:
    """A test client; the server runs on the same thread, so every wait pumps the loop."""

    def __init__(self, h: Harness, sock: socket.socket) -> None:
        self.h = h
        self.sock = sock
        sock.setblocking(False)
        self.buf = bytearray()
        self.eof = False

    def _pull(self) -> None:
        self.h.loop.run_once(0.005)
        try:
            data = self.sock.recv(1 << 20)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if data:
            self.buf += data
        else:
            self.eof = True

    def send(self, data: bytes) -> None:
        view = memoryview(data)
        deadline = time.monotonic() + 10
        while view:
            try:
                sent = self.sock.send(view)
                view = view[sent:]
            except BlockingIOError:
                self._pull()
            if time.monotonic() > deadline:
                raise TimeoutError("send")

    def line(self, timeout: float = 5.0) -> str:
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            if self.eof or time.monotonic() > deadline:
                raise AssertionError(f"no reply line (eof={self.eof}, buf={bytes(self.buf[:80])!r})")
            self._pull()
        idx = self.buf.index(b"\n")
        text = self.buf[:idx].decode()
        del self.buf[: idx + 1]
        return text

    def v1(self, request: str) -> Tuple[str, Dict[str, str]]:
        self.send(request.encode() + b"\n")
        return wire.parse_v1(self.line())

    def frame(self, timeout: float = 5.0) -> Tuple[str, Dict[str, str]]:
        deadline = time.monotonic() + timeout
        while True:
            body = wire.take_frame(self.buf, 1 << 20)
            if body is not None:
                return wire.parse_v2(body.decode())
            if self.eof or time.monotonic() > deadline:
                raise AssertionError(f"no reply frame (eof={self.eof})")
            self._pull()

    def v2(self, cmd: str, **fields: object) -> Tuple[str, Dict[str, str]]:
        self.send(wire.format_v2(cmd, {k.replace("_", "-") if k != "thrid" else k: v
                                      for k, v in fields.items()}))
        return self.frame()

    def silent(self, duration: float = 0.15) -> bool:
        end = time.monotonic() + duration
        while time.monotonic() < end:
            self._pull()
        return not self.buf

    def closed_by_server(self, timeout: float = 5.0) -> bool:
        deadline = time.monotonic() + timeout
        while not self.eof and time.monotonic() < deadline:
            self._pull()
            self.buf.clear()
        return self.eof

    def close(self) -> None:
        self.sock.close()
        for _ in range(5):
            self.h.loop.run_once(0.005)


class Harness:
    def __init__(self, size: int = 2, node_ids: Optional[List[int]] = None,
                 appnums: Optional[List[int]] = None, universe: int = 0) -> None:
        self.loop = Loop()
        self.rec = Recorder()
        self.kvsname = shm.new_kvsname()
        self.mapping = mapping.process_mapping(node_ids or [0] * size)
        self.server = pmiserver.PMIServer(
            self.loop, kvsname=self.kvsname, size=size, process_mapping=self.mapping,
            universe_size=universe or size, appnums=appnums or [0] * size, listener=self.rec)
        self.peers: List[Peer] = []

    def pair(self, rank: int) -> Peer:
        fd = self.server.child_fd(rank)
        peer = Peer(self, socket.socket(fileno=os.dup(fd)))
        self.server.release_child_fds()
        self.peers.append(peer)
        return peer

    def tcp(self) -> Peer:
        if self.server.door is None:
            self.server.listen_tcp()
        env = self.server.tcp_env(0)
        host, port = env["PMI_PORT"].split(":")
        sock = socket.create_connection((host, int(port)))
        for _ in range(3):
            self.loop.run_once(0.005)
        peer = Peer(self, sock)
        self.peers.append(peer)
        return peer

    def init_v1(self, peer: Peer) -> None:
        assert peer.v1("cmd=init pmi_version=1 pmi_subversion=1")[1]["rc"] == "0"

    def init_v2(self, peer: Peer, pmirank: object = -1) -> Dict[str, str]:
        cmd, f = peer.v1("cmd=init pmi_version=2 pmi_subversion=0")
        assert (cmd, f["pmi_version"], f["rc"]) == ("response_to_init", "2", "0")
        cmd, f = peer.v2("fullinit", pmirank=pmirank)
        assert cmd == "fullinit-response" and f["rc"] == "0"
        return f

    def close(self) -> None:
        for peer in self.peers:
            peer.sock.close()
        self.server.close()
        self.loop.close()


@pytest.fixture
def harness():
    made: List[Harness] = []

    def make(*args, **kwargs) -> Harness:
        h = Harness(*args, **kwargs)
        made.append(h)
        return h

    yield make
    for h in made:
        h.close()


def assert_serves(h: Harness, rank: int) -> None:
    """A well-behaved rank still gets answers."""
    peer = h.pair(rank)
    h.init_v1(peer)
    assert peer.v1("cmd=get_my_kvsname") == ("my_kvsname", {"rc": "0", "kvsname": h.kvsname})
    assert peer.v1("cmd=finalize")[0] == "finalize_ack"


# ---------------------------------------------------------------------------
# (a) codecs
# ---------------------------------------------------------------------------

keys = st.from_regex(r"[A-Za-z0-9_/\-]{1,20}", fullmatch=True).filter(lambda k: k != "cmd")
v1_values = st.text(st.characters(min_codepoint=32, max_codepoint=0x2FF, exclude_characters="\x7f"),
                    min_size=1, max_size=40)
v2_values = v1_values.filter(lambda v: ";" not in v)
cmds = st.from_regex(r"[a-z_\-]{1,20}", fullmatch=True)


@given(cmds, st.dictionaries(keys, v1_values, max_size=8))
def test_v1_roundtrip(cmd, fields):
    line = wire.format_v1(cmd, fields)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert wire.parse_v1(line.decode()) == (cmd, fields)


@given(cmds, st.dictionaries(keys, v2_values, max_size=8))
def test_v2_roundtrip(cmd, fields):
    frame = wire.format_v2(cmd, fields)
    assert int(frame[:6]) == len(frame) - 6
    assert wire.parse_v2(frame[6:].decode()) == (cmd, fields)


@given(st.lists(st.tuples(cmds, st.dictionaries(keys, v2_values, max_size=4)), min_size=1, max_size=6),
       st.lists(st.integers(1, 50), min_size=1, max_size=30), st.booleans())
def test_stream_split_anywhere(messages, cuts, v2):
    fmt = wire.format_v2 if v2 else wire.format_v1
    stream = b"".join(fmt(c, f) for c, f in messages)
    buf, got, pos, i = bytearray(), [], 0, 0
    while pos < len(stream) or buf:
        step = cuts[i % len(cuts)]
        i += 1
        buf += stream[pos : pos + step]
        pos += step
        while True:
            item = wire.take_frame(buf, 1000) if v2 else wire.take_line(buf, 1000)
            if item is None:
                break
            got.append(wire.parse_v2(item.decode()) if v2 else wire.parse_v1(item.decode()))
        if pos >= len(stream) and not buf:
            break
        assert pos < len(stream) + 1000
    assert got == messages


@given(st.text(max_size=80))
def test_parsers_only_raise_wire_error(text):
    for parse in (wire.parse_v1, wire.parse_v2):
        try:
            parse(text)
        except wire.WireError:
            pass


def test_v1_details():
    assert wire.parse_v1("cmd=put key=a value=x\\ y\\\\z extra=segments=9\n") == (
        "put", {"key": "a", "value": "x y\\z", "extra": "segments=9"})
    assert wire.parse_v1("cmd=get  key=a key=b ") == ("get", {"key": "a"})
    for bad in ["get key=a", "cmd=get key=", "cmd=get key= x", "cmd=get =x", "cmd=get k!=x",
                "cmd=a cmd=b", "cmd=get\tkey=a", "cmd=get bare"]:
        with pytest.raises(wire.WireError):
            wire.parse_v1(bad)
    with pytest.raises(wire.WireError):
        wire.format_v1("get_result", {"value": ""})
    assert wire.format_v1("x", {"msg": "a b"}) == b"cmd=x msg=a\\ b\n"


def test_v2_details():
    assert wire.format_v2("kvs-get", {"key": "a b"}) == b"    20cmd=kvs-get;key=a b;"
    assert wire.parse_v2("cmd=x;a=b=c;") == ("x", {"a": "b=c"})
    for bad in ["x=1;", "cmd=x;;a=b;", "cmd=x;a=;", "cmd=x;a;"]:
        with pytest.raises(wire.WireError):
            wire.parse_v2(bad)
    with pytest.raises(wire.WireError):
        wire.format_v2("x", {"a": "b;c"})
    for bad in [b"xx", b"    0cmd=", b"1 2345cmd", b"999999"]:
        with pytest.raises(wire.WireError):
            wire.take_frame(bytearray(bad), 100)
    assert wire.take_frame(bytearray(b"   "), 100) is None
    with pytest.raises(wire.WireError):
        wire.take_line(bytearray(b"x" * 101), 100)


# ---------------------------------------------------------------------------
# process mapping
# ---------------------------------------------------------------------------

def dense(ids: List[int]) -> List[int]:
    seen: Dict[int, int] = {}
    return [seen.setdefault(i, len(seen)) for i in ids]


@given(st.lists(st.integers(0, 12), min_size=1, max_size=300))
def test_mapping_roundtrip_random(ids):
    value = mapping.process_mapping(ids)
    assert mapping.parse_process_mapping(value, len(ids)) == dense(ids)


@st.composite
def layouts(draw):
    nodes = draw(st.integers(1, 12))
    per = draw(st.integers(1, 6))
    size = draw(st.integers(1, 400))
    kind = draw(st.sampled_from(["block", "cyclic", "blockcyclic", "head"]))
    if kind == "block":
        ids = [min(r // per, nodes - 1) for r in range(size)]
    elif kind == "cyclic":
        ids = [r % nodes for r in range(size)]
    elif kind == "blockcyclic":
        ids = [(r // per) % nodes for r in range(size)]
    else:
        ids = [0] + [1 + r % nodes for r in range(size - 1)]
    perm = draw(st.permutations(range(nodes + 1)))
    return [perm[i] for i in ids]


@given(layouts())
def test_mapping_roundtrip_structured(ids):
    value = mapping.process_mapping(ids)
    assert mapping.parse_process_mapping(value, len(ids)) == dense(ids)
    assert len(value) < 60, value


def test_mapping_examples():
    assert mapping.process_mapping([5, 5, 5, 5]) == "(vector,(0,1,4))"
    assert mapping.process_mapping([0, 0, 1, 1]) == "(vector,(0,2,2))"
    assert mapping.process_mapping([0, 1, 0, 1]) == "(vector,[(0,2,1)]x2)"
    assert mapping.process_mapping([0, 0, 0, 1]) == "(vector,(0,1,3),1)"
    for k in range(1, 17):
        value = mapping.process_mapping([r % k for r in range(10000)])
        assert len(value) < 40, value
        assert mapping.parse_process_mapping(value, 10000) == [r % k for r in range(10000)]
    with pytest.raises(ValueError):
        mapping.process_mapping([])


def test_parse_mapping_mpich_quirks():
    parse = mapping.parse_process_mapping
    assert parse("(vector,(0,1,2))", 4) == [0, 0, 0, 0]          # legacy wrap-around
    assert parse("(vector,(0,2,1))", 5) == [0, 1, 0, 1, 0]
    assert parse("(vector,0,0,1,1)", 4) == [0, 0, 1, 1]
    assert parse("(vector,(0,1,3),(1,1,1))", 4) == [0, 0, 0, 1]
    assert parse("(vector,[(0,2,1)]x2)", 4) == [0, 1, 0, 1]
    assert parse(" ( vector , ( 0 , 2 , 2 ) ) ", 4) == [0, 0, 1, 1]
    assert parse("(vector,(0x0,0x2,01))", 2) == [0, 1]            # strtol base 0
    assert parse("(vector,(0,1,4),(1,1,4))", 2) == [0, 0]         # extra items ignored
    assert parse("(vector,(0,1,1))", 0) == []
    for bad in ["", "vector", "(vectorx,(0,1,1))", "(vector,(0,1))", "(vector,(0,0,1))",
                "(vector,(1,1,1))", "(vector,[(0,1,1)]x)", "(vector,(0,1,-1))", "(vector;0)",
                "(vector,-1)", "(vector,(0,1,1)"]:
        with pytest.raises(ValueError):
            parse(bad, 3)


@given(st.text(alphabet="(vector,)[]x0123 ", max_size=40), st.integers(0, 30))
@settings(suppress_health_check=[HealthCheck.too_slow])
def test_parse_mapping_total(text, size):
    try:
        out = mapping.parse_process_mapping(text, size)
    except ValueError:
        return
    assert len(out) == size


# ---------------------------------------------------------------------------
# kvsname and shm helpers
# ---------------------------------------------------------------------------

def test_kvsname_and_shm(tmp_path):
    a, b = shm.new_kvsname(), shm.new_kvsname()
    assert a != b and a.startswith(f"kvs_{os.getpid()}_")
    assert shm._fnv1a32(b"") == 0x811C9DC5 and shm._fnv1a32(b"a") == 0xE40C292C
    h = f"{shm._fnv1a32(a.encode()):x}"
    mine = [tmp_path / f"mpich_shm_{h}_0", tmp_path / f"mpich_shm_{h}_1"]
    other = tmp_path / f"mpich_shm_{h}0_0"
    for p in mine + [other]:
        p.write_bytes(b"x")
    assert shm.shm_segments(a, str(tmp_path)) == sorted(map(str, mine))
    assert shm.remove_shm_segments(a, str(tmp_path)) == 2
    assert shm.shm_segments(a, str(tmp_path)) == [] and other.exists()


def test_only_the_users_own_segments_of_its_jobs_name_are_removed(tmp_path):
    # Another user lists /dev/shm, sees a job's segment and makes anything of such
    # a name: a directory once made the job's end fail ("Is a directory").
    a = shm.new_kvsname()
    h = f"{shm._fnv1a32(a.encode()):x}"
    (tmp_path / f"mpich_shm_{h}_0").write_bytes(b"x")
    (tmp_path / f"mpich_shm_{h}_dir").mkdir()
    os.symlink(tmp_path / f"mpich_shm_{h}_dir", tmp_path / f"mpich_shm_{h}_link")
    left = [f"mpich_shm_{h}_dir", f"mpich_shm_{h}_link"]
    if os.geteuid() == 0:
        theirs = tmp_path / f"mpich_shm_{h}_theirs"
        theirs.write_bytes(b"y")
        os.chown(theirs, 65534, 65534)
        left.append(theirs.name)
    assert shm.remove_shm_segments(a, str(tmp_path)) == 1
    assert sorted(os.listdir(tmp_path)) == sorted(left)


def test_the_directories_of_a_guard_have_names_no_other_user_can_know(tmp_path, monkeypatch):
    # A guard's marker names its cgroup, which every user may list, before the job
    # makes any directory: names made of it alone could be taken first.
    from mslaunch.mpi.early import SingletonProbe
    from mslaunch.mpi.pmi.files import backing_path, probe_path
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    marker = f"kvs_{os.getpid()}_0123abcd"
    for made in (probe_path, backing_path, shm.pmix_dir):
        one, two = made(marker), made(marker)
        assert one != two and os.path.basename(one).rpartition("-")[0] == \
            os.path.basename(two).rpartition("-")[0]
        assert len(os.path.basename(one).rpartition("-")[2]) == 12
    (tmp_path / f"mslaunch-ompi-{marker}").mkdir()       # the name alone, taken: no matter
    probe = SingletonProbe(marker)
    try:
        assert os.path.basename(probe.path).startswith(f"mslaunch-ompi-{marker}-")
    finally:
        probe.close()
    assert not os.path.exists(probe.path)


def test_a_dead_launchers_watchdog_removes_its_own_directories_only(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    marker = "kvs_4194000_0123abcd"
    mine = [shm.pmix_dir(marker), os.path.join(tmp_path, f"mslaunch-ompi-{marker}-00aa11bb22cc")]
    others = [os.path.join(tmp_path, f"mslaunch-ompi-{marker}.4194001-00aa11bb22cc"),  # an agent's
              os.path.join(tmp_path, f"mslaunch-ompi-{marker}")]
    for path in mine + others:
        os.makedirs(os.path.join(path, "inner"))
    if os.geteuid() == 0:
        theirs = os.path.join(tmp_path, f"mslaunch-pmix-{marker}-ffffffffffff")
        os.mkdir(theirs)
        os.chown(theirs, 65534, 65534)
        others.append(theirs)
    shm.after_launcher_death([], marker)
    assert not any(os.path.exists(p) for p in mine)
    assert all(os.path.isdir(p) for p in others)
    # ... and a later job's sweep removes those of dead processes, this user's only
    shm.sweep_leftovers()
    assert [p for p in others if os.path.exists(p)] == others[2:]


def test_the_server_is_made_when_a_rank_first_speaks_and_serves_every_socket():
    """Over inherited sockets a job holds its ranks' socket pairs until one speaks:
    a rank that ends without a word needs no server; the first that speaks has
    the server made, which then serves every other rank's socket too."""
    from mslaunch.mpi.pmi.job import PMIJob
    from mslaunch.mpi.pmi.state import LocalJobState

    class Owner(Recorder):
        def __init__(self) -> None:
            super().__init__()
            self.started: List[int] = []

        def pmi_started(self, job, rank: int) -> None:
            self.started.append(rank)

    class Pumped:
        loop = Loop()

    kvsname = shm.new_kvsname()
    made: List[int] = []

    def state() -> LocalJobState:
        made.append(1)
        return LocalJobState(kvsname=kvsname, size=3, process_mapping="", universe_size=3,
                             appnums=[0, 0, 0])
    owner = Owner()
    pj = PMIJob(owner, number=1, kvsname=kvsname, size=3, state=state, keys={0: 0, 1: 1, 2: 2})
    pj.serve(Pumped.loop, [0, 0, 0], "", tcp=False)
    peers = [Peer(Pumped, socket.socket(fileno=os.dup(int(pj.env(r)["PMI_FD"]))))  # type: ignore[arg-type]
             for r in range(3)]
    assert pj.inherited is pj
    pj.release_child_fds()
    try:
        peers[2].sock.close()                   # rank 2 ends without a word
        for _ in range(5):
            Pumped.loop.run_once(0.005)
        assert pj.server is None and made == [] and pj.serving
        assert peers[1].v1("cmd=init pmi_version=1 pmi_subversion=1")[1]["rc"] == "0"
        assert pj.server is not None and made == [1]
        assert peers[0].v1("cmd=init pmi_version=1 pmi_subversion=1")[1]["rc"] == "0"
        assert peers[0].v1("cmd=get_my_kvsname") == ("my_kvsname", {"rc": "0", "kvsname": kvsname})
        assert sorted(owner.started) == [0, 1]
        peers[0].sock.close()                   # an initialized rank lost is reported
        for _ in range(5):
            Pumped.loop.run_once(0.005)
        assert owner.lost == [0] and owner.logs == []
    finally:
        pj.close()
        for peer in peers:
            peer.sock.close()
        Pumped.loop.close()
    assert not pj.serving and pj.server is None


def test_constructor_checks():
    loop = Loop()
    common = dict(size=2, process_mapping="(vector,(0,1,2))", universe_size=2, listener=Recorder())
    for bad in ["0", "singinit", "", "has space", "x" * 300]:
        with pytest.raises(ValueError):
            pmiserver.PMIServer(loop, kvsname=bad, appnums=[0, 0], **common)
    with pytest.raises(ValueError):
        pmiserver.PMIServer(loop, kvsname="kvs_1", appnums=[0], **common)
    srv = pmiserver.PMIServer(loop, kvsname="kvs_1", appnums=[0, 0], **common)
    with pytest.raises(ValueError):
        srv.child_fd(2)
    srv.child_fd(0)
    with pytest.raises(ValueError):
        srv.child_fd(0)
    with pytest.raises(RuntimeError):
        srv.tcp_env(0)
    srv.close()


# ---------------------------------------------------------------------------
# PMI-1 over the inherited socket and TCP
# ---------------------------------------------------------------------------

def test_v1_transcript_order(harness):
    """The per-rank sequence MPICH 5.0.2 sends (reference pmi.md section 5), N=2."""
    h = harness(2)
    r0, r1 = h.pair(0), h.pair(1)
    for r in (r0, r1):
        r.send(b"cmd=init pmi_version=1 pmi_subversion=1\n")
        assert r.line() == "cmd=response_to_init rc=0 pmi_version=1 pmi_subversion=1"
        r.send(b"cmd=get_maxes\n")
        assert r.line() == f"cmd=maxes rc=0 kvsname_max=256 keylen_max=64 vallen_max={wire.VALLEN_MAX}"
        r.send(b"cmd=get_appnum\n")
        assert r.line() == "cmd=appnum rc=0 appnum=0"
        r.send(b"cmd=get_my_kvsname\n")
        assert r.line() == f"cmd=my_kvsname rc=0 kvsname={h.kvsname}"
        r.send(f"cmd=get kvsname={h.kvsname} key=PMI_process_mapping\n".encode())
        assert r.line() == "cmd=get_result rc=0 value=(vector,(0,1,2))"
        for key in ("PMI_hwloc_xmlfile", "PMI_mpi_memory_alloc_kinds"):
            r.send(f"cmd=get kvsname={h.kvsname} key={key}\n".encode())
            assert r.line() == "cmd=get_result rc=1 msg=key_not_found"
    r0.send(b"cmd=barrier_in\n")
    assert r0.silent()
    r1.send(b"cmd=barrier_in\n")
    assert r0.line() == "cmd=barrier_out rc=0" and r1.line() == "cmd=barrier_out rc=0"
    for r in (r0, r1):
        r.send(b"cmd=finalize\n")
        assert r.line() == "cmd=finalize_ack rc=0"
        r.close()
    assert h.rec.lost == [] and h.rec.logs == []
    assert h.server.stats["total"] == 18 and h.server.stats["get"] == 6
    assert h.server.stats["barrier_in"] == 2


def test_v1_tcp_handshake(harness):
    h = harness(3, appnums=[0, 0, 2])
    h.server.listen_tcp()
    peer = h.tcp()
    pmi_id = h.server.tcp_env(2)["PMI_ID"]
    assert h.server.tcp_env(2)["PMI_PORT"].startswith("127.0.0.1:")
    peer.send(f"cmd=initack pmiid={pmi_id}\n".encode())
    assert [peer.line() for _ in range(4)] == [
        "cmd=initack rc=0 rank=2 size=3 appnum=2 debug=0",
        "cmd=set size=3", "cmd=set rank=2", "cmd=set debug=0"]
    h.init_v1(peer)
    assert peer.v1("cmd=get_appnum")[1]["appnum"] == "2"
    assert peer.v1("cmd=finalize")[0] == "finalize_ack"
    ids = {h.server.tcp_env(r)["PMI_ID"] for r in range(3)}
    assert len(ids) == 3 and all(1 <= int(i) < 2**31 for i in ids)


def test_v1_kvs_and_attributes(harness):
    h = harness(2, node_ids=[0, 1], appnums=[1, 1], universe=8)
    a, b = h.pair(0), h.pair(1)
    h.init_v1(a)
    h.init_v1(b)
    k = h.kvsname
    assert a.v1(f"cmd=put kvsname={k} key=card-0 value=00ff[3]") == ("put_result", {"rc": "0"})
    assert b.v1(f"cmd=get kvsname={k} key=card-0") == ("get_result", {"rc": "0", "value": "00ff[3]"})
    assert b.v1(f"cmd=get kvsname={k} key=card-1")[1] == {"rc": "1", "msg": "key_not_found"}
    assert b.v1("cmd=get kvsname=other key=card-0")[1]["rc"] == "1"
    assert a.v1(f"cmd=put kvsname={k} key=PMI_process_mapping value=x")[1]["rc"] == "1"
    assert a.v1(f"cmd=put kvsname={k} key={'k' * 65} value=x")[1]["rc"] == "1"
    assert a.v1(f"cmd=put kvsname={k} key=big value={'v' * (wire.VALLEN_MAX + 1)}")[1]["rc"] == "1"
    assert a.v1(f"cmd=put kvsname={k} key=max value={'v' * wire.VALLEN_MAX}")[1]["rc"] == "0"
    assert len(b.v1(f"cmd=get kvsname={k} key=max")[1]["value"]) == wire.VALLEN_MAX
    assert b.v1(f"cmd=get kvsname={k} key=PMI_process_mapping")[1]["value"] == "(vector,(0,2,1))"
    assert b.v1(f"cmd=get kvsname={k} key=PMI_anything")[1] == {"rc": "1", "msg": "key_not_found"}
    assert a.v1("cmd=get_universe_size") == ("universe_size", {"rc": "0", "size": "8"})
    assert a.v1("cmd=get_appnum")[1]["appnum"] == "1"
    assert a.v1("cmd=put key=nokvs value=1")[1]["rc"] == "0"   # kvsname is optional
    assert h.rec.logs == []


def test_v1_names(harness):
    h = harness(2)
    a, b = h.pair(0), h.pair(1)
    h.init_v1(a)
    h.init_v1(b)
    assert a.v1("cmd=publish_name service=svc port=tag#0$") == ("publish_result", {"rc": "0"})
    assert b.v1("cmd=publish_name service=svc port=x")[1]["rc"] == "1"
    assert b.v1("cmd=lookup_name service=svc") == ("lookup_result", {"rc": "0", "port": "tag#0$"})
    assert b.v1("cmd=unpublish_name service=svc") == ("unpublish_result", {"rc": "0"})
    assert b.v1("cmd=lookup_name service=svc")[1]["rc"] == "1"
    assert b.v1("cmd=unpublish_name service=svc")[1]["rc"] == "1"


def test_v1_spawn_refused_after_whole_message(harness):
    h = harness(1)
    p = h.pair(0)
    h.init_v1(p)
    first = ("mcmd=spawn\nnprocs=1\nexecname=/bin/prog with space\ntotspawns=2\nspawnssofar=1\n"
             "argcnt=1\narg1=-x\npreput_num=1\npreput_key_0=PARENT_ROOT_PORT_NAME\n"
             "preput_val_0=tag#0$\ninfo_num=0\nendcmd\n")
    p.send(first.encode())
    assert p.silent()
    p.send(b"mcmd=spawn\nnprocs=1\nexecname=b\ntotspawns=2\nspawnssofar=2\nargcnt=0\ninfo_num=0\nendcmd\n")
    cmd, f = wire.parse_v1(p.line())
    assert cmd == "spawn_result" and f["rc"] == "1"
    assert p.silent()
    assert p.v1("cmd=get_maxes")[0] == "maxes"


def test_v1_abort(harness):
    h = harness(2)
    p = h.pair(1)
    h.init_v1(p)
    p.send(b"cmd=abort exitcode=7 message=abort\n")
    assert p.silent()
    assert h.rec.aborts == [(1, 7, "abort")]
    p.close()
    assert h.rec.lost == []


def test_lost_exactly_once(harness):
    h = harness(4)
    never, done, lost, v2 = h.pair(0), h.pair(1), h.pair(2), h.pair(3)
    h.init_v1(done)
    done.v1("cmd=finalize")
    h.init_v1(lost)
    h.init_v2(v2)
    for p in (never, done, lost, v2):
        p.close()
    assert sorted(h.rec.lost) == [2, 3]
    h.server.close()
    assert sorted(h.rec.lost) == [2, 3]


def test_lost_when_server_cuts_an_initialized_rank(harness):
    h = harness(2)
    p = h.pair(0)
    h.init_v1(p)
    p.send(b"cmd=get \xff\n")
    assert p.closed_by_server()
    assert h.rec.lost == [0] and len(h.rec.logs) == 1


def test_barrier_four_ranks(harness):
    h = harness(4)
    peers = [h.pair(r) for r in range(4)]
    for p in peers:
        h.init_v1(p)
    for p in peers[:3]:
        p.send(b"cmd=barrier_in\n")
    for p in peers[:3]:
        assert p.silent(0.05)
    # the server keeps serving while three ranks wait
    assert peers[3].v1("cmd=get_maxes")[0] == "maxes"
    peers[3].send(b"cmd=barrier_in\n")
    assert [p.line() for p in peers] == ["cmd=barrier_out rc=0"] * 4
    # a second epoch works the same way
    for p in peers:
        p.send(b"cmd=barrier_in\n")
    assert [p.line() for p in peers] == ["cmd=barrier_out rc=0"] * 4


def test_out_of_order_requests(harness):
    h = harness(3)
    p = h.pair(0)
    assert p.v1("cmd=barrier_in") == ("barrier_out", {"rc": "1", "msg": "not_initialized"})
    assert p.v1("cmd=get key=x")[1]["rc"] == "1"
    h.init_v1(p)
    assert p.v1("cmd=init pmi_version=1 pmi_subversion=1")[1] == {"rc": "1", "msg": "already_initialized"}
    assert p.v1("cmd=initack pmiid=5")[1]["rc"] == "1"
    assert p.v1("cmd=frobnicate x=1") == ("error", {"rc": "1", "msg": "unknown_command"})
    assert p.v1("cmd=finalize")[0] == "finalize_ack"
    assert p.v1("cmd=get_maxes") == ("maxes", {"rc": "1", "msg": "finalized"})
    assert len(h.rec.logs) == 1  # one line per connection
    q = h.pair(1)
    assert q.v1("cmd=init pmi_version=9")[1]["rc"] == "1"
    assert len(h.rec.logs) == 2
    assert_serves(h, 2)
    assert h.rec.lost == []


def test_too_many_errors_closes(harness):
    h = harness(2)
    p = h.pair(0)
    for _ in range(wire.MAX_ERRORS):
        assert p.v1("cmd=nope")[1]["rc"] == "1"
    p.send(b"cmd=nope\n")
    assert p.closed_by_server()
    assert_serves(h, 1)


# ---------------------------------------------------------------------------
# hostile peers
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("payload", [
    b"hello world\n",                 # neither cmd= nor a PMI-2 length
    b"\x00\x01\x02\x03\xff\xfe\xfd",  # binary
    b"cmd=get key=\xc3\x28\n",        # invalid UTF-8
    b"cmd=get key=a\r\n",             # control character
    b"cmd=get key=\n",                # empty value
    b"    12cmd=x;;;;;;;",            # malformed PMI-2 frame
    b"999999cmd=",                    # PMI-2 frame over the size limit
])
def test_garbage_closes_connection(harness, payload):
    h = harness(2)
    p = h.pair(0)
    p.send(payload)
    assert p.closed_by_server()
    assert len(h.rec.logs) == 1 and h.rec.lost == []
    assert_serves(h, 1)


@pytest.mark.parametrize("tcp", [False, True])
def test_ten_megabyte_line(harness, tcp):
    h = harness(2)
    p = h.tcp() if tcp else h.pair(0)
    if tcp:
        p.send(f"cmd=initack pmiid={h.server.tcp_env(0)['PMI_ID']}\n".encode())
        assert p.line().startswith("cmd=initack rc=0")
        for _ in range(3):
            p.line()
    try:
        p.send(b"cmd=put key=a value=" + b"x" * (10 << 20))
    except (BrokenPipeError, ConnectionResetError):
        pass
    assert p.closed_by_server()
    assert len(h.rec.logs) == 1
    assert_serves(h, 1)


def test_flooder_that_never_reads(harness):
    h = harness(2)
    p = h.pair(0)
    h.init_v1(p)
    burst = b"cmd=get_maxes\n" * 5000
    try:
        for _ in range(200):
            p.sock.setblocking(True)
            p.sock.settimeout(0.01)
            try:
                p.sock.send(burst)
            except (socket.timeout, BlockingIOError):
                pass
            for _ in range(3):
                h.loop.run_once(0.001)
            if h.rec.logs:
                break
    except (BrokenPipeError, ConnectionResetError):
        pass
    assert h.rec.logs and "read" in h.rec.logs[0]
    assert h.rec.lost == [0]
    assert_serves(h, 1)


def test_tcp_wrong_and_duplicate_id(harness):
    h = harness(2)
    h.server.stranger_log_limit = (10, 10.0)
    h.server.listen_tcp()
    ids = [int(h.server.tcp_env(r)["PMI_ID"]) for r in range(2)]
    wrong = next(i for i in range(1, 100) if i not in ids)
    for pmiid in [str(wrong), "abc", f"0{ids[0]}", f"{ids[0]}0", "-1"]:
        p = h.tcp()
        p.send(f"cmd=initack pmiid={pmiid}\n".encode())
        assert p.closed_by_server(), pmiid
    assert len(h.rec.logs) == 5
    good = h.tcp()
    good.send(f"cmd=initack pmiid={ids[0]}\n".encode())
    assert good.line() == "cmd=initack rc=0 rank=0 size=2 appnum=0 debug=0"
    dup = h.tcp()
    dup.send(f"cmd=initack pmiid={ids[0]}\n".encode())
    assert dup.closed_by_server()
    assert "twice" in h.rec.logs[-1]


def test_tcp_commands_before_initack(harness):
    h = harness(2)
    p = h.tcp()
    p.send(b"cmd=init pmi_version=1 pmi_subversion=1\n")
    assert p.closed_by_server()
    p = h.tcp()
    p.send(b"cmd=get_maxes\n")
    assert p.closed_by_server()
    assert len(h.rec.logs) == 2


def test_tcp_silent_peer_times_out(harness):
    h = harness(2)
    h.server.auth_timeout = 0.3
    silent = h.tcp()
    slow = h.tcp()
    slow.send(b"cmd=initack pm")   # partial line, never finished
    assert silent.closed_by_server(3) and slow.closed_by_server(3)
    assert len(h.rec.logs) == 2 and "time" in h.rec.logs[0]
    assert h.server.door.pending == 0


def test_tcp_preauth_limits(harness):
    h = harness(2)
    p = h.tcp()
    p.send(b"cmd=initack pmiid=" + b"1" * 2000)
    assert p.closed_by_server()
    h.server.max_pending = 3
    idle = [h.tcp() for _ in range(3)]
    h.tcp()                               # takes the place of the longest-waiting one
    assert idle[0].closed_by_server()
    assert any("evicted" in line for line in h.rec.logs)
    # Idle strangers never cost a real rank its place.
    good = h.tcp()
    good.send(f"cmd=initack pmiid={h.server.tcp_env(1)['PMI_ID']}\n".encode())
    assert good.line().startswith("cmd=initack rc=0 rank=1")


def test_a_rank_slow_to_speak_is_not_evicted_by_a_flood_of_strangers(harness):
    # The rank's connection is accepted, then it is descheduled for a moment
    # before it sends its PMI_ID, while strangers keep connecting: a full
    # table of strangers waits (in the kernel's queue) instead of evicting it.
    h = harness(2)
    h.server.max_pending = 3
    h.server.evict_grace = 1.0
    rank = h.tcp()
    strangers = [h.tcp() for _ in range(8)]
    for _ in range(20):
        h.loop.run_once(0.01)
    rank.send(f"cmd=initack pmiid={h.server.tcp_env(0)['PMI_ID']}\n".encode())
    assert rank.line().startswith("cmd=initack rc=0 rank=0")
    assert not any("evicted" in line for line in h.rec.logs)
    # Strangers that had their time are evicted in turn, oldest first.
    assert strangers[0].closed_by_server()
    assert any("evicted" in line for line in h.rec.logs)


@given(st.binary(min_size=1, max_size=200))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_fuzz_never_breaks_the_loop(harness, data):
    h = Harness(2)
    try:
        p = h.pair(0)
        p.send(data)
        for _ in range(10):
            h.loop.run_once(0.001)   # must not raise
        assert len(h.rec.logs) <= 1
        assert_serves(h, 1)
    finally:
        h.close()


# ---------------------------------------------------------------------------
# PMI-2
# ---------------------------------------------------------------------------

def test_v2_session(harness):
    h = harness(2, node_ids=[0, 0], appnums=[0, 3], universe=5)
    a, b = h.pair(0), h.pair(1)
    fa = h.init_v2(a, pmirank=0)
    assert fa == {"rc": "0", "rank": "0", "size": "2", "appnum": "0", "pmiverbose": "FALSE",
                  "pmi-version": "2", "pmi-subversion": "0", "debugged": "FALSE"}
    assert h.init_v2(b, pmirank=1)["appnum"] == "3"
    assert a.v2("job-getid") == ("job-getid-response", {"rc": "0", "jobid": h.kvsname})
    assert a.v2("kvs-put", key="bc-0", value="a b=c") == ("kvs-put-response", {"rc": "0"})
    assert a.v2("kvs-put", key="PMI_x", value="1")[1]["rc"] == "1"
    a.send(wire.format_v2("kvs-fence"))
    assert a.silent()
    assert b.v2("kvs-fence") == ("kvs-fence-response", {"rc": "0"})
    assert a.frame() == ("kvs-fence-response", {"rc": "0"})
    assert b.v2("kvs-get", jobid=h.kvsname, srcid=0, key="bc-0")[1] == {
        "rc": "0", "found": "TRUE", "value": "a b=c"}
    assert b.v2("kvs-get", key="-NONEXIST-KEY")[1] == {"rc": "0", "found": "FALSE"}
    assert b.v2("kvs-get", jobid="other", key="bc-0")[1]["found"] == "FALSE"
    assert a.v2("info-getjobattr", key="PMI_process_mapping")[1] == {
        "rc": "0", "found": "TRUE", "value": "(vector,(0,1,2))"}
    assert a.v2("info-getjobattr", key="universeSize")[1]["value"] == "5"
    assert a.v2("info-getjobattr", key="PMI_mpi_memory_alloc_kinds")[1]["found"] == "FALSE"
    # node attributes: wait=TRUE is parked until the put
    assert a.v2("info-getnodeattr", key="shm", wait="FALSE")[1]["found"] == "FALSE"
    a.send(wire.format_v2("info-getnodeattr", {"key": "shm", "wait": "TRUE", "thrid": "0x1"}))
    assert a.silent()
    assert b.v2("info-putnodeattr", key="shm", value="/seg") == ("info-putnodeattr-response", {"rc": "0"})
    assert a.frame() == ("info-getnodeattr-response",
                         {"rc": "0", "found": "TRUE", "value": "/seg", "thrid": "0x1"})
    # names
    assert a.v2("name-publish", name="svc", port="p 1") == ("name-publish-response", {"rc": "0"})
    assert b.v2("name-publish", name="svc", port="p")[1]["rc"] == "1"
    assert b.v2("name-lookup", name="svc")[1] == {"rc": "0", "port": "p 1"}
    assert b.v2("name-unpublish", name="svc") == ("name-unpublish-response", {"rc": "0"})
    assert b.v2("name-lookup", name="svc")[1]["rc"] == "1"
    assert b.v2("spawn", ncmds=1, subcmd="x", maxprocs=1, argc=0)[1]["rc"] == "1"
    assert a.v2("finalize") == ("finalize-response", {"rc": "0"})
    assert a.v2("kvs-get", key="x")[1]["rc"] == "1"            # after finalize
    a.close()
    b.send(wire.format_v2("abort", {"exitcode": -1, "message": "bye now"}))
    assert b.silent()
    b.close()
    assert h.rec.aborts == [(1, 255, "bye now")] and h.rec.lost == []


def test_v2_node_attrs_are_per_node(harness):
    h = harness(4, node_ids=[0, 1, 0, 1])
    peers = [h.pair(r) for r in range(4)]
    for p in peers:
        h.init_v2(p)
    peers[1].send(wire.format_v2("info-getnodeattr", {"key": "k", "wait": "TRUE"}))
    assert peers[0].v2("info-putnodeattr", key="k", value="node0")[1]["rc"] == "0"
    assert peers[2].v2("info-getnodeattr", key="k")[1]["value"] == "node0"
    assert peers[1].silent()                      # node 0's put does not wake node 1
    assert peers[3].v2("info-putnodeattr", key="k", value="node1")[1]["rc"] == "0"
    assert peers[1].frame()[1]["value"] == "node1"
    assert peers[2].v2("info-getnodeattr", key="k")[1]["value"] == "node0"


def test_v2_direct_frames_and_order(harness):
    h = harness(2)
    p = h.pair(1)
    assert p.v2("kvs-get", key="x")[1]["rc"] == "1"                  # before fullinit
    assert p.v2("fullinit", pmirank=1)[1]["rank"] == "1"
    assert p.v2("fullinit", pmirank=1)[1]["rc"] == "1"                # twice
    assert p.v2("job-connect", jobid="x") == ("error", {"rc": "1", "errmsg": "unknown_command"})
    assert len(h.rec.logs) == 1
    p.close()
    assert h.rec.lost == [1]


def test_v2_fence_four_ranks(harness):
    h = harness(4)
    peers = [h.pair(r) for r in range(4)]
    for p in peers:
        h.init_v2(p)
    for i, p in enumerate(peers):
        assert p.v2("kvs-put", key=f"k{i}", value=str(i))[1]["rc"] == "0"
    for p in peers[:3]:
        p.send(wire.format_v2("kvs-fence"))
    assert all(p.silent(0.05) for p in peers[:3])
    peers[3].send(wire.format_v2("kvs-fence"))
    assert all(p.frame()[0] == "kvs-fence-response" for p in peers)
    assert [peers[0].v2("kvs-get", key=f"k{i}")[1]["value"] for i in range(4)] == ["0", "1", "2", "3"]


def test_v2_over_tcp(harness):
    h = harness(2)
    h.server.listen_tcp()
    p = h.tcp()
    pmi_id = h.server.tcp_env(1)["PMI_ID"]
    f = h.init_v2(p, pmirank=pmi_id)
    assert (f["rank"], f["size"]) == ("1", "2")
    bad = h.tcp()
    bad.v1("cmd=init pmi_version=2 pmi_subversion=0")
    bad.send(wire.format_v2("fullinit", {"pmirank": 0}))
    assert bad.closed_by_server()
    bad = h.tcp()
    bad.v1("cmd=init pmi_version=2 pmi_subversion=0")
    bad.send(wire.format_v2("kvs-get", {"key": "x"}))
    assert bad.closed_by_server()
    assert len(h.rec.logs) == 2


def test_close_releases_everything(harness):
    h = harness(2)
    h.server.listen_tcp()
    p = h.pair(0)
    h.init_v1(p)
    h.server.close()
    assert p.closed_by_server()
    assert h.rec.lost == []
    assert h.loop._cbs == {}


# ---------------------------------------------------------------------------
# real MPICH ranks (mpi4py + the mpich wheel)
# ---------------------------------------------------------------------------

def _mpich_libmpi() -> Optional[str]:
    path = os.path.join(sys.prefix, "lib", "libmpi.so.12")
    return path if os.path.exists(path) else None


@pytest.fixture
def requires_mpi4py():
    require(importlib.util.find_spec("mpi4py") is not None and _mpich_libmpi() is not None,
            f"mpi4py with the MPICH wheel (libmpi.so.12) installed for {sys.executable}")


def rank_env(extra: Dict[str, str]) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "PMIX_", "OMPI_", "PRTE_", "HYDI_", "MPICH_PMI", "MPIR_CVAR_PMI"))
           and k not in ("PRTE_LAUNCHED", "PYTHONUNBUFFERED")}
    # mpi4py dlopens libmpi.so.12 before libmpi.so.40 by default; pin MPICH explicitly.
    env["MPI4PY_LIBMPI"] = _mpich_libmpi() or ""
    env["PYTHONPATH"] = helpers.REPO
    env.update(extra)
    return env


def run_mpi(tmp_path: Path, n: int, program: str, *, tcp: bool = False,
            node_ids: Optional[List[int]] = None, timeout: float = 120.0):
    """Serve PMI for n real ranks; stop them (like the supervisor) on abort or loss."""
    loop = Loop()
    rec = Recorder()
    kvsname = shm.new_kvsname()
    server = pmiserver.PMIServer(loop, kvsname=kvsname, size=n,
                           process_mapping=mapping.process_mapping(node_ids or [0] * n),
                           universe_size=n, appnums=[0] * n, listener=rec)
    procs: List[subprocess.Popen] = []
    outs = [tmp_path / f"rank{r}.out" for r in range(n)]
    try:
        if tcp:
            server.listen_tcp()
        for r in range(n):
            if tcp:
                extra, fds = server.tcp_env(r), ()
            else:
                fd = server.child_fd(r)
                extra, fds = {"PMI_FD": str(fd), "PMI_RANK": str(r), "PMI_SIZE": str(n)}, (fd,)
            with open(outs[r], "wb") as out:
                procs.append(subprocess.Popen(
                    [sys.executable, str(PROGRAMS / program)], env=rank_env(extra), pass_fds=fds,
                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True))
        server.release_child_fds()
        deadline = time.monotonic() + timeout
        while any(p.poll() is None for p in procs):
            if rec.aborts or rec.lost:
                grace = time.monotonic() + 2
                while time.monotonic() < grace and any(p.poll() is None for p in procs):
                    loop.run_once(0.02)
                break
            assert time.monotonic() < deadline, "ranks did not finish"
            loop.run_once(0.05)
        for _ in range(20):           # drain the last EOFs
            loop.run_once(0.01)
        codes = [p.poll() for p in procs]
        return codes, [o.read_text() for o in outs], rec, server.stats, kvsname
    finally:
        for p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            p.wait()
        server.close()
        loop.close()
        shm.remove_shm_segments(kvsname)
        assert shm.shm_segments(kvsname) == []


@pytest.mark.usefixtures("requires_mpi4py")
@pytest.mark.mpi
@pytest.mark.parametrize("n", [1, 2, 4])
def test_mpi_allreduce(tmp_path, n):
    codes, outs, rec, stats, _ = run_mpi(tmp_path, n, "pmi_allreduce.py")
    assert codes == [0] * n, outs
    for r, out in enumerate(outs):
        assert f"rank={r} size={n} sum={n * (n - 1) // 2} shared={n} lib=MPICH" in out, out
    assert rec.lost == [] and rec.aborts == [] and rec.logs == []
    assert stats["finalize"] == n and stats["init"] == n


@pytest.mark.usefixtures("requires_mpi4py")
@pytest.mark.mpi
def test_mpi_allreduce_tcp(tmp_path):
    codes, outs, rec, stats, _ = run_mpi(tmp_path, 2, "pmi_allreduce.py", tcp=True)
    assert codes == [0, 0], outs
    assert all("sum=1 shared=2 lib=MPICH" in out for out in outs), outs
    assert stats["initack"] == 2 and rec.logs == []


@pytest.mark.usefixtures("requires_mpi4py")
@pytest.mark.mpi
def test_mpi_two_claimed_nodes(tmp_path):
    """Round-robin over two claimed nodes: business cards go through the KVS."""
    codes, outs, rec, stats, _ = run_mpi(tmp_path, 4, "pmi_allreduce.py", node_ids=[0, 1, 0, 1])
    assert codes == [0] * 4, outs
    assert all("sum=6 shared=2 lib=MPICH" in out for out in outs), outs
    assert stats["put"] == 2   # one put per node root thanks to vallen_max


@pytest.mark.usefixtures("requires_mpi4py")
@pytest.mark.mpi
def test_mpi_abort(tmp_path):
    codes, outs, rec, _, _ = run_mpi(tmp_path, 2, "pmi_abort.py")
    assert rec.aborts and rec.aborts[0][:2] == (0, 7), (rec.aborts, outs)


@pytest.mark.usefixtures("requires_mpi4py")
@pytest.mark.mpi
def test_mpi_vanished_rank(tmp_path):
    codes, outs, rec, _, _ = run_mpi(tmp_path, 2, "pmi_vanish.py")
    assert rec.lost == [1], outs
    assert codes[1] == 0


# -- the wire's hand-written checks hold to the regular expressions they replace -------

_WIRE_TEXT = st.text(alphabet="ab09_/-= \\\x00\x1f\x7f;é\t", max_size=24)


@given(_WIRE_TEXT)
def test_wire_checks_match_their_regular_expressions(text):
    from mslaunch.mpi.pmi import wire
    assert wire.has_control(text) == bool(re.search(r"[\x00-\x1f\x7f]", text))
    assert wire.is_key(text) == bool(re.fullmatch(r"[A-Za-z0-9_/\-]+", text))
    assert wire.is_pmi_id(text) == bool(re.fullmatch(r"[1-9][0-9]{0,9}", text))
    raw = text.encode()
    assert wire._v2_header(raw) == bool(re.fullmatch(rb" *[0-9]+ *", raw))


@given(_WIRE_TEXT.filter(lambda t: not re.search(r"[\x00-\x1f\x7f]", t)),
       st.integers(0, 24))
def test_wire_v1_tokens_match_their_regular_expression(text, pos):
    from mslaunch.mpi.pmi import wire
    pos = min(pos, len(text))
    m = re.compile(r" *([A-Za-z0-9_/\-]+)=((?:\\.|\\$|[^ \\])+)").match(text, pos)
    expected = None if m is None else (m.group(1), re.sub(r"\\(.)", r"\1", m.group(2)),
                                       m.end())
    assert wire.v1_token(text, pos) == expected


def test_a_pmi_exchange_imports_no_regular_expressions():
    """Parsing and formatting PMI messages (an agent's, the launcher's) needs no ``re``."""
    code = ("import sys; from mslaunch.mpi.pmi import wire; "
            "wire.parse_v1('cmd=put kvsname=k key=a value=b\\\\ c\\n'); "
            "wire.parse_v2('cmd=fullinit;pmirank=0;'); "
            "wire.take_frame(bytearray(b'    10cmd=x;a=b;'), 99); "
            "wire.format_v1('put', {'key': 'a b'}); print('re' in sys.modules)")
    out = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True,
                         env={"PYTHONPATH": helpers.REPO}, check=True).stdout
    assert out.strip() == "False", out


# -- UCX's segments (MPICH's wheel brings UCX) ----------------------------------------

@pytest.mark.parametrize("users_dir", [False, True])
def test_ucx_segments_of_a_killed_rank_go_with_the_job(mpich, tmp_path, users_dir):
    """UCX unlinks a segment once mapped, unless told to keep it for its peers
    (UCX_POSIX_USE_PROC_LINK=n, as here): a rank killed holding one would leave it
    in /dev/shm.  mslaunch gives UCX the job's own directory there, removed with
    the job; a directory the user chose stays theirs."""
    import tempfile
    from helpers import clean_env, run
    from mslaunch.machine.trees import remove_tree
    own = Path(tempfile.mkdtemp(prefix="msl-t-", dir="/dev/shm"))     # UCX wants a tmpfs
    extra = {"UCX_POSIX_DIR": str(own)} if users_dir else {}
    r = run("-n", "2", "-x", "UCX_POSIX_USE_PROC_LINK=n", sys.executable,
            str(PROGRAMS / "ucx_segments.py"), env=clean_env(**extra), timeout=120)
    rows = [line.split()[1:] for line in r.stdout.decode().splitlines()
            if line.startswith("segments ")]
    segments = [path for row in rows for path in row[2:]]
    try:
        assert r.returncode == 137, r.stderr
        assert sorted(row[0] for row in rows) == ["0", "1"], r.stdout
        assert segments, r.stdout        # UCX's posix transport made segments
        places = {row[1] for row in rows} | {os.path.dirname(path) for path in segments}
        if users_dir:
            assert places == {str(own)} and own.is_dir()
        else:
            assert len(places) == 1, places
            [place] = places
            assert place.startswith("/dev/shm/mslaunch-ompi-"), place
            assert not os.path.exists(place), os.listdir(place)
    finally:
        for path in segments:            # what a failing run left, where it left it
            if os.path.dirname(path) == "/dev/shm":
                try:
                    os.unlink(path)
                except OSError:
                    pass
        remove_tree(str(own))
