"""mslaunch's own output files, written without ever blocking the event loop.

* :class:`Terminal` -- one output file of mslaunch (its stdout, and its
  stderr when that is another file).  Writes go to a description of the
  file that mslaunch opened for itself in non-blocking mode (the caller's
  is never changed), and what the reader does not take yet waits in a
  bounded queue.  When the queue passes :data:`HIGH_WATER`, the sources
  writing to it are paused (they stop reading their rank's pipe, so the
  rank blocks, as in a shell pipeline) until it drains below
  :data:`LOW_WATER`.  The terminal also owns the "mid-line" state: a line
  left unfinished by one source is ended with a newline before another
  source writes, whichever of stdout and stderr they use, so lines of
  different ranks (and mslaunch's own messages) are never glued together.
  Whole lines of a remote host may instead be spliced into it unseen
  (``splice(2)``), one source at a time.
* :class:`Console` -- mslaunch's stdout and stderr, and its own messages.
* :func:`xml_element` -- the ``--xml`` form of a line (Open MPI's), for
  mslaunch's own lines and the ranks'.

The ranks' streams reach a terminal through :mod:`.output`.
"""

from __future__ import annotations

import errno
import os
import stat
import sys

from .loop import deque  # the C type, without the collections package (0.6 ms)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Deque, Optional, Set

    from .loop import Loop

from .loop import QueuedWriter

PIPE_SIZE = 1 << 20       # F_SETPIPE_SZ: a slow reader's pipe takes a burst in one write
HIGH_WATER = 8 << 20      # bytes queued for a terminal before its sources pause
LOW_WATER = 1 << 20       # ... and the level at which they resume
#: Seconds past a stopped job's grace period after which output that mslaunch's
#: reader has not taken is given up (a stopped job does not wait for it).
GIVE_UP_AFTER = 0.5

#: Errors meaning "nobody reads this any more": the output is dropped quietly.
_GONE = (errno.EPIPE, errno.EBADF, errno.EIO, errno.ENXIO, errno.ECONNRESET)


def _own_description(fd: int):
    """A way to write ``fd`` without blocking and without touching the caller's flags.

    Returns ``(fd, sock, flags)``: for a pipe, FIFO or terminal, a new
    non-blocking description of the same file (opened through /proc;
    O_NONBLOCK on the inherited one would change it for every process
    sharing it); for a socket, a duplicate written with ``MSG_DONTWAIT``;
    otherwise (regular files, which never wait for a reader) the descriptor
    itself.
    """
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return fd, None, 0
    if stat.S_ISFIFO(mode) or stat.S_ISCHR(mode):
        try:
            return os.open(f"/proc/self/fd/{fd}", os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC
                           | os.O_NOCTTY), None, 0
        except OSError as err:
            if err.errno == errno.ENXIO:   # a FIFO whose reader has gone
                return -1, None, 0
    elif stat.S_ISSOCK(mode):
        from ..core import socket
        try:
            sock = socket.socket(fileno=os.dup(fd))
            return sock.fileno(), sock, socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL
        except OSError:
            pass
    return fd, None, 0


def _same_file(a: int, b: int) -> bool:
    try:
        sa, sb = os.fstat(a), os.fstat(b)
    except OSError:
        return False
    return (sa.st_dev, sa.st_ino, sa.st_rdev) == (sb.st_dev, sb.st_ino, sb.st_rdev)


