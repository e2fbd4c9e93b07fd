"""Soak: a job started again after a failure runs for minutes after its restart,
on this machine, and ends with the result of an uninterrupted run (--max-restarts
promises days; a restart once killed the job 35 s later)."""

from __future__ import annotations

import subprocess

import pytest

from helpers import PY, clean_env, cmd, kill_tagged, new_tag
from soak import LONG_TRAIN, MINUTES_3, PERIOD, attempts, nothing_left, result

pytestmark = [pytest.mark.soak, pytest.mark.timeout(600)]


def test_a_restarted_local_job_runs_for_3_minutes_and_ends_right(mpich, tmp_path, own_tmpdir):
    out = tmp_path / "out"
    out.mkdir()
    steps = 10 + MINUTES_3
    tag = new_tag()
    p = subprocess.Popen(cmd("--max-restarts", "1", "--report-json", str(tmp_path / "r.json"),
                             "-n", "4", PY, LONG_TRAIN, str(out), str(steps), str(PERIOD),
                             "0:10:kill"),
                         env=clean_env(MSL_TEST_TAG=tag), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    try:
        stdout, err = p.communicate(timeout=500)
        nothing_left(tag, p.pid)
    finally:
        p.kill()
        p.communicate()
        kill_tagged(tag)
    assert p.returncode == 0, err
    assert stdout.strip() == result(steps), (stdout, err)
    first, second = attempts(tmp_path / "r.json")
    assert first["exit_code"] == 137 and second["exit_code"] == 0
    assert second["end"] - second["start"] >= MINUTES_3 * PERIOD, second
    assert [str(p) for p in own_tmpdir.rglob("*")] == []
