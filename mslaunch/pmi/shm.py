"""Job names and MPICH's shared-memory segments.

Ranks of one job on one node meet in ``/dev/shm/mpich_shm_<hash>_<node>``,
the hash being the 32-bit FNV-1a of the kvsname; a job that is killed leaves
its segment behind, so the launcher removes the segments of its kvsname.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import List, Sequence


def new_kvsname() -> str:
    """A kvsname unique per concurrent job on a host: ``kvs_<pid>_<random hex>``."""
    return f"kvs_{os.getpid()}_{os.urandom(6).hex()}"


def _fnv1a32(data: bytes) -> int:
    h = 0x811C9DC5
    for byte in data:
        h = ((h ^ byte) * 0x01000193) & 0xFFFFFFFF
    return h


def shm_segments(kvsname: str, shm_dir: str = "/dev/shm") -> List[str]:
    """Paths of MPICH's POSIX shared-memory segments left for ``kvsname``."""
    prefix = f"mpich_shm_{_fnv1a32(kvsname.encode('utf-8')):x}_"
    try:
        names = os.listdir(shm_dir)
    except OSError:
        return []
    return sorted(os.path.join(shm_dir, n) for n in names if n.startswith(prefix))


def remove_shm_segments(kvsname: str, shm_dir: str = "/dev/shm") -> int:
    """Unlink the segments of :func:`shm_segments`; returns how many were removed."""
    removed = 0
    for path in shm_segments(kvsname, shm_dir):
        try:
            os.unlink(path)
            removed += 1
        except FileNotFoundError:
            pass
    return removed





def after_launcher_death(kvsnames: Sequence[str], marker: str) -> None:
    """The orphan guard's ``on_death`` hook for PMI jobs (see
    :class:`mslaunch.machine.guard.Watchdog`): the segments of every kvsname
    it kept, and the singleton probe of its marker, are removed."""
    for name in kvsnames:
        remove_shm_segments(name)
    if kvsnames:
        from .singleton import probe_path, remove_probe
        remove_probe(probe_path(marker))
