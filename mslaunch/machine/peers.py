"""Who may connect to a job's listeners: whose a connection is (this job's user,
another user of this host, or a process elsewhere), how many unproven ones
are held (:func:`make_room`, :func:`accept_strangers`), and a library's
listener kept for this process alone (:class:`Admission`).

Every listener of a job asks :func:`judge` right after ``accept``, before it
reads a byte: a connection of another local user is closed at once, never
read, never relayed, never counted among the job's pending peers.  A peer on
another host cannot be judged so; it must prove the job's secret, as each
listener asks.

A Unix socket's peer is named by the kernel (``SO_PEERCRED``).  A TCP peer on
this host (loopback or any address of it, in this network namespace) is a
socket of the same kernel: the kernel's socket diagnostics
(``NETLINK_SOCK_DIAG``, what ``ss -tep`` reads) look it up by its four
addresses and say which user made it, in one exchange of a few
microseconds.  Only a peer socket still ``ESTABLISHED`` counts as the user's:
one already closing may be a socket the kernel keeps with no owner (its
``TIME_WAIT`` is reported as root's), so its bytes are nobody's.
"""

from __future__ import annotations

import os
import time

from ..core import socket
from .loop import STRANGER_GRACE, wait_fd

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import (Any, Callable, Iterable, Iterator, List, Literal, Optional, Set, Sized,
                        Tuple)

    from .loop import Loop

    #: The job's own user (or root); another user of this host; a peer not on this host.
    Verdict = Literal["ours", "stranger", "elsewhere"]

_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST = 1
_NLMSG_ERROR = 2
_TCP_ESTABLISHED = 1
_TCP_LISTEN = 10
#: Whether this kernel answers socket diagnostics (None: not asked yet).
_diag_works: Optional[bool] = None


def admitted_uid(uid: int) -> bool:
    """Whether a process of ``uid`` may reach this job: its own user, and root
    (who may trace or end any process anyway)."""
    return uid == os.getuid() or uid == 0


def judge(sock: socket.socket, *, local_only: bool = False) -> Verdict:
    """Whether the peer of the connected socket ``sock`` is this job's user's
    (``"ours"``), another local user's (``"stranger"``) or not on this host
    (``"elsewhere"``).  ``local_only``: the listener serves this host alone, so
    a peer that cannot be found here is a stranger too.  Where the kernel
    answers no diagnostics (a sandbox), a TCP peer is ``"elsewhere"``: the
    listener's own proof is then all that keeps it out."""
    family = sock.family
    if family == socket.AF_UNIX:
        try:
            creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
        except OSError:
            return "stranger"
        return "ours" if admitted_uid(int.from_bytes(creds[4:8], "little")) else "stranger"
    try:
        peer, here = sock.getpeername(), sock.getsockname()
    except OSError:
        return "stranger"          # reset before it was judged
    found = _tcp_owner(family, peer, here)
    if found is None:
        if _diag_works is False:
            return "elsewhere"
        return "stranger" if local_only or _loopback(peer[0]) else "elsewhere"
    state, uid = found
    return "ours" if state == _TCP_ESTABLISHED and admitted_uid(uid) else "stranger"


def _loopback(addr: str) -> bool:
    return addr.startswith(("127.", "::ffff:127.")) or addr == "::1"


def _packed(family: int, addr: str) -> bytes:
    if family == socket.AF_INET:
        return socket.inet_pton(socket.AF_INET, addr) + bytes(12)
    return socket.inet_pton(socket.AF_INET6, addr.split("%", 1)[0])


def _tcp_owner(family: int, peer: Tuple, here: Tuple) -> Optional[Tuple[int, int]]:
    """``(state, uid)`` of the TCP socket on this host whose own address is
    ``peer`` and whose peer is ``here``; None if there is none (or no answer)."""
    global _diag_works
    if _diag_works is False:
        return None
    import struct
    try:
        nl = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG)
    except OSError:
        _diag_works = False
        return None
    try:
        sockid = (struct.pack("!HH", peer[1], here[1]) + _packed(family, peer[0])
                  + _packed(family, here[0]) + struct.pack("=III", 0, 0xFFFFFFFF, 0xFFFFFFFF))
        body = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 0, 0, 0xFFFFFFFF) + sockid
        nl.send(struct.pack("=IHHII", 16 + len(body), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST,
                            1, 0) + body)
        nl.settimeout(1.0)
        reply = nl.recv(1024)
    except OSError:
        return None                    # no answer this time: not taken for no diagnostics
    finally:
        nl.close()
    if len(reply) < 16:
        return None
    kind = struct.unpack_from("=H", reply, 4)[0]
    if kind == _NLMSG_ERROR:
        # ENOENT: no such socket here; anything else: this kernel answers no such question
        _diag_works = -struct.unpack_from("=i", reply, 16)[0] in (0, 2)
        return None
    _diag_works = True
    if kind != _SOCK_DIAG_BY_FAMILY or len(reply) < 16 + 76:
        return None
    state = reply[17]
    uid = struct.unpack_from("=I", reply, 16 + 4 + 48 + 12)[0]
    if state == _TCP_LISTEN:
        return None                    # a listener on the peer's port, not the peer
    return state, uid


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


