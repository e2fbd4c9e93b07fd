"""One end of a control link on the event loop: frames in, frames out, heartbeats.

Both the launcher (one endpoint per remote host) and the agent use it.
Writes never block the loop: what the peer does not take yet is queued
(:class:`~..machine.loop.QueuedWriter`).
Every frame received counts as a sign of life; a :data:`~mslaunch.wire.link.BEAT` frame
is sent every ``interval`` seconds, and a peer silent for ``misses``
intervals is declared lost -- the only way to notice a network partition,
which sends no end-of-file.
"""

from __future__ import annotations

import errno
import os
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Deque, List, Optional, Tuple

    from ..machine.loop import Loop, Timer

from ..machine.loop import QueuedWriter, deque
from ..core.switches import heartbeat
from . import link

#: Seconds between heartbeats, and how many may be missed before the peer
#: counts as lost (override with MSLAUNCH_HEARTBEAT="interval,misses").
HEARTBEAT = (1.0, 5)
#: The same for a job run with --max-restarts, where a lost host costs an attempt
#: only if it is noticed late: 1.8 s of silence (see docs/guides/long-jobs.md).
RESTART_HEARTBEAT = (0.3, 6)
#: Seconds of silence a peer that said it stops (a Ctrl-Z of the launcher) is
#: given: should it never come back (its machine gone meanwhile), what it left
#: stopped does not wait for ever.
PAUSED_PATIENCE = 24 * 3600.0
#: Bytes read per wake-up at first, and at most (doubling while reads fill it).
FIRST_READ = 16 << 10
MOST_READ = 1 << 20
#: Decrypted bytes an inbound TLS connection's thread holds for the loop at most.
BACKLOG = 16 << 20
#: Seconds between an idle decrypting thread's looks at whether it should stop.
IDLE_CHECK = 5.0


def heartbeat_setting(text: Optional[str],
                      default: Tuple[float, int] = HEARTBEAT) -> Tuple[float, int]:
    """``MSLAUNCH_HEARTBEAT`` parsed (see :func:`~mslaunch.core.switches.heartbeat`), or
    ``default`` when unset."""
    given = heartbeat(text)
    if given is None:
        return default
    return given[0], default[1] if given[1] is None else given[1]


