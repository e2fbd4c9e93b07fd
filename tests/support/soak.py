"""What the soak tests of --max-restarts share: their long training job (a real
MPI loop with a checkpoint, tests/programs/long_train.py), its expected result,
and the check that nothing of the job is left, its cgroups included."""

from __future__ import annotations

import json
import os
import subprocess

from helpers import PY, cmd, kill_tagged, new_tag, program, tagged_pids, wait_for

LONG_TRAIN = program("long_train.py")
#: Seconds between two steps of the loop, and the steps of 3 minutes of it.
PERIOD = 0.5
MINUTES_3 = int(180 / PERIOD)


def result(steps: int, ranks: int = 4) -> bytes:
    """long_train.py's line at ``steps`` steps: sum(step) * sum(rank + 1)."""
    return b"result %d %d" % (steps, steps * (steps - 1) // 2 * ranks * (ranks + 1) // 2)


def attempts(path) -> list:
    with open(path) as f:
        return json.load(f)["attempts"]


def launcher_of(path) -> int:
    """The launcher's pid, from the job's report."""
    with open(path) as f:
        return json.load(f)["launcher"]["pid"]


def _cgroup_root() -> str:
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            if right.split(" ", 1)[0] == "cgroup2":
                return left.split()[4]
    return ""


def cgroups_of(launcher: int) -> list:
    """The cgroups, anywhere in the tree, of a job whose launcher's pid is ``launcher``:
    the launcher's own and those of its agents on the test hosts (which share this
    machine's cgroup tree), all named after the job's first PMI name."""
    root, mark = _cgroup_root(), f"kvs_{launcher}_"
    found = []
    for where, dirs, _ in os.walk(root) if root else ():
        found += [os.path.join(where, d) for d in dirs if mark in d]
    return found


def nothing_left(tag: str, launcher: int, timeout: float = 30) -> None:
    """Every process of the job is gone, and every cgroup it made."""
    assert wait_for(lambda: tagged_pids(tag) == [], timeout), tagged_pids(tag)
    assert wait_for(lambda: cgroups_of(launcher) == [], timeout), cgroups_of(launcher)


def remote_job(sshbed, tmp_path, hosts: str, restarts: int, steps: int, *faults: str, cut=()):
    """The job on ``hosts``; for each (attempt, host) of ``cut``, that host's link is
    cut once every rank of the attempt holds (a ``hold`` fault), and put back after
    the job.  Its (exit status, stdout, stderr)."""
    from remote import no_agents, renv
    sshbed.require_netns("a host cut off")
    home = sshbed.make_home(tmp_path / "home")
    out = tmp_path / "out"
    out.mkdir()
    tag = new_tag()
    p = subprocess.Popen(cmd("--max-restarts", str(restarts), "--report-json",
                             str(tmp_path / "r.json"), "-H", hosts, "-n", "4", "-x",
                             "MSL_TEST_TAG", PY, LONG_TRAIN, str(out), str(steps), str(PERIOD),
                             *faults),
                         env=renv(home, MSL_TEST_TAG=tag), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    try:
        for attempt, host in cut:
            assert wait_for(lambda: all((out / f"held.{attempt}.{r}").exists()
                                        for r in range(4)), 900), p.poll()
            sshbed.link_down(host)
        stdout, err = p.communicate(timeout=1000)
    finally:
        for _, host in cut:
            sshbed.link_up(host)
        p.kill()
        p.communicate()
    try:
        nothing_left(tag, p.pid)
        assert wait_for(lambda: no_agents(sshbed), 30)
    finally:
        kill_tagged(tag)
    return p.returncode, stdout, err.decode()
