"""An agent's plain output connection, its whole lines spliced to mslaunch's stdout.

On a plain TCP output connection the agent sends ``LINES`` frames: output
that also says how many of its first bytes end with a newline.  When a
rank's stream goes to mslaunch's stdout (or stderr) unchanged -- a pipe, no
rank file, no prefixes, no tail kept for the failure summary -- those bytes
move from the socket into the pipe with ``splice(2)``: the kernel hands the
received pages on, and this process neither copies nor sees them.  The rest
of such a frame (an unfinished last line), and every other frame, is read
into a buffer and handed on as ``OUTPUT``, as on any other link.

While a frame is being spliced the terminal is its own (other sources'
output queues), so lines never mix, and a full pipe leaves the rest of the
frame in the socket, which holds the agent back as a full queue would.  The
agent is trusted to say where its lines end: it is the peer that presented
this job's token, and a wrong count could misplace a line end, not lose a
byte.
"""

from __future__ import annotations

import errno
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Optional, Protocol, Tuple

    from ..machine.loop import Loop, Timer
    from ..machine.output import RankOutput
    from ..machine.terminal import Terminal

    class OutputOwner(Protocol):
        """Where spliced frames' ranks have their sinks (a remote host's handle)."""

        def output_sink(self, rank: int, stream: int) -> RankOutput: ...

        def output_taken(self, sink: RankOutput, count: int) -> None: ...

from ..machine.loop import wait_fd
from . import link
from .endpoint import SocketEndpoint

_HEAD = link.HEAD.size           # length and kind
_LINES = link.LINES_HEAD.size    # ... and rank, stream, whole
#: Seconds a splice waits for the rest of its frame before it gives the
#: terminal back and reads that rest the ordinary way.
STALL_SECONDS = 0.2


