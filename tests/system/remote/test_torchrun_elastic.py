"""torchrun's lines whose nodes start again together, one command per node on
the test bed's namespace hosts: ``--max-restarts`` across nodes and elastic
membership (``--nnodes MIN:MAX``): a lost node and a new one, over minutes
(a soak test), and below the minimum."""

from __future__ import annotations

import pytest

from helpers import wait_for
from torchnodes import Jobs, expected, torch_hosts

# (jobs of torch ranks started twice: on a slow machine each import of torch takes seconds)
pytestmark = [pytest.mark.remote, pytest.mark.timeout(600)]


@pytest.fixture
def nodes(sshbed):
    return torch_hosts(sshbed)


@pytest.fixture
def job_of(sshbed, tmp_path):
    with Jobs(sshbed, tmp_path) as make:
        yield make


@pytest.mark.parametrize("static", [False, True], ids=["c10d", "static"])
def test_a_failure_restarts_every_node_counted(nodes, job_of, static):
    # rank 3 (on the second node) fails at step 10 of the first attempt; with
    # --max-restarts 1 both nodes start again from the checkpoint
    job = job_of("2", "--max-restarts=1", STEPS="30", FAIL_RANK="3", FAIL_AT="10")
    a, b = job.start(nodes[0], static), job.start(nodes[1], static)
    codes = [a.end(240), b.end(240)]
    assert codes == [0, 0], job.texts()
    assert a.said(expected(30)), job.texts()
    for node in (a, b):
        assert node.said("restart 1 of 1 after a failure on"), job.texts()
        assert node.said("from step 10 restart 1"), job.texts()


def test_a_failure_with_no_restart_left_ends_every_node_with_its_code(nodes, job_of):
    job = job_of("2", "--max-restarts=1", STEPS="30", FAIL_RANK="3", FAIL_AT="5",
                 FAIL_TIMES="2")
    a, b = job.start(nodes[0]), job.start(nodes[1])
    codes = [a.end(240), b.end(240)]
    assert codes == [7, 7], job.texts()
    for node in (a, b):
        assert node.said("no restart left: 1 of 1 used"), job.texts()


@pytest.mark.soak
@pytest.mark.timeout(900)
def test_a_lost_node_leaves_the_job_on_the_others_and_a_new_one_joins(nodes, job_of):
    # 2:4 nodes; three start; one's link is cut mid-run: the job goes on on two
    # from its checkpoint (no restart counted); a fourth comes later and joins at
    # the next boundary; the job then runs on for minutes and ends with the
    # result of an uninterrupted run
    steps = 2400                                   # 0.05 s a step: about two minutes
    job = job_of("2:4", "--rdzv-conf=last_call_timeout=2", STEPS=str(steps))
    a, b, c = job.start(nodes[0]), job.start(nodes[1]), job.start(nodes[2])
    assert wait_for(lambda: job.step() >= 40, 120), job.texts()
    job.bed.link_down(nodes[2])
    assert wait_for(lambda: a.said("lost node") and a.said("round "), 60), job.texts()
    at = job.step()
    assert wait_for(lambda: job.step() >= at + 40, 60), job.texts()
    d = job.start(nodes[3])
    assert wait_for(lambda: d.said("from step"), 90), job.texts()
    assert c.end(60) == 255, job.texts()
    codes = [a.end(600), b.end(600), d.end(60)]
    assert codes == [0, 0, 0], job.texts()
    assert a.said(expected(steps)), job.texts()
    assert a.said("joined"), job.texts()
    # membership changes are not restarts: every worker's count stayed 0
    assert not any("restart 1" in line for n in (a, b, d) for line in n.lines
                   if line.startswith("rank")), job.texts()




def test_below_min_the_job_ends_with_one_line(nodes, job_of):
    job = job_of("2:3", "--rdzv-conf=last_call_timeout=1", STEPS="100000")
    a, b = job.start(nodes[0]), job.start(nodes[1])
    assert wait_for(lambda: job.step() >= 5, 120), job.texts()
    job.bed.link_down(nodes[1])
    assert a.end(60) == 255, job.texts()
    assert a.said("fewer than --nnodes' minimum 2"), job.texts()
    assert b.end(60) == 255, job.texts()
