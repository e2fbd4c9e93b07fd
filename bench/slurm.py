"""Inside a Slurm allocation: mslaunch's srun-started agents against SSH and Hydra ``-launcher slurm``.

The cluster is the Slurm test bed of ``tests/support/slurmbed.py`` (root; slurmctld
and one slurmd per network namespace on this machine).  For each node count
H (2, 4, 8) the script takes one allocation, ``salloc -N H
--ntasks-per-node=1``, and inside it runs the launchers interleaved, one
rank per node (the launcher itself runs outside the nodes, so every rank is
remote):

1. ``-n H python -c pass``;
2. mpi4py Init + ``allreduce`` + Finalize with ``UCX_TLS=tcp`` (the sum is
   checked).

mslaunch starts its agents with one ``srun`` step that dials back, or
(``--launcher ssh``, the same nodes, each running an sshd of the SSH test
bed in its namespace) over SSH, or (``--launcher srun``) has srun start the
ranks themselves, with no agent; Hydra
runs ``srun`` with its ``hydra_pmi_proxy``, which connects back to the
runner's host name (mapped to the runner's bed address on the nodes).

    python bench/slurm.py [--runs 7] [--nodes 2,4,8]

Run it with the interpreter that has mslaunch installed (not editable),
mpi4py and the mpich wheel; see bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from typing import Dict, List, Sequence

import _common as C

sys.path.insert(0, str(C.REPO_ROOT / "tests" / "support"))

MPI_CODE = ("from mpi4py import MPI; c = MPI.COMM_WORLD; s = c.allreduce(1); "
            "print(s) if c.rank == 0 else None")


def inner(args) -> int:
    """Runs inside the allocation: time each launcher, print JSON."""
    n = int(os.environ["SLURM_JOB_NUM_NODES"])
    py = sys.executable
    launchers = {"mslaunch": [args.mslaunch_cmd, "--launcher", "slurm", "-x", "UCX_TLS"],
                 "mslaunch-direct": [args.mslaunch_cmd, "--launcher", "srun", "-x", "UCX_TLS"],
                 "mslaunch-ssh": [args.mslaunch_cmd, "--launcher", "ssh", "-x", "UCX_TLS"],
                 "hydra": [args.hydra_cmd, "-launcher", "slurm", "-genv", "UCX_TLS", "tcp"]}
    cases = {"pass": [py, "-c", "pass"], "mpi": [py, "-c", MPI_CODE]}
    times: Dict[str, List[float]] = {f"{k}/{c}": [] for k in launchers for c in cases}
    env = dict(os.environ, UCX_TLS="tcp")
    if args.switch_ns:
        times.update(_bytes_per_node(args, launchers, env, n))
    shuffle = random.Random(4711).shuffle    # no launcher always after the same one
    for i in range(args.runs + 1):
        for case, program in cases.items():
            order = list(launchers.items())
            shuffle(order)
            for key, prefix in order:
                run_env = dict(env, HOME=args.ssh_home) if key == "mslaunch-ssh" else env
                t0 = time.monotonic()
                r = subprocess.run([*prefix, "-n", str(n), *program], env=run_env,
                                   capture_output=True, timeout=120)
                took = time.monotonic() - t0
                ok = r.returncode == 0 and (case != "mpi" or r.stdout.split() == [str(n).encode()])
                if not ok:
                    sys.stderr.write(f"{key} {case} -n {n} failed ({r.returncode}): "
                                     f"{r.stderr.decode(errors='replace')[-300:]}\n")
                    times[f"{key}/{case}"].append(float("nan"))
                elif i:
                    times[f"{key}/{case}"].append(took)
    print(json.dumps(times))
    return 0


def _bytes_per_node(args, launchers, env, n: int) -> Dict[str, List[float]]:
    """Bytes each node received during one untimed ``hostname`` job of each
    launcher (and of mslaunch with the package sent): the least and the most."""
    from types import SimpleNamespace
    names = subprocess.run(["scontrol", "show", "hostnames"], capture_output=True, text=True,
                           check=True).stdout.split()
    net = SimpleNamespace(switch_ns=args.switch_ns)
    program = [sys.executable, "-c", "import socket; print(socket.gethostname())"]
    variants = [(key, prefix, {}) for key, prefix in launchers.items()]
    variants.insert(1, ("mslaunch-sent", launchers["mslaunch"], {"MSLAUNCH_HOST_PACKAGE": "0"}))
    got: Dict[str, List[float]] = {}
    for key, prefix, extra in variants:
        run_env = dict(env, HOME=args.ssh_home, **extra) if key == "mslaunch-ssh" else \
            dict(env, **extra)
        got[f"bytes/{key}"] = list(C.bytes_per_host(net, names, lambda: subprocess.run(
            [*prefix, "-n", str(n), *program], env=run_env, capture_output=True, timeout=120)))
    return got


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--nodes", default="2,4,8")
    parser.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--mslaunch-cmd", default=os.path.join(os.path.dirname(sys.executable),
                                                               "mslaunch"))
    parser.add_argument("--hydra-cmd", default=None)
    parser.add_argument("--ssh-home", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--switch-ns", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.inner:
        return inner(args)
    # The installed mslaunch is measured: the source tree stays off PYTHONPATH (it
    # would be imported, and recompiled on every run, by the launcher and the agents).
    C.MEASURE_TREE = False
    hydra = C.find_hydra(args.hydra_cmd)
    if hydra is None:
        raise SystemExit("no Hydra mpiexec (the mpich wheel) found")
    import tempfile
    from slurmbed import SlurmBed
    from sshbed import SSHBed
    sizes = [int(x) for x in args.nodes.split(",")]
    rows = ["| nodes | `python -c pass`: mslaunch, agents by srun | mslaunch, SSH | "
            "mslaunch `--launcher srun` | Hydra, srun | agents / Hydra | `--launcher srun` / "
            "Hydra | MPI allreduce: mslaunch, agents by srun | mslaunch, SSH | "
            "mslaunch `--launcher srun` | Hydra, srun | agents / Hydra | `--launcher srun` / "
            "Hydra |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    with SlurmBed(nodes=max(sizes), cpus=2) as bed:
        # An sshd on every node, for mslaunch --launcher ssh on the same nodes.
        ssh_dir = tempfile.mkdtemp(prefix="slurm-bench-ssh-")
        ssh_bed = SSHBed(ssh_dir)
        try:
            ssh_bed.start(max(sizes), net=bed.net)
            home = ssh_bed.make_home(os.path.join(ssh_dir, "home"))
            rows += _rounds(args, bed, sizes, home, hydra)
        finally:
            ssh_bed.stop()
            shutil.rmtree(ssh_dir, ignore_errors=True)
    print(f"**Inside a Slurm allocation** (ms, median of {args.runs}; one rank per node, "
          f"every rank remote)\n")
    print("\n".join(r for r in rows if not r.startswith("bytes")))
    print("\n**Bytes received per node** (one untimed `hostname` job: every byte the node's "
          "network port delivered, Slurm's own step launch included; least–most over the "
          "nodes)\n")
    print("| nodes | mslaunch, agents by srun | mslaunch, agents by srun, package sent | "
          "mslaunch, SSH | mslaunch `--launcher srun` | Hydra, srun |")
    print("|---|---|---|---|---|---|")
    print("\n".join(r[len("bytes"):] for r in rows if r.startswith("bytes")))
    return 0


def _rounds(args, bed, sizes, home, hydra) -> List[str]:
    """One allocation per node count; a table row for each."""
    rows = []
    for n in sizes:
        r = bed.run(["salloc", "-N", str(n), "--ntasks-per-node=1", "-Q", sys.executable,
                     os.path.abspath(__file__), "--inner", "--runs", str(args.runs),
                     "--mslaunch-cmd", args.mslaunch_cmd, "--hydra-cmd",
                     hydra.prefix[0], "--ssh-home", home, "--switch-ns", bed.net.switch_ns],
                    timeout=1200,
                    base_env=dict(C.base_environ(), UCX_TLS="tcp"))
        if r.returncode != 0 or not r.stdout.strip():
            raise SystemExit(f"{n} nodes failed: {r.stderr[-600:]}")
        sys.stderr.write(r.stderr)
        t = json.loads(r.stdout.strip().splitlines()[-1])

        def med(key: str) -> float:
            return statistics.median(t[key]) * 1000 if t[key] else float("nan")
        cells = [str(n)]
        for case in ("pass", "mpi"):
            cells += [f"{med(f'{key}/{case}'):.0f}"
                      for key in ("mslaunch", "mslaunch-ssh", "mslaunch-direct", "hydra")]
            cells += [f"{med(f'{key}/{case}') / med(f'hydra/{case}'):.2f}×"
                      for key in ("mslaunch", "mslaunch-direct")]
        rows.append("| " + " | ".join(cells) + " |")
        rows.append("bytes| " + str(n) + " | " + " | ".join(
            "–".join(str(int(x)) for x in t.get(f"bytes/{key}", []))
            for key in ("mslaunch", "mslaunch-sent", "mslaunch-ssh", "mslaunch-direct",
                        "hydra")) + " |")
    return rows


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
