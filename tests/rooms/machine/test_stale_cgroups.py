"""Job cgroups made in another pid namespace: a live job's is left alone, one
left empty by a launcher that was pid 1 of its namespace (its exit takes its
watchdog with it) is removed once it has stayed empty a while. Real cgroups,
beside this process's own."""

from __future__ import annotations

import os
import subprocess

import pytest

from helpers import new_tag
from mslaunch.machine import cgroups
from requires import require


@pytest.fixture
def home():
    mount, own = cgroups._cgroup2_mount(), cgroups._own_cgroup()
    require(mount is not None and own is not None and os.access(
        os.path.normpath(mount + "/" + own), os.W_OK), "a writable cgroup v2 hierarchy")
    return os.path.normpath(mount + "/" + own)


def _foreign(home: str) -> str:
    """A job cgroup's name from a pid namespace that is not this one."""
    return os.path.join(home, f"mslaunch-1-w2-n{cgroups._pid_namespace() + 1}-kvs_{new_tag()}")


def test_an_empty_cgroup_of_another_namespace_goes_once_it_stayed_empty(home, monkeypatch):
    path = _foreign(home)
    os.mkdir(path)
    os.mkdir(os.path.join(path, "mslaunch-2-w3-n1-kvs_inner"))   # (an old nested attempt)
    try:
        cgroups.remove_stale(home)
        assert os.path.isdir(path)                  # young: perhaps a job just starting
        monkeypatch.setattr(cgroups, "FOREIGN_EMPTY", 0.0)
        cgroups.remove_stale(home)
        assert not os.path.exists(path)
    finally:
        for p in (os.path.join(path, "mslaunch-2-w3-n1-kvs_inner"), path):
            if os.path.isdir(p):
                os.rmdir(p)


def test_a_live_job_of_another_namespace_is_left_alone(home, monkeypatch):
    path = _foreign(home)
    os.mkdir(path)
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        with open(os.path.join(path, "cgroup.procs"), "w") as f:
            f.write(str(sleeper.pid))
        monkeypatch.setattr(cgroups, "FOREIGN_EMPTY", 0.0)
        cgroups.remove_stale(home)
        assert os.path.isdir(path) and sleeper.poll() is None
    finally:
        sleeper.kill()
        sleeper.wait()
        os.rmdir(path)
