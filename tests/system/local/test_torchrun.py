"""torchrun's command lines run by mslaunch, side by side with torch 2.x's own
torchrun on the same lines: the workers' environment key by key, the same DDP
result, the same files under ``--log-dir``, and a failure's traceback from the
worker's error file (torch's ``@record``) in mslaunch's summary and report."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
from typing import Dict

import pytest

from helpers import PY, StderrLines, clean_env, cmd, end_all, new_tag, run, wait_for
from ports import free_block
from torchenv import ENV, compare, workers
from requires import require

# (each test runs torch's own torchrun, which imports torch: seconds of CPU on a slow machine)
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module", autouse=True)
def torch_ready():
    require(importlib.util.find_spec("torch") is not None, "torch (pip install torch==2.13.0)")


def _free_port() -> int:
    return free_block(2, ("127.0.0.1",))[0]


def _env(where=None) -> Dict[str, str]:
    env = clean_env(**({"TORCH_ENV_DIR": str(where)} if where is not None else {}))
    for name in ("OMP_NUM_THREADS", "TORCHELASTIC_SIGNALS_TO_HANDLE"):
        env.pop(name, None)
    return env


def _torchrun(*args: str, cwd: str, timeout: float = 120, where=None
              ) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "torch.distributed.run", *args], capture_output=True,
                          timeout=timeout, env=_env(where), cwd=cwd)


def _side_by_side(reference, args, tmp_path):
    """The same line run by ``reference`` (its workers write into t/) and by
    mslaunch (into m/): both runs and the pairs of workers' rows."""
    (tmp_path / "t").mkdir()
    (tmp_path / "m").mkdir()
    theirs = reference(*args, cwd=str(tmp_path), where=tmp_path / "t")
    ours = run(*args, env=_env(tmp_path / "m"), cwd=str(tmp_path), timeout=120)
    assert theirs.returncode == 0, theirs.stderr.decode()[-2000:]
    assert ours.returncode == 0, ours.stderr.decode()
    return theirs, ours, list(zip(workers(tmp_path / "t"), workers(tmp_path / "m")))


@pytest.mark.parametrize("line", [
    ["--nproc-per-node=2"],
    ["--standalone", "--nproc_per_node", "2"],
    ["--nproc-per-node", "2", "--master-port", "{port}", "--role", "trainer"],
    ["--nproc-per-node=2", "--max-restarts=1", "--rdzv-backend=c10d", "--rdzv-id=job7"],
    ["--nproc-per-node=1"],
], ids=["default", "standalone", "static", "c10d-id", "one-worker"])
def test_workers_get_torchrun_s_environment(tmp_path, line):
    port = str(_free_port())
    args = [word.replace("{port}", port) for word in line] + [ENV, "x${local_rank}y"]
    theirs, ours, pairs = _side_by_side(_torchrun, args, tmp_path)
    parent = _env(tmp_path / "t")
    assert len(pairs) == (1 if "--nproc-per-node=1" in line else 2)
    for theirs_row, ours_row in pairs:
        compare(theirs_row, ours_row, parent)
    warned = b"Setting OMP_NUM_THREADS environment variable for each process to be 1"
    assert (warned in theirs.stderr) == (warned in ours.stderr) == (len(pairs) > 1)


def _launch(*args: str, cwd: str, where=None) -> subprocess.CompletedProcess:
    """torch's legacy launcher, python -m torch.distributed.launch (it still ships)."""
    return subprocess.run([PY, "-m", "torch.distributed.launch", *args], capture_output=True,
                          timeout=120, env=_env(where), cwd=cwd)


LEGACY = """
import argparse, json, os, sys
parser = argparse.ArgumentParser()
parser.add_argument({spellings}, type=int, required=True)
parser.add_argument("rest", nargs="*")
args = parser.parse_args()
assert args.local_rank == int(os.environ["LOCAL_RANK"])
with open(os.path.join(os.environ["TORCH_ENV_DIR"], os.environ["LOCAL_RANK"] + ".json"), "w") as f:
    json.dump({{"env": dict(os.environ), "argv": sys.argv[1:]}}, f)
"""


