"""The tutorial-style launch scripts in scripts/ run as written."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

from helpers import REPO, clean_env


@pytest.fixture
def script_env(tmp_path):
    """PATH with `mslaunch` and `python` as a user who installed mslaunch has them."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "mslaunch").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m mslaunch "$@"\n')
    (bin_dir / "mslaunch").chmod(0o755)
    (bin_dir / "python").symlink_to(sys.executable)
    env = clean_env()
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    return env


def _copy_scripts(tmp_path):
    shutil.copytree(os.path.join(REPO, "scripts"), tmp_path / "scripts")
    return tmp_path / "scripts"


def test_run_single(script_env, tmp_path):
    scripts = _copy_scripts(tmp_path)
    env = dict(script_env, DEVICE_NUM="3")
    r = subprocess.run(["bash", str(scripts / "run_single.sh")], env=env, capture_output=True,
                       timeout=180)
    assert r.returncode == 0, r.stderr
    for rank in range(3):
        text = (scripts / "log_output" / "1" / f"rank.{rank}" / "stdout").read_text()
        assert text.startswith(f"rank {rank} of 3 on ")
        assert len(re.findall(r"epoch: 0, step: \d+, loss is \d\.\d+", text)) == 5
    assert not (scripts / "log_output" / "1" / "rank.0" / "stderr").exists()


def test_run_cluster_with_a_hostfile(script_env, tmp_path):
    scripts = _copy_scripts(tmp_path)
    hostfile = os.path.join(REPO, "hostfiles", "local.txt")
    r = subprocess.run(["bash", str(scripts / "run_cluster.sh"), hostfile, "4"], env=script_env,
                       capture_output=True, timeout=180)
    assert r.returncode == 0, r.stderr
    for rank in range(4):
        text = (scripts / "log_output" / "1" / f"rank.{rank}" / "stdout").read_text()
        assert text.startswith(f"rank {rank} of 4 on ")
