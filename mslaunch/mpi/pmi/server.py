"""PMI connections and the server of one job.

``_Conn`` owns a socket, its buffers and the framing, and hands each request
to the handler of its wire (:mod:`.commands`, imported when the first message
arrives); :class:`PMIServer` hands out inherited sockets (``PMI_FD``) or
listens on TCP (``PMI_PORT``/``PMI_ID``) through its door (:mod:`.tcp`),
which authenticates the peers.
"""

from __future__ import annotations

from ...core import socket
import os
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Dict, FrozenSet, Optional, Sequence, Set, Tuple, Union

    from ...machine.loop import Loop, Timer
    from .commands import V1Handler, V2Handler
    from .state import JobState, PMIListener
    from .tcp import TCPDoor
    from .wire import Fields

from ...machine.loop import STRANGER_GRACE, QueuedWriter
from ...machine.osfiles import read_ready
from . import ABORTED, ACTIVE, DONE, NEW, READY, V2_PRE
from .state import LocalJobState
from .wire import (
    KVSNAME_MAX,
    MAX_ERRORS,
    MAX_MESSAGE,
    MAX_OUTPUT,
    MAX_PREAUTH_MESSAGE,
    WireError,
    _decode,
    take_frame,
    take_line,
)


class _Conn(QueuedWriter):
    """One PMI connection: socket, buffers, framing, request ordering."""

    send_flags = socket.MSG_NOSIGNAL
    high_water = MAX_OUTPUT       # replies a peer leaves unread before it is cut off

    def __init__(self, server: PMIServer, sock: socket.socket, rank: Optional[int], tcp: bool) -> None:
        super().__init__(server.loop, sock.fileno())
        self.server = server
        self.sock = sock
        self.rank = rank
        self.tcp = tcp
        self.phase = NEW if rank is None else READY
        self.inbuf = bytearray()
        self.proto: Optional[Union[V1Handler, V2Handler]] = None  # once the wire is known
        self.wire = ""
        self.spawn_request: object = None    # the SpawnRequest just read, or its problem
        self.waiting = 0
        self.pumping = False
        self.closed = False
        self.logged = False
        self.errors = 0
        self.auth_timer: Optional[Timer] = None
        self.accepted = time.monotonic()
        sock.setblocking(False)
        server.loop.add_reader(self.fd, self._on_readable)

    def describe(self) -> str:
        return f"rank {self.rank}" if self.rank is not None else f"unauthenticated connection fd {self.fd}"

    def log(self, text: str) -> None:
        if not self.logged:
            self.logged = True
            if self.rank is None:
                self.server.door.log_stranger(f"{self.describe()}: {text}")  # type: ignore[union-attr]
            else:
                self.server._emit_log(f"{self.describe()}: {text}")

    # -- failure handling ---------------------------------------------------
    def abandon(self, why: str) -> None:
        """Cut off a peer that broke the protocol; one log line."""
        if not self.closed:
            self.log(why + "; closing the connection")
            self.close()

    def violation(self, send_error: Callable[[], None], why: str) -> None:
        """A parseable but misplaced request: error reply, one log line."""
        self.errors += 1
        if self.errors > MAX_ERRORS:
            return self.abandon(f"{why} (too many errors)")
        self.log(why)
        send_error()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.auth_timer is not None:
            self.auth_timer.cancel()
        self.discard()
        self.server.loop.forget(self.fd)
        try:
            self.sock.close()
        except OSError:
            pass
        self.server._conn_closed(self)

    # -- input ----------------------------------------------------------------
    def _on_readable(self) -> None:
        started = time.perf_counter()
        try:
            self._read_and_handle()
        finally:
            self.server.busy_seconds += time.perf_counter() - started

    def _read_and_handle(self) -> None:
        try:
            data = read_ready(self.sock.fileno())
            if data is None:
                return
            if not data:
                self.close()
                return
            self.inbuf += data
            cap = MAX_PREAUTH_MESSAGE if self.rank is None else 2 * MAX_MESSAGE
            if len(self.inbuf) > cap and (self.waiting or self.rank is None):
                return self.abandon(f"sent more than {cap} bytes without waiting for replies")
            self.pump()
        except Exception as exc:  # never let a peer break the loop
            self.abandon(f"internal error {exc!r}")

    def pump(self) -> None:
        """Handle buffered requests in order; stops while a reply is pending."""
        if self.pumping:
            return
        self.pumping = True
        try:
            while not self.closed and not self.waiting:
                msg = self._next_message()
                if msg is None:
                    break
                cmd, fields = msg
                self.server._count(cmd)
                if self.server.trace:
                    self.server._trace(self, "->", cmd, fields)
                self.proto.handle(cmd, fields)  # type: ignore[union-attr]
        except WireError as exc:
            self.abandon(str(exc))
        finally:
            self.pumping = False

    def _next_message(self) -> Optional[Tuple[str, Fields]]:
        if self.proto is None:
            if len(self.inbuf) < 4:
                return None
            if self.inbuf.startswith((b"cmd=", b"mcmd")):
                from .commands import V1Handler
                self.wire, self.proto = "v1", V1Handler(self, self.server.state)
            else:
                self._use_v2()
        limit = MAX_PREAUTH_MESSAGE if self.rank is None else MAX_MESSAGE
        while True:
            if self.wire == "v2":
                body = take_frame(self.inbuf, limit)
                return None if body is None else self.proto.read(body)  # type: ignore[union-attr, arg-type]
            line = take_line(self.inbuf, limit)
            if line is None:
                return None
            msg = self.proto.read(_decode(line))  # type: ignore[union-attr, arg-type]
            if msg is not None:
                return msg

    def _use_v2(self) -> None:
        from .commands import V2Handler
        self.wire, self.proto = "v2", V2Handler(self, self.server.state, self.server.spawner)

    # -- what the command handlers call back ---------------------------------
    def switch_to_v2(self) -> None:
        self._use_v2()
        if self.phase != NEW:
            self.phase = V2_PRE

    def authenticate(self, pmiid: Optional[str]) -> bool:
        """Present a TCP peer's secret (``initack pmiid=``, ``fullinit pmirank=``)."""
        return self.server.door is not None and self.server.door.authenticate(self, pmiid)

    def initialized(self) -> None:
        self.phase = ACTIVE
        self.server._started(self.rank)

    def finalized(self) -> None:
        self.phase = DONE
        self.server.finalized.add(self.rank)  # type: ignore[arg-type]

    def aborted(self, code: int, message: str) -> None:
        self.phase = ABORTED
        self.server._emit_abort(self.rank, code, message)

    # -- replies held by the job state --------------------------------------
    def deferred(self, answer: Callable[..., None]) -> Callable[..., None]:
        """Wrap a reply the job state may call later; input is held until then."""
        self.waiting += 1
        called = False

        def reply(*args: object) -> None:
            nonlocal called
            if called or self.closed:
                return
            called = True
            self.waiting -= 1
            try:
                answer(*args)
                if not self.waiting:
                    self.pump()
            except Exception as exc:
                self.abandon(f"internal error {exc!r}")
        return reply

    def spawn(self, answer: Callable[..., None]) -> None:
        """Hand the spawn request just read to the listener; ``answer(error[, jobid])``."""
        request, self.spawn_request = self.spawn_request, None
        if isinstance(request, str) or request is None:
            self.log(f"a malformed spawn request ({request})")
            answer(request or "malformed")
            return
        hook = getattr(self.server.listener, "pmi_spawn", None)
        if hook is None:
            answer("spawn_not_supported_here")
            return
        hook(self.rank, request, self.deferred(answer))

    def enter_barrier(self, answer: Callable[[], None]) -> None:
        reply = self.deferred(answer)
        try:
            self.server.state.barrier(self.rank, reply)  # type: ignore[arg-type]
        except ValueError as exc:
            self.abandon(str(exc))

    # -- output ---------------------------------------------------------------
    def send(self, data: bytes) -> None:
        if self.closed:
            return
        if self.server.trace:
            self.server._trace_sent(self, data)
        self.put(data)

    def on_write_error(self, err: OSError) -> None:
        self.close()

    def on_high_water(self) -> None:
        self.abandon(f"does not read its replies ({self.queued} bytes queued)")

    def flush_some(self) -> None:
        try:
            super().flush_some()
        except Exception as exc:  # never let a peer break the loop
            self.abandon(f"internal error {exc!r}")


