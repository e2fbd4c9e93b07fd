"""netbed's Bed and BedPool, with beds that build nothing; and the removal of a
bed left by a crashed run."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import netbed
from requires import require
from helpers import SUPPORT, wait_for


class _Bed(netbed.Bed):
    log: list = []

    def __init__(self, name: str, fail: bool = False) -> None:
        super().__init__()
        self.dir, self.fail = name, fail

    def _check(self, *args) -> None:
        if self._started:
            raise RuntimeError("started once")

    def _build(self, *args) -> None:
        self.log.append(("build", self.dir))
        if self.fail:
            raise OSError("no such thing")

    def _teardown(self) -> None:
        self.log.append(("stop", self.dir))


def test_a_bed_that_fails_to_build_is_taken_down_and_with_stops_it():
    _Bed.log = []
    with pytest.raises(OSError):
        _Bed("a", fail=True).start()
    assert _Bed.log == [("build", "a"), ("stop", "a")]
    with _Bed("b") as bed:
        assert bed.running
    assert not bed.running and _Bed.log[-2:] == [("build", "b"), ("stop", "b")]
    bed.stop()                          # idempotent
    assert _Bed.log[-1] == ("stop", "b")


def test_beds_still_up_at_exit_stop_last_started_first():
    _Bed.log = []
    bystander = _Bed("the session's").start()
    first, second = _Bed("owner").start(), _Bed("borrower").start()
    # (what runs at exit for every live bed: here for this test's own, since the
    # session's shared beds are live in this process too)
    netbed.stop_live([second, first])
    assert _Bed.log[-2:] == [("stop", "borrower"), ("stop", "owner")]
    assert not first.running and not second.running
    assert bystander.running
    bystander.stop()


def test_a_pool_remembers_a_failure_and_raises_it_afresh():
    made = []

    def build(name: str, fail: bool = False) -> _Bed:
        made.append(name)
        if fail:
            pytest.fail(f"cannot build {name}", pytrace=False)
        return _Bed(name).start()
    pool = netbed.BedPool(build)
    first = second = None
    for _ in range(2):
        try:
            pool.get("k", "x", fail=True)
        except pytest.fail.Exception as e:
            first, second = second, e
    assert made == ["x"]                                 # built once
    assert first is not second and str(first) == str(second) == "cannot build x"
    shared = pool.get("ok", "y")
    assert pool.get("ok", "y") is shared and pool.new("z") is not shared
    assert [b.dir for b in pool.beds] == ["y", "z"]
    pool.close()
    assert not pool.beds


#: A test run that builds an SSH bed, starts ``sleep`` on h1 over SSH, prints what
#: runs on h1 and the SSH client's pid, then dies without any cleanup.
CRASHED_RUN = """
import json, os, signal, subprocess, sys, time
sys.path.insert(0, sys.argv[1])
import sshbed
bed = sshbed.SSHBed(sys.argv[2], mode="netns").start(1)
client = subprocess.Popen(bed.ssh_argv("h1", "exec", "sleep", "600"), start_new_session=True,
                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)


def comm(pid):
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


deadline = time.monotonic() + 15
while "sleep" not in map(comm, bed.host_pids("h1")) and time.monotonic() < deadline:
    time.sleep(0.02)
print(json.dumps({"pids": bed.host_pids("h1"), "client": client.pid, "run": os.getpid()}),
      flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.remote
def test_an_ssh_bed_left_by_a_crashed_run_is_removed_by_the_next(sshbeds, tmp_path):
    """The run dies in a mount namespace of its own (as scripts/test.sh runs the
    suite): its sshd, and what it started over SSH, live on in namespaces that
    /run/netns no longer shows.  The next SSH bed removes them before it is built."""
    ok, reason = netbed.namespaces_permitted()
    require(ok, reason)
    r = subprocess.run(["unshare", "--mount", "--propagation", "private", sys.executable,
                        "-c", CRASHED_RUN, SUPPORT, str(tmp_path / "crashed")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == -9 and r.stdout, r.stderr
    left = json.loads(r.stdout)
    try:
        assert len(left["pids"]) >= 2 and all(netbed.process_alive(p) for p in left["pids"])
        sshbeds.new(1).stop()
        assert [p for p in left["pids"] if netbed.process_alive(p)] == []
        assert wait_for(lambda: not netbed.process_alive(left["client"]), 5)
        records = [netbed.read_record(os.path.join(netbed.state_dir(), e)) or {}
                   for e in os.listdir(netbed.state_dir()) if e.endswith(".json")]
        assert not [rec for rec in records if rec.get("pid") == left["run"]]
    finally:
        netbed.kill_pids(left["pids"] + [left["client"]])
