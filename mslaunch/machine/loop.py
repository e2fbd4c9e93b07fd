"""A small single-threaded event loop over epoll.

The supervisor, the output relay and the PMI server all register file
descriptors here.  Neither asyncio nor ``selectors`` is used, on purpose:
their imports cost more than the loop itself (asyncio more than a whole
``-n 1 true`` launch).
"""

from __future__ import annotations

import heapq
import itertools
import os
import select
import time
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Sized, Tuple

    Callback = Callable[[], None]

_READ = select.EPOLLIN
_WRITE = select.EPOLLOUT
# A hang-up or an error wakes both directions, so the callback sees EOF/EPIPE.
_READABLE = select.EPOLLIN | select.EPOLLHUP | select.EPOLLERR
_WRITABLE = select.EPOLLOUT | select.EPOLLHUP | select.EPOLLERR


#: Seconds an unproven connection to one of our listeners is safe from being
#: pushed out by newer ones (see :func:`make_room`).
STRANGER_GRACE = 0.25


def make_room(strangers: Callable[[], Sized], limit: int, drop: Callable[[Any], None],
              grace: float = STRANGER_GRACE) -> float:
    """Room for one more unproven connection on a listener: 0.0, or seconds to wait.

    ``strangers()`` gives the connections not yet proven, oldest first, each
    with ``accepted`` (its ``time.monotonic()``); ``drop`` closes one and
    takes it out of them.  The oldest are pushed out while ``limit`` are
    held, but only once they have had ``grace`` seconds: a real peer speaks
    right after connecting, yet on a busy machine that can come some
    milliseconds after the accept, and a flood of newer connections must not
    push it out first.  When every one is younger the caller stops accepting
    for the time returned (:meth:`Loop.pause_reader`); new connections wait
    in the kernel's queue meanwhile.
    """
    while True:
        held = strangers()
        if len(held) < limit:
            return 0.0
        oldest = next(iter(held))  # type: ignore[call-overload]
        wait = oldest.accepted + grace - time.monotonic()
        if wait > 0:
            return wait
        drop(oldest)


def accept_strangers(loop: "Loop", lsock, strangers: Callable[[], Sized], limit: int,
                     drop: Callable[[Any], None], note: Callable[[str], None],
                     grace: float = STRANGER_GRACE) -> Iterator[Tuple[Any, Any]]:
    """The connections waiting on the listening socket ``lsock`` (64 at most
    per call), each ``(sock, address)``, non-blocking and without Nagle's
    delay; before each, room is made among the unproven (:func:`make_room`).

    When there is no room yet, or the process is out of descriptors or
    memory (said once through ``note``), the listener rests: new connections
    wait in the kernel's queue meanwhile.
    """
    import errno

    import _socket
    for turn in range(64):
        if turn and not wait_fd(lsock, False, 0):
            return             # nobody else waits: no stranger is pushed out for nothing
        wait = make_room(strangers, limit, drop, grace)
        if wait:
            loop.pause_reader(lsock.fileno(), wait)
            return
        try:
            sock, address = lsock.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as err:
            note(f"accept failed: {err.strerror}")
            if err.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                loop.pause_reader(lsock.fileno(), 0.5)
            return
        try:
            sock.setblocking(False)
            sock.setsockopt(_socket.IPPROTO_TCP, _socket.TCP_NODELAY, 1)
        except OSError:
            sock.close()        # reset before we got to it
            continue
        yield sock, address


def wait_fd(fd, write: bool = False, timeout: Optional[float] = None) -> bool:
    """Wait until ``fd`` (or an object with ``fileno()``) is readable, or writable
    with ``write``, for at most ``timeout`` seconds (None: no limit); True if it is.

    ``poll``, not ``select``: a launcher with many hosts holds descriptors
    above 1023, which ``select`` cannot watch.  A hang-up or an error counts
    as ready, so that the caller's next read or write sees it."""
    poller = select.poll()
    poller.register(fd, select.POLLOUT if write else select.POLLIN)
    wait = None if timeout is None else max(0, int(timeout * 1000 + 0.999))
    return bool(poller.poll(wait))


