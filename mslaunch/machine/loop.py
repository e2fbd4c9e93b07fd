"""A small single-threaded event loop over epoll, and the queued writer on it.

The supervisor, the output relay and the PMI server all register file
descriptors here.  Neither asyncio nor ``selectors`` is used, on purpose:
their imports cost more than the loop itself (asyncio more than a whole
``-n 1 true`` launch).  :class:`QueuedWriter` is every non-blocking writer's
queue (mslaunch's terminals, the links, PMI connections, the ranks' stdin):
it lives here, in a module every one of them imports anyway.
"""

from __future__ import annotations

from ..core import socket
import heapq
import itertools
import os
import select
import time
try:
    # The C type itself: the ``collections`` package costs milliseconds to import.
    from _collections import deque
except ImportError:
    from collections import deque

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import (Any, Callable, Deque, Dict, List, Optional, Sequence, Tuple, Type, Union)

    Callback = Callable[[], None]

_READ = select.EPOLLIN
_WRITE = select.EPOLLOUT
# A hang-up or an error wakes both directions, so the callback sees EOF/EPIPE.
_READABLE = select.EPOLLIN | select.EPOLLHUP | select.EPOLLERR

#: Whether the garbage collector is held off until the first wait (hold_collector).
_COLLECTOR_HELD = False
#: What ends at that first wait besides (at_first_wait).
_AT_FIRST_WAIT: List[Callable[[], None]] = []


def hold_collector() -> None:
    """Hold Python's garbage collector off until a loop first waits.

    The ``mslaunch`` command calls this first: a launch makes its objects (modules,
    the plan, the ranks' environments) in one go, and a collection among them --
    a walk over every object, a millisecond or more -- only delays the ranks.
    Once a loop waits (the ranks, or the remote hosts, are on their way), the
    objects made so far are frozen out of later collections (``gc.freeze``) and
    the collector runs again, as a process that runs for days needs."""
    global _COLLECTOR_HELD
    import gc
    if gc.isenabled():
        gc.disable()
        _COLLECTOR_HELD = True


def at_first_wait(then: Callable[[], None]) -> None:
    """Call ``then`` when a loop of this process first waits (or a fork of it lets
    the collector go): what serves only a start (:mod:`.codecache`'s ``import``)."""
    _AT_FIRST_WAIT.append(then)


def release_collector() -> None:
    """Let the collector run again, if :func:`hold_collector` held it (the objects
    made meanwhile frozen out of later collections); what :func:`at_first_wait`
    was given is called first."""
    global _COLLECTOR_HELD
    while _AT_FIRST_WAIT:
        _AT_FIRST_WAIT.pop()()
    if not _COLLECTOR_HELD:
        return
    import gc
    _COLLECTOR_HELD = False
    gc.freeze()
    gc.enable()


_WRITABLE = select.EPOLLOUT | select.EPOLLHUP | select.EPOLLERR


def bind(fn: Callable[..., Any], *args: Any) -> Callable[..., Any]:
    """``fn`` with ``args`` first, as functools.partial, which imports collections: the
    agents' start-up stays without it."""
    return lambda *more: fn(*args, *more)


#: Seconds an unproven connection to one of our listeners is safe from being
#: pushed out by newer ones (see :func:`~mslaunch.machine.peers.make_room`).
STRANGER_GRACE = 0.25


