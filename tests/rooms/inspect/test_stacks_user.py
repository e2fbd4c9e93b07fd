"""mslaunch-stacks and mslaunch-top as a user who is not root, on a real job.

The test (run as root, as CI does) picks two unused uids, gives each a home
and TMPDIR of its own, copies the package where both can read it, and runs
a job, ``mslaunch-stacks`` and ``mslaunch-top`` as the first with
``setpriv``.  The second user must get one clear line, never a hang, and
can open neither the job's socket nor its directory.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

from helpers import REPO, new_tag, kill_tagged, tagged_pids, wait_for
from requires import require

RANK = """\
import os, sys, time
def waiting_in_user_job():
    print("ready", flush=True)
    while not os.path.exists(sys.argv[1]):
        time.sleep(0.1)
waiting_in_user_job()
"""


#: Asks a job's control socket for its info as another user: what it answers, in one line.
PROBE = ("import sys\nfrom mslaunch.cli.attach import ask\n"
         "from mslaunch.core.errors import LaunchError\n"
         "try:\n    ask(sys.argv[1], {'op': 'info'}, 5.0)\n"
         "except LaunchError as err:\n    print(err)\n")


def _free_uids(count: int):
    uids, uid = [], 61000 + os.getpid() % 2000 * 2
    while len(uids) < count:
        try:
            pwd.getpwuid(uid)
        except KeyError:
            uids.append(uid)
        uid += 1
    return uids


class User:
    """A uid with a home and TMPDIR of its own, running commands with setpriv."""

    def __init__(self, uid: int, base: str, src: str) -> None:
        self.uid = uid
        self.home = os.path.join(base, f"home-{uid}")
        os.mkdir(self.home, 0o700)
        os.chown(self.home, uid, uid)
        self.src = src
        self.python = sys.executable

    def env(self, **extra: str):
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": self.home, "TMPDIR": self.home,
               "PYTHONPATH": self.src, "LANG": "C.UTF-8", "MSL_TEST_TAG": self.tag}
        env.update(extra)
        return env

    def argv(self, *args: str):
        return ["setpriv", f"--reuid={self.uid}", f"--regid={self.uid}", "--clear-groups",
                "--", *args]

    def run(self, *args: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess:
        return subprocess.run(self.argv(*args), capture_output=True, timeout=timeout,
                              env=self.env(**env), cwd=self.home)

    def tool(self, name: str, *args: str, **env: str) -> subprocess.CompletedProcess:
        return self.run(self.python, os.path.join(self.src, "scripts", name), *args, **env)

    def pick_python(self) -> None:
        """This Python if the user may run it (a venv under root's home is not), else
        the system's: what the user would have."""
        probe = ("import os, sys, mslaunch; "
                 "sys.exit(0 if os.access(os.path.realpath(sys.executable), os.X_OK) else 1)")
        for python in (sys.executable, "/usr/bin/python3", shutil.which("python3")):
            if python and self.run(python, "-c", probe).returncode == 0:
                self.python = python
                return
        pytest.fail(f"no Python that uid {self.uid} may run (tried {sys.executable}, python3)")


@pytest.fixture
def users():
    require(os.geteuid() == 0, "root (to run a job as two other users)")
    require(shutil.which("setpriv") is not None, "setpriv (util-linux)")
    base = tempfile.mkdtemp(prefix="msl-users-")
    os.chmod(base, 0o755)            # pytest's own directories are root's alone
    src = os.path.join(base, "src")
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(os.path.join(REPO, "mslaunch"), os.path.join(src, "mslaunch"), ignore=ignore)
    shutil.copytree(os.path.join(REPO, "scripts"), os.path.join(src, "scripts"), ignore=ignore)
    tag = new_tag()
    made = []
    for uid in _free_uids(2):
        user = User(uid, base, src)
        user.tag = tag
        made.append(user)
    made[0].pick_python()
    made[1].python = made[0].python
    try:
        yield made
    finally:
        kill_tagged(tag)
        wait_for(lambda: not tagged_pids(tag), 5.0)
        shutil.rmtree(base, ignore_errors=True)


def _main_frames(data, rank):
    [entry] = [r for r in data["ranks"] if r["rank"] == rank]
    return entry["threads"][0] if entry["threads"] else []


def test_stacks_and_top_as_a_user_and_refused_to_another(users):
    owner, other = users
    script = os.path.join(owner.home, "rank.py")
    release = os.path.join(owner.home, "release")
    with open(script, "w") as f:
        f.write(RANK)
    os.chown(script, owner.uid, owner.uid)
    job = subprocess.Popen(owner.argv(owner.python, "-m", "mslaunch", "-n", "2",
                                      owner.python, script, release),
                           env=owner.env(), cwd=owner.home,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        # the job is this user's only one: found without naming it
        last: list = []

        def both_waiting() -> bool:
            r = owner.tool("mslaunch-stacks", "--json")
            data = json.loads(r.stdout) if r.returncode == 0 else None
            last[:] = [r.stderr, data]
            # both in the same place: a rank between two naps (os.path.exists) is
            # of a class of its own, and is caught there now and then on a busy machine
            return bool(data) and len(data["ranks"]) == 2 and all(
                any("waiting_in_user_job" in f for f in _main_frames(data, n))
                for n in (0, 1)) and data["classes"] == [[0, 1]]
        assert wait_for(both_waiting, 60, 0.3), last
        data = last[1]
        assert data["no_answer"] == []
        text = owner.tool("mslaunch-stacks")
        assert text.returncode == 0 and b"ranks 0-1 (2)" in text.stdout, text
        top = owner.tool("mslaunch-top", "--once")
        assert top.returncode == 0, top.stderr
        pids = {str(r["pid"]) for r in data["ranks"]}
        rows = [line.split() for line in top.stdout.decode().splitlines()[2:4]]
        assert {row[2] for row in rows} == pids, top.stdout.decode()

        # another user: one clear line, at once, by pid or not, from its own
        # TMPDIR or from the owner's (which is not private to it: not searched)
        launcher = str(job.pid)
        for args, tmp in (((), other.home), ((launcher,), other.home),
                          ((launcher,), owner.home)):
            started = time.monotonic()
            r = other.tool("mslaunch-stacks", *args, TMPDIR=tmp)
            lines = r.stderr.decode().splitlines()
            assert r.returncode == 1 and len(lines) == 1, r.stderr
            assert lines[0].startswith("mslaunch-stacks: no running mslaunch job"), lines
            assert time.monotonic() - started < 20
        [sock] = [os.path.join(d, n) for d, _, names in os.walk(owner.home)
                  for n in names if n == launcher + ".sock"]
        r = other.run(other.python, "-c", PROBE, sock)
        assert r.stdout.decode().strip() == "cannot reach the job: Permission denied", r
        # a socket another user can reach (a umask of 0, a directory opened by
        # hand) still answers only its owner, and says so
        for path in (owner.home, os.path.dirname(sock)):
            os.chmod(path, 0o711)
        os.chmod(sock, 0o777)
        r = other.run(other.python, "-c", PROBE, sock)
        assert r.stdout.decode().strip() == "the job says: it is another user's job", r
        for path in (owner.home, os.path.dirname(sock)):
            os.chmod(path, 0o700)
        assert job.poll() is None             # all this left the job running
    finally:
        with open(release, "w"):
            pass
    out, err = job.communicate(timeout=60)
    assert job.returncode == 0, err
    assert out.count(b"ready") == 2
    # the owner's private directory went with the job: its watchdog removes it once
    # the launcher is gone, so its end is waited for (it carries the job's tag)
    assert wait_for(lambda: not tagged_pids(owner.tag), 30), tagged_pids(owner.tag)
    assert not [n for n in os.listdir(owner.home) if n.startswith("mslaunch")]


def test_a_root_jobs_control_socket_refuses_another_user(users, tmp_path):
    """A job of root's answers root alone, even where another user can reach its socket."""
    _, other = users
    tmp = os.path.join(os.path.dirname(other.home), "root-tmp")
    os.mkdir(tmp, 0o755)
    release = os.path.join(tmp, "release")
    script = os.path.join(tmp, "rank.py")
    with open(script, "w") as f:
        f.write(RANK)
    env = dict(other.env(), HOME=tmp, TMPDIR=tmp)
    job = subprocess.Popen([sys.executable, "-m", "mslaunch", "-n", "1", sys.executable, script,
                            release], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        sock = os.path.join(tmp, "mslaunch-0", f"{job.pid}.sock")
        assert wait_for(lambda: os.path.exists(sock), 30), job.poll()
        os.chmod(os.path.dirname(sock), 0o711)       # as by hand: the socket reachable
        os.chmod(sock, 0o777)
        r = other.run(other.python, "-c", PROBE, sock)
        assert r.stdout.decode().strip() == "the job says: it is another user's job", r
        os.chmod(os.path.dirname(sock), 0o700)
        assert job.poll() is None
    finally:
        with open(release, "w"):
            pass
    _, err = job.communicate(timeout=60)
    assert job.returncode == 0, err
