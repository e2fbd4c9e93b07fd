"""The CPU topology of a host as a record: what the planner places ranks on.

A :class:`Topology` lists the usable logical CPUs of one host in hwloc's
*logical* order, which Open MPI uses in rankfiles and ``--report-bindings``:
CPUs sorted depth-first through the tree package > NUMA node > L3 > L2 > L1 >
core > hardware thread, siblings in order of their lowest OS CPU number, and
every object kind numbered densely from 0 in that order.  So on a two-socket
machine that numbers CPUs 0-3 and 8-11 on socket 0 (8-11 being the second
hardware threads), the logical order is 0, 8, 1, 9, 2, 10, 3, 11, 4, 12, ...
(hwloc inserts Group objects for unusual nestings; this record does not.)

Everything here is pure: :func:`make_topology` builds the canonical record
from keys, :func:`objects` and :func:`count` read it, :func:`parse_cpulist`
reads the kernel's (and ``--cpu-set``'s) cpu lists, and :func:`to_wire` /
:func:`from_wire` carry a topology between hosts as plain lists of ints.
Reading a host's sysfs is :mod:`mslaunch.machine.topology`'s.  Importing this module
imports nothing outside the package.
"""

from __future__ import annotations

from .spec import dataclass

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, Hashable, Iterable, List, Sequence, Set, Tuple

__all__ = [
    "CORE", "CPU", "KINDS", "L3", "MAX_CPUS", "NUMA", "PACKAGE", "Topology", "count",
    "from_wire", "make_topology", "objects", "parse_cpulist", "to_wire",
]

#: CPU numbers (OS numbers, object ids) are below this; also the most CPUs a
#: topology may have.  Linux's largest NR_CPUS is 8192.
MAX_CPUS = 1 << 16

#: Object kinds understood by :func:`objects` and :func:`count` (Open MPI's names).
KINDS = ("hwthread", "core", "l1cache", "l2cache", "l3cache", "numa", "socket",
         "package", "board", "node")

# Indexes into a row of Topology.cpus.
CPU, CORE, PACKAGE, NUMA, L3 = range(5)

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
# building


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