class CListener(socket.socket):
    """A listening socket made without the :mod:`socket` module, which costs a
    launch a millisecond or more: ``accept()`` gives ``socket.socket``
    connections (``recv``, ``send``, ``detach``... as :mod:`socket`'s; no
    ``makefile``, and TLS wants a :class:`socket.socket` made of one)."""

    def accept(self) -> Tuple[socket.socket, Any]:
        fd, address = self._accept()  # type: ignore[attr-defined]  # C method typeshed omits
        return socket.socket(self.family, self.type, self.proto, fileno=fd), address


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
        self._delay_fd: Optional[int] = None
        self._events_at = 0.0
        self._ready: List[Tuple[int, int]] = []
        #: When the last wait for events ended (``time.monotonic()``): what came
        #: after it to a descriptor not among them is not read yet.
        self.polled_at = time.monotonic()

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
        if _COLLECTOR_HELD or _AT_FIRST_WAIT:
            release_collector()
        timeout = max_wait
        while self._timers and self._timers[0][2].cancelled:
            heapq.heappop(self._timers)
        if self._timers:
            delay = max(0.0, self._timers[0][0] - time.monotonic())
            timeout = delay if timeout is None else min(timeout, delay)
        if self._cbs:
            slept, waited = time.time(), self._run_delay()
            ready = self._epoll.poll(-1 if timeout is None else timeout)
            woke = time.time()
            self._events_at = max(slept, woke - (self._run_delay() - waited))
        else:
            ready = []
            if timeout:
                time.sleep(timeout)
        self.polled_at = time.monotonic()
        self._ready = ready
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

    def events_at(self) -> float:
        """When the events being dispatched happened (``time.time()``'s clock): when
        the loop woke, less the time it then waited for a CPU, but not before it
        began to wait.  On a busy machine a process woken by an event (a child's
        exit) may wait milliseconds to run, and its peers' processes elsewhere
        may see what followed from it before."""
        return self._events_at or time.time()

    def woke_for(self, fd: int) -> bool:
        """Whether ``fd`` is among the events being dispatched (those :meth:`events_at` dates)."""
        return any(ready == fd for ready, _ in self._ready)

    def _run_delay(self) -> float:
        """Seconds this thread has waited, runnable, for a CPU (the kernel's
        ``run_delay`` of ``/proc/thread-self/schedstat``); 0.0 where it is not kept."""
        fd = self._delay_fd
        if fd is None:
            try:
                fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                fd = -1
            self._delay_fd = fd
        if fd < 0:
            return 0.0
        try:
            return int(os.pread(fd, 64, 0).split()[1]) / 1e9
        except (OSError, ValueError, IndexError):
            return 0.0

    def catch_signals(self, signals: Sequence[int], handler: Callable[[int], None],
                      early: Optional[Callable[[int], None]] = None) -> Callable[[], None]:
        """Deliver ``signals`` to ``handler(signum)`` on this loop; returns the
        function that puts back what was there before.

        The signals travel through a wake-up pipe (``signal.set_wakeup_fd``),
        so a signal that arrives while the loop waits in epoll wakes it; the
        Python-level handler only calls ``early(signum)``, if given, for what
        must be noted even while the loop does not run.
        """
        from ..core import signal
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
        if self._delay_fd is not None and self._delay_fd >= 0:
            os.close(self._delay_fd)
        self._delay_fd = -1


IOV_MAX = 1024          # most parts one writev or sendmsg takes (Linux's UIO_MAXIOV)