@pytest.mark.parametrize("line, declared", [
    (["--nproc-per-node", "2"], '"--local-rank", "--local_rank"'),
    (["--nproc_per_node=2", "--logs-specs", "default", "--master_port={port}"],
     "'--local-rank'"),
    (["--use-env", "--nproc-per-node=2"], None),
    (["--nproc_per_node", "2", "--use_env", "--standalone"], None),
], ids=["argument", "argument-static", "use-env", "use_env-standalone"])
def test_torch_distributed_launch_s_lines(tmp_path, line, declared):
    """python -m torch.distributed.launch replaced by mslaunch: the script that
    declares --local-rank gets it (without --use-env), key by key as the legacy
    launcher gives its workers, with torchrun's default --logs-specs taken."""
    script = tmp_path / "legacy.py"
    script.write_text(LEGACY.format(spellings=declared) if declared else open(ENV).read())
    port = str(_free_port())
    args = [w.replace("{port}", port) for w in line] + [str(script), "x"]
    _, _, pairs = _side_by_side(_launch, args, tmp_path)
    assert len(pairs) == 2
    for local, (theirs_row, ours_row) in enumerate(pairs):
        compare(theirs_row, ours_row, _env(tmp_path / "t"))
        assert ours_row["argv"] == ([f"--local-rank={local}"] if declared else []) + ["x"]


def test_a_script_of_torch_1_s_local_rank_runs_where_torch_2_s_launcher_fails_it(tmp_path):
    """A script that declares only --local_rank (written for torch 1.x's launcher)
    gets that spelling; torch 2.x's launcher passes --local-rank and argparse stops it."""
    script = tmp_path / "old.py"
    script.write_text(LEGACY.format(spellings='"--local_rank"'))
    (tmp_path / "t").mkdir()
    (tmp_path / "m").mkdir()
    theirs = _launch("--nproc-per-node=2", str(script), cwd=str(tmp_path),
                     where=tmp_path / "t")
    assert theirs.returncode != 0 and b"required: --local_rank" in theirs.stderr
    ours = run("--nproc-per-node=2", str(script), env=_env(tmp_path / "m"), cwd=str(tmp_path),
               timeout=120)
    assert ours.returncode == 0, ours.stderr.decode()
    assert [row["argv"] for row in workers(tmp_path / "m")] == [["--local_rank=0"],
                                                                ["--local_rank=1"]]


DDP = """
import json, os, sys, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
dist.init_process_group("gloo")
torch.manual_seed(0)
model = DistributedDataParallel(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(5):
    x = torch.full((8, 4), float(dist.get_rank() + step))
    opt.zero_grad()
    model(x).sum().backward()
    opt.step()
if dist.get_rank() == 0:
    print(json.dumps([round(v, 6) for v in model.module.weight.flatten().tolist()]))
# torch's gloo aborts a rank at its end now and then ("terminate called without an
# active exception") when DDP's reducer still holds the group at the interpreter's
# finalization (as in tests/programs/train_ddp.py): released and destroyed first
dist.barrier()
del model, opt
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)
"""


#: Seconds a DDP job of two ranks may take: two imports of torch and gloo's set-up
#: took over 120 s on a busy 2-core machine.
DDP_TIME = 240


def _ddp_without_a_launcher() -> list:
    """What DDP.py's rank 0 prints, computed in one process: DDP averages the two
    ranks' gradients before each step (the reference torchrun's run gives too;
    computed here, as torchrun's own workers abort at exit now and then on a
    busy machine)."""
    import torch
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(5):
        grads = []
        for rank in range(2):
            opt.zero_grad()
            model(torch.full((8, 4), float(rank + step))).sum().backward()
            grads.append([p.grad.clone() for p in model.parameters()])
        for p, *per_rank in zip(model.parameters(), *grads):
            p.grad = sum(per_rank) / 2
        opt.step()
    return [round(v, 6) for v in model.weight.flatten().tolist()]


def test_the_same_ddp_result(tmp_path):
    script = tmp_path / "ddp.py"
    script.write_text(DDP)
    ours = run("--nproc-per-node=2", str(script), env=_env(), cwd=str(tmp_path), timeout=DDP_TIME)
    assert ours.returncode == 0, ours.stderr.decode()[-3000:]
    assert json.loads(ours.stdout) == _ddp_without_a_launcher()


