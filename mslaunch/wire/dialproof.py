"""Both ends of a dial-back prove that they know its one-time token, the launcher
first, and neither ever sends it.

An agent dials the addresses it was given in turn; on a host of many users,
another user there may listen on one of them first (the host's own loopback,
an address both machines have, such as a container bridge's) and answer in
the launcher's place.  So the agent runs nothing it is sent until the far end
has shown that it knows the token:

1. the agent sends ``mslaunch-dial TAG NONCE [ABOUT]``: :func:`tag_of` the
   token names it and tells nothing of it, NONCE is 16 fresh random bytes;
2. the launcher answers ``NONCE' PROOF``: its own fresh nonce, and
   :func:`proof` of ``launcher``, both nonces and the token;
3. the agent checks it (a wrong one: it tries its next address) and sends
   the proof of ``agent`` for the same nonces, which the launcher checks
   before it sends the bootstrap or takes any output.

Each proof also covers the launcher's address on that connection
(:func:`address`), as each end's socket has it: one who answered the agent at another address and relayed both
ways to the launcher would pass on a proof for the launcher's own address,
which the agent, having dialled another, refuses.

A proof is HMAC-SHA256 (RFC 2104), made with the interpreter's own SHA-256
module, as the agents' one-line dial program also makes it
(:data:`AGENT_HANDSHAKE`): no OpenSSL is loaded for it.
"""

from __future__ import annotations

import os
import sys
import time
from _socket import AF_INET, AF_INET6, inet_ntop, inet_pton

#: The dial line's first word.
HELLO = "mslaunch-dial"


def _sha256():
    try:
        return __import__("_sha2" if sys.version_info >= (3, 12) else "_sha256").sha256
    except ImportError:
        # An interpreter built without its own SHA-256 (a FIPS build's
        # --with-builtin-hashlib-hashes): OpenSSL's, as hashlib has it.
        from _hashlib import openssl_sha256
        return openssl_sha256


def tag_of(token: str) -> str:
    """What a dialling agent presents for ``token``."""
    return _sha256()(f"{HELLO} {token}".encode()).hexdigest()[:32]


def new_nonce() -> str:
    return os.urandom(16).hex()


def address(addr: str) -> str:
    """An IP address in one spelling: IPv6 compressed, without a zone, an
    IPv4-mapped one as IPv4 (a dual-stack socket's view of an IPv4 peer)."""
    addr = addr.split("%")[0]
    if ":" not in addr:
        return addr
    try:
        packed = inet_pton(AF_INET6, addr)
    except OSError:
        return addr
    if packed[:12] == bytes(10) + b"\xff\xff":
        return inet_ntop(AF_INET, packed[12:])
    return inet_ntop(AF_INET6, packed)


def proof(token: str, who: str, agent_nonce: str, launcher_nonce: str, where: str) -> str:
    """``who``'s proof (``launcher`` or ``agent``) for this pair of nonces, on a
    connection to the launcher's address ``where`` (see :func:`address`)."""
    sha = _sha256()
    key = token.encode()
    if len(key) > 64:                      # (a key longer than SHA-256's block)
        key = sha(key).digest()
    key = key.ljust(64, b"\0")
    message = f"{who} {agent_nonce} {launcher_nonce} {where}".encode()
    inner = sha(bytes(x ^ 0x36 for x in key) + message).digest()
    return sha(bytes(x ^ 0x5C for x in key) + inner).hexdigest()


def is_nonce(word: str) -> bool:
    return len(word) == 32 and all(c in "0123456789abcdef" for c in word)


def prove(sock, token: str, timeout: float) -> None:
    """The agent's side on ``sock`` (a connected socket, Python's): ValueError (or
    OSError) if the far end does not prove it knows ``token`` within ``timeout``."""
    where = address(sock.getpeername()[0])
    ours = new_nonce()
    sock.sendall(f"{HELLO} {tag_of(token)} {ours}\n".encode())
    line = b""
    deadline = time.monotonic() + timeout
    while not line.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or len(line) > 200:
            raise ValueError("no proof")
        sock.settimeout(left)
        chunk = sock.recv(1)
        if not chunk:
            raise ValueError("no proof")
        line += chunk
    words = line.decode("ascii", "replace").split()
    if len(words) != 2 or not is_nonce(words[0]) or \
            words[1] != proof(token, "launcher", ours, words[0], where):
        raise ValueError("not the launcher")
    sock.sendall(f"{proof(token, 'agent', ours, words[0], where)}\n".encode())


#: Seconds an agent waits for the far end's proof, at each address: longer than
#: any launcher waits for its agents (an agent started early, under Slurm, waits
#: while the launcher plans), and no longer however slowly the far end speaks.
AGENT_WAIT = 120.0

#: The agents' side, as the one-line dial program runs it (hex-encoded: any
#: shell passes it through untouched).  It is given ``h`` (:data:`HELLO`, left
#: readable in the agent's command line), ``t`` (the token, at most 64
#: characters), ``a`` (``ADDR:PORT[,ADDR:PORT...]``), ``m`` (what follows the
#: nonce on the dial line) and ``socket`` (the C module), and leaves ``s``, the
#: first connection whose far end proved itself, or None.
AGENT_HANDSHAKE = f"""
import os, sys, time
WAIT = {AGENT_WAIT!r}
try:
    S = __import__('_sha2' if sys.version_info >= (3, 12) else '_sha256').sha256
except ImportError:
    from _hashlib import openssl_sha256 as S
k = t.encode().ljust(64, bytes(1))
def mac(who, n, ln, w):
    inner = S(bytes(x ^ 54 for x in k) + ('%s %s %s %s' % (who, n, ln, w)).encode()).digest()
    return S(bytes(x ^ 92 for x in k) + inner).hexdigest()
def where(x):
    x = x.split('%')[0]
    if ':' not in x:
        return x
    p = socket.inet_pton(socket.AF_INET6, x)
    if p[:12] == bytes(10) + bytes([255, 255]):
        return socket.inet_ntop(socket.AF_INET, p[12:])
    return socket.inet_ntop(socket.AF_INET6, p)
def line(c):
    r = b''
    end = time.monotonic() + WAIT
    while not r.endswith(bytes([10])) and len(r) < 200:
        c.settimeout(max(0.01, end - time.monotonic()))
        d = c.recv(1)
        if not d:
            break
        r += d
    return r.decode('ascii', 'replace').split()
s = None
n = os.urandom(16).hex()
g = S((h + ' ' + t).encode()).hexdigest()[:32]
for y in a.split(','):
    c = None
    try:
        x, q = y.rsplit(':', 1)
        c = socket.socket(socket.AF_INET6 if ':' in x else socket.AF_INET)
        c.settimeout(10)
        c.connect((x, int(q)))
        c.setsockopt(6, 1, 1)
        c.sendall(('%s %s %s %s' % (h, g, n, m)).rstrip().encode() + bytes([10]))
        ln, pr = line(c)
        w = where(c.getpeername()[0])
        if pr != mac('launcher', n, ln, w):
            raise ValueError('not the launcher')
        c.sendall(mac('agent', n, ln, w).encode() + bytes([10]))
        c.settimeout(None)
        s = c
        break
    except (OSError, ValueError):
        if c is not None:
            c.close()
"""
