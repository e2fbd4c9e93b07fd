"""The control link between the launcher and its agents: the codec, the real agent
driven over pipes (no SSH), and the launcher facing a lying agent over a real SSH host.

Every agent here is started the way SSH starts it -- ``sh -c <remote command>`` with
the bootstrap written to its stdin -- only without SSH in between, so the tests see
exactly what a launcher sees: the link's start mark, frames, the exit status and
the agent's stderr.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List, Optional, Sequence, Tuple

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from helpers import PY, clean_env, cmd, kill_tagged, tagged_pids, wait_for
from mslaunch.remote import bootstrap, link
from mslaunch.machine.output import CHUNK

Frame = Tuple[int, bytes]

JSON_KINDS = sorted(k for k in link.NAMES if k not in (link.OUTPUT, link.STDIN, link.LINES))


# ---------------------------------------------------------------------------
# strategies
# ---------------------------------------------------------------------------

#: Text as the launcher carries it: arbitrary bytes (no NUL) through os.fsdecode,
#: so lone surrogates (surrogateescape) are common; plus arbitrary Unicode text.
fs_bytes = st.binary(max_size=40).filter(lambda b: b"\0" not in b)
fs_text = st.one_of(fs_bytes.map(os.fsdecode), st.text(max_size=20))
json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(1 << 70), 1 << 70), fs_text),
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(fs_text, inner, max_size=4)),
    max_leaves=12)
json_bodies = st.one_of(st.none(), st.dictionaries(fs_text, json_values, max_size=5))


@st.composite
def frames(draw) -> Tuple[int, Any]:
    """``(kind, body)``: a JSON body (None: empty), or ``(rank, stream, data)``."""
    which = draw(st.sampled_from(["json", "output", "stdin"]))
    if which == "json":
        return draw(st.sampled_from(JSON_KINDS)), draw(json_bodies)
    rank = draw(st.one_of(st.integers(0, 3), st.just(link.ALL_RANKS),
                          st.integers(0, (1 << 32) - 1)))
    data = draw(st.binary(max_size=300))
    if which == "output":
        return link.OUTPUT, (rank, draw(st.sampled_from([1, 2])), data)
    return link.STDIN, (rank, 0, data)


def encode_frame(kind: int, body: Any) -> bytes:
    if kind == link.OUTPUT:
        return link.encode_output(*body)
    if kind == link.STDIN:
        return link.encode_stdin(body[0], body[2])
    return link.encode(kind, body)


def decode_frame(kind: int, body: bytes) -> Any:
    if kind in (link.OUTPUT, link.STDIN):
        return link.decode_binary(body)
    return link.decode_json(kind, body)


def chunked(data: bytes, cuts: Sequence[int]) -> List[bytes]:
    """``data`` cut at the (sorted, clipped) positions ``cuts``."""
    points = sorted({min(max(c, 0), len(data)) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in zip(points, points[1:])]


def feed_all(reader: link.Reader, pieces: Sequence[bytes]) -> List[Frame]:
    out: List[Frame] = []
    for piece in pieces:
        out += reader.feed(piece)
    return out


def stops_at_first_frame(data: bytes) -> bool:
    """Whether a Reader cuts no frame out of ``data``: its first header is invalid, or
    its first frame is incomplete (then it waits, however the bytes are chunked)."""
    if header_is_invalid(data):
        return True
    try:
        return link.Reader().feed(data) == []
    except link.LinkError:
        return False


def header_is_invalid(data: bytes) -> bool:
    """Whether the first frame header in ``data`` is one the Reader must reject."""
    if len(data) < 5:
        return False
    length, kind = link.HEAD.unpack_from(data)
    return not 1 <= length <= link.MAX_FRAME or kind not in link.NAMES


# ---------------------------------------------------------------------------
# 1. the codec: property tests
# ---------------------------------------------------------------------------

@settings(max_examples=200, deadline=None, database=None)
@given(st.lists(frames(), max_size=8), st.lists(st.integers(0, 4000), max_size=12))
def test_frames_survive_any_chunking(sent, cuts):
    data = b"".join(encode_frame(k, b) for k, b in sent)
    reader = link.Reader()
    got = feed_all(reader, chunked(data, cuts))
    assert not reader.buf
    assert [k for k, _ in got] == [k for k, _ in sent]
    for (kind, body), (gkind, gbody) in zip(sent, got):
        decoded = decode_frame(gkind, gbody)
        if kind in (link.OUTPUT, link.STDIN):
            assert decoded == body
        else:
            assert decoded == ({} if body is None else body)


@settings(max_examples=200, deadline=None, database=None)
@given(st.binary(max_size=3000), st.lists(frames(), min_size=1, max_size=4),
       st.lists(st.integers(0, 4000), max_size=10))
def test_junk_before_the_sync_mark_is_skipped_and_kept(junk, sent, cuts):
    # The junk must not itself hold the mark, nor end in a prefix that the mark completes.
    stream_head = junk + link.SYNC
    assume(stream_head.find(link.SYNC) == len(junk))
    frames_data = b"".join(encode_frame(k, b) for k, b in sent)
    reader = link.Reader(expect_sync=True)
    got = feed_all(reader, chunked(stream_head + frames_data, cuts))
    assert reader.synced
    assert reader.preamble == junk
    assert [decode_frame(k, b) for k, b in got] == [
        (b if k in (link.OUTPUT, link.STDIN) else (b or {})) for k, b in sent]


@settings(max_examples=200, deadline=None, database=None)
@given(st.lists(fs_bytes, max_size=6), st.dictionaries(fs_bytes.filter(lambda b: b"=" not in b),
                                                       fs_bytes, max_size=6))
def test_argv_and_environment_are_carried_byte_for_byte(argv, env):
    body = {"argv": [os.fsdecode(a) for a in argv],
            "env": {os.fsdecode(k): os.fsdecode(v) for k, v in env.items()}}
    (kind, raw), = link.Reader().feed(link.encode(link.JOB, body))
    assert raw.isascii()
    back = link.decode_json(kind, raw)
    assert [os.fsencode(a) for a in back["argv"]] == argv
    assert {os.fsencode(k): os.fsencode(v) for k, v in back["env"].items()} == env


def test_preamble_without_a_sync_mark_is_bounded():
    reader = link.Reader(expect_sync=True)
    assert reader.feed(b"x" * link.MAX_PREAMBLE) == []
    with pytest.raises(link.LinkError, match="start mark"):
        reader.feed(b"y" * (len(link.SYNC) + 1))


# ---------------------------------------------------------------------------
# 2. the codec: fuzz
# ---------------------------------------------------------------------------

def _cut_and_check(reader: link.Reader, pieces: Sequence[bytes]) -> None:
    """Feed; every outcome is frames whose bodies decode or raise LinkError."""
    fed = 0
    for piece in pieces:
        fed += len(piece)
        try:
            got = reader.feed(piece)
        except link.LinkError:
            return
        assert len(reader.buf) <= fed      # nothing is buffered beyond what came in
        for kind, body in got:
            assert kind in link.NAMES
            try:
                value = decode_frame(kind, body)
            except link.LinkError:
                continue
            assert isinstance(value, (dict, tuple))


@settings(max_examples=300, deadline=None, database=None)
@given(st.binary(max_size=2000), st.lists(st.integers(0, 2000), max_size=8), st.booleans())
def test_random_bytes_give_frames_or_link_error(data, cuts, expect_sync):
    _cut_and_check(link.Reader(expect_sync=expect_sync), chunked(data, cuts))


@settings(max_examples=250, deadline=None, database=None)
@given(st.lists(frames(), min_size=1, max_size=5), st.lists(st.integers(0, 1 << 16), max_size=6),
       st.integers(0, 1 << 16), st.lists(st.integers(0, 4000), max_size=6), st.booleans())
def test_damaged_frames_give_frames_or_link_error(sent, flips, cut, cuts, with_sync):
    data = bytearray((link.SYNC if with_sync else b"")
                     + b"".join(encode_frame(k, b) for k, b in sent))
    for bit in flips:
        bit %= len(data) * 8
        data[bit // 8] ^= 1 << (bit % 8)
    data = bytes(data[:cut % (len(data) + 1)])
    _cut_and_check(link.Reader(expect_sync=with_sync), chunked(data, cuts))


@settings(max_examples=150, deadline=None, database=None)
@given(st.sampled_from(JSON_KINDS), st.one_of(
    st.binary(max_size=200),
    st.text(max_size=200).map(lambda t: t.encode("utf-8", "surrogatepass")),
    json_values.map(lambda v: json.dumps(v).encode("ascii")),
    st.integers(1, 3000).map(lambda n: b"[" * n + b"]" * n)))
def test_decode_json_returns_an_object_or_raises_link_error(kind, body):
    try:
        value = link.decode_json(kind, body)
    except link.LinkError:
        return
    assert isinstance(value, dict)


@pytest.mark.parametrize("body", [
    b"[" * 200_000, b'{"a":' * 100_000, b'{"n":' + b"9" * 10_000 + b"}", b"\xff\xfe",
    b'"\xc3\xa9"', b"NaN", b"null", b"", b"{}garbage", b"\x00"])
def test_decode_json_hostile_bodies(body):
    try:
        value = link.decode_json(link.JOB, body)
    except link.LinkError:
        return
    assert value == {} and body in (b"",)


@settings(max_examples=200, deadline=None, database=None)
@given(st.integers(link.MAX_FRAME + 1, (1 << 32) - 1), st.sampled_from(sorted(link.NAMES)),
       st.booleans())
def test_a_length_above_max_frame_is_refused_from_the_header_alone(length, kind, sync):
    reader = link.Reader(expect_sync=sync)
    with pytest.raises(link.LinkError, match="out of range"):
        reader.feed((link.SYNC if sync else b"") + link.HEAD.pack(length, kind))
    # ... while the largest allowed length waits for its body without a copy of it.
    reader = link.Reader()
    assert reader.feed(link.HEAD.pack(link.MAX_FRAME, kind) + b"{") == []
    assert len(reader.buf) == 6


def test_short_binary_frames_are_link_errors():
    for body in (b"", b"\0", b"\0\0\0\0"):
        with pytest.raises(link.LinkError):
            link.decode_binary(body)
    assert link.decode_binary(b"\0\0\0\1\2") == (1, 2, b"")


def read_in_place(reader: link.Reader, data: bytes, sizes: Sequence[int]) -> List[Frame]:
    """Feed ``data`` as a receiver does: into :meth:`Reader.room`, ``sizes`` bytes a
    time; bodies are copied at once, as views are only good until the next read.
    The last OUTPUT view is held on to, as a careless consumer might."""
    out: List[Frame] = []
    held = None
    pos, i = 0, 0
    while pos < len(data):
        want = max(1, sizes[i % len(sizes)] if sizes else 1 << 16)
        i += 1
        room = reader.room(want)
        n = min(len(room), want, len(data) - pos)
        room[:n] = data[pos:pos + n]
        del room
        pos += n
        for kind, body in reader.received(n):
            assert (type(body) is memoryview) == (kind == link.OUTPUT)
            if kind == link.OUTPUT:
                held = body
            out.append((kind, bytes(body)))
    del held
    return out


@settings(max_examples=200, deadline=None, database=None)
@given(st.lists(frames(), max_size=8), st.lists(st.integers(1, 3000), max_size=6),
       st.booleans(), st.binary(max_size=200))
def test_frames_read_in_place_are_the_frames_fed(sent, sizes, sync, junk):
    data = b"".join(encode_frame(k, b) for k, b in sent)
    if sync:
        data = junk.replace(link.SYNC, b"") + link.SYNC + data
    expected = link.Reader(expect_sync=sync).feed(data)
    reader = link.Reader(expect_sync=sync)
    assert read_in_place(reader, data, sizes) == expected
    assert not reader.buf


def test_a_frame_larger_than_the_buffer_grows_it_and_it_shrinks_after():
    big = link.encode(link.JOB, {"x": "y" * (link.KEEP + 100)})
    data = big + link.encode_output(1, 1, b"z" * 1000)
    reader = link.Reader()
    got = read_in_place(reader, data, [1 << 16])
    assert [k for k, _ in got] == [link.JOB, link.OUTPUT]
    assert got[0][1] == big[5:]
    assert len(reader._mem) <= link.KEEP


# ---------------------------------------------------------------------------
# endpoints: frames through a real socket, plain or TLS, with a full send buffer
# ---------------------------------------------------------------------------

def test_waiting_on_a_descriptor_above_1023():
    """A launcher with many hosts holds such descriptors; select() cannot watch them."""
    import resource
    import socket

    from mslaunch.machine.loop import wait_fd
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 2100:
        if hard != resource.RLIM_INFINITY and hard < 2100:
            pytest.fail(f"RLIMIT_NOFILE hard limit {hard} is below 2100")
        resource.setrlimit(resource.RLIMIT_NOFILE, (2100, hard))
    a, b = socket.socketpair()
    high = os.dup2(b.fileno(), 2000)
    try:
        assert not wait_fd(high, False, 0.05)
        assert wait_fd(high, True, 0.05)
        a.send(b"x")
        assert wait_fd(high, False, 1.0)
    finally:
        os.close(high)
        a.close()
        b.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_the_launchers_certificate_is_a_self_signed_ca_for_two_days():
    """Its DER is put together by hand: held against cryptography's parser and
    OpenSSL's handshake (here, and in every TLS endpoint test below)."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    from mslaunch.remote import dialback
    import warnings
    serials = set()
    for _ in range(400):     # signatures and serials of every length the DER must encode
        key_pem, cert_pem = dialback.self_signed()
        with warnings.catch_warnings():
            warnings.simplefilter("error")      # cryptography warns of a negative serial
            cert = x509.load_pem_x509_certificate(cert_pem)
        key = load_pem_private_key(key_pem, None)
        assert cert.public_key().public_numbers() == key.public_key().public_numbers()
        cert.public_key().verify(cert.signature, cert.tbs_certificate_bytes,
                                 ec.ECDSA(hashes.SHA256()))
        assert cert.version == x509.Version.v3 and cert.issuer == cert.subject
        assert cert.subject.rfc4514_string() == "CN=mslaunch launcher"
        constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints)
        assert constraints.critical and constraints.value.ca
        now = datetime.datetime.now(datetime.timezone.utc)
        assert cert.not_valid_before_utc < now < cert.not_valid_after_utc
        assert cert.not_valid_after_utc - now > datetime.timedelta(days=1, hours=23)
        serials.add(cert.serial_number)
        assert 0 < cert.serial_number < 1 << 127
    assert len(serials) == 400


