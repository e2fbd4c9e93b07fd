"""Placement cost: planning a job on thousands of hosts.

Times ``mslaunch --hostfile H -n N --dry-run true`` (the whole command:
reading the hostfile, placing the ranks, building every rank's environment,
printing the plan) for 1,000, 10,000 and 100,000 hosts of one slot each,
with ``--map-by slot`` and ``--map-by node``, and N twice the slots with
``--oversubscribe`` where that stays under the 100,000-rank limit.  Names
in the hostfile are never resolved (a dry run connects to nothing).

    python bench/placement.py [--runs 3] [--sizes 1000,10000,100000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import List, Sequence

import _common as C


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--mslaunch", default=None, help="how to invoke mslaunch (shell words)")
    parser.add_argument("--mslaunch-console", action="store_true")
    args = parser.parse_args(argv)
    if args.mslaunch_console:
        prefix = [os.path.join(os.path.dirname(sys.executable), "mslaunch")]
    elif args.mslaunch:
        prefix = args.mslaunch.split()
    else:
        prefix = [sys.executable, "-m", "mslaunch"]
    env = C.base_environ()
    print("### Placement (wall seconds of `mslaunch --dry-run`, median of "
          f"{args.runs})\n")
    print("| hosts | ranks | `--map-by slot` | `--map-by node` |")
    print("|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for hosts in [int(x) for x in args.sizes.split(",")]:
            path = os.path.join(tmp, f"hosts{hosts}")
            with open(path, "w") as f:
                f.writelines(f"node{i:06d} slots=1\n" for i in range(hosts))
            for ranks in (hosts, 2 * hosts):
                if ranks > 100_000:
                    continue
                cells: List[str] = []
                for policy in ("slot", "node"):
                    cmd = [*prefix, "--hostfile", path, "-n", str(ranks), "--map-by", policy,
                           "--oversubscribe", "--dry-run", "true"]
                    times = []
                    for _ in range(args.runs):
                        t = time.perf_counter()
                        done = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL,
                                              stderr=subprocess.PIPE)
                        times.append(time.perf_counter() - t)
                        if done.returncode:
                            print(done.stderr.decode()[-500:], file=sys.stderr)
                            return 1
                    cells.append(f"{statistics.median(times):.2f}")
                print(f"| {hosts} | {ranks} | {cells[0]} | {cells[1]} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
