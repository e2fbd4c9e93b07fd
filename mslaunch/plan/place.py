"""Placement: slot counts of hosts and the host of each rank (pure)."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Optional, Sequence

from ..errors import PlanError
from ..spec import Host, HostEntry


def resolve_hosts(entries: Sequence[HostEntry], *, ncores: int, hostname: str,
                  is_local=None) -> List[Host]:
    """Turn host entries into hosts with slot counts.

    All names of this machine collapse into one host (so its ranks share a
    node id and MPI shared memory); an entry without a count gets ``ncores``
    slots on this machine and 1 elsewhere.
    """
    if is_local is None:
        is_local = _is_local
    merged: Dict[str, List] = {}  # key -> [name, slots, max_slots, local]
    for e in entries:
        local = is_local(e.name)
        key = "\0local" if local else e.name
        item = merged.setdefault(key, [hostname if local else e.name, 0, None, local])
        item[1] += e.slots if e.slots is not None else (ncores if local else 1)
        if e.max_slots is not None:
            item[2] = (item[2] or 0) + e.max_slots
    return [Host(name=name, slots=slots, max_slots=max_slots, local=local, node_id=i)
            for i, (name, slots, max_slots, local) in enumerate(merged.values())]


def _is_local(name: str) -> bool:
    if name == "localhost":
        return True   # the default host: spare the import of the parsers
    from ..hosts.local import is_local_host
    return is_local_host(name)


def filter_hosts(pool: Sequence[HostEntry], wanted: Sequence[HostEntry]) -> List[HostEntry]:
    """``--hostfile`` gives the pool and ``-H`` picks hosts from it."""
    names = {w.name for w in wanted}
    missing = [w.name for w in wanted if w.name not in {p.name for p in pool}]
    if missing:
        raise PlanError(f"-H names host(s) not in the hostfile: {', '.join(missing)}")
    return [p for p in pool if p.name in names]


def _describe(hosts: Sequence[Host]) -> str:
    return ", ".join(f"{h.name}: {h.slots}" + (f" (max {h.max_slots})" if h.max_slots else "")
                     for h in hosts)


def place(hosts: Sequence[Host], np: Optional[int], *, map_by: str = "slot",
          per_node: Optional[int] = None, oversubscribe: bool = False) -> List[int]:
    """Return the host index of each rank, in world-rank order.

    ``slot`` fills each host to its capacity before the next; ``node`` deals
    ranks round-robin.  Capacity is the slot count, or ``per_node``.  Extra
    ranks need ``oversubscribe`` and are dealt round-robin, never above a
    host's ``max_slots``.  With ``slot`` each host's ranks are contiguous.
    """
    if not hosts:
        raise PlanError("no hosts to run on")
    caps = []
    for h in hosts:
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
    if np < 1:
        raise PlanError("no slots available on the hosts given")
    counts = [0] * len(hosts)
    order: List[int] = []
    if map_by == "node":
        placed = 0
        while placed < np:
            progress = False
            for i in range(len(hosts)):
                if placed < np and counts[i] < caps[i]:
                    counts[i] += 1
                    order.append(i)
                    placed += 1
                    progress = True
            if not progress:
                break
    else:
        for i, cap in enumerate(caps):
            take = min(cap, np - sum(counts))
            counts[i] = take
    extra = np - sum(counts)
    if extra > 0:
        if per_node is not None:
            raise PlanError(f"{np} ranks requested but {per_node} per host on {len(hosts)} "
                            f"host(s) place only {total}")
        if not oversubscribe:
            raise PlanError(f"not enough slots: {np} ranks requested but the hosts have "
                            f"{total} slots ({_describe(hosts)}); use --oversubscribe "
                            f"to run more ranks than slots")
        while extra > 0:
            progress = False
            for i, h in enumerate(hosts):
                if extra and (h.max_slots is None or counts[i] < h.max_slots):
                    counts[i] += 1
                    extra -= 1
                    progress = True
                    if map_by == "node":
                        order.append(i)
            if not progress:
                raise PlanError(f"{np} ranks requested but the hosts' max_slots allow only "
                                f"{sum(counts)} ({_describe(hosts)})")
    if map_by == "node":
        return order
    return [i for i, c in enumerate(counts) for _ in range(c)]
