"""Property tests of the output relay: any chunking, any interleaving of ranks."""

from __future__ import annotations

import os
import tempfile

from hypothesis import given, settings
from hypothesis import strategies as st

from mslaunch.run.output import Console, RankOutput, line_prefix

_piece = st.binary(max_size=40).map(lambda b: b.replace(b"\r", b""))


def _relay(chunks, prefix=False):
    """Feed (source, bytes) chunks through RankOutputs; return terminal and file bytes."""
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
        for source, data in chunks:
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
