"""The control link between the launcher and a host's agent: framing and codecs.

The link is a byte stream (the agent's stdin and stdout inside the SSH
connection, or any other pipe or socket).  The agent writes :data:`SYNC`
first: a remote login shell may print text before the agent runs, and the
launcher skips everything before the mark.  After it, both directions carry
frames::

    frame := length (4 bytes, big-endian; kind and body) | kind (1 byte) | body

``OUTPUT``, ``LINES`` and ``STDIN`` frames have a small binary header before
their bytes; every other body is a JSON object (UTF-8), so that nothing received
is ever executed or unpickled.  ``NODE`` frames are the msrun-mode node
service's (:mod:`mslaunch.msrun.service`), on a link of their own.  Strings of the job (argv, environment,
paths) are carried as text with ``surrogateescape``, so any bytes but NUL
arrive byte for byte.  Malformed input raises :class:`LinkError` with a
short description; the caller ends the link with a message naming the host.
"""

from __future__ import annotations

import struct

from .wirejson import dumps, loads

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
#: Largest receive buffer a reader keeps once it is empty again.
KEEP = 4 << 20

HELLO, JOB, READY, START, STARTED, OUTPUT, EXITED, SIGNAL, CREDIT, STDIN, PMI, BEAT, \
    ERROR, BYE, DONE, LOG, NODE, LINES = range(1, 19)
NAMES = {HELLO: "HELLO", JOB: "JOB", READY: "READY", START: "START", STARTED: "STARTED",
         OUTPUT: "OUTPUT", EXITED: "EXITED", SIGNAL: "SIGNAL", CREDIT: "CREDIT",
         STDIN: "STDIN", PMI: "PMI", BEAT: "BEAT", ERROR: "ERROR", BYE: "BYE", DONE: "DONE",
         LOG: "LOG", NODE: "NODE", LINES: "LINES"}
#: The launcher to an agent whose ranks have all ended (``DONE``), when the job
#: starts again (``--max-restarts``): forget that job, keep the link, and wait
#: for the next ``JOB`` (``{"idle": seconds}``: at most that long, then exit).
NEXT = 19
NAMES[NEXT] = "NEXT"
#: The agent to the launcher, as it gives up on a launcher silent for longer than
#: the heartbeat allows (``{"silent": seconds}``): it then ends its ranks and exits.
#: Read by a launcher that was itself not running (stopped, starved), this says the
#: host was sound and the pause was the launcher's.
GONE = 20
NAMES[GONE] = "GONE"
#: The agent to the launcher, which said it stops (``SIGNAL`` SIGTSTP, a Ctrl-Z):
#: heard; its ranks are stopped and it takes the launcher's silence for a pause.
PAUSED = 21
NAMES[PAUSED] = "PAUSED"
#: The launcher to an agent: nobody takes a rank's stream any more (mslaunch's
#: own stdout or stderr was closed, ``| head``, and no file wants it); the agent
#: stops reading it, so that the rank meets a broken pipe (``{"rank", "stream"}``).
UNWANTED = 22
NAMES[UNWANTED] = "UNWANTED"
#: Looking inside a running job (see :mod:`mslaunch.agent.agentlook`): the launcher asks with
#: ``{"id", "timeout"}``, the agent answers on the same kind with ``{"id", "ranks"}``.
#: Numbered apart from the kinds above, so that kinds added there do not collide.
STACKS, TOP = 40, 41
NAMES.update({STACKS: "STACKS", TOP: "TOP"})
#: A frame's head (length, kind), and the rank and stream that open a binary body.
HEAD = struct.Struct(">IB")
RANK_STREAM = struct.Struct(">IB")
_OUTPUT_HEAD = struct.Struct(">IBIB")
#: ``LINES``: an ``OUTPUT`` frame that also says how many of its first bytes
#: end with a newline (``whole``), so that a receiver may pass those on
#: without looking at them (plain output connections only).
LINES_HEAD = struct.Struct(">IBIBI")
_LINES_BODY = struct.Struct(">IBI")      # the part of LINES_HEAD in the body
#: ``STDIN`` rank meaning "every rank that reads stdin".
ALL_RANKS = 0xFFFFFFFF


