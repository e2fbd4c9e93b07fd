"""Host keys are checked against exactly the files the SSH config names, as
OpenSSH's ``ssh -F FILE`` checks them: ``UserKnownHostsFile``,
``GlobalKnownHostsFile`` (``none``: no file), else OpenSSH's defaults; and a
missing paramiko is one line that names how to install it into this Python."""

from __future__ import annotations

import os

from helpers import PY, one_error_line
from remote import renv, run_remote


def _config(home: str, tmp_path, extra: str) -> str:
    """The test bed's ssh config with ``extra`` first (its settings win)."""
    with open(os.path.join(home, ".ssh", "config")) as f:
        text = f.read()
    path = tmp_path / "ssh_config"
    path.write_text(extra + "\n" + text)
    return str(path)


def test_an_empty_user_known_hosts_file_refuses_the_host(sshbed, home, tmp_path):
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    config = _config(home, tmp_path, f"Host *\n    UserKnownHostsFile {empty}\n")
    r = run_remote(home, "--ssh-config", config, "-n", "1", "-H", "h1", "true")
    assert r.returncode != 0
    line = one_error_line(r.stderr)
    assert "host key" in line and f"not in {empty}" in line, line
    assert empty.read_text() == ""


def test_the_global_file_named_is_read_and_accept_new_writes_the_user_file(sshbed, home,
                                                                          tmp_path):
    empty = tmp_path / "user_known_hosts"
    empty.write_text("")
    with open(os.path.join(home, ".ssh", "known_hosts")) as f:
        keys = f.read()
    system = tmp_path / "global_known_hosts"
    system.write_text(keys)
    config = _config(home, tmp_path, f"Host *\n    UserKnownHostsFile {empty}\n"
                     f"    GlobalKnownHostsFile {system}\n")
    r = run_remote(home, "--ssh-config", config, "-n", "1", "-H", "h1", "true")
    assert r.returncode == 0, r.stderr
    assert empty.read_text() == ""
    # accept-new: h2's key goes into the user's file the config names, nowhere else
    system.write_text("")
    config = _config(home, tmp_path, f"Host *\n    UserKnownHostsFile {empty}\n"
                     f"    GlobalKnownHostsFile none\n    StrictHostKeyChecking accept-new\n")
    before = open(os.path.join(home, ".ssh", "known_hosts")).read()
    r = run_remote(home, "--ssh-config", config, "-n", "1", "-H", "h2", "true")
    assert r.returncode == 0, r.stderr
    assert empty.read_text().count("\n") == 1
    assert open(os.path.join(home, ".ssh", "known_hosts")).read() == before


def test_a_missing_paramiko_names_the_command_that_installs_it(sshbed, home, tmp_path):
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "paramiko.py").write_text("raise ImportError('no paramiko in this test')\n")
    env = renv(home)
    env["PYTHONPATH"] = f"{shim}{os.pathsep}{env['PYTHONPATH']}"
    r = run_remote(home, "-n", "1", "-H", "h1", "true", env=env)
    assert r.returncode != 0
    line = one_error_line(r.stderr)
    assert "remote hosts need paramiko, which mslaunch depends on" in line, line
    assert f"{PY} -m pip install paramiko" in line, line
