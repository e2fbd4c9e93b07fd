"""Where the time of one launch goes, from the launcher's exec to its ranks'.

    python bench/timeline.py [--runs 15] [--ranks 1,4] [--ab COMMIT] [--hydra PATH]

Each run starts ``LAUNCHER -n N date +%s.%N``: every rank prints its own
clock as it starts.  mslaunch runs from a copy of this tree (and of
``COMMIT``'s, interleaved, with ``--ab``), compiled, through
``bench/_timeline.py``, which notes when its interpreter is up, when each of
its modules starts to be imported, when it forks (its watchdog) and when it
spawns each rank.  Each phase is measured from just before the launcher's
``Popen``; the table gives medians, in ms:

- ``interpreter``: Python and ``site`` up, before mslaunch's first import;
- ``guard fork``: the orphan guard's watchdog forked (its modules imported;
  for an mpirun-style line, before it is read);
- ``cgroup wait``: not a moment but a length, the time the launcher spent
  waiting for the watchdog's move of it into the job's cgroup (an RCU grace
  period) before its first spawn;
- ``first spawn`` / ``last spawn``: ``posix_spawn`` of the first and last
  rank; ``modules``: how many of mslaunch's were imported before the first;
- ``first rank``, ``last rank``: the ranks' own clocks, once exec'd;
- ``exit``: the launcher gone.

With ``--mpi`` each rank is instead an MPI program (``python -c``: mpi4py's
``Init``, ``allreduce(1)``, ``Finalize``), whose clocks go to a file of its
rank: ``first rank`` and ``last rank`` are the ranks' Python up (after its
own start and ``site``), then ``MPI_Init done`` and ``MPI_Finalize done``
for the last rank, and ``broken lines``, the runs in which a line the ranks
printed (one each, as an unbuffered ``print`` writes it: the text, then its
end) reached the launcher's stdout cut or merged with another; no floors
then.

``--installed CMD`` adds an installed mslaunch (a ``pip install``'s
command, say), seen as Hydra is.  Hydra's ``mpiexec`` runs the same line, interleaved (its ``first rank``,
``last rank``, ``exit``), and so do two floors of any launcher written in
Python (``bench/_spawn_floor.py``, run with ``python -S``): one that only
spawns its ranks, and one that first moves itself into a cgroup of its own,
as mslaunch's orphan guard does so that every process of the job starts
inside it (the move waits for the kernel).  Run it on a quiet machine, with the Python whose
site-packages the users' launcher would have.
"""

from __future__ import annotations

import argparse
import atexit
import os
import random
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common

PHASES = ("interpreter", "guard fork", "cgroup wait", "first spawn", "last spawn", "modules",
          "first rank", "last rank", "exit")
MPI_PHASES = PHASES[:-1] + ("MPI_Init done", "MPI_Finalize done", "exit", "broken lines")

#: The rank of ``--mpi``: its clocks (Python up, MPI_Init done, MPI_Finalize done)
#: into ``DIR/RANK``, and one line on stdout, written as ``print`` writes it
#: unbuffered (``PYTHONUNBUFFERED=1``, ``flush=True``): the text, then its end.
MPI_PROGRAM = """import os, sys, time
up = time.time()
from mpi4py import MPI
init = time.time()
MPI.COMM_WORLD.allreduce(1)
rank = MPI.COMM_WORLD.Get_rank()
MPI.Finalize()
done = time.time()
clocks = f"{up!r} {init!r} {done!r}"
with open(os.path.join(sys.argv[1], str(rank)), "w") as f:
    f.write(clocks)
os.write(1, f"rank {rank}: {clocks}".encode())
os.write(1, b"\\n")
"""


class Ranks:
    """What each rank runs, and how its clocks are read back after a run."""

    def __init__(self, mpi: bool) -> None:
        self.mpi = mpi
        self.dir = tempfile.mkdtemp(prefix="mslaunch-timeline-clocks-")
        atexit.register(shutil.rmtree, self.dir, True)
        self.argv = ([sys.executable, "-c", MPI_PROGRAM, self.dir] if mpi else
                     [shutil.which("date") or "/bin/date", "+%s.%N"])

    def clocks(self, stdout: bytes, ranks: int, start: float) -> Dict[str, float]:
        """The ranks' phases, in seconds after ``start``."""
        if not self.mpi:
            clocks = _clocks(stdout)
            return {"first rank": clocks[0] - start, "last rank": clocks[-1] - start}
        rows = []
        for name in os.listdir(self.dir):
            with open(os.path.join(self.dir, name)) as f:
                rows.append([float(x) for x in f.read().split()])
            os.unlink(os.path.join(self.dir, name))
        if len(rows) != ranks:
            raise SystemExit(f"{len(rows)} of {ranks} ranks wrote their clocks")
        lines = stdout.decode(errors="replace").splitlines()
        intact = len(lines) == ranks and all(
            line.startswith("rank ") and len(line.split()) == 5 for line in lines)
        return {"first rank": min(r[0] for r in rows) - start,
                "last rank": max(r[0] for r in rows) - start,
                "MPI_Init done": max(r[1] for r in rows) - start,
                "MPI_Finalize done": max(r[2] for r in rows) - start,
                "broken lines": 0.0 if intact else 1.0}


