"""Rank wrapper: export every ecosystem's rank variables, then run the program.

    python -m mslaunch.rankenv [--mpi4py] program [args...]
    python -m mslaunch.rankenv [--mpi4py] script.py [args...]
    python -m mslaunch.rankenv [--mpi4py] -m module [args...]
    python -m mslaunch.rankenv [--mpi4py] -c code [args...]

Under any outer launcher (Open MPI's ``mpirun``, Hydra's ``mpiexec``,
``srun``) it derives rank, size, local rank and local size from the
launcher's variables (``OMPI_COMM_WORLD_*``, then ``PMI_RANK``/``PMI_SIZE``,
then ``SLURM_*``) without initialising MPI.  When none are present, or with
``--mpi4py``, it asks mpi4py's ``COMM_WORLD`` (and a shared-memory split for
the local values).  It then sets ``RANK_ID``, ``RANK_SIZE``, ``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE`` and the
``OMPI_COMM_WORLD_*`` names that are missing.

Python targets (a ``.py`` script, ``-m``, ``-c``) run in this interpreter, so
an MPI initialised here is the one the program sees; other programs are
exec'ed with the new environment (which needs the launcher's variables).

On the host named by ``MSLAUNCH_WAS_HOST``, the variables ``MSLAUNCH_WAS_NAME``
name (and those ``MSLAUNCH_WAS_UNSET`` lists) are put back first: Open MPI's
mpirun puts its own installation first in ``PATH`` and ``LD_LIBRARY_PATH``, and
a program of another Open MPI would load that library in place of its own
(see :mod:`mslaunch.backends.mpirun.ompiargs`).
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Mapping, MutableMapping, Optional, Tuple

USAGE = "usage: python -m mslaunch.rankenv [--mpi4py] (program | script.py | -m module | -c code) [args...]"


class RankEnvError(Exception):
    """The rank could not be determined, or the program cannot run."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code    # 2: usage; 127: the program cannot be run


def _ints(environ: Mapping[str, str], *names: str) -> Optional[List[int]]:
    """The values of ``names`` as (index, count) pairs that make sense, or None."""
    try:
        values = [int(environ[n]) for n in names]
    except (KeyError, ValueError):
        return None
    if any(v < 0 for v in values) or (len(values) == 2 and values[0] >= values[1]):
        return None
    return values


def _slurm_local_size(environ: Mapping[str, str]) -> Optional[int]:
    """Tasks on this node from SLURM_STEP_TASKS_PER_NODE and SLURM_NODEID."""
    spec = environ.get("SLURM_STEP_TASKS_PER_NODE") or environ.get("SLURM_TASKS_PER_NODE")
    node = _ints(environ, "SLURM_NODEID")
    if not spec or node is None:
        return None
    from .hosts.allocations.slurm import expand_tasks_per_node
    try:
        counts = expand_tasks_per_node(spec)
    except Exception:
        return None
    return counts[node[0]] if node[0] < len(counts) else None


def from_environment(environ: Mapping[str, str]) -> Optional[Tuple[str, int, int, int, int]]:
    """(source, rank, size, local rank, local size) from launcher variables, or None."""
    for source, world, node in (
            ("Open MPI", ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
             ("OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE")),
            ("PMI", ("PMI_RANK", "PMI_SIZE"), ("MPI_LOCALRANKID", "MPI_LOCALNRANKS"))):
        found = _ints(environ, *world)
        if found:
            local_rank, local_size = _ints(environ, *node) or (0, 1)
            return source, found[0], found[1], local_rank, local_size
    found = _ints(environ, "SLURM_PROCID", "SLURM_NTASKS")
    if found:
        local = _ints(environ, "SLURM_LOCALID")
        local_rank = local[0] if local else 0
        return ("Slurm", found[0], found[1], local_rank,
                max(_slurm_local_size(environ) or 1, local_rank + 1))
    return None


def from_mpi4py() -> Tuple[str, int, int, int, int]:
    """(source, rank, size, local rank, local size) from mpi4py's COMM_WORLD."""
    try:
        from mpi4py import MPI
    except ImportError as err:
        raise RankEnvError(f"no launcher variables and mpi4py cannot be imported: {err}") \
            from None
    world = MPI.COMM_WORLD
    node = world.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return "mpi4py", world.Get_rank(), world.Get_size(), node.Get_rank(), node.Get_size()
    finally:
        node.Free()


def rank_variables(rank: int, size: int, local_rank: int, local_size: int,
                   environ: Mapping[str, str]) -> Dict[str, str]:
    """The variables to export for one rank."""
    values = {"RANK_ID": rank, "RANK_SIZE": size, "RANK": rank, "WORLD_SIZE": size,
              "LOCAL_RANK": local_rank, "LOCAL_WORLD_SIZE": local_size}
    for name, value in (("OMPI_COMM_WORLD_RANK", rank), ("OMPI_COMM_WORLD_SIZE", size),
                        ("OMPI_COMM_WORLD_LOCAL_RANK", local_rank),
                        ("OMPI_COMM_WORLD_LOCAL_SIZE", local_size)):
        if name not in environ:
            values[name] = value
    return {k: str(v) for k, v in values.items()}


