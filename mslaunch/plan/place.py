"""Placement: slot counts of hosts and the host of each rank (pure)."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Mapping, Optional, Sequence

from ..errors import PlanError, UsageError
from ..spec import Host, HostEntry


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


def place(hosts: Sequence[Host], np: Optional[int], *, map_by: str = "slot",
          per_node: Optional[int] = None, oversubscribe: bool = False,
          max_ranks: int = 100_000, per_host: Optional[Sequence[int]] = None) -> List[int]:
    """Return the host index of each rank, in world-rank order.

    ``slot`` fills each host to its capacity before the next; ``node`` deals
    ranks round-robin.  Capacity is the slot count, or ``per_node``.  Extra
    ranks need ``oversubscribe`` and are dealt round-robin; as in Open MPI
    4.1.4, ``max_slots`` does not limit them.  With ``slot`` each host's ranks
    are contiguous.  Linear in the number of hosts plus ranks.
    """
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
        _deal(order, everyone, list(caps), np)  # type: ignore[arg-type]
        counts = None
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


def _count_per_host(order: Sequence[int], nhosts: int) -> List[int]:
    counts = [0] * nhosts
    for i in order:
        counts[i] += 1
    return counts
