"""Where each rank runs inside its host, how ranks are numbered, what they are bound to.

After :func:`~mslaunch.plan.place.place` has decided how many ranks each host
gets, this module does the rest of Open MPI's mapping, ranking and binding
on each host's :class:`~mslaunch.machine.topology.Topology` (pure functions):

* ``--map-by``: ``slot``, ``node``, ``core``, ``hwthread`` and ``board``
  take the host's processing units (cores, or hardware threads with
  ``--use-hwthread-cpus``) in order; ``socket``, ``numa``, ``l1cache``,
  ``l2cache`` and ``l3cache`` deal the host's ranks round-robin over those
  objects; ``ppr:N:OBJ`` gives each object N ranks, object by object.  A
  rank's *location* is its ``:PE=n`` processing units (1 by default).
* ``--rank-by``: ``node`` numbers ranks round-robin over hosts; ``slot`` host
  by host in mapping order; an object kind host by host, round-robin over
  those objects.  By default ranks are numbered as they were mapped.
* ``--bind-to``: the objects of that kind that hold the rank's location
  (``hwthread``: the first thread of each unit); ``cpu-list`` the
  ``--cpu-list`` cpus (one each with ``:ordered``).  Binding more ranks to
  a core or hardware thread than it has is refused unless
  ``:overload-allowed``, as Open MPI does.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Optional, Sequence, Tuple

    from ..spec import JobSpec

from ..errors import PlanError
from ..machine.topology import CPU, Topology, objects

#: Mapping objects that deal ranks round-robin over themselves.
SPREAD = ("socket", "package", "numa", "l1cache", "l2cache", "l3cache")
#: Binding objects that may hold one rank per hardware thread at most.
TIGHT = ("hwthread", "core", "l1cache", "l2cache")


def units(topo: Topology, hwthreads: bool) -> Tuple[Tuple[int, ...], ...]:
    """The host's processing units: cores, or hardware threads."""
    return objects(topo, "hwthread" if hwthreads else "core")


def locations(topo: Topology, count: int, job: JobSpec) -> List[Tuple[int, ...]]:
    """The CPUs each of a host's ``count`` ranks is mapped to, in mapping order."""
    pu = units(topo, job.use_hwthreads)
    pe = job.pe or 1
    if not pu:
        return [()] * count
    kind = job.ppr[1] if job.ppr else job.map_by
    if kind in SPREAD:
        groups = objects(topo, kind)
        inside = [[u for u in pu if u[0] in set(g)] for g in groups]
        inside = [g for g in inside if g] or [list(pu)]
        out = []
        for i in range(count):
            if job.ppr:
                j, k = divmod(i, job.ppr[0])
                j %= len(inside)
            else:
                k, j = divmod(i, len(inside))
            group = inside[j]
            out.append(_take(group, k * pe, pe))
        return out
    return [_take(list(pu), i * pe, pe) for i in range(count)]


def _take(seq: List[Tuple[int, ...]], start: int, n: int) -> Tuple[int, ...]:
    return tuple(cpu for i in range(start, start + n) for cpu in seq[i % len(seq)])


def rank_order(hosts_of: Sequence[int], locs: Sequence[Tuple[int, ...]],
               topos: Sequence[Topology], job: JobSpec) -> List[int]:
    """The order in which mapped processes get world ranks (indexes into the lists).

    ``hosts_of[i]`` and ``locs[i]`` describe process ``i`` in mapping order
    (host by host, or round-robin for ``--map-by node``).
    """
    by = job.rank_by or ("node" if job.map_by == "node" else "slot")
    procs = list(range(len(hosts_of)))
    if by == "slot" and job.map_by != "node":
        return procs
    per_host: Dict[int, List[int]] = {}
    for i in procs:
        per_host.setdefault(hosts_of[i], []).append(i)
    if by == "node":
        order: List[int] = []
        lists = list(per_host.values())
        for k in range(max((len(x) for x in lists), default=0)):
            order.extend(x[k] for x in lists if k < len(x))
        return order
    if by == "slot":                      # host by host, in mapping order
        return [i for host in sorted(per_host) for i in per_host[host]]
    order = []
    for host in sorted(per_host):
        topo = topos[host]
        owner = {}
        for g, group in enumerate(objects(topo, by)):
            for cpu in group:
                owner[cpu] = g
        groups: Dict[int, List[int]] = {}
        for i in per_host[host]:
            key = owner.get(locs[i][0], 0) if locs[i] else 0
            groups.setdefault(key, []).append(i)
        lists = [groups[g] for g in sorted(groups)]
        for k in range(max((len(x) for x in lists), default=0)):
            order.extend(x[k] for x in lists if k < len(x))
    return order


def binding(topo: Topology, loc: Tuple[int, ...], local_rank: int,
            job: JobSpec) -> Optional[Tuple[int, ...]]:
    """The CPUs a rank at ``loc`` is bound to, or None (not bound)."""
    kind = job.bind_to
    if kind == "cpu-list" or (kind == "none" and job.cpu_list):
        cpus = job.cpu_list or ()
        if not cpus:
            return None
        return (cpus[local_rank % len(cpus)],) if job.bind_ordered else tuple(cpus)
    if kind == "none":
        if job.pe:
            return tuple(sorted(loc)) or None
        if job.cpu_set:
            known = set(topo.cpu_ids())
            return tuple(c for c in job.cpu_set if c in known) or None
        return None
    if not loc:
        return None
    if kind == "hwthread":
        first = {}
        for row in topo.cpus:
            first.setdefault(row[1], row[CPU])
        cores = {row[CPU]: row[1] for row in topo.cpus}
        picked = []
        for cpu in loc:
            lead = first[cores[cpu]]
            chosen = cpu if job.use_hwthreads else lead
            if chosen not in picked:
                picked.append(chosen)
        return tuple(sorted(picked))
    chosen = set()
    inside = set(loc)
    for group in objects(topo, "node" if kind == "board" else kind):
        if inside.intersection(group):
            chosen.update(group)
    return tuple(sorted(chosen))


def check_overload(host: str, bound: Sequence[Optional[Tuple[int, ...]]], job: JobSpec) -> None:
    """Refuse to bind more ranks to one core or thread than it has (Open MPI's rule)."""
    if job.bind_overload or job.bind_to not in TIGHT + ("cpu-list",):
        return
    if job.bind_to == "cpu-list" and not job.bind_ordered:
        return
    seen: Dict[Tuple[int, ...], int] = {}
    for cpus in bound:
        if cpus:
            seen[cpus] = seen.get(cpus, 0) + 1
    for cpus, n in seen.items():
        if n > len(cpus):
            raise PlanError(
                f"--bind-to {job.bind_to}: {n} ranks would share cpu(s) "
                f"{','.join(map(str, cpus))} on {host}; give fewer ranks, or allow it with "
                f"--bind-to {job.bind_to}:overload-allowed")
