"""The PMI-2 wire against a real third-party client: Slurm's libpmi2.

The MPICH wheel speaks PMI-1 only, so PMI-2 is exercised with a small C
program (tests/programs/pmi2_client.c) that makes the PMI-2 calls MPICH's
MPI layer makes, linked against Slurm's libpmi2 (Debian: libpmi2-0-dev).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from requires import require
from helpers import program, run

pytestmark = pytest.mark.pmi2


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    have = shutil.which("gcc") is not None and os.path.exists("/usr/include/slurm/pmi2.h")
    require(have, "gcc and Slurm's libpmi2 headers (apt-get install gcc libpmi2-0-dev)")
    exe = str(tmp_path_factory.mktemp("pmi2") / "pmi2_client")
    subprocess.run(["gcc", "-O1", "-I/usr/include/slurm", "-o", exe,
                    program("pmi2_client.c"), "-lpmi2"], check=True)
    return exe


@pytest.mark.parametrize("n", [1, 2, 4])
def test_init_attributes_fence_finalize(client, n):
    r = run("-n", str(n), "--oversubscribe", client, timeout=60)
    assert r.returncode == 0, r.stderr
    out = r.stdout.decode()
    summary = sorted(re.findall(r"\[(\d+)/(\d+)\] spawned=0 appnum=0 jobid=(\S+)", out))
    assert [(int(a), int(b)) for a, b, _ in summary] == [(i, n) for i in range(n)]
    assert len({j for _, _, j in summary}) == 1
    if n > 1:
        assert out.count(f"PMI_process_mapping found=1 (vector,(0,1,{n}))") == n


def test_node_attributes_wait_for_the_put(client):
    r = run("-n", "4", "--oversubscribe", client, "nodeattr", timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.decode().count("nodeattr found=1 2F6465762F73686D") == 3


def test_put_fence_get_exchange(client):
    r = run("-n", "3", "--oversubscribe", client, "multinode", timeout=60)
    assert r.returncode == 0, r.stderr
    for rank in range(3):
        for src in range(3):
            assert f"[{rank}] got -allgather-1-{src}=ADDR{src} (len 5)" in r.stdout.decode()


def test_tcp_port_refuses_a_client_without_the_job_secret(client):
    # Over PMI_PORT a rank proves it belongs to the job with its secret
    # PMI_ID (MPICH's clients send it); Slurm's client sends its rank instead,
    # so the server must refuse it rather than trust a guessable number.
    r = run("-pmi-port", "-n", "1", client, timeout=60)
    assert r.returncode != 0
    assert b"wrong PMI_ID" in r.stderr


def test_abort_ends_the_job(client):
    r = run("-n", "3", "--oversubscribe", "--grace", "1", client, "abort", timeout=60)
    assert r.returncode == 1
    assert b"rank 2" in r.stderr and b"MPI_Abort" in r.stderr


def test_spawn_over_pmi2(client):
    r = run("-n", "1", client, "spawn", timeout=60)
    assert r.returncode == 0, r.stderr
    out = r.stdout.decode()
    [job] = re.findall(r"\[0\] spawned job (\S+)", out)
    assert job.endswith("_2")
    for rank in range(2):
        assert f"[{rank}] child of 2 spawned=1 args=child|with space key=from-the-parent" in out
        assert f"[{rank}/2] spawned=1 appnum=0 jobid={job}" in out
