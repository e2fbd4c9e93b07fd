"""mslaunch: a fast, trustworthy launcher for MPI and distributed jobs.

From Python, :func:`run` runs a job as the ``mslaunch`` command does and
returns its exit status, and :func:`launch` calls a function on every rank
and returns what each returned (see ``docs/reference/python-api.md``)::

    import mslaunch
    status = mslaunch.run(["-n", "2", "python", "train.py"])
    values = mslaunch.launch(train, 0.1, nprocs=2)

The package is in rooms that follow a job's way, its imports pointing down:
records and errors (``core``); where the job may run and the pure planner
(``hosts``, ``plan``, ``rankenv``); the mechanisms of one machine
(``machine``: loop, spawn, output, guard, local ranks); the MPI services
(``mpi``: ``mpi.pmi``, ``mpi.pmix``); the link between the launcher and its agents
(``wire``); how a job's MPI is served across its hosts (``serve``); the
agent (``agent``); the ways ranks start (``backends``: this machine, agents
with their starters, srun steps, Open MPI's mpirun, one command per node);
looking inside a running job (``inspect``); running a job, its attempts and
its policy (``run``); msrun mode (``msrun``); and the command-line dialects
(``cli``) last (``docs/design.md`` draws it; ``tests/project/test_layers.py``
checks the order); the Python API's calls themselves are in ``api``.
Importing the package imports none of them: :func:`run` and :func:`launch` do,
when called.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, List, Sequence, Union

    from .api import RankFailed as RankFailed

__version__ = "0.2.0"
__all__ = ["run", "launch", "RankFailed", "__version__"]


def run(argv: Sequence[str]) -> int:
    """Run the job that ``mslaunch ARGV...`` would run; return its exit status.

    ``argv`` is the command line after the word ``mslaunch``, as a list
    (``["-n", "2", "python", "x.py"]``), in any dialect (mpirun's, msrun's or
    torchrun's).  The status is the command's: 0, the failing rank's code,
    128+N for a rank killed by signal N, 110 for ``--timeout``, 2 for a bad
    command line (its one error line is written to stderr), and so on.  The
    job runs in a child process, the ``mslaunch`` command itself, with this
    process's descriptors 0, 1 and 2, so nothing of it stays in this one
    (libraries such as the PMIx server keep process-wide state).  Called
    from the main thread, SIGTERM and SIGHUP sent to this process reach the
    job while it runs; a Ctrl-C at the terminal reaches it directly, and once
    the job has stopped ``KeyboardInterrupt`` is raised here, as
    ``subprocess.run`` does (a loop of jobs, a notebook's "Run All", stops).
    """
    from .api import run as run_words
    return run_words(argv)


def launch(fn: Callable[..., Any], *args: Any, nprocs: int = 1,
           hosts: Union[None, str, Sequence[str]] = None, max_restarts: int = 0,
           options: Sequence[str] = ()) -> List[Any]:
    """Call ``fn(*args)`` on each of ``nprocs`` ranks; their return values in rank order.

    The ranks are those of ``mslaunch -n NPROCS [-H HOSTS] [--max-restarts N]
    [OPTIONS...]``: this machine's, or ``hosts``' (``"h1:2,h2:2"`` or a list),
    each with every ecosystem's rank variables (``RANK``, ``WORLD_SIZE``,
    ``LOCAL_RANK``...); ``options`` are more of the command's words
    (``["--bind-to", "core"]``).  ``fn`` is found by its module and name on
    every rank (a function of the script run is found by running the script
    as ``__mp_main__``, as multiprocessing's spawn does; a notebook's is sent
    by value with cloudpickle, if installed).  ``args`` and the return values
    are pickled.  The ranks' output goes to this process's ``sys.stdout`` and
    ``sys.stderr``.  When the job fails, the first failure is raised: the
    rank's own exception, its cause a :class:`RankFailed` with the rank, the
    host and the exit status; a rank that raised nothing (killed, exited,
    lost with its host) raises :class:`RankFailed` itself.  Signals and
    Ctrl-C as for :func:`run`.
    """
    from .api import launch as launch_function
    return launch_function(fn, args, nprocs=nprocs, hosts=hosts, max_restarts=max_restarts,
                           options=options)


def __getattr__(name: str) -> Any:
    if name == "RankFailed":
        from .api import RankFailed
        return RankFailed
    raise AttributeError(f"module 'mslaunch' has no attribute {name!r}")