class Endpoint(QueuedWriter):
    """Frames over a pair of non-blocking descriptors (the same one twice for a socket)."""

    loop: Loop

    def __init__(self, loop: Loop, read_fd: int, write_fd: int, *,
                 on_frame: Callable[[int, bytes], None], on_closed: Callable[[str], None],
                 expect_sync: bool = False) -> None:
        super().__init__(loop, write_fd)
        self.read_fd = read_fd
        self.write_fd = write_fd
        self.on_frame = on_frame
        self.on_closed = on_closed
        self.reader = link.Reader(expect_sync=expect_sync)
        self._want = FIRST_READ
        self.closed = False
        self.last_heard = time.monotonic()
        self._beat: Optional[Timer] = None
        self._watch: Optional[Timer] = None
        self.interval, self.misses = HEARTBEAT
        self.limit = self.interval * self.misses      # seconds of silence that lose the peer
        self.paused = False
        self._later = False        # a write error closes the link at the next turn
        #: What to tell a peer found silent before the link is closed (its bytes).
        self.farewell: Optional[Callable[[float], bytes]] = None
        for fd in {read_fd, write_fd}:
            os.set_blocking(fd, False)
        loop.add_reader(read_fd, self._on_readable)

    # -- heartbeats ---------------------------------------------------------
    def start_heartbeat(self, interval: float, misses: int,
                        patience: Optional[float] = None) -> None:
        """Send a beat every ``interval`` s; the peer is lost once silent for
        ``misses`` intervals, or ``patience`` s when given (an idle agent's)."""
        self.stop_heartbeat()
        self.interval, self.misses = interval, misses
        self.limit = interval * misses if patience is None else patience
        self.paused = False
        self.last_heard = time.monotonic()
        self._beat = self.loop.call_later(interval, self._send_beat)
        self._watch = self.loop.call_later(interval, self._check_peer)

    def stop_heartbeat(self) -> None:
        """Neither send heartbeats nor expect the peer's, until started again."""
        for timer in (self._beat, self._watch):
            if timer is not None:
                timer.cancel()
        self._beat = self._watch = None

    def pause_watch(self, paused: bool = True) -> None:
        """The peer said it stops for a while (a Ctrl-Z): its silence counts only
        after :data:`PAUSED_PATIENCE` s, until it says it runs again."""
        self.paused = paused
        self.last_heard = time.monotonic()

    def beat_now(self) -> None:
        """A beat now, if beats are being sent: for a caller that holds the loop
        for a while (waiting for a library's start).  A write that fails closes
        the link at the loop's next turn, not inside that caller."""
        if not self.closed and self._beat is not None:
            self._later = True
            try:
                self.send(link.encode(link.BEAT))
            finally:
                self._later = False

    def _send_beat(self) -> None:
        if self.closed:
            return
        self.send(link.encode(link.BEAT))
        self._beat = self.loop.call_later(self.interval, self._send_beat)

    def _check_peer(self) -> None:
        if self.closed:
            return
        now = time.monotonic()
        due = self._watch.when if self._watch is not None else now
        if now - due > self.limit / 2:
            # This process itself did not run for a while (stopped, starved or
            # suspended): what the peer sent meanwhile may not be read yet (a
            # thread of paramiko's forwards it), so its silence says nothing
            # yet.  It gets a whole interval's start again.
            self.last_heard = max(self.last_heard, now - self.interval)
        # Silence counts up to the loop's last wait for events: what came since,
        # while a long callback of this pass ran, is read by the next pass.
        silent = min(now, self.loop.polled_at) - self.last_heard
        if silent > (PAUSED_PATIENCE if self.paused else self.limit):
            if self.farewell is not None:
                self._say_farewell(self.farewell(silent))
            how = (f"heartbeat every {self.interval:g} s, {self.misses} missed"
                   if self.limit == self.interval * self.misses else
                   f"waiting at most {self.limit:g} s")
            self.close(f"no sign of life for {silent:.1f} s ({how})")
            return
        self._watch = self.loop.call_later(self.interval, self._check_peer)

    def _say_farewell(self, data: bytes) -> None:
        """Write ``data`` after what is queued, if the peer still takes it at once
        (it is silent: nothing here may wait for it)."""
        if not self.queue:       # (else it would land inside a frame still waiting)
            try:
                os.write(self.write_fd, data)
            except OSError:
                pass

    # -- input --------------------------------------------------------------
    def _recv_into(self, view) -> int:
        return os.readv(self.read_fd, [view])

    def _buffered(self) -> bool:
        """Whether received bytes wait where the loop cannot see them (TLS)."""
        return False

    def _on_readable(self) -> None:
        while True:
            room = self.reader.room(self._want)
            try:
                n = self._recv_into(room)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as err:
                self.close(f"link read failed: {err.strerror or err}")
                return
            finally:
                del room
            if not n:
                self.close("the link reached end-of-file")
                return
            if n >= self._want and self._want < MOST_READ:
                self._want *= 2          # a busy link reads in larger pieces
            self.last_heard = time.monotonic()
            try:
                frames = self.reader.received(n)
            except link.LinkError as err:
                self.close(f"protocol error: {err}")
                return
            self._dispatch(frames)
            if self.closed or not self._buffered():
                return

    def deliver(self, data: bytes) -> None:
        """Bytes received from the peer elsewhere: cut them into frames and hand those on."""
        self.last_heard = time.monotonic()
        try:
            frames = self.reader.feed(data)
        except link.LinkError as err:
            self.close(f"protocol error: {err}")
            return
        self._dispatch(frames)

    def _dispatch(self, frames) -> None:
        for kind, body in frames:
            if self.closed:
                return
            try:
                self.on_frame(kind, body)
            except link.LinkError as err:
                self.close(f"protocol error: {err}")
                return
            except (KeyError, TypeError, ValueError, AttributeError, IndexError,
                    OverflowError) as err:
                # The handlers check what they read; a value that still slips
                # through is the peer's fault and must end the link, not us.
                self.close(f"protocol error: malformed {link.NAMES.get(kind, 'unknown')} "
                           f"frame ({type(err).__name__})")
                return

    # -- output -------------------------------------------------------------
    def send(self, data: bytes) -> None:
        """Send ``data``: bytes, or a view valid only during the call (copied if it must wait)."""
        if not self.closed:
            self.put(data)

    def send_parts(self, parts) -> None:
        """Send ``parts`` back to back, as :meth:`send` does one."""
        if not self.closed:
            self.put_parts(parts)

    def on_write_error(self, err: OSError) -> None:
        gone = err.errno in (errno.EPIPE, errno.ECONNRESET, errno.EBADF)
        reason = ("the link was closed by the other side" if gone
                  else f"link write failed: {err.strerror}")
        if self._later:
            self.loop.call_later(0, lambda: self.close(reason))
        else:
            self.close(reason)

    def flush(self, deadline: float) -> None:
        """Write what is queued, waiting up to ``deadline`` (outside the loop)."""
        if not self.closed:
            self.drain(deadline)

    def detach(self, deadline: float) -> bool:
        """Let go of the descriptors without closing them, for another endpoint to
        take up (an agent kept for the next attempt of a job): True when nothing
        was left half-read or unsent, so that the next one starts on a frame's
        boundary; the loop no longer watches them either way."""
        if self.closed:
            return False
        lost: List[str] = []
        on_closed, self.on_closed = self.on_closed, lost.append   # (a write error's)
        clean = self.drain(deadline) and not self.reader.buf
        self.on_closed = on_closed
        clean = clean and not lost
        self.closed = True
        self.stop_heartbeat()
        self.discard()
        for fd in {self.read_fd, self.write_fd}:
            self.loop.forget(fd)
        return clean

    def close(self, reason: str = "") -> None:
        if self.closed:
            return
        self.closed = True
        for timer in (self._beat, self._watch):
            if timer is not None:
                timer.cancel()
        self.discard()
        for fd in {self.read_fd, self.write_fd}:
            self.loop.forget(fd)
        self.on_closed(reason)


