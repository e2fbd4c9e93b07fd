"""Each node's link to the node service of a multi-node msrun-mode job.

A :class:`NodeLink` connects to the service (:mod:`.service`) at one of the
master's addresses, proves it knows the job's secret (:mod:`.secret`, inside
TLS with :mod:`.tls` when asked), registers the node's workers and gets its
ranks back; from then on it carries ``stop`` both ways and the heartbeats.
For a job whose nodes start again together (:mod:`.rounds`), it also takes
the service's ``restart`` (the node comes back with :meth:`NodeLink.rejoin`)
and ``over``, and a failure here is sent as one the job may start again after.
"""

from __future__ import annotations

import functools
import os
import socket
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Optional, Tuple

    from ..machine.loop import Loop, Timer
    from ..core.states import LinkState

from ..wire import link
from ..wire.endpoint import SocketEndpoint
from ..core.errors import one_line
from ..core.states import (LINK_CONNECTING, LINK_ENDED, LINK_HANDSHAKING, LINK_JOINED,
                           LINK_PROVING, LINK_REGISTERING, LINK_WAITING)
from . import secret as auth
from .service import HANDSHAKE_SECONDS, NODE_LOST_EXIT, PROTOCOL, encode, node_message

#: Seconds the node service has, once connected, to prove it knows the job's
#: secret (its side gives a node 5 s; this one waits for the loop of a busy master).
PROOF_SECONDS = 15.0


