"""A replay of Kubernetes' PyTorchJob (Kubeflow's training operator), whose
pods run ``torchrun train.py`` with the job's shape in their environment.

Kubernetes cannot run here; the stand-in reproduces the operator's side of the
contract exactly: one network namespace per pod, each with the pod's name
(``train-master-0``, ``train-worker-0``...) in the hosts file as cluster DNS
would answer it, no SSH between them, and the variables the operator's
``setPodEnv`` gives each pod's container: ``PYTHONUNBUFFERED=1``;
with a Master replica ``MASTER_ADDR``/``PET_MASTER_ADDR`` (the master pod's
name), ``MASTER_PORT``/``PET_MASTER_PORT`` (23456), ``WORLD_SIZE`` (replicas x
nproc), ``RANK`` and ``PET_NODE_RANK`` (the pod's index, the master's 0),
``PET_NNODES`` (replicas); ``PET_NPROC_PER_NODE``; with an elastic policy
instead ``PET_RDZV_ENDPOINT`` (the first worker's name and port),
``PET_RDZV_BACKEND=c10d``, ``PET_NNODES=MIN:MAX`` and ``PET_MAX_RESTARTS``.
The container's command is the same in both runs but for the launcher's name:
torch's torchrun, then mslaunch."""

from __future__ import annotations

import re
import subprocess
from typing import Dict, List

import pytest

from helpers import PY, clean_env, cmd, kill_tagged, new_tag, program, tagged_pids, wait_for
from netbed import NetBed, NetBedError
from requires import require

pytestmark = pytest.mark.remote

STEPS = program("torch_steps.py")
PODS = ("train-master-0", "train-worker-0", "train-worker-1")


@pytest.fixture(scope="module")
def pods(tmp_path_factory):
    import importlib.util
    require(importlib.util.find_spec("torch") is not None, "torch (pip install torch==2.13.0)")
    bed = NetBed(str(tmp_path_factory.mktemp("pods")), prefix_base="pj")
    bed.aliases = {f"p{i}": [name] for i, name in enumerate(PODS)}
    try:
        bed.create([(f"p{i}", 11 + i) for i in range(len(PODS))])
    except NetBedError as err:
        bed.teardown()
        require(False, f"network namespaces for the pods ({err})")
    yield bed
    bed.teardown()


def _pod_env(index: int, elastic: bool, tag: str, ckpt) -> Dict[str, str]:
    env = clean_env(MSL_TEST_TAG=tag, MSLAUNCH_SECRET="the-job's-secret", CKPT=str(ckpt),
                    STEPS="20", PYTHONUNBUFFERED="1", PET_NPROC_PER_NODE="2")
    env.pop("OMP_NUM_THREADS", None)
    if elastic:      # Worker replicas only, with an elastic policy
        env.update(PET_RDZV_ENDPOINT="train-worker-0:23456", PET_RDZV_BACKEND="c10d",
                   PET_NNODES="2:3", PET_MAX_RESTARTS="1")
    else:            # a Master and two Workers
        env.update(MASTER_ADDR=PODS[0], PET_MASTER_ADDR=PODS[0], MASTER_PORT="23456",
                   PET_MASTER_PORT="23456", WORLD_SIZE="6", RANK=str(index),
                   PET_NODE_RANK=str(index), PET_NNODES="3")
    return env


def _run_pods(bed, launcher: List[str], elastic: bool, tmp_path) -> List[tuple]:
    tag = new_tag()
    ckpt = tmp_path / f"ckpt-{tag[:8]}"
    ckpt.mkdir()
    procs = [bed.spawn(host, [*launcher, STEPS], env=_pod_env(i, elastic, tag, ckpt),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for i, host in enumerate(bed.hosts)]
    done = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=180)
            done.append((p.returncode, out.decode(errors="replace")))
        assert wait_for(lambda: not tagged_pids(tag), 15)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        kill_tagged(tag)
    return done


@pytest.mark.timeout(600)         # torch ranks in pods, side by side with torchrun
@pytest.mark.parametrize("elastic", [False, True], ids=["master-workers", "elastic"])
def test_the_pods_run_the_job_as_under_torchrun(pods, tmp_path, elastic):
    theirs = _run_pods(pods, [PY, "-m", "torch.distributed.run"], elastic, tmp_path)
    ours = _run_pods(pods, cmd(), elastic, tmp_path)
    for done, whole in ((theirs, False), (ours, True)):
        assert [code for code, _ in done] == [0, 0, 0], done
        text = "\n".join(out for _, out in done)
        assert "result 190" in text, done
        assert _ranks(text, whole) == [
            f"rank {r} of 6 from step 0 restart 0" for r in range(6)], done
    # the pods hold the same ranks under both: node ranks by the operator's
    # index (static) or by the pods' addresses (c10d)
    assert [_ranks(out, True) for _, out in ours] == [_ranks(out, False) for _, out in theirs]


def _ranks(out: str, whole_lines: bool) -> List[str]:
    """The ranks' lines in a pod's output.  torchrun's workers share the pod's
    stdout and, unbuffered, write a line's text and its newline apart, so another
    rank's line can land between the two (about 1 line in 25 here): in theirs the
    lines are found wherever they are; mslaunch's must be whole lines."""
    if whole_lines:
        return sorted(line for line in out.splitlines() if line.startswith("rank "))
    return sorted(re.findall(r"rank \d+ of 6 from step \d+ restart \d+", out))
