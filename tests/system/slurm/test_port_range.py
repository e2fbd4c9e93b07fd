"""Hydra's port range (``MPICH_PORT_RANGE``, ``MPIEXEC_PORT_RANGE``): every port
mslaunch listens on for a job -- the PMI TCP door, the agents' dial-in and
output listener, the free port it picks for ``MASTER_PORT`` -- on the launcher
and on the agents, is one of the range; a full range or a bad value is one
error line.
"""

from __future__ import annotations

import socket
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import PY, clean_env, cmd, error_lines, one_error_line, run, socket_inodes
from ports import free_block
from mslaunch.cli.hydraenv import port_range
from mslaunch.core.errors import UsageError

SHOW = "import os; print(os.environ['PMI_PORT'], os.environ['MASTER_PORT'], flush=True)"


def _free_range(size: int) -> tuple:
    """``size`` consecutive ports that are free now, below the ephemeral range
    (in it, another test's connection could take one before the launcher binds)."""
    return free_block(size)


def _ports(stdout: bytes):
    rows = [line.split() for line in stdout.decode().splitlines()]
    return [(int(pmi.rsplit(":", 1)[1]), int(master)) for pmi, master in rows]


@pytest.mark.parametrize("var", ["MPIEXEC_PORT_RANGE", "MPICH_PORT_RANGE"])
def test_pmi_port_and_master_port_are_of_the_range(var):
    low, high = _free_range(4)
    r = run("-n", "3", "-pmi-port", PY, "-c", SHOW,
            env=clean_env(**{var: f"{low}:{high}"}, MASTER_PORT=""))
    assert r.returncode == 0, r.stderr
    ports = _ports(r.stdout)
    assert len(ports) == 3 and len(set(ports)) == 1, ports
    pmi, master = ports[0]
    assert low <= pmi <= high and low <= master <= high and pmi != master, (ports, low, high)


def test_mpich_port_range_wins_over_mpiexec_port_range_as_in_hydra():
    low, high = _free_range(2)
    r = run("-n", "1", "-pmi-port", PY, "-c", SHOW,
            env=clean_env(MPICH_PORT_RANGE=f"{low}:{high}", MPIEXEC_PORT_RANGE="1:1"))
    assert r.returncode == 0, r.stderr
    (pmi, master), = _ports(r.stdout)
    assert {pmi, master} == {low, high}


def test_a_range_with_no_free_port_is_one_error_line():
    low, high = _free_range(1)
    taken = socket.socket()
    taken.bind(("", low))
    taken.listen()
    try:
        r = run("-n", "1", "-pmi-port", PY, "-c", SHOW,
                env=clean_env(MPIEXEC_PORT_RANGE=f"{low}:{high}"))
    finally:
        taken.close()
    line = one_error_line(r.stderr)
    assert r.returncode == 1 and r.stdout == b""
    assert "MPIEXEC_PORT_RANGE" in line and f"{low}:{high}" in line, line


@pytest.mark.parametrize("value", ["", "abc", "5000", "50:40", "1:70000", "0:10", "1:2:3"])
def test_a_bad_range_is_one_error_line_exit_2(value):
    r = run("-n", "1", "true", env=clean_env(MPIEXEC_PORT_RANGE=value))
    line = one_error_line(r.stderr)
    assert r.returncode == 2 and "MPIEXEC_PORT_RANGE" in line, line


def test_zero_zero_is_any_port_as_in_hydra():
    r = run("-n", "1", "-pmi-port", PY, "-c", SHOW, env=clean_env(MPICH_PORT_RANGE="0:0"))
    assert r.returncode == 0, r.stderr


@settings(max_examples=300, deadline=None)
@given(st.one_of(
    st.tuples(st.integers(-5, 70000), st.integers(-5, 70000)).map(lambda t: f"{t[0]}:{t[1]}"),
    st.text(alphabet=" 0123456789:-+x\t", max_size=14),
    st.text(max_size=10)))
def test_port_range_parser(text):
    try:
        got = port_range("MPIEXEC_PORT_RANGE", text)
    except UsageError as err:
        message = str(err)
        assert message.startswith("MPIEXEC_PORT_RANGE (environment): ")
        assert "\n" not in message
        return
    low, _, high = text.strip().partition(":")
    if got is None:
        assert int(low) == int(high) == 0
    else:
        assert got == (int(low), int(high)) and 1 <= got[0] <= got[1] <= 65535


# -- remote hosts: the agents' PMI door, the launcher's listeners ----------------------

WAIT = ("import os, sys; print(os.environ['PMI_PORT'], os.environ['MASTER_PORT'], flush=True);"
        " sys.stdin.readline()")