class SplicingEndpoint(SocketEndpoint):
    """See the module docstring; frames are read head first, one at a time."""

    def __init__(self, loop: Loop, sock, *, host: OutputOwner, **kw) -> None:
        self.host = host
        self._head = bytearray(_LINES)
        self._got = 0                  # bytes of the head read
        self._need = _HEAD             # bytes of head wanted now
        self._body = bytearray()       # grown to the largest body read
        self._at = -1                  # where the body's next byte goes; -1: reading a head
        self._end = 0
        self._kind = 0                 # the kind handed on with the body
        self._left = 0                 # bytes still to splice
        self._sink: Optional[RankOutput] = None
        self._term: Optional[Terminal] = None
        self._lines: Tuple[int, int, int, int] = (0, 0, 0, 0)   # rank, stream, whole, size
        self._parked = False           # for the terminal, the frame's body unread
        self._early = bytearray()      # bytes that came with the token, read first
        self._stall: Optional[Timer] = None
        super().__init__(loop, sock, **kw)

    def deliver(self, data: bytes) -> None:
        """Bytes of the connection read before it was handed over (with the token)."""
        self._early += data
        self._on_readable()

    def _on_readable(self) -> None:
        try:
            while (not self.closed and not self._parked
                   and (self._splice() if self._left else self._read())):
                pass
        except link.LinkError as err:
            self.close(f"protocol error: {err}")
        except OSError as err:
            self.close(f"link read failed: {err.strerror or err}")

    def _recv(self, view) -> int:
        """Bytes read into ``view``; 0 if none yet; closes the link at end-of-file."""
        if self._early:
            n = min(len(view), len(self._early))
            view[:n] = self._early[:n]
            del self._early[:n]
            return n
        try:
            n = self.sock.recv_into(view)
        except (BlockingIOError, InterruptedError):
            return 0
        if not n:
            self.close("the link reached end-of-file")
        self.last_heard = time.monotonic()
        return n

    # -- reading ---------------------------------------------------------------
    def _read(self) -> bool:
        """Read on; False when nothing more is there now."""
        if self._at < 0:
            n = self._recv(memoryview(self._head)[self._got:self._need])
            if not n:
                return False
            self._got += n
            if self._got == self._need:
                self._head_done()
            return True
        n = self._recv(memoryview(self._body)[self._at:self._end])
        if not n:
            return False
        self._at += n
        if self._at == self._end:
            self._body_done()
        return True

    def _head_done(self) -> None:
        length, kind = link.check_head(self._head)
        if self._need == _HEAD:
            if kind == link.LINES:
                if length < _LINES - 4:
                    raise link.LinkError("short LINES frame")
                self._need = _LINES
                return
            self._expect(kind, length - 1)
            return
        _, _, rank, stream, whole = link.LINES_HEAD.unpack(self._head)
        size = length - (_LINES - 4)
        if whole > size:
            raise link.LinkError("LINES: more whole bytes than bytes")
        self._lines = (rank, stream, whole, size)
        self._begin()

    def _begin(self) -> None:
        """Splice the whole lines of the ``LINES`` frame whose head was read, or
        read it as bytes; or, while the terminal is busy, wait for a turn with
        the frame left in the socket (copying it out would cost more)."""
        rank, stream, whole, size = self._lines
        sink = self.host.output_sink(rank, stream)
        # (bytes that came with the token cannot be spliced: read, then)
        term = sink.splice_terminal() if whole and not self._early else None
        if term is not None and term.splice_busy:
            self._parked = True
            self.loop.remove_reader(self.read_fd)
            term.wait_to_splice(self._turn)
            return
        if term is not None and term.begin_splice(sink, sink.pending):
            sink.pending = b""
            self._sink, self._term, self._left = sink, term, whole
            return
        self._expect(link.OUTPUT, size, (rank, stream))

    def _turn(self) -> None:
        if self.closed or not self._parked:
            return
        self._parked = False
        self.loop.add_reader(self.read_fd, self._on_readable)
        try:
            self._begin()
        except link.LinkError as err:
            self.close(f"protocol error: {err}")
            return
        if not self._parked:
            self._on_readable()

    def _expect(self, kind: int, size: int, rank_stream: Optional[Tuple[int, int]] = None) -> None:
        """Read a body of ``size`` bytes next; with ``rank_stream``, laid out as
        an ``OUTPUT`` body (LINES data read whole, or the rest of a splice)."""
        start = link.RANK_STREAM.size if rank_stream else 0
        if len(self._body) < start + size:
            self._body = bytearray(max(start + size, 2 * len(self._body), 4096))
        if rank_stream:
            link.RANK_STREAM.pack_into(self._body, 0, *rank_stream)
        self._kind, self._at, self._end = kind, start, start + size
        if not size:
            self._body_done()

    def _body_done(self) -> None:
        body = memoryview(self._body)[:self._end]
        kind = self._kind
        self._at, self._got, self._need = -1, 0, _HEAD
        self._dispatch([(kind, body if kind == link.OUTPUT else bytes(body))])
        del body
        if len(self._body) > link.KEEP:
            self._body = bytearray()

    # -- splicing --------------------------------------------------------------
    def _splice(self) -> bool:
        """Splice on; False when neither the socket nor the pipe can go on now."""
        term, sink = self._term, self._sink
        assert term is not None and sink is not None
        if term.splicing is not sink or not term.open:
            self._read_rest()    # the terminal was closed or given up meanwhile
            return True
        try:
            n = term.splice_from(self.read_fd, self._left)
        except (BlockingIOError, InterruptedError):
            if wait_fd(self.read_fd, False, 0):
                # Bytes are waiting, so the pipe is full: wait for its reader
                # and leave the rest in the socket meanwhile.
                self.loop.remove_reader(self.read_fd)
                term.when_writable(self._pipe_writable)
            elif self._stall is None:
                # The rest of the frame is late: others must not wait on this
                # connection for long (their lines then start a line of their own).
                self._stall = self.loop.call_later(STALL_SECONDS, self._stalled)
            return False
        except OSError as err:
            if err.errno == errno.EPIPE:
                term.writing_failed(err)          # the reader has gone: the rest is dropped
            elif err.errno in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                term.refuse_splices()             # this file cannot take them after all
            else:
                raise                             # the connection's trouble
            self._read_rest()
            return True
        if not n:
            self.close("the link reached end-of-file")
            return False
        self._no_stall()
        self.last_heard = time.monotonic()
        self._left -= n
        sink.written += n
        self.host.output_taken(sink, n)
        if not self._left:
            term.end_splice()
            self._sink, self._term = None, None
            rank, stream, whole, size = self._lines
            if size > whole:
                self._expect(link.OUTPUT, size - whole, (rank, stream))
            else:
                self._at, self._got, self._need = -1, 0, _HEAD
        return True

    def _read_rest(self) -> None:
        """The rest of the frame is read as bytes instead, and handed on as
        ``OUTPUT``: the sink writes them the ordinary way, or drops them."""
        self._let_go()
        rank, stream, whole, size = self._lines
        left, self._left = self._left, 0
        self._expect(link.OUTPUT, left + size - whole, (rank, stream))

    def _let_go(self) -> None:
        """Give the terminal back before the frame's whole lines are all in: the
        line in progress counts as unfinished there."""
        self._no_stall()
        if self._term is not None and self._term.splicing is self._sink:
            self._term.end_splice(whole=False)
        self._term = self._sink = None

    def _stalled(self) -> None:
        self._stall = None
        if self._left and not self.closed:
            self._read_rest()

    def _no_stall(self) -> None:
        if self._stall is not None:
            self._stall.cancel()
            self._stall = None

    def _pipe_writable(self) -> None:
        if not self.closed:
            self.loop.add_reader(self.read_fd, self._on_readable)
            self._on_readable()

    def close(self, reason: str = "") -> None:
        self._let_go()
        super().close(reason)
