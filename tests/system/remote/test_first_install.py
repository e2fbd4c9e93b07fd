"""The README's install command, in a fresh virtual environment, is all a
two-host job over SSH needs (paramiko comes with mslaunch).

The suite looks nothing up beyond this machine, so the command installs from
the wheels the test command downloaded for it first (``MSLAUNCH_TEST_WHEELS``:
``--no-index --find-links``), not from the package index."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from helpers import REPO, kill_tagged, new_tag
from remote import renv, settle
from requires import require


def _readme_install() -> str:
    with open(f"{REPO}/README.md") as f:
        first = re.search(r"```sh\n(.*?)\n```", f.read(), re.S).group(1)
    (install,) = [part.strip() for part in first.split("&&") if "pip install" in part]
    return install


@pytest.mark.timeout(900)         # a virtual environment made and filled, on a busy machine
def test_the_readme_s_install_runs_a_two_host_job(sshbed, home, tmp_path):
    install = _readme_install()
    assert install.startswith("pip install ") and "'.[" in install, install
    wheels = os.environ.get("MSLAUNCH_TEST_WHEELS", "")
    require(os.path.isdir(wheels), "the wheels of the README's install (scripts/test.sh "
                                   "downloads them into MSLAUNCH_TEST_WHEELS)")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    local = install.replace("pip install ", f"pip install --no-index --find-links {wheels} ",
                            1)
    r = subprocess.run(["sh", "-c", f"{venv}/bin/python -m {local}"], cwd=REPO,
                       capture_output=True, timeout=600)
    assert r.returncode == 0, r.stderr.decode()[-3000:]
    tag = new_tag()
    try:
        # a Python rank, as a newcomer's first job is: the venv's python on each host
        job = subprocess.run([f"{venv}/bin/mslaunch", "-n", "2", "-H", "h1,h2", "-x",
                              "MSL_TEST_TAG", f"{venv}/bin/python", "-c",
                              "import os, socket; print(socket.gethostname(), "
                              "os.environ['OMPI_COMM_WORLD_RANK'])"],
                             capture_output=True, timeout=120,
                             env=renv(home, MSL_TEST_TAG=tag), cwd=str(tmp_path))
        settle(tag, sshbed)
    finally:
        kill_tagged(tag)
    assert job.returncode == 0, job.stderr
    assert sorted(job.stdout.decode().splitlines()) == ["h1 0", "h2 1"], job.stdout
