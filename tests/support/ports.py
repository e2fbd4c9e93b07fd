"""Ports a test binds on purpose, taken below the kernel's ephemeral range.

A port found free by binding port 0 (or picked at random in the ephemeral range)
can be taken by any outgoing connection of the tests beside it between the check
and the use; below the range only an explicit bind takes a port."""

from __future__ import annotations

import random
import socket
from typing import Sequence, Tuple

import pytest

LOWEST = 10000


def ephemeral_low() -> int:
    """The first port the kernel hands out to connections that bind none."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def spare_port(step: int = 1) -> int:
    """A port below the ephemeral range, for a listener in another network
    namespace (where it cannot be checked from here); ``step`` 2 leaves the next
    one free too (torchrun's store takes the port, and its agents port + 1)."""
    return random.randrange(LOWEST, ephemeral_low() - 2, step)


def free_block(size: int = 1, addrs: Sequence[str] = ("",)) -> Tuple[int, int]:
    """``size`` consecutive ports below the ephemeral range, free now on ``addrs``."""
    top = ephemeral_low() - size
    for _ in range(200):
        low = random.randrange(LOWEST, top)
        socks = []
        try:
            for port in range(low, low + size):
                for addr in addrs:
                    s = socket.socket()
                    socks.append(s)
                    s.bind((addr, port))
            return low, low + size - 1
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    pytest.fail("no free block of ports below the ephemeral range")
