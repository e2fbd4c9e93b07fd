"""A look inside the ranks of a ``--launcher srun`` job, from a step of its own.

With no agent on the nodes, the launcher answers ``mslaunch-stacks`` and
``mslaunch-top`` by starting one more srun step, a task on each node with
ranks (``--overlap``: it takes no CPUs from the ranks), that runs
:func:`main`.  The task reads the stacks (:func:`~mslaunch.machine.stacks.read`)
or the usage (:func:`~mslaunch.machine.stacks.usage`) of its node's ranks,
by the pids they reported when they dialled in, and sends them as JSON on a
connection of its own to the launcher, presenting the look's token joined
to its node's name (``mslaunch-dial TOKEN-NODE``).  When the job is refused
for Open MPI singletons, such a step also ends them as an agent would, and
removes what they made in /dev/shm and TMPDIR (:func:`_end_singletons`).
"""

from __future__ import annotations

import json
import os
import socket

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, List, Mapping

#: The variable that carries the look's request (never argv: it holds a secret).
LOOK_VARIABLE = "MSLAUNCH_LOOK"


def program(package_dir: str) -> str:
    """The ``python -c`` text a look's task runs: this module, found first in
    ``package_dir`` (where the launcher's mslaunch is: nodes share it, or have
    their own)."""
    return (f"import sys; sys.path.insert(0, {package_dir!r}); "
            "from mslaunch.backends.srunsteps.steplook import main; main()")


def request(op: str, pids: Mapping[str, Mapping[int, int]], token: str, port: int,
            timeout: float) -> str:
    """The value of :data:`LOOK_VARIABLE`: ``op`` (``stacks`` or ``top``) of the
    ranks ``pids`` (``{node: {key: pid}}``)."""
    return json.dumps({"op": op, "token": token, "port": port, "timeout": timeout,
                       "pids": {n: {str(k): p for k, p in m.items()} for n, m in pids.items()}})


def _node() -> str:
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def _end_singletons(groups: List[int], timeout: float) -> None:
    """Stop refused Open MPI singletons (the ranks ``groups``) as an agent would:
    note what their Open MPI processes make in /dev/shm and /tmp while they
    are frozen, end them (SIGTERM; SIGKILL at ``timeout``), remove it."""
    from ...core import signal
    import time

    from ...mpi.pmi.singletons import SingletonFiles
    files = SingletonFiles()
    files.stop(groups)
    files.follow(groups, time.monotonic() + timeout)
    for pgid in groups:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except OSError:
            pass
    files.follow(groups, time.monotonic() + 2.0)
    files.remove()


def main() -> None:
    want = json.loads(os.environ.pop(LOOK_VARIABLE))
    node = _node()
    pids = {int(k): int(v) for k, v in want["pids"].get(node, {}).items()}
    rows: Dict[int, Dict[str, Any]]
    if want["op"] == "top":
        from ...machine.stacks import usage
        rows = usage(pids, {})
    elif want["op"] == "singletons":
        rows = {}
        _end_singletons(list(pids.values()), float(want["timeout"]))
    else:
        from ...machine.stacks import read
        rows = read(pids, None, float(want["timeout"]))
    sock = socket.create_connection((os.environ["SLURM_LAUNCH_NODE_IPADDR"], int(want["port"])),
                                    timeout=10)
    with sock:
        sock.sendall(f"mslaunch-dial {want['token']}-{node}\n".encode()
                     + json.dumps({str(k): v for k, v in rows.items()}).encode())
