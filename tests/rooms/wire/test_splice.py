"""The plain output connection that splices LINES frames into the terminal:
lines stay whole and unmixed, and every way a splice can end."""

from __future__ import annotations

import os
import select
import time
from typing import List, Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from mslaunch.wire import link

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

    from mslaunch.wire.splice import SplicingEndpoint
    from mslaunch.machine.loop import Loop
    from mslaunch.machine.output import RankOutput
    from mslaunch.machine.terminal import Terminal
    loop = Loop()
    got = bytearray()
    if to_pipe:
        r, w = os.pipe()

        def read() -> None:
            while True:
                if slow:
                    time.sleep(0.001)           # a slow reader: the fault itself
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
                        time.sleep(0.0002)      # now and then: the fault itself
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
    import mslaunch.machine.terminal as output
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

    from mslaunch.wire.splice import SplicingEndpoint
    from mslaunch.machine.loop import Loop
    from mslaunch.machine.output import RankOutput
    from mslaunch.machine.terminal import Terminal
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

        from mslaunch.wire.splice import SplicingEndpoint
        from mslaunch.machine.loop import Loop
        from mslaunch.machine.output import RankOutput
        from mslaunch.machine.terminal import Terminal
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

    from mslaunch.wire import splice
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
    from mslaunch.wire.splice import STALL_SECONDS
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
            time.sleep(0.002)                   # a slow reader: the situation under test
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
