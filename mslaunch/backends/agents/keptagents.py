"""Agents kept between the attempts of a job run with ``--max-restarts``.

An attempt that fails stops its ranks on every host; an agent whose ranks have
all ended, whose output is all in and whose link is sound is then told
``NEXT`` (see :mod:`mslaunch.agent.agent`) rather than ``BYE``: it forgets
the job and waits for the next one on the same link.  The next attempt takes
its hosts' agents from here, so a restart costs no new SSH session, rsh agent
or srun step -- only the ranks start again.  Agents the plan left without
ranks (spare hosts) wait here as well, from the first attempt on.

What could not be kept (a lost host, a link that closed while waiting, an
agent that gave up waiting) is started anew by the attempt's own starter,
for those hosts only.  The starters that started agents live as long as the
job, and everything here is let go when the job ends.
"""

from __future__ import annotations

import os
import select
import time
from ...core import signal

from ...core.errors import HostsFailed
from ...core.switches import PAUSE_PATIENCE
from ...wire import frames, link
from ...machine import timeline
from ...machine.osfiles import read_ready
from .starters.starter import let_go

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

    from ...machine.loop import Loop, Timer
    from .starters.starter import AgentConnection, Starter

#: What a waiting agent may send: beats, and its answer to a Ctrl-Z (see pause).
_WAITING = (link.BEAT, link.PAUSED)
#: Seconds a kept agent waits for its next job while this launcher is silent
#: before it exits: longer than anything between two attempts (the longest
#: back-off, :data:`~mslaunch.run.attempts.MAX_BACKOFF`, the stop of a failed attempt and the
#: health check); during an attempt the launcher beats to every waiting agent.
IDLE = 30.0


