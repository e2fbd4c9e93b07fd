"""LSF's allocation (with ``LSB_JOBID``): ``LSB_DJOB_HOSTFILE`` lists a host
once per slot; else ``LSB_MCPU_HOSTS`` is ``HOST N HOST N ...``."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import List, Mapping, Optional, Tuple

from ...core.errors import HostfileError
from ...core.spec import HostEntry
from ..hostfile import _count, _name_problem, _show_path, _x
from . import in_lsf, merge_counts
from .pbs import host_lines


def hosts(environ: Mapping[str, str]) -> Optional[Tuple[List[HostEntry], str]]:
    """The hosts of the LSF job."""
    return _lsf_hosts(environ) if in_lsf(environ) else None


def _lsf_hosts(environ: Mapping[str, str]) -> Tuple[List[HostEntry], str]:
    path = environ.get("LSB_DJOB_HOSTFILE", "")
    if path:
        entries, _ = host_lines(path, "LSB_DJOB_HOSTFILE")
        return entries, f"LSF allocation (LSB_DJOB_HOSTFILE={_show_path(path)})"
    text = environ["LSB_MCPU_HOSTS"]
    words = text.split()
    if len(words) % 2:
        raise HostfileError(f"LSB_MCPU_HOSTS={_x(text)}: expected 'HOST N HOST N ...'")
    pairs: List[Tuple[str, int, str]] = []
    for name, count in zip(words[::2], words[1::2]):
        problem = _name_problem(name)
        slots = _count(count)
        if problem or slots is None:
            raise HostfileError(f"LSB_MCPU_HOSTS: {problem or f'bad slot count {_x(count)}'}"
                                f" for {_x(name)}")
        pairs.append((name, slots, "LSB_MCPU_HOSTS"))
    return merge_counts(pairs), f"LSF allocation (LSB_MCPU_HOSTS={text.strip()})"
