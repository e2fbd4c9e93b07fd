"""Which rsh agent reaches the remote hosts: Hydra's flags and variables, Open MPI's MCA.

Hydra runs ``EXEC [EXTRA ARGS] HOST command`` for ``-launcher ssh|rsh``:
``-launcher-exec``/``-bootstrap-exec`` (and ``HYDRA_LAUNCHER_EXEC``,
``HYDRA_BOOTSTRAP_EXEC``, Intel's ``I_MPI_HYDRA_BOOTSTRAP_EXEC``) name the
program, ``-bootstrap-exec-args``, ``HYDRA_LAUNCHER_EXTRA_ARGS`` (the
``HYDRA_LAUNCH_EXTRA_ARGS`` spelling of MPICH's documentation and of the
MPI Operator too) and ``I_MPI_HYDRA_BOOTSTRAP_EXEC_EXTRA_ARGS`` its
arguments; ``-launcher rsh`` alone means ``rsh``.  ``HYDRA_LAUNCHER``,
``HYDRA_BOOTSTRAP`` and ``I_MPI_HYDRA_BOOTSTRAP`` choose the launcher as
``-launcher`` does.  Open MPI's ``plm_rsh_agent`` and ``plm_rsh_args``
(from any MCA source, read in :mod:`.mca`) do the same.  Extra arguments alone mean
the OpenSSH client with them, as in both.  Nothing set: paramiko.
The command line wins over the environment.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Sequence, Tuple

    from ..core.states import LauncherName
    from .draft import Draft

_EXEC_VARS = ("HYDRA_LAUNCHER_EXEC", "HYDRA_BOOTSTRAP_EXEC", "I_MPI_HYDRA_BOOTSTRAP_EXEC")
_ARGS_VARS = ("HYDRA_LAUNCHER_EXTRA_ARGS", "HYDRA_LAUNCH_EXTRA_ARGS",
              "I_MPI_HYDRA_BOOTSTRAP_EXEC_EXTRA_ARGS")
_LAUNCHER_VARS = ("HYDRA_LAUNCHER", "HYDRA_BOOTSTRAP", "I_MPI_HYDRA_BOOTSTRAP")


def set_exec(d: Draft, flag: str, values: Sequence[str]) -> None:
    from ..core.errors import UsageError
    if not values[0].strip():
        raise UsageError(f"{flag}: empty command")
    d.rsh_exec = values[0]


def set_exec_args(d: Draft, flag: str, values: Sequence[str]) -> None:
    d.rsh_exec_args = values[0]


def _first(environ, names: Sequence[str]) -> str:
    for name in names:
        if environ.get(name, "").strip():
            return environ[name]
    return ""


def rsh_settings(d: Draft) -> Tuple[LauncherName, str, str]:
    """(launcher, rsh agent, rsh args) of the finished draft."""
    from .draft import set_launcher
    env = d.environ
    if d.launcher_word is None:
        for name in _LAUNCHER_VARS:
            if env.get(name, "").strip():
                set_launcher(d, name, env[name].strip())
                d.launcher_word = env[name].strip()
                break
    # d.rsh_agent and d.rsh_args: plm_rsh_agent/args from every MCA source (mca.py).
    agent = d.rsh_exec or d.rsh_agent or _first(env, _EXEC_VARS)
    args = d.rsh_exec_args or d.rsh_args or _first(env, _ARGS_VARS)
    if not agent and d.launcher_word == "rsh":
        agent = "rsh"
    return d.launcher, agent, args
