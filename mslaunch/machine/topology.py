"""The CPU topology of one host, read from sysfs and handed to the planner as data.

:func:`read_topology` reads Linux's ``/sys/devices/system`` (only the files
named below) and returns a :class:`Topology`: for each usable logical CPU its
core, package (socket), NUMA node and L3 cache, plus its L2 and L1 (data)
caches when they are not simply per core.  Files that are missing or
unreadable fall back to a sane default without raising: one package, one
NUMA node, one L3, each CPU its own core.

Order and numbering follow hwloc's *logical* indexes, which Open MPI uses in
rankfiles and ``--report-bindings``: CPUs are sorted depth-first through the
tree package > NUMA node > L3 > L2 > L1 > core > hardware thread, siblings in
order of their lowest OS CPU number, and every object kind is numbered densely
from 0 in that order.  So on a two-socket machine that numbers CPUs 0-3 and
8-11 on socket 0 (8-11 being the second hardware threads), the logical order
is 0, 8, 1, 9, 2, 10, 3, 11, 4, 12, ...  (hwloc inserts Group objects for
unusual nestings; this reader does not.)

:func:`to_wire` / :func:`from_wire` carry a topology between hosts as plain
lists of ints; :mod:`.bindings` writes a binding as Open MPI 4 does.
Importing this module imports nothing but ``os``.
"""

from __future__ import annotations

import os

from ..spec import dataclass

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, Hashable, Iterable, List, Optional, Sequence, Set, Tuple

__all__ = [
    "KINDS", "MAX_CPUS", "Topology", "count", "from_wire", "make_topology", "objects",
    "parse_cpulist", "read_topology", "to_wire",
]

#: CPU numbers (OS numbers, object ids) are below this; also the most CPUs a
#: topology may have.  Linux's largest NR_CPUS is 8192.
MAX_CPUS = 1 << 16

#: Object kinds understood by :func:`objects` and :func:`count` (Open MPI's names).
KINDS = ("hwthread", "core", "l1cache", "l2cache", "l3cache", "numa", "socket",
         "package", "board", "node")

# Indexes into a row of Topology.cpus.
CPU, CORE, PACKAGE, NUMA, L3 = range(5)

_OWN = object()      # key part: "this CPU is its own core"
_ONE = object()      # key: "the one default object"
_BY_CORE = object()  # key part: "this cache is per core"


@dataclass(frozen=True)
class Topology:
    """Usable logical CPUs of one host, in logical (hwloc) order.

    ``cpus`` rows are ``(cpu, core, package, numa, l3)``: the OS CPU number
    (as used by ``sched_setaffinity``) and the dense logical ids of its
    objects.  ``l2`` and ``l1`` give, in the same order, the ids of the L2 and
    L1 data caches; empty when those caches are per core (the usual case).
    Build one with :func:`make_topology` to get the canonical order and ids.
    """

    cpus: Tuple[Tuple[int, int, int, int, int], ...]
    l2: Tuple[int, ...] = ()
    l1: Tuple[int, ...] = ()

    def cpu_ids(self) -> Tuple[int, ...]:
        """The OS CPU numbers, in logical order."""
        return tuple(row[CPU] for row in self.cpus)

    def hwthreads_per_core(self) -> int:
        """The largest number of usable hardware threads on one core."""
        sizes: Dict[int, int] = {}
        for row in self.cpus:
            sizes[row[CORE]] = sizes.get(row[CORE], 0) + 1
        return max(sizes.values(), default=0)


# ---------------------------------------------------------------------------
# cpu lists


def parse_cpulist(text: str, allow_empty: bool = False) -> Tuple[int, ...]:
    """The sorted, distinct CPUs of a kernel cpu list such as ``0-3,8,10-11``.

    Also the syntax of ``--cpu-set``.  Spaces around items are allowed; numbers
    are below :data:`MAX_CPUS`.  An empty list is a ValueError unless
    ``allow_empty`` (the kernel writes an empty line for an empty set).
    """
    if not isinstance(text, str):
        raise ValueError("cpu list must be text")
    body = text.strip()
    if not body:
        if allow_empty:
            return ()
        raise ValueError("empty cpu list")
    found: Set[int] = set()
    for item in body.split(","):
        lo, hi = _cpu_range(item.strip())
        found.update(range(lo, hi + 1))
    return tuple(sorted(found))