class KeptAgents:
    """The job's agents between attempts; see the module docstring.

    A waiting agent beats; while an attempt runs (:meth:`watch`) its beats are
    read on the attempt's loop, this launcher beats back, and an agent silent
    for the job's heartbeat (or whose link ends) is a lost host: it goes, with
    one line, and is noted in :attr:`lost` for the attempts to leave out."""

    def __init__(self, say: Callable[[str], None],
                 heartbeat: Tuple[float, int] = (1.0, 5)) -> None:
        self.idle: Dict[str, AgentConnection] = {}
        self.starters: List[Starter] = []     # those that started agents, in order
        self.heartbeat = heartbeat
        self.lost: Dict[str, str] = {}        # hosts lost while waiting, and why
        #: Spares whose agents were still starting when the attempt ended
        #: (:class:`~.spares.Spares`), for the next.
        self.starting: List[Any] = []
        self._heard: Dict[str, float] = {}    # when each was last heard (monotonic)
        self._readers: Dict[str, Any] = {}
        self._loop: Optional[Loop] = None
        self._timer: Optional[Timer] = None
        self._say = say
        #: This launcher was stopped since the last check (SIGCONT came): what its
        #: waiting agents did meanwhile is not their hosts' fault.
        self.stopped = False
        self._told = False            # ... after it told them it stops (pause)

    def put(self, conn: AgentConnection, fresh: bool = False) -> None:
        """An agent with no job (told ``NEXT``; or ``fresh``: never given one, told
        here) for a later attempt."""
        self._drop(conn.name)
        os.set_blocking(conn.fd, False)
        if fresh:
            try:
                os.write(conn.fd, frames.encode(frames.Next(idle=IDLE,
                                                            heartbeat=self.heartbeat)))
            except OSError:
                let_go(conn)
                return
        self.idle[conn.name] = conn
        self._heard[conn.name] = time.monotonic()
        if self._loop is not None:
            self._listen(conn)

    def take(self, names: Sequence[str]) -> Dict[str, AgentConnection]:
        """The waiting agents of ``names`` whose links are still sound and that were
        heard from within the heartbeat."""
        taken = {}
        for name in names:
            conn = self.idle.pop(name, None)
            if conn is None:
                continue
            self._forget_fd(name, conn)
            heard = _sound(conn.fd, self._heard.pop(name, 0.0))
            if heard is not None and time.monotonic() - heard <= self._limit():
                taken[name] = conn
                conn.hello["package"] = "kept from the attempt before"   # (for -v)
                timeline.mark("agent kept", name)
            else:
                let_go(conn)
        return taken

    def check(self) -> Dict[str, str]:
        """Before an attempt is planned: the waiting agents that are gone or silent
        (lost hosts, which go); every host lost while waiting so far, and why."""
        now = time.monotonic()
        stopped, self.stopped = self.stopped, False
        gave_up = []
        for name, conn in list(self.idle.items()):
            heard = _sound(conn.fd, self._heard.get(name, 0.0))
            fresh = heard is not None and now - heard <= self._limit()
            if stopped:
                # Stopped without a word to them (SIGSTOP), this launcher cannot
                # tell which of them gave up on it, or is about to: all start anew.
                gave_up.append(name)
                self._drop(name)
            elif fresh:
                self._heard[name] = heard  # type: ignore[assignment]
            elif heard is None:
                self._lose(name, "its agent's link ended while it waited")
            else:
                self._lose(name, f"no sign of life for {now - heard:.1f} s while it waited")
        if gave_up:
            from ...hosts.ranges import host_ranges
            self._say(f"mslaunch: {host_ranges(gave_up)}: the agents that waited there for "
                      f"the next attempt are started again: mslaunch itself was stopped")
        return dict(self.lost)

    # -- while an attempt runs ---------------------------------------------------------
    def watch(self, loop: Loop) -> None:
        """Read the waiting agents' beats on ``loop`` and beat back, until :meth:`unwatch`."""
        self._loop = loop
        for conn in list(self.idle.values()):
            self._listen(conn)
        self._timer = loop.call_later(self.heartbeat[0], self._tick)

    def unwatch(self) -> None:
        if self._loop is None:
            return
        for name in list(self._readers):
            self._forget(name)
        if self._timer is not None:
            self._timer.cancel()
        self._loop, self._timer = None, None

    def pause(self) -> None:
        """This launcher stops (a Ctrl-Z between two attempts): the waiting agents
        are told, so that they wait for it as long as a stopped launcher is waited
        for; each answers (``PAUSED``) before this returns, or within
        :data:`~mslaunch.core.switches.PAUSE_PATIENCE` s: what carries the frame
        (paramiko's thread) stops with this process."""
        self._tell(signal.SIGTSTP)
        self._told = True
        waiting = {conn.fd: (name, link.Reader()) for name, conn in self.idle.items()}
        deadline = time.monotonic() + PAUSE_PATIENCE
        poller = select.poll()
        for fd in waiting:
            poller.register(fd, select.POLLIN)
        while waiting and time.monotonic() < deadline:
            for fd, _ in poller.poll(max(0, int((deadline - time.monotonic()) * 1000))):
                name, reader = waiting[fd]
                try:
                    frames = reader.feed(os.read(fd, 1 << 16))
                except (OSError, link.LinkError):
                    frames = [(link.PAUSED, b"")]     # its end is said later
                self._heard[name] = time.monotonic()
                if any(kind == link.PAUSED for kind, _ in frames):
                    poller.unregister(fd)
                    del waiting[fd]

    def resume(self) -> None:
        """This launcher runs again after it was stopped (SIGCONT)."""
        self._tell(signal.SIGCONT)
        if self._told:     # they knew: silence while this launcher stood still is not theirs
            now = time.monotonic()
            self._heard.update((name, now) for name in self.idle)
        self.stopped = self.stopped or not self._told
        self._told = False

    def _tell(self, sig: int) -> None:
        for conn in self.idle.values():
            try:
                os.write(conn.fd, frames.encode(frames.Signal(sig=int(sig))))
            except OSError:
                pass            # its silence, or its link's end, tells later

    def _listen(self, conn: AgentConnection) -> None:
        assert self._loop is not None
        reader = link.Reader()
        name = conn.name

        def readable() -> None:
            data = read_ready(conn.fd)
            if data is None:
                return
            if not data:
                self._lose(name, "its agent's link ended while it waited")
                return
            try:
                frames = reader.feed(data)
            except link.LinkError as err:
                self._lose(name, f"protocol error while it waited: {err}")
                return
            if any(kind not in _WAITING for kind, _ in frames):
                self._drop(name)   # not on a frame's boundary for the next attempt
                return
            self._heard[name] = time.monotonic()

        self._readers[name] = readable
        self._loop.add_reader(conn.fd, readable)

    def _forget(self, name: str) -> None:
        conn = self.idle.get(name)
        if conn is not None:
            self._forget_fd(name, conn)

    def _forget_fd(self, name: str, conn: AgentConnection) -> None:
        if self._readers.pop(name, None) is not None and self._loop is not None:
            self._loop.forget(conn.fd)

    def _tick(self) -> None:
        now = time.monotonic()
        for name, conn in list(self.idle.items()):
            silent = now - self._heard.get(name, now)
            if silent > self._limit():
                self._lose(name, f"no sign of life for {silent:.1f} s while it waited")
                continue
            try:
                os.write(conn.fd, link.encode(link.BEAT))
            except BlockingIOError:
                pass           # a full link: the agent is not reading; its silence tells
            except OSError:
                self._lose(name, "its agent's link ended while it waited")
        if self._loop is not None:
            self._timer = self._loop.call_later(self.heartbeat[0], self._tick)

    def _drop(self, name: str) -> None:
        conn = self.idle.pop(name, None)
        if conn is not None:
            self._forget_fd(name, conn)
            self._heard.pop(name, None)
            let_go(conn)

    def _lose(self, name: str, why: str) -> None:
        conn = self.idle.pop(name, None)
        if conn is None:
            return
        self._forget_fd(name, conn)
        self._heard.pop(name, None)
        self.lost[name] = why
        self._say(f"mslaunch: lost spare host {name}: {why}; it is left out")
        conn.close(wait=0, gone=True)
        os.close(conn.fd)

    def _limit(self) -> float:
        interval, misses = self.heartbeat
        return interval * misses

    # -- the end ------------------------------------------------------------------
    def starter(self, make: Callable[[], Starter]) -> Starter:
        """The attempt's starter: agents from here first, ``make()``'s for the rest."""
        return _KeptFirst(self, make)

    def let_go_all(self) -> None:
        """Every waiting agent goes (the next attempt starts its own)."""
        for name, conn in self.idle.items():
            self._forget(name)
            let_go(conn)
        self.idle = {}
        self._heard = {}

    def close(self) -> None:
        """The job ended: every waiting agent goes, then the starters."""
        self.unwatch()
        starting, self.starting = self.starting, []
        for spares in starting:
            for conn in spares.halt().values():
                let_go(conn)
        self.let_go_all()
        for starter in self.starters:
            starter.close()
        self.starters = []


