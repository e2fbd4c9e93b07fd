"""Grid Engine's allocation: ``PE_HOSTFILE``'s ``HOST SLOTS QUEUE PROCESSORS``
lines, read when ``JOB_ID``, ``SGE_ROOT`` and ``ARC`` are set too (as Open
MPI reads it)."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import List, Mapping, Optional, Tuple

from ...core.errors import HostfileError
from ...core.spec import HostEntry
from ..hostfile import _count, _name_problem, _show_path, _x, read_host_file
from . import in_grid_engine, merge_counts


def hosts(environ: Mapping[str, str]) -> Optional[Tuple[List[HostEntry], str]]:
    """The hosts of ``PE_HOSTFILE`` inside a parallel environment."""
    return _grid_engine_hosts(environ["PE_HOSTFILE"]) if in_grid_engine(environ) else None


def _grid_engine_hosts(path: str) -> Tuple[List[HostEntry], str]:
    shown = _show_path(path)
    text = read_host_file(path, "PE_HOSTFILE")
    pairs: List[Tuple[str, int, str]] = []
    for number, line in enumerate(text.split("\n"), 1):
        words = line.split()
        if not words:
            continue
        problem = _name_problem(words[0])
        if problem:
            raise HostfileError(f"{shown}:{number}: {problem} (from PE_HOSTFILE)")
        slots = _count(words[1]) if len(words) > 1 else None
        if slots is None:
            raise HostfileError(f"{shown}:{number}: expected 'HOST SLOTS QUEUE PROCESSORS', "
                                f"got {_x(line.strip())} (from PE_HOSTFILE)")
        pairs.append((words[0], slots, f"{shown}:{number}"))
    if not pairs:
        raise HostfileError(f"PE_HOSTFILE={shown}: lists no hosts")
    return merge_counts(pairs), f"Grid Engine allocation (PE_HOSTFILE={shown})"
