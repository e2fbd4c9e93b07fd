"""Hosts of a resource manager's allocation: one reader per manager, each a
module of this package with its line in :data:`READERS`.

A reader's ``hosts(environ)`` gives the allocation's hosts, with a
description, or None when the variables it needs are not all there.  Errors
are one line naming the variable or FILE:LINE.  Each host counts as many
slots as the allocation gives it; a host named twice adds up.

Whether this runs inside a manager's job, and so which starter a job's
agents get, is told here, from the variables alone: a job that reads no
allocation (hosts from ``-H``, over SSH) imports no reader.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Mapping, Optional, Tuple

    from ...core.states import LauncherName

from ...core.errors import UsageError
from ...core.states import AUTO, SLURM, SRUN, SSH
from ...core.spec import HostEntry

#: The readers, asked in this order (the first that finds its allocation wins):
#: (manager, the variables that say it may be there, module).
READERS: Tuple[Tuple[str, Tuple[str, ...], str], ...] = (
    ("Slurm", ("SLURM_JOB_NODELIST", "SLURM_NODELIST"), "mslaunch.hosts.allocations.slurm"),
    ("PBS", ("PBS_NODEFILE",), "mslaunch.hosts.allocations.pbs"),
    ("Grid Engine", ("PE_HOSTFILE",), "mslaunch.hosts.allocations.gridengine"),
    ("LSF", ("LSB_JOBID",), "mslaunch.hosts.allocations.lsf"),
)


def in_slurm(environ: Mapping[str, str]) -> bool:
    """Whether this runs inside a Slurm allocation (a job id and its node list)."""
    return bool(environ.get("SLURM_JOB_ID")) and bool(
        environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST"))


def in_grid_engine(environ: Mapping[str, str]) -> bool:
    """Inside a Grid Engine parallel environment, as Open MPI tells."""
    return all(environ.get(v) for v in ("PE_HOSTFILE", "JOB_ID", "SGE_ROOT", "ARC"))


def in_lsf(environ: Mapping[str, str]) -> bool:
    """Inside an LSF job with its hosts."""
    return bool(environ.get("LSB_JOBID")) and bool(
        environ.get("LSB_DJOB_HOSTFILE") or environ.get("LSB_MCPU_HOSTS", "").strip())


def choose_launcher(launcher: LauncherName, environ: Mapping[str, str]) -> LauncherName:
    """"ssh", "slurm", "srun" or "local" for ``--launcher`` (auto: srun's agents
    inside a Slurm allocation, else ssh).

    The one place where the job's starter is chosen (see
    :func:`mslaunch.backends.agents.starters.starter.starter_for`); it raises UsageError for
    ``slurm`` or ``srun`` outside an allocation."""
    if launcher == AUTO:
        return SLURM if in_slurm(environ) else SSH
    if launcher in (SLURM, SRUN) and not in_slurm(environ):
        raise UsageError(f"--launcher {launcher}: not inside a Slurm allocation (no "
                         f"SLURM_JOB_ID and node list); run mslaunch within salloc or sbatch")
    return launcher


def may_be_in_one(environ: Mapping[str, str]) -> bool:
    """Whether a variable of any manager's allocation is set (no reader imported)."""
    return any(environ.get(v) for _, variables, _ in READERS for v in variables)


def allocation_hosts(environ: Mapping[str, str]) -> Optional[Tuple[List[HostEntry], str]]:
    """The hosts of the first allocation a reader of :data:`READERS` finds, with a
    description; None when there is none."""
    for _, variables, module in READERS:
        if any(environ.get(v, "").strip() for v in variables):
            found = __import__(module, fromlist=["hosts"]).hosts(environ)
            if found is not None:
                return found
    return None


def merge_counts(pairs: List[Tuple[str, int, str]]) -> List[HostEntry]:
    """``(name, slots, origin)`` triples merged by name, first position kept."""
    merged: Dict[str, List] = {}
    for name, slots, origin in pairs:
        if name in merged:
            merged[name][0] += slots
        else:
            merged[name] = [slots, origin]
    return [HostEntry(name, slots, None, origin) for name, (slots, origin) in merged.items()]
