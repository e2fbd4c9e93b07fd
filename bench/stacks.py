"""Reading a running job's stacks: how long the report takes, what a sample costs.

Cases:

* ``local``: ``-n RANKS`` idle Python ranks (``time.sleep`` in a function) on this
  machine; ``mslaunch-stacks --json`` is timed ``--runs`` times (wall clock, the
  whole command: finding the job, every rank's Python dump and eu-stack's native
  frames, merging, JSON).
* ``native``: the same with ``sleep`` ranks (native frames only).
* ``ssh``: ``RANKS`` Python ranks over ``--hosts`` SSH hosts of the test bed
  (``tests/support/sshbed.py``, as ``bench/remote.py``): every agent reads its own
  ranks at once.

For each case the CPU one sample costs is measured too: the launcher's and
its agents' own CPU time with that of the readers they reaped, and the ranks'
(their faulthandler dump), over all runs, divided by runs and ranks.  The
stall sampler takes one such sample per rank every ``S/4`` seconds (at most
every minute) once a job has been silent that long, so its cost per rank per
minute is this times the samples per minute (1 at the default ``S`` of 300 s).
The pause of a rank is bounded by eu-stack's run on it (it stops the process
only while it unwinds): timed on its own for a few ranks.

    python bench/stacks.py [--ranks 64] [--hosts 8] [--runs 5] [--cases local,native,ssh]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Callable, Dict, List, Optional, Sequence

import _common as C

STACKS = C.REPO_ROOT / "scripts" / "mslaunch-stacks"
IDLE = ("import time\ndef idle_in_a_function():\n    time.sleep(3600)\nidle_in_a_function()\n")
TICK = os.sysconf("SC_CLK_TCK")


def cpu(pid: int, children: bool = True) -> float:
    """CPU seconds of ``pid`` (with the children it reaped)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return 0.0
    used = int(fields[11]) + int(fields[12])
    if children:
        used += int(fields[13]) + int(fields[14])
    return used / TICK


def tree(pid: int) -> List[int]:
    """``pid`` and its descendants."""
    kids: Dict[int, List[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            kids.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def measure(argv: Sequence[str], env: Dict[str, str], ranks: int, runs: int,
            elsewhere: Optional[Callable[[], List[int]]] = None) -> Dict[str, object]:
    """Time ``mslaunch-stacks`` on the job ``argv`` starts; ``elsewhere`` lists the
    processes on other hosts (agents and their ranks) whose CPU counts too."""
    job = subprocess.Popen(list(argv), env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            r = subprocess.run([sys.executable, str(STACKS), str(job.pid), "--json"],
                               capture_output=True, env=env, timeout=120)
            if r.returncode == 0:
                data = json.loads(r.stdout)
                if len(data["ranks"]) == ranks and all(x["threads"] for x in data["ranks"]):
                    break
            if time.monotonic() > deadline:
                raise SystemExit(f"bench: the job never showed {ranks} ranks: {r.stderr[-300:]}")
            time.sleep(1.0)
        time.sleep(1.0)
        procs = tree(job.pid) + (elsewhere() if elsewhere else [])
        before = sum(cpu(p) for p in procs)
        walls = []
        for _ in range(runs):
            t0 = time.monotonic()
            r = subprocess.run([sys.executable, str(STACKS), str(job.pid), "--json"],
                               capture_output=True, env=env, timeout=120)
            walls.append(time.monotonic() - t0)
            assert r.returncode == 0, r.stderr
        after = sum(cpu(p) for p in procs)
        pauses = []
        eu = shutil.which("eu-stack")
        rank_pids = [x["pid"] for x in data["ranks"] if x["host"] == os.uname().nodename][:5]
        for pid in rank_pids if eu else []:
            t0 = time.monotonic()
            subprocess.run([eu, "-m", "-p", str(pid)], capture_output=True, timeout=60)
            pauses.append(time.monotonic() - t0)
        return {"wall": statistics.median(walls), "min": min(walls),
                "cpu_per_rank": (after - before) / runs / ranks,
                "pause": statistics.median(pauses) if pauses else None,
                "groups": len(data["classes"])}
    finally:
        os.killpg(job.pid, 15)
        try:
            job.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(job.pid, 9)
            job.wait()


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--hosts", type=int, default=8)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--cases", default="local,native,ssh")
    args = parser.parse_args(argv)
    env = C.base_environ()
    env.setdefault("UCX_LOG_LEVEL", "fatal")
    launch = [sys.executable, "-m", "mslaunch"]
    rows = []
    cases = args.cases.split(",")
    n = args.ranks
    if "local" in cases:
        res = measure(launch + ["--oversubscribe", "-n", str(n), sys.executable, "-c", IDLE],
                      env, n, args.runs)
        rows.append((f"{n} Python ranks, this machine", res))
    if "native" in cases:
        res = measure(launch + ["--oversubscribe", "-n", str(n), "sleep", "3600"], env, n,
                      args.runs)
        rows.append((f"{n} `sleep` ranks, this machine", res))
    if "ssh" in cases:
        sys.path.insert(0, str(C.REPO_ROOT / "tests" / "support"))
        sys.path.insert(0, str(C.BENCH_DIR))
        import remote as R  # noqa: E402  (bench/remote.py: the SSH bed's start and stop)
        root = tempfile.mkdtemp(prefix="msl-bench-stacks-")
        beds = R.start_beds([args.hosts], root)
        try:
            bed = beds[args.hosts]
            per = max(1, n // args.hosts)
            spec = ",".join(f"{h}:{per}" for h in bed.hosts)
            renv = dict(env, HOME=bed.home)
            def remote_pids() -> List[int]:
                return [p for h in bed.bed.hosts for p in bed.bed.host_pids(h)]
            res = measure(launch + ["-H", spec, "-n", str(per * args.hosts), sys.executable,
                                    "-c", IDLE], renv, per * args.hosts, args.runs, remote_pids)
            rows.append((f"{per * args.hosts} Python ranks on {args.hosts} SSH hosts", res))
        finally:
            R.stop_beds(beds)
            shutil.rmtree(root, ignore_errors=True)
    print(C.markdown_table(
        ["case", "mslaunch-stacks, median (min)", "CPU per rank per sample",
         "stall sampler per rank per minute (S=300 / S=60)", "eu-stack on one rank"],
        [(name, f"{C.ms(r['wall'])} ({C.ms(r['min'])})",  # type: ignore[arg-type]
          f"{float(r['cpu_per_rank']) * 1000:.1f} ms",  # type: ignore[arg-type]
          f"{float(r['cpu_per_rank']) * 1000:.1f} / {float(r['cpu_per_rank']) * 4000:.1f} ms",
          "-" if r["pause"] is None else C.ms(r["pause"]))  # type: ignore[arg-type]
         for name, r in rows]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
