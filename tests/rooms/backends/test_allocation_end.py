"""Asking how a Slurm allocation stands never holds the job: the question is
asked without waiting, its answer read on the job's loop and said once; an
answer still out at the job's end gets a bounded time, and its process goes.

scontrol here is a stand-in script (no slurmctld in this room): it answers
what the test writes into its answer file, when the test lets it; the real
scontrol is asked in tests/system/slurm/test_slurm_spares.py.
"""

from __future__ import annotations

import os
import time

import pytest

from mslaunch.backends.allocationend import LAST_WAIT, AllocationEnd, allocation_end
from mslaunch.hosts.allocations.slurm import ended_because
from mslaunch.machine.loop import Loop

from helpers import wait_for

NODE_FAIL = "JobId=7 JobName=x JobState=NODE_FAIL Reason=NodeDown Dependency=(null)"
RUNNING = "JobId=7 JobName=x JobState=RUNNING Reason=None Dependency=(null)"


@pytest.fixture
def scontrol(tmp_path):
    """A stand-in scontrol: waits for ``go`` to exist, prints ``answerN`` for its
    Nth start (else ``answer``), and notes each start in ``asked`` (with its pid
    in ``pids``)."""
    script = tmp_path / "scontrol"
    script.write_text(f"""#!/bin/sh
echo "$*" >> {tmp_path}/asked
echo $$ >> {tmp_path}/pids
while [ ! -e {tmp_path}/go ]; do sleep 0.01; done
n=$(wc -l < {tmp_path}/asked)
cat {tmp_path}/answer$n 2>/dev/null || cat {tmp_path}/answer
""")
    script.chmod(0o755)
    return tmp_path


def _watch(folder, said):
    watch = AllocationEnd([str(folder / "scontrol"), "show", "job", "-o", "7"], "7",
                          ended_because)
    watch.say = said.append
    return watch


def _asked(folder) -> int:
    try:
        return len((folder / "asked").read_text().splitlines())
    except FileNotFoundError:
        return 0


def _gone(folder) -> bool:
    for pid in (folder / "pids").read_text().split():
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rpartition(")")[2].split()[0] != "Z":
                    return False
        except FileNotFoundError:
            pass
    return True


def test_the_answer_is_read_on_the_loop_and_said_once(scontrol):
    (scontrol / "answer").write_text(NODE_FAIL + "\n")
    said: list = []
    watch = _watch(scontrol, said)
    loop = Loop()
    try:
        watch.ask(loop)            # returns at once: the stand-in waits for "go"
        watch.ask(loop)            # a second question while one is out: none more
        assert wait_for(lambda: _asked(scontrol) == 1, 30)
        assert said == []
        (scontrol / "go").touch()
        deadline = time.monotonic() + 30
        while not said and time.monotonic() < deadline:
            loop.run_once(0.1)
        assert said == ["mslaunch: Slurm ended the job's allocation (job 7: NODE_FAIL, "
                        "NodeDown): a node failed, and the allocation was not made with "
                        "--no-kill (salloc -k, sbatch -k), which keeps the job when a node "
                        "fails"]
        watch.ask(loop)            # said: never asked again
        watch.finish(True)
        assert said[1:] == [] and _asked(scontrol) == 1
    finally:
        loop.close()
    assert wait_for(lambda: _gone(scontrol), 30)


def test_an_answer_of_no_end_asked_again_is_asked_again(scontrol):
    # The first loss may be seen before slurmctld marks the node down: the stop
    # signal asks again, once the answer out has come.
    (scontrol / "answer1").write_text(RUNNING + "\n")
    (scontrol / "answer2").write_text(NODE_FAIL + "\n")
    said: list = []
    watch = _watch(scontrol, said)
    loop = Loop()
    try:
        watch.ask(loop)
        watch.ask(loop)
        assert wait_for(lambda: _asked(scontrol) == 1, 30)
        (scontrol / "go").touch()
        deadline = time.monotonic() + 30
        while not said and time.monotonic() < deadline:
            loop.run_once(0.1)
        assert _asked(scontrol) == 2 and len(said) == 1 and "NODE_FAIL" in said[0]
    finally:
        loop.close()