class SocketEndpoint(Endpoint):
    """An :class:`Endpoint` on a socket object (plain or TLS) rather than raw fds."""

    def __init__(self, loop: Loop, sock, **kw) -> None:
        self.sock = sock
        self._tls = hasattr(sock, "pending")
        if self._tls:
            import ssl
            # A record that cannot go whole wants to be offered again unchanged.
            self.again = (BlockingIOError, InterruptedError, ssl.SSLWantWriteError,
                          ssl.SSLWantReadError)
        sock.setblocking(False)
        super().__init__(loop, sock.fileno(), sock.fileno(), **kw)

    def _recv_into(self, view) -> int:
        if not self._tls:
            return self.sock.recv_into(view)
        import ssl
        filled = 0
        try:
            # One TLS record per call: read on until the view is full or the
            # socket is empty.
            while filled < len(view):
                n = self.sock.recv_into(view[filled:])
                if not n:
                    break
                filled += n
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
            if not filled:
                raise BlockingIOError from None
        except BlockingIOError:
            if not filled:
                raise
        return filled

    def _buffered(self) -> bool:
        # A record decrypted only in part (the view was full) stays inside
        # the TLS object, and the kernel no longer signals it.
        return self._tls and self.sock.pending() > 0

    def _write_parts(self, parts) -> int:
        if not self._tls:
            return self.sock.sendmsg(parts)
        # TLS: one part at a time.  A part that cannot go whole raises
        # "want write" and must be offered again unchanged: it is queued whole.
        sent = 0
        for part in parts:
            try:
                sent += self.sock.send(part)
            except self.again:
                if not sent:
                    raise
                break
        return sent

    def close(self, reason: str = "") -> None:
        was = self.closed
        super().close(reason)
        if not was:
            try:
                self.sock.close()
            except OSError:
                pass


