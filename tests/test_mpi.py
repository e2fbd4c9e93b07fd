"""Real MPI programs (mpi4py on the PyPI MPICH wheel) run under mslaunch's PMI."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from conftest import require
from helpers import PY, clean_env, kill_tagged, new_tag, program, run, start, tagged_pids

pytestmark = pytest.mark.mpi


def _mpich_ready() -> bool:
    probe = subprocess.run([PY, "-c", "from mpi4py import MPI; print(MPI.Get_library_version())"],
                           capture_output=True, env=clean_env(), timeout=60)
    return probe.returncode == 0 and b"MPICH" in probe.stdout


@pytest.fixture(scope="module", autouse=True)
def mpich():
    require(_mpich_ready(), "mpi4py with the MPICH wheel (pip install '.[mpi]')")


def shm_segments():
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith("mpich_shm"))


def rows(out: bytes):
    return sorted((json.loads(line) for line in out.decode().splitlines()),
                  key=lambda r: r["rank"])


@pytest.mark.parametrize("n", [1, 2, 4])
def test_collectives_point_to_point_split_and_shared_groups(n):
    r = run("-n", str(n), "--oversubscribe", PY, program("mpi_job.py"), "basic", timeout=120)
    assert r.returncode == 0, r.stderr
    got = rows(r.stdout)
    assert [g["rank"] for g in got] == list(range(n))
    for g in got:
        rank = g["rank"]
        assert g["size"] == n and g["sum"] == n * (n - 1) // 2
        assert g["bcast"] == {"from": 0, "data": [0, 1, 2, 3, 4]}
        assert g["ring"] == (rank - 1) % n
        same = [i for i in range(n) if i % 2 == rank % 2]
        assert g["split"] == [same.index(rank), len(same), sum(same)]
        assert g["shared"] == [rank, n]     # all ranks on this host: one node
        assert g["lib"] == "MPICH"
        assert g["env"] == [str(rank), str(rank)]


def test_sixteen_ranks_oversubscribed():
    r = run("-n", "16", "--oversubscribe", PY, program("mpi_job.py"), "basic", timeout=180)
    assert r.returncode == 0, r.stderr
    assert [g["sum"] for g in rows(r.stdout)] == [120] * 16


def test_pmi_over_tcp():
    r = run("-n", "2", "-pmi-port", PY, "-c",
            "import os; from mpi4py import MPI; c = MPI.COMM_WORLD;"
            " print(c.allreduce(c.Get_rank()), 'PMI_FD' in os.environ, os.environ['PMI_PORT'][:10])",
            timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.decode().split("\n")[:2] == ["1 False 127.0.0.1:"] * 2


def test_mpi_abort_ends_the_job_with_its_code_and_no_leftovers():
    tag = new_tag()
    t0 = time.monotonic()
    try:
        r = run("-n", "3", "--oversubscribe", "--grace", "2", PY, program("mpi_job.py"),
                "abort", "7", env=clean_env(MSL_TEST_TAG=tag), timeout=60)
        assert r.returncode == 7, r.stderr
        assert time.monotonic() - t0 < 30
        assert b"rank 2" in r.stderr and b"MPI_Abort with exit code 7" in r.stderr
        assert tagged_pids(tag) == []
        assert shm_segments() == []
    finally:
        kill_tagged(tag)


def test_rank_crashing_inside_a_collective_ends_the_job_within_the_grace_period():
    tag = new_tag()
    t0 = time.monotonic()
    try:
        r = run("-n", "3", "--oversubscribe", "--grace", "2", PY, program("mpi_job.py"),
                "crash", env=clean_env(MSL_TEST_TAG=tag), timeout=60)
        assert r.returncode == 128 + 9, r.stderr
        assert time.monotonic() - t0 < 20
        assert b"rank 1" in r.stderr and b"SIGKILL" in r.stderr
        assert tagged_pids(tag) == []
        assert shm_segments() == []
    finally:
        kill_tagged(tag)


def test_rank_leaving_without_finalize_ends_the_job_even_with_exit_0():
    tag = new_tag()
    try:
        r = run("-n", "2", "--grace", "2", PY, program("mpi_job.py"), "noinit",
                env=clean_env(MSL_TEST_TAG=tag), timeout=60)
        assert r.returncode == 1, r.stderr
        assert b"without MPI_Finalize" in r.stderr
        assert tagged_pids(tag) == []
        assert shm_segments() == []
    finally:
        kill_tagged(tag)


def test_two_concurrent_jobs_do_not_collide():
    jobs = [start("-n", "2", PY, program("mpi_job.py"), "basic") for _ in range(2)]
    try:
        for p in jobs:
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, err
            assert [g["sum"] for g in rows(out)] == [1, 1]
    finally:
        for p in jobs:
            p.kill()


def test_rankenv_wrapper_agrees_with_mpi4py_under_pmi():
    r = run("-n", "2", PY, "-m", "mslaunch.rankenv", "--mpi4py", program("mpi_job.py"),
            "rankenv", timeout=120)
    assert r.returncode == 0, r.stderr
    for line in r.stdout.decode().splitlines():
        g = json.loads(line)
        rank, size, lrank, lsize = g["mpi"]
        assert (g["RANK_ID"], g["RANK_SIZE"], g["LOCAL_RANK"], g["LOCAL_WORLD_SIZE"]) == \
            (str(rank), str(size), str(lrank), str(lsize))


def test_pmi_stats_line():
    r = run("-n", "2", PY, program("mpi_job.py"), "basic",
            env=clean_env(MSLAUNCH_PMI_STATS="1"), timeout=120)
    assert r.returncode == 0
    assert b"mslaunch: PMI: " in r.stderr and b" messages from 2 ranks" in r.stderr
