"""Endpoints: frames through a real socket, plain or TLS, with a full send buffer."""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import List

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import wait_for
from linkhelpers import Frame
from mslaunch.wire import link

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


def _endpoint_pair(tls: bool):
    import socket
    import ssl

    from mslaunch.wire import dialback
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

    from mslaunch.wire.endpoint import SocketEndpoint
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
    from mslaunch.wire.endpoint import FIRST_READ, SocketEndpoint
    from mslaunch.machine.loop import Loop
    import fcntl
    import struct
    import termios
    loop = Loop()
    a, b = _endpoint_pair(True)
    head = link.output_head(0, 1, 0)
    data = b"q" * (FIRST_READ - len(head) + 5)
    a.sendall(link.output_head(0, 1, len(data)))     # a record ...
    a.sendall(data)                                  # ... and more
    # all of them are in b's socket (none waits in a's: loopback, nothing unacknowledged)
    assert wait_for(lambda: struct.unpack("i", fcntl.ioctl(a.fileno(), termios.TIOCOUTQ,
                                                            b"\0" * 4))[0] == 0, 5, 0.01)
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
    from mslaunch.wire.endpoint import InboundTLSEndpoint, SocketEndpoint
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

    from mslaunch.wire.endpoint import InboundTLSEndpoint, SocketEndpoint
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


def test_a_long_callback_does_not_make_a_peer_that_spoke_meanwhile_silent():
    """A callback of the loop runs 0.9 s (as a launcher's work on an event can on a
    busy machine) after the peer was quiet for 1.3 s of its 2 s, and the peer's beat
    comes during it: the check of the peer that falls due then counts the silence up
    to the loop's last wait for events, so the peer is not lost, and the next pass
    reads the beat.  Counted up to the check, the silence was 2.2 s: "lost"."""
    import socket

    from mslaunch.machine.loop import Loop
    from mslaunch.wire.endpoint import Endpoint
    ours, theirs = socket.socketpair()
    loop = Loop()
    closed: List[str] = []
    ep = Endpoint(loop, ours.fileno(), ours.fileno(), on_frame=lambda kind, body: None,
                  on_closed=closed.append)
    r, w = os.pipe()
    stalled: List[float] = []

    def long_callback() -> None:
        os.read(r, 1)
        theirs.send(link.encode(link.BEAT))       # the peer speaks as the callback begins
        stalled.append(time.monotonic())
        while time.monotonic() < stalled[0] + 0.9:
            pass                                   # the callback's own work: the stall
    loop.add_reader(r, long_callback)
    ep.start_heartbeat(0.5, 4)
    loop.call_later(1.3, lambda: os.write(w, b"!"))
    try:
        while not closed and not (stalled and ep.last_heard > stalled[0]):
            loop.run_once(1.0)
        assert closed == [], closed
    finally:
        ep.close()
        loop.forget(r)
        loop.close()
        for fd in (r, w):
            os.close(fd)
        theirs.close()