def _tree(commit: Optional[str]) -> Path:
    """A compiled copy of mslaunch: this working tree's, or ``commit``'s."""
    where = Path(tempfile.mkdtemp(prefix="mslaunch-timeline-"))
    atexit.register(shutil.rmtree, where, True)
    if commit is None:
        shutil.copytree(_common.REPO_ROOT / "mslaunch", where / "mslaunch",
                        ignore=shutil.ignore_patterns("__pycache__"))
    else:
        archive = subprocess.run(["git", "-C", str(_common.REPO_ROOT), "archive", commit,
                                  "mslaunch"], capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(where)], input=archive, check=True)
    subprocess.run([sys.executable, "-m", "compileall", "-q", "-f", str(where / "mslaunch")],
                   stdout=subprocess.DEVNULL, check=True)
    return where


def _clocks(stdout: bytes) -> List[float]:
    return sorted(float(x) for x in stdout.split() if x.replace(b".", b"").isdigit())


def _mslaunch(tree: Path, ranks: int, env: Dict[str, str], program: Ranks) -> Dict[str, float]:
    notes = tree / "notes"
    start = time.time()
    run = _common.run_once([sys.executable, str(_common.BENCH_DIR / "_timeline.py"), str(tree),
                            str(notes), "--oversubscribe", "-n", str(ranks), *program.argv],
                           env, keep_stdout=True, timeout=60)
    end = start + run.seconds
    if run.returncode != 0:
        raise SystemExit(f"mslaunch failed ({run.returncode}): {run.stderr.decode(errors='replace')}")
    said = [line.split(" ", 2) for line in notes.read_text().splitlines()]
    forks = [float(at) for at, what, _ in said if what == "fork"]
    waited = sum(float(ms) for at, what, ms in said if what == "wait") / 1000
    spawns = [float(at) for at, what, _ in said if what == "spawn"]
    first = spawns[0] if spawns else end
    steps = _steps([(float(at), f"{what} {detail}".strip()) for at, what, detail in said
                    if float(at) <= first and what != "wait"])
    return {**steps, "interpreter": float(said[0][0]) - start,
            "guard fork": (forks[0] if forks else end) - start, "cgroup wait": waited,
            "first spawn": first - start, "last spawn": (spawns[-1] if spawns else end) - start,
            "modules": sum(1 for at, what, _ in said if what == "import" and float(at) < first),
            **program.clocks(run.stdout, ranks, start), "exit": end - start}


def _steps(notes: List[tuple]) -> Dict[str, float]:
    """Each note's time until the next one, by its label (``step: import X``)."""
    steps: Dict[str, float] = {}
    for (at, label), (then, _) in zip(notes, notes[1:]):
        key = f"step: {label}"
        steps[key] = steps.get(key, 0.0) + then - at
    return steps


def _plain(prefix: Sequence[str], ranks: int, env: Dict[str, str],
           program: Ranks) -> Dict[str, float]:
    """A launcher seen from outside: its ranks' clocks and its exit."""
    start = time.time()
    run = _common.run_once([*prefix, "-n", str(ranks), *program.argv], env, keep_stdout=True,
                           timeout=60)
    if run.returncode != 0:
        raise SystemExit(f"{prefix[0]} failed ({run.returncode}): "
                         f"{run.stderr.decode(errors='replace')}")
    return {**program.clocks(run.stdout, ranks, start), "exit": run.seconds}


