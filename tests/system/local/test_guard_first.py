"""The command's orphan guard, started before its command line is read
(mslaunch.cli: the cgroup's move overlaps the reading and the planning): a
line that asks for no job leaves neither process nor cgroup, and the job's
own grace holds in the watchdog, which was started before the line said it."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from requires import require
from helpers import PY, all_gone, clean_env, cmd, kill_tagged, new_tag, program, tagged_pids
from helpers import wait_for, wait_lines
from soak import cgroups_of


@pytest.mark.parametrize("args, code", [
    (["--bogus-option", "-n", "1", "true"], 2),
    (["-n", "0x", "true"], 2),
    (["--version"], 0),
    (["--help"], 0),
    (["--dry-run", "-n", "2", "true"], 0),
    (["--report-json", "/nonexistent-dir/r.json", "-n", "1", "true"], 2),
])
def test_a_line_that_runs_no_job_leaves_no_process_and_no_cgroup(args, code):
    tag = new_tag()
    p = subprocess.Popen(cmd(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env=clean_env(MSL_TEST_TAG=tag))
    try:
        out, err = p.communicate(timeout=60)
        assert p.returncode == code, err
        if code:
            assert len(err.splitlines()) == 1 and err.startswith(b"mslaunch: error: "), err
        else:
            assert out and not err, err
        # its watchdog, forked before the line was read, removes the cgroup once
        # the launcher has exited, and ends
        assert all_gone(tag, 10), tagged_pids(tag)
        assert wait_for(lambda: cgroups_of(p.pid) == [], 10), cgroups_of(p.pid)
    finally:
        p.kill()
        kill_tagged(tag)


def test_the_guard_started_first_settles_the_job_in_its_cgroup_and_removes_it():
    tag = new_tag()
    try:
        p = subprocess.Popen(cmd("-v", "-n", "2", "sh", "-c", "cat /proc/self/cgroup"),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             env=clean_env(MSL_TEST_TAG=tag))
        out, err = p.communicate(timeout=60)
        require(b"orphan guard: cgroup" in err, "a cgroup v2 of this user's")
        assert p.returncode == 0, err
        lines = [line for line in out.decode().splitlines() if line.startswith("0::")]
        assert len(lines) == 2 and len(set(lines)) == 1, out
        # the one cgroup of the job, named after the launcher and its job
        assert f"/mslaunch-{p.pid}-" in lines[0] and f"kvs_{p.pid}_" in lines[0], lines
        assert wait_for(lambda: cgroups_of(p.pid) == [], 10), cgroups_of(p.pid)
        assert all_gone(tag, 10), tagged_pids(tag)
    finally:
        kill_tagged(tag)


def test_the_jobs_grace_holds_when_the_launcher_is_killed(tmp_path):
    # The watchdog was forked before the line said --grace: the launcher told it
    # since.  Killed, the launcher cannot end the ranks; the watchdog sends
    # SIGTERM, which these ranks ignore, and SIGKILL only after the job's grace.
    tag = new_tag()
    p = subprocess.Popen(cmd("-n", "2", "--grace", "3", PY, program("trap.py"), str(tmp_path),
                             "no"),
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         env=clean_env(MSL_TEST_TAG=tag))
    try:
        for r in range(2):
            assert wait_lines(str(tmp_path / f"rank{r}.log"), 1)
        killed = time.monotonic()
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=30)
        for r in range(2):                    # the watchdog's SIGTERM reached them
            assert wait_lines(str(tmp_path / f"rank{r}.log"), 2)
        assert all_gone(tag, 30), tagged_pids(tag)
        took = time.monotonic() - killed
        assert took >= 2.9, took                # not at once: after the job's 3 s
        logs = [(tmp_path / f"rank{r}.log").read_text().split() for r in range(2)]
        assert logs == [["ready", "SIGTERM"]] * 2, logs
    finally:
        p.kill()
        kill_tagged(tag)


def _pids_home():
    """Where a cgroup with a limit on processes can be made: cgroup v2's root when
    its pids controller is on for its children, else cgroup v1's pids hierarchy."""
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            kind, point = right.split(" ", 1)[0], left.split()[4]
            if kind == "cgroup2":
                try:
                    with open(os.path.join(point, "cgroup.subtree_control")) as g:
                        if "pids" in g.read().split():
                            return point
                    with open(os.path.join(point, "cgroup.controllers")) as g:
                        if "pids" not in g.read().split():
                            continue
                    # (a root without it for its children: turned on, as systemd does)
                    with open(os.path.join(point, "cgroup.subtree_control"), "w") as g:
                        g.write("+pids")
                    return point
                except OSError:
                    continue
            elif kind == "cgroup" and "pids" in right.split()[-1].split(","):
                return point
    return None


@pytest.fixture
def one_process():
    """A cgroup of this test's own in which no second process can be started."""
    home = _pids_home()
    require(home is not None and os.access(home, os.W_OK),
            "a pids controller of cgroups this user may write")
    path = os.path.join(home, f"msl-test-{new_tag()}")
    os.mkdir(path)
    try:
        with open(os.path.join(path, "pids.max"), "w") as f:
            f.write("1")
        yield path
    finally:
        def removed() -> bool:
            try:
                os.rmdir(path)       # EBUSY until its process is reaped
            except FileNotFoundError:
                pass
            except OSError:
                return False
            return True
        assert wait_for(removed, 10), path


def _confined(path, *args):
    """mslaunch run as the one process of cgroup ``path``."""
    return ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', path, *cmd(*args)]


@pytest.mark.parametrize("args, code", [
    (["--version"], 0),
    (["--help"], 0),
    (["--dry-run", "-n", "2", "true"], 0),
    (["--bogus-option", "-n", "1", "true"], 2),
])
def test_a_line_that_runs_no_job_works_where_no_process_can_be_started(one_process, args,
                                                                        code):
    # The guard's fork fails first (EAGAIN): such a line needs no guard.
    p = subprocess.run(_confined(one_process, *args), capture_output=True, timeout=60,
                       env=clean_env())
    assert p.returncode == code, p.stderr
    if code:
        assert p.stderr.startswith(b"mslaunch: error: unknown option '--bogus-option'") \
            and len(p.stderr.splitlines()) == 1, p.stderr
    else:
        assert p.stdout and not p.stderr, p.stderr


def test_a_job_where_no_process_can_be_started_says_so_in_one_line(one_process):
    p = subprocess.run(_confined(one_process, "-n", "1", "true"), capture_output=True,
                       timeout=60, env=clean_env())
    assert p.returncode == 1, p.stderr
    assert p.stderr == (b"mslaunch: error: cannot start the job's orphan guard: no process "
                        b"can be started now (a limit on processes: ulimit -u, a cgroup's "
                        b"pids.max)\n"), p.stderr