class LinkError(ValueError):
    """Bytes on the link that do not follow the protocol."""


def encode(kind: int, body: Optional[Dict[str, Any]] = None) -> bytes:
    """One JSON frame."""
    data = b"" if body is None else dumps(body).encode("ascii")
    if len(data) + 1 > MAX_FRAME:
        raise LinkError(f"{NAMES.get(kind, kind)} frame of {len(data)} bytes is too large")
    return HEAD.pack(len(data) + 1, kind) + data


def encode_output(rank: int, stream: int, data) -> bytes:
    """One ``OUTPUT`` frame: ``stream`` 1 or 2 of ``rank``; empty data is end-of-stream."""
    return output_head(rank, stream, len(data)) + bytes(data)


def output_head(rank: int, stream: int, size: int) -> bytes:
    """The start of an ``OUTPUT`` frame whose ``size`` bytes of data follow it."""
    return _OUTPUT_HEAD.pack(size + 1 + RANK_STREAM.size, OUTPUT, rank, stream)


def lines_head(rank: int, stream: int, size: int, whole: int) -> bytes:
    """The start of a ``LINES`` frame whose ``size`` bytes of data follow it, the
    first ``whole`` of them ending with a newline (0: none does)."""
    return LINES_HEAD.pack(size + LINES_HEAD.size - 4, LINES, rank, stream, whole)


def decode_lines(body) -> Tuple[int, int, int, Any]:
    """``(rank, stream, whole, data)`` of a ``LINES`` body."""
    if len(body) < _LINES_BODY.size:
        raise LinkError("short LINES frame")
    rank, stream, whole = _LINES_BODY.unpack_from(body)
    data = body[_LINES_BODY.size:]
    if whole > len(data) or (whole and data[whole - 1:whole] != b"\n"):
        raise LinkError("LINES: its whole lines do not end where it says")
    return rank, stream, whole, data


def encode_stdin(rank: int, data: bytes) -> bytes:
    """One ``STDIN`` frame for ``rank`` (or :data:`ALL_RANKS`); empty data is end-of-file."""
    return HEAD.pack(len(data) + 1 + RANK_STREAM.size, STDIN) + \
        RANK_STREAM.pack(rank, 0) + data


def decode_binary(body: bytes) -> Tuple[int, int, bytes]:
    """``(rank, stream, data)`` of an ``OUTPUT`` or ``STDIN`` body."""
    if len(body) < RANK_STREAM.size:
        raise LinkError("short binary frame")
    rank, stream = RANK_STREAM.unpack_from(body)
    return rank, stream, body[RANK_STREAM.size:]


