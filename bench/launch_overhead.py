"""Launch overhead: wall time of trivial jobs under each launcher.

Cases (as in reference/mpirun.md §7): ``-n 1 true``, ``-n 4 true``,
``-n 16 true`` and ``-n 4 python -c pass`` (``python`` is ``sys.executable``,
the interpreter that also runs mslaunch and the floor).  Contenders:
mslaunch (its default ``--mpi pmi`` mode unless ``--mslaunch-args`` says
otherwise), Hydra ``mpiexec``, Open MPI 5 ``mpirun`` (``--oversubscribe``,
plus ``--allow-run-as-root`` as root) and the ``bench/floor.py`` Popen floor.

Prints two markdown tables, wall time (median (min) ms) and CPU time (the
launcher's and its children's, median ms: what a busy machine disturbs far
less), each with the ratios mslaunch/floor, mslaunch/Hydra and mslaunch/Open
MPI of the medians.  ``--ab COMMIT`` adds mslaunch as of that commit,
interleaved, and the ratio of this tree to it.

    python bench/launch_overhead.py [--runs 15] [--warmups 2] [--ab COMMIT]
"""

from __future__ import annotations

import argparse
import shutil
import sys
from typing import Dict, List, Sequence, Tuple

import _common as C

TRUE = shutil.which("true") or "/bin/true"
CASES: List[Tuple[str, int, List[str]]] = [
    ("-n 1 true", 1, [TRUE]),
    ("-n 4 true", 4, [TRUE]),
    ("-n 16 true", 16, [TRUE]),
    ("-n 4 python -c pass", 4, [sys.executable, "-c", "pass"]),   # --python-ranks N,N
]
RATIOS = [("mslaunch / floor", "mslaunch", "floor"),
          ("mslaunch@ / floor", C.AB, "floor"),
          ("mslaunch / mslaunch@", "mslaunch", C.AB),
          ("mslaunch / Hydra", "mslaunch", "hydra"),
          ("mslaunch / Open MPI", "mslaunch", "openmpi")]


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    C.add_launcher_args(parser, runs=15)
    parser.add_argument("--python-ranks", default="4", metavar="N,N",
                        help="rank counts of the `python -c pass` cases (default 4)")
    args = parser.parse_args(argv)
    warmups = 2 if args.warmups is None else args.warmups
    launchers = C.launchers_from_args(args)
    by_key: Dict[str, C.Launcher] = {l.key: l for l in launchers}
    cases = {label: (n, prog) for label, n, prog in CASES if "python" not in label}
    for n in (int(x) for x in args.python_ranks.split(",") if x.strip()):
        cases[f"-n {n} python -c pass"] = (n, [sys.executable, "-c", "pass"])
    base = C.base_environ()

    def execute(case: str, key: str) -> C.Outcome:
        n, prog = cases[case]
        launcher = by_key[key]
        res = C.run_once(launcher.argv(n, prog), launcher.environ(base), timeout=args.timeout)
        return C.Outcome(res.seconds, res.failure(), cpu=res.cpu)

    results = C.run_rounds(list(cases), list(by_key), args.runs, warmups, execute,
                           quiet=args.quiet)
    print("### Launch overhead (wall ms, median (min))\n")
    print(C.environment_note(launchers, args.runs, warmups) + "\n")
    print(C.time_table([(c, f"`{c}`") for c in cases], launchers, results, RATIOS))
    print("\n### Launch overhead (CPU ms of the launcher and its children, median)\n")
    print(C.cpu_table([(c, f"`{c}`") for c in cases], launchers, results, RATIOS))
    reps = max(3, args.runs)
    alone = C.direct_median([sys.executable, "-c", "pass"], base, reps)
    bare = C.direct_median([sys.executable, "-S", "-c", "pass"], base, reps)
    print(f"\nReference, no launcher (median of {reps}): `python -c pass` {C.ms(alone)} ms, "
          f"`python -S -c pass` {C.ms(bare)} ms (the difference is site-packages start-up).")
    notes = C.failures(results, {l.key: l.label for l in launchers})
    if notes:
        print("\n" + notes)
    print()
    return 1 if notes else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
