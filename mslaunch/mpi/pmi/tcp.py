"""The TCP door of a PMI server: ``PMI_PORT`` clients, let in by their ``PMI_ID``.

A :class:`TCPDoor` listens on an IPv4 address, hands each rank a secret
``PMI_ID``, accepts connections without letting idle strangers crowd out
real ranks (:func:`~mslaunch.machine.peers.accept_strangers`), gives each
stranger ``auth_timeout`` seconds to present its secret, and logs strangers
at a bounded rate.  Imported only when a job serves PMI over TCP.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    import socket
    from typing import Any, Callable, Dict, List, Optional, Set, Tuple

    from ...machine.loop import Timer

    # The server's types, not imported: the server imports this module.
    PMIServer = Any
    _Conn = Any

from ...machine.loop import CListener
from ...machine.peers import accept_strangers
from . import READY
from .wire import is_pmi_id


#: Seconds a peer that gave a wrong ``PMI_ID`` waits for its connection's end, and
#: how many wait at once before the door stops taking new connections until
#: one has been answered: see ``TCPDoor._wrong``.
TARPIT = 2.0
HELD = 256


class TCPDoor:
    """The listening socket of ``server`` and the peers not yet authenticated.

    ``make_conn`` wraps an accepted socket in the server's connection type.
    The limits (``auth_timeout``, ``max_pending``, ``evict_grace``,
    ``stranger_log_limit``) are read from the server, where they are set.
    """

    def __init__(self, server: PMIServer, make_conn: Callable[[socket.socket], _Conn],
                 admit: Optional[Callable[[str], bool]] = None) -> None:
        self.server = server
        self.make_conn = make_conn
        # Which peers' addresses may try a PMI_ID at all (None: any): a door open
        # to the network lets in only the hosts the job's ranks run on.
        self.admit = admit
        self.lsock: Optional[CListener] = None
        self.host = ""
        self.port = 0
        self.ids: Dict[int, int] = {}           # PMI_ID -> rank
        self.rank_ids: List[int] = []
        self.ranks: Set[int] = set()            # ranks that have come in
        self.pending = 0
        self.unauth: Dict[int, _Conn] = {}      # oldest first
        self._stranger_lines = 0
        self._stranger_suppressed = 0
        self._stranger_window: Optional[Timer] = None
        self.held: Set[_Conn] = set()            # wrong PMI_IDs, answered later
        self.full = False                        # HELD held: no connection accepted

    def listen(self, host: str, port_range: Optional[Tuple[int, int]] = None) -> int:
        """Listen on ``host``, on a port of ``port_range`` if given; returns the port."""
        from ...core import socket as _socket
        server = self.server
        lsock = CListener(_socket.AF_INET, _socket.SOCK_STREAM)
        try:
            if port_range is None:
                lsock.bind((host, 0))
            else:
                from ...machine.ports import bind_in_range
                # a port of the range whose last connection is in TIME-WAIT
                lsock.setsockopt(_socket.SOL_SOCKET, _socket.SO_REUSEADDR, 1)
                bind_in_range(lsock, host, port_range)
            lsock.listen(min(_socket.SOMAXCONN, max(128, server.size)))
            lsock.setblocking(False)
        except BaseException:
            lsock.close()
            raise
        self.lsock = lsock
        self.host = "127.0.0.1" if host in ("", "0.0.0.0") else host
        self.port = lsock.getsockname()[1]
        # MPICH atoi()s PMI_ID and sends it back with %d: positive 31-bit ints.
        while len(self.ids) < server.size:
            self.ids.setdefault(int.from_bytes(os.urandom(4), "big") % (2**31 - 1) + 1,
                                len(self.ids))
        self.rank_ids = [0] * server.size
        for pmi_id, rank in self.ids.items():
            self.rank_ids[rank] = pmi_id
        server.loop.add_reader(lsock.fileno(), self._on_accept)
        return self.port

    def env(self, rank: int) -> Dict[str, str]:
        """``PMI_PORT`` and ``PMI_ID`` of ``rank``."""
        return {"PMI_PORT": f"{self.host}:{self.port}", "PMI_ID": str(self.rank_ids[rank])}

    def _on_accept(self) -> None:
        try:
            self._accept_some()
        except Exception as exc:  # never let a peer break the loop
            self.server._emit_log(f"listener: internal error {exc!r}")

    def _accept_some(self) -> None:
        lsock, server = self.lsock, self.server
        if lsock is None or server._closed:
            return
        # Idle strangers must never cost a real rank its place: the
        # longest-waiting one makes room, once it has had its time.
        for sock, _addr in accept_strangers(
                server.loop, lsock, self.unauth.values, server.max_pending,
                lambda c: c.abandon("evicted: too many unauthenticated connections"),
                lambda text: server._emit_log(f"listener: {text}"), server.evict_grace,
                local_only=self.admit is None):
            if server._closed:
                sock.close()
                return
            if self.admit is not None and not self.admit(_addr[0]):
                sock.close()
                self.log_stranger(f"listener: refused a connection from {_addr[0]}, "
                                  f"no host of the job's")
                continue
            try:
                conn = self.make_conn(sock)
            except OSError:
                sock.close()
                continue
            self.pending += 1
            self.unauth[conn.fd] = conn
            server._conns[conn.fd] = conn
            conn.auth_timer = server.loop.call_later(
                server.auth_timeout, lambda c=conn: c.abandon("no initack within the time limit"))
            # A rank sends its PMI_ID right after connecting: read it now.
            conn._on_readable()
            if self.full:
                return              # the next connection waits in the kernel's queue

    def authenticate(self, conn: _Conn, pmiid: Optional[str]) -> bool:
        """Let ``conn`` in as the rank whose secret ``pmiid`` is, or cut it off."""
        rank = self.ids.get(int(pmiid)) if pmiid and is_pmi_id(pmiid) else None
        if rank is None:
            self._wrong(conn)
            return False
        if rank in self.ranks:
            conn.abandon(f"PMI_ID of rank {rank} used twice")
            return False
        self.ranks.add(rank)
        conn.rank = rank
        conn.phase = READY
        self.pending -= 1
        self.unauth.pop(conn.fd, None)
        if conn.auth_timer is not None:
            conn.auth_timer.cancel()
            conn.auth_timer = None
        return True

    def _wrong(self, conn: _Conn) -> None:
        """A wrong ``PMI_ID``: the peer learns it only :data:`TARPIT` s later (its
        connection is held, unread, and no longer counts among the strangers).

        MPICH's ``PMI_ID`` is an int, 31 bits: a process that may connect (another
        user's here, or on a host of the job over TCP) could guess the secrets of
        ranks not yet in ``MPI_Init`` at thousands a second.  Held answers bound
        it to :data:`HELD` per :data:`TARPIT` s, with no lockout: a real rank from
        the same address still comes in (a lockout would let any process end the
        job with 16 wrong tries).  Once :data:`HELD` wait, the door takes no new
        connection until one has been answered (they wait in the kernel's
        queue, a real rank's too, a few seconds at most): each connection
        already taken still has its one try, so that a real rank among them
        gets in, and is held whatever it guessed.  Answering at once past the
        limit would tell a flood of tries which are wrong as fast as it sends
        them."""
        if self.unauth.pop(conn.fd, None) is not None:
            self.pending -= 1
        if conn.auth_timer is not None:
            conn.auth_timer.cancel()
            conn.auth_timer = None
        self.server.loop.forget(conn.fd)
        self.held.add(conn)
        conn.log("wrong PMI_ID; closing the connection")
        conn.logged = True

        def answer() -> None:
            self.held.discard(conn)
            conn.close()
            if self.full and len(self.held) < HELD and self.lsock is not None:
                self.full = False
                self.server.loop.add_reader(self.lsock.fileno(), self._on_accept)
        self.server.loop.call_later(TARPIT, answer)
        if len(self.held) >= HELD and not self.full and self.lsock is not None:
            self.full = True
            self.server.loop.remove_reader(self.lsock.fileno())

    def closed(self, conn: _Conn) -> None:
        """A stranger's connection closed before it authenticated."""
        if self.unauth.pop(conn.fd, None) is not None:
            self.pending -= 1

    def log_stranger(self, message: str) -> None:
        """Rate-limited log of unauthenticated peers (a flood must not flood the terminal)."""
        limit, window = self.server.stranger_log_limit
        if self._stranger_window is None:
            self._stranger_window = self.server.loop.call_later(window, self._window_end)
        if self._stranger_lines < limit:
            self._stranger_lines += 1
            self.server._emit_log(message)
        else:
            self._stranger_suppressed += 1

    def _window_end(self) -> None:
        self._stranger_window = None
        self._stranger_lines = 0
        if self._stranger_suppressed:
            count, self._stranger_suppressed = self._stranger_suppressed, 0
            self.server._emit_log(f"listener: {count} more unauthenticated connection(s) closed")

    def close(self) -> None:
        if self.lsock is not None:
            self.server.loop.forget(self.lsock.fileno())
            self.lsock.close()
            self.lsock = None