def _floor(how: str, ranks: int, env: Dict[str, str],
           program: Sequence[str]) -> Optional[Dict[str, float]]:
    start = time.time()
    run = _common.run_once([sys.executable, "-S", str(_common.BENCH_DIR / "_spawn_floor.py"), how,
                            str(ranks), *program], env, keep_stdout=True, timeout=60)
    if run.returncode == 3:
        return None                    # no cgroup of its own here
    if run.returncode != 0:
        raise SystemExit(f"the floor failed ({run.returncode}): "
                         f"{run.stderr.decode(errors='replace')}")
    clocks = _clocks(run.stdout)
    return {"first rank": clocks[0] - start, "last rank": clocks[-1] - start,
            "exit": run.seconds}


#: The floors' columns: what ``bench/_spawn_floor.py`` is asked to do.
FLOORS = {"Python floor": "plain", "Python floor, cgroup": "cgroup"}


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--warmups", type=int, default=2)
    parser.add_argument("--ranks", default="1,4", help="comma-separated rank counts")
    parser.add_argument("--ab", metavar="COMMIT", help="also mslaunch as of COMMIT")
    parser.add_argument("--steps", type=int, default=15, help="how many of the longest steps "
                                                              "to show")
    parser.add_argument("--hydra", metavar="PATH", help="Hydra's mpiexec (default: the mpich "
                                                       "wheel's)")
    parser.add_argument("--mpi", action="store_true",
                        help="ranks that run mpi4py's Init, allreduce and Finalize (no floors)")
    parser.add_argument("--installed", metavar="CMD", action="append", default=[],
                        help="also an installed mslaunch started as CMD, seen from outside "
                             "(its ranks' clocks and its exit); repeatable")
    args = parser.parse_args(argv)
    _common.MEASURE_TREE = False
    env = _common.base_environ()
    program = Ranks(args.mpi)
    trees = {"mslaunch": _tree(None)}
    if args.ab:
        trees[f"mslaunch@{args.ab[:12]}"] = _tree(args.ab)
    hydra = _common.find_hydra(args.hydra)
    installed = {f"installed {cmd}": [*shlex.split(cmd), "--oversubscribe"]
                 for cmd in args.installed}
    contenders = (list(trees) + list(installed) + (["Hydra"] if hydra is not None else [])
                  + ([] if args.mpi else list(FLOORS)))
    counts = [int(x) for x in args.ranks.split(",")]
    got: Dict[tuple, List[Dict[str, float]]] = {(n, c): [] for n in counts for c in contenders}
    shuffle = random.Random(4711).shuffle
    for round_ in range(args.warmups + args.runs):
        for n in counts:
            order = list(contenders)
            shuffle(order)
            for who in order:
                row: Optional[Dict[str, float]]
                if who == "Hydra":
                    assert hydra is not None
                    row = _plain(hydra.prefix, n, env, program)
                elif who in installed:
                    row = _plain(installed[who], n, env, program)
                elif who in FLOORS:
                    row = _floor(FLOORS[who], n, env, program.argv)
                else:
                    row = _mslaunch(trees[who], n, env, program)
                if round_ >= args.warmups and row is not None:
                    got[(n, who)].append(row)
        _common.log(f"round {round_ + 1} of {args.warmups + args.runs}")
    print(f"_{sys.version.split()[0]}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; "
          f"medians of {args.runs} interleaved runs, ms after the launcher's Popen_\n")
    for n in counts:
        rows = []
        for phase in MPI_PHASES if args.mpi else PHASES:
            cells = []
            for who in contenders:
                values = [r[phase] for r in got[(n, who)] if phase in r]
                if not values:
                    cells.append("")
                elif phase == "broken lines":
                    cells.append(f"{sum(values):.0f} of {len(values)}")
                elif phase == "modules":
                    cells.append(f"{statistics.median(values):.0f}")
                else:
                    cells.append(f"{statistics.median(values) * 1000:.1f}")
            rows.append([phase, *cells])
        print(f"**`-n {n} {'python -c MPI_PROGRAM' if args.mpi else 'date +%s.%N'}`**\n")
        print(_common.markdown_table(["phase", *contenders], rows))
        print()
    first = contenders[0]
    runs = got[(counts[0], first)]
    labels = {k for r in runs for k in r if k.startswith("step: ")}
    largest = sorted(((statistics.median([r.get(k, 0.0) for r in runs]), k) for k in labels),
                     reverse=True)[:args.steps]
    print(f"**{first}, `-n {counts[0]}`: the longest steps before the first spawn** (from a "
          f"note to the next: a module's import, with what ran after it)\n")
    print(_common.markdown_table(["step", "ms"], [[k[6:], f"{v * 1000:.1f}"]
                                                  for v, k in largest]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