def test_making_the_credentials_does_not_import_x509():
    code = ("import sys\nfrom mslaunch.remote import dialback\ndialback.tls_credentials()\n"
            "print('cryptography.x509' in sys.modules)")
    out = subprocess.run([PY, "-c", code], capture_output=True, text=True, env=clean_env(),
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def _endpoint_pair(tls: bool):
    import socket
    import ssl

    from mslaunch.remote import dialback
    if not tls:
        return socket.socketpair()
    cert, server_context = dialback.tls_credentials()
    listener = socket.create_server(("127.0.0.1", 0))
    try:
        client_context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        client_context.check_hostname = False
        client_context.load_verify_locations(cadata=cert.decode())
        with ThreadPoolExecutor(1) as pool:
            accepted = pool.submit(lambda: server_context.wrap_socket(
                listener.accept()[0], server_side=True))
            client = client_context.wrap_socket(
                socket.create_connection(listener.getsockname()))
            server = accepted.result(10)
    finally:
        listener.close()
    return client, server


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
@settings(max_examples=25, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sizes=st.lists(st.integers(0, 300_000), min_size=1, max_size=12))
def test_output_frames_cross_a_socket_whole_from_reused_buffers(tls, sizes):
    import socket

    from mslaunch.remote.endpoint import SocketEndpoint
    from mslaunch.machine.loop import Loop
    loop = Loop()
    a, b = _endpoint_pair(tls)
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)   # most sends are left queued
    got: List[Frame] = []
    closed: List[str] = []
    sender = SocketEndpoint(loop, a, on_frame=lambda k, body: None, on_closed=closed.append)
    receiver = SocketEndpoint(loop, b, on_frame=lambda k, body: got.append((k, bytes(body))),
                              on_closed=closed.append)
    scratch = bytearray(max(sizes))
    expected = []
    try:
        for i, size in enumerate(sizes):
            data = bytes([65 + i % 26]) * size
            scratch[:size] = data
            sender.send_parts((link.output_head(i, 1, size), memoryview(scratch)[:size]))
            scratch[:] = b"#" * len(scratch)          # the agent's next read
            sender.send(link.encode(link.BEAT))
            expected += [link.encode_output(i, 1, data)[5:], b""]
        deadline = time.monotonic() + 30
        loop.run_until(lambda: len(got) == len(expected) or bool(closed)
                       or time.monotonic() > deadline)
        assert closed == []
        assert [body for _, body in got] == expected
    finally:
        sender.close()
        receiver.close()
        loop.close()


def test_a_tls_record_read_only_in_part_is_not_left_behind():
    """The first read has room for 64 KiB; the TLS records of a frame ending 5
    bytes past it leave those bytes decrypted inside the TLS object, where the
    loop cannot see them, and nothing else comes to wake it."""
    from mslaunch.remote.endpoint import FIRST_READ, SocketEndpoint
    from mslaunch.machine.loop import Loop
    import fcntl
    import struct
    import termios
    loop = Loop()
    a, b = _endpoint_pair(True)
    head = link.output_head(0, 1, 0)
    data = b"q" * (FIRST_READ - len(head) + 5)
    a.sendall(link.output_head(0, 1, len(data)))     # two records ...
    a.sendall(data)                                  # ... and four more
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:               # all of them arrived
        waiting = struct.unpack("i", fcntl.ioctl(b.fileno(), termios.FIONREAD, b"\0" * 4))[0]
        if waiting >= len(head) + len(data) + 5 * 16:
            break
        time.sleep(0.01)
    got: List[Frame] = []
    closed: List[str] = []
    sender = SocketEndpoint(loop, a, on_frame=lambda k, body: None, on_closed=closed.append)
    receiver = SocketEndpoint(loop, b, on_frame=lambda k, body: got.append((k, bytes(body))),
                              on_closed=closed.append)
    try:
        deadline = time.monotonic() + 5
        loop.run_until(lambda: bool(got) or bool(closed) or time.monotonic() > deadline)
        assert closed == [] and got == [(link.OUTPUT, link.encode_output(0, 1, data)[5:])]
    finally:
        sender.close()
        receiver.close()
        loop.close()


@pytest.mark.parametrize("ending", ["peer closes", "we close"])
def test_a_tls_connection_decrypted_in_a_thread_gives_every_frame_then_ends(ending):
    from mslaunch.remote.endpoint import InboundTLSEndpoint, SocketEndpoint
    from mslaunch.machine.loop import Loop
    loop = Loop()
    a, b = _endpoint_pair(True)
    got: List[Frame] = []
    closed: List[str] = []
    sender = SocketEndpoint(loop, a, on_frame=lambda k, body: None, on_closed=lambda r: None)
    receiver = InboundTLSEndpoint(loop, b, on_frame=lambda k, body: got.append((k, bytes(body))),
                                  on_closed=closed.append)
    thread = receiver._thread
    expected = [link.encode_output(i % 3, 1, bytes([48 + i % 10]) * (i * 7919 % 200_000))[5:]
                for i in range(60)]
    try:
        for body in expected:
            sender.send(link.HEAD.pack(len(body) + 1, link.OUTPUT) + body)
        deadline = time.monotonic() + 30
        loop.run_until(lambda: len(got) == len(expected) or bool(closed)
                       or time.monotonic() > deadline)
        assert closed == [] and [body for _, body in got] == expected
        if ending == "peer closes":
            sender.close()
            loop.run_until(lambda: bool(closed) or time.monotonic() > deadline)
            assert closed == ["the link reached end-of-file"]
        else:
            receiver.close("done")          # the thread is waiting for bytes that never come
            assert closed == ["done"]
        assert wait_for(lambda: not thread.is_alive(), 5)
    finally:
        sender.close()
        receiver.close()
        loop.close()


def test_without_a_thread_to_spare_a_tls_connection_is_read_on_the_loop(monkeypatch):
    import threading

    from mslaunch.remote.endpoint import InboundTLSEndpoint, SocketEndpoint
    from mslaunch.machine.loop import Loop
    loop = Loop()
    a, b = _endpoint_pair(True)
    got: List[Frame] = []
    closed: List[str] = []
    sender = SocketEndpoint(loop, a, on_frame=lambda k, body: None, on_closed=lambda r: None)

    def no_thread(self):
        raise RuntimeError("can't start new thread")
    monkeypatch.setattr(threading.Thread, "start", no_thread)
    receiver = InboundTLSEndpoint(loop, b, on_frame=lambda k, body: got.append((k, bytes(body))),
                                  on_closed=closed.append)
    monkeypatch.undo()
    try:
        assert receiver._thread is None
        body = link.encode_output(1, 2, b"z" * 300_000)
        sender.send(body)
        deadline = time.monotonic() + 10
        loop.run_until(lambda: bool(got) or bool(closed) or time.monotonic() > deadline)
        assert got == [(link.OUTPUT, body[5:])]
        sender.close()
        loop.run_until(lambda: bool(closed) or time.monotonic() > deadline)
        assert closed == ["the link reached end-of-file"]
    finally:
        receiver.close()
        loop.close()


