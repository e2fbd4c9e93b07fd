"""PBS/Torque's allocation: ``PBS_NODEFILE`` lists a host once per slot."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import List, Mapping, Optional, Tuple

from ...core.errors import HostfileError
from ...core.spec import HostEntry
from ..hostfile import MAX_HOSTS, _name_problem, _show_path, read_host_file
from . import merge_counts


def hosts(environ: Mapping[str, str]) -> Optional[Tuple[List[HostEntry], str]]:
    """The hosts of ``PBS_NODEFILE``, a host's slots the lines naming it."""
    path = environ.get("PBS_NODEFILE", "")
    return host_lines(path) if path else None


def host_lines(path: str, var: str = "PBS_NODEFILE") -> Tuple[List[HostEntry], str]:
    """The hosts of a file that lists a host once per slot (``var`` names it)."""
    shown = _show_path(path)
    text = read_host_file(path, var, sep="=")
    pairs: List[Tuple[str, int, str]] = []
    for number, line in enumerate(text.split("\n"), 1):
        name = line.split("#", 1)[0].strip()
        if not name:
            continue
        problem = _name_problem(name)
        if problem:
            raise HostfileError(f"{shown}:{number}: {problem} (from {var})")
        pairs.append((name, 1, f"{shown}:{number}"))
        if len(pairs) > 64 * MAX_HOSTS:
            raise HostfileError(f"{shown}:{number}: more lines than any allocation has slots "
                                f"(from {var})")
    if not pairs:
        raise HostfileError(f"{var}={shown}: lists no hosts")
    return merge_counts(pairs), f"PBS allocation (PBS_NODEFILE={shown})"
