"""Output relay throughput: 4 ranks each write 256 MiB to stdout as fast as they can.

Each rank is a small Python program that writes one preallocated 1 MiB block
of 100-byte text lines in a loop with ``os.write`` (C speed; the writer costs
almost nothing).  The launcher's stdout is a pipe that the harness drains and
counts; its stderr is drained too.  Contenders:

- ``Popen floor``: ranks write straight into the harness's pipe (no relay).
- ``pty floor``: each rank writes to a pseudo-terminal of its own, copied to
  the harness's pipe by a bare loop (``bench/pty_floor.py``): the kernel's
  cost of a terminal, which bounds every relay that gives ranks one.
- ``mslaunch`` (its stdout a pipe; each rank's stdout a pseudo-terminal,
  the default), ``mslaunch --output-filename DIR`` (per-rank files *and* the
  terminal copy), ``mslaunch --output-filename DIR:nocopy`` (files only);
  the same three with ``--no-pty`` (ranks write to pipes, as under Hydra).
- ``Hydra mpiexec`` (pipe) and ``-outfile-pattern DIR/out.%r`` (files only).
- ``Open MPI mpirun`` (pipe) and ``--output-filename DIR/out`` (Open MPI
  5.0.11 treats the value as a file prefix, ``out.<jobid>.<rank>.out``, and
  does not copy to the terminal).

Files go to a fresh temporary directory per run, deleted afterwards.  Every
run is checked: bytes on the pipe and bytes in the files must equal what the
ranks wrote (or 0 where nothing is expected).  Reported: MiB/s of total
bytes over the whole command's wall time (start-up included; small at the
default size), median and best; "net" MiB/s, which first subtracts the median
wall time of the same job writing 0 MiB (run in the same rounds); ratios.

    python bench/relay_throughput.py [--mb 256] [--ranks 4] [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence

import _common as C

MIB = 1 << 20
WRITER = C.LINE_WRITER


@dataclass(frozen=True)
class Variant:
    """One row: a launcher and where its ranks' output goes."""

    launcher: C.Launcher
    files: Optional[Callable[[str], List[str]]] = None   # options sending output under DIR
    copies: bool = True                                  # bytes also reach the launcher's stdout

    @property
    def key(self) -> str:
        return self.launcher.key


def variants(launchers: Sequence[C.Launcher]) -> List[Variant]:
    out: List[Variant] = []
    for l in launchers:
        out.append(Variant(l))
        if l.kind == "mslaunch":
            out.append(Variant(l.variant("mslaunch-files", "mslaunch --output-filename DIR"),
                               lambda d: ["--output-filename", d], copies=True))
            out.append(Variant(l.variant("mslaunch-nocopy", "mslaunch --output-filename DIR:nocopy"),
                               lambda d: ["--output-filename", d + ":nocopy"], copies=False))
            if "--no-pty" not in l.args:
                plain = l.variant("mslaunch-nopty", "mslaunch --no-pty", ["--no-pty"])
                out.append(Variant(plain))
                out.append(Variant(plain.variant("mslaunch-nopty-files",
                                                 "mslaunch --no-pty --output-filename DIR"),
                                   lambda d: ["--output-filename", d], copies=True))
                out.append(Variant(plain.variant("mslaunch-nopty-nocopy",
                                                 "mslaunch --no-pty --output-filename DIR:nocopy"),
                                   lambda d: ["--output-filename", d + ":nocopy"], copies=False))
        elif l.kind == "hydra":
            out.append(Variant(l.variant("hydra-files", "Hydra -outfile-pattern DIR/out.%r"),
                               lambda d: ["-outfile-pattern", os.path.join(d, "out.%r")],
                               copies=False))
        elif l.kind == "floor":
            out.append(Variant(C.Launcher("floor-pty", "pty floor (bench/pty_floor.py)", "floor",
                                          (sys.executable, str(C.BENCH_DIR / "pty_floor.py")))))
        elif l.kind == "openmpi":
            out.append(Variant(l.variant("openmpi-files", "Open MPI --output-filename DIR/out"),
                               lambda d: ["--output-filename", os.path.join(d, "out")],
                               copies=False))
    return out


