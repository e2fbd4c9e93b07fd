"""The CPU topology of this host, read from sysfs and cached per user.

:func:`read_topology` reads Linux's ``/sys/devices/system`` (only the files
named below) and returns a :class:`~mslaunch.core.cputopo.Topology` (the record,
its logical order and its wire form are :mod:`mslaunch.core.cputopo`'s): for each
usable logical CPU its core, package (socket), NUMA node and L3 cache, plus
its L2 and L1 (data) caches when they are not simply per core.  Files that
are missing or unreadable fall back to a sane default without raising: one
package, one NUMA node, one L3, each CPU its own core.
:func:`cached_topology` keeps the result in the per-user cache while the
boot, the online CPUs and the affinity stay the same.  Importing this module
imports nothing but ``os``.
"""

from __future__ import annotations

import os

from ..core.cputopo import MAX_CPUS, from_wire, make_topology, parse_cpulist, to_wire

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, Hashable, Iterable, List, Optional, Tuple

    from ..core.cputopo import Topology

__all__ = ["cache_folder", "cache_path", "cached_topology", "host_key", "read_topology", "save_whole"]

_OWN = object()      # key part: "this CPU is its own core"
_ONE = object()      # key: "the one default object"


def read_topology(root: str = "/sys/devices/system",
                  allowed: Optional[Iterable[int]] = None) -> Topology:
    """The topology of the usable CPUs of this host, never raising for bad sysfs.

    Usable CPUs are those in ``cpu/online`` (else the ``cpu/cpuN``
    directories) that are also in ``allowed`` (default: this process's
    affinity); when none are, ``allowed`` itself.  Reads per CPU
    ``cpu/cpuN/topology/{physical_package_id,core_id}`` and
    ``cpu/cpuN/cache/indexK/{level,type,shared_cpu_list}`` (a cache already
    known from another CPU's shared list is not read again), and
    ``node/nodeM/cpulist`` (else the ``cpu/cpuN/nodeM`` links).
    """
    cpu_root = os.path.join(root, "cpu")
    if allowed is None:
        try:
            allowed = os.sched_getaffinity(0)
        except (AttributeError, OSError):
            allowed = None
    allowed_set = None if allowed is None else {int(c) for c in allowed if 0 <= int(c) < MAX_CPUS}
    online = _read_cpulist(os.path.join(cpu_root, "online"))
    if online is None:
        online = tuple(sorted(_numbered(cpu_root, "cpu")))
    usable = [c for c in online if allowed_set is None or c in allowed_set]
    if not usable:
        usable = sorted(allowed_set or ()) or list(online) or list(range(os.cpu_count() or 1))

    numa_of: Dict[int, int] = {}
    node_root = os.path.join(root, "node")
    for node in sorted(_numbered(node_root, "node")):
        for c in _read_cpulist(os.path.join(node_root, f"node{node}", "cpulist")) or ():
            numa_of.setdefault(c, node)

    caches: Dict[int, Dict[int, Hashable]] = {1: {}, 2: {}, 3: {}}
    rows = []
    for c in usable:
        base = os.path.join(cpu_root, f"cpu{c}")
        package = _read_int(os.path.join(base, "topology", "physical_package_id"))
        if package is None or package < 0:   # some platforms write -1
            package = 0
        core_id = _read_int(os.path.join(base, "topology", "core_id"))
        core = (package, core_id) if core_id is not None and core_id >= 0 else (_OWN, c)
        numa = numa_of.get(c)
        if numa is None:
            links = _numbered(base, "node")
            numa = min(links) if links else 0
        _read_caches(base, c, caches)
        rows.append((c, core, package, numa, caches[3].get(c, _ONE),
                     caches[2].get(c), caches[1].get(c)))
    return make_topology(rows)


def host_key() -> Optional[bytes]:
    """What this host's topology, as seen from here, depends on: the boot, the
    online CPUs and this process's affinity (None if that cannot be told)."""
    try:
        with open("/proc/sys/kernel/random/boot_id", "rb") as f:
            boot = f.read(64)
        with open("/sys/devices/system/cpu/online", "rb") as f:
            online = f.read(4096)
        return b"%s|%s|%r" % (boot.strip(), online.strip(), sorted(os.sched_getaffinity(0)))
    except (OSError, AttributeError):
        return None


#: Each cache folder looked at, and whether it is safe (see cache_folder).
_CACHE_FOLDERS: Dict[str, bool] = {}