def _cpu_range(item: str) -> Tuple[int, int]:
    first, dash, last = item.partition("-")
    lo, hi = _cpu_number(first, item), (_cpu_number(last, item) if dash else None)
    if hi is None:
        return lo, lo
    if hi < lo:
        raise ValueError(f"reversed range {_short(item)} in cpu list")
    return lo, hi


def _cpu_number(text: str, item: str) -> int:
    if not (text.isascii() and text.isdigit()):
        raise ValueError(f"bad item {_short(item)} in cpu list (expected N or N-M)")
    if len(text) > 6 or int(text) >= MAX_CPUS:
        raise ValueError(f"cpu {_short(text)} is out of range (at most {MAX_CPUS - 1})")
    return int(text)


def _short(text: str, limit: int = 20) -> str:
    return repr(text[:limit]) + ("..." if len(text) > limit else "")


# ---------------------------------------------------------------------------
# building and reading


def make_topology(rows: Iterable[Sequence[Any]]) -> Topology:
    """A canonical :class:`Topology` from rows of arbitrary hashable keys.

    Each row is ``(cpu, core, package, numa, l3[, l2[, l1]])``: the OS CPU
    number and keys that are equal for CPUs sharing the object (a missing or
    None ``l2``/``l1`` means per core).  Rows are put in logical order and
    ids renumbered densely; ValueError for a CPU listed twice or out of range.
    """
    full = []
    seen = set()
    for row in rows:
        cpu = row[0]
        if cpu in seen:
            raise ValueError(f"cpu {cpu} is listed twice")
        if not 0 <= cpu < MAX_CPUS:
            raise ValueError(f"cpu {cpu} is out of range")
        seen.add(cpu)
        core = row[1]
        l2 = row[5] if len(row) > 5 and row[5] is not None else (_BY_CORE, core)
        l1 = row[6] if len(row) > 6 and row[6] is not None else (_BY_CORE, core)
        full.append((cpu, core, row[2], row[3], row[4], l2, l1))
    lowest: List[Dict[Hashable, int]] = [{} for _ in range(7)]
    for row in full:
        for field in range(1, 7):
            low = lowest[field]
            if low.get(row[field], MAX_CPUS) > row[0]:
                low[row[field]] = row[0]
    # depth-first: package, NUMA node, L3, L2, L1, core, then the CPU itself
    order = (2, 3, 4, 5, 6, 1)
    full.sort(key=lambda r: tuple(lowest[f][r[f]] for f in order) + (r[0],))
    ids: List[Dict[Hashable, int]] = [{} for _ in range(7)]
    out = []
    l2s: List[int] = []
    l1s: List[int] = []
    for row in full:
        dense = [ids[f].setdefault(row[f], len(ids[f])) for f in range(1, 7)]
        out.append((row[0], dense[0], dense[1], dense[2], dense[3]))
        l2s.append(dense[4])
        l1s.append(dense[5])
    cores = [r[CORE] for r in out]
    return Topology(cpus=tuple(out),
                    l2=() if l2s == _renumber(cores) else tuple(l2s),
                    l1=() if l1s == _renumber(cores) else tuple(l1s))


def _renumber(keys: Sequence[Hashable]) -> List[int]:
    ids: Dict[Hashable, int] = {}
    return [ids.setdefault(k, len(ids)) for k in keys]


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


def cache_path(name: str) -> str:
    """``name`` in mslaunch's per-user cache directory (``$XDG_CACHE_HOME`` or ``~/.cache``)."""
    home = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(home, "mslaunch", name)


def save_whole(path: str, data: bytes) -> None:
    """Write a cache file whole (under a name of this host and process, then
    renamed: caches may be shared by hosts), or not at all."""
    tmp = f"{path}.{os.uname().nodename[:64]}.{os.getpid()}"
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
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


# ---------------------------------------------------------------------------
# objects


