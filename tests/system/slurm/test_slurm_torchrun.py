"""torchrun's line under Slurm as batch scripts write it, one launcher per node
started by srun, side by side with torch's own torchrun on the same line:
``srun --ntasks-per-node=1 mslaunch --nnodes=$SLURM_NNODES --nproc-per-node=2
--rdzv-backend=c10d --rdzv-endpoint=$HEAD:PORT train.py``.  The cluster is the
Slurm test bed (:mod:`slurmbed`); each launcher runs on its node (h1, h2), the
endpoint is the allocation's first node by name."""

from __future__ import annotations

import os
import re
import signal
import subprocess

import pytest

from helpers import PY, cmd, kill_tagged, new_tag, program
from ports import spare_port
from requires import require
from slurm import benv, finish, left_on_nodes

# (jobs of torch ranks started twice: on a slow machine each import of torch takes seconds)
pytestmark = [pytest.mark.remote, pytest.mark.timeout(600)]

STEPS = program("torch_steps.py")
LINE = ("srun --ntasks-per-node=1 {launcher} --nnodes=$SLURM_NNODES --nproc-per-node=2 "
        "--rdzv-backend=c10d --rdzv-endpoint=$(scontrol show hostnames $SLURM_JOB_NODELIST | "
        "head -n 1):{port} --rdzv-id=$SLURM_JOB_ID {options} {script}")


@pytest.fixture
def torch_ok():
    import importlib.util
    require(importlib.util.find_spec("torch") is not None, "torch (pip install torch==2.13.0)")


def _job(bed, tmp_path, launcher, options: str = "", **env: str):
    tag = new_tag()
    ckpt = tmp_path / f"ckpt-{tag[:8]}"
    ckpt.mkdir()
    line = LINE.format(launcher=" ".join(launcher), port=spare_port(2),
                       options=options, script=STEPS)
    p = bed.popen(["salloc", "-N", "2", "--ntasks-per-node=1", "-Q", "sh", "-c", line],
                  env=None, base_env=benv(bed, tag, GLOO_SOCKET_IFNAME="eth0", CKPT=str(ckpt),
                                          MSLAUNCH_SECRET="slurm-torch", **env),
                  stdout=-1, stderr=-1)
    try:
        try:
            code, out, err = finish(p, timeout=300)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            kill_tagged(tag)
            o, e = p.communicate(timeout=30)
            raise AssertionError(f"{launcher[-1]} hung: {o.decode(errors='replace')} "
                                 f"{e.decode(errors='replace')}") from None
        assert not left_on_nodes(bed, tag)
    finally:
        kill_tagged(tag)
    return code, out, err


def test_srun_runs_the_torchrun_line_as_torchrun_does(slurmbed, tmp_path, torch_ok):
    theirs = _job(slurmbed, tmp_path, [PY, "-m", "torch.distributed.run"], STEPS="20")
    ours = _job(slurmbed, tmp_path, cmd(), STEPS="20")
    for code, out, err in (theirs, ours):
        assert code == 0, (out, err)
        assert "result 190" in out, (out, err)
        # (torchrun's workers share srun's pipe, unbuffered: their lines may
        # cut into each other; mslaunch passes on each worker's whole lines)
        starts = sorted(re.findall(r"rank \d+ of \d+ from step \d+ restart \d+", out))
        assert starts == [f"rank {r} of 4 from step 0 restart 0" for r in range(4)], (out, err)
    assert sorted(line for line in ours[1].splitlines() if line.startswith("rank ")) == starts


def test_under_srun_a_failure_restarts_every_node(slurmbed, tmp_path, torch_ok):
    code, out, err = _job(slurmbed, tmp_path, cmd(), "--max-restarts=1", STEPS="30",
                          FAIL_RANK="2", FAIL_AT="10")
    assert code == 0, (out, err)
    assert "result 435" in out, (out, err)
    assert sorted(line for line in out.splitlines() if "from step 10 restart 1" in line) == [
        f"rank {r} of 4 from step 10 restart 1" for r in range(4)], (out, err)


def test_a_one_node_line_in_an_allocation_runs_all_its_workers_here(slurmbed, tmp_path,
                                                                    torch_ok):
    # (the allocation's two nodes of one task each are not the workers' hosts:
    # a torchrun line's workers are the machine's it runs on)
    tag = new_tag()
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    p = slurmbed.popen(["salloc", "-N", "2", "--ntasks-per-node=1", "-Q", "srun", "-N", "1", "-n", "1",
                        *cmd("--standalone", "--nproc-per-node=3", STEPS)], env=None,
                       base_env=benv(slurmbed, tag, GLOO_SOCKET_IFNAME="eth0", CKPT=str(ckpt),
                                     STEPS="5"), stdout=-1, stderr=-1)
    try:
        code, out, err = finish(p, timeout=300)
    finally:
        kill_tagged(tag)
    assert code == 0, (out, err)
    assert sorted(line for line in out.splitlines() if line.startswith("rank ")) == [
        f"rank {r} of 3 from step 0 restart 0" for r in range(3)], (out, err)
