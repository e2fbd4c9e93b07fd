"""Starting ranks on this machine.

Each rank is the leader of its own session and process group, so signals
reach its children too and a terminal's Ctrl-C reaches only the launcher,
which forwards it.  Exits are watched through a pidfd, which the event loop
polls like any other descriptor.
"""

from __future__ import annotations

import os
import signal
import subprocess
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Mapping, Optional, Sequence, Tuple

from .errors import SpawnError
from .spec import RankSpec


def find_program(name: str, env: Mapping[str, str], cwd: str) -> Optional[str]:
    """Resolve ``name`` as exec would with the rank's PATH; None if not found."""
    if "/" in name:
        path = os.path.join(cwd, name)
        return path if os.access(path, os.X_OK) and not os.path.isdir(path) else None
    for d in env.get("PATH", os.defpath).split(":"):
        path = os.path.join(d or ".", name)
        if os.access(path, os.X_OK) and not os.path.isdir(path):
            return path
    return None


def check_startable(ranks: Sequence[RankSpec]) -> None:
    """Fail before anything starts if a program or working directory is missing."""
    seen = set()
    for r in ranks:
        key = (r.argv[0], r.cwd, r.env.get("PATH"))
        if key in seen or not r.host.local:
            continue
        seen.add(key)
        if not os.path.isdir(r.cwd):
            raise SpawnError(f"working directory {r.cwd!r} of rank {r.rank} does not exist")
        if find_program(r.argv[0], r.env, r.cwd) is None:
            where = "" if "/" in r.argv[0] else " in PATH"
            raise SpawnError(f"program {r.argv[0]!r} of rank {r.rank} not found{where} "
                             f"(or not executable)")


class LocalProcess:
    """One rank running on this machine."""

    def __init__(self, spec: RankSpec, env: Mapping[str, str], *, stdin, stdout: int,
                 stderr: int, pass_fds: Sequence[int] = ()) -> None:
        cpus = spec.cpus
        preexec = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
        try:
            self.proc = subprocess.Popen(
                spec.argv, env=env, cwd=spec.cwd, stdin=stdin, stdout=stdout, stderr=stderr,
                pass_fds=tuple(pass_fds), start_new_session=True, preexec_fn=preexec)
        except OSError as err:
            raise SpawnError(f"cannot start rank {spec.rank} ({spec.argv[0]}): "
                             f"{err.strerror or err}") from None
        self.pid = self.proc.pid
        self.pgid = self.pid
        self.pidfd = os.pidfd_open(self.pid)

    def signal(self, sig: int) -> bool:
        """Send ``sig`` to the rank's process group; False if the group is gone."""
        try:
            os.killpg(self.pgid, sig)
            return True
        except (ProcessLookupError, PermissionError):
            return False

    def group_alive(self) -> bool:
        return self.signal(0)

    def reap(self) -> Tuple[Optional[int], Optional[int]]:
        """Collect the exit status: (exit code, None) or (None, signal number)."""
        code = self.proc.wait()
        os.close(self.pidfd)
        self.pidfd = -1
        if code < 0:
            return None, -code
        return code, None


def signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"
