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

from ..core.errors import UsageError, one_line
from .draft import check_int

#: Where Hydra 5.0.2 reads its port range, the first one set winning (even empty).
PORT_RANGE_VARS = ("MPICH_PORTRANGE", "MPICH_PORT_RANGE", "MPIEXEC_PORTRANGE",
                   "MPIEXEC_PORT_RANGE")

#: Variables with no effect here, and why (``-v`` prints it when one is set).
NO_EFFECT: Tuple[Tuple[str, str], ...] = (
    ("HYDRA_RMK", "mslaunch finds Slurm, PBS, Grid Engine and LSF allocations by itself"),
    ("I_MPI_HYDRA_RMK", "mslaunch finds Slurm, PBS, Grid Engine and LSF allocations by itself"),
    ("MPIEXEC_PREFIX_STDOUT", "use -l or --tag-output to prefix lines"),
    ("MPIEXEC_PREFIX_STDERR", "use -l or --tag-output to prefix lines"),
)


def _perhost(word: str) -> Optional[int]:
    if word.strip().lower() in ("all", "allcores", ""):
        return None        # a rank per slot (core), mslaunch's default
    return check_int("I_MPI_PERHOST (environment)", word.strip())


def port_range(var: str, text: str) -> Optional[Tuple[int, int]]:
    """``LOW:HIGH`` of ``var``, the ports mslaunch may listen on; None for ``0:0``
    (Hydra's "any port").  UsageError for anything else, as Hydra refuses to start."""
    low_text, colon, high_text = text.strip().partition(":")
    low_text, high_text = low_text.strip(), high_text.strip()
    if colon and low_text.isdigit() and high_text.isdigit() and low_text.isascii() \
            and high_text.isascii():
        low, high = int(low_text), int(high_text)
        if low == high == 0:
            return None
        if 1 <= low <= high <= 65535:
            return low, high
    raise UsageError(f"{var} (environment): expected LOW:HIGH, two ports with "
                     f"1 <= LOW <= HIGH <= 65535, got {one_line(text, 40)!r}")


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
    for var in PORT_RANGE_VARS:
        if var in env:
            d.port_range = port_range(var, env[var])
            break
    for var, why in NO_EFFECT:
        if env.get(var):
            d.notes.append(f"{var} (environment) has no effect here: {why}")
