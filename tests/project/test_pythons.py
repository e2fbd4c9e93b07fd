"""The Python versions the project promises are the ones it checks.

The README, setup.cfg, the type checker and the linter name the same oldest
Python; the built wheel carries ``py.typed`` and the licence; and an agent
runs on a host whose Python is the oldest the README promises for hosts
(3.8): over SSH on the test bed, started from the host's own copy of the
package (every agent module imported by that interpreter) and sent the
package, serving MPI to its ranks.  (The smoke subset on the oldest and the
newest Python the package claims is run by scripts/test.sh, each in a
virtual environment of its own.)
"""

from __future__ import annotations

import configparser
import os
import re
import subprocess
import sys
import zipfile

import pytest

import pythons
from requires import require
from helpers import PY, REPO, clean_env, cmd, new_tag, tagged_pids, wait_for

try:
    import tomllib
except ImportError:             # Python 3.9 and 3.10: the smoke subset does not need it
    tomllib = None


def read(*parts: str) -> str:
    with open(os.path.join(REPO, *parts), encoding="utf-8") as f:
        return f.read()


def test_every_place_names_the_same_pythons():
    oldest, newest = pythons.package_versions()
    host = pythons.host_floor()
    assert (oldest, newest, host) == ("3.9", "3.13", "3.8")
    # the classifiers list every version from the oldest to the newest
    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(REPO, "setup.cfg"))
    listed = re.findall(r"Python :: (3\.\d+)\s*$", cfg["metadata"]["classifiers"], re.M)
    assert [int(v[2:]) for v in listed] == list(range(int(oldest[2:]), int(newest[2:]) + 1))
    readme = read("README.md")
    assert f"Python {oldest} or newer (tested on {oldest} and {newest})" in readme
    assert f"Python {host} or newer" in readme
    assert f"needs Python {host} or newer" in read("mslaunch", "backends", "agents", "bootstrap.py")
    if tomllib is not None:
        settings = tomllib.loads(read("pyproject.toml"))["tool"]
        assert settings["mypy"]["python_version"] == oldest
        assert settings["ruff"]["target-version"] == "py" + oldest.replace(".", "")


def test_the_wheel_carries_py_typed_and_the_licence(tmp_path):
    # Built with what the test environment has (the test extra brings the build
    # requirements): the suite's resolver answers nothing, so no index is asked.
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-index",
                        "--no-build-isolation", "-w", str(tmp_path), REPO],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    (wheel,) = tmp_path.glob("mslaunch-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "mslaunch/py.typed" in names
    licence = [n for n in names if n.endswith("/LICENSE") and ".dist-info/" in n]
    assert licence, names
    text = zipfile.ZipFile(wheel).read(licence[0]).decode()
    assert "Apache License" in text and "Version 2.0" in text
    meta = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("METADATA"))).decode()
    assert "Classifier: Programming Language :: Python :: 3.9" in meta
    assert "Classifier: Typing :: Typed" in meta


# -- an agent on the oldest host Python ------------------------------------------

RANK = """
import os, sys
from mpi4py import MPI
c = MPI.COMM_WORLD
agent = os.path.realpath(f"/proc/{os.getppid()}/exe")
print(c.rank, c.size, c.allreduce(c.rank + 1), agent, flush=True)
"""


@pytest.fixture(scope="module")
def host_python():
    """The oldest Python a host may have (scripts/test.sh says where it found it)."""
    path = os.environ.get("MSLAUNCH_TEST_HOST_PYTHON") or pythons.find(pythons.host_floor())
    require(path is not None, f"a Python {pythons.host_floor()} interpreter "
                              f"(looked for: {', '.join(pythons.candidates(pythons.host_floor()))})")
    return path


@pytest.mark.remote
@pytest.mark.parametrize("way", ["host", "sent"])
def test_an_agent_runs_on_the_oldest_host_python(sshbed, mpich, tmp_path, host_python, way):
    home = sshbed.make_home(tmp_path / "home")
    tag = new_tag()
    python = host_python
    if way == "host":
        # the host's own copy of the package (this checkout), which the agent
        # then imports with that interpreter, module by module
        python = str(tmp_path / "python")
        with open(python, "w") as f:
            f.write(f'#!/bin/sh\nPYTHONPATH={REPO} exec {host_python} "$@"\n')
        os.chmod(python, 0o755)
    env = clean_env(HOME=home, MSL_TEST_TAG=tag, UCX_TLS="tcp")
    r = subprocess.run(cmd("-v", "--remote-python", python, "-H", "h1,h2", "-n", "2",
                           "-x", "MSL_TEST_TAG", "-x", "UCX_TLS", PY, "-c", RANK),
                       capture_output=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    lines = sorted(r.stdout.decode().splitlines())
    real = os.path.realpath(host_python)
    assert lines == [f"0 2 3 {real}", f"1 2 3 {real}"], (lines, r.stderr)
    said = r.stderr.decode()
    if way == "host":
        assert said.count(f"agent started from the host's mslaunch at {REPO}") == 2, said
    else:
        assert said.count("agent package sent") == 2, said
    assert wait_for(lambda: tagged_pids(tag) == [], 15), tagged_pids(tag)
