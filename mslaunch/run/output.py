"""Relay of rank output to the terminal and to per-rank files.

Each rank stream is read in large chunks.  The bytes go unchanged to the
rank's file (when ``--output-filename`` is given); the terminal copy is cut
at line ends so that a line of one rank is never spliced into another's.  A
partial last line waits for its newline (or the stream's end), and when a
console stream was left mid-line by one source, a newline is put before the
next source's output.
"""

from __future__ import annotations

import errno
import os
import time
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Dict, Optional

from .loop import Loop

CHUNK = 1 << 20
PIPE_SIZE = 1 << 20       # F_SETPIPE_SZ: fewer wake-ups when ranks write a lot
MAX_PENDING = 1 << 20     # a "line" longer than this is passed on unfinished
TAIL = 4096               # bytes of stderr kept per rank for the failure summary

# One read buffer for all streams: the loop is single-threaded and each chunk
# is fully passed on before the next read, so no per-read allocation (and no
# page faults on a fresh megabyte) is needed.
_BUFFER = bytearray(CHUNK)


class Console:
    """The launcher's own stdout and stderr, shared by all rank streams."""

    def __init__(self, out_fd: int = 1, err_fd: int = 2) -> None:
        self._fds = {1: out_fd, 2: err_fd}
        self._open = {1: True, 2: True}
        self._midline: Dict[int, object] = {}

    def write(self, stream: int, source: object, data) -> None:
        if not data or not self._open[stream]:
            return
        owner = self._midline.get(stream)
        if owner is not None and owner is not source:
            data = b"\n" + data
        self._midline[stream] = None if data[-1:] == b"\n" else source
        fd = self._fds[stream]
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(fd, view):]
        except OSError as err:
            if err.errno not in (errno.EPIPE, errno.EBADF, errno.EIO):
                raise
            self._open[stream] = False   # the reader went away; files still get everything

    def is_open(self, stream: int) -> bool:
        return self._open[stream]

    def message(self, text: str) -> None:
        """A line of mslaunch's own on stderr, kept apart from rank lines."""
        self.write(2, self, text.encode("utf-8", "replace") + b"\n")


def line_prefix(rank: int, stream: str, *, tag: bool, timestamp: bool,
                rank_prefix: bool) -> Optional[Callable[[], bytes]]:
    """Return a function making the prefix of each terminal line, or None."""
    if tag:
        fixed = f"[1,{rank}]<{stream}>:".encode()
    elif rank_prefix:
        fixed = f"[{rank}] ".encode()
    else:
        fixed = b""
    if timestamp:
        return lambda: time.ctime().encode() + (fixed or f"<{stream}>:".encode())
    if fixed:
        return lambda: fixed
    return None


def _last_newline(data) -> int:
    if isinstance(data, memoryview) and data.obj is _BUFFER:
        return _BUFFER.rfind(b"\n", 0, len(data))   # no copy of the chunk
    return bytes(data).rfind(b"\n")


