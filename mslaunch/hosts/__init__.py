"""Hosts: where the job may run, as :class:`~mslaunch.spec.HostEntry` items.

Sources, in order of precedence: the command line (``-H``, hostfiles:
:mod:`.hostfile`), a resource manager's allocation (Slurm, PBS:
:mod:`.allocation`), else this machine.  :mod:`.local` tells which names
denote this machine.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import List, Mapping

    from ..spec import JobSpec

from ..spec import HostEntry


def host_entries(job: JobSpec, environ: Mapping[str, str]) -> List[HostEntry]:
    """The hosts to use: the command line's, an allocation's, or this machine."""
    if job.hosts:
        entries = list(job.hosts)
        if job.host_filter:
            from ..plan import filter_hosts
            entries = filter_hosts(entries, job.host_filter)
        return entries
    if "SLURM_JOB_NODELIST" in environ or "SLURM_NODELIST" in environ \
            or "PBS_NODEFILE" in environ:
        from .allocation import allocation_hosts
        found = allocation_hosts(environ)
        if found is not None:
            return list(found[0])
    from ..plan import IMPLICIT_HOST
    return [HostEntry(name="localhost", slots=None, origin=IMPLICIT_HOST)]