def accept_strangers(loop: Loop, lsock, strangers: Callable[[], Sized], limit: int,
                     drop: Callable[[Any], None], note: Callable[[str], None],
                     grace: float = STRANGER_GRACE,
                     local_only: bool = False) -> Iterator[Tuple[Any, Any]]:
    """The connections waiting on the listening socket ``lsock`` (64 at most
    per call), each ``(sock, address)``, non-blocking and without Nagle's
    delay; before each, room is made among the unproven (:func:`make_room`).
    A connection of another user of this host is closed at once, unread and
    unsaid (:func:`~mslaunch.machine.peers.judge`; ``local_only`` as there):
    only peers of this user or of other hosts are given, to prove themselves.

    When there is no room yet, or the process is out of descriptors or
    memory (said once through ``note``), the listener rests: new connections
    wait in the kernel's queue meanwhile.
    """
    import errno
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
        if judge(sock, local_only=local_only) == "stranger":
            sock.close()
            continue
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            sock.close()        # reset before we got to it
            continue
        yield sock, address


#: The most source ports one filter names (two instructions each, of the kernel's 4,096).
MOST_PORTS = 2000
_SO_ATTACH_FILTER = 26
_SO_DETACH_FILTER = 27
#: Where a classic BPF program reads the network header (``SKF_NET_OFF``).
_NET = -0x100000


class Admission:
    """The listening TCP sockets of this process on ``ports`` (a library's, which
    accepts by itself: libpmix's server) made to take connections from this
    process alone: a kernel filter on each drops every packet but those from
    the source ports :meth:`allow` names on ``source`` (IPv4), so that another
    user's connection attempt never completes and costs this process nothing.
    A port is this process's while its socket is bound: no other user can bind
    it on that address (the kernel refuses ``SO_REUSEADDR`` across owners and
    ``SO_REUSEPORT`` across users).  An IPv6 listener takes nothing at all."""

    def __init__(self, ports: Iterable[int], source: str) -> None:
        self.source = source
        self.allowed: Set[int] = set()
        self.socks: List[socket.socket] = []
        wanted = set(ports)
        try:
            names = os.listdir("/proc/self/fd")
        except OSError:
            names = []
        seen: Set[str] = set()
        for name in names:
            try:
                link = os.readlink(f"/proc/self/fd/{name}")
                if not link.startswith("socket:") or link in seen:
                    continue
                seen.add(link)
                sock = socket.socket(fileno=os.dup(int(name)))
            except (OSError, ValueError):
                continue
            try:
                if (sock.family in (socket.AF_INET, socket.AF_INET6)
                        and sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
                        and sock.getsockname()[1] in wanted):
                    self.socks.append(sock)
                    continue
            except OSError:
                pass
            sock.close()
        self._apply()

    def allow(self, port: int) -> None:
        self.allowed.add(port)
        self._apply()

    def forget(self, port: int) -> None:
        self.allowed.discard(port)
        self._apply()

    def _apply(self) -> None:
        import ctypes
        import struct
        ports = sorted(self.allowed)
        for sock in self.socks:
            try:
                if len(ports) > MOST_PORTS:
                    # more connections than one filter names: let the library judge
                    sock.setsockopt(socket.SOL_SOCKET, _SO_DETACH_FILTER, 0)
                    continue
                code = _program(self.source if sock.family == socket.AF_INET else None, ports)
                raw = b"".join(struct.pack("=HBBI", *op) for op in code)
                buf = ctypes.create_string_buffer(raw, len(raw))
                sock.setsockopt(socket.SOL_SOCKET, _SO_ATTACH_FILTER,
                                struct.pack("@HP", len(code), ctypes.addressof(buf)))
            except OSError:
                pass

    def close(self) -> None:
        """Let go of the listeners (the library closes its own)."""
        for sock in self.socks:
            sock.close()
        self.socks = []


def _program(source: Optional[str], ports: List[int]) -> List[Tuple[int, int, int, int]]:
    """A classic BPF socket filter: keep a packet from ``source`` and one of
    ``ports`` (the TCP header's first field, where a TCP socket's filter reads
    from), drop every other."""
    drop, keep = (0x06, 0, 0, 0), (0x06, 0, 0, 0xFFFFFFFF)
    if source is None or not ports:
        return [drop]
    addr = int.from_bytes(socket.inet_pton(socket.AF_INET, source), "big")
    code = [(0x20, 0, 0, (_NET + 12) & 0xFFFFFFFF),     # ld the IPv4 source address
            (0x15, 1, 0, addr), drop,                    # not ours: drop
            (0x28, 0, 0, 0)]                             # ldh the TCP source port
    for port in ports:
        code += [(0x15, 0, 1, port), keep]
    return code + [drop]
