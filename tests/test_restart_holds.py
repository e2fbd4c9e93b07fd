"""Restarts that hold (--max-restarts): what a restarted job keeps of the first
attempt's guard, its bad input, its stop signals, its stdin and its --timeout,
on this machine.  The soak tests, which run for minutes after a restart, are in
test_soak.py; the remote cases in test_restarts.py."""

from __future__ import annotations

import os

import pytest

from conftest import require
from helpers import PY, clean_env, kill_tagged, new_tag, run, wait_for

#: A rank that says where it runs (its cgroup, its launcher) and fails once: rank 1
#: of the first attempt exits 5, once rank 0 has said where it runs (argv[1]: a
#: directory for rank 0's word).
WHERE = ("import os, sys, time\n"
         "with open('/proc/self/cgroup') as f:\n"
         "    cg = [l[3:].strip() for l in f if l.startswith('0::')][0]\n"
         "attempt, rank = os.environ['MSLAUNCH_RESTART_COUNT'], os.environ['PMI_RANK']\n"
         "print(attempt, rank, os.getppid(), cg, flush=True)\n"
         "said = os.path.join(sys.argv[1], attempt)\n"
         "if rank == '0':\n"
         "    open(said, 'w').close()\n"
         "elif attempt == '0':\n"
         "    while not os.path.exists(said):\n"
         "        time.sleep(0.01)\n"
         "    sys.exit(5)\n")


def _cgroup_root() -> str:
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            if right.split(" ", 1)[0] == "cgroup2":
                return left.split()[4]
    return ""


def _job_cgroups(launcher: int) -> list:
    """The cgroups, anywhere in the tree, that a launcher of pid ``launcher`` made."""
    root = _cgroup_root()
    found = []
    for where, dirs, _ in os.walk(root):
        found += [os.path.join(where, d) for d in dirs if d.startswith(f"mslaunch-{launcher}-")]
    return found


def test_every_attempt_runs_in_the_one_cgroup_of_the_job_and_none_is_left(tmp_path):
    tag = new_tag()
    try:
        r = run("-v", "--max-restarts", "1", "-n", "2", PY, "-c", WHERE, str(tmp_path),
                env=clean_env(MSL_TEST_TAG=tag), timeout=60)
        require(b"orphan guard: cgroup" in r.stderr, "a cgroup v2 of this user's")
        assert r.returncode == 0, r.stderr
        seen = {tuple(line.split()[:2]): line.split()[2:] for line in r.stdout.decode().splitlines()}
        assert sorted(seen) == [("0", "0"), ("0", "1"), ("1", "0"), ("1", "1")], r.stdout
        launchers = {v[0] for v in seen.values()}
        cgroups = {v[1] for v in seen.values()}
        assert len(launchers) == 1 and len(cgroups) == 1, seen
        # one cgroup of the job's, not one inside another's
        assert cgroups.pop().count("/mslaunch-") == 1, seen
        launcher = int(launchers.pop())
        assert wait_for(lambda: _job_cgroups(launcher) == [], 10), _job_cgroups(launcher)
    finally:
        kill_tagged(tag)


def test_a_leftover_of_one_attempt_is_gone_before_the_next_starts(tmp_path):
    # A daemon of the first attempt that lets go of the rank's pipes and group:
    # the next attempt, in the same cgroup, must not meet it.
    unique = f"1143.{os.getpid()}{int(new_tag()[:6], 16)}"
    script = (f"if [ \"$MSLAUNCH_RESTART_COUNT\" = 0 ]; then setsid -f env -i sleep {unique} "
              f"</dev/null >/dev/null 2>&1; until ps -eo sess,args | grep -q '^ *[0-9]* sleep "
              f"{unique}$'; do :; done; exit 3; fi; "
              f"echo $(ps -eo args | grep -c '^sleep {unique}$')")
    tag = new_tag()
    try:
        r = run("--max-restarts", "1", "-n", "1", "sh", "-c", script,
                env=clean_env(MSL_TEST_TAG=tag), timeout=60)
        assert r.returncode == 0, r.stderr
        assert r.stdout == b"0\n", r.stdout
    finally:
        kill_tagged(tag)


# -- bad input ----------------------------------------------------------------------

@pytest.mark.parametrize("value", [" 3", "+3", "3 ", "\u0663", "1_0", "0x3", ""])
def test_a_count_of_restarts_that_is_not_plain_digits_is_refused(value):
    r = run("--max-restarts", value, "-n", "1", "true")
    assert r.returncode == 2, r.stderr
    assert r.stderr.count(b"\n") == 1 and b"--max-restarts: expected a whole number" in r.stderr


@pytest.mark.parametrize("value", ["abc", "0,0", "-1,5", "nan,3", "inf", "1,x", "1,0", " 1",
                                   "0.001", "1,5,6", "\u0661,5"])
def test_a_bad_heartbeat_setting_is_one_clear_error(value):
    r = run("-n", "1", "true", env=clean_env(MSLAUNCH_HEARTBEAT=value))
    assert r.returncode == 2, r.stderr
    assert r.stderr.count(b"\n") == 1, r.stderr
    assert r.stderr.startswith(b"mslaunch: error: MSLAUNCH_HEARTBEAT="), r.stderr


@pytest.mark.parametrize("value, expected", [("0.5,3", (0.5, 3)), ("2", (2.0, 6)),
                                             ("1e-1,10", (0.1, 10)), ("", (0.3, 6))])
def test_good_heartbeat_settings(value, expected):
    from mslaunch.remote.endpoint import heartbeat_setting
    assert heartbeat_setting(value, (0.3, 6)) == expected


def test_the_heartbeat_setting_is_in_range_or_refused_for_any_text():
    from hypothesis import given, strategies as st

    from mslaunch.errors import UsageError
    from mslaunch.switches import heartbeat

    @given(st.one_of(st.text(max_size=12), st.from_regex(r"-?[0-9.e+]{1,6}(,[0-9+-]{0,5})?",
                                                         fullmatch=True)))
    def check(text):
        try:
            got = heartbeat(text)
        except UsageError as err:
            assert "\n" not in str(err)
            return
        if not text:
            assert got is None
            return
        interval, misses = got
        assert 0.01 <= interval <= 3600 and (misses is None or 1 <= misses <= 1000)
        assert text.isascii() and text.strip() == text
    check()