# ---------------------------------------------------------------------------
# the real agent over pipes
# ---------------------------------------------------------------------------

PAYLOAD = bootstrap.payload()
SLEEPER = "import time; time.sleep(60)"


class AgentProc:
    """An agent started as SSH would start it, with the launcher's side of the link."""

    def __init__(self, tag: str) -> None:
        self.tag = tag
        self.proc = subprocess.Popen(
            ["sh", "-c", bootstrap.remote_command([PY])], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=clean_env(MSL_TEST_TAG=tag))
        self.fd = self.proc.stdout.fileno()
        self.reader = link.Reader(expect_sync=True)
        self.pending: List[Frame] = []
        self.eof = False
        self.output: Dict[Tuple[int, int], bytes] = {}
        self.ended: set = set()
        try:
            self.send(PAYLOAD)
            frame = self.next_frame(15)
            assert frame is not None and frame[0] == link.HELLO, (frame, self.stderr_now())
            assert self.reader.preamble == b""
            self.hello = link.decode_json(*frame)
        except BaseException:
            self.cleanup()
            raise

    # -- link ------------------------------------------------------------------
    def send(self, data: bytes) -> None:
        try:
            self.proc.stdin.write(data)
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            pass

    def close_link(self) -> None:
        try:
            self.proc.stdin.close()
        except BrokenPipeError:
            pass

    def _pump(self, timeout: float) -> bool:
        """Read once (up to ``timeout``); False at end-of-file or when nothing came."""
        if self.eof:
            return False
        ready, _, _ = select.select([self.fd], [], [], max(0.0, timeout))
        if not ready:
            return False
        data = os.read(self.fd, 1 << 16)
        if not data:
            self.eof = True
            return False
        self.pending += self.reader.feed(data)
        return True

    def next_frame(self, timeout: float = 5.0, beats: bool = False) -> Optional[Frame]:
        """The next frame (BEATs skipped unless ``beats``), or None at end-of-file."""
        deadline = time.monotonic() + timeout
        while True:
            while self.pending:
                kind, body = self.pending.pop(0)
                if kind == link.BEAT and not beats:
                    continue
                if kind == link.OUTPUT:
                    rank, stream, data = link.decode_binary(body)
                    if data:
                        self.output[rank, stream] = self.output.get((rank, stream), b"") + data
                    else:
                        self.ended.add((rank, stream))
                return kind, body
            if self.eof:
                return None
            left = deadline - time.monotonic()
            assert left > 0, "no frame from the agent in time"
            self._pump(left)

    def expect(self, wanted: int, timeout: float = 10.0) -> Tuple[Dict[str, Any], List[Frame]]:
        """Frames up to one of kind ``wanted``: its JSON body and the frames before it."""
        seen: List[Frame] = []
        deadline = time.monotonic() + timeout
        while True:
            frame = self.next_frame(max(0.01, deadline - time.monotonic()))
            assert frame is not None, (f"link ended before {link.NAMES[wanted]}: "
                                       f"{self.stderr_now()}")
            if frame[0] == wanted:
                return link.decode_json(*frame), seen
            assert frame[0] not in (link.ERROR,), link.decode_json(*frame)
            seen.append(frame)

    def drain(self, seconds: float) -> List[Frame]:
        """Everything the agent says for ``seconds`` (it keeps the pipe from filling)."""
        deadline = time.monotonic() + seconds
        got: List[Frame] = []
        while time.monotonic() < deadline and not self.eof:
            self._pump(deadline - time.monotonic())
            got += self.pending
            self.pending = []
        return got

    # -- process ----------------------------------------------------------------
    def finish(self, timeout: float) -> Tuple[Optional[int], str]:
        """Wait (reading the link) until the agent exits: (status or None, stderr)."""
        deadline = time.monotonic() + timeout
        while not self.eof and time.monotonic() < deadline:
            self._pump(deadline - time.monotonic())
        try:
            code: Optional[int] = self.proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            code = None
            self.kill()
        return code, self.stderr_now()

    def stderr_now(self) -> str:
        if self.proc.poll() is None:
            return "(agent still running)"
        if not hasattr(self, "_err"):
            self._err = self.proc.stderr.read().decode("utf-8", "replace")
        return self._err

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def cleanup(self) -> None:
        self.kill()
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            try:
                f.close()
            except OSError:
                pass
        kill_tagged(self.tag)


def one_agent_line(err: str) -> str:
    """Assert the agent said exactly one line, its own, and no traceback."""
    assert "Traceback" not in err, err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("mslaunch agent on "), err
    return lines[0]


def no_tagged_processes(tag: str, timeout: float = 5.0) -> None:
    assert wait_for(lambda: tagged_pids(tag) == [], timeout), tagged_pids(tag)


def rank_entry(rank: int, size: int, argv: List[str], cwd: str, **env: str) -> Dict[str, Any]:
    return {"rank": rank, "app": 0, "local_rank": rank, "local_size": size, "node": 0,
            "argv": argv, "cwd": cwd, "stdin": "null", "inherit": "launcher",
            "path_prefix": None, "env": dict(env)}


def job_body(tag: str, cwd: str, argvs: List[List[str]], **over: Any) -> Dict[str, Any]:
    """A JOB frame as jobframe.job_frame builds it, for ``len(argvs)`` ranks on this host."""
    n = len(argvs)
    body = {"kvsname": f"kvs_link_{tag[:12]}", "grace": 1.0, "heartbeat": [1.0, 30],
            "credit": 1 << 22, "merge_stderr": False, "pmi": None, "size": n,
            "universe_size": n, "appnums": None, "process_mapping": "", "bind_to": "none",
            "launch_dir": cwd, "host": "linktest",
            "common_env": {"MSL_TEST_TAG": tag, "PATH": os.environ.get("PATH", "/usr/bin:/bin")},
            "ranks": [rank_entry(i, n, a, cwd, LINK_RANK=str(i)) for i, a in enumerate(argvs)]}
    body.update(over)
    return body


@pytest.fixture
def agents():
    """Start agents with ``agents.new()``; each is killed and its tag swept afterwards."""
    started: List[AgentProc] = []

    class Factory:
        @staticmethod
        def new() -> AgentProc:
            a = AgentProc(uuid.uuid4().hex)
            started.append(a)
            return a

    yield Factory
    for a in started:
        a.cleanup()


def _fresh_agent() -> AgentProc:
    """For hypothesis tests (no function-scoped fixtures there): clean up yourself."""
    return AgentProc(uuid.uuid4().hex)


# ---------------------------------------------------------------------------
# 3. fuzz of the real agent
# ---------------------------------------------------------------------------

@settings(max_examples=8, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(min_size=1, max_size=600).filter(stops_at_first_frame))
def test_agent_survives_random_bytes(data):
    agent = _fresh_agent()
    try:
        agent.send(data)
        if not header_is_invalid(data):
            # An incomplete frame: only the end of the link can end the wait.
            agent.close_link()
        code, err = agent.finish(5)
        assert code == 1, err
        line = one_agent_line(err)
        assert ("protocol error" in line) != (not header_is_invalid(data)), line
        no_tagged_processes(agent.tag)
    finally:
        agent.cleanup()


def _truncatable(tag: str, cwd: str) -> st.SearchStrategy:
    return st.one_of(
        st.just(link.encode(link.JOB, job_body(tag, cwd, [[PY, "-c", SLEEPER]]))),
        st.sampled_from([link.START, link.BYE, link.BEAT]).map(link.encode),
        st.integers(1, 31).map(lambda s: link.encode(link.SIGNAL, {"sig": s})),
        st.integers(0, 1 << 20).map(lambda n: link.encode(link.CREDIT, {"bytes": n})),
        st.binary(max_size=100).map(lambda d: link.encode_stdin(0, d)),
        st.tuples(st.sampled_from(JSON_KINDS), json_bodies).map(lambda kb: link.encode(*kb)))


@settings(max_examples=5, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), st.booleans())
def test_agent_gives_up_on_a_truncated_frame(tmp_path_factory, data, start_ranks):
    cwd = str(tmp_path_factory.getbasetemp())
    agent = _fresh_agent()
    try:
        agent.send(link.encode(link.JOB, job_body(agent.tag, cwd, [[PY, "-c", SLEEPER]],
                                                  heartbeat=[0.1, 3])))
        agent.expect(link.READY)
        if start_ranks:
            agent.send(link.encode(link.START))
            started, _ = agent.expect(link.STARTED)
            assert list(started["pids"]) == ["0"]
        frame = data.draw(_truncatable(agent.tag, cwd))
        cut = data.draw(st.integers(1, len(frame) - 1))
        agent.send(frame[:cut])
        # The launcher's half frame, then silence: a partitioned network, say.
        code, err = agent.finish(5)
        assert code == 1, err
        assert "no sign of life" in one_agent_line(err)
        no_tagged_processes(agent.tag)
    finally:
        agent.cleanup()


WRONG_ORDER = {
    "START before JOB": ([], [link.encode(link.START)], "START without a JOB"),
    "START twice": (["job", "start"], [link.encode(link.START)], "START without a JOB, or twice"),
    "a second JOB": (["job"], ["job"], "a second JOB frame"),
    "OUTPUT downwards": (["job", "start"], [link.encode_output(0, 1, b"hi")],
                         "OUTPUT frames go the other way"),
    "READY downwards": ([], [link.encode(link.READY, {"warnings": []})],
                        "unexpected READY frame"),
    "PMI without a PMI job": (["job", "start"], [link.encode(link.PMI, {"op": "answer",
                                                                       "ask": 1})],
                              "PMI frame without a PMI job"),
    "unknown PMI operation": (["pmijob", "start"], [link.encode(link.PMI, {"op": "nonsense"})],
                              "unknown PMI operation 'nonsense'"),
    "PMI fence_done with numbers": (["pmijob", "start"],
                                    [link.encode(link.PMI, {"op": "fence_done",
                                                            "pairs": {"k": 1}})],
                                    "PMI fence_done: pairs must be strings"),
}


