"""Relay of rank output to mslaunch's terminal and to per-rank files.

Two pieces, so that a remote agent can reuse the first one:

* :class:`RankOutput` -- one stream of one rank: the bytes go unchanged to
  the rank's file, and to the terminal (a :class:`~.terminal.Terminal`)
  cut at line ends.  A partial last line waits for its newline or the end
  of the stream; a line longer than :data:`LONG_LINE` is passed on in
  pieces (each piece still kept apart from other ranks' output by the
  terminal's rule).
* :class:`RankPipe` -- reads one pipe of a local rank on the event loop and
  feeds a :class:`RankOutput`.

:func:`rank_sinks` makes a rank's sinks as its job asks (files, prefixes,
``--xml``), and :func:`open_log` its files.
"""

from __future__ import annotations

import os
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Dict, List, Optional

    from ..core.spec import OutputSpec, RankSpec
    from typing import Protocol

    from .loop import Loop
    from .terminal import Console, Terminal

    class RankSink(Protocol):
        """Where a :class:`RankPipe` puts a rank's stream: a :class:`RankOutput`
        in the launcher, the agent's link (``remote.agentio.LinkOutput``) on a host."""

        pending: bytes               # an unfinished last line, held back

        @property
        def tail(self) -> bytes:
            """The end of the stream, for the failure summary."""

        @property
        def wanted(self) -> bool: ...

        @property
        def congested(self) -> bool: ...

        def wait_for_room(self, source: object) -> None: ...

        def feed(self, data) -> None: ...

        def finish(self) -> None: ...

CHUNK = 1 << 20
PIPE_SIZE = 1 << 20       # F_SETPIPE_SZ: fewer wake-ups when ranks write a lot
LONG_LINE = 1 << 20       # a "line" longer than this is passed on in pieces
# Bytes of stderr kept per rank for the failure summary: enough for a Python
# traceback through a deep library to still hold the user's own frame.
TAIL = 16384
# Bytes kept of every other stream: its last line for the live view (mslaunch-top),
# also for output written before the view first asked.
RECENT = 256

# One read buffer for all pipes: the loop is single-threaded and each chunk
# is fully passed on (or copied) before the next read.  Made by the first
# RankPipe, of FIRST bytes (a zeroed MiB costs 0.5 ms of page faults, which
# a job of quiet ranks never needs), and grown to CHUNK at the next read once
# one wake-up's reads fill it: a rank that writes fast.  A launcher whose
# ranks are all remote reads no pipe.
_BUFFER = bytearray()
_VIEW = memoryview(_BUFFER)
FIRST = 64 << 10
_GROW = [False]
REFILL = 64 << 10         # a pseudo-terminal is read again while this much room is left
PTY_READ = 4096           # what one read of a pseudo-terminal gives at most (N_TTY)


def line_prefix(rank: int, stream: str, *, tag: bool, timestamp: bool,
                rank_prefix: bool, jobid: int = 1) -> Optional[Callable[[], bytes]]:
    """Return a function making the prefix of each terminal line, or None."""
    if tag:
        fixed = f"[{jobid},{rank}]<{stream}>:".encode()
    elif rank_prefix:
        fixed = f"[{rank}] ".encode()
    else:
        fixed = b""
    if timestamp:
        return lambda: time.ctime().encode() + (fixed or f"<{stream}>:".encode())
    return fixed_prefix(fixed) if fixed else None


def fixed_prefix(fixed: bytes) -> Callable[[], bytes]:
    """A prefix function that always makes ``fixed``."""
    return lambda: fixed


def last_newline(data) -> int:
    """Where the last newline of ``data`` (bytes or a view) is; -1 if none."""
    if not isinstance(data, memoryview):
        return data.rfind(b"\n")
    if data.obj is _BUFFER:
        return _BUFFER.rfind(b"\n", 0, len(data))   # no copy of the chunk
    # Another view (a remote host's frame): look back from its end in
    # growing windows, copying about as much as the last line is long.
    end, size = len(data), 4096
    while end > 0:
        start = max(0, end - size)
        at = bytes(data[start:end]).rfind(b"\n")
        if at >= 0:
            return start + at
        end, size = start, size * 4
    return -1