def test_an_answer_still_out_at_the_end_gets_a_bounded_time_and_its_process_goes(scontrol):
    said: list = []
    watch = _watch(scontrol, said)
    loop = Loop()
    watch.ask(loop)
    loop.close()                   # the job's loop is over; no answer yet
    assert wait_for(lambda: _asked(scontrol) == 1, 30)
    began = time.monotonic()
    watch.finish(True)
    took = time.monotonic() - began
    assert said == [] and LAST_WAIT * 0.9 <= took < LAST_WAIT + 30
    assert wait_for(lambda: _gone(scontrol), 30)


def test_an_answer_that_comes_while_the_end_waits_is_said(scontrol):
    (scontrol / "answer").write_text(NODE_FAIL + "\n")
    said: list = []
    watch = _watch(scontrol, said)
    watch.finish(True)             # stopped, never asked: asks now
    assert said == []              # (the stand-in waited for "go" all the while)
    watch = _watch(scontrol, said)
    (scontrol / "go").touch()
    watch.finish(True)
    assert len(said) == 1 and "NODE_FAIL" in said[0]


def _answer_all(watch, loop, folder, asks: int) -> None:
    deadline = time.monotonic() + 30
    while _asked(folder) < asks and time.monotonic() < deadline:
        loop.run_once(0.05)


def test_every_lost_host_asks_and_a_job_that_lost_hosts_asks_once_more_at_its_end(scontrol):
    # The first hosts are often lost before Slurm knows (their heartbeat, not
    # slurmctld, tells first), and the job may end of their loss before Slurm's
    # signal comes: every loss asks, and the end asks once more.
    (scontrol / "answer").write_text(RUNNING + "\n")
    (scontrol / "answer6").write_text(NODE_FAIL + "\n")
    (scontrol / "go").touch()
    said: list = []
    watch = _watch(scontrol, said)
    loop = Loop()
    try:
        for n in range(1, 6):
            watch.ask(loop)
            _answer_all(watch, loop, scontrol, n)
            deadline = time.monotonic() + 30
            while watch._proc is not None and time.monotonic() < deadline:
                loop.run_once(0.05)
        assert _asked(scontrol) == 5 and said == []
    finally:
        loop.close()
    watch.finish(False)
    assert _asked(scontrol) == 6 and len(said) == 1 and "NODE_FAIL" in said[0]
    watch.finish(True)              # said: nothing more
    assert _asked(scontrol) == 6


def test_a_stop_whose_answer_told_of_no_end_is_not_asked_again_at_the_end(scontrol):
    (scontrol / "answer").write_text(RUNNING + "\n")
    (scontrol / "go").touch()
    said: list = []
    watch = _watch(scontrol, said)
    loop = Loop()
    try:
        watch.ask(loop, stop=True)
        _answer_all(watch, loop, scontrol, 1)
    finally:
        loop.close()
    watch.finish(True)
    assert _asked(scontrol) == 1 and said == []


def test_a_job_that_was_not_stopped_asks_nothing_at_its_end(scontrol):
    said: list = []
    _watch(scontrol, said).finish(False)
    assert _asked(scontrol) == 0 and said == []


def test_nothing_is_asked_outside_an_allocation_or_for_a_strange_job_id():
    assert allocation_end({}) is None
    assert allocation_end({"SLURM_JOB_ID": "7; rm -rf /", "SLURM_JOB_NODELIST": "h1"}) is None


def test_no_scontrol_is_nothing_to_say(tmp_path):
    said: list = []
    watch = AllocationEnd([str(tmp_path / "absent")], "7", ended_because)
    watch.say = said.append
    loop = Loop()
    try:
        watch.ask(loop)
        watch.finish(True)
    finally:
        loop.close()
    assert said == []
    assert os.listdir(tmp_path) == []