@pytest.mark.parametrize("case", list(WRONG_ORDER))
def test_agent_refuses_frames_in_the_wrong_order(agents, tmp_path, case):
    before, bad, expected = WRONG_ORDER[case]
    agent = agents.new()
    job = job_body(agent.tag, str(tmp_path), [[PY, "-c", SLEEPER]] * 2)

    for step in before:
        if step in ("job", "pmijob"):
            agent.send(link.encode(link.JOB, dict(job, pmi="fd" if step == "pmijob" else None)))
            agent.expect(link.READY)
        else:
            agent.send(link.encode(link.START))
            started, _ = agent.expect(link.STARTED)
            pids = set(started["pids"].values())
            assert len(pids) == 2
            assert wait_for(lambda: pids <= set(tagged_pids(agent.tag)), 5)
    for step in bad:
        agent.send(link.encode(link.JOB, job) if step == "job" else step)
    code, err = agent.finish(5)
    assert code == 1, err
    line = one_agent_line(err)
    assert f"protocol error: {expected}" in line, line
    no_tagged_processes(agent.tag)


def _without(key: str):
    return lambda job: {k: v for k, v in job.items() if k != key}


def _set(key: str, value: Any):
    return lambda job: dict(job, **{key: value})


def _set_rank(key: str, value: Any):
    return lambda job: dict(job, ranks=[dict(job["ranks"][0], **{key: value})])


BAD_JOBS = [
    pytest.param(_without("ranks"), id="ranks missing"),
    pytest.param(_set("ranks", 5), id="ranks an int"),
    pytest.param(_set("ranks", "x"), id="ranks a string"),
    pytest.param(_set("ranks", [["rank", 0]]), id="a rank a list"),
    pytest.param(_set("heartbeat", 3), id="heartbeat an int"),
    pytest.param(_set("heartbeat", "fast"), id="heartbeat a string"),
    pytest.param(_set("heartbeat", ["nan", 3]), id="heartbeat NaN"),
    pytest.param(_set("credit", "lots"), id="credit a string"),
    pytest.param(_set("credit", 1e999), id="credit infinite"),
    pytest.param(_set("grace", [1]), id="grace a list"),
    pytest.param(_set("common_env", [1, 2]), id="common_env a list"),
    pytest.param(_set_rank("env", {"A": 1}), id="env value an int"),
    pytest.param(_set_rank("env", "A=1"), id="env a string"),
    pytest.param(_set_rank("rank", "zero"), id="rank a word"),
    pytest.param(_set_rank("node", 1e999), id="node infinite"),
    pytest.param(_set_rank("argv", 7), id="argv an int"),
    pytest.param(_set_rank("argv", []), id="argv empty"),
    pytest.param(_set("data", {"addresses": [5], "port": 9, "token": "t"}),
                 id="dial-back address a number"),
    pytest.param(_set("data", {"addresses": ["127.0.0.1"], "port": 9, "token": "t",
                               "cert": "not a certificate"}), id="dial-back cert garbage"),
    pytest.param(_without("kvsname"), id="kvsname missing"),
    pytest.param(lambda job: dict(_without("size")(job), pmi="fd"), id="pmi job without size"),
    pytest.param(_set("kvsname", "kvs\nk/etc"), id="kvsname with a newline"),
    pytest.param(_set("files", [{"name": "f", "mode": 420, "data": "***"}]),
                 id="preloaded file not base64"),
    pytest.param(_set("pmi", "tcp"), id="pmi kind unknown"),
    pytest.param(_set_rank("rank", 7), id="rank beyond size"),
]


@pytest.mark.parametrize("mutate", BAD_JOBS)
def test_agent_refuses_a_malformed_job(agents, tmp_path, mutate):
    agent = agents.new()
    job = mutate(job_body(agent.tag, str(tmp_path), [[PY, "-c", SLEEPER]]))
    agent.send(link.encode(link.JOB, job))
    # Refused at once, before anything starts: no READY, one line, no traceback.
    frame = agent.next_frame(5)
    assert frame is None or frame[0] != link.READY, "a malformed JOB was accepted"
    code, err = agent.finish(2.0)
    assert code == 1, err
    assert "protocol error" in one_agent_line(err)
    no_tagged_processes(agent.tag)


def test_agent_refuses_a_signal_with_malformed_ranks(agents, tmp_path):
    agent = agents.new()
    agent.send(link.encode(link.JOB, job_body(agent.tag, str(tmp_path), [[PY, "-c", SLEEPER]])))
    agent.expect(link.READY)
    agent.send(link.encode(link.START))
    agent.expect(link.STARTED)
    agent.send(link.encode(link.SIGNAL, {"sig": 15, "ranks": [[0]]}))
    code, err = agent.finish(5)
    assert code == 1, err
    assert "protocol error" in one_agent_line(err)
    no_tagged_processes(agent.tag)


def test_frames_right_behind_the_bootstrap_are_not_lost(tmp_path):
    tag = uuid.uuid4().hex
    job = job_body(tag, str(tmp_path), [[PY, "-c", SLEEPER]])
    proc = subprocess.Popen(["sh", "-c", bootstrap.remote_command([PY])], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=clean_env(MSL_TEST_TAG=tag))
    try:
        proc.stdin.write(PAYLOAD + link.encode(link.JOB, job))
        proc.stdin.flush()
        reader = link.Reader(expect_sync=True)
        kinds: List[int] = []
        deadline = time.monotonic() + 3
        while link.READY not in kinds and time.monotonic() < deadline:
            if select.select([proc.stdout], [], [], 0.1)[0]:
                data = os.read(proc.stdout.fileno(), 1 << 16)
                if not data:
                    break
                kinds += [k for k, _ in reader.feed(data)]
        assert kinds[:1] == [link.HELLO]
        assert link.READY in kinds, "the JOB sent with the bootstrap was never answered"
    finally:
        proc.kill()
        proc.wait()
        for f in (proc.stdin, proc.stdout, proc.stderr):
            f.close()
        kill_tagged(tag)


# ---------------------------------------------------------------------------
# 4. a whole conversation with the agent, without SSH
# ---------------------------------------------------------------------------

TALKER = """
import os, sys
rank = os.environ["LINK_RANK"].encode()
sys.stdout.buffer.write(b"rank " + rank + b": " + os.fsencode(sys.argv[1]) + b"|"
                        + os.environb[b"LINK_BYTES"] + b"\\n")
sys.stdout.buffer.flush()
sys.stderr.buffer.write(b"err " + rank + b"\\n")
sys.exit(3 * int(rank))
"""

ODD_BYTES = b"caf\xc3\xa9 \xff\xfe\x01 $HOME 'q' \"d\" \\"


def test_a_whole_job_through_the_agent(agents, tmp_path):
    agent = agents.new()
    assert agent.hello["protocol"] == link.PROTOCOL
    assert agent.hello["pid"] == agent.proc.pid
    job = job_body(agent.tag, str(tmp_path),
                   [[PY, "-c", TALKER, os.fsdecode(ODD_BYTES + b"%d" % i)] for i in range(2)])
    job["common_env"]["LINK_BYTES"] = os.fsdecode(ODD_BYTES)
    agent.send(link.encode(link.JOB, job))
    ready, _ = agent.expect(link.READY)
    assert ready["warnings"] == []
    assert not ready.get("direct")          # no dial-back offered: output stays on the link
    agent.send(link.encode(link.START))
    started, _ = agent.expect(link.STARTED)
    assert sorted(started["pids"]) == ["0", "1"]
    _, frames_seen = agent.expect(link.DONE)
    exits = {}
    for kind, body in frames_seen:
        assert kind in (link.OUTPUT, link.EXITED), (kind, body)
        if kind == link.EXITED:
            msg = link.decode_json(kind, body)
            assert msg["rank"] not in exits
            exits[msg["rank"]] = (msg["code"], msg["signal"])
    assert exits == {0: (0, None), 1: (3, None)}
    for i in range(2):
        assert agent.output[i, 1] == b"rank %d: %s%d|%s\n" % (i, ODD_BYTES, i, ODD_BYTES)
        assert agent.output[i, 2] == b"err %d\n" % i
    assert agent.ended == {(0, 1), (0, 2), (1, 1), (1, 2)}
    agent.send(link.encode(link.BYE))
    code, err = agent.finish(5)
    assert (code, err) == (0, "")
    no_tagged_processes(agent.tag)


#: More than the agent reads at once plus what a rank's pipe holds (1 MiB each at most).
FLOOD_SIZE = 4 << 20
FLOOD = """
import sys
sys.stdout.buffer.write(b"x" * %d)
sys.stdout.buffer.flush()
open(sys.argv[1], "w").close()
sys.stdout.buffer.write(b"\\nFINAL\\n")
""" % FLOOD_SIZE


def test_output_waits_for_credit(agents, tmp_path):
    agent = agents.new()
    marker = tmp_path / "wrote-everything"
    agent.send(link.encode(link.JOB, job_body(agent.tag, str(tmp_path),
                                              [[PY, "-c", FLOOD, str(marker)]], credit=1000)))
    agent.expect(link.READY)
    agent.send(link.encode(link.START))
    agent.expect(link.STARTED)
    # Without credit, the agent stops reading: the rank blocks in write().
    rest = agent.drain(1.5)
    assert all(k in (link.OUTPUT, link.BEAT) for k, _ in rest), rest
    agent.pending = [f for f in rest if f[0] != link.BEAT]
    while agent.pending:
        agent.next_frame(0.1)
    held = len(agent.output.get((0, 1), b""))
    assert 0 < held <= 1000 + CHUNK
    assert not marker.exists()
    assert b"FINAL" not in agent.output.get((0, 1), b"")
    assert tagged_pids(agent.tag)
    # Credit granted: the rest flows, the rank finishes.
    agent.send(link.encode(link.CREDIT, {"bytes": 1 << 30}))
    exited, _ = agent.expect(link.EXITED)
    assert (exited["code"], exited["signal"]) == (0, None)
    agent.expect(link.DONE)
    assert marker.exists()
    assert agent.output[0, 1] == b"x" * FLOOD_SIZE + b"\nFINAL\n"
    agent.send(link.encode(link.BYE))
    assert agent.finish(5) == (0, "")
    no_tagged_processes(agent.tag)


