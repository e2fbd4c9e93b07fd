"""The control link between the launcher and a host's agent: framing and codecs.

The link is a byte stream (the agent's stdin and stdout inside the SSH
connection, or any other pipe or socket).  The agent writes :data:`SYNC`
first: a remote login shell may print text before the agent runs, and the
launcher skips everything before the mark.  After it, both directions carry
frames::

    frame := length (4 bytes, big-endian; kind and body) | kind (1 byte) | body

``OUTPUT`` and ``STDIN`` frames have a small binary header before their
bytes; every other body is a JSON object (UTF-8), so that nothing received
is ever executed or unpickled.  ``NODE`` frames are the msrun-mode node
service's (:mod:`mslaunch.msrun.service`), on a link of their own.  Strings of the job (argv, environment,
paths) are carried as text with ``surrogateescape``, so any bytes but NUL
arrive byte for byte.  Malformed input raises :class:`LinkError` with a
short description; the caller ends the link with a message naming the host.
"""

from __future__ import annotations

import json
import struct

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Tuple

#: Version of the link protocol; both ends must speak the same.
PROTOCOL = 1
#: What the agent writes before its first frame.
SYNC = b"\0mslaunch-link-1\0"
#: Largest frame accepted (a job description for thousands of ranks fits).
MAX_FRAME = 64 << 20
#: Bytes of junk a remote shell may print before :data:`SYNC`.
MAX_PREAMBLE = 64 << 10

HELLO, JOB, READY, START, STARTED, OUTPUT, EXITED, SIGNAL, CREDIT, STDIN, PMI, BEAT, \
    ERROR, BYE, DONE, LOG, NODE = range(1, 18)
NAMES = {HELLO: "HELLO", JOB: "JOB", READY: "READY", START: "START", STARTED: "STARTED",
         OUTPUT: "OUTPUT", EXITED: "EXITED", SIGNAL: "SIGNAL", CREDIT: "CREDIT",
         STDIN: "STDIN", PMI: "PMI", BEAT: "BEAT", ERROR: "ERROR", BYE: "BYE", DONE: "DONE",
         LOG: "LOG", NODE: "NODE"}
_BINARY = (OUTPUT, STDIN)
_HEAD = struct.Struct(">IB")
_RANK_STREAM = struct.Struct(">IB")
#: ``STDIN`` rank meaning "every rank that reads stdin".
ALL_RANKS = 0xFFFFFFFF


class LinkError(ValueError):
    """Bytes on the link that do not follow the protocol."""


def encode(kind: int, body: Optional[Dict[str, Any]] = None) -> bytes:
    """One JSON frame."""
    data = b"" if body is None else json.dumps(body, ensure_ascii=True,
                                               separators=(",", ":")).encode("ascii")
    if len(data) + 1 > MAX_FRAME:
        raise LinkError(f"{NAMES.get(kind, kind)} frame of {len(data)} bytes is too large")
    return _HEAD.pack(len(data) + 1, kind) + data


def encode_output(rank: int, stream: int, data) -> bytes:
    """One ``OUTPUT`` frame: ``stream`` 1 or 2 of ``rank``; empty data is end-of-stream."""
    return _HEAD.pack(len(data) + 1 + _RANK_STREAM.size, OUTPUT) + \
        _RANK_STREAM.pack(rank, stream) + bytes(data)


def encode_stdin(rank: int, data: bytes) -> bytes:
    """One ``STDIN`` frame for ``rank`` (or :data:`ALL_RANKS`); empty data is end-of-file."""
    return _HEAD.pack(len(data) + 1 + _RANK_STREAM.size, STDIN) + \
        _RANK_STREAM.pack(rank, 0) + data


def decode_binary(body: bytes) -> Tuple[int, int, bytes]:
    """``(rank, stream, data)`` of an ``OUTPUT`` or ``STDIN`` body."""
    if len(body) < _RANK_STREAM.size:
        raise LinkError("short binary frame")
    rank, stream = _RANK_STREAM.unpack_from(body)
    return rank, stream, body[_RANK_STREAM.size:]


def decode_json(kind: int, body: bytes) -> Dict[str, Any]:
    """The JSON object of a frame body (an empty body is ``{}``)."""
    if not body:
        return {}
    try:
        value = json.loads(body.decode("ascii"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise LinkError(f"{NAMES.get(kind, kind)} frame is not valid JSON") from None
    if not isinstance(value, dict):
        raise LinkError(f"{NAMES.get(kind, kind)} frame is not a JSON object")
    return value


class Reader:
    """Cuts frames out of the bytes received so far."""

    def __init__(self, expect_sync: bool = False, max_frame: int = MAX_FRAME) -> None:
        self.buf = bytearray()
        self.synced = not expect_sync
        self.preamble = b""          # what came before the sync mark
        self.max_frame = max_frame

    def feed(self, data: bytes) -> List[Tuple[int, bytes]]:
        """Add received bytes; return the complete frames as ``(kind, body)``."""
        self.buf += data
        if not self.synced:
            at = self.buf.find(SYNC)
            if at < 0:
                if len(self.buf) > MAX_PREAMBLE + len(SYNC):
                    raise LinkError("no agent answered (the remote side printed "
                                    f"{len(self.buf)} bytes but never the link's start mark)")
                return []
            self.preamble = bytes(self.buf[:at])
            del self.buf[:at + len(SYNC)]
            self.synced = True
        frames = []
        buf = self.buf
        pos = 0
        while len(buf) - pos >= _HEAD.size:
            length, kind = _HEAD.unpack_from(buf, pos)
            if length < 1 or length > self.max_frame:
                raise LinkError(f"frame length {length} out of range")
            if kind not in NAMES:
                raise LinkError(f"unknown frame kind {kind}")
            end = pos + 4 + length
            if len(buf) < end:
                break
            frames.append((kind, bytes(buf[pos + _HEAD.size:end])))
            pos = end
        if pos:
            del buf[:pos]
        return frames


def hello(frames: List[Tuple[int, bytes]], reader: "Reader") -> Tuple[Dict[str, Any], bytes]:
    """An agent's first frames: its ``HELLO`` (LinkError unless it speaks this
    protocol), and the bytes after it, frames and all, for the link to read on."""
    kind, body = frames[0]
    greeting = decode_json(kind, body) if kind == HELLO else {}
    if kind != HELLO or greeting.get("protocol") != PROTOCOL:
        raise LinkError(f"the agent speaks another protocol "
                        f"({str(greeting.get('protocol'))[:10]}, expected {PROTOCOL})")
    rest = b"".join(_HEAD.pack(len(b) + 1, k) + b for k, b in frames[1:])
    return greeting, rest + bytes(reader.buf)


def field(body: Dict[str, Any], name: str, kind: type, what: str = "") -> Any:
    """``body[name]`` checked to be of ``kind`` (``int`` excludes bool)."""
    value = body.get(name)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise LinkError(f"{what or 'frame'}: field {name!r} missing or not {kind.__name__}")
    return value


def optional(body: Dict[str, Any], name: str, kind: type, what: str = "") -> Any:
    return None if body.get(name) is None else field(body, name, kind, what)