def decode_json(kind: int, body: bytes) -> Dict[str, Any]:
    """The JSON object of a frame body (an empty body is ``{}``)."""
    if not body:
        return {}
    try:
        value = loads(body.decode("ascii"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise LinkError(f"{NAMES.get(kind, kind)} frame is not valid JSON") from None
    if not isinstance(value, dict):
        raise LinkError(f"{NAMES.get(kind, kind)} frame is not a JSON object")
    return value


def check_head(buf, at: int = 0, max_frame: int = MAX_FRAME) -> Tuple[int, int]:
    """The ``(length, kind)`` of the frame head at ``buf[at:]``; LinkError if
    the length is out of range or the kind unknown."""
    length, kind = HEAD.unpack_from(buf, at)
    if length < 1 or length > max_frame:
        raise LinkError(f"frame length {length} out of range")
    if kind not in NAMES:
        raise LinkError(f"unknown frame kind {kind}")
    return length, kind


class Reader:
    """Cuts frames out of the bytes received so far.

    Bytes come in two ways: :meth:`feed` copies them in, or a receiver reads
    straight into :meth:`room` and says how many with :meth:`received`.  The
    latter hands ``OUTPUT`` and ``LINES`` bodies on as views into the buffer,
    valid only until the next read into it (the output path copies what it
    keeps); all other bodies are bytes.
    """

    def __init__(self, expect_sync: bool = False, max_frame: int = MAX_FRAME) -> None:
        self._mem = bytearray()
        self._start = 0          # the first byte not yet cut into a frame
        self._end = 0            # the end of the bytes received
        self.synced = not expect_sync
        self.preamble = b""          # what came before the sync mark
        self.max_frame = max_frame

    @property
    def buf(self) -> bytes:
        """The bytes received but not yet cut into frames."""
        return bytes(self._mem[self._start:self._end])

    def feed(self, data) -> List[Tuple[int, bytes]]:
        """Add received bytes; return the complete frames as ``(kind, body)``."""
        n = len(data)
        self.room(n)[:n] = data
        return [(kind, body if type(body) is bytes else bytes(body))
                for kind, body in self.received(n)]

    def adopt(self, buf: bytearray, n: int) -> List[Tuple[int, Any]]:
        """The frames of ``buf[:n]``, a buffer handed over for good: read in
        place unless part of a frame is still pending."""
        if self._start == self._end:
            self._mem, self._start, self._end = buf, 0, 0
        else:
            self.room(n)[:n] = memoryview(buf)[:n]
        return self.received(n)

    def room(self, want: int) -> memoryview:
        """Writable space for at least ``want`` more bytes: a view of the buffer.

        The buffer is replaced, never resized in place, so that a view still
        held somewhere cannot make this fail."""
        mem, pending = self._mem, self._end - self._start
        if len(mem) - self._end < want:
            if pending + want > len(mem):
                new = bytearray(max(pending + want, 2 * len(mem)))
                new[:pending] = memoryview(mem)[self._start:self._end]
                self._mem = new
            elif pending:
                view = memoryview(mem)
                view[:pending] = view[self._start:self._end]   # memmove: overlap is fine
            self._start, self._end = 0, pending
        return memoryview(self._mem)[self._end:]

    def received(self, n: int) -> List[Tuple[int, Any]]:
        """``n`` bytes were written into :meth:`room`: the frames now complete."""
        self._end += n
        mem = self._mem
        if not self.synced:
            at = mem.find(SYNC, self._start, self._end)
            if at < 0:
                if self._end - self._start > MAX_PREAMBLE + len(SYNC):
                    raise LinkError("no agent answered (the remote side printed "
                                    f"{self._end - self._start} bytes but never the "
                                    "link's start mark)")
                return []
            self.preamble = bytes(mem[self._start:at])
            self._start = at + len(SYNC)
            self.synced = True
        frames: List[Tuple[int, Any]] = []
        pos, end = self._start, self._end
        view = memoryview(mem)
        while end - pos >= HEAD.size:
            length, kind = check_head(mem, pos, self.max_frame)
            stop = pos + 4 + length
            if stop > end:
                break
            body = view[pos + HEAD.size:stop]
            frames.append((kind, body if kind in (OUTPUT, LINES) else bytes(body)))
            pos = stop
        if pos == end:
            pos = end = 0            # all cut: the next read starts at the front
            if len(mem) > KEEP:
                self._mem = bytearray()   # after a large frame
        self._start, self._end = pos, end
        return frames


def hello(frames: List[Tuple[int, bytes]], reader: Reader) -> Tuple[Dict[str, Any], bytes]:
    """An agent's first frames: its ``HELLO`` (LinkError unless it speaks this
    protocol), and the bytes after it, frames and all, for the link to read on."""
    kind, body = frames[0]
    greeting = decode_json(kind, body) if kind == HELLO else {}
    if kind != HELLO or greeting.get("protocol") != PROTOCOL:
        raise LinkError(f"the agent speaks another protocol "
                        f"({str(greeting.get('protocol'))[:10]}, expected {PROTOCOL})")
    rest = b"".join(HEAD.pack(len(b) + 1, k) + b for k, b in frames[1:])
    return greeting, rest + bytes(reader.buf)


def field(body: Dict[str, Any], name: str, kind: type, what: str = "") -> Any:
    """``body[name]`` checked to be of ``kind`` (``int`` excludes bool)."""
    value = body.get(name)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise LinkError(f"{what or 'frame'}: field {name!r} missing or not {kind.__name__}")
    return value


def optional(body: Dict[str, Any], name: str, kind: type, what: str = "") -> Any:
    return None if body.get(name) is None else field(body, name, kind, what)