class RankOutput:
    """One stream of one rank: every byte to its file, whole lines to the terminal."""

    def __init__(self, *, terminal: Optional[Terminal], file_fd: Optional[int],
                 prefix: Optional[Callable[[], bytes]], keep_tail: bool,
                 on_error: Optional[Callable[[str], None]] = None,
                 file_name: str = "", file_prefix: Optional[Callable[[], bytes]] = None,
                 formatter: Optional[Callable[[bytes, bool], bytes]] = None) -> None:
        self.terminal = terminal
        self.file_fd = file_fd
        self.file_name = file_name
        # Open MPI 4 writes --tag-output/--timestamp-output prefixes into the
        # rank files too; here once per line (it repeats them mid-line).
        self.file_prefix = file_prefix
        self._file_line_start = True
        self.formatter = formatter        # --xml: each line becomes an element
        self.prefix = prefix if formatter is None else (lambda: b"")
        self.keep_tail = keep_tail
        self.on_error = on_error
        self._tail = bytearray()
        self._recent = b""
        self.pending = b""
        self.finished = False
        self.written = 0
        # A stream given nowhere to go (torchrun's --local-ranks-filter leaves a
        # rank off the terminal, with no file) is read and dropped: only a
        # reader that leaves (``| head``) or a file that fails breaks its pipe.
        self.nowhere = terminal is None and file_fd is None

    def splice_terminal(self) -> Optional[Terminal]:
        """The terminal this stream's whole lines may be spliced into unseen, or
        None: a rank file, prefixes, ``--xml`` or a kept tail need the bytes."""
        term = self.terminal
        if (term is None or not term.can_splice or self.file_fd is not None
                or self.prefix is not None or self.keep_tail):
            return None
        return term

    @property
    def wanted(self) -> bool:
        """Whether anyone still takes this stream (a file, or an open terminal), or
        it was given nowhere to go."""
        return self.nowhere or self.file_fd is not None or (
            self.terminal is not None and self.terminal.open)

    @property
    def last_on_terminal(self) -> bool:
        """Whether this stream wrote the last lines of the file mslaunch's summary
        goes to (its tail is right above the summary)."""
        term = self.terminal
        return (term is not None and term.under_summary and term.open and not term.dropped
                and term.latest is self)

    @property
    def congested(self) -> bool:
        return self.terminal is not None and self.terminal.open and self.terminal.congested

    @property
    def tail(self) -> bytes:
        """The last :data:`TAIL` bytes of the stream (kept with ``keep_tail``; else, or
        before it, the last :data:`RECENT`)."""
        return bytes(self._tail[-TAIL:]) or self._recent

    def wait_for_room(self, source: object) -> None:
        """Call ``source.resume()`` once the terminal takes output again."""
        self.terminal.wait_for_room(source)  # type: ignore[union-attr]

    def feed(self, data) -> None:
        """Pass on one chunk (bytes, or a view that is only valid during the call)."""
        n = len(data)
        self.written += n
        if self.file_fd is not None:
            self._to_file(data)
        if self.keep_tail:
            self._tail += data[-TAIL:]
            if len(self._tail) > 2 * TAIL:       # trimmed now and then, not every time
                del self._tail[:-TAIL]
        else:
            self._recent = (self._recent + bytes(data[-RECENT:]))[-RECENT:]
        term = self.terminal
        if term is None:
            return
        if not term.open:
            term.write(self, data)        # counted, if given up
            return
        cut = last_newline(data) + 1
        if cut == 0:
            if len(self.pending) + n < LONG_LINE:
                self.pending += bytes(data)
                return
            cut = n            # an endless "line": pass it on unfinished
        if self.prefix is not None:
            whole = self.pending + bytes(data[:cut])
            self.pending = bytes(data[cut:])
            self._emit(whole)
            return
        # The partial line held back and the rest of it go out back to back:
        # nothing else can come between them.
        if self.pending:
            term.write(self, self.pending)
        self.pending = bytes(data[cut:])
        term.write(self, data[:cut] if cut < n else data)

    def _to_file(self, data) -> None:
        if self.file_prefix is not None:
            data = self._prefix_lines(bytes(data))
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self.file_fd, view):]  # type: ignore[arg-type]
        except OSError as err:
            fd, self.file_fd = self.file_fd, None
            try:
                os.close(fd)  # type: ignore[arg-type]
            except OSError:
                pass
            if self.on_error is not None:
                self.on_error(f"cannot write {self.file_name or 'a rank file'}: "
                              f"{err.strerror or err}")

    def _prefix_lines(self, data: bytes) -> bytes:
        lines = data.split(b"\n")
        out = []
        for i, line in enumerate(lines):
            last = i == len(lines) - 1
            if last and not line:
                break                        # the chunk ended with a newline
            if self._file_line_start or i:
                out.append(self.file_prefix())  # type: ignore[misc]
            out.append(line if last else line + b"\n")
        self._file_line_start = data.endswith(b"\n")
        return b"".join(out)

    def _emit(self, data) -> None:
        if self.formatter is not None:
            lines = bytes(data).split(b"\n")
            last = lines.pop()
            data = b"".join(self.formatter(line, True) for line in lines)
            if last:
                data += self.formatter(last, False)
        elif self.prefix is not None:
            lines = bytes(data).split(b"\n")
            last = lines.pop()
            data = b"".join(self.prefix() + line + b"\n" for line in lines)
            if last:
                data += self.prefix() + last
        self.terminal.write(self, data)  # type: ignore[union-attr]

    def finish(self) -> None:
        """End of the stream: pass on a partial last line and close the file."""
        if self.finished:
            return
        self.finished = True
        if self.pending and self.terminal is not None:
            pending, self.pending = self.pending, b""
            self._emit(pending)
        if self.file_fd is not None:
            os.close(self.file_fd)
            self.file_fd = None


