"""msrun mode: spawn-to-exit, node formation, and failure-to-exit.

Cases (medians of ``--runs`` rounds):

1. Spawn-to-exit of a trivial job (the task script is ``pass``; no
   MindSpore) with 2 and 8 workers on this machine:
   ``mslaunch --worker_num=N --local_worker_num=N --master_port=P
   --log_dir=D --join=True task.py`` -- the scheduler plus N workers.
   Beside it the Python floor (``bench/floor.py`` starting the same N+1
   interpreters) and, when an ``msrun`` is on PATH (MindSpore installed),
   the real msrun with the same command line.
2. Node formation: H nodes (2, 4, 8) of the network-namespace test bed of
   ``tests/support/netbed.py`` (one namespace per node, each with its own address
   and hostname, no SSH) each run the same command with
   ``--worker_num=H --local_worker_num=1 --master_addr=<h1>``; the time
   from starting every node to the last node's exit, all exiting 0.
3. Failure-to-exit on 2 nodes: the worker on the second node exits 3
   after 0.5 s while every other process sleeps; the time from that
   worker's exit (its own clock reading just before ``os._exit``) to the
   last node's exit, which must be status 3 on both nodes.

    python bench/msrun.py [--runs 5] [--workers 2,8] [--nodes 2,4,8]

Benchmark the installed package (``--mslaunch-console``): see bench/README.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Sequence

import _common as C

sys.path.insert(0, str(C.REPO_ROOT / "tests" / "support"))

TASK = """\
import os, sys, time
if os.environ.get("MS_ROLE") == "MS_WORKER" and os.environ.get("BENCH_FAIL") and \\
        os.uname().nodename == os.environ["BENCH_FAIL"]:
    time.sleep(0.5)
    with open(os.environ["BENCH_STAMP"], "w") as f:
        f.write(repr(time.time()))
    os._exit(3)
if os.environ.get("BENCH_FAIL"):
    time.sleep(60)
"""


def ms(values: Sequence[float]) -> str:
    return f"{statistics.median(values) * 1000:.0f}" if values else "n/a"


def environ() -> Dict[str, str]:
    # msrun runs the script with the ``python`` on PATH: this interpreter's, as
    # in an activated virtual environment (not a slow version-manager shim).
    env = C.base_environ()
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    return env


def single_node(prefix: List[str], work: str, runs: int, sizes: Sequence[int],
                port: int) -> List[str]:
    task = os.path.join(work, "task.py")
    msrun = shutil.which("msrun")
    rows = ["| workers | mslaunch | Python floor (N+1 interpreters) | real msrun | mslaunch / msrun |",
            "|---|---|---|---|---|"]
    env = environ()
    for n in sizes:
        times: Dict[str, List[float]] = {"mslaunch": [], "floor": [], "msrun": []}
        args = [f"--worker_num={n}", f"--local_worker_num={n}", f"--master_port={port}",
                f"--log_dir={work}/log", "--join=True", task]
        cmds = {"mslaunch": [*prefix, *args],
                "floor": [sys.executable, str(C.FLOOR), str(n + 1), sys.executable, task]}
        if msrun:
            cmds["msrun"] = [msrun, *args]
        for _ in range(runs + 1):                    # the first round warms up
            for key, argv in cmds.items():
                t0 = time.monotonic()
                r = subprocess.run(argv, env=env, cwd=work, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.PIPE, timeout=120)
                took = time.monotonic() - t0
                if r.returncode != 0:
                    raise SystemExit(f"{key} -n {n} failed: {r.stderr.decode()[-400:]}")
                times[key].append(took)
        for key in times:
            times[key] = times[key][1:]
        ratio = (f"{statistics.median(times['mslaunch']) / statistics.median(times['msrun']):.2f}×"
                 if times["msrun"] else "n/a")
        rows.append(f"| {n} | {ms(times['mslaunch'])} | {ms(times['floor'])} | "
                    f"{ms(times['msrun']) if msrun else 'not installed'} | {ratio} |")
    return rows


def nodes_job(bed, hosts, prefix: List[str], work: str, port: int, fail: str = ""
              ) -> tuple:
    """Start every node's mslaunch at once; (seconds to the last exit, codes, stamp)."""
    task = os.path.join(work, "task.py")
    stamp = os.path.join(work, "stamp")
    if os.path.exists(stamp):
        os.unlink(stamp)
    env = dict(environ(), MSLAUNCH_SECRET="bench-secret-" + "x" * 20)
    if fail:
        env.update(BENCH_FAIL=fail, BENCH_STAMP=stamp)
    args = [f"--worker_num={len(hosts)}", "--local_worker_num=1", f"--master_port={port}",
            f"--master_addr={hosts[0].addr}", "--join=True", "--cluster_time_out=30",
            "--grace=2"]
    t0 = time.time()
    procs = [bed.spawn(h, [*prefix, *args, f"--log_dir={work}/log_{h.name}", task],
                       log=os.path.join(work, f"out_{h.name}"), env=env, cwd=work)
             for h in hosts]
    codes = [p.wait(timeout=120) for p in procs]
    end = time.time()
    failed_at = float(open(stamp).read()) if fail else None
    return end - t0, codes, (end - failed_at) if failed_at else None


def multi_node(prefix: List[str], work: str, runs: int, sizes: Sequence[int],
               port: int) -> List[str]:
    from netbed import NetBed, preclean_stale
    preclean_stale("mb")
    rows = ["| nodes | formation + trivial job, s | failure-to-exit of every node, ms |",
            "|---|---|---|"]
    bed = NetBed(os.path.join(work, "bed"), prefix_base="mb")
    try:
        hosts = bed.create([f"h{i}" for i in range(1, max(sizes) + 1)])
        for n in sizes:
            formation, failure = [], []
            for i in range(runs + 1):
                took, codes, _ = nodes_job(bed, hosts[:n], prefix, work, port)
                if codes != [0] * n:
                    raise SystemExit(f"{n} nodes: exit codes {codes}; see {work}/out_h*")
                if i:
                    formation.append(took)
                if n == 2:
                    _, codes, lag = nodes_job(bed, hosts[:n], prefix, work, port, fail="h2")
                    if codes != [3, 3]:
                        raise SystemExit(f"failure case: exit codes {codes}")
                    if i:
                        failure.append(lag)
            rows.append(f"| {n} | {statistics.median(formation):.2f} | "
                        f"{ms(failure) if failure else ''} |")
    finally:
        bed.teardown()
    return rows


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    C.add_launcher_args(parser, runs=5)
    parser.add_argument("--workers", default="2,8")
    parser.add_argument("--nodes", default="2,4,8")
    parser.add_argument("--port", type=int, default=28118)
    args = parser.parse_args(argv)
    mslaunch = C.find_mslaunch(args.mslaunch, args.mslaunch_console, args.mslaunch_args)
    prefix = list(mslaunch.prefix)
    with tempfile.TemporaryDirectory(prefix="msrun-bench-") as work:
        with open(os.path.join(work, "task.py"), "w") as f:
            f.write(TASK)
        print(f"**msrun mode** ({mslaunch.version}; medians of {args.runs})\n")
        print("Spawn-to-exit of a trivial job on this machine (ms):\n")
        print("\n".join(single_node(prefix, work, args.runs,
                                    [int(x) for x in args.workers.split(",")], args.port)))
        if args.nodes:
            print("\nSeveral nodes (network namespaces, one worker each):\n")
            print("\n".join(multi_node(prefix, work, args.runs,
                                       [int(x) for x in args.nodes.split(",")], args.port)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