#: What Open MPI's mpirun changes in a rank's environment that is put back.
RESTORED = ("PATH", "LD_LIBRARY_PATH", "OPAL_PREFIX")


def restore_user_env(environ: Dict[str, str]) -> None:
    """Put back what mpirun changed, as ``MSLAUNCH_WAS_*`` says (module docstring);
    the ``MSLAUNCH_WAS_*`` variables themselves go."""
    here = environ.get("MSLAUNCH_WAS_HOST") == os.uname().nodename
    unset = environ.get("MSLAUNCH_WAS_UNSET", "").split(":")
    for name in [n for n in environ if n.startswith("MSLAUNCH_WAS_")]:
        value = environ.pop(name)
        target = name[len("MSLAUNCH_WAS_"):]
        if here and target in RESTORED:
            environ[target] = value
    for target in unset if here else ():
        if target in RESTORED:
            environ.pop(target, None)


def name_the_program(environ: MutableMapping[str, str], target: str, args: List[str]) -> None:
    """Open MPI's ``OMPI_COMMAND`` and ``OMPI_ARGV`` (``MPI_INFO_ENV``'s "command"
    and "argv") name the program, as under Open MPI's own mpirun, where they
    named this wrapper (its interpreter, ``-m mslaunch.rankenv``)."""
    if "OMPI_COMMAND" in environ and \
            environ.get("OMPI_ARGV", "").startswith("-m mslaunch.rankenv"):
        environ["OMPI_COMMAND"] = os.path.basename(target)
        environ["OMPI_ARGV"] = " ".join(args)


def _run_python(kind: str, target: str, args: List[str]) -> None:
    import runpy
    if kind == "-c":
        sys.argv = ["-c", *args]
        sys.path[0] = ""
        exec(compile(target, "<string>", "exec"), {"__name__": "__main__"})
    elif kind == "-m":
        sys.argv = [target, *args]
        sys.path[0] = os.getcwd()
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        sys.argv = [target, *args]
        sys.path[0] = os.path.dirname(os.path.abspath(target))
        runpy.run_path(target, run_name="__main__")


def _start_with_library_path(argv: List[str], started_with: Optional[str]) -> None:
    """Run this wrapper again (``argv``) if ``LD_LIBRARY_PATH`` is no longer what it
    ``started_with``: the dynamic loader read that one, mpirun's, when this
    interpreter started, and a Python program runs in it.  The second run has
    nothing to put back, so it goes on."""
    if os.environ.get("LD_LIBRARY_PATH") == started_with or not sys.executable:
        return
    try:
        os.execv(sys.executable, [sys.executable, "-m", "mslaunch.rankenv", *argv])
    except OSError:
        pass            # it runs here, on mpirun's library path


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    given = list(argv)
    library_path = os.environ.get("LD_LIBRARY_PATH")
    use_mpi4py = False
    while argv and argv[0] in ("--mpi4py", "--"):
        use_mpi4py = use_mpi4py or argv[0] == "--mpi4py"
        argv.pop(0)
    try:
        if not argv or (argv[0] in ("-m", "-c") and len(argv) < 2):
            raise RankEnvError(USAGE)
        if argv[0] in ("-m", "-c"):
            kind, target, args = argv[0], argv[1], argv[2:]
        elif argv[0].endswith(".py"):
            kind, target, args = "script", argv[0], argv[1:]
        else:
            kind, target, args = "exec", argv[0], argv[1:]
        found = None if use_mpi4py else from_environment(os.environ)
        use_mpi4py = found is None          # (MPI is then initialised here)
        if found is None:
            if kind == "exec":
                raise RankEnvError(f"cannot tell the rank of {target!r}: no OMPI_*, PMI_* or "
                                   f"SLURM_* variables, and mpi4py can only serve Python "
                                   f"programs run in this interpreter")
            found = from_mpi4py()
        _, rank, size, local_rank, local_size = found
        os.environ.update(rank_variables(rank, size, local_rank, local_size, os.environ))
        restore_user_env(os.environ)        # type: ignore[arg-type]
        if kind in ("exec", "script"):
            name_the_program(os.environ, target, args)
        if kind != "exec" and not use_mpi4py:
            _start_with_library_path(given, library_path)
        if kind == "exec":
            try:
                os.execvp(target, [target, *args])
            except OSError as err:
                raise RankEnvError(f"cannot run {target!r}: {err.strerror}", 127) from None
        if kind == "script" and not os.path.isfile(target):
            raise RankEnvError(f"cannot run {target!r}: no such file", 127)
        _run_python(kind, target, args)
    except RankEnvError as err:
        sys.stderr.write(f"mslaunch.rankenv: error: {err}\n")
        return err.code
    return 0


if __name__ == "__main__":
    sys.exit(main())