class RankPipe:
    """Reads one output pipe of a local rank on the loop into a :class:`RankOutput`."""

    def __init__(self, loop: Loop, fd: int, sink: RankSink,
                 on_abandon: Optional[Callable[[], object]] = None) -> None:
        self.loop = loop
        self.fd = fd
        self.sink = sink
        # Called when nobody wants a pseudo-terminal's stream any more: its
        # writer would get EIO, not EPIPE, so it is told with a SIGPIPE instead.
        self.on_abandon = on_abandon
        global _BUFFER, _VIEW
        if not _BUFFER:
            _BUFFER = bytearray(FIRST)
            _VIEW = memoryview(_BUFFER)
        self.closed = False
        self.paused = False
        self.pty = os.isatty(fd)
        if self.pty:
            os.set_blocking(fd, False)     # our own master end: read until empty
        else:
            try:
                import fcntl
                fcntl.fcntl(fd, 1031, PIPE_SIZE)  # F_SETPIPE_SZ
            except OSError:
                pass
        loop.add_reader(fd, self.on_readable)

    @property
    def tail(self) -> bytes:
        return self.sink.tail

    def _read(self) -> int:
        """Fill the shared buffer with what is there; 0 at end-of-file, -1 if none yet.

        A pipe gives up to a whole chunk in one read, but a pseudo-terminal
        gives at most a few KiB (its line discipline's buffer), so reads are
        repeated until the descriptor is empty or the buffer nearly full:
        the chunk is then passed on once, not per few KiB.  End-of-file seen
        after some bytes is seen again by the next call.
        """
        global _BUFFER, _VIEW
        if _GROW[0]:                   # no view of the old buffer is held now
            _GROW[0] = False
            _BUFFER = bytearray(CHUNK)
            _VIEW = memoryview(_BUFFER)
        size = len(_BUFFER)
        room = REFILL if size == CHUNK else PTY_READ
        filled = 0
        n = -1
        while filled <= size - room:
            try:
                n = os.readv(self.fd, [_VIEW[filled:]])
            except (BlockingIOError, InterruptedError):
                n = -1
                break
            except OSError:
                n = 0   # EIO: a pseudo-terminal whose last writer has gone
            if n == 0:
                break
            filled += n
            if not self.pty:
                break
        if size < CHUNK and filled > size - room:
            _GROW[0] = True
        return filled if filled else (0 if n == 0 else -1)

    def on_readable(self) -> None:
        n = self._read()
        if n == 0:
            self.close()
        elif n > 0:
            self.sink.feed(_VIEW[:n])
            self._after_feed()

    def _after_feed(self) -> None:
        if not self.sink.wanted:
            self.abandon()
        elif self.sink.congested and not self.paused:
            self.paused = True
            self.loop.remove_reader(self.fd)
            self.sink.wait_for_room(self)

    def abandon(self) -> None:
        """Nobody reads this stream any more (``| head``) and no file wants it:
        stop reading, so that the rank meets a broken pipe as it would at the
        end of a shell pipeline."""
        if self.closed:
            return
        self.sink.pending = b""
        if self.pty and self.on_abandon is not None:
            self.on_abandon()     # before the close: no EIO is seen first
        self.close()

    def resume(self) -> None:
        if self.paused and not self.closed:
            self.paused = False
            self.loop.add_reader(self.fd, self.on_readable)

    def drain(self) -> bool:
        """Read what is buffered without waiting; True once end-of-file was seen."""
        if self.closed:
            return True
        os.set_blocking(self.fd, False)
        while not self.closed:
            n = self._read()
            if n < 0:
                return False
            if n == 0:
                break
            self.sink.feed(_VIEW[:n])
        self.close()
        return True

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.loop.forget(self.fd)
        os.close(self.fd)
        self.sink.finish()


