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
writes the file too, but with its own job's size, which is not 1 unless
it runs one process.)
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
            if not name.isdigit() or int(name) in self.seen:
                continue
            try:
                with open(os.path.join(self.path, name), "rb") as f:
                    head = f.read(4096)
            except OSError:
                continue
            size = _world_size(head)
            if size is None:
                continue          # still being written: the next check reads it
            self.seen[int(name)] = size
            found.append((int(name), size))
        return found

    def close(self) -> None:
        remove_probe(self.path)


def singleton_message(library: str = "Open MPI") -> str:
    return (f"started {library} as a singleton (rank 0 of 1): mslaunch serves MPICH's PMI "
            f"by default and {library} does not speak it, so every rank would run alone; "
            f"run the job with --mpi openmpi")
