"""Restarts that hold (--max-restarts): what a restarted job keeps of the first
attempt's guard, its bad input, its stop signals, its stdin and its --timeout,
on this machine.  The soak tests, which run for minutes after a restart, are in
test_soak.py; the remote cases in test_restarts.py."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

from requires import require
from helpers import PY, clean_env, kill_tagged, new_tag, program, run, start, wait_for
from soak import cgroups_of

def test_every_attempt_runs_in_the_one_cgroup_of_the_job_and_none_is_left(tmp_path):
    tag = new_tag()
    try:
        r = run("-v", "--max-restarts", "1", "-n", "2", PY, program("cgroup_attempts.py"),
                str(tmp_path), env=clean_env(MSL_TEST_TAG=tag), timeout=60)
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
        assert wait_for(lambda: cgroups_of(launcher) == [], 10), cgroups_of(launcher)
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


#: A rank that fails in the first attempt and, in the next, notes its pid and waits.
_SECOND_WAITS = ("import os, sys, time\n"
                 "if os.environ['MSLAUNCH_RESTART_COUNT'] == '0':\n"
                 "    sys.exit(3)\n"
                 "with open(os.path.join(sys.argv[1], 'pid.' + os.environ['RANK']), 'w') as f:\n"
                 "    f.write(str(os.getpid()))\n"
                 "time.sleep(60)\n")


def test_the_dumps_of_one_attempt_are_gone_when_the_next_runs_and_their_folder_at_the_end(
        tmp_path):
    # Each Python rank's hook opens its dump file (PID.txt) in the launcher's
    # dumps folder; the folder stays for the next attempt's ranks, its guard's
    # watchdog removes it once the job is over.
    from mslaunch.machine.procs import private_dir
    tag = new_tag()
    p = start("--max-restarts", "1", "-n", "2", PY, "-c", _SECOND_WAITS, str(tmp_path),
              env=clean_env(MSL_TEST_TAG=tag))
    try:
        assert wait_for(lambda: all((tmp_path / f"pid.{r}").exists() and
                                    (tmp_path / f"pid.{r}").read_text() for r in range(2)), 60)
        base = private_dir()
        assert base is not None
        dumps = os.path.join(base, f"{os.uname().nodename}.{p.pid}.py")
        pids = sorted(f"{(tmp_path / f'pid.{r}').read_text()}.txt" for r in range(2))
        assert sorted(n for n in os.listdir(dumps) if n.endswith(".txt")) == pids
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=30)
        assert wait_for(lambda: not os.path.exists(dumps), 15), os.listdir(dumps)
    finally:
        p.kill()
        kill_tagged(tag)


# -- bad input ----------------------------------------------------------------------

@pytest.mark.parametrize("value", [" 3", "+3", "3 ", "\u0663", "1_0", "0x3", ""])
def test_a_count_of_restarts_that_is_not_plain_digits_is_refused(value):
    r = run("--max-restarts", value, "-n", "1", "true")
    assert r.returncode == 2, r.stderr
    assert r.stderr.count(b"\n") == 1 and b"--max-restarts: expected a whole number" in r.stderr


@pytest.mark.parametrize("value", ["abc", "0,0", "-1,5", "nan,3", "inf", "1,x", "1,0", " 1",
                                   "0.001", "1,5,6", "\u0661,5", "0.01,1", "0.05"])
def test_a_bad_heartbeat_setting_is_one_clear_error(value):
    r = run("-n", "1", "true", env=clean_env(MSLAUNCH_HEARTBEAT=value))
    assert r.returncode == 2, r.stderr
    assert r.stderr.count(b"\n") == 1, r.stderr
    assert r.stderr.startswith(b"mslaunch: error: MSLAUNCH_HEARTBEAT="), r.stderr


@pytest.mark.parametrize("value, expected", [("0.5,3", (0.5, 3)), ("2", (2.0, 6)),
                                             ("1e-1,10", (0.1, 10)), ("", (0.3, 6))])
def test_good_heartbeat_settings(value, expected):
    from mslaunch.wire.endpoint import heartbeat_setting
    assert heartbeat_setting(value, (0.3, 6)) == expected


def test_the_heartbeat_setting_is_in_range_or_refused_for_any_text():
    from hypothesis import given, strategies as st

    from mslaunch.core.errors import UsageError
    from mslaunch.core.switches import heartbeat

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
        assert interval * (misses or 5) >= 0.5
        assert text.isascii() and text.strip() == text
    check()


# -- stop signals, --timeout and stdin across attempts -------------------------------

def _report(path) -> dict:
    import json
    return json.loads(path.read_text())


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_stop_during_a_back_off_ends_the_job_with_one_line_and_its_code(tmp_path, sig):
    # Every attempt fails at once: from the second restart on, a back-off comes first.
    tag = new_tag()
    p = start("-v", "--max-restarts", "5", "--report-json", str(tmp_path / "r.json"), "-n",
              "1", "sh", "-c", "exit 3", env=clean_env(MSL_TEST_TAG=tag))
    try:
        while True:      # until the first back-off (before the second restart) begins
            line = p.stderr.readline()
            assert line, "no back-off"
            if line.startswith(b"mslaunch: a back-off of "):
                break
        p.send_signal(sig)
        _, err = p.communicate(timeout=60)
    finally:
        p.kill()
        p.communicate()
        kill_tagged(tag)
    text = err.decode()
    assert p.returncode == 128 + sig, text
    assert text.splitlines()[-1] == (f"mslaunch: stopped by {signal.Signals(sig).name} during "
                                     f"the back-off before restart 2; the job ends"), text
    assert "Traceback" not in text
    assert _report(tmp_path / "r.json")["exit_code"] == 128 + sig


def test_timeout_is_the_whole_jobs_across_its_attempts(tmp_path):
    r = run("--timeout", "3", "--max-restarts", "50", "--report-json", str(tmp_path / "r.json"),
            "-n", "2", "sh", "-c", "sleep 1; exit 3", timeout=120)
    err = r.stderr.decode()
    assert r.returncode == 110, err
    assert "job timed out after 3 s (--timeout)" in err, err
    # 1 s each (with a back-off from the third on), within 3 s: 4 attempts at most
    attempts = _report(tmp_path / "r.json")["attempts"]
    assert 1 <= len(attempts) <= 4, attempts


def test_a_restarted_job_reads_end_of_file_and_says_so(tmp_path):
    data = b"".join(b"%d\n" % i for i in range(200000))
    script = ('if [ "$MSLAUNCH_RESTART_COUNT" = 0 ]; then head -n 1000 >/dev/null; exit 3; fi; '
              'wc -c')
    r = run("--max-restarts", "1", "-n", "1", "sh", "-c", script, input=data, timeout=60)
    err = r.stderr.decode()
    assert r.returncode == 0, err
    assert r.stdout == b"0\n", r.stdout
    assert "mslaunch: stdin goes to the first attempt only: the restarted job's ranks read " \
           "end-of-file" in err, err


def test_a_line_one_attempt_leaves_unfinished_is_ended_before_the_next_ones(tmp_path):
    script = ('if [ "$MSLAUNCH_RESTART_COUNT" = 0 ]; then printf "half"; exit 3; fi; '
              'echo whole')
    r = run("--max-restarts", "1", "--health-check", "printf checked", "-n", "1", "sh", "-c",
            script, timeout=60)
    assert r.returncode == 0, r.stderr
    # every source's unfinished line is ended before another's: the check's, the
    # first attempt's, the check's again
    assert r.stdout.split(b"\n") == [b"checked", b"half", b"checked", b"whole", b""], r.stdout


# -- the health check ----------------------------------------------------------------

def test_the_health_check_gets_the_jobs_environment_and_directory_but_no_rank(tmp_path):
    wdir = tmp_path / "w"
    wdir.mkdir()
    check = 'echo "X=$X dir=$(pwd) rank=${OMPI_COMM_WORLD_RANK-none}${RANK-}${PMI_RANK-}"'
    r = run("--health-check", check, "-x", "X=5", "-wdir", str(wdir), "-n", "1", "true",
            timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"X=5 dir={wdir} rank=none\n".encode(), r.stdout


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_during_the_health_check_is_a_stop_not_the_hosts_failure(tmp_path, sig):
    tag = new_tag()
    p = start("--max-restarts", "2", "--health-check", f"touch {tmp_path}/in; sleep 60",
              "-n", "1", "true", env=clean_env(MSL_TEST_TAG=tag))
    try:
        assert wait_for(lambda: (tmp_path / "in").exists(), 60)
        p.send_signal(sig)
        _, err = p.communicate(timeout=60)
    finally:
        p.kill()
        p.communicate()
        kill_tagged(tag)
    text = err.decode()
    assert p.returncode == 128 + sig, text
    assert "failed on" not in text and "no host is left" not in text, text
    assert text.splitlines()[-1] == (f"mslaunch: stopped by {signal.Signals(sig).name} during "
                                     f"the --health-check; the job ends"), text
    if sig == signal.SIGINT:          # (a health check's commands are no ranks)
        assert "mslaunch: SIGINT: stopping the health check (--health-check); press Ctrl-C " \
            "again to kill it\n" in text, text


def test_timeout_counts_the_health_check_too(tmp_path):
    r = run("--timeout", "3", "--max-restarts", "2", "--health-check", "sleep 100", "-n", "1",
            "true", timeout=120)
    err = r.stderr.decode()
    assert r.returncode == 110, err
    assert err.splitlines()[-1] == ("mslaunch: job timed out after 3 s (--timeout), during the "
                                    "--health-check; exit status 110"), err
    assert "failed on" not in err, err


def test_a_health_check_that_never_ends_is_said_as_such(tmp_path):
    r = run("--health-check", "sleep 600", "-n", "1", "true", timeout=180)
    err = r.stderr.decode()
    lines = err.splitlines()
    assert r.returncode == 1, err
    assert lines[0].startswith("mslaunch: --health-check did not end within 60 s on "), err
    assert "--timeout" not in err and "exit status 110" not in err, err
    assert lines[1].startswith("mslaunch: --health-check failed on ") and \
        lines[1].endswith("the host is left out"), err


# -- Ctrl-Z ----------------------------------------------------------------------------

def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def test_ctrl_z_stops_the_ranks_with_the_launcher_and_fg_goes_on(tmp_path):
    tag = new_tag()
    p = start("-n", "2", PY, "-c", "import os, sys, time\n"
              f"open('{tmp_path}/up.' + os.environ['RANK'], 'w').write(str(os.getpid()))\n"
              "while not os.path.exists(sys.argv[1]): time.sleep(0.01)\n"
              "print('done', os.environ['RANK'], flush=True)\n",
              str(tmp_path / "go"), env=clean_env(MSL_TEST_TAG=tag))
    try:
        ups = [tmp_path / f"up.{r}" for r in (0, 1)]
        assert wait_for(lambda: all(up.exists() and up.read_text() for up in ups), 60)
        ranks = [int(up.read_text()) for up in ups]
        p.send_signal(signal.SIGTSTP)
        assert wait_for(lambda: _state(p.pid) == "T", 10)
        assert wait_for(lambda: all(_state(pid) == "T" for pid in ranks), 10)
        (tmp_path / "go").touch()
        p.send_signal(signal.SIGCONT)
        out, err = p.communicate(timeout=60)
    finally:
        p.kill()
        p.communicate()
        kill_tagged(tag)
    assert p.returncode == 0, err
    assert sorted(out.split(b"\n")) == [b"", b"done 0", b"done 1"], out


# -- the private directory of the control socket --------------------------------------

def test_a_private_directory_another_user_made_first_is_said_and_avoided(tmp_path, own_tmpdir):
    require(os.getuid() == 0, "root, to make a directory of another user's")
    taken = own_tmpdir / f"mslaunch-{os.getuid()}"
    taken.mkdir()
    os.chown(taken, 65534, 65534)
    taken.chmod(0o777)
    home = own_tmpdir / "home"       # (a short path: the socket's must fit in 108 bytes)
    home.mkdir()
    tag = new_tag()
    env = clean_env(MSL_TEST_TAG=tag, HOME=str(home), TMPDIR=str(own_tmpdir))
    env.pop("XDG_RUNTIME_DIR", None)
    # The first attempt fails (once its rank has noted it ran): the warning is
    # said once for the job, not again by its second attempt.
    first = own_tmpdir / "first"
    p = start("--max-restarts", "1", "-n", "1", PY, "-c",
              "import os, sys, time\nif not os.path.exists(sys.argv[1]):\n"
              "    open(sys.argv[1], 'w').close()\n    sys.exit(3)\n"
              "print('up', flush=True)\ntime.sleep(60)", str(first), env=env)
    try:
        assert p.stdout.readline() == b"up\n"
        stacks = subprocess.run([PY, "-c", "import sys; from mslaunch.cli.stacks import main; "
                                 "sys.exit(main())"], capture_output=True,
                                env=env, timeout=60)
        assert stacks.returncode == 0, stacks.stderr
        assert b"rank 0 on" in stacks.stdout, stacks.stdout
    finally:
        p.terminate()
        _, err = p.communicate(timeout=60)
        kill_tagged(tag)
    warning = (f"mslaunch: warning: {taken} is not this user's alone (owner uid 65534, mode "
               f"0777): this job's control socket is in {home}/.cache/mslaunch/").encode()
    assert err.count(warning) == 1, err
    assert b"restart" in err, err
