"""The node service of a multi-node msrun-mode job (each node's link to it: :mod:`.nodelink`).

The same command runs on every node.  The node whose addresses include
``--master_addr`` hosts the service (on ``--node_service_port``, default
``--master_port`` + 1: MindSpore's scheduler keeps ``--master_port``); every
node, that one included, connects to it, proves it knows the job's secret
(:mod:`.secret`; inside TLS with :mod:`.tls`), and registers its local
workers.  The service hands out ranks -- ``--node_rank`` * local + i when a
node gives its rank; for a node that gives a sort key instead (torchrun's
c10d rendezvous: its address), once every worker has come, in the order of
the keys and then the pids, as torchrun's rendezvous ranks its nodes; else
the lowest free ranks in the order nodes register -- and refuses a node whose workers would go beyond
``--worker_num`` or whose ranks another node holds.  From then on the
service is how one node's failure, Ctrl-C or timeout ends the job on every
node within a moment, each exiting with the root cause's status: a node
sends ``stop`` and the service tells every other node to stop.  A node that
vanishes (its link ends, or heartbeats stop) stops the job the same way,
named.  If not every worker has joined after ``--cluster_time_out``
seconds, every node ends with one line saying how many came from where.

Messages are the agents' link frames (:mod:`mslaunch.wire.link`), kind
``NODE``, a JSON object each.  Until a peer has proven the secret its
frames may be at most 4 KiB and it has :data:`AUTH_SECONDS` to do so; at
most :data:`MAX_PENDING` such peers are kept, the oldest pushed out first
(once it has had a moment to speak);
a peer that breaks the protocol is cut off with one rate-limited log line.
"""

from __future__ import annotations

import errno
import functools
import socket
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Optional, Tuple

    from ..core.spec import NodeRounds
    from ..core.states import NodeState
    from ..machine.loop import Loop, Timer

from ..wire import link
from .looks import Looks
from .rounds import GATHERING, OVER, Rounds
from ..wire.endpoint import SocketEndpoint
from ..machine.peers import accept_strangers
from ..core.errors import LaunchError, one_line
from ..core.states import NODE_DONE, NODE_GONE, NODE_HELD, NODE_JOINED, NODE_NEW, NODE_STOPPED
from . import secret as auth

PROTOCOL = 1
AUTH_SECONDS = 5.0
MAX_PENDING = 64
PREAUTH_FRAME = 4096
HANDSHAKE_SECONDS = 5.0
#: What a user of MS_ENABLE_RECOVERY=1 is told when a node is lost.
LOST_WITH_RECOVERY = ("; MS_ENABLE_RECOVERY=1 restarts failed workers in place, not a lost "
                      "node: run the job again on the nodes left (a checkpoint lets it "
                      "resume), or in the mpirun dialect with --max-restarts N and a spare "
                      "host, which leaves a lost host out by itself")

#: Exit status when a node of the job is lost (ssh and Hydra use the same).
NODE_LOST_EXIT = 255


def encode(message: Dict[str, Any]) -> bytes:
    return link.encode(link.NODE, message)


def node_message(kind: int, body: bytes) -> Optional[Dict[str, Any]]:
    """A node frame's message; None for a heartbeat; LinkError for any other frame."""
    if kind == link.BEAT:
        return None
    if kind != link.NODE:
        raise link.LinkError(f"unexpected {link.NAMES[kind]} frame")
    return link.decode_json(kind, body)


def _store(value: Any) -> Optional[Tuple[str, int]]:
    """A node's ``[address, port]`` for its store, if well formed."""
    if (isinstance(value, list) and len(value) == 2 and isinstance(value[0], str)
            and 0 < len(value[0]) <= 255 and type(value[1]) is int and 0 < value[1] < 65536):
        return value[0], value[1]
    return None


