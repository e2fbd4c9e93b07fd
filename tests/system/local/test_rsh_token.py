"""The one-time token with which an rsh agent's agent dials back never goes into a
command line (which every user of either host may read while the agent starts,
and dial back first with it): it travels in the rsh command's environment and on
its stdin, whichever the rsh agent carries to the host.

The rsh agents here run the command on this machine, as ``ssh`` (stdin on, no
environment), ``qrsh -V`` or ``blaunch`` (the environment, no stdin) and
``kubectl exec`` without ``-i`` (neither) do; each notes the words it was given.
"""

from __future__ import annotations

import os
import re

import pytest

from helpers import clean_env, kill_tagged, new_tag, one_error_line, run, tagged_pids, wait_for

#: Runs ``HOST COMMAND`` here, notes its words, and passes on what its name says.
AGENT = """#!/bin/sh
host=$1; shift
printf '%s\\n' "$@" > "$0.$host.words"
case "$(basename "$0")" in
  stdin-*) exec env -i PATH="$PATH" /bin/sh -c "$*" ;;
  environment-*) exec /bin/sh -c "$*" </dev/null ;;
  *) exec env -i PATH="$PATH" /bin/sh -c "$*" </dev/null ;;
esac
"""

#: A token as the launcher makes them (24 random bytes in hex), a word of its own
#: (the dial program itself is hex in the command line).
TOKEN = re.compile(r"(?<![0-9a-f])[0-9a-f]{48}(?![0-9a-f])")


def _agent(tmp_path, name: str) -> str:
    path = tmp_path / name
    path.write_text(AGENT)
    os.chmod(path, 0o755)
    return str(path)


def _job(agent: str):
    tag = new_tag()
    try:
        return run("--mca", "plm_rsh_agent", agent, "-H", "far1,far2", "-n", "2",
                   "sh", "-c", "echo rank $OMPI_COMM_WORLD_RANK", timeout=90,
                   env=clean_env(MSL_TEST_TAG=tag))
    finally:
        assert wait_for(lambda: not tagged_pids(tag), 15), tagged_pids(tag)
        kill_tagged(tag)


@pytest.mark.parametrize("way", ["stdin", "environment"])
def test_the_token_reaches_the_agent_outside_any_command_line(tmp_path, way):
    agent = _agent(tmp_path, f"{way}-rsh")
    r = _job(agent)
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.decode().splitlines()) == ["rank 0", "rank 1"]
    for host in ("far1", "far2"):
        words = (tmp_path / f"{way}-rsh.{host}.words").read_text()
        assert "MSLAUNCH_DIAL=" in words           # (the words of a dial-back agent)
        assert not TOKEN.search(words), words


def test_an_rsh_agent_that_carries_neither_is_one_line(tmp_path):
    r = _job(_agent(tmp_path, "plain-rsh"))
    line = one_error_line(r.stderr)
    assert r.returncode != 0 and r.stdout == b""
    assert "far1, far2 (ended with status 1 before the agent dialled back: mslaunch: no " \
           "token of the launcher came to this host, neither in the environment nor on " \
           "stdin (the rsh agent passes on neither)" in line, line


def test_kubectl_exec_without_stdin_gets_the_token_in_the_command(tmp_path):
    # The MPI Operator v1's kubexec.sh: neither way reaches the pod, whose only
    # tenant is the job (docs/reference/security.md).
    r = _job(_agent(tmp_path, "kubexec.sh"))
    assert r.returncode == 0, r.stderr
    assert TOKEN.search((tmp_path / "kubexec.sh.far1.words").read_text())