class PMIServer:
    """Serves the PMI-1 and PMI-2 wires of one job on a :class:`Loop`.

    Per rank, either ``child_fd(rank)`` (export ``PMI_FD``, ``PMI_RANK``,
    ``PMI_SIZE``) or, after ``listen_tcp()``, ``tcp_env(rank)``.
    """

    #: Seconds an unauthenticated TCP connection may take to present its PMI_ID
    #: (MPICH sends it right after connecting).
    auth_timeout = 2.0
    #: Seconds a stranger is safe from newer ones (see ``machine.peers.make_room``).
    evict_grace = STRANGER_GRACE
    #: At most this many lines about unauthenticated peers per window of seconds.
    stranger_log_limit = (5, 10.0)

    def __init__(self, loop: Loop, *, kvsname: str, size: int, process_mapping: str,
                 universe_size: int, appnums: Sequence[int], listener: PMIListener,
                 state: Optional[JobState] = None, spawner: Optional[str] = None) -> None:
        if size < 1:
            raise ValueError("size must be at least 1")
        if len(appnums) != size:
            raise ValueError(f"{len(appnums)} appnums for {size} ranks")
        if (not kvsname or len(kvsname) >= KVSNAME_MAX or kvsname in ("0", "singinit")
                or not all(c.isascii() and c.isalnum() or c in "_-.:" for c in kvsname)):
            # MPICH derives the shm segment name from it; "0"/"singinit" hang.
            raise ValueError(f"unusable kvsname {kvsname!r}")
        self.loop = loop
        self.listener = listener
        self.spawner = spawner        # the kvsname of the job that spawned this one
        self.trace = False            # every message to the listener's pmi_log (-v -v)
        self.state: JobState = state or LocalJobState(
            kvsname=kvsname, size=size, process_mapping=process_mapping,
            universe_size=universe_size, appnums=appnums)
        self.size = size
        self.stats: Dict[str, int] = {"total": 0}
        self._counted: Optional[FrozenSet[str]] = None   # the commands counted by name
        self.busy_seconds = 0.0   # time spent reading and answering ranks
        self.max_pending = 64 + size
        self._conns: Dict[int, _Conn] = {}
        self._child_socks: Dict[int, socket.socket] = {}
        self._socketpair_ranks: Set[int] = set()
        self._lost: Set[int] = set()
        self.started: Set[int] = set()     # ranks that initialized PMI
        self.finalized: Set[int] = set()   # ranks that finalized it
        self.door: Optional[TCPDoor] = None    # after listen_tcp(): see .tcp
        self._closed = False

    # -- inherited socket -------------------------------------------------------
    def child_fd(self, rank: int) -> int:
        """Create rank's socketpair; returns the inheritable child end (PMI_FD)."""
        self._check_rank(rank)
        if rank in self._socketpair_ranks:
            raise ValueError(f"rank {rank} already has a PMI socket")
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        os.set_inheritable(theirs.fileno(), True)
        self.adopt(rank, ours, theirs)
        return theirs.fileno()

    def adopt(self, rank: int, ours: socket.socket, theirs: Optional[socket.socket]) -> None:
        """Serve rank ``rank`` on a socket pair made before the server (``theirs``: its
        end, if not yet released)."""
        self._check_rank(rank)
        if rank in self._socketpair_ranks:
            raise ValueError(f"rank {rank} already has a PMI socket")
        self._socketpair_ranks.add(rank)
        if theirs is not None:
            self._child_socks[rank] = theirs
        conn = _Conn(self, ours, rank, tcp=False)
        self._conns[conn.fd] = conn

    def release_child_fds(self, rank: Optional[int] = None) -> None:
        """Close the child ends in the launcher (one rank's, or all) after spawning."""
        for r in ([rank] if rank is not None else list(self._child_socks)):
            sock = self._child_socks.pop(r, None)
            if sock is not None:
                sock.close()

    # -- TCP (see .tcp) ------------------------------------------------------------
    def listen_tcp(self, host: str = "127.0.0.1",
                   port_range: Optional[Tuple[int, int]] = None,
                   admit: Optional[Callable[[str], bool]] = None) -> int:
        """Listen for ``PMI_PORT`` clients on an IPv4 address, on a port of
        ``port_range`` if given, from the peers ``admit`` lets in (by address;
        None: any); returns the port."""
        if self.door is not None:
            raise RuntimeError("already listening")
        from .tcp import TCPDoor
        self.door = TCPDoor(self, lambda sock: _Conn(self, sock, None, tcp=True), admit)
        return self.door.listen(host, port_range)

    def tcp_env(self, rank: int) -> Dict[str, str]:
        """``PMI_PORT`` and ``PMI_ID`` for a rank that connects over TCP."""
        self._check_rank(rank)
        if self.door is None:
            raise RuntimeError("listen_tcp() first")
        return self.door.env(rank)

    # -- bookkeeping ----------------------------------------------------------
    def _check_rank(self, rank: int) -> None:
        if not 0 <= rank < self.size:
            raise ValueError(f"rank {rank} outside 0..{self.size - 1}")

    def _count(self, cmd: str) -> None:
        if self._counted is None:   # a connection has just loaded the handlers
            from .commands import COUNTED
            self._counted = COUNTED
        key = cmd if cmd in self._counted else "other"
        self.stats[key] = self.stats.get(key, 0) + 1
        self.stats["total"] += 1

    def _conn_closed(self, conn: _Conn) -> None:
        self._conns.pop(conn.fd, None)
        if conn.tcp and conn.rank is None and self.door is not None:
            self.door.closed(conn)
        if conn.rank is not None and conn.phase in (ACTIVE, V2_PRE) and not self._closed:
            if conn.rank not in self._lost:
                self._lost.add(conn.rank)
                try:
                    self.listener.pmi_lost(conn.rank)
                except Exception as exc:
                    self._emit_log(f"listener.pmi_lost raised {exc!r}")

    def _started(self, rank: Optional[int]) -> None:
        if rank is None or rank in self.started:
            return
        self.started.add(rank)
        hook = getattr(self.listener, "pmi_started", None)
        if hook is not None:
            try:
                hook(rank)
            except Exception as exc:
                self._emit_log(f"listener.pmi_started raised {exc!r}")

    def _emit_abort(self, rank: Optional[int], code: int, message: str) -> None:
        try:
            self.listener.pmi_abort(rank if rank is not None else -1, code, message,
                                    self.loop.events_at())
        except Exception as exc:
            self._emit_log(f"listener.pmi_abort raised {exc!r}")

    def _trace(self, conn: _Conn, arrow: str, cmd: str, fields: Fields) -> None:
        if cmd == "spawn" and conn.spawn_request is not None:
            what = f"cmd=spawn {conn.spawn_request!r}"[:2000]
        else:
            what = " ".join([f"cmd={cmd}"] + [f"{k}={v}" for k, v in fields.items()])
        self._emit_log(f"{conn.describe()} {arrow} {what}")

    def _trace_sent(self, conn: _Conn, data: bytes) -> None:
        text = data.decode("utf-8", "replace")
        if conn.wire == "v2":
            text = text[6:].replace(";", " ").strip()
        for line in text.splitlines():
            self._emit_log(f"{conn.describe()} <- {line}")

    def _emit_log(self, message: str) -> None:
        try:
            self.listener.pmi_log(message)
        except Exception:
            pass

    def close(self) -> None:
        """Unregister and close every socket (no pmi_lost is reported after this)."""
        self._closed = True
        for conn in list(self._conns.values()):
            conn.close()
        self.release_child_fds()
        if self.door is not None:
            self.door.close()