class RankStream:
    """One pipe of one rank: copied to a file and, line by line, to the console."""

    def __init__(self, loop: Loop, fd: int, *, stream: int, console: Optional[Console],
                 file_fd: Optional[int], prefix: Optional[Callable[[], bytes]],
                 keep_tail: bool) -> None:
        self.loop = loop
        self.fd = fd
        self.stream = stream
        self.console = console
        self.file_fd = file_fd
        self.prefix = prefix
        self.keep_tail = keep_tail
        self.tail = b""
        self.pending = b""
        self.closed = False
        try:
            import fcntl
            fcntl.fcntl(fd, 1031, PIPE_SIZE)  # F_SETPIPE_SZ
        except OSError:
            pass
        loop.add_reader(fd, self.on_readable)

    def _read(self) -> int:
        """Read one chunk into the shared buffer; 0 at end-of-file."""
        try:
            return os.readv(self.fd, [_BUFFER])
        except BlockingIOError:
            return -1
        except OSError:
            return 0

    def on_readable(self) -> None:
        n = self._read()
        if n == 0:
            self.close()
        elif n > 0:
            self.feed(memoryview(_BUFFER)[:n])
            if self.file_fd is None and self.console is not None \
                    and not self.console.is_open(self.stream):
                # Nobody reads mslaunch's output any more (``| head``) and
                # no file wants it: stop reading, so that the rank meets a
                # broken pipe as it would at the end of a shell pipeline.
                self.pending = b""
                self.close()

    def drain(self) -> None:
        """Read whatever is buffered without blocking, then close."""
        os.set_blocking(self.fd, False)
        while not self.closed:
            n = self._read()
            if n <= 0:
                break
            self.feed(memoryview(_BUFFER)[:n])
        self.close()

    def feed(self, data) -> None:
        """Pass on one chunk (bytes, or a view that is only valid during the call)."""
        n = len(data)
        if self.file_fd is not None:
            view = memoryview(data)
            while view:
                view = view[os.write(self.file_fd, view):]
        if self.keep_tail:
            self.tail = (self.tail + bytes(data[-TAIL:]))[-TAIL:]
        if self.console is None:
            return
        cut = _last_newline(data) + 1
        if cut == 0:
            if len(self.pending) + n < MAX_PENDING:
                self.pending += bytes(data)
                return
            cut = n            # an endless "line": pass it on unfinished
        if self.prefix is not None:
            whole = self.pending + bytes(data[:cut])
            self.pending = bytes(data[cut:])
            self._emit(whole)
            return
        # The partial line held back and the rest of it go out as two writes,
        # back to back: nothing else can come between them.
        if self.pending:
            self.console.write(self.stream, self, self.pending)
        self.pending = bytes(data[cut:])
        self.console.write(self.stream, self, data[:cut] if cut < n else data)

    def _emit(self, data) -> None:
        if self.prefix is not None:
            lines = bytes(data).split(b"\n")
            last = lines.pop()
            data = b"".join(self.prefix() + line + b"\n" for line in lines)
            if last:
                data += self.prefix() + last
        self.console.write(self.stream, self, data)  # type: ignore[union-attr]

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.loop.forget(self.fd)
        os.close(self.fd)
        if self.pending and self.console is not None:
            pending, self.pending = self.pending, b""
            self._emit(pending)
        if self.file_fd is not None:
            os.close(self.file_fd)
            self.file_fd = None


class StdinFanout:
    """Copies the launcher's stdin to every rank (``--stdin all``)."""

    LIMIT = 1 << 20

    def __init__(self, loop: Loop, source_fd: int, sinks: Dict[int, int]) -> None:
        self.loop = loop
        self.source = source_fd
        self.sinks = dict(sinks)          # rank -> write fd
        self.buffers: Dict[int, bytearray] = {r: bytearray() for r in sinks}
        self.eof = False
        self.paused = False
        for fd in self.sinks.values():
            os.set_blocking(fd, False)
        try:
            loop.add_reader(source_fd, self._read)
            self.pollable = True
        except OSError:
            # A regular file or /dev/null cannot be polled (it is always
            # readable): read it from timers instead.
            self.pollable = False
            loop.call_later(0, self._read)

    def _read(self) -> None:
        try:
            data = os.read(self.source, CHUNK)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.eof = True
            if self.pollable:
                self.loop.remove_reader(self.source)
        for rank in list(self.sinks):
            self.buffers[rank] += data
            self._flush(rank)
        if self.eof:
            return
        if any(len(b) > self.LIMIT for b in self.buffers.values()):
            self.paused = True                 # back-pressure until the ranks read
            if self.pollable:
                self.loop.remove_reader(self.source)
        elif not self.pollable:
            self.loop.call_later(0, self._read)

    def _resume(self) -> None:
        self.paused = False
        if self.pollable:
            self.loop.add_reader(self.source, self._read)
        else:
            self.loop.call_later(0, self._read)

    def _flush(self, rank: int) -> None:
        fd = self.sinks.get(rank)
        if fd is None:
            return
        buf = self.buffers[rank]
        try:
            while buf:
                del buf[:os.write(fd, buf)]
        except BlockingIOError:
            self.loop.add_writer(fd, lambda r=rank: self._flush(r))
            return
        except OSError:
            buf.clear()       # the rank closed its stdin: drop its copy
            self.drop(rank)
            return
        self.loop.remove_writer(fd)
        if self.eof:
            self.drop(rank)
        elif self.paused and all(len(b) <= self.LIMIT for b in self.buffers.values()):
            self._resume()

    def drop(self, rank: int) -> None:
        fd = self.sinks.pop(rank, None)
        if fd is not None:
            self.loop.forget(fd)
            os.close(fd)

    def close(self) -> None:
        for rank in list(self.sinks):
            self.drop(rank)
        if not self.eof and self.pollable:
            self.loop.forget(self.source)
