"""The queued writer under every non-blocking writer (terminals, links, PMI, stdin):
real pipes and sockets, a real loop, and the bytes that come out the other end."""

from __future__ import annotations

import errno
import fcntl
import os
import select
import socket
import threading
import time
from typing import List, Tuple

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mslaunch.machine.loop import IOV_MAX, Loop, QueuedWriter

F_SETPIPE_SZ = 1031
SMALL = 4096             # the smallest pipe Linux makes: the writer queues early


class Recorder(QueuedWriter):
    """A writer whose hooks note what happened, with the bytes then waiting."""

    def __init__(self, loop: Loop, fd: int, sock=None) -> None:
        super().__init__(loop, fd)
        if sock is not None:
            self.sock = sock
            self.send_flags = socket.MSG_NOSIGNAL
        self.events: List[Tuple[str, int]] = []

    def on_write_error(self, err: OSError) -> None:
        self.events.append(("error", err.errno))

    def on_empty(self) -> None:
        self.events.append(("empty", self.queued))

    def on_high_water(self) -> None:
        self.events.append(("high", self.queued))

    def on_low_water(self) -> None:
        self.events.append(("low", self.queued))


@pytest.fixture
def pipe():
    """A 4 KiB pipe, its write end non-blocking, its read end too; and a loop."""
    r, w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    fcntl.fcntl(w, F_SETPIPE_SZ, SMALL)
    loop = Loop()
    ends = [r, w]
    yield loop, r, w, ends
    loop.close()
    for fd in ends:
        try:
            os.close(fd)
        except OSError:
            pass


def _read_some(r: int, most: int = 1 << 20) -> bytes:
    try:
        return os.read(r, most)
    except BlockingIOError:
        return b""


def _pump(loop: Loop, r: int, want: int, step: int = 1 << 20, seconds: float = 20) -> bytes:
    """Read ``want`` bytes from ``r``, ``step`` at a time, running the loop between reads."""
    out = bytearray()
    end = time.monotonic() + seconds
    while len(out) < want and time.monotonic() < end:
        out += _read_some(r, min(step, want - len(out)))
        loop.run_once(0.01)
    return bytes(out)


def _fill(w: int) -> int:
    """Fill the pipe until it takes no more; returns the bytes it holds."""
    held = 0
    try:
        while True:
            held += os.write(w, b"f" * SMALL)
    except BlockingIOError:
        return held


def test_a_full_pipe_queues_the_rest_and_the_loop_writes_it_in_order(pipe):
    loop, r, w, _ = pipe
    writer = Recorder(loop, w)
    big = bytes(range(256)) * 400
    assert writer.put(big)                       # the pipe took 4 KiB at most
    assert 0 < writer.queued < len(big)
    assert loop._cbs[w][1] == writer.flush_some  # waits for the loop
    assert writer.put(b"tail")                   # behind what waits, not before
    assert writer.queued == len(big) + 4 - SMALL
    assert writer.events == []
    out = _pump(loop, r, len(big) + 4, step=1000)
    assert out == big + b"tail"
    assert writer.queued == 0 and not writer.queue
    assert w not in loop._cbs                    # the writer callback went with the queue
    assert writer.events == [("empty", 0)]


def test_a_write_taken_whole_queues_nothing_and_is_no_drain(pipe):
    loop, r, w, _ = pipe
    writer = Recorder(loop, w)
    assert not writer.put(b"at once")
    assert not writer.put_parts([b"two ", bytearray(b"parts")])
    assert not writer.put(b"")
    assert not writer.put_parts([b"", b""])
    assert _read_some(r) == b"at oncetwo parts"
    assert not writer.queue and w not in loop._cbs
    assert writer.events == []


@pytest.mark.parametrize("queued_first", [False, True])
def test_more_parts_than_one_writev_takes(pipe, queued_first):
    loop, r, w, _ = pipe
    fcntl.fcntl(w, F_SETPIPE_SZ, 1 << 16)
    writer = Recorder(loop, w)
    if queued_first:               # every part waits: the loop's writes are batched
        held = _fill(w)
        assert writer.put(b"<")
    parts = [bytes([i % 251]) * (1 + i % 13) for i in range(3 * IOV_MAX + 7)]
    assert sum(map(len, parts)) < 1 << 16     # the pipe has room for all ...
    writer.put_parts(parts)
    if not queued_first:                      # ... but one writev takes IOV_MAX parts
        assert len(writer.queue) == len(parts) - IOV_MAX
    if queued_first:
        assert _pump(loop, r, held, step=held) == b"f" * held
    expect = (b"<" if queued_first else b"") + b"".join(parts)
    assert _pump(loop, r, len(expect), step=5000) == expect
    assert writer.events == [("empty", 0)]