class NodeLink:
    """A node's connection to the service: rendezvous, then stop in both directions.

    ``on_ranks(ranks)`` once the service has given this node its ranks,
    ``on_stop(code, message)`` when the job must end (another node's failure,
    the service refusing this node, the service lost).
    """

    def __init__(self, loop: Loop, *, addresses: List[str], port: int, secret: bytes,
                 tls=None, node_rank: int, workers: int, deadline: Optional[float],
                 heartbeat, on_ranks: Callable[[List[int]], None],
                 on_stop: Callable[[int, str], None], order: str = "",
                 store: Tuple[str, int] = ("", 0), rounds: bool = False, job: str = "",
                 log: Callable[[str], None] = lambda _text: None) -> None:
        self.loop = loop
        self.addresses = addresses
        self.port = port
        self.secret = secret
        self.tls = tls
        self.register: Dict[str, Any] = {"op": "register", "node_rank": node_rank, "workers": workers,
                         "host": os.uname().nodename, "pid": os.getpid()}
        if order:
            self.register["order"] = order          # see the service: ranks by this key
        if job:
            self.register["job"] = job              # torchrun's --rdzv-id
        self.store = store           # where this node's rank 0 would serve the job's store
        self.deadline = deadline
        self.heartbeat = heartbeat
        self.on_ranks = on_ranks
        self.on_stop = on_stop
        self.master_port = 0         # the master's MASTER_PORT, with the ranks
        self.master_addr = ""        # and its MASTER_ADDR, when the service names one
        self.rounds = rounds
        self.round: Dict[str, Any] = {}   # (rounds) the last "ranks" message
        self.restart: Optional[Dict[str, Any]] = None   # (rounds) the service's restart
        self.over = False                 # (rounds) every node's workers ended well
        self.ended_by: Optional[Tuple[int, str]] = None   # the stop that ended the link
        self.on_restart: Callable[[str], None] = lambda _text: None
        # a look inside this node's workers that another node asked for:
        # on_look(timeout, reply(rows)); rows are stacktree.row()'s dicts
        self.on_look: Optional[Callable[[float, Callable[[List[Any]], None]], None]] = None
        self._asked: Dict[int, Callable[[List[Any]], None]] = {}
        self.endpoint: Optional[SocketEndpoint] = None
        self.nonce = auth.new_nonce()
        self.state: LinkState = LINK_CONNECTING     # changed by _become alone
        self.log = log
        self.last_error = ""
        self.connected = ""
        self._handshaking = None
        self._try: Optional[Timer] = loop.call_later(0, self._connect)

    def _become(self, state: LinkState) -> None:
        """Every change of the link's state (see :data:`~mslaunch.core.states.LinkState`),
        said through ``log`` (``-v``)."""
        if state != self.state:
            self.log(f"node link: {self.state} -> {state}")
            self.state = state

    def listen(self, stop: Callable[[int, str], None],
               look: Callable[[float, Callable[[List[Any]], None]], None]) -> None:
        """The job here, once it runs: ``stop(code, text)`` ends it, and a new
        round of the service ends it too (its processes end whatever their code:
        1); ``look(timeout, reply)`` answers another node's look inside it."""
        self.on_stop = stop
        self.on_restart = lambda text: stop(1, text)
        self.on_look = look

    def _connect(self) -> None:
        self._try = None
        if self.state != LINK_CONNECTING:
            return
        for addr in self.addresses:
            try:
                # Blocking, 2 s at most: the kernel completes a TCP connect by
                # itself, even to the service in this very process.
                sock = socket.create_connection((addr, self.port), timeout=2.0)
            except OSError as err:
                self.last_error = err.strerror or str(err)
                continue
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setblocking(False)
            self.connected = f"{addr}:{self.port}"
            if self.store[1] and not self.store[0]:
                # unnamed: the address this host reaches the service from
                self.store = (sock.getsockname()[0], self.store[1])
            if self.tls is None:
                self._open(sock)
                return
            # The TLS handshake is driven by the loop: on the master node the
            # other side of it is the service, served by this same loop.
            self._become(LINK_HANDSHAKING)
            tls = self._handshaking = self.tls.wrap_socket(sock, do_handshake_on_connect=False)
            self._try = self.loop.call_later(
                HANDSHAKE_SECONDS, functools.partial(self._tls_failed, tls, "it timed out"))
            self._handshake(tls)
            return
        if self.deadline is not None and time.monotonic() > self.deadline:
            self._end(1, f"no node service at {self.addresses[0]}:{self.port} "
                         f"({self.last_error}); is the master node's mslaunch running?")
            return
        self._try = self.loop.call_later(0.2, self._connect)   # the master may start later

    def _handshake(self, sock) -> None:
        import ssl
        fd = sock.fileno()
        try:
            sock.do_handshake()
        except ssl.SSLWantReadError:
            self.loop.remove_writer(fd)
            self.loop.add_reader(fd, lambda: self._handshake(sock))
            return
        except ssl.SSLWantWriteError:
            self.loop.add_writer(fd, lambda: self._handshake(sock))
            return
        except (OSError, ValueError) as err:
            self._tls_failed(sock, str(getattr(err, "reason", None) or err))
            return
        self.loop.forget(fd)
        self._handshaking = None
        if self._try is not None:
            self._try.cancel()
            self._try = None
        self._open(sock)

    def _tls_failed(self, sock, reason: str) -> None:
        self._handshaking = None
        self.loop.forget(sock.fileno())
        try:
            sock.close()
        except OSError:
            pass
        self._end(1, f"TLS with the node service at {self.connected} failed ({reason}): "
                     f"do all nodes use the same --tls_config, with certificates from its CA?")

    def _open(self, sock) -> None:
        self._become(LINK_PROVING)
        self.endpoint = SocketEndpoint(self.loop, sock, on_frame=self._frame,
                                       on_closed=self._closed)
        # Whatever listens there must prove it knows the job's secret, and soon: a
        # program of another user's on the port would hold this node forever.
        self._try = self.loop.call_later(PROOF_SECONDS, self._unproven)

    def _unproven(self) -> None:
        self._try = None
        if self.state == LINK_PROVING:
            self._end(1, f"the node service at {self.connected} did not prove within "
                         f"{PROOF_SECONDS:g} s that it knows this job's secret: another "
                         f"program on that port?")

    def _frame(self, kind: int, body: bytes) -> None:
        message = node_message(kind, body)
        if message is None:
            return
        op = message.get("op")
        assert self.endpoint is not None
        if op == "refuse" and self.state == LINK_PROVING:
            # (the service's only refusals before its proof: another protocol, or
            # the wrong secret; anyone on the port may send this one)
            hint = f": {auth.mismatch_hint()}" if message.get("secret") is True else ""
            self._end(1, f"the node service at {self.connected} refused this node before "
                         f"proving it is this job's (it said "
                         f"{one_line(message.get('message', ''), 200)!r}){hint}")
        elif op in ("refuse", "stop") and self.state == LINK_PROVING:
            self._end(1, f"the program at {self.connected} sent {op!r} before proving it "
                         f"knows this job's secret (not taken as the job's): another "
                         f"program on the node service's port?")
        elif op == "refuse":
            self._end(1, f"the node service refused this node: "
                         f"{one_line(message.get('message', ''))}")
        elif op == "stop":
            code = message.get("code")
            self._end(code if isinstance(code, int) and 0 < code < 256 else 1,
                      one_line(message.get("message", ""), 600))
        elif self.state == LINK_PROVING and op == "hello":
            nonce = message.get("nonce")
            if not isinstance(nonce, str) or not auth.valid_nonce(nonce):
                raise link.LinkError("hello without a valid nonce")
            self.their_nonce = nonce
            self.endpoint.send(encode({
                "op": "auth", "protocol": PROTOCOL, "nonce": self.nonce,
                "proof": auth.proof(self.secret, "node", nonce, self.nonce),
                "heartbeat": list(self.heartbeat)}))
        elif self.state == LINK_PROVING and op == "welcome":
            if not auth.check(self.secret, "service", self.nonce, self.their_nonce,
                              message.get("proof")):
                self._end(1, "the node service does not know this job's secret (another "
                             "job's service on that port?): " + auth.mismatch_hint())
                return
            self._become(LINK_REGISTERING)
            if self._try is not None:
                self._try.cancel()
                self._try = None
            self.endpoint.start_heartbeat(*self.heartbeat)
            if self.store[1]:
                self.register["store"] = list(self.store)
            self.endpoint.send(encode(self.register))
        elif self.state == LINK_REGISTERING and op == "ranks":
            ranks = message.get("ranks")
            if not isinstance(ranks, list) or not all(type(r) is int for r in ranks):
                raise link.LinkError("ranks are not numbers")
            self._become(LINK_JOINED)
            port = message.get("master_port")
            if type(port) is int and 0 < port < 65536:
                self.master_port = port
            addr = message.get("master_addr")
            if isinstance(addr, str) and 0 < len(addr) <= 255:
                self.master_addr = addr
            self.round = message
            self.on_ranks(ranks)
        elif self.rounds and op == "restart" and self.state in (LINK_JOINED, LINK_WAITING):
            self._become(LINK_WAITING)
            self.restart = message
            self.on_restart(one_line(message.get("message", ""), 600))
        elif op == "look" and self.state != LINK_ENDED:
            self._look(message)
        elif op == "looked":
            ask = message.get("id")
            reply = self._asked.pop(ask, None) if type(ask) is int else None
            rows = message.get("rows")
            if reply is not None:
                reply(rows if isinstance(rows, list) else [])
        elif self.rounds and op == "over" and self.state in (LINK_JOINED, LINK_WAITING):
            self._become(LINK_ENDED)
            self.over = True
        else:
            raise link.LinkError(f"unexpected node message {str(op)[:20]!r}")

    def _closed(self, why: str) -> None:
        if self.state == LINK_PROVING:
            # Cut off before any greeting: the two sides disagree about TLS, or
            # the service refused this node's certificate.
            self._end(1, f"the node service at {self.connected} closed the connection "
                         f"before greeting this node ({why or 'no reason given'}): do all "
                         f"nodes use TLS alike (the same --tls_config, with certificates "
                         f"from its CA)?")
        elif self.state != LINK_ENDED:
            self._end(NODE_LOST_EXIT, f"lost the node service: {why or 'its link ended'}")

    def _end(self, code: int, text: str) -> None:
        if self.state == LINK_ENDED:
            return
        self._become(LINK_ENDED)
        self.ended_by = (code, text)
        if self._try is not None:
            self._try.cancel()
        self.on_stop(code, text)

    # -- this node's news -------------------------------------------------------
    def stop(self, code: int, text: str, restart: bool = False) -> None:
        """This node ends the job (a failure here, a signal, a timeout); with
        ``restart`` (a failure, in a job of rounds) the service may start it again."""
        if self.state in (LINK_ENDED, LINK_WAITING) or self.endpoint is None or self.endpoint.closed:
            return
        restart = restart and self.rounds
        self._become(LINK_WAITING if restart else LINK_ENDED)
        message: Dict[str, Any] = {"op": "stop", "code": code, "message": text[:500]}
        if restart:
            message["restart"] = True
        self.endpoint.send(encode(message))
        self.endpoint.flush(time.monotonic() + 2.0)

    def done(self) -> None:
        """Every process here ended well."""
        if self.state in (LINK_ENDED, LINK_WAITING) or self.endpoint is None or self.endpoint.closed:
            return
        self._become(LINK_WAITING if self.rounds else LINK_ENDED)
        self.endpoint.send(encode({"op": "done"}))
        self.endpoint.flush(time.monotonic() + 2.0)

    def ask_look(self, timeout: float, reply: Callable[[List[Any]], None]) -> bool:
        """Ask every other node for its workers' stacks (within ``timeout`` s);
        ``reply(rows)`` once, with what came.  False when there is no one to ask."""
        if self.state not in (LINK_JOINED, LINK_WAITING) or self.endpoint is None \
                or self.endpoint.closed:
            return False
        ask = len(self._asked) + 1
        while ask in self._asked:
            ask += 1
        self._asked[ask] = reply
        self.endpoint.send(encode({"op": "look", "id": ask, "timeout": timeout}))
        return True

    def _look(self, message: Dict[str, Any]) -> None:
        timeout, ask = message.get("timeout"), message.get("ask")
        endpoint = self.endpoint
        if self.on_look is None or endpoint is None or isinstance(timeout, bool) \
                or not isinstance(timeout, (int, float)) or not 0 < timeout <= 60:
            rows: List[Any] = []
            if endpoint is not None:
                endpoint.send(encode({"op": "looked-here", "ask": ask, "rows": rows}))
            return
        self.on_look(float(timeout), lambda rows: None if endpoint.closed else endpoint.send(
            encode({"op": "looked-here", "ask": ask, "rows": rows})))

    def rejoin(self, port: int = 0) -> None:
        """(rounds) Come back for the round the service's restart began, offering
        ``port`` (if given) for the store should rank 0 be here."""
        if self.state != LINK_WAITING or self.restart is None or self.endpoint is None:
            return
        self._become(LINK_REGISTERING)
        if port and "store" in self.register:
            self.register["store"] = [self.register["store"][0], port]
        self.endpoint.send(encode({**self.register, "round": self.restart.get("round")}))
        self.restart = None

    def close(self) -> None:
        self._become(LINK_ENDED)
        if self._try is not None:
            self._try.cancel()
        if self._handshaking is not None:
            self.loop.forget(self._handshaking.fileno())
            self._handshaking.close()
        if self.endpoint is not None and not self.endpoint.closed:
            self.endpoint.close("")
