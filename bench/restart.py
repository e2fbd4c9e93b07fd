"""Restart time: from a rank's death to every rank of the job running again.

One program for every contender (no MPI, so that torchrun runs it too): each
rank writes the time it started (``time.time()``) into ``DIR/start.A.R``, A
being the attempt (``TORCHELASTIC_RESTART_COUNT``, which both launchers set);
in attempt 0, rank 1 writes ``DIR/fault`` with the time and SIGKILLs itself
0.5 s after the ranks started, the others sleep until stopped; in attempt 1
every rank exits 0.  The restart time is the latest start of attempt 1 less
the fault's time: stopping the others, cleaning up, starting again (and,
remotely, starting the agents again).  Every host is this machine (the SSH
test bed's hosts share its clock).

Contenders, interleaved round by round:

- mslaunch ``--max-restarts 1 -n 4`` (4 local ranks);
- ``torchrun --max-restarts 1 --nproc-per-node 4 --standalone`` (4 local ranks);
- mslaunch ``--max-restarts 1 -H h1:2,h2:2 -n 4`` on the SSH test bed
  (``tests/support/sshbed.py``), and ``-H h1..h16`` at one rank per host, with
  ``--remote`` (needs root for the bed's network namespaces).

Also the launcher's CPU seconds of the whole run (``wait4``: itself and what
it reaped).

    python bench/restart.py [--runs 5] [--remote]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
from typing import Dict, List, Optional, Sequence, Tuple

import _common as C

sys.path.insert(0, str(C.REPO_ROOT / "tests" / "support"))

PROGRAM = """
import os, signal, sys, time
out = sys.argv[1]
attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
rank = os.environ["RANK"]
with open(os.path.join(out, f"start.{attempt}.{rank}"), "w") as f:
    f.write(repr(time.time()))
if attempt == "0":
    time.sleep(0.5)
    if rank == "1":
        with open(os.path.join(out, "fault"), "w") as f:
            f.write(repr(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)
"""


def measure(argv: Sequence[str], out: str, env: Dict[str, str],
            ranks: int) -> Tuple[Optional[float], float, str]:
    """(restart seconds or None, launcher CPU seconds, a problem or "")."""
    for name in os.listdir(out):
        os.unlink(os.path.join(out, name))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = subprocess.run([*argv, out], env=env, capture_output=True, timeout=300)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    try:
        with open(os.path.join(out, "fault")) as f:
            fault = float(f.read())
        starts = []
        for rank in range(ranks):
            with open(os.path.join(out, f"start.1.{rank}")) as f:
                starts.append(float(f.read()))
    except (OSError, ValueError) as err:
        return None, cpu, f"exit {r.returncode}: {err}: {r.stderr.decode()[-300:]}"
    if r.returncode != 0:
        return None, cpu, f"exit {r.returncode}: {r.stderr.decode()[-300:]}"
    return max(starts) - fault, cpu, ""


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--remote", action="store_true",
                        help="also 2+2 and 16 hosts of the SSH test bed (root)")
    args = parser.parse_args(argv)
    work = tempfile.mkdtemp(prefix="mslaunch-bench-restart-")
    program = os.path.join(work, "program.py")
    with open(program, "w") as f:
        f.write(PROGRAM)
    out = os.path.join(work, "out")
    os.mkdir(out)
    env = C.base_environ()
    py = sys.executable
    mslaunch = [py, "-m", "mslaunch", "--max-restarts", "1"]
    cases: List[Tuple[str, List[str], Dict[str, str], int]] = [
        ("mslaunch, 4 local ranks", [*mslaunch, "-n", "4", py, program], env, 4)]
    torchrun = shutil.which("torchrun", path=os.path.dirname(py)) or shutil.which("torchrun")
    if torchrun:
        cases.append(("torchrun, 4 local ranks",
                      [torchrun, "--max-restarts", "1", "--nproc-per-node", "4", "--standalone",
                       program], env, 4))
    beds = {}
    try:
        if args.remote:
            from remote import start_beds
            beds = start_beds([4, 16], work)
            for n, hosts, ranks in ((4, "h1:2,h2:2", 4),
                                    (16, ",".join(f"h{i}:1" for i in range(1, 17)), 16)):
                renv = dict(env, HOME=beds[n].home)
                cases.append((f"mslaunch, {hosts.count(',') + 1} SSH hosts, {ranks} ranks",
                              [*mslaunch, "-H", hosts, "-n", str(ranks), py, program],
                              renv, ranks))
        samples: Dict[str, List[Tuple[float, float]]] = {c[0]: [] for c in cases}
        problems: Dict[str, str] = {}
        for run in range(args.runs):
            for label, command, case_env, ranks in cases:
                took, cpu, problem = measure(command, out, case_env, ranks)
                if problem:
                    problems[label] = problem
                elif took is not None:
                    samples[label].append((took, cpu))
                C.log(f"run {run + 1} {label}: {C.ms(took)} ms, CPU {cpu:.2f} s")
    finally:
        if beds:
            from remote import stop_beds
            stop_beds(beds)
        shutil.rmtree(work, ignore_errors=True)
    rows = []
    for label, got in samples.items():
        if not got:
            rows.append([label, "failed", "", problems.get(label, "")[:80]])
            continue
        times = sorted(t for t, _ in got)
        rows.append([label, f"{statistics.median(times) * 1000:.0f} ({times[0] * 1000:.0f})",
                     f"{statistics.median(c for _, c in got):.2f}", str(len(got))])
    print(C.markdown_table(["case", "restart ms, median (min)", "launcher CPU s", "runs"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
