"""Placement (pure): how many ranks each host gets, where each runs inside it,
how ranks are numbered and what they are bound to.

After :func:`place` has decided how many ranks each host gets, Open MPI's
mapping, ranking and binding follow on each host's
:class:`~mslaunch.core.cputopo.Topology`:

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
    from typing import Dict, List, Mapping, Optional, Sequence, Set, Tuple

    from ..core.spec import JobSpec

from ..core.errors import PlanError, UsageError
from ..core.cputopo import CPU, Topology, objects
from ..core.spec import Host, HostEntry


def resolve_hosts(entries: Sequence[HostEntry], *, ncores: int, hostname: str,
                  is_local=None, remote_cores: Optional[Mapping[str, int]] = None) -> List[Host]:
    """Turn host entries into hosts with slot counts.

    All names of this machine collapse into one host (so its ranks share a
    node id and MPI shared memory); an entry without a count gets ``ncores``
    slots on this machine, the number of cores a remote host's agent
    reported (``remote_cores``, as Open MPI's daemons report them), and 1
    for a remote host not heard from yet.
    """
    remote_cores = remote_cores or {}
    if is_local is None:
        from ..hosts import is_local
    merged: Dict[str, List] = {}  # key -> [name, slots, max_slots, local]
    for e in entries:
        local = is_local(e.name)
        key = "\0local" if local else e.name
        item = merged.setdefault(key, [hostname if local else e.name, 0, None, local])
        # Open MPI 4.1.4: a line with max_slots but no slots gets max_slots slots.
        default = e.max_slots if e.max_slots is not None else (
            ncores if local else remote_cores.get(e.name, 1))
        item[1] += e.slots if e.slots is not None else default
        if e.max_slots is not None:
            item[2] = (item[2] or 0) + e.max_slots
    return [Host(name=name, slots=slots, max_slots=max_slots, local=local, node_id=i)
            for i, (name, slots, max_slots, local) in enumerate(merged.values())]


def _names(names: Sequence[str], limit: int = 8) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _describe(hosts: Sequence[Host], limit: int = 8) -> str:
    text = ", ".join(f"{h.name}: {h.slots}" + (f" (max {h.max_slots})" if h.max_slots else "")
                     for h in hosts[:limit])
    return text + (f", and {len(hosts) - limit} more host(s)" if len(hosts) > limit else "")


def _deal(order: List[int], hosts: Sequence[int], room: List[Optional[int]], count: int) -> int:
    """Deal up to ``count`` ranks round-robin over ``hosts`` (in order) while they have room.

    ``room[i]`` is how many more host ``i`` takes (None: no limit); ranks are
    appended to ``order``.  Each round costs the hosts still open, so the
    whole deal is linear in hosts plus ranks.  Returns how many were dealt.
    """
    dealt = 0
    open_hosts = [i for i in hosts if room[i] is None or room[i] > 0]  # type: ignore[operator]
    while dealt < count and open_hosts:
        still = []
        for i in open_hosts:
            if dealt == count:
                break
            order.append(i)
            dealt += 1
            if room[i] is not None:
                room[i] -= 1  # type: ignore[operator]
                if room[i] == 0:
                    continue
            still.append(i)
        else:
            open_hosts = still
            continue
        break
    return dealt


def _wrap(nhosts: int, np: Optional[int], per_node: int) -> List[int]:
    """Hydra's ``-ppn N``: N ranks per host in turn (without ``-n``: N on each host once)."""
    left = per_node * nhosts if np is None else np
    order: List[int] = []
    while left > 0:
        for i in range(nhosts):
            take = min(per_node, left)
            order.extend([i] * take)
            left -= take
            if not left:
                break
    return order


def place(hosts: Sequence[Host], np: Optional[int], *, map_by: str = "slot",
          per_node: Optional[int] = None, oversubscribe: bool = False,
          max_ranks: int = 100_000, per_host: Optional[Sequence[int]] = None,
          wrap: bool = False) -> List[int]:
    """Return the host index of each rank, in world-rank order.

    ``slot`` fills each host to its capacity before the next; ``node`` deals
    ranks round-robin.  Capacity is the slot count, or ``per_node``.  Extra
    ranks need ``oversubscribe`` and are dealt round-robin; as in Open MPI
    4.1.4, ``max_slots`` does not limit them.  With ``slot`` each host's ranks
    are contiguous.  Linear in the number of hosts plus ranks.

    ``wrap`` is Hydra's ``-ppn``: blocks of ``per_node`` ranks go to the hosts
    in turn, around the list again as long as ranks are left; never refused.
    """
    if wrap and per_node is not None and hosts:
        return _wrap(len(hosts), np, per_node)
    if not hosts:
        raise PlanError("no hosts to run on")
    caps = []
    for i, h in enumerate(hosts):
        if per_host is not None:
            per_node = per_host[i]          # ppr:N:OBJ: N times the host's objects
        cap = h.slots if per_node is None else per_node
        if per_node is not None and per_node > h.slots and not oversubscribe:
            raise PlanError(f"{per_node} ranks per host do not fit on {h.name} with "
                            f"{h.slots} slots; use --oversubscribe")
        if h.max_slots is not None:
            cap = min(cap, h.max_slots)
        caps.append(cap)
    total = sum(caps)
    if np is None:
        np = total
        if np > max_ranks:
            raise UsageError(f"the hosts offer {total} slots, and without -n every slot gets a "
                             f"rank: more than the limit of {max_ranks} ranks (give -n)")
    if np < 1:
        raise PlanError("no slots available on the hosts given")
    everyone = range(len(hosts))
    order: List[int] = []
    if map_by == "node":
        _deal(order, everyone, list(caps), np)
        counts: Optional[List[int]] = None
    else:
        counts = []
        left = np
        for cap in caps:
            take = min(cap, left)
            counts.append(take)
            left -= take
    placed = len(order) if counts is None else sum(counts)
    extra = np - placed
    if extra > 0:
        if per_host is not None:
            raise PlanError(f"{np} ranks requested but the ppr pattern places only {total} "
                            f"on {len(hosts)} host(s)")
        if per_node is not None:
            raise PlanError(f"{np} ranks requested but {per_node} per host on {len(hosts)} "
                            f"host(s) place only {total}")
        if not oversubscribe:
            raise PlanError(f"not enough slots: {np} ranks requested but the hosts have "
                            f"{total} slots ({_describe(hosts)}); use --oversubscribe "
                            f"to run more ranks than slots")
        extras: List[int] = []
        _deal(extras, everyone, [None] * len(hosts), extra)
        if counts is None:
            order.extend(extras)
        else:
            for i in extras:
                counts[i] += 1
    if counts is None:
        return order
    return [i for i, c in enumerate(counts) for _ in range(c)]


# -- inside a host: mapping, ranking, binding ---------------------------------------

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


def check_pe(host: str, topo: Topology, count: int, job: JobSpec,
             oversubscribe: bool) -> None:
    """Refuse ``PE=N`` (cpus per rank) beyond what a host has, as Open MPI does:
    more than its cpus for one rank, or, unless overload is allowed (or the job
    oversubscribes), for its ranks together (they would share cpus)."""
    have = len(units(topo, job.use_hwthreads))
    pe = job.pe or 1
    what = "hardware threads" if job.use_hwthreads else "cores"
    if pe > have:
        raise PlanError(f"PE={pe}: a rank would need {pe} {what}, and {host} has {have}")
    if count * pe > have and not (job.bind_overload or oversubscribe):
        unit = "hwthread" if job.use_hwthreads else "core"
        raise PlanError(f"PE={pe}: {count} ranks on {host} would need {count * pe} {what}, "
                        f"and it has {have}; give fewer ranks or fewer cpus each, or allow "
                        f"it with --oversubscribe or --bind-to {unit}:overload-allowed")


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
        first: Dict[int, int] = {}
        for row in topo.cpus:
            first.setdefault(row[1], row[CPU])
        cores = {row[CPU]: row[1] for row in topo.cpus}
        picked = []
        for cpu in loc:
            lead = first[cores[cpu]]
            thread = cpu if job.use_hwthreads else lead
            if thread not in picked:
                picked.append(thread)
        return tuple(sorted(picked))
    chosen: Set[int] = set()
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