def _sound(fd: int, heard: float) -> Optional[float]:
    """When a waiting agent was last heard from (``heard``, or now if a beat
    waits to be read), or None when its link cannot be taken up again: closed,
    or holding more than heartbeats (sent before the agent read ``NEXT``), or a
    part of a frame."""
    reader = link.Reader()
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    while poller.poll(0):
        try:
            data = os.read(fd, 1 << 16)
        except BlockingIOError:
            break
        except OSError:
            return None
        if not data:
            return None                        # the agent is gone
        try:
            frames = reader.feed(data)
        except link.LinkError:
            return None
        if any(kind not in _WAITING for kind, _ in frames):
            return None
        if frames:
            heard = time.monotonic()
    return None if reader.buf else heard


class _KeptFirst:
    """A :class:`~mslaunch.backends.agents.starters.starter.Starter` that hands out kept agents and
    starts the others with the attempt's own starter, made only if needed."""

    def __init__(self, pool: KeptAgents, make: Callable[[], Starter]) -> None:
        self.pool = pool
        self.make = make
        self.real: Optional[Starter] = None

    def _real(self) -> Starter:
        if self.real is None:
            self.real = self.make()
            self.pool.starters.append(self.real)
        return self.real

    def _kind(self) -> Optional[Starter]:
        """The starter whose agents these are: this attempt's, else the job's first
        (a job's starters are all of one kind, :func:`~.starters.starter.starter_for`'s)."""
        return self.real or (self.pool.starters[0] if self.pool.starters else None)

    @property
    def plain_link(self) -> bool:
        kind = self._kind()
        return kind.plain_link if kind is not None else False

    @property
    def spares_later(self) -> bool:
        return (self._kind() or self._real()).spares_later

    @property
    def first_phase(self) -> str:
        return self.real.first_phase if self.real is not None else ""

    @property
    def begun(self) -> bool:
        return self.real.begun if self.real is not None else False

    def prepare(self, names: Sequence[str] = (), job: str = "") -> None:
        missing = [n for n in names if n not in self.pool.idle]
        if missing:
            self._real().prepare(missing, job)

    def close(self) -> None:
        """(The starters are the job's, closed with :meth:`KeptAgents.close`.)"""

    def start(self, names: Sequence[str], *, cancelled: Optional[Callable[[], bool]] = None,
              say: Optional[Callable[[str], None]] = None) -> Mapping[str, Any]:
        conns: Dict[str, Any] = self.pool.take(names)
        rest = [n for n in names if n not in conns]
        if rest:
            try:
                conns.update(self._real().start(rest, cancelled=cancelled, say=say))
            except HostsFailed as err:
                err.started.update(conns)
                raise
            except BaseException:
                for conn in conns.values():
                    self.pool.put(conn)
                raise
        return conns
