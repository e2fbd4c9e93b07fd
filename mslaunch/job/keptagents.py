"""Agents kept between the attempts of a job run with ``--max-restarts``.

An attempt that fails stops its ranks on every host; an agent whose ranks have
all ended, whose output is all in and whose link is sound is then told
``NEXT`` (see :mod:`mslaunch.remote.agent`) rather than ``BYE``: it forgets
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

from ..remote.starter import let_go

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

    from ..remote.starter import AgentConnection, Starter

#: Seconds a kept agent waits for its next job before it exits: the longest
#: back-off between attempts (:data:`.attempts.MAX_BACKOFF`), the stop of a
#: failed attempt and the health check, with room to spare.
IDLE = 30.0


class KeptAgents:
    """The job's agents between attempts; see the module docstring."""

    def __init__(self) -> None:
        self.idle: Dict[str, AgentConnection] = {}
        self.starters: List[Starter] = []     # those that started agents, in order

    def put(self, conn: AgentConnection) -> None:
        """An agent with no job (told ``NEXT``, or never given one) for a later attempt."""
        old = self.idle.pop(conn.name, None)
        if old is not None:
            let_go(old)
        self.idle[conn.name] = conn

    def take(self, names: Sequence[str]) -> Dict[str, AgentConnection]:
        """The waiting agents of ``names`` whose links are still sound."""
        taken = {}
        for name in names:
            conn = self.idle.pop(name, None)
            if conn is None:
                continue
            if _sound(conn.fd):
                taken[name] = conn
            else:
                let_go(conn)
        return taken

    def starter(self, make: Callable[[], Starter]) -> Starter:
        """The attempt's starter: agents from here first, ``make()``'s for the rest."""
        return _KeptFirst(self, make)

    def let_go_all(self) -> None:
        """Every waiting agent goes (the next attempt starts its own)."""
        for conn in self.idle.values():
            let_go(conn)
        self.idle = {}

    def close(self) -> None:
        """The job ended: every waiting agent goes, then the starters."""
        self.let_go_all()
        for starter in self.starters:
            starter.close()
        self.starters = []


def _sound(fd: int) -> bool:
    """Whether a waiting agent's link can be taken up again: open, with nothing
    to read but heartbeats (sent before the agent read ``NEXT``), and no part
    of a frame."""
    from ..remote import link
    reader = link.Reader()
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    while poller.poll(0):
        try:
            data = os.read(fd, 1 << 16)
        except BlockingIOError:
            break
        except OSError:
            return False
        if not data:
            return False                       # the agent is gone
        try:
            frames = reader.feed(data)
        except link.LinkError:
            return False
        if any(kind != link.BEAT for kind, _ in frames):
            return False
    return not reader.buf


class _KeptFirst:
    """A :class:`~mslaunch.remote.starter.Starter` that hands out kept agents and
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
        (a job's starters are all of one kind, :func:`~mslaunch.remote.starter.starter_for`'s)."""
        return self.real or (self.pool.starters[0] if self.pool.starters else None)

    @property
    def plain_link(self) -> bool:
        kind = self._kind()
        return kind.plain_link if kind is not None else False

    @property
    def one_fate(self) -> bool:
        kind = self._kind()
        return kind.one_fate if kind is not None else False

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
            except BaseException:
                for conn in conns.values():
                    self.pool.put(conn)
                raise
        return conns