def test_master_port_0_is_a_free_port_not_a_hang(tmp_path):
    """torchrun hands its workers MASTER_PORT=0 and they wait forever for rank 0's
    store; mslaunch chooses a free port, as for --standalone."""
    script = tmp_path / "ddp.py"
    script.write_text(DDP)
    ours = run("--nproc-per-node=2", "--master-port", "0", str(script), env=_env(),
               cwd=str(tmp_path), timeout=DDP_TIME)
    assert ours.returncode == 0, ours.stderr.decode()[-3000:]
    assert json.loads(ours.stdout) == _ddp_without_a_launcher()


def _tree(base) -> Dict[str, str]:
    (run_dir,) = os.listdir(base)
    root = os.path.join(base, run_dir)
    files = {}
    for where, _, names in os.walk(root):
        for name in names:
            path = os.path.join(where, name)
            with open(path) as f:
                files[os.path.relpath(path, root)] = f.read() if name.endswith(".log") else ""
    return files


@pytest.mark.parametrize("streams", [["-r", "3"], ["--redirects=1", "--tee=2"], ["-r", "0:3"]])
def test_the_same_log_files(tmp_path, streams):
    args = ["--nproc-per-node=2", "--rdzv-id=logs", *streams, ENV]
    theirs = _torchrun("--log-dir", str(tmp_path / "t"), *args, cwd=str(tmp_path))
    ours = run("--log-dir", str(tmp_path / "m"), *args, env=_env(), cwd=str(tmp_path),
               timeout=120)
    assert theirs.returncode == 0 and ours.returncode == 0, ours.stderr.decode()
    mine, torchrun_s = _tree(tmp_path / "m"), _tree(tmp_path / "t")
    assert sorted(mine) == sorted(torchrun_s)
    for name in mine:
        if name.endswith("stderr.log"):
            assert mine[name] == torchrun_s[name]
    # what reaches the terminal: tee'd lines with torchrun's prefix, redirected ones not
    for out in (ours, theirs):
        text = (out.stdout + out.stderr).decode()
        if streams == ["--redirects=1", "--tee=2"]:
            assert "[default0]:err 0" in text and "out 0" not in text
        if streams == ["-r", "0:3"]:
            assert "out 0" not in text and "out 1" in text


FILTERED = """import os, sys
rank = os.environ["LOCAL_RANK"]
for i in range(3000):
    print(f"out {rank} {i}", flush=True)
print(f"err {rank}", file=sys.stderr, flush=True)
open(f"done.{rank}", "w").close()
"""


@pytest.mark.parametrize("streams", [[], ["-r", "1"]])
def test_ranks_left_off_the_terminal_by_local_ranks_filter_run_to_their_end(tmp_path, streams):
    """The ranks --local-ranks-filter leaves out write on: their output was
    dropped by a closed pipe, which killed them (BrokenPipeError) and the job."""
    (tmp_path / "filtered.py").write_text(FILTERED)
    args = ["--nproc-per-node=3", "--local-ranks-filter", "1", *streams, "filtered.py"]
    for who in ("t", "m"):
        where = tmp_path / who
        where.mkdir()
        (where / "filtered.py").write_text(FILTERED)
        out = _torchrun(*args, cwd=str(where)) if who == "t" else \
            run(*args, env=_env(), cwd=str(where), timeout=120)
        assert out.returncode == 0, (who, out.stderr.decode()[-2000:])
        assert sorted(os.listdir(where)) == ["done.0", "done.1", "done.2", "filtered.py"]
        lines = (out.stdout + out.stderr).decode().splitlines()
        assert [x for x in lines if x.startswith(("out", "err"))] == \
            ([] if streams else [f"out 1 {i}" for i in range(3000)]) + ["err 1"], who


IDENTITY = "import os\nprint(os.environ['RANK'], os.environ['WORLD_SIZE'], os.environ['GROUP_RANK'])\n"


