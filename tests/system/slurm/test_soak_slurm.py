"""Soak, inside a Slurm allocation (agents started with srun): a job started again
after a failure runs for minutes after its restart and ends with the result of an
uninterrupted run; nothing is left on any node, cgroups included."""

from __future__ import annotations

import pytest

from helpers import PY, kill_tagged, new_tag
from soak import LONG_TRAIN, MINUTES_3, PERIOD, attempts, launcher_of, nothing_left, result
from slurm import finish, salloc

pytestmark = [pytest.mark.soak, pytest.mark.remote, pytest.mark.timeout(600)]


def test_a_restarted_job_under_slurm_runs_for_3_minutes_and_ends_right(slurmbed, mpich,
                                                                        tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    steps = 10 + MINUTES_3
    tag = new_tag()
    p = salloc(slurmbed, tag, "--max-restarts", "1", "--report-json", str(tmp_path / "r.json"),
               "-n", "4", PY, LONG_TRAIN, str(out), str(steps), str(PERIOD), "0:10:kill",
               cwd=tmp_path)
    try:
        code, stdout, err = finish(p, timeout=500)
        nothing_left(tag, launcher_of(tmp_path / "r.json"))
    finally:
        p.kill()
        p.communicate()
        kill_tagged(tag)
    assert code == 0, err
    assert stdout.strip() == result(steps).decode(), (stdout, err)
    first, second = attempts(tmp_path / "r.json")
    assert first["exit_code"] == 137 and second["exit_code"] == 0
    assert second["end"] - second["start"] >= MINUTES_3 * PERIOD, second
