"""A spare node of a Slurm allocation that fails while the job runs is left out,
and the job goes on: its agent's end does not end the agents of the other nodes
(srun starts them all in one step, with ``--no-kill``), whether the agent gave up
on a link that was down a moment or Slurm itself found the node dead."""

from __future__ import annotations

import pytest

from helpers import PY, StderrLines, kill_tagged, new_tag, tagged_pids, wait_for
from slurm import finish, finish_read, salloc
from soak import LONG_TRAIN, MINUTES_3, PERIOD, attempts, launcher_of, nothing_left, result

pytestmark = [pytest.mark.remote, pytest.mark.timeout(600)]


def _reached(out) -> int:
    """The step long_train.py's checkpoint holds (0 before the first)."""
    try:
        return int((out / "checkpoint").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def _train(bed, tmp_path, steps: int, options=()):
    """``long_train.py`` on 4 ranks of a 3-node allocation (h3 gets none: the
    spare), with 2 restarts; (process, tag, out dir, stderr)."""
    out = tmp_path / "out"
    out.mkdir()
    tag = new_tag()
    p = salloc(bed, tag, "--max-restarts", "2", "--report-json", str(tmp_path / "r.json"),
               "-n", "4", PY, LONG_TRAIN, str(out), str(steps), str(PERIOD), nodes=3,
               options=options, cwd=tmp_path)
    return p, tag, out, StderrLines(p)


def _lose_spare(bed, p, tag, out, lines, fault, then) -> int:
    """Once the job has done 4 steps, ``fault`` (h3); wait until mslaunch has left
    h3 out and ``then()`` holds; the step the job had reached then."""
    try:
        assert wait_for(lambda: _reached(out) >= 4, 120), lines.lines
        fault(3)
        assert wait_for(lambda: lines.said("mslaunch: lost spare host h3: "), 60), lines.lines
        assert wait_for(then, 180, interval=0.5), (bed.node_states(), bed.task_pids(3))
        return _reached(out)
    except BaseException:
        p.kill()
        kill_tagged(tag)
        raise


def _ended(p, tag, tmp_path, lines, timeout: float):
    """The job's (exit status, stdout, stderr), once nothing of it is left."""
    try:
        code, stdout, err = finish_read(p, lines, timeout=timeout)
        nothing_left(tag, launcher_of(tmp_path / "r.json"))
    finally:
        p.kill()
        p.communicate()
        kill_tagged(tag)
    return code, stdout, err


def _ended_right(p, tag, tmp_path, lines, steps: int) -> None:
    code, stdout, err = _ended(p, tag, tmp_path, lines, steps * PERIOD + 300)
    assert code == 0, err
    assert stdout.strip() == result(steps).decode(), (stdout, err)
    (only,) = attempts(tmp_path / "r.json")          # no restart was needed
    assert only["exit_code"] == 0 and only["lost"] == ["h3"], (only, err)
    assert only["hosts"] == ["h1", "h2"], (only, err)


def test_a_spare_node_whose_link_was_down_a_moment_does_not_end_the_job(slurmbeds, mpich,
                                                                         tmp_path):
    # The spare's agent hears nothing from the launcher, gives up and exits 1
    # while its link is down; once the link is back, srun learns of that exit.
    # With --kill-on-bad-exit srun then ended the agents on h1 and h2 too.  The
    # site's own settings would do the same (KillOnBadExit, or WaitTime: end
    # the step 5 s after a task ended); the agents' step overrides them.
    bed = slurmbeds.get(nodes=3, extra_conf=["KillOnBadExit=1", "WaitTime=5"])
    steps = 60
    p, tag, out, lines = _train(bed, tmp_path, steps)
    reached = _lose_spare(bed, p, tag, out, lines, bed.linkdown,
                          lambda: bed.task_pids(3) == [])       # its agent gave up
    bed.linkup(3)
    # the job has 10 s still to run with the link back (srun heard of the exit at once)
    assert reached <= steps - 10 / PERIOD, (reached, lines.lines)
    _ended_right(p, tag, tmp_path, lines, steps)
    assert "the agent said: srun: cluster configuration" not in lines.text()


@pytest.mark.soak
def test_a_spare_node_slurm_finds_dead_is_left_out_and_the_job_runs_on(slurmbeds, mpich,
                                                                        tmp_path):
    # SlurmdTimeout=5: slurmctld marks the crashed spare down some 20 s on and ends
    # the job's steps on it.  The allocation has --no-kill (Slurm keeps the job);
    # the agents' step has it too, so only h3's task is ended, not the step.  The
    # job then runs for two more minutes and ends with the uninterrupted result.
    bed = slurmbeds.get(nodes=3, extra_conf=["SlurmdTimeout=5"])
    steps = MINUTES_3
    p, tag, out, lines = _train(bed, tmp_path, steps, options=("--no-kill",))
    reached = _lose_spare(bed, p, tag, out, lines, bed.crash,
                          lambda: bed.node_states().get("h3", "").startswith("down"))
    assert reached <= steps - 120 / PERIOD, (reached, lines.lines)
    _ended_right(p, tag, tmp_path, lines, steps)


def test_a_spare_node_whose_agent_ends_before_it_dials_back_is_left_out(slurmbeds, tmp_path):
    # h3's Python fails at once (a --remote-python that exits 3 there): srun goes
    # on with the step's other tasks and says the task ended; the job, which puts
    # no rank on h3, starts on h1 and h2 without waiting for h3 to dial back.
    bed = slurmbeds.get(nodes=3)
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\n[ "$SLURMD_NODENAME" = h3 ] && exit 3\nexec {PY} "$@"\n')
    python.chmod(0o755)
    tag = new_tag()
    p = salloc(bed, tag, "--remote-python", str(python), "-n", "4", "hostname", nodes=3,
               cwd=tmp_path)
    try:
        code, stdout, err = finish(p, timeout=120)
        assert wait_for(lambda: tagged_pids(tag) == [], 30), tagged_pids(tag)
    finally:
        p.kill()
        p.communicate()
        kill_tagged(tag)
    assert code == 0, err
    assert sorted(stdout.split()) == ["h1", "h1", "h2", "h2"], (stdout, err)
    assert "mslaunch: h3: cannot start the agent (" in err and \
        "its task: Exited with exit code 3" in err, err


def test_a_node_failure_in_an_allocation_without_no_kill_is_named_as_slurm_s_end(slurmbeds,
                                                                                 tmp_path):
    # Without --no-kill Slurm ends the whole allocation when a node fails: every
    # step, and salloc's command (mslaunch) by a signal, whatever --max-restarts
    # says.  The lost hosts and the stop are what the job sees; a line says,
    # once, that Slurm ended the allocation, and why.  (Slurm's own KillWait,
    # 30 s: what is left of the job is SIGKILLed that long after its signal.)
    bed = slurmbeds.get(nodes=3, extra_conf=["SlurmdTimeout=5", "KillWait=30"])
    p, tag, out, lines = _train(bed, tmp_path, 600)
    try:
        assert wait_for(lambda: _reached(out) >= 2, 120), lines.lines
        bed.crash(3)
        code, _, err = finish_read(p, lines, timeout=300)
        nothing_left(tag, launcher_of(tmp_path / "r.json"))
    finally:
        p.kill()
        p.communicate()
        kill_tagged(tag)
    assert code != 0, err
    said = [line for line in err.splitlines() if line.startswith("mslaunch: Slurm ended")]
    assert len(said) == 1 and said[0].startswith("mslaunch: Slurm ended the job's allocation "
                                                 "(job ") and \
        ": NODE_FAIL" in said[0] and "--no-kill" in said[0], err