class QueuedWriter:
    """Bytes for one descriptor, written without ever blocking the loop.

    What the file does not take at once waits in :attr:`queue`, in order,
    for the loop to find the file writable.  A ``bytes`` object waits as it
    is (the rest of one written in part as a view of it); other buffers,
    views valid only during the call, are copied once if they must wait.
    Written with ``os.write``/``os.writev``, or with ``send``/``sendmsg``
    and :attr:`send_flags` by an owner that sets :attr:`sock`.  The owner
    keeps its policy in the ``on_*`` hooks it overrides.
    """

    sock: Any = None
    send_flags = 0
    high_water = 1 << 62
    low_water = 0
    #: The errors that mean "not now": the write waits for the loop.
    again: Tuple[Type[BaseException], ...] = (BlockingIOError, InterruptedError)

    def __init__(self, loop: Optional[Loop], fd: int) -> None:
        self.loop = loop
        self.fd = fd
        self.queue: Deque[Union[bytes, memoryview]] = deque()
        self.queued = 0
        self._registered = False      # flush_some is the loop's writer callback for fd
        self._above = False           # past high_water, not yet down to low_water

    # -- hooks --------------------------------------------------------------
    def on_write_error(self, err: OSError) -> None:
        """A write failed (not for want of room); the queue has been dropped."""

    def on_empty(self) -> None:
        """What waited has all been written by :meth:`flush_some`."""

    def on_high_water(self) -> None:
        """More than :attr:`high_water` bytes wait."""

    def on_low_water(self) -> None:
        """No more than :attr:`low_water` bytes wait, after more than :attr:`high_water` did."""

    # -- writing ------------------------------------------------------------
    def put(self, data) -> bool:
        """Write ``data`` (bytes, or a buffer valid only during the call) after
        what waits; True if some of it is left waiting."""
        if not self.queue:
            try:
                n = os.write(self.fd, data) if self.sock is None else self.sock.send(data, self.send_flags)
            except self.again:
                n = 0
            except OSError as err:
                self._write_error(err)
                return False
            if n == len(data):
                return False
            self._hold(data, n)
        elif data:
            self._hold(data, 0)
        return True

    def put_parts(self, parts) -> bool:
        """Write ``parts`` back to back (as :meth:`put`, in one ``writev``);
        True if some are left waiting."""
        rest = [p for p in parts if len(p)]
        if not rest:
            return False
        n = 0
        if not self.queue:
            try:
                n = self._write_parts(rest[:IOV_MAX] if len(rest) > IOV_MAX else rest)
            except self.again:
                n = 0
            except OSError as err:
                self._write_error(err)
                return False
        queue = self.queue
        held = self.queued
        for part in rest:
            size = len(part)
            if n >= size:
                n -= size
                continue
            if type(part) is not bytes:
                part = bytes(memoryview(part)[n:])
            elif n:
                part = memoryview(part)[n:]
            n = 0
            queue.append(part)
            held += len(part)
        if held == self.queued:
            return False
        self.queued = held
        self._waiting()
        return True

    def hold(self, data) -> None:
        """Queue ``data`` without trying to write it now."""
        if data:
            self._hold(data, 0)

    def _hold(self, data, n: int) -> None:
        if type(data) is not bytes:       # a buffer the caller may reuse: copied
            data, n = bytes(memoryview(data)[n:]), 0
        rest = memoryview(data)[n:] if n else data
        self.queue.append(rest)
        self.queued += len(rest)
        self._waiting()

    def _waiting(self) -> None:
        self._await_writable()
        if not self._above and self.queued > self.high_water:
            self._above = True
            self.on_high_water()

    def _write_parts(self, parts: List[Any]) -> int:
        sock = self.sock
        if sock is None:
            return os.writev(self.fd, parts)
        return sock.sendmsg(parts, (), self.send_flags)

    def flush_some(self) -> None:
        """Write what the file takes now; the loop calls it when the file is writable."""
        queue = self.queue
        if not queue:
            self._unregister()
            return
        while queue:
            try:
                if len(queue) == 1:
                    head = queue[0]
                    asked = len(head)
                    n = (os.write(self.fd, head) if self.sock is None
                         else self.sock.send(head, self.send_flags))
                else:
                    batch = list(itertools.islice(queue, IOV_MAX))
                    asked = sum(map(len, batch))
                    n = self._write_parts(batch)
            except self.again:
                break
            except OSError as err:
                self._write_error(err)
                return
            self.queued -= n
            full = n < asked      # the file took less than it was offered
            while n:
                head = queue[0]
                size = len(head)
                if n < size:
                    queue[0] = head[n:] if type(head) is memoryview else memoryview(head)[n:]
                    break
                n -= size
                queue.popleft()
            if full:
                break
        if not queue:
            self._unregister()
        if self._above and self.queued <= self.low_water:
            self._above = False
            self.on_low_water()
        if not self.queue:
            self.on_empty()

    def _write_error(self, err: OSError) -> None:
        self.discard()
        self.on_write_error(err)

    # -- waiting --------------------------------------------------------------
    def _await_writable(self) -> None:
        """Have the loop call :meth:`flush_some` once the file is writable."""
        if not self._registered and self.queue:
            self.loop.add_writer(self.fd, self.flush_some)  # type: ignore[union-attr]
            self._registered = True

    def _unregister(self) -> None:
        if self._registered:
            self._registered = False
            self.loop.remove_writer(self.fd)  # type: ignore[union-attr]

    def discard(self) -> int:
        """Drop what waits (and the loop's callback); returns how many bytes that was."""
        dropped = self.queued
        self.queue.clear()
        self.queued = 0
        self._above = False
        self._unregister()
        return dropped

    def drain(self, deadline: Optional[float]) -> bool:
        """Write what waits, blocking until ``deadline`` (``time.monotonic()``;
        None: no limit); outside the loop only.  True if nothing is left."""
        while self.queue:
            timeout = None if deadline is None else deadline - time.monotonic()
            if timeout is not None and timeout <= 0:
                return False
            try:
                wait_fd(self.fd, True, timeout)
            except (OSError, ValueError):
                time.sleep(0.01)
            self.flush_some()
        return True
