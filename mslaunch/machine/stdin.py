"""The launcher's stdin, copied to the ranks that read it.

Input, not output, though fed much the same way: :class:`StdinFanout`
reads the launcher's stdin on the event loop and pushes each chunk to
every sink (a local rank's pipe, :class:`PipeStdin`, or a remote host's
stand-in); a sink's pipe is written without blocking, from a queue
(:class:`~.loop.QueuedWriter`).  A terminal is read only while mslaunch's
job is the terminal's foreground one: run with ``&``, it waits for ``fg``
instead of being stopped by the terminal (SIGTTIN) when the shell's next
command is typed, as Open MPI's mpirun waits.
Needed only when some rank reads stdin through a pipe: imported then.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Dict, Mapping, Protocol, Union

    from .loop import Loop

    class StdinSink(Protocol):
        """Where a rank's copy of the input goes: a local pipe (:class:`PipeStdin`)
        or a remote host's stand-in for its rank."""

        @property
        def backlog(self) -> int: ...
        def push(self, data: bytes) -> None: ...
        def finish(self) -> None: ...
        def close(self) -> None: ...

from .loop import QueuedWriter, bind

CHUNK = 1 << 20           # bytes of stdin read at once


class PipeStdin(QueuedWriter):
    """A local rank's stdin pipe, written without blocking from a queue.

    ``on_room`` is called whenever all it was given is written, ``on_gone``
    once that includes the end of the input, or when the rank stops reading
    (it closed its stdin, or exited).
    """

    loop: Loop

    def __init__(self, loop: Loop, fd: int, on_gone: Callable[[], None],
                 on_room: Callable[[], None]) -> None:
        super().__init__(loop, fd)
        self.eof = False
        self.gone = False               # a write failed: the rank reads no more
        self.on_gone = on_gone
        self.on_room = on_room
        os.set_blocking(fd, False)

    @property
    def backlog(self) -> int:
        return self.queued

    def push(self, data: bytes) -> None:
        if not self.put(data) and not self.gone:     # all written at once
            self.on_room()

    def finish(self) -> None:
        self.eof = True
        if not self.queue:
            self.on_gone()

    def on_empty(self) -> None:
        if self.eof:
            self.on_gone()
        else:
            self.on_room()

    def on_write_error(self, err: OSError) -> None:
        self.gone = True        # the rank closed its stdin (or exited): drop its copy
        self.on_gone()

    def close(self) -> None:
        if self.fd >= 0:
            self.discard()
            self.loop.forget(self.fd)
            os.close(self.fd)
            self.fd = -1


class StdinFanout:
    """Copies the launcher's stdin to every rank that reads it.

    Sinks are local pipes (:class:`PipeStdin`) or anything with the same
    ``push``/``finish``/``backlog``/``close``; reading stops while any sink
    holds more than :data:`LIMIT` bytes not yet taken, and goes on when it
    has room again or is dropped (a rank that exits without reading).
    """

    LIMIT = 1 << 20
    #: Seconds between looks at whether a terminal is this job's again (``fg``).
    FOREGROUND_LOOK = 0.25

    def __init__(self, loop: Loop, source_fd: int,
                 sinks: Mapping[int, Union[int, StdinSink]]) -> None:
        self.loop = loop
        self.source = source_fd
        self.sinks: Dict[int, StdinSink] = {}
        for rank, sink in sinks.items():
            if isinstance(sink, int):
                sink = PipeStdin(loop, sink, bind(self.drop, rank),
                                 self.resume_if_room)
            self.sinks[rank] = sink
        self.eof = False
        self.paused = False
        self.terminal = os.isatty(source_fd)
        self.waiting_fg = False
        try:
            loop.add_reader(source_fd, self._read)
            self.pollable = True
        except OSError:
            # A regular file or /dev/null cannot be polled (it is always
            # readable): read it from timers instead.
            self.pollable = False
            loop.call_later(0, self._read)

    def _read(self) -> None:
        if self.paused or self.eof or self.waiting_fg:
            return
        if self.terminal and self._in_background():
            self.waiting_fg = True
            self.loop.remove_reader(self.source)
            self.loop.call_later(self.FOREGROUND_LOOK, self._look_again)
            return
        try:
            data = os.read(self.source, CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data or not self.sinks:
            # End of input, or nobody left to read it.
            self.eof = True
            if self.pollable:
                self.loop.forget(self.source)
            for sink in list(self.sinks.values()):
                sink.finish()
            return
        for sink in list(self.sinks.values()):
            sink.push(data)
        if any(s.backlog > self.LIMIT for s in self.sinks.values()):
            self.paused = True                 # back-pressure until the ranks read
            if self.pollable:
                self.loop.remove_reader(self.source)
        elif not self.pollable:
            self.loop.call_later(0, self._read)

    def _in_background(self) -> bool:
        """Whether the terminal belongs to another process group: a read now
        would stop the whole launcher (SIGTTIN)."""
        try:
            return os.tcgetpgrp(self.source) != os.getpgrp()
        except OSError:
            return False         # no longer our controlling terminal: a read says so

    def _look_again(self) -> None:
        if self.eof:
            return
        if self._in_background():
            self.loop.call_later(self.FOREGROUND_LOOK, self._look_again)
            return
        self.waiting_fg = False
        if not self.paused:
            self.loop.add_reader(self.source, self._read)

    def resume_if_room(self) -> None:
        if self.paused and all(s.backlog <= self.LIMIT
                               for s in self.sinks.values()):
            self.paused = False
            if self.waiting_fg:
                return              # read again once in the foreground
            if self.pollable:
                self.loop.add_reader(self.source, self._read)
            else:
                self.loop.call_later(0, self._read)

    def drop(self, rank: int) -> None:
        sink = self.sinks.pop(rank, None)
        if sink is not None:
            sink.close()
        # The others may have been waiting for this rank's backlog.
        self.resume_if_room()

    def close(self) -> None:
        for rank in list(self.sinks):
            self.drop(rank)
        if not self.eof and self.pollable:
            self.loop.forget(self.source)
        self.eof = True