def _heartbeat(value: Any) -> Tuple[float, int]:
    """A node's heartbeat setting ``[interval, misses]``, within sane bounds."""
    if not isinstance(value, list) or len(value) != 2 or \
            not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
        raise link.LinkError("bad heartbeat setting")
    interval, misses = float(value[0]), int(value[1])
    if not (0.01 <= interval <= 3600 and 1 <= misses <= 1000):
        raise link.LinkError("heartbeat setting out of range")
    return interval, misses


class _Peer:
    """One node's connection at the service."""

    def __init__(self, service: NodeService, sock, address: str) -> None:
        self.service = service
        self.address = address
        self.nonce = auth.new_nonce()
        self.authenticated = False
        self.handshaking = service.tls is not None
        self.endpoint: Optional[SocketEndpoint] = None
        self.sock = sock
        self.timer: Optional[Timer] = None
        self.accepted = time.monotonic()
        self.info: Dict[str, Any] = {}
        self.ranks: List[int] = []
        self.state: NodeState = NODE_NEW     # changed by become() alone
        self.order = ""               # the sort key a held node gave
        self.store: Optional[Tuple[str, int]] = None   # where its rank 0 would serve the store
        self.rank_given: Optional[int] = None          # (rounds) its --node-rank

    def name(self) -> str:
        host = self.info.get("host") or self.address
        return f"{one_line(host, 64)} (pid {self.info.get('pid', '?')})"

    def become(self, state: NodeState) -> None:
        """Every change of the node's state (see :data:`~mslaunch.core.states.NodeState`),
        said in ``-v`` (a node changes it only once it proved it knows the job's secret:
        a stranger's coming and going is noted, rate-limited, where it is refused)."""
        if state != self.state:
            self.service.log(f"node service: node {self.name()}: {self.state} -> {state}")
            self.state = state


class ServiceTaken(LaunchError):
    """The service's port is taken on its address: another node of the job, on
    this host, hosts the service (torchrun's c10d rendezvous), or another job."""


