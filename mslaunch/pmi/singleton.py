"""No silent singletons: noticing an Open MPI program under mslaunch's PMI.

mslaunch serves the PMI wire of MPICH-ABI libraries.  An Open MPI program
finds no PMIx server there, starts as a *singleton* -- rank 0 of 1 -- and,
with N ranks, the job becomes N one-rank jobs that all "succeed".  To
notice, every rank of a PMI job gets two of Open MPI's own parameters:
``mpi_show_mca_params=enviro`` and ``mpi_show_mca_params_file=DIR/KEY``.
Open MPI (4 and 5) then writes that file in ``MPI_Init``, from
``MPI_COMM_WORLD`` rank 0 only, with the world size in its header; MPICH
ignores both.  A file that says "out of a total of 1" from a rank whose
job has more ranks is a singleton, and the job ends with one line saying
to use ``--mpi openmpi``.  (An Open MPI ``mpirun`` started by a rank
writes the file too, with its own job's size: Open MPI 4's says
``ess=pmi`` there and ``ess=singleton`` in a singleton; for Open MPI 5,
whose files do not differ, a rank that runs an Open MPI launcher in its
process tree is not taken for a singleton.)
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Optional, Tuple

_TOTAL = b"out of a total of "


def _world_size(head: bytes) -> Optional[int]:
    at = head.find(_TOTAL)
    if at < 0:
        return None
    digits = head[at + len(_TOTAL):].split(b")", 1)[0]
    return int(digits) if digits.isdigit() else None


def _read_regular(path: str) -> Optional[bytes]:
    """The start of a regular file, without ever blocking (a rank could put a FIFO
    or a device where Open MPI writes)."""
    import stat
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)


_LAUNCHERS = frozenset(("mpirun", "mpiexec", "orterun", "prterun", "prted", "orted",
                        "ompirun_wrapper", "mpirun.openmpi", "mpiexec.openmpi"))


def runs_a_launcher(pid: int) -> bool:
    """Whether an Open MPI launcher runs in ``pid``'s process tree (a rank that
    starts a job of its own writes the same probe file, from that job's rank 0)."""
    todo, seen = [pid], set()
    while todo and len(seen) < 10000:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        try:
            with open(f"/proc/{p}/comm", "rb") as f:
                if f.read().strip().decode("ascii", "replace") in _LAUNCHERS:
                    return True
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children", "rb") as f:
                    todo.extend(int(c) for c in f.read().split())
        except (OSError, ValueError):
            continue
    return False


def probe_path(marker: str) -> str:
    """The probe directory of the launcher or agent whose guard has ``marker``."""
    # Not tempfile: its import costs more than a small job's whole launch.
    return os.path.join(os.environ.get("TMPDIR") or "/tmp", f"mslaunch-ompi-{marker[:120]}")


def remove_probe(path: str) -> None:
    try:
        for name in os.listdir(path):
            os.unlink(os.path.join(path, name))
        os.rmdir(path)
    except OSError:
        pass


class SingletonProbe:
    """The directory Open MPI ranks write to, and what was found there."""

    def __init__(self, marker: str) -> None:
        self.path = probe_path(marker)
        os.mkdir(self.path, 0o700)      # OSError if it exists: never someone else's
        self.seen: Dict[int, int] = {}

    def env(self, key: int) -> Dict[str, str]:
        return {"OMPI_MCA_mpi_show_mca_params": "enviro",
                "OMPI_MCA_mpi_show_mca_params_file": os.path.join(self.path, str(key))}

    def check(self) -> List[Tuple[int, int]]:
        """``(key, world size)`` of every rank that started Open MPI since the last check."""
        found = []
        try:
            names = os.listdir(self.path)
        except OSError:
            return []
        for name in names:
            if not (name.isascii() and name.isdigit()) or len(name) > 9 \
                    or int(name) in self.seen:
                continue
            head = _read_regular(os.path.join(self.path, name))
            if head is None:
                continue
            size = _world_size(head)
            if size is None:
                continue          # still being written: the next check reads it
            if b"ess=pmi " in head:
                size = 0          # Open MPI 4 under its own mpirun (a rank's nested job)
            self.seen[int(name)] = size
            found.append((int(name), size))
        return found

    def close(self) -> None:
        remove_probe(self.path)


def singleton_message(library: str = "Open MPI") -> str:
    return (f"started {library} as a singleton (rank 0 of 1): mslaunch serves MPICH's PMI "
            f"by default and {library} does not speak it, so every rank would run alone; "
            f"run the job with --mpi openmpi")
