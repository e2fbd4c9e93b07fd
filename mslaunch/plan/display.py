"""What ``--display-allocation``, ``--display-map`` and friends print (Open MPI 4's text).

Pure functions of a :class:`~mslaunch.core.spec.Plan`; the separators are tabs,
as Open MPI 4.1.4 writes them.  A rank that is not bound shows ``N/A``.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List

    from ..core.spec import JobSpec, Plan, RankSpec

from .bindings import binding_map, binding_words
from ..core.cputopo import objects


def job_id() -> str:
    """Open MPI's ``[family,1]`` job name; the family is the launcher's pid (16 bits)."""
    return f"[{os.getpid() & 0xFFFF},1]"


def allocation(plan: Plan) -> str:
    lines = ["", "======================   ALLOCATED NODES   ======================"]
    for host in plan.hosts:
        flags = "0x11" if host.local else "0x10"
        lines.append(f"\t{host.name}: flags={flags} slots={host.slots} "
                     f"max_slots={host.max_slots or 0} slots_inuse=0 state=UP")
    lines.append("=================================================================")
    return "\n".join(lines) + "\n"


def _by_node(plan: Plan) -> Dict[int, List[RankSpec]]:
    by: Dict[int, List[RankSpec]] = {}
    for r in plan.ranks:
        by.setdefault(r.host.node_id, []).append(r)
    return by


def _bound(plan: Plan, r: RankSpec, sep: str = ":") -> str:
    if not r.cpus or not plan.topologies:
        return "N/A"
    topo = plan.topologies[r.host.node_id]
    if set(r.cpus) >= set(topo.cpu_ids()):  # type: ignore[attr-defined]
        return "N/A"
    return f"{binding_words(topo, r.cpus)}{sep}{binding_map(topo, r.cpus)}"  # type: ignore[arg-type]


def job_map(plan: Plan) -> str:
    """The ``--display-map`` text."""
    jobid = job_id()
    total = sum(h.slots for h in plan.hosts)
    lines = [f" Data for JOB {jobid} offset 0 Total slots allocated {total}", "",
             " ========================   JOB MAP   ========================", ""]
    by = _by_node(plan)
    for host in plan.hosts:
        here = by.get(host.node_id, [])
        lines.append(f" Data for node: {host.name}\tNum slots: {host.slots}\t"
                     f"Max slots: {host.max_slots or 0}\tNum procs: {len(here)}")
        for r in here:
            lines.append(f" \tProcess OMPI jobid: {jobid} App: {r.app} Process rank: {r.rank} "
                         f"Bound: {_bound(plan, r)}")
        lines.append("")
    lines.append(" =============================================================")
    return "\n".join(lines) + "\n"


def diffable_map(plan: Plan) -> str:
    """The ``--display-diffable-map`` text."""
    lines = ["<map>"]
    by = _by_node(plan)
    for host in plan.hosts:
        lines.append(f"\t<host num={host.node_id}>")
        for r in by.get(host.node_id, []):
            binding = _bound(plan, r).split(":")[-1]
            lines.append(f"\t\t<process rank={r.rank} app_idx={r.app} local_rank={r.local_rank} "
                         f"node_rank={r.local_rank} binding={binding}>")
        lines.append("\t</host>")
    lines.append("</map>")
    return "\n".join(lines) + "\n"


def topologies(plan: Plan) -> str:
    """``--display-topo``: the sockets, cores and threads of each host."""
    lines = []
    for host, topo in zip(plan.hosts, plan.topologies):
        lines.append(f" Topology of node: {host.name}")
        for s, socket in enumerate(objects(topo, "socket")):  # type: ignore[arg-type]
            cores = [c for c in objects(topo, "core") if c[0] in set(socket)]  # type: ignore[arg-type]
            text = " ".join("[" + ",".join(map(str, c)) + "]" for c in cores)
            lines.append(f" \tsocket {s}: {len(cores)} core(s) {text}")
    return "\n".join(lines) + "\n"


def display(plan: Plan, job: JobSpec) -> str:
    """Everything the job's ``--display-*`` options ask for, in Open MPI's order."""
    parts = []
    if job.display_allocation:
        parts.append(allocation(plan))
    if job.display_topo and plan.topologies:
        parts.append(topologies(plan))
    if job.display_map:
        parts.append(job_map(plan))
    if job.display_diffable:
        parts.append(diffable_map(plan))
    return "".join(parts)

