"""Fast checks of the Slurm test bed itself (tests/support/slurmbed.py)."""

from __future__ import annotations

import os
import socket
import sys
import threading
from typing import TYPE_CHECKING, List

import pytest

import netbed

if TYPE_CHECKING:
    from slurmbed import SlurmBed, SlurmBedPool

pytestmark = pytest.mark.remote


def test_srun_runs_on_both_nodes(slurmbed: SlurmBed):
    r = slurmbed.run(["salloc", "-N", "2", "srun", "-N", "2", "hostname"], timeout=60)
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.split()) == ["h1", "h2"]


def test_salloc_environment(slurmbed: SlurmBed):
    r = slurmbed.run(["salloc", "-N", "2", "sh", "-c",
                      'echo "$SLURM_JOB_NODELIST $SLURM_TASKS_PER_NODE $SLURM_CONF"'], timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["h[1-2]", "1(x2)", slurmbed.conf]


def test_tasks_dial_back_to_the_gateway(slurmbed: SlurmBed):
    """Tasks run the project's Python and connect to a listener of the test process,
    by address and by the runner's hostname (the nodes' /etc/hosts maps it)."""
    srv = socket.create_server((slurmbed.gateway, 0))
    srv.settimeout(30)
    port = srv.getsockname()[1]
    got: List[str] = []

    def serve() -> None:
        try:
            for _ in range(4):
                conn, _ = srv.accept()
                with conn:
                    got.append(conn.makefile().readline().strip())
        except OSError:
            pass
    t = threading.Thread(target=serve, daemon=True)
    t.start()
    code = ("import os, socket, mslaunch\n"
            "for host in (os.environ['GW'], os.environ['RUNNER']):\n"
            "    with socket.create_connection((host, int(os.environ['PORT'])), timeout=10) as s:\n"
            "        s.sendall(f\"{socket.gethostname()} {os.environ['SLURM_PROCID']} "
            "{socket.gethostbyname(os.environ['RUNNER'])}\\n\".encode())\n")
    try:
        r = slurmbed.run(["srun", "--mpi=none", "--kill-on-bad-exit", "-N", "2", "-n", "2",
                          "--ntasks-per-node=1", "--input=none", sys.executable, "-c", code],
                         env={"GW": slurmbed.gateway, "RUNNER": slurmbed.runner,
                              "PORT": str(port)}, timeout=60)
        t.join(30)
    finally:
        srv.close()
    assert r.returncode == 0, r.stderr
    gw = slurmbed.gateway
    assert sorted(got) == [f"h1 0 {gw}", f"h1 0 {gw}", f"h2 1 {gw}", f"h2 1 {gw}"]


def test_sbatch_wait_writes_output(slurmbed: SlurmBed, tmp_path):
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\necho \"batch on $(hostname) $SLURM_JOB_NUM_NODES\"\n")
    r = slurmbed.run(["sbatch", "--wait", "-N", "1", "-o", str(tmp_path / "out-%j.txt"),
                      "-D", str(tmp_path), str(script)], timeout=60)
    assert r.returncode == 0, r.stderr
    job = r.stdout.split()[-1]
    assert (tmp_path / f"out-{job}.txt").read_text().split() == ["batch", "on", "h1", "1"]


def test_crash_and_restart(slurmbed: SlurmBed):
    slurmbed.wait_idle()        # no job of an earlier test still ending on h2
    assert slurmbed.host_pids(2)
    killed = slurmbed.crash(2)
    assert killed and not slurmbed.host_pids(2)
    slurmbed.restart_slurmd(2)
    slurmbed.wait_idle(timeout=30)
    r = slurmbed.run(["srun", "-w", "h2", "hostname"], timeout=60)
    assert (r.returncode, r.stdout.strip()) == (0, "h2"), r.stderr
    assert slurmbed.exec_in(2, ["hostname"]).stdout.strip() == "h2"


def test_private_bed_teardown(slurmbeds: SlurmBedPool):
    bed = slurmbeds.new(1, cpus=1)
    prefix = bed.net.prefix
    daemons = [p.pid for p in bed.daemons.values()]
    munge_dir = bed.munge_dir
    bed.stop()
    assert not [n for n in netbed.list_netns() if netbed.belongs_to(n, prefix)]
    assert not [p for p in daemons if netbed.process_alive(p)]
    assert not os.path.exists(munge_dir)
    assert not os.path.exists(f"/sys/class/net/{prefix}up")
