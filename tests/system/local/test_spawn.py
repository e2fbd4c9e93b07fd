"""MPI_Comm_spawn under mslaunch: real mpi4py programs (the MPICH wheel).

The spawned jobs are part of the launch in every way: supervised by the
same policy, their output relayed and written to files of their own job
number, stopped by timeouts, their shared memory removed, nothing left
behind.
"""

from __future__ import annotations

import json
import signal

import pytest

from helpers import (PY, clean_env, kill_tagged, new_tag, program, run, start,
                     tagged_pids, wait_for)

pytestmark = [pytest.mark.mpi, pytest.mark.usefixtures("mpich")]

SPAWN = program("spawn_job.py")


def parents(out: bytes):
    return sorted((json.loads(line) for line in out.decode().splitlines()
                   if line.startswith("{")), key=lambda row: row["parent"])


def segments(kvsname: str):
    from mslaunch.mpi.pmi.files import shm_segments
    return shm_segments(kvsname)


def spawn_run(*args: str, tag: str = "", timeout: float = 120, **kw):
    tag = tag or new_tag()
    # These jobs are of this machine alone.  Other workers' test beds add and
    # remove network interfaces meanwhile: UCX (MPICH's wheel) then failed its
    # start on a device gone between its listing and its use, and MPICH's
    # port names, which carry UCX's address of every device, outgrew their
    # 256 bytes.  Loopback alone is what a job of one machine needs.
    env = clean_env(MSL_TEST_TAG=tag, UCX_NET_DEVICES="lo")
    try:
        return run(*args, env=env, timeout=timeout, **kw)
    finally:
        assert wait_for(lambda: tagged_pids(tag) == [], 10), tagged_pids(tag)
        kill_tagged(tag)


def test_children_are_a_job_of_their_own():
    r = spawn_run("-n", "1", PY, SPAWN, "basic", "3")
    assert r.returncode == 0, r.stderr
    [parent] = parents(r.stdout)
    kids = parent["children"]
    assert [k["rank"] for k in kids] == [0, 1, 2]
    assert {k["size"] for k in kids} == {3}
    assert {k["spawned"] for k in kids} == {"1"}
    assert {k["appnum"] for k in kids} == {0}
    # A kvsname of their own, and no shared memory left by either job
    assert len({k["job"] for k in kids}) == 1 and kids[0]["job"].endswith("_2")
    assert segments(kids[0]["job"]) == [] and segments(kids[0]["job"][:-2]) == []
    # As under Hydra, MPI_UNIVERSE_SIZE is not known unless -usize says so
    assert parent["universe"] is None
    assert sorted(r.stdout.decode().splitlines()[:3]) == [f"child {i} of 3" for i in range(3)]


def test_usize_sets_the_universe_size():
    r = spawn_run("-usize", "SYSTEM", "-H", "localhost:3", "-n", "1", PY, SPAWN, "basic", "1")
    assert r.returncode == 0, r.stderr
    assert parents(r.stdout)[0]["universe"] == 3
    r = spawn_run("-usize", "7", "-n", "1", PY, SPAWN, "basic", "1")
    assert parents(r.stdout)[0]["universe"] == 7


def test_spawn_multiple_numbers_commands_as_apps():
    r = spawn_run("-n", "1", PY, SPAWN, "multiple")
    assert r.returncode == 0, r.stderr
    kids = parents(r.stdout)[0]["children"]
    assert [(k["rank"], k["appnum"], k["argv"][-1]) for k in kids] == \
        [(0, 0, "a"), (1, 1, "b"), (2, 1, "b")]
    assert {k["size"] for k in kids} == {3}


def test_several_parents_spawn_at_once():
    r = spawn_run("-n", "3", PY, SPAWN, "basic", "1")
    assert r.returncode == 0, r.stderr
    rows = parents(r.stdout)
    assert [p["parent"] for p in rows] == [0, 1, 2]
    jobs = {p["children"][0]["job"] for p in rows}
    assert len(jobs) == 3                        # three jobs: 2, 3 and 4
    assert sorted(j.rsplit("_", 1)[1] for j in jobs) == ["2", "3", "4"]


def test_a_collective_spawn_over_comm_world():
    r = spawn_run("-n", "2", PY, SPAWN, "world")
    assert r.returncode == 0, r.stderr
    [parent] = parents(r.stdout)
    assert [k["rank"] for k in parent["children"]] == [0, 1]


def test_nested_spawns():
    r = spawn_run("-n", "1", PY, SPAWN, "nested", "1")
    assert r.returncode == 0, r.stderr
    [child] = parents(r.stdout)[0]["children"]
    grand = child["grandchild"]
    assert child["job"].endswith("_2") and grand["job"].endswith("_3")
    assert grand["spawned"] == "1" and grand["size"] == 1


def test_tags_and_files_number_the_spawned_job(tmp_path):
    r = spawn_run("--tag-output", "--output-filename", str(tmp_path / "logs"), "-n", "1",
                  PY, SPAWN, "basic", "2")
    assert r.returncode == 0, r.stderr
    out = r.stdout.decode().splitlines()
    assert "[2,0]<stdout>:child 0 of 2" in out and "[2,1]<stdout>:child 1 of 2" in out
    assert any(line.startswith("[1,0]<stdout>:{") for line in out)
    files = sorted(str(p.relative_to(tmp_path / "logs")) for p in (tmp_path / "logs").rglob("*")
                   if p.is_file())
    assert files == ["1/rank.0/stderr", "1/rank.0/stdout", "2/rank.0/stderr",
                     "2/rank.0/stdout", "2/rank.1/stderr", "2/rank.1/stdout"]
    assert (tmp_path / "logs/2/rank.1/stdout").read_text() == "[2,1]<stdout>:child 1 of 2\n"


