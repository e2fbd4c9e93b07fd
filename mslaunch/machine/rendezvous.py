"""The ports a job's ranks meet at: ``MASTER_PORT`` (PyTorch's rendezvous), and
the Open MPI job id from which jax derives its coordinator's port.  Both are
chosen free on this machine, where rank 0 binds them when it runs here.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Optional, Tuple


def free_port(port_range: Optional[Tuple[int, int]] = None) -> int:
    """A TCP port that is free on this machine now (for MASTER_PORT), of
    ``port_range`` if given (LaunchError when none of it is free)."""
    if port_range is not None:
        from .ports import free_port_in
        return free_port_in(port_range)
    from ..core import socket
    # Below the kernel's range for the local ends of connections: rank 0 binds it on
    # its own host, where any connection (an agent's, a PMIx door's) could hold a
    # port of that range (a job's restart once failed so, EADDRINUSE on a remote host).
    low = _ephemeral_low()
    for _ in range(32 if low > 11000 else 0):
        port = 10000 + int.from_bytes(os.urandom(2), "big") % (low - 10000)
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.bind(("", port))
            return port
        except OSError:
            continue
        finally:
            s.close()
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind(("", 0))
        return s.getsockname()[1]
    finally:
        s.close()


def _ephemeral_low() -> int:
    """The first port of the kernel's range for the local ends of connections."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", "rb") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def ompi_jobid(avoid: int) -> int:
    """An Open MPI job id whose port for jax's coordinator (see
    :func:`..plan.coordinator_port`) is free on this machine now.

    Open MPI's own ids are ``family << 16``, so jax derives one of 256
    ports, 16 apart; mslaunch picks its id the same way, but only a family
    whose port is free (and is not ``avoid``, the job's MASTER_PORT)."""
    from ..core import socket
    from ..plan import coordinator_port
    start = os.urandom(1)[0]
    for i in range(256):
        family = (start + i) % 256
        port = coordinator_port(family << 16)
        if port == avoid:
            continue
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.bind(("", port))
            return family << 16
        except OSError:
            continue
        finally:
            s.close()
    return start << 16       # none free: jax reports the port it cannot bind


def master_port_of(text: Optional[str]) -> Optional[int]:
    """``MASTER_PORT`` from the environment, checked; None when unset or empty."""
    if not text:
        return None
    if text.isascii() and text.isdigit() and 1 <= int(text) <= 65535:
        return int(text)
    from ..core.errors import UsageError
    raise UsageError(f"MASTER_PORT={text[:20]!r} in the environment is not a port number "
                     f"(1-65535)")