def tree_bytes(root: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(root) for f in fs)


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    C.add_launcher_args(parser, runs=3)
    parser.add_argument("--mb", type=int, default=256, help="MiB written by each rank (default 256)")
    parser.add_argument("--ranks", type=int, default=4, help="number of ranks (default 4)")
    parser.add_argument("--tmpdir", default=None, help="where the per-run output directories go")
    args = parser.parse_args(argv)
    warmups = 1 if args.warmups is None else args.warmups
    launchers = C.launchers_from_args(args)
    rows = variants(launchers)
    by_key: Dict[str, Variant] = {v.key: v for v in rows}
    base = C.base_environ()
    total = args.ranks * args.mb * MIB
    case = f"-n {args.ranks}, {args.mb} MiB each"
    empty = f"-n {args.ranks}, 0 MiB (start-up only)"
    sizes = {case: args.mb, empty: 0}

    def execute(which: str, key: str) -> C.Outcome:
        v = by_key[key]
        program = [sys.executable, "-c", WRITER, str(sizes[which])]
        expect = args.ranks * sizes[which] * MIB
        tmp = tempfile.mkdtemp(prefix="mslaunch-bench-", dir=args.tmpdir) if v.files else None
        try:
            extra = v.files(tmp) if v.files and tmp else []
            res = C.run_once(v.launcher.argv(args.ranks, program, extra),
                             v.launcher.environ(base), timeout=args.timeout)
            in_files = tree_bytes(tmp) if tmp else 0
        finally:
            if tmp:
                shutil.rmtree(tmp, ignore_errors=True)
        want_pipe = expect if v.copies else 0
        want_files = expect if v.files else 0
        ok = res.stdout_bytes == want_pipe and in_files == want_files
        info: Dict[str, object] = {"ok": ok, "pipe": res.stdout_bytes, "files": in_files,
                                   "want_pipe": want_pipe, "want_files": want_files}
        return C.Outcome(res.seconds, res.failure(), info)

    results = C.run_rounds([case, empty], list(by_key), args.runs, warmups, execute, quiet=args.quiet)

    def rate(seconds: Optional[float]) -> Optional[float]:
        return None if not seconds else total / MIB / seconds

    def check(s: C.Samples) -> str:
        if s.error is not None:
            return "FAIL"
        bad = [i for i in s.infos if not i["ok"]]
        if not bad:
            return f"ok ({len(s.infos)}/{len(s.infos)})"
        i = bad[0]
        return (f"BAD {len(bad)}/{len(s.infos)}: pipe {i['pipe']} (want {i['want_pipe']}), "
                f"files {i['files']} (want {i['want_files']})")

    floor = results[(case, "floor")].median() if "floor" in by_key else None
    table = []
    for v in rows:
        s = results[(case, v.key)]
        wall, base_s = s.median(), results[(empty, v.key)].median()
        med, best = rate(wall), rate(s.minimum())
        net = rate(wall - base_s) if wall is not None and base_s is not None and wall > base_s else None
        table.append([v.launcher.label,
                      "FAIL" if s.error else (f"{med:.0f}" if med else "–"),
                      f"{best:.0f}" if best else "–",
                      f"{net:.0f}" if net else "–",
                      f"{wall:.2f}" if wall is not None else "–",
                      f"{base_s * 1e3:.0f}" if base_s is not None else "FAIL",
                      check(s) if results[(empty, v.key)].error is None else check(s) + "; 0 MiB run FAIL",
                      C.ratio(rate(s.median()), rate(floor))])
    print(f"### Output relay throughput ({case}, {total // MIB} MiB total)\n")
    print(C.environment_note(launchers, args.runs, warmups) + "\n")
    print(C.markdown_table(["launcher / mode", "MiB/s median", "MiB/s best",
                            "net MiB/s", "wall s median", "0 MiB wall ms",
                            "bytes check", "× floor"], table))
    print("\nMiB/s = total bytes / wall time of the whole command; net MiB/s = total bytes / "
          "(median wall − median wall of the same job writing 0 MiB).")
    pairs = [("mslaunch (pty) / Hydra, pipe", "mslaunch", "hydra"),
             ("mslaunch (pty) / pty floor", "mslaunch", "floor-pty"),
             ("mslaunch (pty) / Open MPI, pipe", "mslaunch", "openmpi"),
             ("mslaunch --no-pty / Hydra, pipe", "mslaunch-nopty", "hydra"),
             ("mslaunch --no-pty DIR:nocopy / Hydra files", "mslaunch-nopty-nocopy", "hydra-files"),
             ("mslaunch DIR:nocopy / Open MPI files", "mslaunch-nocopy", "openmpi-files"),
             ("mslaunch DIR (files + copy) / mslaunch pipe", "mslaunch-files", "mslaunch")]
    lines = [f"- {name}: {C.ratio(rate(results[(case, a)].median()), rate(results[(case, b)].median()))}"
             for name, a, b in pairs if a in by_key and b in by_key]
    if lines:
        print("\nThroughput ratios (higher is better for mslaunch):\n" + "\n".join(lines))
    notes = C.failures(results, {v.key: v.launcher.label for v in rows})
    if notes:
        print("\n" + notes)
    print()
    bad = any(i.get("ok") is False for s in results.values() for i in s.infos)
    return 1 if notes or bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
