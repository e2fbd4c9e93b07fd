"""A binding as Open MPI 4 writes it: ``--report-bindings`` and ``--display-map``.

:func:`binding_words` and :func:`binding_map` are the two halves of the text
(``socket 0[core 1[hwt 0-1]]`` and ``[../BB]``), numbered as hwloc's logical
indexes of a :class:`~mslaunch.core.cputopo.Topology`; :func:`report_binding` is one
``--report-bindings`` line.  Imported only by the reports that print them.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, Iterable, List, Optional, Tuple

    from ..core.cputopo import Topology

from ..core.cputopo import CORE, CPU, PACKAGE


def _ranges(values: Iterable[int]) -> str:
    """``0-3,8`` for {0, 1, 2, 3, 8}."""
    out: List[str] = []
    start = prev = None
    for v in sorted(set(values)):
        if prev is not None and v == prev + 1:
            prev = v
            continue
        if start is not None:
            out.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = v
    if start is not None:
        out.append(str(start) if start == prev else f"{start}-{prev}")
    return ",".join(out)


def binding_words(topo: Topology, cpus: Iterable[int]) -> str:
    """Open MPI 4's ``socket 0[core 1[hwt 0-1]], ...`` for a set of CPUs.

    As ``opal_hwloc_base_cset2str``: one item per bound core, in order of
    socket then core; the core number is the core's logical index over the
    whole host (not within its socket); ``hwt`` lists which of the core's
    threads are bound, by their position in the core, as ranges.
    """
    chosen = set(cpus)
    threads: Dict[Tuple[int, int], List[int]] = {}
    position: Dict[int, int] = {}
    for row in topo.cpus:
        hwt = position.get(row[CORE], 0)
        position[row[CORE]] = hwt + 1
        if row[CPU] in chosen:
            threads.setdefault((row[PACKAGE], row[CORE]), []).append(hwt)
    return ", ".join(f"socket {s}[core {c}[hwt {_ranges(threads[s, c])}]]"
                     for s, c in sorted(threads))


def binding_map(topo: Topology, cpus: Iterable[int]) -> str:
    """Open MPI 4's mask ``[BB/..][../..]`` for a set of CPUs.

    As ``opal_hwloc_base_cset2mapstr``: one bracket per socket, its cores
    separated by ``/``, one character per hardware thread: ``B`` bound,
    ``.`` not.
    """
    chosen = set(cpus)
    sockets: Dict[int, Dict[int, List[str]]] = {}
    for row in topo.cpus:
        core = sockets.setdefault(row[PACKAGE], {}).setdefault(row[CORE], [])
        core.append("B" if row[CPU] in chosen else ".")
    return "".join("[" + "/".join("".join(sockets[s][c]) for c in sorted(sockets[s])) + "]"
                   for s in sorted(sockets))


def describe_binding(topo: Topology, cpus: Iterable[int]) -> Optional[str]:
    """``socket 0[core 0[hwt 0]]: [B/.]`` as in ``--report-bindings``, or None.

    None stands for Open MPI's "not bound (or bound to all available
    processors)": the set covers every CPU of the topology or none of them.
    CPUs that are not in the topology are ignored.

    Assumptions (from Open MPI 4.1's ``opal/mca/hwloc/base/hwloc_base_util.c``
    as remembered, checked only against the 1-socket 2-core output measured
    for 4.1.4): the text is ``cset2str`` + ``": "`` + ``cset2mapstr``; core
    numbers in the text are host-wide logical indexes; the mask shows only the
    CPUs of this topology (4.1.4 may also show CPUs that are online but
    outside the allowed set, as ``.``).
    """
    known = set(topo.cpu_ids())
    chosen = known.intersection(cpus)
    if not chosen or chosen == known:
        return None
    return f"{binding_words(topo, chosen)}: {binding_map(topo, chosen)}"


def report_binding(rank: int, topo: Topology, cpus: Optional[Iterable[int]]) -> str:
    """The ``MCW rank N ...`` text of one ``--report-bindings`` line.

    Open MPI prefixes ``[host:pid] `` and writes it to stderr; a rank with no
    binding at all (``--bind-to none``) gets no line, so callers skip it.
    """
    text = None if cpus is None else describe_binding(topo, cpus)
    if text is None:
        return f"MCW rank {rank} is not bound (or bound to all available processors)"
    return f"MCW rank {rank} bound to {text}"
