"""Soak, on the SSH test hosts: a job started again after it lost a host runs for
minutes after its restart on the host left and the spare, and ends with the
result of an uninterrupted run; nothing is left on any host, cgroups included."""

from __future__ import annotations

import pytest

from soak import MINUTES_3, PERIOD, attempts, remote_job, result

pytestmark = [pytest.mark.soak, pytest.mark.remote, pytest.mark.timeout(600)]


def test_a_job_that_lost_a_host_runs_3_minutes_on_the_spare_and_ends_right(sshbed, tmp_path,
                                                                          mpich):
    steps = 10 + MINUTES_3
    code, out, err = remote_job(sshbed, tmp_path, "h1:2,h2:2,h3:2", 1, steps, "0:10:hold",
                                cut=[(0, "h2")])
    assert code == 0, err
    assert out.strip() == result(steps), (out, err)
    first, second = attempts(tmp_path / "r.json")
    assert first["lost"] == ["h2"] and second["hosts"] == ["h1", "h3"], (first, second)
    assert second["end"] - second["start"] >= MINUTES_3 * PERIOD, second