def _two_launchers(tmp_path, lines, tag, script="who.py", env_for=lambda i: {}):
    """Two launchers of one machine, the first waiting (its service says so) when the
    second starts; their exit statuses and outputs."""
    (tmp_path / "who.py").write_text(IDENTITY)
    procs = []
    try:
        for i, line in enumerate(lines):
            env = clean_env(MSL_TEST_TAG=tag, LOGLEVEL="INFO", **env_for(i))
            procs.append(subprocess.Popen(cmd(*line, "--rdzv-conf=join_timeout=60", script),
                                          cwd=str(tmp_path), env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE))
            said = StderrLines(procs[-1])
            if len(procs) == 1:
                # (its node registered with its own service: "new -> held")
                assert wait_for(lambda: said.said("new -> held") or
                                procs[0].poll() is not None, 60), said.lines
        return [(p.wait(timeout=120), p.stdout.read().decode()) for p in procs]
    finally:
        end_all(procs, tag)


@pytest.mark.parametrize("kind", ["static", "static, node 1 first", "c10d"])
def test_two_nodes_of_one_job_on_one_machine_form_it(tmp_path, kind):
    """A job of two nodes tried on one machine, as torchrun runs it: the first
    launcher to take the service's port hosts it, the other joins (each used to
    host it, and the second failed on the port in use)."""
    port = free_block(2, ("127.0.0.1",))[0]
    if kind == "c10d":
        lines = [["--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d",
                  f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=job7"]] * 2
    else:
        lines = [["--nnodes=2", "--nproc-per-node=1", f"--node-rank={i}",
                  "--master-addr=127.0.0.1", f"--master-port={port}"]
                 for i in ((1, 0) if "first" in kind else (0, 1))]
    done = _two_launchers(tmp_path, lines, new_tag())
    assert [code for code, _ in done] == [0, 0], done
    assert sorted(out.strip() for _, out in done) == ["0 2 0", "1 2 1"], done


RECORDED_FAILURE = """import json, os, sys
if os.environ["RANK"] == "1":
    with open(os.environ["TORCHELASTIC_ERROR_FILE"], "w") as f:
        json.dump({"message": {"message": "ValueError: round " +
                   os.environ["TORCHELASTIC_RESTART_COUNT"], "extraInfo": {
                       "py_callstack": "Traceback", "timestamp": "0"}}}, f)
    sys.exit(3)
"""


def test_the_last_rounds_failure_is_the_launchers_error_file(tmp_path):
    """With --max-restarts the nodes start again in rounds: the launcher whose worker
    failed first in the last round writes that worker's error file to its own
    TORCHELASTIC_ERROR_FILE, as torchrun's agent does once its restarts are spent."""
    (tmp_path / "fail.py").write_text(RECORDED_FAILURE)
    port = free_block(2, ("127.0.0.1",))[0]
    lines = [["--nnodes=2", "--nproc-per-node=1", f"--node-rank={i}", "--max-restarts=1",
              "--master-addr=127.0.0.1", f"--master-port={port}"] for i in (0, 1)]
    files = [tmp_path / f"node{i}.json" for i in (0, 1)]
    done = _two_launchers(tmp_path, lines, new_tag(), script="fail.py",
                          env_for=lambda i: {"TORCHELASTIC_ERROR_FILE": str(files[i])})
    assert [code for code, _ in done] == [3, 3], done
    said = json.loads(files[1].read_text())["message"]
    assert said["message"] == "ValueError: round 1" and said["errorCode"] == 3, said
    assert not files[0].exists()


def test_a_node_of_another_rdzv_id_on_the_same_endpoint_is_refused_in_one_line(tmp_path):
    port = free_block(1, ("127.0.0.1",))[0]
    lines = [["--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d",
              f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id={name}"] for name in "AB"]
    tag = new_tag()
    (tmp_path / "who.py").write_text(IDENTITY)
    env = clean_env(MSL_TEST_TAG=tag)
    first = subprocess.Popen(cmd(*lines[0], "--rdzv-conf=join_timeout=60", "who.py"),
                             cwd=str(tmp_path), env=clean_env(MSL_TEST_TAG=tag, LOGLEVEL="INFO"),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        said = StderrLines(first)
        # (A hosts the service before B comes)
        assert wait_for(lambda: said.said("waits for every node: 1 of 2") or
                        first.poll() is not None, 60), said.lines
        second = run(*lines[1], "who.py", env=env, cwd=str(tmp_path), timeout=60)
        assert second.returncode == 1, second.stderr
        errors = [x for x in second.stderr.decode().splitlines() if x.startswith("mslaunch:")]
        assert errors == ["mslaunch: error: the node service refused this node: the service "
                          "here is --rdzv-id 'A''s, not 'B''s: give each job an endpoint of "
                          "its own"], second.stderr
        assert wait_for(lambda: said.said("refused node"), 30), said.lines
    finally:
        end_all([first], tag)


def test_standalone_with_a_range_of_nodes_is_this_node_alone(tmp_path):
    # (torchrun runs the same, after its last_call_timeout of 30 s)
    (tmp_path / "who.py").write_text(IDENTITY)
    r = run("--standalone", "--nnodes=1:2", "--nproc-per-node=2", "who.py", env=_env(),
            cwd=str(tmp_path), timeout=60)
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.decode().splitlines()) == ["0 2 0", "1 2 0"], r.stdout


def test_a_failure_s_traceback_from_its_error_file(tmp_path):
    report = tmp_path / "report.json"
    env = _env()
    env["TORCHELASTIC_ERROR_FILE"] = str(tmp_path / "ours.json")
    ours = run("--nproc-per-node=2", "--report-json", str(report), ENV, "--fail", "1",
               env=env, cwd=str(tmp_path), timeout=120)
    theirs = subprocess.run([PY, "-m", "torch.distributed.run", "--nproc-per-node=2", ENV,
                             "--fail", "1"], capture_output=True, timeout=120, cwd=str(tmp_path),
                            env={**env, "TORCHELASTIC_ERROR_FILE": str(tmp_path / "theirs.json")})
    assert theirs.returncode == 1 and b"boom from rank 1" in theirs.stderr
    assert ours.returncode == 1
    # the launcher's own error file: the root cause's, its errorCode the exit status
    mine, torchrun_s = (json.loads((tmp_path / f"{who}.json").read_text())["message"]
                        for who in ("ours", "theirs"))
    for said in (mine, torchrun_s):
        said["extraInfo"].pop("timestamp")
    assert mine == torchrun_s and mine["errorCode"] == 1, (mine, torchrun_s)
    said = ours.stderr.decode()
    assert "mslaunch: rank 1 (pid" in said and "exited with code 1" in said
    assert re.search(r"rank 1's error file \(.*/attempt_0/1/error\.json\): "
                     r"ValueError: boom from rank 1", said), said
    assert 'raise ValueError(f"boom from rank' in said
    first = json.loads(report.read_text())["first_failure"]
    assert first["rank"] == 1 and first["error"]["message"] == "ValueError: boom from rank 1"
    assert "Traceback (most recent call last)" in first["error"]["traceback"]


def test_restarts_count_in_the_workers_and_the_files(tmp_path):
    script = tmp_path / "flaky.py"
    script.write_text(
        "import os, sys\n"
        "count = os.environ['TORCHELASTIC_RESTART_COUNT']\n"
        "print('attempt', count, os.environ['RANK'], flush=True)\n"
        "sys.exit(3 if count == '0' and os.environ['RANK'] == '1' else 0)\n")
    ours = run("--nproc-per-node=2", "--max-restarts=1", "--log-dir", str(tmp_path / "logs"),
               "-r", "1", str(script), env=_env(), cwd=str(tmp_path), timeout=120)
    assert ours.returncode == 0, ours.stderr.decode()
    files = _tree(tmp_path / "logs")
    assert files["attempt_1/0/stdout.log"] == "attempt 1 0\n"
    assert files["attempt_1/1/stdout.log"] == "attempt 1 1\n"
    assert files["attempt_0/1/stdout.log"] == "attempt 0 1\n"


def test_no_log_directory_is_left_without_log_dir(tmp_path):
    (tmp_path / "m").mkdir()
    env = _env(tmp_path / "m")
    env["TMPDIR"] = str(tmp_path)
    ours = run("--nproc-per-node=1", ENV, env=env, cwd=str(tmp_path), timeout=120)
    assert ours.returncode == 0, ours.stderr.decode()
    error_file = workers(tmp_path / "m")[0]["env"]["TORCHELASTIC_ERROR_FILE"]
    assert error_file.startswith(str(tmp_path) + "/torchelastic_")
    assert not [n for n in os.listdir(tmp_path) if n.startswith("torchelastic_")]