class Timer:
    """A handle returned by :meth:`Loop.call_at`; ``cancel()`` disarms it."""

    __slots__ = ("when", "callback", "cancelled")

    def __init__(self, when: float, callback: Callback) -> None:
        self.when = when
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class Loop:
    """Dispatch readiness of file descriptors and timers to callbacks."""

    def __init__(self) -> None:
        self._epoll = select.epoll()
        self._registered: set = set()
        self._cbs: Dict[int, List[Optional[Callback]]] = {}
        self._timers: List[Tuple[float, int, Timer]] = []
        self._seq = itertools.count()
        self._paused: Dict[int, Timer] = {}

    # -- file descriptors -------------------------------------------------
    def _update(self, fd: int) -> None:
        cbs = self._cbs[fd]
        events = (_READ if cbs[0] else 0) | (_WRITE if cbs[1] else 0)
        if events:
            # A descriptor closed without forget() leaves epoll by itself; its
            # number may come back for a new file, hence the fallbacks.
            try:
                if fd in self._registered:
                    self._epoll.modify(fd, events)
                else:
                    self._epoll.register(fd, events)
            except FileNotFoundError:
                self._epoll.register(fd, events)
            except FileExistsError:
                self._epoll.modify(fd, events)
            self._registered.add(fd)
        else:
            if fd in self._registered:
                self._registered.discard(fd)
                try:
                    self._epoll.unregister(fd)
                except OSError:
                    pass   # already closed: the kernel dropped it
            del self._cbs[fd]

    def add_reader(self, fd: int, callback: Callback) -> None:
        self._unpause(fd)
        self._cbs.setdefault(fd, [None, None])[0] = callback
        self._update(fd)

    def remove_reader(self, fd: int) -> None:
        self._unpause(fd)
        if fd in self._cbs:
            self._cbs[fd][0] = None
            self._update(fd)

    def pause_reader(self, fd: int, seconds: float) -> None:
        """Stop reading ``fd`` for ``seconds``, then read it again with the same
        callback, unless it was added, removed or forgotten meanwhile."""
        cbs = self._cbs.get(fd)
        if cbs is None or cbs[0] is None:
            return
        callback = cbs[0]
        self.remove_reader(fd)

        def resume() -> None:
            if self._paused.get(fd) is timer:
                self.add_reader(fd, callback)

        timer = self._paused[fd] = self.call_later(seconds, resume)

    def _unpause(self, fd: int) -> None:
        timer = self._paused.pop(fd, None)
        if timer is not None:
            timer.cancel()

    def add_writer(self, fd: int, callback: Callback) -> None:
        self._cbs.setdefault(fd, [None, None])[1] = callback
        self._update(fd)

    def remove_writer(self, fd: int) -> None:
        if fd in self._cbs:
            self._cbs[fd][1] = None
            self._update(fd)

    def forget(self, fd: int) -> None:
        """Drop every callback of ``fd`` (call before closing it)."""
        self._unpause(fd)
        if fd in self._cbs:
            self._cbs[fd] = [None, None]
            self._update(fd)

    # -- timers -----------------------------------------------------------
    def call_at(self, when: float, callback: Callback) -> Timer:
        timer = Timer(when, callback)
        heapq.heappush(self._timers, (when, next(self._seq), timer))
        return timer

    def call_later(self, delay: float, callback: Callback) -> Timer:
        return self.call_at(time.monotonic() + delay, callback)

    # -- running ----------------------------------------------------------
    def run_once(self, max_wait: Optional[float] = None) -> None:
        """Wait for one batch of events (or the next timer) and dispatch it."""
        timeout = max_wait
        while self._timers and self._timers[0][2].cancelled:
            heapq.heappop(self._timers)
        if self._timers:
            delay = max(0.0, self._timers[0][0] - time.monotonic())
            timeout = delay if timeout is None else min(timeout, delay)
        if self._cbs:
            ready = self._epoll.poll(-1 if timeout is None else timeout)
        else:
            ready = []
            if timeout:
                time.sleep(timeout)
        for fd, mask in ready:
            cbs = self._cbs.get(fd)
            if cbs is None:
                continue
            if mask & _READABLE and cbs[0] is not None:
                cbs[0]()
            cbs = self._cbs.get(fd)
            if cbs is not None and mask & _WRITABLE and cbs[1] is not None:
                cbs[1]()
        now = time.monotonic()
        while self._timers and self._timers[0][0] <= now:
            _, _, timer = heapq.heappop(self._timers)
            if not timer.cancelled:
                timer.cancelled = True
                timer.callback()

    def catch_signals(self, signals: Sequence[int], handler: Callable[[int], None],
                      early: Optional[Callable[[int], None]] = None) -> Callable[[], None]:
        """Deliver ``signals`` to ``handler(signum)`` on this loop; returns the
        function that puts back what was there before.

        The signals travel through a wake-up pipe (``signal.set_wakeup_fd``),
        so a signal that arrives while the loop waits in epoll wakes it; the
        Python-level handler only calls ``early(signum)``, if given, for what
        must be noted even while the loop does not run.
        """
        import _signal as signal   # the C module: no enum import
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        old_wakeup = signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        note = (lambda signum, frame: early(signum)) if early else (lambda signum, frame: None)
        old = {sig: signal.signal(sig, note) for sig in signals}

        def on_wake() -> None:
            try:
                data = os.read(wake_r, 512)
            except BlockingIOError:
                return
            for sig in data:
                handler(sig)

        def restore() -> None:
            signal.set_wakeup_fd(old_wakeup)
            for sig, previous in old.items():
                signal.signal(sig, previous)
            self.forget(wake_r)
            os.close(wake_r)
            os.close(wake_w)

        self.add_reader(wake_r, on_wake)
        return restore

    def run_until(self, done: Callable[[], bool]) -> None:
        while not done():
            self.run_once()

    def close(self) -> None:
        self._epoll.close()