def test_signal_frame_ends_a_sleeping_rank(agents, tmp_path):
    agent = agents.new()
    agent.send(link.encode(link.JOB, job_body(agent.tag, str(tmp_path),
                                              [[PY, "-c", SLEEPER]] * 2)))
    agent.expect(link.READY)
    agent.send(link.encode(link.START))
    agent.expect(link.STARTED)
    agent.send(link.encode(link.SIGNAL, {"sig": int(signal.SIGTERM), "ranks": [1]}))
    exited, _ = agent.expect(link.EXITED)
    assert exited == {"rank": 1, "code": None, "signal": int(signal.SIGTERM)}
    agent.send(link.encode(link.SIGNAL, {"sig": int(signal.SIGTERM)}))
    exited, _ = agent.expect(link.EXITED)
    assert exited == {"rank": 0, "code": None, "signal": int(signal.SIGTERM)}
    agent.expect(link.DONE)
    agent.send(link.encode(link.BYE))
    assert agent.finish(5) == (0, "")
    no_tagged_processes(agent.tag)


def _started_sleepers(agent: AgentProc, cwd: str, **over: Any) -> None:
    agent.send(link.encode(link.JOB, job_body(agent.tag, cwd, [[PY, "-c", SLEEPER]] * 2,
                                              **over)))
    agent.expect(link.READY)
    agent.send(link.encode(link.START))
    started, _ = agent.expect(link.STARTED)
    assert len(started["pids"]) == 2
    assert wait_for(lambda: all(p in tagged_pids(agent.tag) for p in started["pids"].values()),
                    5)


def test_end_of_link_stops_the_ranks(agents, tmp_path):
    agent = agents.new()
    _started_sleepers(agent, str(tmp_path))
    agent.close_link()
    code, err = agent.finish(5)
    assert code == 1, err
    assert one_agent_line(err).endswith("lost the launcher: the link reached end-of-file")
    no_tagged_processes(agent.tag)


def test_heartbeat_silence_stops_the_ranks(agents, tmp_path):
    agent = agents.new()
    t0 = time.monotonic()
    _started_sleepers(agent, str(tmp_path), heartbeat=[0.2, 3])
    beats = agent.drain(2.0)             # the launcher says nothing for 2 s
    assert any(k == link.BEAT for k, _ in beats)   # the agent's own beats kept coming
    code, err = agent.finish(3)
    assert code == 1, err
    assert "no sign of life" in one_agent_line(err)
    assert time.monotonic() - t0 < 4
    no_tagged_processes(agent.tag)


# ---------------------------------------------------------------------------
# 5. the launcher facing a lying agent, over a real SSH host
# ---------------------------------------------------------------------------

#: Run on the host as its "remote Python": ignores its arguments, says what it is
#: told to say (part after part), then, if it lingers, reads its stdin until the
#: launcher closes the link.  ``alarm`` keeps a broken test from leaving it behind.
FAKE_AGENT = """#!{python}
import json, os, signal, socket, ssl, struct, sys, time
signal.alarm(30)
with open({pidfile!r}, "w") as f:
    f.write(str(os.getpid()))
out = sys.stdout.buffer
inp = sys.stdin.buffer
booted = False


def frame():
    length, kind = struct.unpack(">IB", inp.read(5))
    return kind, inp.read(length - 1)


def boot():
    global booted
    if not booted:
        booted = True
        for _ in range(2):
            inp.read(int(inp.readline()))


for i, path in enumerate({parts!r}):
    if i and {wait_start!r}:
        boot()
        while frame()[0] != {start_kind!r}:
            pass
    elif i:
        boot()          # the launcher has sent everything: it reads what follows
        time.sleep({pause!r})
    with open(path, "rb") as f:
        out.write(f.read())
    out.flush()
    if i == 0 and {dial!r}:
        # Read the bootstrap and the JOB frame, and dial back as an agent does.
        boot()
        data = json.loads(frame()[1])["data"]
        conn = socket.create_connection((data["addresses"][0], data["port"]), timeout=5)
        if data.get("cert"):
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            context.check_hostname = False
            context.load_verify_locations(cadata=data["cert"])
            conn = context.wrap_socket(conn)
        conn.sendall(b"mslaunch-dial " + data["token"].encode() + b"\\n")
        with open({dial!r}, "rb") as f:
            conn.sendall(f.read())
if {linger!r}:
    while inp.read1(1 << 16):
        pass
else:
    time.sleep(0.3)
"""

HELLO = link.SYNC + link.encode(link.HELLO, {"protocol": link.PROTOCOL, "host": "fake",
                                             "pid": 1, "python": "3"})
READY = link.encode(link.READY, {"warnings": []})
GRACE = 0
#: The launcher holds a lost host's link open for grace + 2 s, waiting for its agent.
LAUNCH_LIMIT = 15.0


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def _fake_agent(directory, parts: Sequence[bytes], *, pause: float = 0.3,
                linger: bool = True, dial: Optional[bytes] = None,
                wait_start: bool = False) -> Tuple[str, str]:
    """Write a fake agent script into ``directory``: (its path, its pid file).

    With ``dial``, it also opens the output connection the JOB offers and sends
    ``dial`` on it, after the first part.  With ``wait_start``, every part after
    the first waits for the launcher's START rather than for ``pause``."""
    os.makedirs(directory, exist_ok=True)
    dial_path = None
    if dial is not None:
        dial_path = os.path.join(directory, "dial")
        with open(dial_path, "wb") as f:
            f.write(dial)
    paths = []
    for i, part in enumerate(parts):
        path = os.path.join(directory, f"part{i}")
        with open(path, "wb") as f:
            f.write(part)
        paths.append(path)
    script = os.path.join(directory, "fake-python")
    pidfile = os.path.join(directory, "pid")
    with open(script, "w") as f:
        f.write(FAKE_AGENT.format(python=PY, pidfile=pidfile, parts=paths, pause=pause,
                                  linger=linger, dial=dial_path, wait_start=wait_start,
                                  start_kind=link.START))
    os.chmod(script, 0o755)
    return script, pidfile


def _launch(home: str, fake: str, host: str = "h1", timeout: float = LAUNCH_LIMIT,
            **env_vars: str) -> Tuple[Optional[int], str, float]:
    """mslaunch with the fake as remote Python: (status or None if it hung, stderr, seconds)."""
    env = clean_env(HOME=home, MSLAUNCH_HEARTBEAT="0.2,3", **env_vars)
    t0 = time.monotonic()
    p = subprocess.Popen(cmd("--grace", str(GRACE), "-H", host, "-n", "1",
                             "--remote-python", fake, "true"),
                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=env)
    try:
        _, err = p.communicate(timeout=timeout)
        code: Optional[int] = p.returncode
    except subprocess.TimeoutExpired:
        p.kill()
        _, err = p.communicate()
        code = None
    return code, err.decode("utf-8", "replace"), time.monotonic() - t0


def _host_extras(sshbed, host: str) -> set:
    return {p for p in sshbed.host_pids(host) if not sshbed._is_sshd(p) and _alive(p)}


def _check_launcher_error(code: Optional[int], err: str, pattern: str, host: str = "h1",
                          statuses=(1, 255)) -> None:
    assert code is not None, f"mslaunch did not end: {err}"
    assert "Traceback" not in err, err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert code in statuses, (code, err)
    assert lines[0].startswith("mslaunch: error: ") and host in lines[0], err
    assert re.search(pattern, lines[0]), (pattern, err)


def _fake_gone(pidfile: str) -> None:
    try:
        with open(pidfile) as f:
            pid = int(f.read())
    except (OSError, ValueError):
        raise AssertionError("the fake agent never ran") from None
    assert wait_for(lambda: not _alive(pid), 5), f"the fake agent {pid} is still running"


def _run_cases(sshbed, tmp_path, cases: Dict[str, tuple], check=None) -> None:
    """Run mslaunch against each fake agent in ``cases`` at once: ``name: (parts,
    pattern[, options of _fake_agent, and ``env`` for mslaunch])``; each must fail with
    one line matching ``pattern``."""
    home = sshbed.make_home(tmp_path / "home")
    before = _host_extras(sshbed, "h1")
    options = {name: dict(case[2]) if len(case) > 2 else {} for name, case in cases.items()}
    envs = {name: options[name].pop("env", {}) for name in cases}
    fakes = {name: _fake_agent(tmp_path / f"case{i}", case[0], **options[name])
             for i, (name, case) in enumerate(cases.items())}
    with ThreadPoolExecutor(max_workers=12) as pool:
        results = dict(zip(cases, pool.map(lambda name: _launch(home, fakes[name][0],
                                                                **envs[name]), cases)))
    problems = []
    for name, (code, err, seconds) in results.items():
        try:
            (check or _check_launcher_error)(code, err, cases[name][1])
            assert seconds < LAUNCH_LIMIT, seconds
            _fake_gone(fakes[name][1])
        except AssertionError as e:
            problems.append(f"{name}: {e}")
    assert not problems, "\n".join(problems)
    assert wait_for(lambda: _host_extras(sshbed, "h1") <= before, 5), \
        _host_extras(sshbed, "h1") - before


LOST = r"lost host h1 before the job started: "
BAD = LOST + r"protocol error: "
MALFORMED = {
    "junk after HELLO": ([HELLO, b"\xff" * 16], BAD + r"frame length \d+ out of range"),
    "junk with HELLO": ([HELLO + b"\x7f" * 16], r"frame length \d+ out of range"),
    "length above MAX_FRAME": ([HELLO, link.HEAD.pack(link.MAX_FRAME + 1, link.READY)],
                               BAD + r"frame length 67108865 out of range"),
    "READY not JSON": ([HELLO, link.HEAD.pack(6, link.READY) + b"{nope"],
                       BAD + r"READY frame is not valid JSON"),
    "JOB upwards": ([HELLO, link.encode(link.JOB, {})], BAD + r"unexpected JOB frame"),
    "OUTPUT before START": ([HELLO, link.encode_output(0, 1, b"hi")],
                            BAD + r"OUTPUT before START"),
    "EXITED before START": ([HELLO, READY + link.encode(link.EXITED, {"rank": 0, "code": 3})],
                            BAD + r"EXITED before START"),
    "STARTED before START": ([HELLO, link.encode(link.STARTED, {"pids": {"0": 1}})],
                             BAD + r"STARTED before START"),
    "READY twice": ([HELLO, READY + READY], BAD + r"READY before JOB, or twice"),
    "READY warnings a number": ([HELLO, link.encode(link.READY, {"warnings": 1})],
                                BAD + r"READY: warnings are not a list of strings"),
    "PMI unknown operation": ([HELLO, link.encode(link.PMI, {"op": "nonsense", "ask": 1})],
                              BAD + r"unknown PMI operation 'nonsense'"),
    "PMI abort of a foreign rank": ([HELLO, link.encode(link.PMI, {"op": "abort", "rank": 3,
                                                                   "code": 1})],
                                    BAD + r"PMI abort for rank 3, not on this host"),
    "silence after HELLO": ([HELLO], LOST + r"no sign of life"),
    "another protocol": ([link.SYNC + link.encode(link.HELLO, {"protocol": 2})],
                         r"agent start: the agent speaks another protocol \(2, expected 1\)"),
    "no start mark": ([b"Welcome to h1!\n" * 5000], r"agent start: no agent answered"),
    "end of link after HELLO": ([HELLO], LOST + r"the link reached end-of-file",
                                {"linger": False}),
}


