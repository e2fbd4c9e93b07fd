"""DeepSpeed's launcher lines run by mslaunch, side by side with DeepSpeed's own
``deepspeed`` on the same lines: each worker's arguments and environment key by
key, on this machine and, through DeepSpeed's pdsh runner, on two SSH hosts."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from typing import Dict, List

import pytest

from helpers import PY, all_gone, clean_env, cmd, new_tag, program, tagged_pids
from ports import free_block
from requires import require

WORKER = program("ds_env.py")
#: What DeepSpeed's launch.py gives each worker (and mslaunch must, value for value).
KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_SIZE", "CROSS_RANK", "CROSS_SIZE",
        "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES", "PYTORCH_NVML_BASED_CUDA_CHECK")


@pytest.fixture(scope="module")
def deepspeed() -> str:
    path = os.path.join(os.path.dirname(PY), "deepspeed")
    require(os.access(path, os.X_OK), "DeepSpeed's launcher (pip install deepspeed==0.19.8)")
    return path


def _free_port() -> int:
    return free_block(2, ("127.0.0.1",))[0]


def _workers(where) -> List[dict]:
    rows = [json.loads((where / name).read_text()) for name in os.listdir(where)]
    return sorted(rows, key=lambda row: int(row["env"]["RANK"]))


def _both(deepspeed: str, line: List[str], tmp_path, env: Dict[str, str], timeout=180):
    (tmp_path / "theirs").mkdir()
    (tmp_path / "ours").mkdir()
    theirs = subprocess.run([deepspeed, *line], capture_output=True, timeout=timeout,
                            cwd=str(tmp_path), env={**env, "DS_ENV_DIR": str(tmp_path / "theirs")})
    assert theirs.returncode == 0, theirs.stderr.decode()[-3000:]
    ours = subprocess.run(cmd(*line), capture_output=True, timeout=timeout, cwd=str(tmp_path),
                          env={**env, "DS_ENV_DIR": str(tmp_path / "ours")})
    assert ours.returncode == 0, ours.stderr.decode()[-3000:]
    return _workers(tmp_path / "theirs"), _workers(tmp_path / "ours"), ours


@pytest.mark.parametrize("line, count", [
    (["--num_gpus", "2"], 2),
    (["--num_gpus=3", "--master_port", "{port}", "--no_local_rank"], 3),
    (["--num_gpus", "2", "--module"], 2),
    (["--num_g", "2", "--master_addr", "10.1.2.3"], 2),    # (a start; its address replaced)
], ids=["num_gpus", "no_local_rank", "include-module", "prefix-master_addr"])
def test_one_node_s_workers_get_deepspeed_s_arguments_and_variables(deepspeed, tmp_path, line,
                                                                     count):
    port = str(_free_port())
    line = [w.replace("{port}", port) for w in line]
    script = "ds_env" if "--module" in line else WORKER
    env = clean_env(PYTHONPATH=os.path.dirname(WORKER))
    env.pop("CUDA_VISIBLE_DEVICES", None)
    theirs, ours, _ = _both(deepspeed, [*line, script, "--deepspeed_config", "x.json"],
                            tmp_path, env)
    assert len(theirs) == len(ours) == count
    for t, o in zip(theirs, ours):
        assert o["argv"] == t["argv"], (o["argv"], t["argv"])
        for key in KEYS:
            assert o["env"].get(key) == t["env"].get(key), key
        assert o["cwd"] == t["cwd"]
        assert o["isatty"] == t["isatty"] is False      # (both launchers' stdout a pipe)


@pytest.mark.remote
def test_two_hosts_as_deepspeed_s_pdsh_runner_starts_them(deepspeed, sshbed, tmp_path):
    require(shutil.which("pdsh") is not None, "pdsh (apt-get install pdsh)")
    home = sshbed.make_home(tmp_path / "home")
    (tmp_path / "hostfile").write_text("# DeepSpeed's hostfile\nh1 slots=4\nh2 slots=2\n"
                                       "h3 slots=2\n")
    # the workers' own variable reaches every node through .deepspeed_env, as DeepSpeed's
    (tmp_path / ".deepspeed_env").write_text(f"MSL_TEST_TAG={new_tag()}\n")
    tag = (tmp_path / ".deepspeed_env").read_text().strip().split("=")[1]
    port = str(_free_port())
    env = clean_env(HOME=home, PYTHONFROMTEST="kept", UCX_TLS="tcp")
    env["PATH"] = f"{home}/bin:{env['PATH']}"    # pdsh's ssh: the OpenSSH client, this HOME
    env.pop("CUDA_VISIBLE_DEVICES", None)
    line = ["--hostfile", "hostfile", "--include", "h1:1,3@h2", "--master_port", port,
            WORKER, "--deepspeed_config", "a b"]
    (tmp_path / ".deepspeed_env").write_text(
        f"MSL_TEST_TAG={tag}\nDS_ENV_DIR={tmp_path / 'theirs'}\n")
    (tmp_path / "theirs").mkdir()
    theirs = subprocess.run([deepspeed, *line], capture_output=True, timeout=180,
                            cwd=str(tmp_path), env=env)
    assert theirs.returncode == 0, theirs.stderr.decode()[-3000:]
    (tmp_path / ".deepspeed_env").write_text(
        f"MSL_TEST_TAG={tag}\nDS_ENV_DIR={tmp_path / 'ours'}\n")
    (tmp_path / "ours").mkdir()
    ours = subprocess.run(cmd(*line), capture_output=True, timeout=180, cwd=str(tmp_path),
                          env=env)
    assert ours.returncode == 0, ours.stderr.decode()[-3000:]
    mine, deepspeed_s = _workers(tmp_path / "ours"), _workers(tmp_path / "theirs")
    assert len(mine) == len(deepspeed_s) == 4
    for t, o in zip(deepspeed_s, mine):
        assert o["argv"] == t["argv"] == [f"--local_rank={t['env']['LOCAL_RANK']}",
                                          "--deepspeed_config", "a b"]
        for key in (*KEYS, "PYTHONPATH", "PYTHONFROMTEST", "UCX_TLS", "MSL_TEST_TAG"):
            assert o["env"].get(key) == t["env"].get(key), key
        assert o["cwd"] == t["cwd"]
    assert [(w["env"]["CROSS_RANK"], w["env"]["CUDA_VISIBLE_DEVICES"]) for w in mine] == \
        [("0", "1,3"), ("0", "1,3"), ("1", "0,1"), ("1", "0,1")]
    # DeepSpeed's MPI runners (mpirun ... python -u SCRIPT ARGS) give no --local_rank
    (tmp_path / "two").write_text("h1 slots=1\nh2 slots=1\n")
    (tmp_path / "mpi").mkdir()
    (tmp_path / ".deepspeed_env").write_text(
        f"MSL_TEST_TAG={tag}\nDS_ENV_DIR={tmp_path / 'mpi'}\n")
    ours = subprocess.run(cmd("--hostfile", "two", "--launcher", "openmpi", "--master_port",
                              port, WORKER, "--deepspeed_config", "a b"),
                          capture_output=True, timeout=180, cwd=str(tmp_path), env=env)
    assert ours.returncode == 0, ours.stderr.decode()[-3000:]
    assert [w["argv"] for w in _workers(tmp_path / "mpi")] == [["--deepspeed_config", "a b"]] * 2
    assert all_gone(tag), tagged_pids(tag)


@pytest.mark.parametrize("argv, message", [
    (["--num_gpus", "2", "--include", "localhost:0", "x.py"], "cannot be given with --include"),
    (["--hostfile", "{hosts}", "--include", "h9", "x.py"], "host 'h9' is not in the hostfile"),
    (["--hostfile", "{hosts}", "--include", "h1:7", "x.py"], "h1 has no slot 7"),
    (["--hostfile", "{bad}", "--num_gpus", "1", "x.py"], "bad:2: expected 'HOST slots=N'"),
    (["--num_gpus", "1", "--launcher", "torque", "x.py"], "--launcher=torque: expected one of"),
    (["--num_gpus", "1", "--no_ssh", "--node_rank", "1", "x.py"], "--no_ssh: not served"),
    (["--num_gpus", "1", "--num_n", "2", "x.py"], "no hostfile names other nodes"),
    (["--num_gpus", "1", "--bogus", "x.py"], "unknown option '--bogus' of DeepSpeed's"),
    (["--num_gpus", "one", "x.py"], "--num_gpus=one: expected a whole number"),
])
def test_bad_lines_are_one_error_line(tmp_path, argv, message):
    (tmp_path / "hosts").write_text("h1 slots=2\nh2 slots=2\n")
    (tmp_path / "bad").write_text("h1 slots=2\nh2 slots two\n")
    argv = [w.replace("{hosts}", str(tmp_path / "hosts")).replace("{bad}", str(tmp_path / "bad"))
            for w in argv]
    r = subprocess.run(cmd(*argv), capture_output=True, timeout=60, cwd=str(tmp_path),
                       env=clean_env())
    assert r.returncode == 2, r.stderr
    lines = r.stderr.decode().splitlines()
    assert len(lines) == 1 and message in lines[0], lines
