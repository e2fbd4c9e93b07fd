"""Is a host name this machine?  Judged without DNS.

Loopback names and addresses, this machine's host names (short and full, the
full one from ``/etc/hosts``) and the IPv4 addresses of its interfaces denote
this machine; its ranks then start without SSH.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, List, Optional, Set

from .hostfile import _is_digits

_ETC_HOSTS = "/etc/hosts"
def _once(func: Callable[[], frozenset]) -> Callable[[], frozenset]:
    """``functools.lru_cache(maxsize=1)`` for a function of no arguments, with its
    ``cache_clear``; ``functools`` (with ``collections``) costs a launch milliseconds."""
    kept: List[frozenset] = []

    def once() -> frozenset:
        if not kept:
            kept.append(func())
        return kept[0]
    once.cache_clear = kept.clear  # type: ignore[attr-defined]
    once.__doc__ = func.__doc__
    return once


_LOOPBACK_NAMES = frozenset({
    "localhost", "localhost.localdomain", "localhost6", "localhost6.localdomain6",
    "ip6-localhost", "ip6-loopback",
})


@_once
def _local_names() -> frozenset:
    """This machine's names, lower-cased: hostname, short form, full form.

    The full name is taken from ``/etc/hosts`` lines that also list the
    hostname; no resolver call is made (they can hang on a broken DNS).
    """
    from ..core import socket

    raw = {socket.gethostname()}
    uname = getattr(os, "uname", None)
    if uname is not None:
        raw.add(uname().nodename)
    names = {n.lower().rstrip(".") for n in raw if n}
    shorts = {n.split(".", 1)[0] for n in names}
    names |= shorts
    try:
        with open(_ETC_HOSTS, encoding="utf-8", errors="replace") as fh:
            lines = fh.read().split("\n")
    except OSError:
        lines = []
    found: Set[str] = set()
    for line in lines:
        aliases = [a.lower().rstrip(".") for a in line.split("#", 1)[0].split()[1:]]
        if names.intersection(aliases):
            found.update(a for a in aliases if a.split(".", 1)[0] in shorts)
    names |= found
    names.discard("")
    return frozenset(names)


def _is_loopback_v4(name: str) -> bool:
    parts = name.split(".")
    if len(parts) != 4:
        return False
    for part in parts:
        if not (1 <= len(part) <= 3 and _is_digits(part)) or int(part) > 255:
            return False
    return parts[0] == "127"


def is_local_host(name: str) -> bool:
    """True if ``name`` denotes this machine, judged without any DNS lookup.

    Loopback names and addresses (127.0.0.0/8, ``::1``, also bracketed), this
    machine's hostname in short or full form (compared case-insensitively),
    and the IPv4 addresses of its interfaces.
    """
    n = name.strip().lower()
    if n.startswith("[") and n.endswith("]"):
        n = n[1:-1]
    if n.endswith(".") and not n.endswith(".."):
        n = n[:-1]
    if not n:
        return False
    if n in _LOOPBACK_NAMES or _is_loopback_v4(n):
        return True
    if ":" in n:
        import ipaddress

        try:
            addr = ipaddress.IPv6Address(n.split("%", 1)[0])
        except ValueError:
            return False
        mapped = addr.ipv4_mapped
        return addr.is_loopback or (mapped is not None and mapped.is_loopback)
    if n in _local_names():
        return True
    return n[:1].isdigit() and n in _local_ipv4_addresses()


@_once
def _local_ipv4_addresses() -> frozenset:
    """This machine's IPv4 addresses, from the kernel's routing trie (no DNS)."""
    found = set()
    try:
        with open("/proc/net/fib_trie") as f:
            previous = ""
            for line in f:
                if line.strip() == "/32 host LOCAL":
                    found.add(previous.strip().lstrip("|-+` ").strip())
                previous = line
    except OSError:
        pass
    return frozenset(found)


def local_ipv4_addresses() -> frozenset:
    """This machine's IPv4 addresses (loopback ones too)."""
    return _local_ipv4_addresses()


def route_address(addr: str) -> Optional[str]:
    """This machine's address towards ``addr``, or None without a route.

    No packet is sent: connecting a UDP socket only asks the kernel's
    routing table which source address it would use.
    """
    from ..core import socket
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    try:
        s = socket.socket(family, socket.SOCK_DGRAM)
    except OSError:
        return None
    try:
        s.connect((addr, 9))
        return str(s.getsockname()[0])
    except OSError:
        return None
    finally:
        s.close()
