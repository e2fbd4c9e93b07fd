"""mslaunch: a fast, trustworthy launcher for MPI and distributed jobs.

From Python, :func:`run` runs a job as the ``mslaunch`` command does and
returns its exit status (see ``docs/reference/python-api.md``)::

    import mslaunch
    status = mslaunch.run(["-n", "2", "python", "train.py"])

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
checks the order).  Importing the package imports none of them: :func:`run`
does, when called.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    import subprocess
    from typing import Sequence

__version__ = "0.2.0"
__all__ = ["run", "__version__"]


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
    if isinstance(argv, (str, bytes)):
        raise TypeError("mslaunch.run() takes a list of words, e.g. ['-n', '2', 'prog'], "
                        "not a string")
    import subprocess
    import sys
    words = [str(word) for word in argv]
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass
    import os
    # This package, wherever the caller found it (its sys.path may name a directory
    # that PYTHONPATH does not); the ranks' own environment is left as it is.
    where = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    start = ("import sys; sys.argv[0] = 'mslaunch'; sys.path.insert(0, sys.argv.pop(1)); "
             "from mslaunch.__main__ import main; main()")
    child = subprocess.Popen([sys.executable, "-c", start, where, *words], close_fds=True)
    return _wait(child)


def _wait(child: subprocess.Popen[bytes]) -> int:
    """The job's exit status, passing on SIGTERM and SIGHUP meanwhile (main thread
    only: elsewhere handlers cannot be set); KeyboardInterrupt once the job
    stopped, if SIGINT came meanwhile."""
    import signal
    import threading
    previous = {}
    interrupted = []
    if threading.current_thread() is threading.main_thread():
        def forward(signum: int, frame: object) -> None:
            if signum != signal.SIGINT:     # Ctrl-C reached the job's process group too
                child.send_signal(signum)
            else:
                interrupted.append(signum)
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            previous[signum] = signal.signal(signum, forward)
    try:
        code = child.wait()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if interrupted:
        raise KeyboardInterrupt
    return 128 - code if code < 0 else code