OUTPUT_BAD = LOST + r"its output connection: protocol error: "
#: The agent's own connection for output (dialled back, plain or TLS) carries
#: OUTPUT and LINES only.
MALFORMED_OUTPUT = {
    f"output connection{way}: {what}": ([HELLO], OUTPUT_BAD + pattern,
                                        {"dial": sent, "env": {"MSLAUNCH_OUTPUT_TLS": tls}})
    for way, tls in (("", "0"), (" in TLS", "1"))
    for what, pattern, sent in (("junk", r"frame length \d+ out of range", b"\xee" * 64),
                                ("READY", r"READY frame on the output connection", READY))
}


def test_launcher_refuses_a_lying_agent(sshbed, tmp_path):
    _run_cases(sshbed, tmp_path, {**MALFORMED, **MALFORMED_OUTPUT})


#: Lies told once the job runs: the fake answers READY, waits for START,
#: then lies.
RUNNING = r"lost host h1: protocol error: "
WAIT = {"wait_start": True}
MALFORMED_RUNNING = {
    "OUTPUT of a foreign rank": ([HELLO + READY, link.encode_output(5, 1, b"hi")],
                                 RUNNING + r"rank 5 does not run on this host", WAIT),
    "OUTPUT on stream 3": ([HELLO + READY, link.encode_output(0, 3, b"x")],
                           RUNNING + r"output of rank 0 on stream 3", WAIT),
    "EXITED rank a string": ([HELLO + READY, link.encode(link.EXITED, {"rank": "0"})],
                             RUNNING + r"EXITED: field 'rank' missing or not int", WAIT),
    "STARTED bad rank": ([HELLO + READY, link.encode(link.STARTED, {"pids": {"x": 1}})],
                         RUNNING + r"STARTED: bad rank or pid", WAIT),
    "STARTED superscript rank": ([HELLO + READY,
                                  link.encode(link.STARTED, {"pids": {"\u00b2": 5}})],
                                 RUNNING + r"STARTED: bad rank or pid", WAIT),
    "STARTED pid zero": ([HELLO + READY, link.encode(link.STARTED, {"pids": {"0": 0}})],
                         RUNNING + r"STARTED: bad rank or pid", WAIT),
    "SIGNAL upwards": ([HELLO + READY, link.encode(link.SIGNAL, {"sig": 9})],
                       RUNNING + r"unexpected SIGNAL frame", WAIT),
}


def _check_running_error(code: Optional[int], err: str, pattern: str) -> None:
    """A lie after START: the host is lost (status 255), said in lines of mslaunch's own."""
    assert code is not None, f"mslaunch did not end: {err}"
    assert "Traceback" not in err, err
    assert code == 255, (code, err)
    lines = err.splitlines()
    assert lines and all(line.startswith("mslaunch: ") for line in lines), err
    assert any(re.search(pattern, line) for line in lines), (pattern, err)


def test_launcher_refuses_a_lying_agent_while_the_job_runs(sshbed, tmp_path):
    _run_cases(sshbed, tmp_path, MALFORMED_RUNNING, check=_check_running_error)


def test_launcher_reports_a_host_lost_while_its_rank_runs(sshbed, tmp_path):
    # The fake answers READY, waits for START, then its link ends: the job has begun.
    code, err, _ = _one_case(sshbed, tmp_path, [HELLO + READY, b""])
    assert code == 255, err
    assert "Traceback" not in err
    lines = err.splitlines()
    assert lines and all(line.startswith("mslaunch: ") for line in lines), err
    assert "lost host h1: the link reached end-of-file" in lines[0], err


garbage = st.one_of(
    st.binary(min_size=5, max_size=300).filter(header_is_invalid),
    st.tuples(st.sampled_from([k for k in JSON_KINDS if k != link.BEAT]),
              st.binary(min_size=1, max_size=200)).filter(
        lambda kb: not kb[1].lstrip().startswith(b"{")).map(
        lambda kb: link.HEAD.pack(len(kb[1]) + 1, kb[0]) + kb[1]))


@settings(max_examples=1, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.lists(garbage, min_size=4, max_size=4))
def test_launcher_fuzz_garbage_after_hello(sshbed, tmp_path_factory, payloads):
    tmp = tmp_path_factory.mktemp("garbage")
    _run_cases(sshbed, tmp, {f"garbage {i} {p[:24]!r}": ([HELLO, p], r"protocol error|frame")
                             for i, p in enumerate(payloads)})


def _one_case(sshbed, tmp_path, parts: Sequence[bytes], *, linger: bool = False,
              timeout: float = LAUNCH_LIMIT,
              wait_start: bool = True) -> Tuple[Optional[int], str, float]:
    home = sshbed.make_home(tmp_path / "home")
    fake, pidfile = _fake_agent(tmp_path / "fake", parts, linger=linger,
                                wait_start=wait_start)
    result = _launch(home, fake, timeout=timeout)
    _fake_gone(pidfile)
    return result


def test_launcher_ends_when_a_host_is_lost_after_its_rank_exited(sshbed, tmp_path):
    # The fake: READY, then after START: STARTED and EXITED, then gone (no end of
    # the rank's streams, with or without DONE): the end of its output is lost.
    for i, done in enumerate((b"", link.encode(link.DONE))):
        code, err, _ = _one_case(sshbed, tmp_path / f"case{i}", [
            HELLO + READY,
            link.encode(link.STARTED, {"pids": {"0": 4242}})
            + link.encode(link.EXITED, {"rank": 0, "code": 0, "signal": None}) + done],
            timeout=8)
        assert code is not None, f"mslaunch hung after losing h1: {err}"
        assert code == 255, err
        assert "h1" in err and "Traceback" not in err
        assert "lost the end of its output" in err, err


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="0123456789abcdef", max_size=48), st.binary(max_size=40),
       st.binary(max_size=260))
def test_the_dial_token_line_is_read_whole_or_not_at_all(token, rest, junk):
    from mslaunch.remote.dialback import read_token
    line = b"mslaunch-dial " + token.encode() + b"\n"
    for cut in range(len(line)):
        assert read_token(line[:cut]) is None
    assert read_token(line + rest) == (token, rest)
    try:
        got = read_token(junk)
    except ValueError:
        assert b"\n" not in junk and len(junk) > 200
    else:
        assert got is None or junk.startswith(b"mslaunch-dial ") or got[0] == ""


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(JSON_KINDS), st.integers(0, 3), st.binary(max_size=4))
def test_an_agent_greeting_is_hello_of_this_protocol_and_keeps_what_follows(kind, protocol,
                                                                            tail):
    # ``tail``: the start of a frame header, not yet a frame
    first = link.encode(kind, {"protocol": protocol})
    after = link.encode(link.BEAT)
    reader = link.Reader(expect_sync=True)
    frames = reader.feed(link.SYNC + first + after + tail)
    if kind == link.HELLO and protocol == link.PROTOCOL:
        greeting, rest = link.hello(frames, reader)
        assert greeting["protocol"] == protocol and rest == after + tail
    else:
        with pytest.raises(link.LinkError, match="another protocol"):
            link.hello(frames, reader)


# ---------------------------------------------------------------------------
# the bundle: sources for another Python, the launcher's cache
# ---------------------------------------------------------------------------

def _hello_from(payload: bytes, tag: str) -> Dict[str, Any]:
    """Start the remote command on ``payload``; its HELLO, then close its link."""
    proc = subprocess.Popen(["sh", "-c", bootstrap.remote_command([PY])], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=clean_env(MSL_TEST_TAG=tag))
    try:
        proc.stdin.write(payload)
        proc.stdin.flush()
        reader = link.Reader(expect_sync=True)
        got: List[Tuple[int, bytes]] = []
        deadline = time.monotonic() + 15
        while not got and time.monotonic() < deadline:
            if select.select([proc.stdout], [], [], 0.1)[0]:
                data = os.read(proc.stdout.fileno(), 1 << 16)
                if not data:
                    break
                got = reader.feed(data)
        assert got and got[0][0] == link.HELLO, proc.stderr.read1(4096) if not got else got
        proc.stdin.close()          # the link ends: the agent exits (1: launcher lost)
        proc.wait(10)
        err = proc.stderr.read().decode(errors="replace")
        assert "Traceback" not in err and "lost the launcher" in err, err
        return link.decode_json(*got[0])
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for f in (proc.stdin, proc.stdout, proc.stderr):
            f.close()
        kill_tagged(tag)


def test_a_python_of_another_version_compiles_the_sources():
    # The bundle's code is for a bytecode version no interpreter has: the
    # agent must import every module it needs from the sources instead.
    bundle = bootstrap.build_bundle(bootstrap._package_files(), b"\0\0\r\n")
    source = bootstrap.BOOTSTRAP.encode()
    payload = b"%d\n%s%d\n%s" % (len(source), source, len(bundle), bundle)
    hello = _hello_from(payload, uuid.uuid4().hex)
    assert hello["protocol"] == link.PROTOCOL


def test_the_bundle_is_kept_in_the_cache_and_rebuilt_when_the_package_changes(tmp_path):
    probe = ("import sys; from mslaunch.remote import bootstrap as b; "
             "sys.stdout.buffer.write(b.package_bundle())")
    env = clean_env(XDG_CACHE_HOME=str(tmp_path / "cache"))
    first = subprocess.run([PY, "-c", probe], env=env, capture_output=True, check=True,
                           cwd=tmp_path).stdout
    files = list((tmp_path / "cache" / "mslaunch").glob("agent-*.bundle"))
    assert len(files) == 1 and files[0].read_bytes() == first
    # Read back from the cache: the same bytes, even if the file was altered
    # meanwhile (proof that it was read, not rebuilt).
    files[0].write_bytes(first + b"x")
    again = subprocess.run([PY, "-c", probe], env=env, capture_output=True, check=True,
                           cwd=tmp_path).stdout
    assert again == first + b"x"
    # A package whose files differ (here: a copy with one module touched)
    # gets a bundle of its own.
    import shutil
    copy = tmp_path / "pkg"
    shutil.copytree(os.path.dirname(os.path.dirname(bootstrap.__file__)), copy / "mslaunch",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "mslaunch" / "spec.py").write_text((copy / "mslaunch" / "spec.py").read_text()
                                               + "\n# changed\n")
    env2 = dict(env, PYTHONPATH=str(copy))
    third = subprocess.run([PY, "-c", probe + "; assert b.__file__.startswith(sys.argv[1])",
                            str(copy)], env=env2, capture_output=True, check=True,
                           cwd=tmp_path).stdout
    assert len(list((tmp_path / "cache" / "mslaunch").glob("agent-*.bundle"))) == 2
    assert third != first


