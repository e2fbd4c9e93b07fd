"""Agents dialling back to the launcher over TCP: listener, credentials, TLS.

Two uses: over SSH, an agent sends its ranks' output on a connection of its
own to the launcher (paramiko decrypts in Python, many times slower than a
plain socket the launcher splices from, or a TLS one OpenSSL decrypts);
under Slurm, where ``srun`` gives no stdin to its tasks, the whole link
goes that way.

The launcher listens only on the addresses given (those the hosts route to
it), and every connection must prove itself within :data:`AUTH_SECONDS`.
An agent's token is a random secret it got over a trusted path (the SSH
link, the Slurm step's environment, an rsh command's environment or stdin)
and is used once; the agent never sends it, but proves it knows it, after
the launcher has proved the same (:mod:`.dialproof`): whoever else answers
on an address the agent dials is given nothing and runs nothing.  The
tasks of ``--launcher srun``, plain shells, present their token itself
(``mslaunch-dial <token>``, :meth:`Listener.expect` with ``plain``).  With
TLS, the launcher's certificate is a fresh self-signed one whose PEM the
agent also gets over that path and pins, so the connection is encrypted and
each side knows the other.  Anything else -- a wrong token or proof, junk,
silence -- is closed, and at most a few lines a window report it.
"""

from __future__ import annotations

from ..core import socket as _socket
import _thread
import os
import time

from ..core.errors import LaunchError
from ..machine.loop import CListener
from ..core.switches import switch

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Type

    from ..machine.loop import Loop, Timer

def _bind(fn: Callable[..., Any], *args: Any) -> Callable[[], Any]:
    # functools.partial without functools (it imports collections: milliseconds per agent)
    return lambda: fn(*args)


#: Seconds a new connection has to present its token.  An agent, a Python just
#: started on a machine that may be busy, takes its time between its connection
#: and its proof; one cut off after it has sent the proof meets a reset reading
#: its bootstrap, and its host is lost.  A stranger that says nothing holds one of
#: :data:`MAX_PENDING` places meanwhile, and newer connections push it out.
AUTH_SECONDS = 20.0
#: Unauthenticated connections kept at once; a new one pushes out the oldest
#: once that one has had a moment to present its token.
MAX_PENDING = 64
_HELLO = b"mslaunch-dial "


def new_token() -> str:
    return os.urandom(24).hex()


