"""Restarts that hold, on the SSH test hosts: spares are hosts too (a hung or
unreachable one is left out with one line), a host lost as a restart starts is
left out and the restart goes on, and the launcher's own pause (SIGSTOP, Ctrl-Z)
is not blamed on the hosts."""

from __future__ import annotations

import json
import os
import signal
import re
import subprocess
import sys
import time

import pytest

from helpers import PY, StderrLines, cmd, kill_tagged, new_tag, program, tagged_pids, wait_for
from remote import agents, renv, settle

pytestmark = pytest.mark.remote

#: A rank that writes DIR/up.RANK.ATTEMPT, then in the first attempt waits for
#: DIR/trigger, when rank 1 exits 5; later attempts run SECONDS and say so.
RANK = r"""
dir=$1; seconds=$2
echo $$ > "$dir/up.$RANK.$MSLAUNCH_RESTART_COUNT"
if [ "$MSLAUNCH_RESTART_COUNT" = 0 ]; then
  while [ ! -e "$dir/trigger" ]; do sleep 0.02; done
  [ "$RANK" = 1 ] && exit 5
  sleep 600
fi
sleep "$seconds"; echo "done $RANK $(hostname)"
"""


def _job(sshbed, tmp_path, hosts, *extra, seconds="1", restarts="2", env=None):
    home = sshbed.make_home(tmp_path / "home")
    tag = new_tag()
    argv = cmd("--max-restarts", restarts, "--report-json", str(tmp_path / "report.json"),
               "-H", hosts, "-n", "4", "-x", "MSL_TEST_TAG", *extra, "sh", "-c", RANK, "rank",
               str(tmp_path), seconds)
    p = subprocess.Popen(argv, env=renv(home, MSL_TEST_TAG=tag, **(env or {})),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return p, tag


def _up(tmp_path, attempt: int = 0, ranks=range(4)) -> bool:
    return all((tmp_path / f"up.{r}.{attempt}").exists() for r in ranks)


def _agent(sshbed, host) -> int:
    found = agents(sshbed, host, watchdogs=False)
    assert len(found) == 1, found
    return found[0]


def _end(p, tag, sshbed, stopped=()):
    try:
        out, err = p.communicate(timeout=180)
    finally:
        for pid in stopped:
            try:
                os.kill(pid, signal.SIGCONT)
            except OSError:
                pass
        p.kill()
        p.communicate()
    try:
        settle(tag, sshbed, timeout=30)
    finally:
        kill_tagged(tag)
    return p.returncode, out.decode(), err.decode()


def _attempts(tmp_path):
    return json.loads((tmp_path / "report.json").read_text())["attempts"]


def test_a_kept_agent_runs_every_attempt_in_its_one_cgroup(sshbed, tmp_path):
    # The agent that stays for the next attempt keeps its one guard: its ranks'
    # cgroup is the same in every attempt, and not one inside another's.
    home = sshbed.make_home(tmp_path / "home")
    tag = new_tag()
    try:
        r = subprocess.run(cmd("--max-restarts", "1", "-H", "h1:2", "-n", "2", "-x",
                               "MSL_TEST_TAG", sys.executable, program("cgroup_attempts.py"),
                               str(tmp_path)),
                           env=renv(home, MSL_TEST_TAG=tag), capture_output=True, timeout=120)
        settle(tag, sshbed)
    finally:
        kill_tagged(tag)
    assert r.returncode == 0, r.stderr
    seen = {tuple(line.split()[:2]): line.split()[3] for line in r.stdout.decode().splitlines()}
    assert sorted(seen) == [("0", "0"), ("0", "1"), ("1", "0"), ("1", "1")], r.stdout
    assert len(set(seen.values())) == 1, seen
    assert next(iter(seen.values())).count("/mslaunch-") == 1, seen     # (none: no guard)


def test_a_hosts_agent_leaves_its_cgroup_while_its_ranks_run(sshbed, tmp_path):
    # ... and comes back before it starts the next attempt's (the agent's
    # guard, mslaunch.machine.cgroups)
    home = sshbed.make_home(tmp_path / "home")
    tag = new_tag()
    try:
        r = subprocess.run(cmd("--max-restarts", "1", "-H", "h1", "-n", "1", "-x",
                               "MSL_TEST_TAG", "sh", program("cgroup_outside.sh")),
                           env=renv(home, MSL_TEST_TAG=tag), capture_output=True, timeout=120)
        settle(tag, sshbed)
    finally:
        kill_tagged(tag)
    assert r.returncode == 0, r.stderr
    lines = [line.split() for line in r.stdout.decode().splitlines()]
    assert [line[0] for line in lines] == ["0", "1"], r.stdout
    assert lines[0][1].count("/mslaunch-") == 1, r.stdout
    for _, rank, agent in lines:
        assert rank == lines[0][1] and agent != rank, r.stdout


def test_an_unreachable_host_that_gets_no_rank_is_left_out_with_one_line(sshbed, tmp_path):
    sshbed.require_netns("a host whose link is down")
    home = sshbed.make_home(tmp_path / "home")
    hosts = tmp_path / "hosts"
    hosts.write_text("h1 slots=2\nh2 slots=2\nh3 slots=2\n")
    tag = new_tag()
    sshbed.link_down("h3")
    try:
        r = subprocess.run(cmd("-n", "4", "--hostfile", str(hosts), "hostname"),
                           capture_output=True, timeout=120, env=renv(home, MSL_TEST_TAG=tag))
    finally:
        sshbed.link_up("h3")
        kill_tagged(tag)
    err = r.stderr.decode()
    assert r.returncode == 0, err
    assert sorted(r.stdout.decode().split()) == ["h1", "h1", "h2", "h2"], r.stdout
    said = [line for line in err.splitlines() if "h3" in line]
    assert len(said) >= 1 and said[-1].startswith("mslaunch: h3: cannot start the agent (") \
        and said[-1].endswith("); no rank goes there, so the job goes on without it"), err


@pytest.mark.parametrize("mpi", ["pmi", "none"])
def test_a_spare_that_does_not_answer_never_delays_the_start_and_joins_when_it_does(
        sshbed, tmp_path, mpi):
    # h3 gets no rank and its sshd is stopped: it accepts connections and says
    # nothing.  The ranks start on h1 and h2 while h3 is still silent (waiting for
    # it, --ssh-timeout 300 would hold the start for minutes); once its sshd runs
    # again h3's agent joins as a spare, and the restart after h2 is lost runs
    # h2's ranks there.
    sshd = sshbed.host("h3").pid
    assert sshd
    os.kill(sshd, signal.SIGSTOP)
    try:
        p, tag, lines = _run_reading(sshbed, tmp_path, "h1:2,h2:2,h3:2", "--ssh-timeout", "300",
                                     "--mpi", mpi, "-v", restarts="1")
        try:
            assert wait_for(lambda: _up(tmp_path) or p.poll() is not None, 90)
        finally:
            os.kill(sshd, signal.SIGCONT)
        assert p.poll() is None and _up(tmp_path)
        assert wait_for(lambda: lines.said("h3: agent started beside the job"), 60)
        os.kill(_agent(sshbed, "h2"), signal.SIGKILL)
    finally:
        os.kill(sshd, signal.SIGCONT)
        code, out, err = _finish_reading(p, tag, sshbed, lines)
    assert code == 0, err
    assert sorted(out.splitlines()) == ["done 0 h1", "done 1 h1", "done 2 h3", "done 3 h3"], err
    assert "h3: cannot start" not in err and "lost spare host h3" not in err, err
    attempts = _attempts(tmp_path)
    assert attempts[-1]["hosts"] == ["h1", "h3"], attempts


#: Rank 1 of the first attempt fails once every rank is up; the others take no
#: SIGTERM in it until DIR/go is there.
HOLD = r"""
dir=$1
echo $$ > "$dir/up.$RANK.$MSLAUNCH_RESTART_COUNT"
if [ "$MSLAUNCH_RESTART_COUNT" = 0 ]; then
    if [ "$RANK" = 1 ]; then
        until [ "$(ls "$dir" | grep -c '^up\..\.0$')" = 4 ]; do sleep 0.05; done
        exit 4
    fi
    trap '' TERM
    until [ -e "$dir/go" ]; do sleep 0.05; done
    exit 0
fi
echo "done $RANK $(hostname)"
"""


@pytest.mark.timeout(300)          # two waits of up to 90 s, each with its own message
def test_a_spare_that_answers_while_the_job_stops_is_said_started_and_kept(sshbed, tmp_path):
    # h3's sshd is stopped until the first attempt has failed; its agent answers
    # while the ranks still hold the job's stop: said started (-v), kept, and in the
    # next attempt at once.
    sshd = sshbed.host("h3").pid
    assert sshd
    os.kill(sshd, signal.SIGSTOP)
    try:
        p, tag, lines = _run_reading(sshbed, tmp_path, "h1:2,h2:2,h3:2", "--ssh-timeout", "300",
                                     "--grace", "300", "-v", restarts="1", script=HOLD)
        try:
            assert wait_for(lambda: lines.said("mslaunch: the job ends: failure") or
                            p.poll() is not None, 90), lines.text()
        finally:
            os.kill(sshd, signal.SIGCONT)
        assert wait_for(lambda: lines.said("h3: agent started as the job stopped") or
                        p.poll() is not None, 90), lines.text()
        (tmp_path / "go").touch()
    finally:
        os.kill(sshd, signal.SIGCONT)
        (tmp_path / "go").touch()
        code, out, err = _finish_reading(p, tag, sshbed, lines)
    assert code == 0, err
    assert sorted(out.splitlines()) == [f"done {r} h{1 + r // 2}" for r in range(4)], err
    said = [line for line in err.splitlines() if line.startswith("mslaunch: h3: agent ")]
    assert said == ["mslaunch: h3: agent started as the job stopped (a spare host: kept for "
                    "the next attempt)", "mslaunch: h3: agent kept from the attempt before"], err


@pytest.mark.parametrize("mpi", ["pmi", "none"])
def test_a_hung_spare_is_left_out_and_the_job_starts_again_without_it(sshbed, tmp_path, mpi):
    # h3 is a spare: with MPI its agent stands by for spawned jobs, without it waits
    # for a later attempt; either way, stopped (SIGSTOP) it must not hold the restart.
    p, tag, lines = _run_reading(sshbed, tmp_path, "h1:2,h2:2,h3:2", "--mpi", mpi, "-v")
    stopped = []
    try:
        assert wait_for(lambda: _up(tmp_path), 90)
        # (a spare's agent starts beside the job, and joins it)
        assert wait_for(lambda: lines.said("h3: agent started beside the job"), 60)
        stopped.append(_agent(sshbed, "h3"))
        os.kill(stopped[0], signal.SIGSTOP)
        (tmp_path / "trigger").touch()
    finally:
        code, out, err = _finish_reading(p, tag, sshbed, lines, stopped)
    assert code == 0, err
    assert sorted(out.splitlines()) == [f"done {r} h{1 + r // 2}" for r in range(4)], out
    assert "lost spare host h3" in err, err
    first, second = _attempts(tmp_path)
    assert second["hosts"] == ["h1", "h2"], (first, second)


def test_a_host_lost_as_the_restart_starts_is_left_out_and_the_restart_goes_on(sshbed,
                                                                              tmp_path):
    # h2 goes (its agent killed) and h3, a spare, hangs (stopped): the restart moves
    # h2's ranks to h3, finds it does not answer, and runs them on h4 instead.
    p, tag, lines = _run_reading(sshbed, tmp_path, "h1:2,h2:2,h3:2,h4:2", "-v", restarts="1")
    stopped = []
    try:
        assert wait_for(lambda: _up(tmp_path), 90)
        # (the spares' agents start beside the job, and join it)
        assert wait_for(lambda: lines.said("h3: agent started beside the job")
                        and lines.said("h4: agent started beside the job"), 60)
        stopped.append(_agent(sshbed, "h3"))
        os.kill(stopped[0], signal.SIGSTOP)
        os.kill(_agent(sshbed, "h2"), signal.SIGKILL)
    finally:
        code, out, err = _finish_reading(p, tag, sshbed, lines, stopped)
    assert code == 0, err
    assert sorted(out.splitlines()) == ["done 0 h1", "done 1 h1", "done 2 h4", "done 3 h4"], err
    assert "no restart left" not in err and "restart 1 of 1" in err, err
    attempts = _attempts(tmp_path)
    assert attempts[-1]["hosts"] == ["h1", "h4"], attempts
    assert {"h2", "h3"} <= set(attempts[-1]["left_out"]), attempts


def test_a_pause_of_the_launcher_is_not_blamed_on_the_hosts(sshbed, tmp_path):
    # Longer than the heartbeat of a restartable job (1.8 s): the agents give up on
    # the launcher and end their ranks; no host is left out, the job runs again.
    p, tag = _job(sshbed, tmp_path, "h1:2,h2:2", seconds="3")
    try:
        assert wait_for(lambda: _up(tmp_path), 90)
        p.send_signal(signal.SIGSTOP)
        time.sleep(2.5)             # the pause itself, not a wait for an event
        p.send_signal(signal.SIGCONT)
        (tmp_path / "trigger").touch()
    finally:
        code, out, err = _end(p, tag, sshbed)
    assert code == 0, err
    assert "lost host" not in err and "left out" not in err, err
    assert "mslaunch itself did not run for" in err, err
    attempts = _attempts(tmp_path)
    assert [a["hosts"] for a in attempts] == [["h1", "h2"], ["h1", "h2"]], attempts
    assert attempts[-1]["left_out"] == [], attempts


def _pausable(sshbed, tmp_path, **env):
    """A job of one rank on h1 and one on h2 that waits for ``tmp_path/go``, once both
    ranks are up: (the launcher, its tag, the ranks' pids)."""
    home = sshbed.make_home(tmp_path / "home")
    tag = new_tag()
    # One process per rank, which a stop shows as such: a shell's loop would vfork
    # its `sleep`, and a stop that came between the vfork and the exec leaves the
    # shell waiting for its stopped child in state D, not T.
    script = ("import os, sys, time\n"
              "d, rank = sys.argv[1], os.environ['RANK']\n"
              "with open(f'{d}/up.{rank}.tmp', 'w') as f: f.write(str(os.getpid()))\n"
              "os.rename(f'{d}/up.{rank}.tmp', f'{d}/up.{rank}')\n"
              "while not os.path.exists(f'{d}/go'): time.sleep(0.05)\n"
              "print('done', rank)\n")
    p = subprocess.Popen(cmd("-H", "h1:1,h2:1", "-n", "2", "-x", "MSL_TEST_TAG", PY, "-c",
                             script, str(tmp_path)),
                         env=renv(home, MSL_TEST_TAG=tag, **env), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    try:
        assert wait_for(lambda: all((tmp_path / f"up.{r}").exists() for r in (0, 1)), 90)
    except BaseException:
        _go_on(p, tag, sshbed, tmp_path)
        raise
    return p, tag, {int((tmp_path / f"up.{r}").read_text()) for r in (0, 1)}


def _go_on(p, tag, sshbed, tmp_path):
    """Let the job of :func:`_pausable` end (whatever a check found): its output."""
    (tmp_path / "go").touch()
    p.send_signal(signal.SIGCONT)
    code, out, err = _end(p, tag, sshbed)
    assert code == 0, err
    assert sorted(out.splitlines()) == ["done 0", "done 1"], (out, err)


def test_ctrl_z_of_the_launcher_stops_the_remote_ranks_and_fg_goes_on(sshbed, tmp_path):
    # Without restarts a host is lost after 5 s of silence: stopped for longer, the
    # agents wait for the launcher, their ranks stopped too.
    p, tag, pids = _pausable(sshbed, tmp_path)
    try:
        p.send_signal(signal.SIGTSTP)
        assert wait_for(lambda: _stopped(p.pid), 10)
        assert wait_for(lambda: {pid for pid in pids if _stopped(pid)} == pids, 10)
        time.sleep(6)              # the pause itself: longer than the 5 s heartbeat
    finally:
        _go_on(p, tag, sshbed, tmp_path)


def test_ctrl_z_waits_until_every_agent_has_heard_it(sshbed, tmp_path):
    # h2's agent cannot hear the Ctrl-Z for a while (stopped, as a starved one
    # is): the launcher does not stop before it has, and then h2's rank stops too.
    p, tag, pids = _pausable(sshbed, tmp_path, MSLAUNCH_HEARTBEAT="1,20")
    deaf = None
    try:
        deaf = _agent(sshbed, sshbed.hosts[1])
        os.kill(deaf, signal.SIGSTOP)
        p.send_signal(signal.SIGTSTP)
        time.sleep(3)              # the agent deaf for 3 s, longer than the launcher once waited
        assert not _stopped(p.pid)
        os.kill(deaf, signal.SIGCONT)
        deaf = None
        assert wait_for(lambda: _stopped(p.pid), 30)
        assert wait_for(lambda: {pid for pid in pids if _stopped(pid)} == pids, 10)
    finally:
        if deaf is not None:
            os.kill(deaf, signal.SIGCONT)
        _go_on(p, tag, sshbed, tmp_path)


def _stopped(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "T"
    except OSError:
        return False


def test_a_line_one_attempt_leaves_unfinished_is_ended_before_the_next_ones(sshbed,
                                                                           tmp_path):
    home = sshbed.make_home(tmp_path / "home")
    tag = new_tag()
    script = ('[ "$RANK" = 0 ] || exit 0; if [ "$MSLAUNCH_RESTART_COUNT" = 0 ]; then '
              'printf half; exit 3; fi; echo whole')
    r = subprocess.run(cmd("--max-restarts", "1", "-H", "h1:1,h2:1", "-n", "2", "-x",
                           "MSL_TEST_TAG", "sh", "-c", script),
                       capture_output=True, timeout=120, env=renv(home, MSL_TEST_TAG=tag))
    try:
        settle(tag, sshbed)
    finally:
        kill_tagged(tag)
    assert r.returncode == 0, r.stderr
    assert r.stdout == b"half\nwhole\n", r.stdout


def test_a_host_lost_after_the_failure_is_said_as_what_followed(sshbed, tmp_path):
    # Rank 2 (h2) is killed; its host's link is cut once the stop has reached it
    # (rank 3 there got SIGTERM, and ignores it): the summary names the kill, and
    # the host's loss is said as news that came after it.
    sshbed.require_netns("a host cut off")
    home = sshbed.make_home(tmp_path / "home")
    tag = new_tag()
    script = ('d=$0; if [ "$RANK" = 2 ]; then sleep 0.5; kill -9 $$; fi; '
              '[ "$RANK" = 3 ] && trap "touch $d/term.$RANK" TERM; '
              'while :; do sleep 0.05; done')
    p = subprocess.Popen(cmd("--grace", "10", "-H", "h1:2,h2:2", "-n", "4", "-x",
                             "MSL_TEST_TAG", "sh", "-c", script, str(tmp_path)),
                         env=renv(home, MSL_TEST_TAG=tag), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    try:
        assert wait_for(lambda: (tmp_path / "term.3").exists(), 90)
        sshbed.link_down("h2")
        code, out, err = _end(p, tag, sshbed)
    finally:
        sshbed.link_up("h2")
    assert code == 137, err
    lines = err.splitlines()
    summary = [line for line in lines if line.startswith("mslaunch: rank 2 (pid ")]
    assert summary and "was killed by signal 9 (SIGKILL)" in summary[0], err
    lost = [line for line in lines if "lost host h2" in line]
    assert lost and all(line.startswith("mslaunch: lost host h2 while the job was stopping: ")
                        for line in lost), err


def test_a_crashed_spare_node_of_a_slurm_allocation_is_left_out(slurmbeds, tmp_path):
    # The allocation's third node crashes before the job starts its agents (one
    # srun step on every node): srun fails the step on it; the job, which puts no
    # rank there, starts on the other two, as without the spare.
    from slurm import benv
    bed = slurmbeds.get(nodes=3)
    tag = new_tag()
    script = (f'touch {tmp_path}/granted; while [ ! -e {tmp_path}/go ]; do sleep 0.05; done; '
              f'exec "$@"')
    p = bed.popen(["salloc", "-N", "3", "--ntasks-per-node=2", "-Q", "sh", "-c", script, "sh",
                   *cmd("-n", "4", "hostname")], env=None, base_env=benv(bed, tag),
                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path)
    try:
        assert wait_for(lambda: (tmp_path / "granted").exists(), 60)
        bed.crash(3)
        (tmp_path / "go").touch()
        out, err = p.communicate(timeout=120)
        assert wait_for(lambda: tagged_pids(tag) == [], 30), tagged_pids(tag)
    finally:
        p.kill()
        p.communicate()
        kill_tagged(tag)
    text = err.decode()
    assert p.returncode == 0, text
    assert sorted(out.decode().split()) == ["h1", "h1", "h2", "h2"], (out, text)
    assert "mslaunch: h3: cannot start the agent (" in text and \
        "no rank goes there, so the job goes on without it" in text, text


def _run_reading(sshbed, tmp_path, hosts, *extra, seconds="1", restarts="2", script=RANK):
    home = sshbed.make_home(tmp_path / "home")
    tag = new_tag()
    argv = cmd("--max-restarts", restarts, "--report-json", str(tmp_path / "report.json"),
               "-H", hosts, "-n", "4", "-x", "MSL_TEST_TAG", *extra, "sh", "-c", script, "rank",
               str(tmp_path), seconds)
    p = subprocess.Popen(argv, env=renv(home, MSL_TEST_TAG=tag), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    return p, tag, StderrLines(p)


def _finish_reading(p, tag, sshbed, lines, stopped=()):
    try:
        out = p.stdout.read()
        p.wait(timeout=180)
    finally:
        for pid in stopped:
            try:
                os.kill(pid, signal.SIGCONT)
            except OSError:
                pass
        p.kill()
        p.wait()
    try:
        settle(tag, sshbed, timeout=30)
    finally:
        kill_tagged(tag)
    return p.returncode, out.decode(), lines.text()


def test_a_spare_that_hangs_while_the_job_runs_is_said_lost_and_not_waited_for(sshbed,
                                                                             tmp_path):
    p, tag, lines = _run_reading(sshbed, tmp_path, "h1:2,h2:2,h3:2", "-v")
    stopped = []
    try:
        assert wait_for(lambda: _up(tmp_path), 90)
        # the spare's agent starts beside the job, and joins it
        assert wait_for(lambda: lines.said("h3: agent started beside the job"), 60)
        stopped.append(_agent(sshbed, "h3"))
        os.kill(stopped[0], signal.SIGSTOP)
        # said while the job runs, as soon as its heartbeat is over
        assert wait_for(lambda: lines.said("lost spare host h3: no sign of life"), 60)
        (tmp_path / "trigger").touch()
    finally:
        code, out, err = _finish_reading(p, tag, sshbed, lines, stopped)
    assert code == 0, err
    assert sorted(out.splitlines()) == [f"done {r} h{1 + r // 2}" for r in range(4)], err
    first, second = _attempts(tmp_path)
    assert first["lost"] == ["h3"] and second["hosts"] == ["h1", "h2"], (first, second)
    assert "h3" in second["left_out"], second


#: Ranks that fail at once in the first two attempts (rank 1, after its peers are
#: up): the second restart comes after a back-off.
QUICK = r"""
dir=$1
echo $$ > "$dir/up.$RANK.$MSLAUNCH_RESTART_COUNT"
if [ "$MSLAUNCH_RESTART_COUNT" -lt 2 ] && [ "$RANK" = 1 ]; then sleep 0.3; exit 4; fi
sleep 1; echo "done $RANK $(hostname)"
"""


def test_a_host_that_hangs_during_a_back_off_is_left_out_and_the_spare_takes_its_ranks(
        sshbed, tmp_path):
    p, tag, lines = _run_reading(sshbed, tmp_path, "h1:2,h2:2,h3:2", "-v", restarts="3",
                                 script=QUICK)
    stopped = []
    try:
        assert wait_for(lambda: lines.said("mslaunch: a back-off of "), 120)
        stopped.append(_agent(sshbed, "h2"))
        os.kill(stopped[0], signal.SIGSTOP)
    finally:
        code, out, err = _finish_reading(p, tag, sshbed, lines, stopped)
    assert code == 0, err
    assert sorted(out.splitlines()) == ["done 0 h1", "done 1 h1", "done 2 h3", "done 3 h3"], err
    attempts = _attempts(tmp_path)
    assert attempts[-1]["hosts"] == ["h1", "h3"] and "h2" in attempts[-1]["left_out"], attempts


#: QUICK's rank 1 failing at once until DIR/go is there.
UNTIL_GO = QUICK.replace('[ "$MSLAUNCH_RESTART_COUNT" -lt 2 ]', '[ ! -e "$dir/go" ]')


@pytest.mark.timeout(400)          # two waits of up to 120 s, each with its own message
def test_a_spare_lost_during_a_back_off_is_said(sshbed, tmp_path):
    p, tag, lines = _run_reading(sshbed, tmp_path, "h1:2,h2:2,h3:2", "-v", restarts="9",
                                 script=UNTIL_GO)
    try:
        # The spare starts beside the job: on a busy machine, after a back-off or two.
        assert wait_for(lambda: any(re.match(r"mslaunch: .*h3.*: agent started", line)
                                    for line in list(lines.lines)), 120), "".join(lines.lines)
        backoffs = sum("mslaunch: a back-off of " in line for line in list(lines.lines))
        assert wait_for(lambda: sum("mslaunch: a back-off of " in line for line in
                                    list(lines.lines)) > backoffs, 120), "".join(lines.lines)
        os.kill(_agent(sshbed, "h3"), signal.SIGKILL)
        (tmp_path / "go").touch()
    finally:
        code, out, err = _finish_reading(p, tag, sshbed, lines)
    assert code == 0, err
    assert "mslaunch: lost spare host h3: " in err, err
    attempts = _attempts(tmp_path)
    assert any("h3" in a["lost"] for a in attempts), attempts
    # -v: an agent is said started once, and kept at each restart after
    agent = [line for line in err.splitlines() if line.startswith("mslaunch: h1: agent ")]
    assert len(agent) == len(attempts) and \
        agent[1:] == ["mslaunch: h1: agent kept from the attempt before"] * (len(agent) - 1), err


@pytest.mark.parametrize("how", ["SIGSTOP", "SIGTSTP"])
def test_a_pause_of_the_launcher_longer_than_its_agents_wait_leaves_no_host_out(
        sshbed, tmp_path, how):
    # During a back-off the waiting agents hear nothing from mslaunch: stopped for
    # longer than they wait (30 s), they give up -- but no host is left out for it.
    p, tag, lines = _run_reading(sshbed, tmp_path, "h1:2,h2:2", "-v", restarts="3",
                                 script=QUICK)
    try:
        assert wait_for(lambda: lines.said("mslaunch: a back-off of "), 120)
        p.send_signal(getattr(signal, how))
        assert wait_for(lambda: _stopped(p.pid), 10)
        time.sleep(32)              # the pause itself: longer than the agents wait
        p.send_signal(signal.SIGCONT)
    finally:
        code, out, err = _finish_reading(p, tag, sshbed, lines)
    assert code == 0, err
    assert sorted(out.splitlines()) == ["done 0 h1", "done 1 h1", "done 2 h2", "done 3 h2"], err
    assert "lost" not in err and "left out" not in err, err


def test_a_host_lost_during_the_health_check_is_said_once_and_left_out(sshbed, tmp_path):
    sshbed.require_netns("a host cut off")
    check = f'[ "$(hostname)" = h2 ] && {{ touch {tmp_path}/checking; sleep 120; }}; true'
    p, tag, lines = _run_reading(sshbed, tmp_path, "h1:2,h2:2,h3:2", "--health-check", check,
                                 restarts="1", script='echo "done $RANK $(hostname)"')
    try:
        assert wait_for(lambda: (tmp_path / "checking").exists(), 90)
        sshbed.link_down("h2")
        code, out, err = _finish_reading(p, tag, sshbed, lines)
    finally:
        sshbed.link_up("h2")
    assert code == 0, err
    assert sorted(out.splitlines()) == ["done 0 h1", "done 1 h1", "done 2 h3", "done 3 h3"], err
    said = [line for line in err.splitlines() if "h2" in line]
    assert len(said) == 2 and said[0].startswith("mslaunch: lost host h2: ") and \
        said[1] == "mslaunch: h2, lost during the --health-check, is left out", err
