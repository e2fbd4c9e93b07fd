"""The launcher out of its job's cgroup while the ranks run (mslaunch.machine.cgroups),
and back in before it starts anything: every process of the job is born inside."""

from __future__ import annotations

import pytest

from requires import require
from helpers import clean_env, kill_tagged, new_tag, program, run


@pytest.mark.parametrize("where", ["here", "elsewhere"])
def test_the_launcher_leaves_while_its_ranks_run_and_each_attempt_is_born_inside(tmp_path,
                                                                                   where):
    # "elsewhere": ranks in another working directory start through the C
    # library's posix_spawn (mslaunch.machine.spawndir), not os.posix_spawn.
    tag = new_tag()
    wdir = ["-wdir", str(tmp_path)] if where == "elsewhere" else []
    try:
        r = run("-v", "--max-restarts", "1", *wdir, "-n", "1", "sh", program("cgroup_outside.sh"),
                env=clean_env(MSL_TEST_TAG=tag), timeout=120)
        require(b"orphan guard: cgroup" in r.stderr, "a cgroup v2 of this user's")
        assert r.returncode == 0, r.stderr
    finally:
        kill_tagged(tag)
    # tests/programs/cgroup_outside.sh's lines: each attempt's rank in the job's
    # one cgroup (the second's too: born inside), the launcher out while it ran
    lines = [line.split() for line in r.stdout.decode().splitlines()]
    assert [line[0] for line in lines] == ["0", "1"], r.stdout
    job = lines[0][1]
    assert job.count("/mslaunch-") == 1, r.stdout
    assert all(rank == job and launcher != job for _, rank, launcher in lines), r.stdout