def test_info_keys_wdir_and_path(tmp_path):
    r = spawn_run("-n", "1", PY, SPAWN, "info", f"wdir={tmp_path}")
    assert r.returncode == 0, r.stderr
    assert parents(r.stdout)[0]["children"][0]["cwd"] == str(tmp_path)
    # path=DIR: a bare program name is found there (a Python under another name)
    (tmp_path / "bin").mkdir()
    wrapper = tmp_path / "bin" / "spawned-python"
    wrapper.write_text(f'#!/bin/sh\nexec "{PY}" "$@"\n')
    wrapper.chmod(0o755)
    r = spawn_run("-n", "1", PY, SPAWN, "program", str(tmp_path / "bin"), "spawned-python")
    assert r.returncode == 0, r.stderr
    assert "error" not in parents(r.stdout)[0]


def test_a_spawn_that_cannot_be_placed_fails_in_the_parent_only():
    # Unknown host, missing program: MPI_Comm_spawn fails, the parent goes on.
    r = spawn_run("-n", "1", PY, SPAWN, "info", "host=no-such-host.invalid")
    assert r.returncode == 0, r.stderr
    assert "error" in parents(r.stdout)[0]
    assert b"could not spawn: info host='no-such-host.invalid' is not a host of this job" \
        in r.stderr
    r = spawn_run("-n", "1", PY, SPAWN, "program", "/nonexistent", "no-such-program")
    assert r.returncode == 0, r.stderr
    assert "error" in parents(r.stdout)[0]
    assert b"could not spawn: program 'no-such-program'" in r.stderr


def test_explicit_slots_are_respected_unless_oversubscribing():
    r = spawn_run("-H", "localhost:2", "-n", "1", PY, SPAWN, "info", "wdir=/")
    assert r.returncode == 0, r.stderr              # one free slot: fits
    r = spawn_run("-H", "localhost:2", "-n", "1", PY, SPAWN, "basic", "2")
    assert r.returncode == 1                        # the parent's Spawn raised
    assert b"not enough free slots to spawn 2 process(es)" in r.stderr
    assert b"--oversubscribe" in r.stderr
    r = spawn_run("--oversubscribe", "-H", "localhost:2", "-n", "1", PY, SPAWN, "basic", "2")
    assert r.returncode == 0, r.stderr


def test_name_publishing_between_a_job_and_the_one_it_spawned():
    r = spawn_run("-n", "1", PY, SPAWN, "publish")
    assert r.returncode == 0, r.stderr
    assert parents(r.stdout)[0]["accepted"] == {"hello": 0}


def test_a_failing_child_ends_the_launch_with_its_code():
    r = spawn_run("-n", "1", PY, SPAWN, "fail", "2", "7")
    assert r.returncode == 7, r.stderr
    assert b"of spawned job 2 (pid" in r.stderr
    assert b"exited with code 7; terminated the job" in r.stderr


def test_timeout_and_signals_reach_spawned_processes():
    tag = new_tag()
    r = spawn_run("--timeout", "4", "-n", "1", PY, SPAWN, "sleep", "2", tag=tag)
    assert r.returncode == 110, r.stderr
    kvs = parents(r.stdout)[0]["children"][0]["job"]
    assert segments(kvs) == []
    # SIGTERM to mslaunch while children sleep: everything goes, 143
    p = start("-n", "1", PY, SPAWN, "sleep", "2", env=clean_env(MSL_TEST_TAG=tag))
    try:
        assert p.stdout.readline().startswith(b"child")
        assert wait_for(lambda: len(tagged_pids(tag)) >= 4, 20)   # launcher, parent, 2 children
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=30)
        assert p.returncode == 128 + signal.SIGTERM
        assert wait_for(lambda: tagged_pids(tag) == [], 10), tagged_pids(tag)
    finally:
        p.kill()
        p.wait()
        kill_tagged(tag)


def test_spawn_over_the_pmi_port():
    r = spawn_run("-pmi-port", "-n", "1", PY, SPAWN, "basic", "2")
    assert r.returncode == 0, r.stderr
    assert len(parents(r.stdout)[0]["children"]) == 2


def test_a_helper_is_known_until_its_waiter_reaps_it_and_tells_its_end():
    """srun and rsh commands start as helpers: the orphan guard's sweep of adopted
    children skips them while they are known, so their waiter gets their status."""
    from mslaunch.machine.spawn import Helper, helper_pids
    helper = Helper(["sh", "-c", "echo said; exit 3"], None)
    assert helper.pid in helper_pids()
    assert helper.wait() == 3 and helper.poll() == 3
    assert helper.pid not in helper_pids()
    assert helper.stdout.read() == b"said\n"
    helper.stdout.close()
    killed = Helper(["sh", "-c", "kill -TERM $$"], None)
    assert killed.wait() == -15
    killed.stdout.close()
    with pytest.raises(FileNotFoundError):
        Helper(["no-such-program-here"], {"PATH": "/nonexistent"})
