"""The door of a PMIx server: the one address its ranks are told; the first one
that knocks starts the server, if it is not up yet.

Loading ``libpmix`` and starting its server costs some 20 ms of CPU, paid by
every job if it were done before the ranks start, though only Open MPI ranks
ever speak PMIx.  So a job is given the variables the server would give it
(:mod:`.template`), with this door's address in the URIs; when the first
rank connects, ``wake()`` starts the real server (on a thread of its own: the
loop goes on meanwhile) and registers the job, and every connection made to
the door is held until then, and joined to the server's own listener
(loopback) and its bytes carried both ways as they are, until either side
closes.  Ranks started once the server is up are given the door's address
too, and the server's own listener takes no connection but the door's: a
kernel filter on it (:class:`~mslaunch.machine.peers.Admission`) drops
every other, before the library sees it.  Only this user's processes on
this host are let in (:func:`~mslaunch.machine.peers.judge`): another
user's connection is closed before a byte of it is read, and starts
nothing.  A process of this user that knocks costs the server's start; the
library then reads its handshake as it reads any other.
"""

from __future__ import annotations

import errno

# the socket module's own import costs a millisecond a job, with or without PMIx
from ...core import socket
from ..early import listener

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Dict, List, Literal, Optional, Tuple

    from ...machine.loop import Loop
    from ...machine.peers import Admission

    #: Not knocked at yet; the server being started; started (or failed); closed.
    State = Literal["asleep", "waking", "awake", "closed"]
else:
    State = str

ASLEEP: State = "asleep"
WAKING: State = "waking"
AWAKE: State = "awake"
CLOSED: State = "closed"

#: Bytes read from one side at a time.
CHUNK = 1 << 16


class _Pipe:
    """One direction of a joined connection: what ``src`` sends goes to ``dst``."""

    __slots__ = ("door", "src", "dst", "pending", "pair")

    def __init__(self, door: Door, src: socket.socket, dst: socket.socket,
                 pair: List[_Pipe]) -> None:
        self.door, self.src, self.dst, self.pair = door, src, dst, pair
        self.pending = b""

    def readable(self) -> None:
        try:
            data = self.src.recv(CHUNK)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.door.part(self.pair)
            return
        self._send(data)

    def _send(self, data: bytes) -> None:
        try:
            sent = self.dst.send(data)
        except BlockingIOError:
            sent = 0
        except OSError:
            self.door.part(self.pair)
            return
        if sent < len(data):
            # the other side is slow: hold this one back until it takes the rest
            self.pending = data[sent:]
            self.door.loop.remove_reader(self.src.fileno())
            self.door.loop.add_writer(self.dst.fileno(), self.writable)

    def writable(self) -> None:
        data, self.pending = self.pending, b""
        self.door.loop.remove_writer(self.dst.fileno())
        self.door.loop.add_reader(self.src.fileno(), self.readable)
        self._send(data)


class Door:
    """See the module docstring: a listening socket on ``host`` (the address the
    server would have had), or ``sock``, one made before; ``wake(answer)``
    starts the server and calls ``answer`` in the loop with its address, or
    None if it could not (the knocking connections are then closed).
    Connections made meanwhile wait, unread, for the answer."""

    def __init__(self, loop: Loop, host: str,
                 wake: Callable[[Callable[[Optional[Tuple[str, int]]], None]], None],
                 sock: Optional[socket.socket] = None) -> None:
        self.loop = loop
        self.wake = wake
        self.target: Optional[Tuple[str, int]] = None
        self.state: State = ASLEEP
        self.waiting: List[socket.socket] = []
        self.pairs: Dict[int, List[_Pipe]] = {}
        #: The server's listener, filtered to take only the door's connections
        #: (set by the host once the server is up).
        self.admission: Optional[Admission] = None
        self.sock = sock if sock is not None else listener(host)
        self.port: int = self.sock.getsockname()[1]
        loop.add_reader(self.sock.fileno(), self._knock)

    def _knock(self) -> None:
        from ...machine.peers import judge
        while True:
            try:
                fd, _ = self.sock._accept()  # type: ignore[attr-defined]  # _socket names it so
            except (BlockingIOError, InterruptedError):
                return
            except OSError as err:
                if err.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    self.loop.pause_reader(self.sock.fileno(), 0.1)
                return
            conn = socket.socket(self.sock.family, socket.SOCK_STREAM, 0, fd)
            if judge(conn, local_only=True) != "ours":
                conn.close()        # another user's: never relayed, never a start
                continue
            if self.state == AWAKE:
                self._let_in(conn)
                continue
            self.waiting.append(conn)
            if self.state == ASLEEP:
                self.state = WAKING
                self.wake(self._answer)

    def open_at(self, target: Tuple[str, int]) -> None:
        """The server is up already: let every connection in, to ``target``."""
        if self.state == ASLEEP:
            self.state, self.target = AWAKE, target

    def _answer(self, target: Optional[Tuple[str, int]]) -> None:
        if self.state != WAKING:
            return          # closed meanwhile
        self.state, self.target = AWAKE, target
        waiting, self.waiting = self.waiting, []
        for conn in waiting:
            self._let_in(conn)

    def _let_in(self, conn: socket.socket) -> None:
        if self.target is None:
            conn.close()
        else:
            self._join(conn, self.target)

    def _join(self, conn: socket.socket, target: Tuple[str, int]) -> None:
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        source = 0
        try:
            if self.admission is not None:
                # from a port of ours, named to the listener's filter first
                server.bind((target[0], 0))
                source = server.getsockname()[1]
                self.admission.allow(source)
            # loopback, to a listener that is up: the connection is made at once
            server.connect(target)
        except OSError:
            server.close()
            conn.close()
            if source and self.admission is not None:
                self.admission.forget(source)
            return
        for s in (conn, server):
            s.setblocking(False)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        pair: List[_Pipe] = []
        pair += [_Pipe(self, conn, server, pair), _Pipe(self, server, conn, pair)]
        self.pairs[conn.fileno()] = pair
        for pipe in pair:
            self.loop.add_reader(pipe.src.fileno(), pipe.readable)

    def part(self, pair: List[_Pipe]) -> None:
        """One side closed: close both (the library then sees its client go)."""
        if self.pairs.pop(pair[0].src.fileno(), None) is None:
            return
        if self.admission is not None:
            try:            # the port the server's side was bound to, named to the filter
                self.admission.forget(pair[1].src.getsockname()[1])
            except OSError:
                pass
        for pipe in pair:
            self._forget(pipe.src)

    def close(self) -> None:
        """Stop listening and close every connection, joined or waiting."""
        self.state = CLOSED
        for conn in self.waiting:
            conn.close()
        self.waiting = []
        for pair in list(self.pairs.values()):
            self.part(pair)
        if self.sock.fileno() >= 0:
            self._forget(self.sock)

    def _forget(self, sock: socket.socket) -> None:
        try:
            self.loop.forget(sock.fileno())
        except (OSError, ValueError):
            pass        # a closed loop (an attempt's of --max-restarts, ended)
        sock.close()
