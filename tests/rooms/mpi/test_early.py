"""mslaunch.mpi.early: what a local job's ranks are given before its MPI services
run, and the services made at a rank's first word, connection or Open MPI file.

The loop, the sockets, the probe directory and the PMIx template are real; the
job's supervisor view and the services woken are small stand-ins (what is
under test is when they are woken and what they are handed)."""

from __future__ import annotations

import os
import socket
from types import SimpleNamespace
from typing import Dict, List, Optional

import pytest

from mslaunch.machine.loop import Loop
from mslaunch.machine.topology import cache_path, save_whole
from mslaunch.mpi import early
from mslaunch.mpi.pmix import template

TEMPLATE = {"PMIX_NAMESPACE": "{nspace}", "PMIX_RANK": "{rank}",
            "PMIX_SERVER_URI2": "pmix-server.{pid};tcp4://127.0.0.1:{port}",
            "PMIX_SERVER_TMPDIR": "{dir}"}


class Services:
    """What ``wake`` makes: it notes the sockets it was handed, and what it is asked."""

    def __init__(self, front: early.EarlyMPI) -> None:
        self.ours = dict(front.ours)
        self.theirs = dict(front.theirs)
        self.door = front.door
        self.probe = front.probe            # the services' own from now on, as the real ones take it
        self.singletons: List[tuple] = []
        self.closed = False
        self.first = None

    def singleton(self, key: int, size: int) -> None:
        self.singletons.append((key, size))

    def check_singletons(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True
        if self.probe is not None:
            self.probe.close()


class Job:
    """The served job's view, as the front reads it."""

    def __init__(self, loop: Loop, size: int) -> None:
        host = SimpleNamespace(local=True)
        self.loop = loop
        self.plan = SimpleNamespace(kvsname="kvs_1_0123abcd", ranks=[
            SimpleNamespace(rank=r, key=r, env={}, host=host) for r in range(size)])
        self.watchdog = SimpleNamespace(marker="kvs_1_0123abcd", task=lambda name, arg: None)
        self.ending: Optional[str] = None
        self.woken: List[Services] = []

    def wake(self, front: early.EarlyMPI) -> Services:
        self.woken.append(Services(front))
        return self.woken[-1]


@pytest.fixture
def job(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    loop = Loop()
    yield Job(loop, 3)
    loop.close()


def _known(environ: Dict[str, str]) -> None:
    """The library's variables kept, as a first job would have kept them."""
    line = template.key(environ)
    assert line is not None
    template.save(cache_path(template.file_name()), line, TEMPLATE, "/bin/sh", save_whole)


def _turns(loop: Loop, n: int = 3) -> None:
    for _ in range(n):
        loop.run_once(0.05)


def test_without_the_librarys_variables_the_services_start_before_the_ranks(job):
    assert early.early_mpi(job, job.wake, environ={}) is None


def test_a_pmi_word_wakes_the_services_once_and_they_read_it(job):
    front = early.early_mpi(job, job.wake, environ={"MSLAUNCH_PMIX_LIBRARY": "none"})
    assert front is not None and front.door is None
    envs = [front.env(r, {}) for r in range(3)]
    assert [sorted(k for k in e if k.startswith("PMIX")) for e in envs] == [[]] * 3
    fds = [int(e["PMI_FD"]) for e in envs]
    assert all(os.get_inheritable(fd) for fd in fds)
    ranks = [socket.socket(fileno=os.dup(fd)) for fd in fds]     # the ranks' ends
    rank1 = ranks[1]
    front.release_child_fds()           # (spawned)
    _turns(job.loop)
    assert job.woken == []              # nothing said yet
    rank1.sendall(b"cmd=init pmi_version=1 pmi_subversion=1\n")
    _turns(job.loop)
    (woken,) = job.woken
    assert sorted(woken.ours) == [0, 1, 2] and woken.theirs == {}
    # the word that woke them is theirs to read, whole
    assert woken.ours[1].recv(100) == b"cmd=init pmi_version=1 pmi_subversion=1\n"
    for end in ranks:
        end.close()
    front.check_singletons()
    front.close()
    assert woken.closed
    probe = woken.probe                 # its directories went with the services
    assert probe.backing is not None and not os.path.exists(probe.backing)
    assert not os.path.exists(probe.path)


def test_ranks_that_end_without_a_word_wake_nothing(job):
    front = early.early_mpi(job, job.wake, environ={"MSLAUNCH_PMIX_LIBRARY": "none"})
    assert front is not None
    fds = [int(front.env(r, {})["PMI_FD"]) for r in range(3)]
    front.release_child_fds()           # spawned, and gone at once: every end closed
    assert all(_closed(fd) for fd in fds)
    _turns(job.loop)
    assert job.woken == [] and front.ours == {}     # each socket dropped at its end
    probe = front.probe
    assert probe is not None and os.path.isdir(probe.path)
    front.process_ended(job.plan.ranks[0])
    front.left(job.plan.ranks[0])
    front.close()
    assert job.woken == [] and not os.path.exists(probe.path)
    assert front.hang_report() == [] and front.reported() == 0
    assert front.stats(3) == "0 messages from 3 ranks in 0.0000 s"


def _closed(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return True
    return False


def _with_door(job) -> early.EarlyMPI:
    """The front of a job whose PMIx library's variables were kept."""
    environ = {"PATH": "/usr/bin"}
    _known(environ)
    front = early.early_mpi(job, job.wake, environ=environ)
    assert front is not None and front.door is not None
    return front


def test_a_connection_at_the_door_wakes_the_services_with_it_waiting(job):
    front = _with_door(job)
    env = front.env(2, {})
    assert env["PMIX_NAMESPACE"] == "kvs_1_0123abcd" and env["PMIX_RANK"] == "2"
    port = int(env["PMIX_SERVER_URI2"].rpartition(":")[2])
    assert port == front.door.getsockname()[1] and env["PMIX_SERVER_TMPDIR"] == front.directory
    assert env["OMPI_MCA_orte_tmpdir_base"] == front.directory
    assert front.pmix_ranks == {2}
    front.release_child_fds()
    client = socket.create_connection(("127.0.0.1", port))
    _turns(job.loop)
    (woken,) = job.woken
    fd, _ = woken.door._accept()       # still in the listener's queue, for the real door
    os.close(fd)
    client.close()
    woken.door.close()
    front.close()


def test_the_session_base_a_rank_made_goes_though_nothing_woke(job):
    front = _with_door(job)
    env = front.env(0, {})
    front.release_child_fds()
    # what a nested Open MPI 4 mpirun makes under its inherited base
    os.makedirs(os.path.join(env["OMPI_MCA_orte_tmpdir_base"], "ompi.h.0", "jf.1"))
    _turns(job.loop)
    front.close()
    assert job.woken == [] and not os.path.exists(front.directory)


def test_an_open_mpi_file_in_the_probe_wakes_the_services_with_the_singleton(job):
    front = early.early_mpi(job, job.wake, environ={"MSLAUNCH_PMIX_LIBRARY": "none"})
    assert front is not None and front.probe is not None
    env = front.env(1, {})
    assert env["OMPI_MCA_mpi_show_mca_params_file"] == os.path.join(front.probe.path, "1")
    front.release_child_fds()
    front.check_singletons()
    assert job.woken == []
    with open(env["OMPI_MCA_mpi_show_mca_params_file"], "w") as f:
        f.write("#\n# This file was automatically generated on ... by rank 0 (out of a "
                "total of 1) on host\n#\n")
    front.watch_singletons()
    (woken,) = job.woken
    assert woken.singletons == [(1, 1)]
    front.check_singletons()            # (the services' own look from now on)
    assert woken.singletons == [(1, 1)]
    front.close()
    assert woken.closed and not os.path.exists(front.probe.path)
