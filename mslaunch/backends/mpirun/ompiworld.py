"""The program's own Open MPI, against the mpirun the Open MPI-backed mode runs.

The program keeps the MPI library it links (:mod:`.ompiargs`), which may not
be the mpirun's.  To know, every rank gets two of Open MPI's own parameters,
as the default mode's singleton check does (:mod:`mslaunch.mpi.pmi.singletons`):
``mpi_show_mca_params=enviro`` and ``mpi_show_mca_params_file=FILE``.  In
``MPI_Init``, ``MPI_COMM_WORLD`` rank 0 writes FILE, with the world's size in
its header; Open MPI 4 (and older: the ORTE generation) lists ``ess=`` and
``orte_*`` parameters there, which 5 has not.  Measured with Debian's 4.1.4 and
the wheel's 5.0.11:

- an Open MPI 5 program under 4.1.4's mpirun runs (PMIx speaks across
  versions): one line says so;
- an Open MPI 4 program under 5's mpirun: every rank starts alone
  (``ess=singleton``, "out of a total of 1"), so N ranks would be N one-rank
  jobs that all succeed; one line says so and the job is stopped.

Only when every rank runs on this host (a remote rank 0 would write on its own
host: no ``-H`` or hostfile naming another host, no batch allocation, no
default hostfile of Open MPI's) and the user has not set those parameters.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import List, Mapping, Optional, Tuple

    from ...core.spec import JobSpec
    from .ompifind import OpenMPI

_TOTAL = b"out of a total of "
#: Variables of the batch systems whose allocations Open MPI's mpirun reads itself.
_ALLOCATIONS = ("SLURM_JOB_ID", "PBS_JOBID", "PBS_NODEFILE", "LSB_JOBID", "PE_HOSTFILE")


class WorldProbe:
    """The file rank 0's ``MPI_Init`` writes, and what it says about the program."""

    def __init__(self, path: str, ompi: OpenMPI, size: Optional[int],
                 quiet: bool = False) -> None:
        self.path = path
        self.ompi = ompi
        self.size = size            # the job's ranks, if -n says
        self.quiet = quiet          # --quiet: only the line that stops the job
        self.done = False

    def flags(self) -> List[str]:
        """``-x`` flags for every rank."""
        return ["-x", "OMPI_MCA_mpi_show_mca_params=enviro",
                "-x", f"OMPI_MCA_mpi_show_mca_params_file={self.path}"]

    def check(self) -> Optional[Tuple[str, bool]]:
        """Once rank 0 has written the file: ``(message, stop)`` when the program's
        Open MPI is not the mpirun's major version, else None (also before)."""
        if self.done:
            return None
        head = _read_head(self.path)
        if head is None or _TOTAL not in head or b")" not in head.split(_TOTAL, 1)[1]:
            return None         # not written yet (or being written)
        self.done = True
        program = 4 if (b"\ness=" in head or b"\norte_" in head) else 5
        mpirun = self.ompi.major
        if program == mpirun:
            return None
        where = (f"{self.ompi.argv[0]}, Open MPI {self.ompi.version or '?'}'s mpirun "
                 f"({self.ompi.source})")
        alone = head.split(_TOTAL, 1)[1].startswith(b"1)") and b"\ness=singleton" in head
        if program < mpirun and alone and self.size != 1:
            return (f"the program runs an Open MPI {program} library under {where}: each of "
                    f"its ranks starts alone (rank 0 of 1), so the job fails; run it "
                    f"with its own Open MPI's mpirun (MSLAUNCH_OMPI_MPIRUN, or that Open "
                    f"MPI's bin directory first on PATH)", True)
        return (f"note: the program runs an Open MPI {program} library under {where}; "
                f"for its own Open MPI set MSLAUNCH_OMPI_MPIRUN to that mpirun", False)


def _read_head(path: str) -> Optional[bytes]:
    """The start of a regular file, never blocking (a rank could put a FIFO there)."""
    import stat
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return os.read(fd, 8192) if stat.S_ISREG(os.fstat(fd).st_mode) else None
    except OSError:
        return None
    finally:
        os.close(fd)


def world_probe(job: JobSpec, environ: Mapping[str, str], ompi: OpenMPI,
                base: Optional[str]) -> Optional[WorldProbe]:
    """The job's probe in the directory ``base``, or None where there can be none
    (see the module docstring)."""
    if base is None:
        return None
    from ...hosts import is_local
    if any(not is_local(h.name) for h in job.hosts) or any(n in environ for n in _ALLOCATIONS):
        return None        # ranks elsewhere: mpirun's own hosts, or the allocation's
    names = [k for k, _ in job.mca] + [n for n, _ in job.global_env] + list(environ)
    if any("mpi_show_mca_params" in name or "default_hostfile" in name for name in names):
        return None
    size = sum(a.np for a in job.apps if a.np) if all(a.np for a in job.apps) else None
    return WorldProbe(os.path.join(base, "world"), ompi, size, job.quiet)


__all__ = ["WorldProbe", "world_probe"]