class InboundTLSEndpoint(SocketEndpoint):
    """A TLS connection that is only read (an agent's output connection),
    decrypted by a thread of its own: OpenSSL lets go of the GIL, so the loop
    passes one chunk on while the next is decrypted.  The thread hands whole
    buffers over and wakes the loop through a pipe."""

    def __init__(self, loop: Loop, sock, **kw) -> None:
        import threading
        super().__init__(loop, sock, **kw)
        loop.forget(self.read_fd)
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._cond = threading.Condition()
        self._chunks: Deque[Tuple[bytearray, int, Optional[str]]] = deque()
        self._backlog = 0
        self._stop = False
        self._thread: Optional[threading.Thread] = threading.Thread(
            target=self._pump, name="output-tls", daemon=True)
        try:
            self._thread.start()
        except RuntimeError:      # no thread to be had: read on the loop, as other links do
            self._thread = None
            for fd in (self._wake_r, self._wake_w):
                os.close(fd)
            loop.add_reader(self.read_fd, self._on_readable)
            return
        loop.add_reader(self._wake_r, self._collect)

    def _pump(self) -> None:
        from ..machine.loop import wait_fd
        size = FIRST_READ
        buf = bytearray(size)
        while not self._stop:
            end: Optional[str]
            try:
                filled = self._recv_into(memoryview(buf))
            except BlockingIOError:
                try:     # close() shuts the socket down, which ends the wait
                    wait_fd(self.sock, False, IDLE_CHECK)
                except (OSError, ValueError):
                    pass     # the next read says what is wrong
                continue
            except (OSError, ValueError) as err:
                filled, end = 0, f"link read failed: {getattr(err, 'strerror', None) or err}"
            else:
                end = None if filled else ""
            if self._stop:
                return
            del buf[filled:]          # the loop keeps it until read: no more than was read
            if filled == size and size < MOST_READ:
                size *= 2
            elif filled < size // 4 and size > FIRST_READ:
                size //= 2
            with self._cond:
                self._chunks.append((buf, filled, end))
                self._backlog += filled
                first = len(self._chunks) == 1
            if first:
                try:
                    os.write(self._wake_w, b"!")
                except OSError:
                    return
            if end is not None:
                return
            with self._cond:     # the agent keeps to its credit; this bounds one that does not
                while self._backlog > BACKLOG and not self._stop:
                    self._cond.wait(IDLE_CHECK)
            buf = bytearray(size)

    def _collect(self) -> None:
        try:
            os.read(self._wake_r, 4096)
        except OSError:
            pass
        with self._cond:
            chunks = list(self._chunks)
            self._chunks.clear()
            self._backlog = 0
            self._cond.notify()
        for buf, n, end in chunks:
            if self.closed:
                return
            if n:
                self.last_heard = time.monotonic()
                try:
                    frames = self.reader.adopt(buf, n)
                except link.LinkError as err:
                    self.close(f"protocol error: {err}")
                    return
                self._dispatch(frames)
            if end is not None and not self.closed:
                self.close(end or "the link reached end-of-file")

    def close(self, reason: str = "") -> None:
        if self.closed:
            return
        import socket
        if self._thread is not None:
            with self._cond:
                self._stop = True
                self._cond.notify()
            self.loop.forget(self._wake_r)
            try:
                socket.socket.shutdown(self.sock, socket.SHUT_RDWR)   # wakes the thread
            except OSError:
                pass
            self._thread.join(5)
            if not self._thread.is_alive():   # else its wake-up pipe outlives it
                for fd in (self._wake_r, self._wake_w):
                    os.close(fd)
        super().close(reason)
