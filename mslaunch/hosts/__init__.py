"""Hosts: where the job may run, as :class:`~mslaunch.core.spec.HostEntry` items.

Sources, in order of precedence: the command line (``-H``, hostfiles:
:mod:`.hostfile`), a resource manager's allocation (Slurm, PBS, Grid Engine,
LSF: one reader each in :mod:`.allocations`), else this machine.  :mod:`.local` tells which names
denote this machine.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import List, Mapping, Sequence

    from ..core.spec import JobSpec

from ..core.spec import HostEntry

#: The origin of the host entry used when no host list is given.
IMPLICIT_HOST = "this machine"


def host_entries(job: JobSpec, environ: Mapping[str, str]) -> List[HostEntry]:
    """The hosts to use: the command line's, an allocation's, or this machine."""
    if job.hosts:
        entries = list(job.hosts)
        if job.host_filter:
            entries = filter_hosts(entries, job.host_filter)
        return entries
    from .allocations import allocation_hosts, may_be_in_one
    if may_be_in_one(environ):
        found = allocation_hosts(environ)
        if found is not None:
            return list(found[0])
    return [HostEntry(name="localhost", slots=None, origin=IMPLICIT_HOST)]


def is_local(name: str) -> bool:
    """Whether ``name`` is this machine (see :func:`.local.is_local_host`)."""
    if name == "localhost":
        return True   # the default host: spare the import of the parsers
    from .local import is_local_host
    return is_local_host(name)


def filter_hosts(pool: Sequence[HostEntry], wanted: Sequence[HostEntry]) -> List[HostEntry]:
    """``--hostfile`` gives the pool and ``-H`` picks hosts from it."""
    names = {w.name for w in wanted}
    have = {p.name for p in pool}
    missing = [w.name for w in wanted if w.name not in have]
    if missing:
        from ..core.errors import PlanError
        shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
        raise PlanError(f"-H names host(s) not in the hostfile: {shown}")
    return [p for p in pool if p.name in names]
