"""Soak, on the SSH test hosts: a job restarted three times over ten minutes (a
killed rank, a host cut off, MPI_Abort) ends with the result of an uninterrupted
run; nothing is left on any host, cgroups included."""

from __future__ import annotations

import pytest

from soak import PERIOD, attempts, remote_job, result

pytestmark = [pytest.mark.soak, pytest.mark.remote, pytest.mark.timeout(1200)]


def test_three_restarts_over_ten_minutes_end_with_the_uninterrupted_result(sshbed, tmp_path,
                                                                          mpich):
    steps = 1200                          # 10 minutes of steps
    code, out, err = remote_job(sshbed, tmp_path, "h1:2,h2:2,h3:2,h4:2", 3, steps,
                                "0:100:kill", "1:400:hold", "2:800:abort", cut=[(1, "h2")])
    assert code == 0, err
    assert out.strip() == result(steps), (out, err)
    runs = attempts(tmp_path / "r.json")
    assert [a["exit_code"] for a in runs] == [137, 255, 5, 0], runs
    assert runs[1]["lost"] == ["h2"] and runs[3]["hosts"] == ["h1", "h3"], runs
    assert runs[-1]["end"] - runs[0]["start"] >= steps * PERIOD, runs
