"""Binding a listening socket to a port of a range (Hydra's ``MPIEXEC_PORT_RANGE``).

Imported only when the job has a port range: without one, every listener of
mslaunch binds port 0 and the kernel chooses.  With one, the ports of the
range are tried from a random offset onwards (so that two jobs sharing a
range do not race for its first port), wrapping around; a port in use is
skipped, and so is one :func:`free_port_in` promised to the job (its
``MASTER_PORT``, which a rank binds later); when none is left the error
names the range.
"""

from __future__ import annotations

import errno
import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..core import socket
    from typing import Set, Tuple

from ..core.errors import LaunchError

#: How the range is named in errors (the variables Hydra reads it from).
RANGE_NAME = "MPICH_PORT_RANGE/MPIEXEC_PORT_RANGE"

#: The ports :func:`free_port_in` handed out in this process.
_promised: Set[int] = set()


def bind_in_range(sock: socket.socket, host: str, port_range: Tuple[int, int]) -> int:
    """Bind ``sock`` to ``host`` and a free port of ``port_range`` (inclusive); returns
    the port.  A port in use (or, for a listener, one the kernel keeps) is skipped;
    any other error is raised as it is."""
    low, high = port_range
    count = high - low + 1
    start = int.from_bytes(os.urandom(4), "big") % count
    for i in range(count):
        port = low + (start + i) % count
        if port in _promised:
            continue
        try:
            sock.bind((host, port))
        except OSError as err:
            if err.errno in (errno.EADDRINUSE, errno.EACCES):
                continue       # EACCES: a privileged port, for a user who is not root
            raise
        return port
    raise LaunchError(f"no free TCP port on {host or 'any address'} in {RANGE_NAME} "
                      f"{low}:{high}")


def free_port_in(port_range: Tuple[int, int]) -> int:
    """A TCP port of ``port_range`` that is free on this machine now; no listener
    of this process takes it later."""
    from ..core import socket
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        port = bind_in_range(s, "", port_range)
    finally:
        s.close()
    _promised.add(port)
    return port