class NodeService:
    """The master node's service; see the module docstring."""

    def __init__(self, loop: Loop, *, address: str, port: int, secret: bytes,
                 worker_num: int, time_out: int, tls=None,
                 log: Callable[[str], None], master_port: int = 0,
                 refused: Optional[Callable[[str], None]] = None,
                 recovery: bool = False, rounds: Optional[NodeRounds] = None,
                 rank_flag: str = "--node_rank", every_node_first: bool = False,
                 job_name: str = "") -> None:
        self.loop = loop
        self.job_name = job_name                   # torchrun's --rdzv-id: others are refused
        self.rank_flag = rank_flag                 # the line's own spelling, for errors
        #: Nodes with a rank of their own get it once every node came (torchrun's
        #: static rendezvous); msrun's start their workers at once.
        self.every_node_first = every_node_first
        self.rounds = None if rounds is None else Rounds(self, rounds, time_out)
        self.looks = Looks(self)
        self.recovery = recovery                   # MS_ENABLE_RECOVERY=1 (see _closed)
        self.master_port = master_port
        self.refused_by: Dict[str, str] = {}       # refused node -> why (for the time out)
        self._refused_say = refused or log         # said without -v too
        self.secret = secret
        self.worker_num = worker_num
        self.tls = tls
        self.log = log
        self.peers: Dict[int, _Peer] = {}          # by socket fd
        self.taken: Dict[int, _Peer] = {}          # rank -> node
        self.stopped: Optional[Dict[str, Any]] = None
        self.started = time.monotonic()
        self._lines = 0
        self._window_end = 0.0
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.sock.bind((address, port))
            self.sock.listen(128)
        except OSError as err:
            self.sock.close()
            from ..core.errors import LaunchError
            if err.errno == errno.EADDRINUSE:
                raise ServiceTaken(f"the node service cannot listen on {address}:{port}: "
                                   f"{err.strerror} (another job there? "
                                   f"--node_service_port picks another port)") from None
            raise LaunchError(f"the node service cannot listen on {address}:{port}: "
                              f"{err.strerror}") from None
        self.sock.setblocking(False)
        loop.add_reader(self.sock.fileno(), self._accept)
        self.deadline: Optional[Timer] = None
        if time_out >= 0:
            self.deadline = loop.call_later(max(time_out, 0), self._time_out)

    # -- connections --------------------------------------------------------------
    def _accept(self) -> None:
        for sock, addr in accept_strangers(
                self.loop, self.sock, lambda: [p for p in self.peers.values() if not p.authenticated],
                MAX_PENDING, lambda p: self._drop(
                    p, "too many unproven connections; the oldest is dropped"), self._note):
            if self.tls is not None:
                sock = self.tls.wrap_socket(sock, server_side=True,
                                            do_handshake_on_connect=False)
            peer = _Peer(self, sock, addr[0])
            self.peers[sock.fileno()] = peer
            peer.timer = self.loop.call_later(AUTH_SECONDS, functools.partial(
                self._drop, peer, f"no proof of the secret within {AUTH_SECONDS:g} s"))
            if peer.handshaking:
                self.loop.add_reader(sock.fileno(), functools.partial(self._handshake, peer))
                self._handshake(peer)
            else:
                self._open(peer)

    def _handshake(self, peer: _Peer) -> None:
        import ssl
        try:
            peer.sock.do_handshake()
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
            return
        except (OSError, ValueError) as err:
            reason = getattr(err, "reason", None) or err.__class__.__name__
            self._drop(peer, f"TLS handshake failed ({reason})")
            return
        self.loop.forget(peer.sock.fileno())
        peer.handshaking = False
        self._open(peer)

    def _open(self, peer: _Peer) -> None:
        peer.endpoint = SocketEndpoint(self.loop, peer.sock,
                                       on_frame=lambda k, b, p=peer: self._frame(p, k, b),
                                       on_closed=lambda why, p=peer: self._closed(p, why))
        peer.endpoint.reader.max_frame = PREAUTH_FRAME
        peer.endpoint.send(encode({"op": "hello", "protocol": PROTOCOL,
                                   "nonce": peer.nonce}))

    def _drop(self, peer: _Peer, why: str) -> None:
        if self.peers.pop(peer.sock.fileno(), None) is None:
            return
        if peer.timer is not None:
            peer.timer.cancel()
        if peer.endpoint is not None:
            peer.endpoint.on_closed = lambda _why: None
            peer.endpoint.close("")
        else:
            self.loop.forget(peer.sock.fileno())
            try:
                peer.sock.close()
            except OSError:
                pass
        self._note(f"closed a connection from {peer.address}: {why}")

    def _note(self, text: str, say: Optional[Callable[[str], None]] = None) -> None:
        # At most five lines per ten seconds about peers that were turned away.
        now = time.monotonic()
        if now > self._window_end:
            self._window_end, self._lines = now + 10.0, 0
        self._lines += 1
        if self._lines <= 5:
            (say or self.log)(f"node service: {text}")

    # -- messages ---------------------------------------------------------------
    def _frame(self, peer: _Peer, kind: int, body: bytes) -> None:
        message = node_message(kind, body)
        if message is None:
            return
        op = message.get("op")
        if not peer.authenticated:
            if op != "auth":
                self._drop(peer, f"{str(op)[:20]!r} before proof of the secret")
                return
            if message.get("protocol") != PROTOCOL:
                self._refuse(peer, f"this node speaks another protocol "
                                   f"({one_line(message.get('protocol'), 10)}, the service "
                                   f"{PROTOCOL}): run the same mslaunch on every node")
                return
            theirs = message.get("nonce")
            if not isinstance(theirs, str) or not auth.valid_nonce(theirs) or not auth.check(
                    self.secret, "node", peer.nonce, theirs, message.get("proof")):
                # The node is told no more than that: the hint it prints is its
                # own (this one names the service owner's secret file).
                self._refuse(peer, "this node's secret is not the job's",
                             here=f": {auth.mismatch_hint()}", wrong_secret=True)
                return
            peer.authenticated = True
            if peer.timer is not None:
                peer.timer.cancel()
            assert peer.endpoint is not None
            peer.endpoint.reader.max_frame = 1 << 20
            interval, misses = _heartbeat(message.get("heartbeat"))
            peer.endpoint.send(encode({"op": "welcome", "proof": auth.proof(
                self.secret, "service", theirs, peer.nonce)}))
            peer.endpoint.start_heartbeat(float(interval), int(misses))
            return
        if op == "register":
            self._register(peer, message)
        elif op == "stop":
            self._node_stopped(peer, message)
        elif op == "look":
            self.looks.ask(peer, message)
        elif op == "looked-here":
            self.looks.answered(peer, message)
        elif op == "done":
            peer.become(NODE_DONE)
            if self.rounds is not None:
                self.rounds.done(peer)
        else:
            raise link.LinkError(f"unknown node message {str(op)[:20]!r}")

    def _refuse(self, peer: _Peer, text: str, here: str = "",
                wrong_secret: bool = False) -> None:
        """Refuse ``peer``, telling it ``text`` (and this service's own log ``here`` more)."""
        who = peer.name() if peer.info else peer.address
        self.refused_by[who] = text + here
        self._note(f"refused node {who}: {text}{here}", self._refused_say)
        if peer.endpoint is not None:
            peer.endpoint.send(encode({"op": "refuse", "message": text,
                                       "secret": wrong_secret}))
            peer.endpoint.flush(time.monotonic() + 1.0)
        self.peers.pop(peer.sock.fileno(), None)
        if peer.timer is not None:
            peer.timer.cancel()
        if peer.endpoint is not None:
            peer.endpoint.on_closed = lambda _why: None
            peer.endpoint.close("")

    # -- what rounds (:mod:`.rounds`) use ----------------------------------------------
    def refuse(self, peer: _Peer, text: str) -> None:
        self._refuse(peer, text)

    def send(self, peer: _Peer, message: Dict[str, Any]) -> None:
        if peer.endpoint is not None and not peer.endpoint.closed:
            peer.endpoint.send(encode(message))

    def began(self, workers: int) -> None:
        """A round began with ``workers`` workers: no cluster time out from now on."""
        self.worker_num = max(self.worker_num, workers)
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None

    def _register(self, peer: _Peer, message: Dict[str, Any]) -> None:
        again = self.rounds is not None and peer.state == NODE_HELD and \
            peer not in self.rounds.waiting
        if peer.state != NODE_NEW and not again:
            raise link.LinkError("a node registered twice")
        order = message.get("order")
        workers = link.field(message, "workers", int, "register")
        node_rank = link.field(message, "node_rank", int, "register")
        peer.info = {"host": str(message.get("host", ""))[:64],
                     "pid": message.get("pid") if isinstance(message.get("pid"), int) else "?",
                     "workers": workers}
        if self.stopped is not None:
            self._refuse(peer, f"the job has already ended: {self.stopped['message']}")
            return
        job = message.get("job", "")
        if job != self.job_name:
            self._refuse(peer, f"the service here is --rdzv-id "
                               f"{one_line(self.job_name, 60)!r}'s, not "
                               f"{one_line(str(job), 60)!r}'s: give each job an endpoint "
                               f"of its own")
            return
        if not 1 <= workers <= self.worker_num:
            self._refuse(peer, f"{workers} local workers is not within 1..{self.worker_num}")
            return
        if self.rounds is not None:
            peer.order = order[:256] if isinstance(order, str) else ""
            peer.store = _store(message.get("store"))
            self.rounds.register(peer, message)
            return
        if node_rank >= 0:
            wanted = [node_rank * workers + i for i in range(workers)]
            if wanted[-1] >= self.worker_num:
                self._refuse(peer, f"{self.rank_flag}={node_rank} gives ranks {wanted[0]}-"
                                   f"{wanted[-1]}, beyond --worker_num={self.worker_num}")
                return
            clash = [r for r in wanted if r in self.taken]
            if clash:
                other = self.taken[clash[0]]
                flag = self.rank_flag
                self._refuse(peer, f"{flag}={node_rank}: rank {clash[0]} belongs to node "
                                   f"{other.name()} already; give each node its own {flag}")
                return
        else:
            free = [r for r in range(self.worker_num) if r not in self.taken]
            wanted = free[:workers]
        if self._joined() + workers > self.worker_num:
            have = self._joined()
            self._refuse(peer, f"the job has {have} of its {self.worker_num} workers already; "
                               f"this node's {workers} are {have + workers - self.worker_num} "
                               f"too many (check --worker_num and --local_worker_num)")
            return
        if node_rank < 0 and isinstance(order, str) and order:
            peer.order = order[:256]
            peer.become(NODE_HELD)
            peer.store = _store(message.get("store"))
        elif node_rank >= 0 and self.every_node_first:
            # Its ranks are its own already, kept for it until every node came.
            peer.ranks = wanted
            peer.become(NODE_HELD)
            for r in wanted:
                self.taken[r] = peer
        else:
            self._give(peer, wanted)
            return
        if self._joined() == self.worker_num:
            self._give_held()
        else:
            self._note(f"node {peer.name()} waits for every node: {self._joined()} of "
                       f"{self.worker_num} workers came")

    def _give_held(self) -> None:
        """Every worker has come: the held nodes' ranks in the order of their keys
        and pids, and the first one's store for every node (torchrun's c10d
        rendezvous: rank 0's node names MASTER_ADDR and a free port of its own)."""
        held = sorted((p for p in self.peers.values() if p.state == NODE_HELD),
                      key=lambda p: (p.order, p.info["pid"] if p.info["pid"] != "?" else 0))
        for p in [p for p in held if p.ranks]:        # (ranks of their own)
            self._give(p, p.ranks)
        held = [p for p in held if p.state == NODE_HELD]
        free = [r for r in range(self.worker_num) if r not in self.taken]
        master = held[0].store if held and free and free[0] == 0 else None
        for p in held:
            self._give(p, free[:p.info["workers"]], master)
            free = free[p.info["workers"]:]

    def _held_workers(self) -> int:
        """Workers of nodes held for ranks not chosen yet (a node's own are taken)."""
        return sum(p.info["workers"] for p in self.peers.values()
                   if p.state == NODE_HELD and not p.ranks)

    def _joined(self) -> int:
        """How many workers have come: those with ranks and those held for theirs."""
        return len(self.taken) + self._held_workers()

    def _give(self, peer: _Peer, ranks: List[int],
              master: Optional[Tuple[str, int]] = None) -> None:
        peer.ranks = ranks
        peer.become(NODE_JOINED)
        for r in ranks:
            self.taken[r] = peer
        assert peer.endpoint is not None
        message: Dict[str, Any] = {"op": "ranks", "ranks": ranks, "master_port": self.master_port}
        if master is not None:
            message["master_addr"], message["master_port"] = master
        peer.endpoint.send(encode(message))
        if len(self.taken) == self.worker_num and self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None

    # -- the end ------------------------------------------------------------------
    def _node_stopped(self, peer: _Peer, message: Dict[str, Any]) -> None:
        code = message.get("code")
        text = one_line(message.get("message", ""))
        if self.rounds is not None and message.get("restart") is True:
            peer.become(NODE_HELD)
            self.rounds.failed(peer, code if isinstance(code, int) and 0 < code < 256 else 1,
                               text or "its workers failed", True)
            return
        peer.become(NODE_STOPPED)
        if self.rounds is not None:
            self.rounds.phase = OVER
        self.stop(code if isinstance(code, int) and 0 < code < 256 else 1,
                  f"on {peer.name()}: {text}" if text else f"node {peer.name()} stopped",
                  exclude=peer)

    def _closed(self, peer: _Peer, why: str) -> None:
        self.peers.pop(peer.sock.fileno(), None)
        self.looks.gone(peer)
        if peer.timer is not None:
            peer.timer.cancel()
        if not peer.authenticated:
            self._note(f"closed a connection from {peer.address}: {why or 'it went away'}")
            return
        if self.rounds is not None:
            if self.stopped is None and self.rounds.phase != OVER:
                self.rounds.lost(peer, why or "its link ended", NODE_LOST_EXIT)
            peer.become(NODE_GONE)
        elif peer.state == NODE_HELD:
            # torchrun's rendezvous forgets a node that leaves before it completes
            peer.become(NODE_GONE)
            for r in peer.ranks:
                self.taken.pop(r, None)
            peer.ranks = []
            self._note(f"node {peer.name()} left before every worker came: "
                       f"{why or 'its link ended'}")
        elif peer.state in (NODE_JOINED, NODE_NEW) and self.stopped is None:
            peer.become(NODE_GONE)
            self.stop(NODE_LOST_EXIT, f"lost node {peer.name()}: {why or 'its link ended'}"
                      + (LOST_WITH_RECOVERY if self.recovery else ""))

    def _time_out(self) -> None:
        self.deadline = None
        if self.rounds is not None:
            if self.rounds.round == 0 and self.rounds.phase == GATHERING:
                self.stop(1, f"join time out: {len(self.rounds.waiting)} of at least "
                             f"{self.rounds.min} node(s) came in "
                             f"{int(time.monotonic() - self.started)} s (--rdzv-conf "
                             f"join_timeout)")
            return
        if len(self.taken) >= self.worker_num or self.stopped is not None:
            return
        nodes = [p for p in self.peers.values() if p.state in (NODE_JOINED, NODE_HELD, NODE_DONE)]
        seen = ", ".join(f"{p.name()} with {p.info['workers']}" for p in nodes[:8]) or "none"
        self.stop(1, f"cluster time out: only {self._joined()} of {self.worker_num} workers "
                     f"joined in {int(time.monotonic() - self.started)} s (nodes: {seen}); "
                     f"{self.worker_num - self._joined()} missing" + (
                         "; refused: " + "; ".join(f"{k} ({v[:80]})" for k, v in
                                                   list(self.refused_by.items())[:4])
                         if self.refused_by else ""))

    def stop(self, code: int, text: str, exclude: Optional[_Peer] = None) -> None:
        """End the job on every node (the first stop is the root cause)."""
        if self.stopped is not None:
            return
        self.stopped = {"code": code, "message": text}
        for peer in list(self.peers.values()):
            if peer is not exclude and peer.authenticated and peer.endpoint is not None:
                peer.endpoint.send(encode({"op": "stop", "code": code, "message": text}))

    def settled(self) -> bool:
        """Whether the job is over for the service: stopped, or every worker has
        joined and every node is done."""
        if self.rounds is not None and self.stopped is None:
            return self.rounds.settled()
        if self.stopped is not None:
            return all(p.state != NODE_JOINED or p.endpoint is None or p.endpoint.closed
                       for p in self.peers.values())
        return len(self.taken) >= self.worker_num and all(
            p.state in (NODE_DONE, NODE_STOPPED) for p in self.peers.values() if p.authenticated)

    def close(self) -> None:
        for peer in list(self.peers.values()):
            if peer.endpoint is not None:
                peer.endpoint.on_closed = lambda _why: None
                peer.endpoint.flush(time.monotonic() + 1.0)
                peer.endpoint.close("")
        self.peers.clear()
        self.loop.forget(self.sock.fileno())
        self.sock.close()
