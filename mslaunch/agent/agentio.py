"""An agent's streams: its ranks' output to the launcher, the launcher's stdin to its ranks.

Output goes out in ``OUTPUT`` (or ``LINES``) frames, on the link itself or
on a connection of its own (see :mod:`mslaunch.wire.dialback`), only within the credit
the launcher grants (:class:`Outflow`); each rank stream is a
:class:`LinkOutput` sink of :class:`~mslaunch.machine.local.LocalRanks`.
``STDIN`` frames are written to the ranks' stdin pipes by a
:class:`StdinRelay`, which tells the launcher how much each rank took.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, Optional, Set

    from ..machine.loop import Loop, Timer
    from ..wire.endpoint import Endpoint

from ..machine.loop import bind
from ..machine.output import last_newline
from ..wire import frames, link

#: Output of a rank is gathered for up to this long, or this many bytes,
#: before it goes out as one frame: a rank writing many small lines would
#: otherwise cost a frame (and a terminal write at the launcher) per line.
GATHER_SECONDS = 0.002
GATHER_BYTES = 256 << 10


class Outflow:
    """Where the ranks' output goes, and the credit the launcher has granted for it."""

    def __init__(self, loop: Loop, end: Endpoint) -> None:
        self.loop = loop
        self.link = end                 # the link itself, or a connection of its own
        self.lines = False              # output as LINES frames (see LinkOutput._send)
        self.credit = 0
        self.waiting: Set[object] = set()

    def grant(self, nbytes: int) -> None:
        """More credit (a ``CREDIT`` frame): the sources waiting for room read again."""
        self.credit += nbytes
        if self.credit > 0 and self.waiting:
            waiting, self.waiting = self.waiting, set()
            for source in waiting:
                source.resume()  # type: ignore[attr-defined]


class LinkOutput:
    """A rank stream whose bytes go to the launcher in ``OUTPUT`` frames
    (a :class:`~mslaunch.machine.output.RankSink`, as the launcher's
    :class:`~mslaunch.machine.output.RankOutput` is)."""

    terminal = None
    tail = b""

    def __init__(self, flow: Outflow, rank: int, stream: int) -> None:
        self.flow = flow
        self.rank = rank
        self.stream = stream
        self.pending = b""
        self.finished = False
        self.gathered = bytearray()
        self.timer: Optional[Timer] = None

    @property
    def wanted(self) -> bool:
        return not self.flow.link.closed

    @property
    def congested(self) -> bool:
        return self.flow.credit - len(self.gathered) <= 0

    def wait_for_room(self, source: object) -> None:
        self.flow.waiting.add(source)

    def feed(self, data) -> None:
        if not self.gathered and len(data) >= GATHER_BYTES:
            # A large read goes out as it is, its header written in front of
            # the view rather than both copied into one frame.
            self._send(data)
            return
        self.gathered += data
        if len(self.gathered) >= GATHER_BYTES:
            self.flush()
        elif self.timer is None:
            self.timer = self.flow.loop.call_later(GATHER_SECONDS, self.flush)

    def flush(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.gathered:
            data, self.gathered = self.gathered, bytearray()
            self._send(data)

    def _send(self, data) -> None:
        flow = self.flow
        flow.credit -= len(data)
        if flow.lines:
            # A plain connection of its own: say where the whole lines end,
            # so the launcher can splice them to its stdout unseen.
            head = link.lines_head(self.rank, self.stream, len(data), last_newline(data) + 1)
        else:
            head = link.output_head(self.rank, self.stream, len(data))
        if type(data) is bytearray:      # gathered: one piece (one TLS record, not two)
            flow.link.send(head + data)     # bytes + bytearray: bytes
        else:
            flow.link.send_parts((head, data))

    def finish(self) -> None:
        if not self.finished:
            self.finished = True
            self.flush()
            self.flow.link.send(link.encode_output(self.rank, self.stream, b""))


class StdinRelay:
    """The launcher's stdin, from ``STDIN`` frames, to the ranks here that read it."""

    def __init__(self, loop: Loop, end: Endpoint) -> None:
        self.loop = loop
        self.end = end                  # the link: CREDIT frames go back on it
        self.pipes: Dict[int, int] = {}     # the ranks' stdin pipes, by rank
        self.queues: Dict[int, bytearray] = {}
        self.eof: Set[int] = set()

    def attach(self, pipes: Dict[int, int]) -> None:
        """The started ranks' stdin pipes (:attr:`LocalRanks.stdin_pipes`, kept as it is)."""
        self.pipes = pipes
        for rank, fd in pipes.items():
            os.set_blocking(fd, False)
            self.queues[rank] = bytearray()

    def feed(self, rank: int, data: bytes) -> None:
        """Bytes for ``rank`` (or every rank); empty: the end of the input."""
        targets = list(self.queues) if rank == link.ALL_RANKS else [rank]
        for r in targets:
            if r not in self.queues:
                continue
            if data:
                self.queues[r] += data
            else:
                self.eof.add(r)
            self.flush(r)

    def flush(self, rank: int) -> None:
        queue = self.queues.get(rank)
        fd: Optional[int] = self.pipes.get(rank)
        if queue is None or fd is None:
            return
        wrote = 0
        try:
            while wrote < len(queue):
                wrote += os.write(fd, queue[wrote:])
        except BlockingIOError:
            self.loop.add_writer(fd, bind(self.flush, rank))
        except OSError:
            self.drop(rank)     # the rank closed its stdin
            return
        finally:
            if wrote:
                del queue[:wrote]
                # Tell the launcher how much was taken: it sends more only then.
                self.end.send(frames.encode(frames.StdinTaken(rank=rank, stdin=wrote)))
        if not queue:
            self.loop.remove_writer(fd)
            if rank in self.eof:
                self.drop(rank)

    def drop(self, rank: int) -> None:
        """No more input for ``rank`` (it ended, or closed its stdin): close its pipe."""
        fd = self.pipes.pop(rank, None)
        self.queues.pop(rank, None)
        self.eof.discard(rank)
        if fd is not None:
            self.loop.forget(fd)
            os.close(fd)