def test_parts_that_wait_are_kept_without_a_copy_only_when_they_are_bytes(pipe):
    loop, r, w, _ = pipe
    writer = Recorder(loop, w)
    held = _fill(w)
    big = os.urandom(1 << 20)
    other = os.urandom(50_000)
    scratch = bytearray(b"s" * 1000)
    view_source = bytearray(b"v" * 1000)
    assert writer.put(big)
    writer.put_parts([other, scratch, memoryview(view_source)])
    assert writer.queue[0] is big and writer.queue[1] is other
    assert bytes(writer.queue[2]) == b"s" * 1000
    scratch[:] = b"X" * 1000           # the caller's buffers may change after the call
    view_source[:] = b"Y" * 1000
    assert _pump(loop, r, held, step=held) == b"f" * held
    loop.run_once(0.01)                # the pipe takes 4 KiB of big: the rest a view of it
    head = writer.queue[0]
    assert type(head) is memoryview and head.obj is big and len(head) < len(big)
    out = _pump(loop, r, len(big) + 52_000)
    assert out == big + other + b"s" * 1000 + b"v" * 1000


def test_the_rest_of_a_part_written_in_part_at_once_is_a_view_of_it(pipe):
    loop, r, w, _ = pipe
    writer = Recorder(loop, w)
    big = os.urandom(100_000)
    writer.put_parts([b"head", big])
    head = writer.queue[0]
    assert type(head) is memoryview and head.obj is big
    assert _pump(loop, r, 100_004) == b"head" + big


def test_water_marks_fire_once_each_way_at_their_thresholds(pipe):
    loop, r, w, _ = pipe
    writer = Recorder(loop, w)
    writer.high_water, writer.low_water = 20_000, 5_000
    levels = []
    for i in range(10):
        writer.put(bytes([65 + i]) * 3000)
        levels.append(writer.queued)
    first_above = next(q for q in levels if q > 20_000)
    assert writer.events == [("high", first_above)]
    # Read 1000 bytes at a time: the low mark fires when the queue first
    # reaches 5000 or less, not when it falls below 20000.
    seen = writer.queued
    out = bytearray()
    while writer.queued:
        out += _read_some(r, 1000)
        before = seen
        loop.run_once(0.01)
        seen = writer.queued
        lows = [e for e in writer.events if e[0] == "low"]
        if seen > 5_000:
            assert lows == []
        elif before > 5_000:
            assert lows == [("low", seen)]
    assert [e[0] for e in writer.events] == ["high", "low", "empty"]
    out += _pump(loop, r, 30_000 - len(out))
    assert bytes(out) == b"".join(bytes([65 + i]) * 3000 for i in range(10))
    # Past the high mark again: it fires again.
    _fill(w)
    writer.put(b"z" * 25_000)
    assert writer.events[-1] == ("high", 25_000)


def test_on_empty_lets_an_owner_close_after_the_drain(pipe):
    loop, r, w, ends = pipe

    class CloseWhenDone(Recorder):
        def on_empty(self) -> None:
            super().on_empty()
            loop.forget(self.fd)
            os.close(self.fd)
            ends.remove(self.fd)

    writer = CloseWhenDone(loop, w)
    held = _fill(w)
    writer.put(b"last words")
    out = _pump(loop, r, held + 10)
    assert out.endswith(b"last words")
    assert os.read(r, 10) == b""                 # end-of-file: the write end was closed
    assert writer.events == [("empty", 0)]


def test_a_reader_gone_before_the_write_is_an_error_hook_not_an_exception(pipe):
    loop, r, w, ends = pipe
    writer = Recorder(loop, w)
    os.close(r)
    ends.remove(r)
    assert not writer.put(b"nobody reads")
    assert not writer.put_parts([b"nor", b"this"])
    assert writer.events == [("error", errno.EPIPE), ("error", errno.EPIPE)]
    assert not writer.queue and writer.queued == 0 and w not in loop._cbs


def test_a_reader_gone_while_bytes_wait_drops_them_through_the_hook(pipe):
    loop, r, w, ends = pipe
    writer = Recorder(loop, w)
    _fill(w)
    writer.put(b"x" * 100_000)
    assert loop._cbs[w][1] is not None
    os.close(r)
    ends.remove(r)
    loop.run_once(1.0)                           # EPOLLERR wakes the writer: EPIPE
    assert writer.events == [("error", errno.EPIPE)]
    assert not writer.queue and writer.queued == 0 and w not in loop._cbs