class Terminal(QueuedWriter):
    """One of mslaunch's own output files, written without ever blocking the loop."""

    high_water = HIGH_WATER
    low_water = LOW_WATER

    def __init__(self, fd: int, name: str) -> None:
        given = fd
        fd, sock, flags = _own_description(fd)
        super().__init__(None, fd)
        self._own = fd not in (given, -1)     # a descriptor of its own, for close()
        if sock is not None:
            self.sock, self.send_flags = sock, flags
        self.name = name
        self.open = self.fd >= 0
        self.error = ""                   # why it was closed, for a write error
        self.dropped = 0                  # bytes given up (stop requested, reader stalled)
        self.given_up = False
        self.owner: object = None         # the source whose line is unfinished
        self.latest: object = None        # the source of the last bytes written
        self.under_summary = False        # mslaunch's own summary is written here next
        try:
            pipe = self.open and sock is None and stat.S_ISFIFO(os.fstat(self.fd).st_mode)
        except OSError:
            pipe = False
        self._grow = pipe                 # grown once, when its reader falls behind
        # whether splice(2) may write into it (os.splice is Python 3.10's)
        self._splices = pipe and sys.version_info >= (3, 10)
        self._waiters: Set[object] = set()
        self.on_error: Optional[Callable[[Terminal], None]] = None
        self.splicing: object = None      # the source whose lines go in by splice(2)
        self._splice_waiter: Optional[Callable[[], None]] = None
        self._splice_turns: Deque[Callable[[], None]] = deque()
        self._turn: object = None         # the timer of the next source's turn

    # -- writing ------------------------------------------------------------
    @property
    def congested(self) -> bool:
        return self.queued > HIGH_WATER

    def write(self, source: object, data) -> None:
        """Queue ``data`` (bytes or a view valid only during the call) from ``source``."""
        if not data or not self.open:
            if self.given_up:
                self.dropped += len(data)
            return
        if self.owner is not None and self.owner is not source:
            data = b"\n" + bytes(data)
        self.owner = None if data[-1:] == b"\n" else source
        self.latest = source
        if self.queue or self.splicing is not None:
            self.hold(data)               # behind what waits, or the splice's until it ends
        elif self.put(data) and self._grow:
            self._grow_pipe()             # the file did not take it all at once

    def _grow_pipe(self) -> None:
        # The reader falls behind: a pipe of 1 MiB instead of 64 KiB takes a
        # burst in one write and lets it read in larger pieces.  Once only.
        self._grow = False
        try:
            import fcntl
            fcntl.fcntl(self.fd, 1031, PIPE_SIZE)  # F_SETPIPE_SZ
        except OSError:
            pass   # over the user's pipe allowance: keep the size it has

    def flush_some(self) -> None:
        """Write what the file takes now; called when it is writable."""
        if self.splicing is not None:
            # Nothing else goes in until the splice is done; it may go on now.
            waiter, self._splice_waiter = self._splice_waiter, None
            self._unregister()
            if waiter is not None:
                waiter()
            return
        super().flush_some()
        self._next_splice()

    # -- splicing ------------------------------------------------------------
    def begin_splice(self, source: object, lead: bytes) -> bool:
        """Hand the file to ``source`` for whole lines moved in around this
        process (``splice(2)`` from a socket), after ``lead``: its unfinished
        line, which they complete.  True if the file is a pipe with nothing
        queued and took ``lead`` whole; other sources' writes then queue
        until :meth:`end_splice`."""
        if not self.can_splice or self.queue or self.splicing is not None:
            return False
        if self.owner is not None and self.owner is not source:
            lead = b"\n" + lead
        if lead:
            if len(lead) > 4096:      # PIPE_BUF: a larger write could go in part
                return False
            try:
                os.write(self.fd, lead)   # up to PIPE_BUF a pipe takes all or nothing
            except BlockingIOError:
                return False
            except OSError as err:
                self._failed(err)
                return False
        self.owner = None
        self.splicing = self.latest = source
        return True

    @property
    def holding(self) -> bool:
        """Whether output waits for this file: queued, being spliced, or
        waiting for its turn to be."""
        return bool(self.queued or self.splicing is not None or self._splice_turns)

    @property
    def can_splice(self) -> bool:
        """Whether bytes may be spliced into the file at all (an open pipe)."""
        return self.open and self._splices and self.loop is not None

    @property
    def splice_busy(self) -> bool:
        """Whether a splice would have to wait for another (on, or next)."""
        return self.open and (self.splicing is not None or self._turn is not None)

    def wait_to_splice(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once no other splice is on (or the file is closed):
        sources take turns, in the order they asked."""
        self._splice_turns.append(callback)

    def _next_splice(self) -> None:
        # The turn is called on the loop's next round, not inside the caller
        # (a chain of hosts would nest), and held for it meanwhile.
        if self._splice_turns and not self.splice_busy and self.loop is not None:
            self._turn = self.loop.call_later(0, self._take_turn)

    def _take_turn(self) -> None:
        self._turn = None
        if self._splice_turns:
            self._splice_turns.popleft()()
        self._next_splice()

    def _closed_for_splices(self) -> None:
        # Those waiting, for their turn or for the pipe, learn that the file
        # is gone (on the loop's next round, not inside whatever closed it).
        waiter, self._splice_waiter = self._splice_waiter, None
        if waiter is not None and self.loop is not None:
            self.loop.call_later(0, waiter)
        self._next_splice()

    def splice_from(self, fd: int, count: int) -> int:
        """Move up to ``count`` bytes from ``fd`` (a socket) into the file, unseen;
        BlockingIOError when the socket is empty or the pipe full."""
        if sys.version_info < (3, 10):
            raise OSError(errno.ENOSYS, "os.splice needs Python 3.10")
        return os.splice(fd, self.fd, count, flags=os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK)

    def when_writable(self, callback: Callable[[], None]) -> None:
        """While splicing: call ``callback`` once the full pipe takes bytes again."""
        if self._grow:
            self._grow_pipe()
        self._splice_waiter = callback
        if not self._registered and self.loop is not None:
            self.loop.add_writer(self.fd, self.flush_some)
            self._registered = True

    def end_splice(self, whole: bool = True) -> None:
        """The splice is over: its last byte was a newline (``whole``), or it
        was cut short, and its line is left unfinished (the next source's
        bytes then start on a line of their own)."""
        if not whole and self.splicing is not None:
            self.owner = self.splicing
        self.splicing = None
        self._splice_waiter = None
        if not self.queue:
            self._unregister()
        self._await_writable()
        self._next_splice()

    def refuse_splices(self) -> None:
        """The file turned out not to take spliced bytes: no more are tried."""
        self._splices = False

    def writing_failed(self, err: OSError) -> None:
        """A write into the file by another way (a splice) failed."""
        self._failed(err)

    def _await_writable(self) -> None:
        if self._registered or not self.queue:
            return
        if self.loop is not None:
            try:
                super()._await_writable()
                return
            except OSError:
                pass   # not pollable: write with waits below
        self.wait_until_drained(None)

    def on_write_error(self, err: OSError) -> None:
        self._failed(err)

    def _failed(self, err: OSError) -> None:
        self.open = False
        self.discard()
        self._closed_for_splices()
        if err.errno not in _GONE:
            self.error = err.strerror or str(err)
            if self.on_error is not None:
                self.on_error(self)
        self._wake()

    # -- back-pressure ------------------------------------------------------
    def wait_for_room(self, source: object) -> None:
        """Remember a paused source; its ``resume()`` is called when there is room."""
        self._waiters.add(source)

    def on_low_water(self) -> None:
        self._wake()

    def _wake(self) -> None:
        if self._waiters:
            waiters, self._waiters = self._waiters, set()
            for source in waiters:
                source.resume()  # type: ignore[attr-defined]

    def give_up(self) -> None:
        """Drop what is queued, and what comes later (the job is being stopped
        and nobody reads)."""
        self.given_up = True
        self.splicing = None
        self.dropped += self.discard()
        self.open = False
        self._closed_for_splices()
        self._wake()

    def close(self) -> None:
        """Close the descriptor this terminal opened itself (the given one stays)."""
        if self._own:
            self._own = self.open = False
            if self.sock is not None:
                self.sock.close()
            else:
                os.close(self.fd)

    def wait_until_drained(self, deadline: Optional[float]) -> bool:
        """Block until the queue is written (or ``deadline``); outside the loop only."""
        if self.splicing is not None:
            self.end_splice(False)     # the loop has stopped: the splice will not go on
        return self.drain(deadline)


#: The source of :meth:`Console.status`'s lines (see :meth:`Terminal.write`).
_STATUS = object()


class Console:
    """mslaunch's stdout and stderr; one shared :class:`Terminal` when they are one file."""

    def __init__(self, out_fd: int = 1, err_fd: int = 2, owned: bool = False) -> None:
        # owned: the descriptors given are the console's to close (--xml-file's)
        self._given = sorted({out_fd, err_fd}) if owned else []
        self.out = Terminal(out_fd, "stdout")
        self.err = self.out if _same_file(out_fd, err_fd) else Terminal(err_fd, "stderr")
        self.err.under_summary = True
        self.loop: Optional[Loop] = None
        self.xml = False          # --xml: mslaunch's own lines become <stderr> elements

    def terminal(self, stream: int) -> Terminal:
        return self.out if stream == 1 else self.err

    def terminals(self):
        return (self.out,) if self.err is self.out else (self.out, self.err)

    def attach(self, loop: Optional[Loop], on_error: Optional[Callable[[Terminal], None]] = None) -> None:
        """Write through ``loop`` from now on (None: back to waiting writes)."""
        for t in self.terminals():
            t._unregister()
            t.loop = loop
            t.on_error = on_error
            t._await_writable()

    def write(self, stream: int, source: object, data) -> None:
        self.terminal(stream).write(source, data)

    def is_open(self, stream: int) -> bool:
        return self.terminal(stream).open

    def message(self, text: str) -> None:
        """A line of mslaunch's own on stderr, kept apart from rank lines."""
        data = text.encode("utf-8", "replace")
        if self.xml:
            fmt = xml_element("stderr", None)
            data = b"".join(fmt(line, True) for line in data.split(b"\n"))
            self.out.write(self, data)
            return
        data += b"\n"
        if not self.err.open and self.out.open and self.err.error:
            self.out.write(self, data)
            return
        self.err.write(self, data)

    def status(self, text: str) -> None:
        """A line of mslaunch's own that the next one replaces: on a terminal,
        rewritten in place (``""`` clears it); elsewhere a line each time."""
        if not self.status_in_place():
            if text:
                self.message(text)
            return
        self.err.write(_STATUS, b"\r\x1b[K" + text.encode("utf-8", "replace"))
        if not text and self.err.owner is _STATUS:
            self.err.owner = None       # (the line is empty: the next starts there)

    def status_in_place(self) -> bool:
        """Whether :meth:`status` rewrites a line of a terminal."""
        try:
            return not self.xml and self.err.open and os.isatty(self.err.fd)
        except (OSError, AttributeError):
            return False

    @property
    def pending(self) -> bool:
        """Whether output waits for a terminal: queued, or being spliced, or
        left in a socket until a splice's turn."""
        return any(t.holding for t in self.terminals())

    def give_up(self) -> None:
        """Drop all output held for a terminal, and what comes for it later."""
        for t in self.terminals():
            if t.holding:
                t.give_up()

    @property
    def dropped(self) -> int:
        """Bytes of output given up."""
        return sum(t.dropped for t in self.terminals())

    def drain(self, deadline: Optional[float]) -> bool:
        ok = True
        for t in self.terminals():
            ok = t.wait_until_drained(deadline) and ok
        return ok

    def close(self) -> None:
        """Once the job's last line is written: close the descriptors the console
        opened (a process that runs jobs one after another keeps none of them)."""
        for t in self.terminals():
            t.close()
        for fd in self._given:
            os.close(fd)
        self._given = []


def xml_escape(data: bytes) -> bytes:
    """Open MPI's escaping in ``--xml`` output: entities, and ``&#NNN;`` for other bytes."""
    out = bytearray()
    for b in data:
        if b == 0x26:
            out += b"&amp;"
        elif b == 0x3C:
            out += b"&lt;"
        elif b == 0x3E:
            out += b"&gt;"
        elif b < 32 or b > 126:
            out += b"&#%03d;" % b
        else:
            out.append(b)
    return bytes(out)


def xml_element(stream: str, rank: Optional[int]) -> Callable[[bytes, bool], bytes]:
    """The formatter of ``--xml``: one ``<stdout rank="N">...</stdout>`` element per line."""
    attr = b"" if rank is None else b' rank="%d"' % rank
    tag = stream.encode()

    def fmt(line: bytes, complete: bool) -> bytes:
        body = xml_escape(line + (b"\n" if complete else b""))
        return b"<" + tag + attr + b">" + body + b"</" + tag + b">" + (b"\n" if complete else b"")
    return fmt