def _field_ids(topo: Topology, kind: str) -> Sequence[Hashable]:
    if kind == "hwthread":
        return [row[CPU] for row in topo.cpus]
    if kind in ("core", "l1cache", "l2cache"):
        extra = topo.l1 if kind == "l1cache" else topo.l2 if kind == "l2cache" else ()
        return list(extra) if extra else [row[CORE] for row in topo.cpus]
    field = {"l3cache": L3, "numa": NUMA, "socket": PACKAGE, "package": PACKAGE}.get(kind)
    if field is not None:
        return [row[field] for row in topo.cpus]
    if kind in ("board", "node"):
        return [0] * len(topo.cpus)
    raise ValueError(f"unknown object kind {_short(str(kind))} "
                     f"(expected one of {', '.join(KINDS)})")


def objects(topo: Topology, kind: str) -> Tuple[Tuple[int, ...], ...]:
    """The CPU groups of one kind of object, in logical order.

    Each group holds OS CPU numbers in logical order.  ``kind`` is one of
    :data:`KINDS`: ``hwthread``, ``core``, ``l1cache``, ``l2cache``,
    ``l3cache``, ``numa``, ``socket`` (alias ``package``), ``board`` /
    ``node`` (all CPUs).  ValueError for any other kind.
    """
    groups: Dict[Hashable, List[int]] = {}
    for row, key in zip(topo.cpus, _field_ids(topo, kind)):
        groups.setdefault(key, []).append(row[CPU])
    return tuple(tuple(g) for g in groups.values())


def count(topo: Topology, kind: str) -> int:
    """How many objects of ``kind`` (see :func:`objects`) the topology has."""
    return len(set(_field_ids(topo, kind)))


# ---------------------------------------------------------------------------
# wire form


def to_wire(topo: Topology) -> Dict[str, List[Any]]:
    """A JSON-friendly form of ``topo``: plain lists of ints.

    ``{"cpus": [[cpu, core, package, numa, l3], ...], "l2": [...], "l1": [...]}``
    """
    return {"cpus": [list(row) for row in topo.cpus], "l2": list(topo.l2), "l1": list(topo.l1)}


def from_wire(data: Any) -> Topology:
    """The topology from :func:`to_wire`'s form (e.g. sent by a remote agent).

    Checks everything (types, sizes, ranges, distinct CPUs, each core within
    one package, socket and caches) and raises ValueError for anything
    malformed; the result is canonical (:func:`make_topology`).
    """
    if not isinstance(data, dict):
        raise ValueError("topology: expected an object")
    unknown = [k for k in data if k not in ("cpus", "l2", "l1")]
    if unknown:
        raise ValueError(f"topology: unknown field {_short(str(unknown[0]))}")
    rows = data.get("cpus")
    if not isinstance(rows, list) or not 1 <= len(rows) <= MAX_CPUS:
        raise ValueError(f"topology: 'cpus' must be a list of 1 to {MAX_CPUS} rows")
    checked = []
    for row in rows:
        if not isinstance(row, list) or len(row) != 5 or not all(_is_id(v) for v in row):
            raise ValueError(f"topology: each cpu must be 5 integers from 0 to {MAX_CPUS - 1}")
        checked.append(tuple(row))
    extra = {}
    for name in ("l2", "l1"):
        ids = data.get(name, [])
        if not isinstance(ids, list) or len(ids) not in (0, len(rows)) \
                or not all(_is_id(v) for v in ids):
            raise ValueError(f"topology: {name!r} must be empty or one id per cpu")
        extra[name] = ids or [None] * len(rows)
    if len({row[CPU] for row in checked}) != len(checked):
        raise ValueError("topology: a cpu is listed twice")
    home: Dict[int, Tuple[Any, ...]] = {}
    for row, l2, l1 in zip(checked, extra["l2"], extra["l1"]):
        if home.setdefault(row[CORE], (row[PACKAGE], l2, l1)) != (row[PACKAGE], l2, l1):
            raise ValueError(f"topology: core {row[CORE]} spans packages or caches")
    return make_topology(row + (l2, l1) for row, l2, l1 in zip(checked, extra["l2"], extra["l1"]))


def _is_id(value: Any) -> bool:
    return type(value) is int and 0 <= value < MAX_CPUS