def test_bundles_of_other_versions_go_after_a_day(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    old, recent, other = cache / "agent-old.bundle", cache / "agent-new.bundle", cache / "other"
    for path in (old, recent, other):
        path.write_bytes(b"x")
    two_days = time.time() - 2 * 86400
    os.utime(old, (two_days, two_days))
    os.utime(other, (two_days, two_days))
    bootstrap._save(str(cache / "agent-this.bundle"), b"bundle")
    assert sorted(p.name for p in cache.iterdir()) == ["agent-new.bundle", "agent-this.bundle",
                                                       "other"]
    assert (cache / "agent-this.bundle").read_bytes() == b"bundle"


def test_a_background_preparation_is_waited_for_at_exit(tmp_path):
    """An early exit (a bad host name, say) while the bundle or the credentials
    are still being made waits for that thread instead of stopping it midway."""
    done = tmp_path / "done"
    code = ("import threading, time, pathlib\n"
            "from mslaunch.remote.bootstrap import finish_before_exit\n"
            "def work():\n"
            "    time.sleep(0.5)\n"
            f"    pathlib.Path({str(done)!r}).write_text('yes')\n"
            "finish_before_exit(threading.Thread(target=work, daemon=True))\n"
            "raise SystemExit(3)\n")
    r = subprocess.run([PY, "-c", code], capture_output=True, timeout=30)
    assert r.returncode == 3, r.stderr
    assert done.read_text() == "yes"


def test_the_dial_listener_keeps_a_place_for_an_agent_slow_to_speak():
    # An agent's connection is accepted, then a flood of strangers arrives
    # before its token does (a busy host): the strangers wait in the kernel's
    # queue instead of pushing the agent out.
    import socket as socket_mod

    from mslaunch.remote import dialback
    from mslaunch.machine.loop import Loop
    loop = Loop()
    lines: List[str] = []
    listener = dialback.Listener(loop, ["127.0.0.1"], tls=False, log=lines.append)
    got: List[bytes] = []
    token = dialback.new_token()
    listener.expect(token, lambda sock, first: got.append(first))
    port = listener.port_of("127.0.0.1")
    assert port is not None
    agent = socket_mod.create_connection(("127.0.0.1", port), timeout=2)
    strangers = []
    try:
        deadline = time.monotonic() + 1
        while not listener.pending and time.monotonic() < deadline:
            loop.run_once(0.01)
        assert len(listener.pending) == 1
        for _ in range(dialback.MAX_PENDING + 40):
            strangers.append(socket_mod.create_connection(("127.0.0.1", port), timeout=2))
            loop.run_once(0)
        assert len(listener.pending) == dialback.MAX_PENDING
        assert not lines, lines
        agent.sendall(b"mslaunch-dial " + token.encode() + b"\nfirst")
        deadline = time.monotonic() + 2
        while not got and time.monotonic() < deadline:
            loop.run_once(0.01)
        assert got == [b"first"]
        # The strangers that had their time make room for the queued ones.
        deadline = time.monotonic() + 3
        while not lines and time.monotonic() < deadline:
            loop.run_once(0.05)
        assert lines and "pushed out by newer connections" in lines[0]
        assert len(listener.pending) <= dialback.MAX_PENDING
    finally:
        for s in strangers + [agent]:
            s.close()
        listener.close()
        loop.close()


# ---------------------------------------------------------------------------
# LINES frames, and the plain output connection that splices them
# ---------------------------------------------------------------------------

@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(0, 255), st.binary(max_size=300),
       st.integers(0, 310))
def test_lines_frames_decode_to_what_was_sent_or_are_refused(rank, stream, data, whole):
    frame = link.lines_head(rank, stream, len(data), whole) + data
    (kind, body), = link.Reader().feed(frame)
    assert kind == link.LINES
    honest = whole <= len(data) and (whole == 0 or data[whole - 1:whole] == b"\n")
    if honest:
        assert link.decode_lines(body) == (rank, stream, whole, data)
    else:
        with pytest.raises(link.LinkError):
            link.decode_lines(body)


class _Host:
    """What a splicing endpoint asks of its RemoteHost: the sink of a rank's
    stream, and to be told of bytes passed on."""

    def __init__(self, sinks) -> None:
        self.sinks = sinks
        self.taken = 0

    def output_sink(self, rank: int, stream: int):
        if (rank, stream) not in self.sinks:
            raise link.LinkError(f"output of rank {rank} on stream {stream}")
        return self.sinks[rank, stream]

    def output_taken(self, sink, count: int) -> None:
        self.taken += count


def _lines_frames(rank: int, text: bytes, cuts: Sequence[int]) -> bytes:
    """``text`` as the agent sends it: LINES frames cut at ``cuts``, then end-of-stream."""
    out, at = [], 0
    for cut in list(cuts) + [len(text)]:
        cut = max(at, min(cut, len(text)))
        piece = text[at:cut]
        if piece:
            out.append(link.lines_head(rank, 1, len(piece), piece.rfind(b"\n") + 1) + piece)
        at = cut
    return b"".join(out) + link.encode_output(rank, 1, b"")


def _splice_run(texts, cuts, *, to_pipe: bool, slow: bool, tmp_path=None, close_after=None,
                local: int = 0):
    """Send each of ``texts`` as one agent would, over a socket of its own, to
    splicing endpoints that share one terminal (a pipe read by a thread, or a
    file), while ``local`` lines ``L:n`` are written to it the ordinary way
    (as a local rank's); returns what the terminal's file got, and each sink."""
    import socket
    import threading

    from mslaunch.remote.splice import SplicingEndpoint
    from mslaunch.machine.loop import Loop
    from mslaunch.machine.output import RankOutput, Terminal
    loop = Loop()
    got = bytearray()
    if to_pipe:
        r, w = os.pipe()

        def read() -> None:
            while True:
                if slow:
                    time.sleep(0.001)
                chunk = os.read(r, 1 << 16)
                if not chunk:
                    break
                got.extend(chunk)
                if close_after is not None and len(got) >= close_after:
                    break
            os.close(r)
        reader = threading.Thread(target=read)
        reader.start()
    else:
        path = tmp_path / "terminal"
        w = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    term = Terminal(w, "stdout")
    term.loop = loop
    sinks = {(i, 1): RankOutput(terminal=term, file_fd=None, prefix=None, keep_tail=False)
             for i in range(len(texts))}
    host = _Host(sinks)
    closed: List[str] = []
    ends, senders = [], []
    try:
        for i, text in enumerate(texts):
            a, b = socket.socketpair()

            def on_frame(kind, body, i=i):
                if kind == link.OUTPUT:
                    rank, stream, data = link.decode_binary(body)
                    sink = host.output_sink(rank, stream)
                    if data:
                        sink.feed(data)
                    else:
                        sink.finish()
                else:
                    raise link.LinkError("unexpected")
            ends.append(SplicingEndpoint(loop, b, on_frame=on_frame, on_closed=closed.append,
                                         host=host))
            data = _lines_frames(i, text, cuts)

            def send(a=a, data=data) -> None:
                # in pieces, now and then: a splice then waits for the socket
                # in the middle of a frame, with room in the pipe for others
                for at in range(0, len(data), 7919):
                    a.sendall(data[at:at + 7919])
                    if at % 5 == 0:
                        time.sleep(0.0002)
                a.close()
            t = threading.Thread(target=send)
            t.start()
            senders.append(t)
        written = [0]

        def write_local() -> None:
            term.write(written, b"L:%06d\n" % written[0])
            written[0] += 1
            if written[0] < local:
                loop.call_later(0.0002, write_local)
        if local:
            write_local()
        deadline = time.monotonic() + 60
        loop.run_until(lambda: (len(closed) == len(texts) and written[0] >= local)
                       or time.monotonic() > deadline)
        for t in senders:
            t.join()
        term.wait_until_drained(time.monotonic() + 30)
    finally:
        for e in ends:
            e.close()
        if term.fd != w:
            os.close(term.fd)
        os.close(w)
        if to_pipe:
            reader.join()
        loop.close()
    if not to_pipe:
        got = bytearray((tmp_path / "terminal").read_bytes())
    return bytes(got), sinks, closed


TEXT_LINES = st.lists(st.binary(max_size=120).map(lambda b: b.replace(b"\n", b".")),
                      min_size=1, max_size=400)


def _check_unmixed(texts, cuts, slow: bool) -> None:
    got, sinks, closed = _splice_run(texts, sorted(cuts), to_pipe=True, slow=slow, local=300)
    assert closed == ["the link reached end-of-file"] * len(texts)
    per_source = {i: [] for i in range(len(texts))}
    local = []
    for line in got.split(b"\n")[:-1]:
        source, _, _ = line.partition(b":")
        if source == b"L":
            local.append(line)
        else:
            per_source[int(source)].append(line + b"\n")
    assert {i: b"".join(v) for i, v in per_source.items()} == dict(enumerate(texts))
    assert local == [b"L:%06d" % i for i in range(300)]
    assert all(s.written == len(texts[i]) and s.finished for (i, _), s in sinks.items())


@settings(max_examples=30, deadline=None)
@given(st.lists(TEXT_LINES, min_size=1, max_size=3), st.lists(st.integers(0, 50_000),
                                                               max_size=8), st.booleans())
def test_spliced_lines_of_several_agents_arrive_whole_and_unmixed(texts, cuts, slow):
    _check_unmixed([b"".join(b"%d:%s\n" % (i, line) for line in lines)
                    for i, lines in enumerate(texts)], cuts, slow)


def test_spliced_lines_stay_whole_while_others_write_between_frames():
    # Three agents' megabytes, sent in pieces: splices often wait for the
    # socket in the middle of a line while the local rank writes.
    texts = [b"".join(b"%d:%06d %s\n" % (i, n, b"z" * (n % 97)) for n in range(20000))
             for i in range(3)]
    _check_unmixed(texts, list(range(0, 2_000_000, 300_000)), False)