def _der(tag: int, content: bytes) -> bytes:
    n = len(content)
    size = bytes([n]) if n < 0x80 else \
        bytes([0x80 | ((n.bit_length() + 7) // 8)]) + n.to_bytes((n.bit_length() + 7) // 8, "big")
    return bytes([tag]) + size + content


def _oid(text: str) -> bytes:
    arcs = [int(x) for x in text.split(".")]
    out = bytearray([40 * arcs[0] + arcs[1]])
    for arc in arcs[2:]:
        chunk = [arc & 0x7F]
        while arc > 0x7F:
            arc >>= 7
            chunk.append(0x80 | (arc & 0x7F))
        out += bytes(reversed(chunk))
    return _der(0x06, bytes(out))


def _seq(*items: bytes) -> bytes:
    return _der(0x30, b"".join(items))


def self_signed() -> Tuple[bytes, bytes]:
    """A fresh P-256 key and a self-signed CA certificate for it (PEM), valid
    for two days.

    The certificate is put together here (DER by hand) rather than with
    ``cryptography.x509``, whose import costs some 30 ms on the path of
    every remote launch; the key and the signature are ``cryptography``'s,
    whose modules paramiko has loaded already."""
    import base64
    import datetime

    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    key = ec.generate_private_key(ec.SECP256R1())
    ecdsa_sha256 = _seq(_oid("1.2.840.10045.4.3.2"))
    name = _seq(_der(0x31, _seq(_oid("2.5.4.3"), _der(0x0C, b"mslaunch launcher"))))
    now = datetime.datetime.now(datetime.timezone.utc)

    def utc_time(when: datetime.datetime) -> bytes:
        return _der(0x17, when.strftime("%y%m%d%H%M%SZ").encode("ascii"))

    serial = int.from_bytes(os.urandom(16), "big") >> 1 | 1      # in 1 .. 2**127
    ca = _seq(_oid("2.5.29.19"), _der(0x01, b"\xff"),           # basicConstraints, critical
              _der(0x04, _seq(_der(0x01, b"\xff"))))            # cA TRUE
    tbs = _seq(
        _der(0xA0, _der(0x02, b"\x02")),                         # v3
        _der(0x02, serial.to_bytes(serial.bit_length() // 8 + 1, "big")),   # sign bit 0
        ecdsa_sha256, name,
        _seq(utc_time(now - datetime.timedelta(minutes=10)),
             utc_time(now + datetime.timedelta(days=2))),
        name,
        key.public_key().public_bytes(serialization.Encoding.DER,
                                      serialization.PublicFormat.SubjectPublicKeyInfo),
        _der(0xA3, _seq(ca)))
    signature = key.sign(tbs, ec.ECDSA(hashes.SHA256()))
    cert = _seq(tbs, ecdsa_sha256, _der(0x03, b"\0" + signature))
    text = base64.b64encode(cert).decode("ascii")
    cert_pem = ("-----BEGIN CERTIFICATE-----\n"
                + "".join(text[i:i + 64] + "\n" for i in range(0, len(text), 64))
                + "-----END CERTIFICATE-----\n").encode("ascii")
    key_pem = key.private_bytes(serialization.Encoding.PEM,
                                serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return key_pem, cert_pem


def direct_output() -> bool:
    """Whether agents send output on a connection of their own (unless
    ``MSLAUNCH_DIRECT_OUTPUT=0`` keeps it in the SSH channels)."""
    return switch("MSLAUNCH_DIRECT_OUTPUT")


def output_tls() -> bool:
    """Whether output connections are TLS (``MSLAUNCH_OUTPUT_TLS=1``).  By
    default they are plain TCP, token-checked, as Hydra's proxies and Open
    MPI's daemons send output: that lets the launcher splice it."""
    return switch("MSLAUNCH_OUTPUT_TLS")


_tls_lock = _thread.allocate_lock()
#: (certificate PEM, server context, None), or (None, None, the error), once made.
_tls: List[tuple] = []


def tls_credentials() -> Tuple[bytes, Any]:
    """The launcher's certificate (PEM) and TLS server context, made once per
    process: in the background while the hosts connect (see
    :func:`mslaunch.backends.agents.bootstrap.prepare_in_background`), or here."""
    with _tls_lock:
        if not _tls:
            try:
                key_pem, cert_pem = self_signed()
                _tls.append((cert_pem, _server_context(key_pem, cert_pem), None))
            except Exception as err:   # no cryptography, no ssl: Listener says so
                _tls.append((None, None, err))
    cert_pem, context, error = _tls[0]
    if error is not None:
        raise error
    return cert_pem, context


def _server_context(key_pem: bytes, cert_pem: bytes):
    import ssl
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    # load_cert_chain reads files only: an anonymous file in memory (Linux),
    # else a private file that lives for an instant.
    if hasattr(os, "memfd_create"):
        try:
            fd = os.memfd_create("mslaunch-launcher-pem", os.MFD_CLOEXEC)
            try:
                os.write(fd, key_pem + cert_pem)
                context.load_cert_chain(f"/proc/self/fd/{fd}")
            finally:
                os.close(fd)
            return context
        except OSError:         # no memfd, no /proc: the file below
            pass
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "launcher.pem")
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
            f.write(key_pem + cert_pem)
        context.load_cert_chain(path)
    return context


def read_hello(buf: bytes) -> Optional[Tuple[str, str, bytes]]:
    """A dialling connection's first line (``mslaunch-dial WORD [MORE]``): its
    word, what the line says after it, and what came after the line; None
    until the line is whole, ValueError past 200 bytes without one.  A line
    of another form gives the empty word, which no one expects."""
    if b"\n" not in buf:
        if len(buf) > 200:
            raise ValueError("no token line")
        return None
    line, _, rest = buf.partition(b"\n")
    if not line.startswith(_HELLO):
        return "", "", rest
    word, _, more = line[len(_HELLO):].decode("ascii", "replace").partition(" ")
    return word, more, rest


class _Pending:
    __slots__ = ("sock", "buf", "timer", "handshaking", "accepted", "proving")

    def __init__(self, sock) -> None:
        self.sock = sock
        self.buf = b""
        self.timer: Optional[Timer] = None
        self.handshaking = False
        self.accepted = time.monotonic()
        #: Once the launcher has proved itself: (tag, the agent's proof due, what
        #: its hello said after the nonce).
        self.proving: Optional[Tuple[str, str, str]] = None


class Listener:
    """Accepts dial-back connections on the loop; hands each to its token's owner."""

    def __init__(self, loop: Loop, addresses: Sequence[str], *, tls: bool,
                 log: Callable[[str], None],
                 port_range: Optional[Tuple[int, int]] = None) -> None:
        self.loop = loop
        self.log = log
        #: By the word a dial line presents (a token's tag, or a plain token):
        #: the token ("" for a plain one) and what takes the connection.
        self.expected: Dict[str, Tuple[str, Callable[[object, bytes, str], None]]] = {}
        self.socks: List[CListener] = []
        self.pending: Dict[int, _Pending] = {}
        self.cert_pem: Optional[bytes] = None
        self._context = None
        # What a socket raises for "not yet" (ssl, and its 1.5 MiB, only with TLS).
        self._wants: Tuple[Type[BaseException], ...] = (BlockingIOError,)
        if tls:
            import ssl
            self.cert_pem, self._context = tls_credentials()
            self._wants = (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError)
        self._lines = 0
        self._window_end = 0.0
        self._suppressed = 0
        for addr in dict.fromkeys(addresses):
            family = _socket.AF_INET6 if ":" in addr else _socket.AF_INET
            try:
                sock = CListener(family, _socket.SOCK_STREAM)
            except OSError:            # no IPv6 here
                continue
            try:
                if port_range is not None:
                    # a port of the range whose last connection is in TIME-WAIT
                    sock.setsockopt(_socket.SOL_SOCKET, _socket.SO_REUSEADDR, 1)
                if family == _socket.AF_INET6:
                    # The wildcard "::" takes both families on one port (an IPv4
                    # peer shows as ::ffff:a.b.c.d): no other process can then
                    # take the same port in the other family.  A given IPv6
                    # address takes IPv6 only.
                    sock.setsockopt(_socket.IPPROTO_IPV6, _socket.IPV6_V6ONLY,
                                    0 if addr == "::" else 1)
                if port_range is None:
                    sock.bind((addr, 0))
                else:          # no free port of the range: an error, not a lesser listener
                    from ..machine.ports import bind_in_range
                    bind_in_range(sock, addr, port_range)
                sock.listen(1024)          # every host may dial at once (the kernel caps it)
                sock.setblocking(False)
            except OSError:
                sock.close()
                continue
            except LaunchError:        # the range is full: no listener at all
                sock.close()
                self.close()
                raise
            self.socks.append(sock)
            loop.add_reader(sock.fileno(), _bind(self._accept, sock))

    def port_of(self, addr: str) -> Optional[int]:
        for sock in self.socks:
            if sock.getsockname()[0] == addr:
                return sock.getsockname()[1]
        return None

    def expect(self, token: str, on_connection: Callable[[object, bytes, str], None],
               plain: bool = False) -> None:
        """Call ``on_connection(sock, first_bytes, about)`` when a connection proves
        it knows ``token`` (:mod:`.dialproof`), or, ``plain``, presents it.

        ``first_bytes`` is what came after the last line of that in the same
        read, ``about`` what the dial line said after the nonce (the token, if
        plain).  A token is used once.
        """
        if plain:
            self.expected[token] = ("", on_connection)
        else:
            from .dialproof import tag_of
            if len(token) > 64:           # (see dialproof.AGENT_HANDSHAKE)
                raise ValueError("a dial-back token is 64 characters at most")
            self.expected[tag_of(token)] = (token, on_connection)

    # -- accepting ------------------------------------------------------------
    def _accept(self, lsock: CListener) -> None:
        from ..machine.peers import accept_strangers
        for sock, _ in accept_strangers(self.loop, lsock, self.pending.values, MAX_PENDING,
                                        lambda e: self._drop(e, "was pushed out by newer connections"),
                                        self._note):
            if self._context is not None:
                import socket
                full = socket.socket(fileno=sock.detach())
                full.setblocking(False)         # made of a descriptor, it would block
                sock = self._context.wrap_socket(full, server_side=True,
                                                 do_handshake_on_connect=False)
            entry = _Pending(sock)
            entry.handshaking = self._context is not None
            self.pending[sock.fileno()] = entry
            entry.timer = self.loop.call_later(AUTH_SECONDS, _bind(
                self._drop, entry, "did not present a token in time"))
            self.loop.add_reader(sock.fileno(), _bind(self._readable, entry))
            self._readable(entry)

    def _readable(self, entry: _Pending) -> None:
        sock = entry.sock
        try:
            if entry.handshaking:
                sock.do_handshake()
                entry.handshaking = False
            data = sock.recv(256)
        except self._wants:
            return
        except (OSError, ValueError) as err:
            self._drop(entry, f"broke off ({err.__class__.__name__})")
            return
        if not data:
            self._drop(entry, "closed before presenting a token")
            return
        entry.buf += data
        if entry.proving is not None:
            self._proved(entry)
            return
        try:
            found = read_hello(entry.buf)
        except ValueError:
            self._drop(entry, "sent junk")
            return
        if found is None:
            return
        word, more, rest = found
        token, owner = self.expected.get(word, ("", None))
        if owner is None:
            self._drop(entry, "presented a wrong token")
            return
        if not token:                   # a plain token: the connection is its owner's
            del self.expected[word]
            self._release(entry)
            owner(sock, rest, more)
            return
        from .dialproof import address, is_nonce, new_nonce, proof
        nonce, _, about = more.partition(" ")
        if not is_nonce(nonce) or rest:
            self._drop(entry, "sent junk")
            return
        ours = new_nonce()
        where, answer = "", b""
        try:
            where = address(sock.getsockname()[0])
            answer = f"{ours} {proof(token, 'launcher', nonce, ours, where)}\n".encode()
            sent = sock.send(answer)
        except (OSError, ValueError):
            sent = -1
        if sent != len(answer):          # (a few bytes into an empty buffer)
            self._drop(entry, "broke off")
            return
        entry.buf = b""
        entry.proving = (word, proof(token, "agent", nonce, ours, where), about)

    def _proved(self, entry: _Pending) -> None:
        """The agent's proof, once its line is whole."""
        if b"\n" not in entry.buf:
            if len(entry.buf) > 200:
                self._drop(entry, "sent junk")
            return
        from _operator import _compare_digest
        assert entry.proving is not None
        word, due, about = entry.proving
        line, _, rest = entry.buf.partition(b"\n")
        _, owner = self.expected.get(word, ("", None))
        if owner is None or not _compare_digest(line, due.encode()):
            self._drop(entry, "gave a wrong proof")
            return
        del self.expected[word]
        self._release(entry)
        owner(entry.sock, rest, about)

    def _release(self, entry: _Pending) -> None:
        self.pending.pop(entry.sock.fileno(), None)
        self.loop.forget(entry.sock.fileno())
        if entry.timer is not None:
            entry.timer.cancel()

    def _drop(self, entry: _Pending, why: str) -> None:
        if entry.sock.fileno() not in self.pending:
            return
        self._release(entry)
        try:
            entry.sock.close()
        except OSError:
            pass
        self._note(f"closed a connection that {why}")

    def _note(self, text: str) -> None:
        now = time.monotonic()
        if now > self._window_end:
            if self._suppressed:
                self.log(f"link listener: {self._suppressed} more connection(s) closed")
            self._window_end, self._lines, self._suppressed = now + 10.0, 0, 0
        if self._lines < 5:
            self._lines += 1
            self.log(f"link listener: {text}")
        else:
            self._suppressed += 1

    def close(self) -> None:
        for entry in list(self.pending.values()):
            self._release(entry)
            entry.sock.close()
        for sock in self.socks:
            self.loop.forget(sock.fileno())
            sock.close()
        self.socks.clear()


def _connect(addr: str, port: int, timeout: float, tls: bool):
    """A TCP connection to ``addr``, without Nagle's delay.  Without TLS it is
    the C module's socket: importing ``socket`` would cost the agent 10 ms."""
    if tls:
        import socket
        full = socket.create_connection((addr, port), timeout=timeout)
        full.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return full
    last: Optional[OSError] = None
    # A str host goes through the idna codec, whose import brings ``re``.
    host = addr.encode("ascii") if addr.isascii() else addr
    for family, kind, proto, _, where in _socket.getaddrinfo(host, port, 0,
                                                             _socket.SOCK_STREAM):
        sock = _socket.socket(family, kind, proto)
        try:
            sock.settimeout(timeout)
            sock.connect(where)
            sock.setsockopt(_socket.IPPROTO_TCP, _socket.TCP_NODELAY, 1)
            return sock
        except OSError as err:
            sock.close()
            last = err
    raise last or OSError(f"no address for {addr}")


def dial(addresses: Sequence[str], port: int, token: str, cert_pem: Optional[str],
         timeout: float = 3.0):
    """The agent's side: connect, check the launcher's certificate, prove the
    token both ways (:mod:`.dialproof`).

    Returns a connected socket (TLS when ``cert_pem`` is given) to the first
    address whose far end proved itself, or None when none did; never
    raises for network trouble (ValueError for a certificate that is not one).
    """
    context = None
    if cert_pem:
        import ssl
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.check_hostname = False          # pinned: the one certificate trusted
        try:
            context.load_verify_locations(cadata=cert_pem)
        except (ssl.SSLError, ValueError):
            raise ValueError("the launcher's certificate is not a PEM certificate") from None
    for addr in addresses:
        try:
            sock = _connect(addr, port, timeout, context is not None)
        except OSError:
            continue
        try:
            if context is not None:
                sock = context.wrap_socket(sock)
            from .dialproof import prove
            prove(sock, token, timeout)
            sock.settimeout(None)
            return sock
        except (OSError, ValueError):
            sock.close()
    return None
