"""The variables through which MPICH's Hydra and Intel MPI's mpiexec are configured.

Read before the command line, which overrides them (``MPIEXEC_TIMEOUT`` is
read with ``--timeout``).  The launcher and bootstrap variables
(``HYDRA_LAUNCHER``, ``I_MPI_HYDRA_BOOTSTRAP``, ...) are not read here: they
choose how the agents start.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Optional, Tuple

    from .draft import Draft

from ..errors import one_line
from .draft import check_int

#: Variables with no effect here, and why (``-v`` prints it when one is set).
NO_EFFECT: Tuple[Tuple[str, str], ...] = (
    ("HYDRA_RMK", "mslaunch finds Slurm and PBS allocations by itself"),
    ("I_MPI_HYDRA_RMK", "mslaunch finds Slurm and PBS allocations by itself"),
    ("MPIEXEC_PORT_RANGE", "mslaunch's PMI ports are chosen by the kernel"),
    ("MPICH_PORT_RANGE", "mslaunch's PMI ports are chosen by the kernel"),
    ("MPIEXEC_PREFIX_STDOUT", "use -l or --tag-output to prefix lines"),
    ("MPIEXEC_PREFIX_STDERR", "use -l or --tag-output to prefix lines"),
)


def _perhost(word: str) -> Optional[int]:
    if word.strip().lower() in ("all", "allcores", ""):
        return None        # a rank per slot (core), mslaunch's default
    return check_int("I_MPI_PERHOST (environment)", word.strip())


def apply_hydra_environment(d: Draft) -> None:
    """What Hydra's and Intel MPI's variables in ``d.environ`` say, applied to a fresh draft."""
    env = d.environ
    for var in ("HYDRA_HOST_FILE", "I_MPI_HYDRA_HOST_FILE"):
        if env.get(var) and d.default_hostfile is None:
            import os
            d.default_hostfile = os.path.join(d.cwd, env[var])
            d.hostfile_source = (d.default_hostfile, f"{var} (environment)")
    if env.get("HYDRA_ENV"):
        if env["HYDRA_ENV"].strip().lower() == "all":
            d.forward_env = True
        else:              # Hydra 5.0.2 ignores any other value too
            d.notes.append(f"HYDRA_ENV={one_line(env['HYDRA_ENV'], 20)} (environment) has no "
                           f"effect here: only 'all' (as -genvall) means something")
    if env.get("HYDRA_DEBUG", "0").strip() not in ("", "0"):
        d.verbose += 1
    if env.get("I_MPI_PERHOST"):
        d.perhost = _perhost(env["I_MPI_PERHOST"])
    for var, why in NO_EFFECT:
        if env.get(var):
            d.notes.append(f"{var} (environment) has no effect here: {why}")
