"""Helpers shared by the tests of the control link: strategies of frames and
bodies, the codec's round trip, and what a Reader must refuse."""

from __future__ import annotations

import os
from typing import Any, List, Sequence, Tuple

from hypothesis import strategies as st

from mslaunch.wire import link

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