# -- a rank's sinks and log files ------------------------------------------------

def rank_sinks(out: OutputSpec, spec: RankSpec, console: Console, restarts: int,
               limit: int, last_end: str, on_error: Callable[[str], None],
               marker: str = "", shared: Optional[Dict[str, int]] = None) -> List[RankOutput]:
    """The sinks of one rank: stdout (with stderr when merged), then stderr.

    ``restarts`` is how often the process was started again (msrun's recovery,
    at most ``limit``); its files are then appended to, after a marker line
    saying how the last run ended (``last_end``).  A ``marker`` given (a later
    attempt of the whole job) is that line.  A stream that Hydra's
    ``-outfile-pattern`` or ``-errfile-pattern`` sends to a file goes there
    alone, with the line prefix, through one description of the file per path
    for the whole job (``shared``, by path; the caller closes them)."""
    shown = out.copy_to_terminal if spec.console is None else spec.console
    terminal = console if shown else None
    opts = dict(tag=out.tag, timestamp=out.timestamp, rank_prefix=out.rank_prefix)
    label = (f"[{spec.label}] ".encode() if out.label_prefix and spec.label else None)
    marker = (f"mslaunch: restart {restarts} of {limit} of "
              f"{spec.label or 'rank ' + str(spec.rank)} (the previous run {last_end})\n"
              ) if restarts else marker
    from .terminal import xml_element
    sinks = []
    if spec.error_file is not None:
        _make_dir_of(spec.error_file)
    pattern = _pattern_prefix(out, spec)
    for stream, name, path in ((1, "stdout", spec.stdout_path), (2, "stderr", spec.stderr_path)):
        if stream == 2 and out.merge_stderr:
            break
        prefix = fixed_prefix(label) if label else fixed_prefix(pattern) if pattern else \
            line_prefix(spec.rank, name, jobid=spec.job, **opts)
        file_prefix = line_prefix(spec.rank, name, tag=out.tag, timestamp=out.timestamp,
                                  rank_prefix=False, jobid=spec.job)
        shown_here = terminal
        if spec.streams is not None:        # (torchrun's -r, -t, --local-ranks-filter)
            given = spec.streams[stream - 1]
            shown_here = console if given is not None else None
            prefix = fixed_prefix(given) if given else None
        hydra_file = path is not None and (out.stdout_pattern, out.stderr_pattern)[stream - 1]
        if hydra_file:
            shown_here, file_prefix = None, prefix
        sinks.append(RankOutput(
            # --xml: one document, on stdout
            terminal=shown_here.terminal(1 if out.xml else stream) if shown_here else None,
            # (torchrun's files are the attempt's own: no marker line)
            file_fd=_open_shared(path, shared) if hydra_file else  # type: ignore[arg-type]
            open_log(path, marker if spec.streams is None else ""),
            file_name=path or "", prefix=prefix, file_prefix=file_prefix,
            formatter=xml_element(name, spec.rank) if out.xml else None,
            keep_tail=(stream == 2 or out.merge_stderr), on_error=on_error))
    return sinks


