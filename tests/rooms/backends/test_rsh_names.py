"""An rsh agent's failure is said with the host's name, never a placeholder:
hosts that failed alike are one group, said with the first host's words."""

from __future__ import annotations

import os

from helpers import one_error_line, run


def _agent(tmp_path) -> str:
    """An rsh agent that cannot resolve any host, in ssh's words."""
    path = tmp_path / "fake-ssh"
    path.write_text('#!/bin/sh\necho "ssh: Could not resolve hostname $1: Name or service '
                    'not known" >&2\nexit 255\n')
    os.chmod(path, 0o755)
    return str(path)


def test_one_host_s_error_names_it(tmp_path):
    r = run("--mca", "plm_rsh_agent", _agent(tmp_path), "-n", "1", "-H", "far1", "true")
    line = one_error_line(r.stderr)
    assert r.returncode != 0
    assert "far1 (ended with status 255 before the agent dialled back: ssh: Could not " \
           "resolve hostname far1: Name or service not known)" in line, line


def test_hosts_that_failed_alike_are_one_group_said_with_a_name(tmp_path):
    r = run("--mca", "plm_rsh_agent", _agent(tmp_path), "-n", "2", "-H", "far1,far2", "true")
    line = one_error_line(r.stderr)
    assert "far1, far2 (ended with status 255 before the agent dialled back: ssh: Could not " \
           "resolve hostname far1: Name or service not known; the others alike, each with " \
           "its own name)" in line, line
    assert "hostname HOST" not in line