def test_lines_are_spliced_unseen_into_a_pipe_and_read_into_a_file(tmp_path, monkeypatch):
    import mslaunch.machine.output as output
    text = b"".join(b"line %06d %s\n" % (i, b"y" * (i % 300)) for i in range(20000)) + b"tail"
    spliced = []
    real = output.Terminal.splice_from
    monkeypatch.setattr(output.Terminal, "splice_from",
                        lambda self, fd, n: spliced.append(real(self, fd, n)) or spliced[-1])
    got, _, _ = _splice_run([text], [1 << 20, 3 << 20], to_pipe=True, slow=False)
    assert got == text
    assert sum(spliced) > len(text) * 0.9
    spliced.clear()
    got, _, _ = _splice_run([text], [1 << 20], to_pipe=False, slow=False, tmp_path=tmp_path)
    assert got == text and spliced == []   # a file takes no splice: read, then written


def test_a_reader_gone_in_the_middle_of_a_splice_ends_it_quietly():
    # More than a pipe holds even of spliced pages (a slot each, up to 32 KiB)
    text = b"".join(b"%08d\n" % i for i in range(2_000_000))
    got, sinks, closed = _splice_run([text], [], to_pipe=True, slow=True, close_after=100_000)
    assert closed == ["the link reached end-of-file"]
    assert len(got) >= 100_000 and text.startswith(bytes(got[:100_000]))
    assert not sinks[0, 1].terminal.open


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(
    st.binary(max_size=40),
    st.builds(lambda r, s, w, d: link.lines_head(r, s, len(d), w) + d,
              st.integers(0, 2), st.integers(0, 3), st.integers(0, 50), st.binary(max_size=40)),
    st.builds(lambda r, d: link.encode_output(r, 1, d), st.integers(0, 2),
              st.binary(max_size=40))), max_size=6))
def test_a_splicing_endpoint_fed_anything_ends_with_a_reason_never_an_exception(chunks):
    import socket

    from mslaunch.remote.splice import SplicingEndpoint
    from mslaunch.machine.loop import Loop
    from mslaunch.machine.output import RankOutput, Terminal
    loop = Loop()
    r, w = os.pipe()
    term = Terminal(w, "stdout")
    term.loop = loop
    host = _Host({(0, 1): RankOutput(terminal=term, file_fd=None, prefix=None, keep_tail=False)})
    a, b = socket.socketpair()
    closed: List[str] = []

    def on_frame(kind, body):
        if kind != link.OUTPUT:
            raise link.LinkError("not output")
        rank, stream, data = link.decode_binary(body)
        host.output_sink(rank, stream).feed(data)
    end = SplicingEndpoint(loop, b, on_frame=on_frame, on_closed=closed.append, host=host)
    try:
        a.sendall(b"".join(chunks))
        a.close()
        deadline = time.monotonic() + 5
        while not closed and time.monotonic() < deadline:
            loop.run_once(0.01)
            while select.select([r], [], [], 0)[0]:
                if not os.read(r, 1 << 16):
                    break
        assert len(closed) == 1 and closed[0], closed
        assert "Traceback" not in closed[0]
    finally:
        end.close()
        if term.fd != w:
            os.close(term.fd)
        os.close(w)
        os.close(r)
        loop.close()


class _SpliceBench:
    """A Terminal on a pipe nobody reads unless asked, and splicing endpoints
    fed by this test through socket pairs (TCP with ``tcp``)."""

    def __init__(self, hosts: int = 1, tcp: bool = False) -> None:
        import socket

        from mslaunch.remote.splice import SplicingEndpoint
        from mslaunch.machine.loop import Loop
        from mslaunch.machine.output import RankOutput, Terminal
        self.loop = Loop()
        self.r, self.w = os.pipe()
        os.set_blocking(self.r, False)
        self.term = Terminal(self.w, "stdout")
        self.term.loop = self.loop
        self.sinks = {(i, 1): RankOutput(terminal=self.term, file_fd=None, prefix=None,
                                         keep_tail=False) for i in range(hosts)}
        self.host = _Host(self.sinks)
        self.closed: List[str] = []
        self.ends, self.agents = [], []
        for _ in range(hosts):
            if tcp:
                listener = socket.create_server(("127.0.0.1", 0))
                a = socket.create_connection(listener.getsockname())
                b, _ = listener.accept()
                listener.close()
            else:
                a, b = socket.socketpair()

            def on_frame(kind, body):
                rank, stream, data = link.decode_binary(body)
                sink = self.host.output_sink(rank, stream)
                sink.feed(data) if data else sink.finish()
            self.ends.append(SplicingEndpoint(self.loop, b, on_frame=on_frame,
                                              on_closed=self.closed.append, host=self.host))
            self.agents.append(a)

    def run(self, seconds: float, read: bool = False) -> bytes:
        got = bytearray()
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.loop.run_once(0.01)
            while read:
                try:
                    chunk = os.read(self.r, 1 << 20)
                except BlockingIOError:
                    break
                if not chunk:
                    break
                got += chunk
        return bytes(got)

    def close(self) -> None:
        for e in self.ends:
            e.close()
        for a in self.agents:
            a.close()
        if self.term.fd != self.w:
            os.close(self.term.fd)
        os.close(self.w)
        os.close(self.r)
        self.loop.close()


def _lines(rank: int, data: bytes) -> bytes:
    return link.lines_head(rank, 1, len(data), data.rfind(b"\n") + 1) + data


def test_giving_up_a_terminal_mid_splice_still_ends_the_connection(monkeypatch):
    """mslaunch stopped while nobody reads its stdout and a splice waits for room:
    the connection is still read to its end (not left waiting for ever)."""
    import threading

    from mslaunch.remote import splice
    monkeypatch.setattr(splice, "STALL_SECONDS", 60.0)   # a slow sender must not end it
    bench = _SpliceBench()
    try:
        frame = _lines(0, b"x" * 99 + b"\n")
        big = _lines(0, (b"y" * 99 + b"\n") * 200_000) + link.encode_output(0, 1, b"")
        sender = threading.Thread(target=lambda: (bench.agents[0].sendall(frame + big),
                                                  bench.agents[0].close()))
        sender.start()
        deadline = time.monotonic() + 20
        while bench.term._splice_waiter is None and time.monotonic() < deadline:
            bench.run(0.05)
        assert bench.term.splicing is bench.sinks[0, 1]     # waiting for the pipe
        assert bench.term._splice_waiter is not None
        bench.term.give_up()
        bench.run(2)
        sender.join(5)
        assert bench.sinks[0, 1].finished and bench.closed == ["the link reached end-of-file"]
    finally:
        bench.close()


def test_a_connection_reset_mid_splice_ends_the_link_not_the_terminal():
    import socket
    import struct
    bench = _SpliceBench(hosts=2, tcp=True)
    try:
        a = bench.agents[0]
        a.sendall(_lines(0, b"0:one\n0:two\n0:three\n")[:-4])
        bench.run(0.1, read=True)
        a.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        a.close()                                         # a reset, not an end
        bench.run(0.2, read=True)
        assert bench.closed and "reset" in bench.closed[0].lower(), bench.closed
        assert bench.term.open and bench.term.splicing is None
        bench.agents[1].sendall(_lines(1, b"1:still here\n"))
        assert b"1:still here\n" in bench.run(0.3, read=True)
    finally:
        bench.close()


def test_a_splice_cut_short_leaves_its_line_unfinished_for_the_next_source():
    bench = _SpliceBench()
    try:
        bench.agents[0].sendall(_lines(0, b"0:first\n0:second line\n")[:-8])
        bench.run(0.1)
        bench.agents[0].close()                           # the agent is gone mid-line
        bench.run(0.1)
        bench.term.write(object(), b"mslaunch: lost host h1\n")
        got = bench.run(0.1, read=True)
        assert got == b"0:first\n0:seco\nmslaunch: lost host h1\n", got
    finally:
        bench.close()


def test_a_late_rest_of_a_frame_gives_the_terminal_back_to_the_others():
    from mslaunch.remote.splice import STALL_SECONDS
    bench = _SpliceBench(hosts=2)
    try:
        first = _lines(0, b"0:a\n0:b" + b"b" * 10 + b"\n")
        bench.agents[0].sendall(first[:-5])               # the rest is late
        got = bench.run(0.05, read=True)
        bench.agents[1].sendall(_lines(1, b"1:x\n"))
        got += bench.run(STALL_SECONDS + 0.3, read=True)
        assert b"1:x\n" in got and bench.term.splicing is None
        bench.agents[0].sendall(first[-5:])
        got += bench.run(0.2, read=True)
        # 0's line is ended where the splice stopped, 1's line stands whole
        assert got == b"0:a\n0:bbbbbbb\n1:x\nbbbb\n", got
    finally:
        bench.close()


def test_remote_lines_keep_flowing_while_a_local_rank_keeps_the_queue_busy():
    """A local rank writes faster than mslaunch's stdout is read, so bytes are
    always queued: a remote host's lines still get through (read and queued
    between the local ones) rather than waiting for an empty queue."""
    import threading
    bench = _SpliceBench()
    got = bytearray()
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            time.sleep(0.002)
            try:
                got.extend(os.read(bench.r, 1 << 16))
            except BlockingIOError:
                pass

    class Local:
        paused = False

        def resume(self) -> None:
            self.paused = False
    local = Local()

    def produce() -> None:
        if not local.paused:
            bench.term.write(local, (b"L" * 1023 + b"\n") * 64)
            if bench.term.congested:
                local.paused = True
                bench.term.wait_for_room(local)
        bench.loop.call_later(0.001, produce)
    reader = threading.Thread(target=read)
    try:
        bench.term.write(local, (b"L" * 1023 + b"\n") * 1280)
        produce()
        reader.start()
        sent = b"".join(b"0:%05d\n" % i for i in range(2000))
        bench.agents[0].sendall(_lines(0, sent[:7000]) + _lines(0, sent[7000:]))
        bench.run(2)
        stop.set()
        reader.join()
        remote = b"".join(line + b"\n" for line in bytes(got).split(b"\n")
                          if line.startswith(b"0:"))
        assert remote == sent
    finally:
        stop.set()
        bench.close()


def test_bytes_that_came_with_the_token_start_the_stream():
    bench = _SpliceBench()
    try:
        stream = _lines(0, b"0:hello\n0:world\n") + _lines(0, b"0:more\n")
        bench.ends[0].deliver(stream[:9])                 # cut inside the first head
        bench.agents[0].sendall(stream[9:])
        bench.agents[0].close()
        assert bench.run(0.3, read=True) == b"0:hello\n0:world\n0:more\n"
        assert bench.closed == ["the link reached end-of-file"]
    finally:
        bench.close()