def _launcher_sockets(pid: int):
    """(state, local port, remote port) of the TCP sockets process ``pid`` holds,
    but not those it inherited from its parent (salloc's, under Slurm)."""
    from netbed import parent_pid
    inodes = socket_inodes(pid) - socket_inodes(parent_pid(pid))
    found = []
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{table}") as f:
            for row in f.read().splitlines()[1:]:
                cols = row.split()
                if cols[9] in inodes:
                    found.append((cols[3], int(cols[1].rsplit(":", 1)[1], 16),
                                  int(cols[2].rsplit(":", 1)[1], 16)))
    return found


@pytest.mark.remote
@pytest.mark.parametrize("how", ["ssh", "kubexec"])
def test_remote_agents_and_the_launcher_listen_in_the_range(sshbed, tmp_path, how):
    from remote import renv
    from rsh import kubexec
    home = sshbed.make_home(tmp_path / "home")
    way = [] if how == "ssh" else ["--mca", "plm_rsh_agent", kubexec(sshbed, tmp_path)]
    low, high = _free_range(8)
    host = sshbed.hosts[0].name
    p = subprocess.Popen(cmd(*way, "-H", host, "-n", "1", "-pmi-port", PY, "-c", WAIT),
                         env=renv(home, MPIEXEC_PORT_RANGE=f"{low}:{high}"),
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        line = p.stdout.readline()
        socks = _launcher_sockets(p.pid)
    finally:
        p.stdin.write(b"go\n")
        out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    (pmi, master), = _ports(line)
    assert low <= pmi <= high and low <= master <= high, (line, low, high)
    listening = [local for state, local, _ in socks if state == "0A"]
    accepted = [local for state, local, remote in socks if state == "01" and remote != 22]
    assert accepted, socks                  # the agent's connection (link or output)
    assert all(low <= port <= high for port in listening + accepted), (socks, low, high)


@pytest.mark.remote
def test_srun_agents_and_the_launcher_listen_in_the_range(slurmbed):
    from helpers import new_tag, tagged_pids, wait_for
    from slurm import salloc
    tag = new_tag()
    low, high = _free_range(8)
    p = salloc(slurmbed, tag, "-n", "2", "-pmi-port", PY, "-c", WAIT, per_node=1,
               extra_env={"MPIEXEC_PORT_RANGE": f"{low}:{high}"}, stdin=subprocess.PIPE)

    def launcher():
        for pid in tagged_pids(tag):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if f.read().split(b"\0")[1:3] == [b"-m", b"mslaunch"]:
                        return pid
            except OSError:
                continue
        return None

    try:
        lines = [p.stdout.readline(), p.stdout.readline()]
        assert wait_for(lambda: launcher() is not None, 10)
        socks = _launcher_sockets(launcher())
    finally:
        p.stdin.write(b"go\n")
        out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    for pmi, master in _ports(b"".join(lines)):
        assert low <= pmi <= high and low <= master <= high, (lines, low, high)
    accepted = [local for state, local, _ in socks if state == "01"]
    assert accepted, socks                  # the agents' links, dialled in
    assert all(low <= port <= high for state, port, _ in socks if state in ("01", "0A")), \
        (socks, low, high)


@pytest.mark.remote
def test_an_agent_with_no_free_port_of_the_range_is_one_error_line(sshbed, tmp_path):
    from remote import renv
    sshbed.require_netns("a port taken on the host only")
    home = sshbed.make_home(tmp_path / "home")
    low, high = _free_range(1)
    h1 = sshbed.hosts[0]
    # The port is taken in h1's network only: the launcher's side is free.
    taker = subprocess.Popen(
        ["nsenter", "-t", str(h1.pid), "-n", "--", PY, "-c",
         f"import socket, sys; s = socket.socket(); s.bind(('', {low})); s.listen();"
         " print('ok', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert taker.stdout.readline() == b"ok\n"
        r = subprocess.run(cmd("-H", h1.name, "-n", "1", "-pmi-port", PY, "-c", SHOW),
                           capture_output=True, timeout=90,
                           env=renv(home, MPIEXEC_PORT_RANGE=f"{low}:{high}"))
    finally:
        taker.stdin.close()
        taker.wait(10)
    # As for any failure an agent reports: the host's line, then its ranks', 255.
    lines = error_lines(r.stderr.decode())
    assert r.returncode == 255 and r.stdout == b"" and len(lines) == 2, r.stderr.decode()
    assert lines[0].startswith(f"mslaunch: lost host {h1.name}: the agent reported: no free ")
    assert lines[1].startswith("mslaunch: rank 0 ")
    assert all(f"MPIEXEC_PORT_RANGE {low}:{high}" in line for line in lines), lines
