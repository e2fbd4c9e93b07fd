"""Property tests of the output relay: any chunking, any interleaving of ranks."""

from __future__ import annotations

import os
import tempfile

from hypothesis import given, settings
from hypothesis import strategies as st

from mslaunch.machine.loop import Loop
from mslaunch.machine.output import RankOutput, last_newline, line_prefix
from mslaunch.machine.terminal import Console

_piece = st.binary(max_size=40).map(lambda b: b.replace(b"\r", b""))


def _relay(chunks, prefix=False, views=False):
    """Feed (source, bytes) chunks through RankOutputs; return terminal and file bytes.
    With ``views``, each chunk is fed as a view of a buffer scribbled over after it."""
    with tempfile.TemporaryFile() as term:
        console = Console(out_fd=term.fileno(), err_fd=term.fileno())
        sinks, files = {}, {}
        for source in {s for s, _ in chunks}:
            f = tempfile.TemporaryFile()
            files[source] = f
            sinks[source] = RankOutput(
                terminal=console.terminal(1), file_fd=os.dup(f.fileno()),
                prefix=line_prefix(source, "stdout", tag=True, timestamp=False,
                                   rank_prefix=False) if prefix else None,
                keep_tail=True)
        for source, data in _scribbled_views(chunks) if views else chunks:
            sinks[source].feed(data)
        for s in sinks.values():
            s.finish()
        term.seek(0)
        out = term.read()
        kept = {}
        for source, f in files.items():
            f.seek(0)
            kept[source] = f.read()
            f.close()
        return out, kept


def _lines(data: bytes):
    parts = data.split(b"\n")
    if parts and parts[-1] == b"":
        parts.pop()
    return parts


# Each source writes its own letter (and newlines), so every byte on the
# terminal can be traced back to the rank that wrote it.
_chunks = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 12), st.integers(0, 2)),
                   max_size=40).map(
    lambda items: [(src, (bytes([97 + src]) * n) + b"\n" * nl) for src, n, nl in items])


@settings(max_examples=400, deadline=None)
@given(_chunks)
def test_files_get_exact_bytes_and_terminal_lines_are_never_spliced(chunks):
    out, kept = _relay(chunks)
    for source in kept:
        assert kept[source] == b"".join(d for s, d in chunks if s == source)
    terminal = {}
    for line in _lines(out):
        letters = set(line)
        assert len(letters) <= 1, line            # one rank per line, never spliced
        if letters:
            terminal.setdefault(letters.pop() - 97, []).append(line)
    for source in kept:
        expected = [x for x in _lines(kept[source]) if x]
        assert terminal.get(source, []) == expected


@settings(max_examples=200, deadline=None)
@given(_chunks)
def test_tagged_lines_carry_their_own_rank(chunks):
    out, kept = _relay(chunks, prefix=True)
    per_source = {}
    for line in _lines(out):
        assert line.startswith(b"[1,"), line
        head, _, body = line.partition(b"]<stdout>:")
        rank = int(head[3:])
        assert set(body) <= {97 + rank}
        per_source.setdefault(rank, []).append(body)
    for source in kept:
        assert per_source.get(source, []) == _lines(kept[source])


# -- views: the remote path hands on views of a buffer that is reused ------------

def _scribbled_views(chunks, size=64):
    """The chunks as views of one scratch buffer, overwritten after each use."""
    scratch = bytearray(max([size] + [len(d) for _, d in chunks]))
    for source, data in chunks:
        scratch[:len(data)] = data
        yield source, memoryview(scratch)[:len(data)]
        scratch[:] = b"#" * len(scratch)


@settings(max_examples=300, deadline=None)
@given(_chunks, st.booleans())
def test_views_of_a_reused_buffer_relay_like_bytes(chunks, prefix):
    assert _relay(chunks, prefix, views=True) == _relay(chunks, prefix)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.lists(st.integers(0, 90_000), max_size=4),
       st.integers(0, 90_000), st.integers(0, 50))
def test_last_newline_of_any_view_is_rfind(noise, newlines, size, offset):
    data = bytearray((noise.replace(b"\n", b"") * (size // max(1, len(noise)) + 1))[:size]
                     if noise.replace(b"\n", b"") else b"x" * size)
    for at in newlines:
        if at < len(data):
            data[at] = 10
    backing = bytearray(b"\n" * offset) + data + b"\n"     # newlines outside the view
    view = memoryview(backing)[offset:offset + len(data)]
    assert last_newline(view) == bytes(data).rfind(b"\n")
    assert last_newline(bytes(data)) == bytes(data).rfind(b"\n")


def test_a_slow_pipe_gets_every_byte_of_views_whose_buffer_is_reused():
    """Writes to a full pipe queue a copy of what is left, never the caller's view."""
    import threading
    read_fd, write_fd = os.pipe()
    got = bytearray()

    def reader():
        while True:
            data = os.read(read_fd, 4096)
            if not data:
                return
            got.extend(data)

    # The reader starts once everything is fed: a reader already running
    # could keep the pipe from ever filling, and nothing would be queued.
    thread = threading.Thread(target=reader)
    try:
        loop = Loop()
        console = Console(out_fd=write_fd, err_fd=write_fd)
        console.attach(loop)
        sink = RankOutput(terminal=console.terminal(1), file_fd=None, prefix=None,
                          keep_tail=False)
        line = b"".join(b"%07d\n" % i for i in range(40_000))      # 320 KB of lines
        chunks = [(0, line[a:a + 50_000]) for a in range(0, len(line), 50_000)]
        for _, view in _scribbled_views(chunks):
            sink.feed(view)                 # the pipe is full after the first
        sink.finish()
        assert console.out.queued > 0
        thread.start()
        loop.run_until(lambda: not console.pending)
        console.attach(None)
        loop.close()
        if console.out.fd != write_fd:
            os.close(console.out.fd)        # its own description of the pipe
    finally:
        os.close(write_fd)
        if not thread.is_alive() and thread.ident is None:
            thread.start()                  # (failed before it started) it sees end-of-file
        thread.join(10)
    assert not thread.is_alive()            # the reader saw end-of-file
    os.close(read_fd)
    assert bytes(got) == line
