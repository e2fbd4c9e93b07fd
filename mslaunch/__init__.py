"""mslaunch: a fast, trustworthy launcher for MPI and distributed jobs.

From Python, :func:`run` runs a job as the ``mslaunch`` command does and
returns its exit status (see ``docs/reference/python-api.md``)::

    import mslaunch
    status = mslaunch.run(["-n", "2", "python", "train.py"])

The package is layered, its imports pointing down: records and errors
(``spec``, ``errors``, ``switches``, ``liblogs``); pure parsers and the pure
planner (``hosts``, ``plan``, ``procmap``, ``rankenv``, ``mcafile``); the
mechanisms of one machine (``machine``: loop, spawn, output, guard, local
ranks); services on them (``pmi``, the agent and its link in ``remote``,
the node service of ``msrun``); the starters (``remote.ssh``, ``remote.rsh``,
``remote.slurm``); the job's policy (``job``: launch, supervise, reports, Open
MPI mode); and the command-line dialects (``cli``) last.  Importing the
package imports none of them: :func:`run` does, when called.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Sequence

__version__ = "0.1.0"
__all__ = ["run", "__version__"]


def run(argv: Sequence[str]) -> int:
    """Run the job that ``mslaunch ARGV...`` would run; return its exit status.

    ``argv`` is the command line after the word ``mslaunch``, as a list
    (``["-n", "2", "python", "x.py"]``), in either dialect (mpirun's or
    msrun's).  The status is the command's: 0, the failing rank's code,
    128+N for a rank killed by signal N, 110 for ``--timeout``, 2 for a bad
    command line (its one error line is written to stderr), and so on.  The
    ranks' output goes to this process's descriptors 1 and 2, as the
    command's does.  Call it from the main thread: while the job runs,
    mslaunch handles SIGINT, SIGTERM and SIGHUP (stopping the ranks) and
    restores the previous handlers when it returns.  Nothing is exited:
    unlike the command, the interpreter goes on.
    """
    if isinstance(argv, (str, bytes)):
        raise TypeError("mslaunch.run() takes a list of words, e.g. ['-n', '2', 'prog'], "
                        "not a string")
    import threading
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("mslaunch.run() must be called from the main thread (it handles "
                           "the signals that stop a job)")
    from .cli import main
    return main([str(word) for word in argv])