def cache_folder() -> Optional[str]:
    """mslaunch's per-user cache directory (``$XDG_CACHE_HOME/mslaunch`` or
    ``~/.cache/mslaunch``); None where a folder on its way is another user's to
    rename or replace (root run with a user's ``HOME``, say): what a cache holds
    (an agent's package, a library's path, the ranks' variables, bytecode) would
    be that user's to choose."""
    home = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    folder = os.path.join(home, "mslaunch")
    safe = _CACHE_FOLDERS.get(folder)
    if safe is None:
        from .procs import unsafe_above
        safe = _CACHE_FOLDERS[folder] = unsafe_above(os.path.join(folder, "-"),
                                                     missing=True) is None
    return folder if safe else None


def cache_path(name: str) -> str:
    """``name`` in :func:`cache_folder`; where that is not safe, a path under
    ``/dev/null``, where nothing opens: every cache is then as if it were not there."""
    return os.path.join(cache_folder() or "/dev/null/mslaunch", name)


def save_whole(path: str, data: bytes) -> None:
    """Write a cache file whole (under a name of this host and process, then
    renamed: caches may be shared by hosts), or not at all."""
    from .osfiles import write_whole
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        write_whole(path, data, shared=True)
    except OSError:
        pass


def cached_topology() -> Topology:
    """This host's topology (:func:`read_topology`), from a cache file while right.

    sysfs costs some 10 reads per CPU (milliseconds on a laptop, far more on
    a large host), on every launch.  The cache (``~/.cache/mslaunch``, or
    ``$XDG_CACHE_HOME``) holds the topology with what it depends on: the
    boot, the online CPUs and this process's affinity; anything else
    changed reads sysfs again.  A cache that cannot be read or written is
    simply not used.
    """
    import marshal
    key = host_key()
    if key is None:
        return read_topology()
    path = cache_path(f"topology-{os.uname().nodename[:64]}")
    try:
        with open(path, "rb") as f:
            saved_key, wire = marshal.load(f)
        if saved_key == key:
            return from_wire(wire)
    except (OSError, EOFError, ValueError, TypeError):
        pass
    topo = read_topology()
    save_whole(path, marshal.dumps((key, to_wire(topo))))
    return topo


def _read_caches(base: str, cpu: int, caches: Dict[int, Dict[int, Hashable]]) -> None:
    """Note the L1d, L2 and L3 of ``cpu`` (and of the CPUs sharing them)."""
    need = {level for level in (1, 2, 3) if cpu not in caches[level]}
    if not need:
        return
    cache_dir = os.path.join(base, "cache")
    for index in sorted(_numbered(cache_dir, "index")):
        where = os.path.join(cache_dir, f"index{index}")
        level = _read_int(os.path.join(where, "level"))
        if level not in need:
            continue
        if level == 1 and _read_text(os.path.join(where, "type")) == "Instruction":
            continue
        shared = _read_cpulist(os.path.join(where, "shared_cpu_list"))
        if not shared:
            continue
        need.discard(level)
        key = (level, shared)
        for c in shared + (cpu,):
            caches[level].setdefault(c, key)
        if not need:
            return


def _read_text(path: str) -> Optional[str]:
    try:
        with open(path, "rb") as fh:
            return fh.read(1 << 20).decode("ascii").strip()
    except (OSError, ValueError):
        return None


def _read_int(path: str) -> Optional[int]:
    text = _read_text(path)
    if text is None:
        return None
    digits = text[1:] if text.startswith("-") else text
    if not digits.isdigit() or len(digits) > 9:
        return None
    return int(text)


def _read_cpulist(path: str) -> Optional[Tuple[int, ...]]:
    text = _read_text(path)
    if text is None:
        return None
    try:
        return parse_cpulist(text, allow_empty=True)
    except ValueError:
        return None


def _numbered(directory: str, prefix: str) -> List[int]:
    """N for each entry PREFIXN (N < MAX_CPUS) of a directory; [] if unreadable."""
    try:
        names = os.listdir(directory)
    except (OSError, ValueError):
        return []
    cut = len(prefix)
    return [int(n[cut:]) for n in names
            if n.startswith(prefix) and n[cut:].isascii() and n[cut:].isdigit()
            and len(n) - cut <= 6 and int(n[cut:]) < MAX_CPUS]