def _pattern_prefix(out: OutputSpec, spec: RankSpec) -> bytes:
    """A rank's line prefix by Hydra's ``-prepend-pattern`` (empty without one)."""
    if not out.prefix_pattern:
        return b""
    from ..plan.patterns import expand
    return expand(out.prefix_pattern, rank=spec.rank, host=spec.host.name,
                  node=spec.host.node_id, job=spec.job).encode("utf-8", "surrogateescape")


def _open_shared(path: str, shared: Optional[Dict[str, int]]) -> int:
    """A descriptor of the file at ``path``, made new the first time the job names
    it and shared after that (Hydra sends every stream that names one file there)."""
    if shared is None:
        return _open_pattern_file(path)
    if path not in shared:
        shared[path] = _open_pattern_file(path)
    return os.dup(shared[path])


def _open_pattern_file(path: str) -> int:
    """A file Hydra's patterns name: a device or FIFO that is there (``/dev/null``)
    written as it is, else the rank file :func:`open_log` makes."""
    import stat
    try:
        if not stat.S_ISREG(os.stat(path).st_mode) and not os.path.isdir(path):
            # (not blocking to open: a FIFO nobody reads fails, not hangs, the launch)
            fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC | os.O_NONBLOCK)
            os.set_blocking(fd, True)
            return fd
    except OSError:
        pass
    return open_log(path)  # type: ignore[return-value]


def _make_dir_of(path: str) -> None:
    """The directory of ``path``, made if missing, where no other user may put
    anything of theirs (:func:`~.osfiles.check_dirs`)."""
    from .osfiles import check_dirs
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        check_dirs(os.path.dirname(path))
    except OSError as err:
        from ..core.errors import LaunchError
        where = f" ({err.filename})" if err.filename else ""
        raise LaunchError(f"cannot use the directory of {path}: {err.strerror}{where}") \
            from None


def open_log(path: Optional[str], marker: str = "") -> Optional[int]:
    """A rank's output file, new -- or, with a ``marker`` (a process started
    again), appended to after that line."""
    if path is None:
        return None
    from .osfiles import open_own
    _make_dir_of(path)
    try:
        fd = open_own(path, append=bool(marker))
        if marker:
            # Its own line, even when the last run ended mid-line.
            size = os.fstat(fd).st_size
            lead = b"\n" if size and os.pread(fd, 1, size - 1) != b"\n" else b""
            os.write(fd, lead + marker.encode())
        return fd
    except OSError as err:
        from ..core.errors import LaunchError
        raise LaunchError(f"cannot create output file: {err.filename}: {err.strerror}") \
            from None