def test_a_socket_is_written_with_send_and_its_flags():
    a, b = socket.socketpair()
    loop = Loop()
    try:
        a.setblocking(False)
        a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        writer = Recorder(loop, a.fileno(), sock=a)
        data = os.urandom(300_000)
        parts = [os.urandom(n) for n in (1, 10, 100, 1000, 10_000)]
        writer.put(data)
        writer.put_parts(parts)
        assert writer.queue
        got = bytearray()
        b.setblocking(False)
        end = time.monotonic() + 20
        while len(got) < len(data) + 11_111 and time.monotonic() < end:
            try:
                got += b.recv(7000)
            except BlockingIOError:
                pass
            loop.run_once(0.01)
        assert bytes(got) == data + b"".join(parts)
        b.close()
        writer.put(b"gone")    # MSG_NOSIGNAL: EPIPE, not a signal
        assert writer.events == [("empty", 0), ("error", errno.EPIPE)]
    finally:
        loop.close()
        a.close()
        b.close()


def test_drain_blocks_until_written_or_the_deadline(pipe):
    loop, r, w, _ = pipe
    writer = Recorder(loop, w)
    data = os.urandom(200_000)
    writer.put(data)
    started = time.monotonic()
    assert not writer.drain(started + 0.2)       # nobody reads
    assert time.monotonic() - started >= 0.2
    got = bytearray()

    def read_slowly() -> None:
        end = time.monotonic() + 20
        while len(got) < len(data) and time.monotonic() < end:
            chunk = _read_some(r, 3000)
            got.extend(chunk)
            if not chunk:
                select.select([r], [], [], 0.1)

    reader = threading.Thread(target=read_slowly)
    reader.start()
    try:
        assert writer.drain(time.monotonic() + 20)
    finally:
        reader.join()
    assert bytes(got) == data
    assert w not in loop._cbs


_PART = st.one_of(
    st.binary(max_size=40),
    st.builds(lambda seed, n: (seed * (n // len(seed) + 1))[:n],       # enough to fill the pipe
              st.binary(min_size=1, max_size=50), st.integers(0, 20_000)))
_STEP = st.one_of(
    st.tuples(st.just("put"), _PART, st.sampled_from(["bytes", "bytearray", "view"])),
    st.tuples(st.just("parts"), st.lists(_PART, max_size=40), st.sampled_from(["bytes", "view"])),
    st.tuples(st.just("read"), st.integers(0, 20_000), st.just("")),
)


@settings(max_examples=60, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(steps=st.lists(_STEP, max_size=60), use_socket=st.booleans())
def test_any_parts_at_any_reader_pace_come_out_as_their_concatenation(steps, use_socket):
    """Bytes given as they are, copied buffers that the caller then changes, and
    views of them, between reads of any size: exactly what was given comes out."""
    if use_socket:
        a, b = socket.socketpair()
        a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        a.setblocking(False)
        b.setblocking(False)
        wfd, rfd, closers = a.fileno(), b.fileno(), [a.close, b.close]
    else:
        rfd, wfd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        fcntl.fcntl(wfd, F_SETPIPE_SZ, SMALL)
        closers = [lambda: os.close(rfd), lambda: os.close(wfd)]
    loop = Loop()
    try:
        writer = Recorder(loop, wfd, sock=a if use_socket else None)
        expect = bytearray()
        got = bytearray()

        def given_as(data: bytes, how: str):
            if how == "bytes":
                return data
            buf = bytearray(data)
            return memoryview(buf) if how == "view" else buf

        for kind, what, how in steps:
            if kind == "put":
                arg = given_as(what, how)
                writer.put(arg)
                expect += what
                if how != "bytes":
                    arg[:] = b"#" * len(arg)     # the caller reuses its buffer
            elif kind == "parts":
                args = [given_as(p, how) for p in what]
                writer.put_parts(args)
                expect += b"".join(what)
                for arg in args:
                    if how != "bytes":
                        arg[:] = b"#" * len(arg)
            else:
                got += _read_some(rfd, what) if what else b""
                loop.run_once(0)
            assert writer.queued == sum(map(len, writer.queue))
        got += _pump(loop, rfd, len(expect) - len(got), step=8000)
        assert bytes(got) == bytes(expect)
        assert not writer.queue and wfd not in loop._cbs
        assert all(e[0] != "error" for e in writer.events)
    finally:
        loop.close()
        for close in closers:
            close()
