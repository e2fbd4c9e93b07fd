"""The same program on every host (mslaunch.machine.samepython) and Hydra's
environment rule for Hydra's spellings, on the SSH test hosts.

The user's shell has a virtual environment active (its ``bin`` first on
``PATH``, ``VIRTUAL_ENV`` set) that holds a module the system's Python lacks;
the hosts' login ``PATH`` finds another ``python``.  The test hosts share this
machine's files, so the environment exists on them; a host without it is made
by running the launcher in a mount namespace of its own, where the
environment lives on a tmpfs the hosts do not see.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sysconfig
import tempfile

import pytest
from helpers import PY, cmd, kill_tagged, new_tag
from remote import on_a_terminal, renv, settle
from rsh import hide_ssh_config

from mslaunch.hosts.ranges import host_ranges

pytestmark = pytest.mark.remote

SHOW = ("import socket, sys, only_in_the_venv; "
        "print(socket.gethostname(), sys.prefix, only_in_the_venv.WHERE, flush=True)")


def _make_venv(path: str) -> str:
    subprocess.run([PY, "-m", "venv", "--without-pip", path], check=True, timeout=120)
    purelib = sysconfig.get_path("purelib", vars={"base": path, "platbase": path})
    with open(os.path.join(purelib, "only_in_the_venv.py"), "w") as f:
        f.write("WHERE = 'venv'\n")
    return path


@pytest.fixture(scope="module")
def venv():
    top = tempfile.mkdtemp(prefix="msl-t-venv-", dir="/tmp")
    try:
        yield _make_venv(os.path.join(top, "venv"))
    finally:
        shutil.rmtree(top, ignore_errors=True)


def _activated(home: str, venv: str, **extra: str):
    env = renv(home, **extra)
    env["PATH"] = f"{venv}/bin:{env['PATH']}"
    env["VIRTUAL_ENV"] = venv
    return env


def _ran(r, venv: str, hosts) -> None:
    assert r.returncode == 0, r.stderr
    rows = sorted(line.split() for line in r.stdout.decode().splitlines())
    assert rows == [[h, venv, "venv"] for h in hosts], (r.stdout, r.stderr)


@pytest.mark.parametrize("agent", ["paramiko", "openssh"])
def test_a_venvs_python_runs_on_every_host_without_x(sshbed, venv, tmp_path, agent):
    home = sshbed.make_home(tmp_path / "home")
    way = []
    if agent == "openssh":
        way = ["--mca", "plm_rsh_agent", "ssh : rsh", "--mca", "plm_rsh_args",
               f"-F {hide_ssh_config(home)}"]
    tag = new_tag()
    try:
        r = subprocess.run(cmd(*way, "-v", "-H", "h1,h2", "-n", "2", "-x", "MSL_TEST_TAG",
                               "python", "-c", SHOW), capture_output=True, timeout=120,
                           env=_activated(home, venv, MSL_TEST_TAG=tag))
        settle(tag, sshbed)
    finally:
        kill_tagged(tag)
    _ran(r, venv, ["h1", "h2"])
    # -v says what was done, once for both hosts
    said = [line for line in r.stderr.decode().splitlines()
            if f"python is {venv}/bin/python, as where mslaunch runs" in line]
    assert len(said) == 1 and said[0].startswith("mslaunch: h1, h2: "), r.stderr


def test_a_host_without_the_venv_says_so_in_one_line(sshbed, tmp_path):
    # the launcher in a mount namespace of its own, the environment on a tmpfs there
    # (python3: the hosts' PATH is sshd's, where Debian has no ``python``)
    home = sshbed.make_home(tmp_path / "home")
    hidden = tempfile.mkdtemp(prefix="msl-t-hidden-", dir="/tmp")
    tag = new_tag()
    env = renv(home, MSL_TEST_TAG=tag)
    script = (f"mount -t tmpfs tmpfs {hidden} && {PY} -m venv --without-pip {hidden}/venv && "
              f"PATH={hidden}/venv/bin:$PATH VIRTUAL_ENV={hidden}/venv exec \"$@\"")
    try:
        r = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script,
                            "sh", *cmd("-H", "h1,h2,h3", "-n", "3", "-x", "MSL_TEST_TAG",
                                       "python3", "-c", "import sys; print(sys.prefix)")],
                           capture_output=True, timeout=180, env=env)
        settle(tag, sshbed)
    finally:
        kill_tagged(tag)
        shutil.rmtree(hidden, ignore_errors=True)
    assert r.returncode == 0, r.stderr
    assert f"{hidden}/venv" not in r.stdout.decode(), r.stdout   # it is not there
    lines = [line for line in r.stderr.decode().splitlines() if "as where mslaunch runs" in line]
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("mslaunch: h1-h3: python3 is ") and \
        f"not {hidden}/venv/bin/python3" in lines[0] and "which is not here" in lines[0], lines


def test_hydras_spelling_passes_the_environment_as_hydra_does(sshbed, venv, tmp_path):
    hydra = shutil.which("mpiexec.hydra", path=os.path.dirname(PY))
    assert hydra is not None, "the mpich wheel's mpiexec.hydra"
    home = sshbed.make_home(tmp_path / "home")
    show = "import os, socket; print(socket.gethostname(), os.environ.get('ONLY_HERE'))"
    results = {}
    for who in ("hydra", "mslaunch"):
        tag = new_tag()
        env = _activated(home, venv, MSL_TEST_TAG=tag, ONLY_HERE="yes")
        env["PATH"] = f"{sshbed.bin_dir}:{env['PATH']}"     # Hydra's ssh reaches the hosts
        argv = [hydra, "-launcher", "ssh"] if who == "hydra" else cmd()
        try:
            r = subprocess.run([*argv, "-hosts", "h1,h2", "-n", "2", "python", "-c", SHOW + "; " + show],
                               capture_output=True, timeout=120, env=env)
            settle(tag, sshbed)
        finally:
            kill_tagged(tag)
        assert r.returncode == 0, (who, r.stderr)
        results[who] = sorted(r.stdout.decode().splitlines())
    assert results["mslaunch"] == results["hydra"], results
    assert results["hydra"][1::2] == ["h1 yes", "h2 yes"], results
    # -genvnone: Hydra's rule for it too, the launcher's variables stay here
    tag = new_tag()
    try:
        r = subprocess.run(cmd("-genvnone", "-hosts", "h1", "-n", "1", "-x", "MSL_TEST_TAG",
                               PY, "-c", show), capture_output=True, timeout=120,
                           env=_activated(home, venv, MSL_TEST_TAG=tag, ONLY_HERE="yes"))
        settle(tag, sshbed)
    finally:
        kill_tagged(tag)
    assert r.returncode == 0 and r.stdout == b"h1 None\n", (r.stdout, r.stderr)


def test_open_mpis_spelling_keeps_the_login_environment(sshbed, tmp_path):
    home = sshbed.make_home(tmp_path / "home")
    tag = new_tag()
    try:
        r = subprocess.run(cmd("-H", "h1", "-n", "1", "-x", "MSL_TEST_TAG", PY, "-c",
                               "import os; print(os.environ.get('ONLY_HERE'))"),
                           capture_output=True, timeout=120,
                           env=renv(home, MSL_TEST_TAG=tag, ONLY_HERE="yes"))
        settle(tag, sshbed)
    finally:
        kill_tagged(tag)
    assert r.returncode == 0 and r.stdout == b"None\n", (r.stdout, r.stderr)


@pytest.mark.parametrize("names, said", [
    (["h1", "h2", "h3", "h4", "h5", "h6", "h7", "h8"], "h1-h8"),
    (["h3", "h1", "h2", "h5", "h2"], "h1-h3, h5"),
    (["node007", "node008", "node010", "login"], "login, node007, node008, node010"),
    (["h9", "h10", "h11", "a"], "a, h9-h11"),
])
def test_host_lists_are_said_in_ranges(names, said):
    assert host_ranges(names) == said



def _slow_h2(bed, seconds: float):
    bed.slow_logins("h2", seconds)
    try:
        yield bed
    finally:
        bed.restore()


@pytest.fixture
def slower_h2(sshbed):
    """h2's logins take 20 s: long enough for the late hosts to be named twice
    even when a busy machine makes h1's start, and so the lateness, slow
    (late is three times the start of the hosts up)."""
    yield from _slow_h2(sshbed, 20)


def _late_lines(text: str):
    """(seconds, the rest) of each line naming hosts still starting."""
    found = re.findall(r"^mslaunch: still starting after (\d+) s: (.*)$", text, re.M)
    return [(int(seconds), rest) for seconds, rest in found]


def test_a_slow_host_is_named_while_it_starts(slower_h2, tmp_path):
    from mslaunch.machine import timeline
    home = slower_h2.make_home(tmp_path / "home")
    tag = new_tag()
    try:
        r = subprocess.run(cmd("-H", "h1,h2", "-n", "2", "-x", "MSL_TEST_TAG", "true"),
                           capture_output=True, timeout=120, env=renv(home, MSL_TEST_TAG=tag))
        settle(tag, slower_h2)
    finally:
        kill_tagged(tag)
    assert r.returncode == 0, r.stderr
    err = r.stderr.decode()
    late = _late_lines(err)
    # nothing before a host is late; then again every few seconds while it is
    assert len(late) >= 2, err
    assert late[0][0] >= timeline.LATE_MIN, err
    assert all(b[0] - a[0] >= timeline.REPEAT - 1 for a, b in zip(late, late[1:])), err
    for _, rest in late:        # (h1 too, on a machine that slows its start past the first)
        named = sum(len(part.split(" (", 1)[0].split(", ")) for part in rest.split("; ")[:-1])
        assert "h2 (" in rest and rest.endswith(f"; {2 - named} of 2 hosts up"), err
    assert re.search(r"^mslaunch: every host up after \d+\.\d s$", err, re.M), err
    others = [line for line in err.splitlines() if not line.startswith(
        ("mslaunch: still starting after ", "mslaunch: every host up after "))]
    assert others == [], err


def test_on_a_terminal_the_late_line_is_rewritten_in_place(slower_h2, tmp_path):
    home = slower_h2.make_home(tmp_path / "home")
    tag = new_tag()
    try:
        r = on_a_terminal(renv(home, MSL_TEST_TAG=tag), "-H", "h1,h2", "-n", "2", "-x",
                          "MSL_TEST_TAG", "true")
        assert r.returncode == 0, r.stderr
        settle(tag, slower_h2)
    finally:
        kill_tagged(tag)
    text = r.stderr.decode()
    assert "\n" not in text.replace("\r\n", "\n").strip("\n"), text
    shown = text.split("\r\x1b[K")
    assert len(shown) >= 3, text             # at least two lines, then the clearing
    assert all(part.startswith("mslaunch: still starting after ") for part in shown[1:-1]), text
    assert shown[-1] == "", text


def test_the_companion_commands_answer_while_the_hosts_start(slower_h2, tmp_path):
    from helpers import REPO, wait_for
    home = slower_h2.make_home(tmp_path / "home")
    tag = new_tag()
    p = subprocess.Popen(cmd("-H", "h1,h2", "-n", "2", "-x", "MSL_TEST_TAG", "true"),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env=renv(home, MSL_TEST_TAG=tag))
    try:
        said = {}
        for tool in ("mslaunch-stacks", "mslaunch-top"):
            def asked() -> bool:
                r = subprocess.run([PY, os.path.join(REPO, "scripts", tool), str(p.pid)],
                                   capture_output=True, timeout=30, env=renv(home))
                said[tool] = r
                # h1 is up in seconds (more on a busy machine), h2 takes 20 s more
                return b"remote hosts are starting: 1 of 2" in r.stderr
            assert wait_for(asked, 15), said[tool].stderr
            err = said[tool].stderr.decode()
            assert r_one_line(err) and "h2: starting the agent (its bootstrap and package)" \
                in err and "1 of 2 hosts up" in err, err
        out, err = p.communicate(timeout=90)
        settle(tag, slower_h2)
    finally:
        p.kill()
        p.wait()
        kill_tagged(tag)
    assert p.returncode == 0, err


def r_one_line(err: str) -> bool:
    return len(err.strip().splitlines()) == 1
