"""Another user of the node cannot end, slow or reach a job through its ports.

The crowd (tests/programs/crowd.py) runs as ``nobody``, handed every address
the job's processes listen on, found by root from their own descriptors (TCP
and Unix, as ``/proc/net`` names them): it holds 2,000 connections to each
and sends junk on every tenth, while the job's ranks reach ``MPI_Init``.  The
job, whose descriptor limit is 1,024, must end 0 with its result, print no
line of its own or of libpmix about it, and hold none of the crowd's
connections while it still runs (the tallies are taken before its ranks may
end): each one is refused, dropped by the kernel, or closed at once.
Open MPI 4.1.4's ranks, with the PMIx server started before them (the first
job of a user here) or started by the first rank's knock (a template kept
from before); MPICH's with the PMI TCP port (``-pmi-port``); and Open MPI's
on two SSH test hosts, with one crowd at the agent's ports on a host (in its
network namespace) and one at the launcher's.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess

import pytest
from requires import require
from helpers import NOBODY, PY, clean_env, cmd, error_lines, kill_tagged, new_tag, open_copies, program, \
    read_until, socket_inodes, wait_for
from netbed import descendants

CONNECTIONS = 2000
HOLD = 14


@pytest.fixture(scope="module")
def crowd():
    """The crowd's program where every user may read it."""
    require(os.geteuid() == 0, "root, to run the crowd as another user")
    require(shutil.which("setpriv") is not None and shutil.which("prlimit") is not None,
            "setpriv and prlimit (util-linux)")
    where = open_copies("msl-crowd-", "crowd.py")
    yield os.path.join(where, "crowd.py")
    shutil.rmtree(where, ignore_errors=True)


def _tree(pid):
    """``pid`` and its descendants."""
    return [pid, *descendants(pid)]


def _listening(pids, net="/proc/net"):
    """Every TCP and Unix address the processes ``pids`` listen on, as the tables
    of ``net`` (a network namespace's, ``/proc/PID/net``) show them."""
    inodes = set()
    for pid in pids:
        try:
            inodes |= socket_inodes(pid)
        except OSError:
            continue
    found = []
    for table, v6 in ((f"{net}/tcp", False), (f"{net}/tcp6", True)):
        with open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if fields[3] != "0A" or fields[9] not in inodes:
                    continue
                addr, port = fields[1].split(":")
                raw = bytes.fromhex(addr)
                if v6:
                    import socket
                    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
                    host = f"[{socket.inet_ntop(socket.AF_INET6, words)}]"
                else:
                    host = ".".join(str(b) for b in raw[::-1])
                found.append(f"{host}:{int(port, 16)}")
    with open(f"{net}/unix") as f:
        for line in f.readlines()[1:]:
            fields = line.split()
            # flags 00010000: listening; a name that is a path
            if len(fields) >= 8 and fields[6] in inodes and fields[3] == "00010000" \
                    and fields[7].startswith("/"):
                path = fields[7]
                # the name it was bound to: the control socket is renamed once it listens
                found.append(path if os.path.exists(path) else path.removesuffix(".new"))
    return sorted(set(found))


def _descriptor_limit():
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))


@pytest.mark.parametrize("kind", ["ompi4-first", "ompi4-kept", "mpich-port"])
def test_another_user_crowding_every_port_changes_nothing(kind, crowd, tmp_path, own_tmpdir):
    env = clean_env(MSL_TEST_TAG=new_tag(), XDG_CACHE_HOME=str(tmp_path / "cache"))
    tag = env["MSL_TEST_TAG"]
    options = ["-n", "2"]
    if kind.startswith("ompi4"):
        from ompi import open_mpi_4
        python = open_mpi_4()
        require(python is not None, "Debian's python3-mpi4py on Open MPI 4.1.4")
        if kind == "ompi4-kept":       # a job before: the server's variables are kept
            done = subprocess.run(cmd("-n", "1", python, "-c",
                                      "from mpi4py import MPI; MPI.COMM_WORLD.Barrier()"),
                                  env=env, capture_output=True, timeout=120)
            assert done.returncode == 0, done.stderr
    else:
        from requires import mpich_ready
        require(mpich_ready(), "mpi4py with the MPICH wheel")
        python = PY
        options.append("-pmi-port")
    out = tmp_path / "out"
    out.mkdir()
    job = subprocess.Popen(cmd(*options, python, program("late_init.py"), str(out)), env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           preexec_fn=_descriptor_limit)
    attack = None
    try:
        assert wait_for(lambda: all((out / f"ready.{r}").exists() for r in (0, 1)), 60), \
            job.stderr.read1().decode() if job.poll() is not None else "ranks not ready"
        addresses = _listening(_tree(job.pid))
        assert any(":" in a and not a.startswith("/") for a in addresses), addresses
        attack = _crowd(crowd, addresses)
        stdout, stderr, (tally,), (held,) = _crowded(
            job, out, 2, [attack], [(_tree(job.pid), "/proc/net")])
    finally:
        job.kill()
        if attack is not None:
            attack.kill()
        kill_tagged(tag)
    assert job.returncode == 0, stderr.decode()
    assert sorted(stdout.decode().splitlines()) == ["sum 3 at 0", "sum 3 at 1"], stdout
    assert error_lines(stderr.decode()) == [], stderr.decode()
    # none held by the job: refused, dropped unanswered, or closed at once
    _none_held(tally, held)


def _crowd(crowd, addresses, netns=None):
    """The crowd at ``addresses``, started, holding (on ``netns``'s host if given)."""
    attack = subprocess.Popen(
        [*(["ip", "netns", "exec", netns] if netns else []),
         "prlimit", f"--nofile={CONNECTIONS * len(addresses) + 64}", *NOBODY,
         "/usr/bin/python3", crowd, str(HOLD), str(CONNECTIONS), *addresses],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd="/")
    read_until(attack.stdout, b"holding\n", timeout=60)
    return attack


def _tcp_table(net):
    """Inode -> (local, remote) of every TCP socket in ``net``'s tables (hex as there)."""
    table = {}
    for name in ("tcp", "tcp6"):
        with open(f"{net}/{name}") as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                table[fields[9]] = (fields[1], fields[2])
    return table


def _held(job_pids, attack, net):
    """How many of the crowd's connections the job's processes hold, as the kernel
    shows it: their sockets whose far end is one of the crowd's."""
    table = _tcp_table(net)
    # both ends must match: a port of the crowd's may also be a rank's own, towards
    # another address (the kernel shares a local port among destinations)
    theirs = {table[i] for i in socket_inodes(attack.pid) if i in table}
    ours = set()
    for pid in job_pids:
        try:
            ours |= socket_inodes(pid)
        except OSError:
            continue
    return sum(1 for i in ours if i in table and table[i][::-1] in theirs)


def _crowded(job, out, size, attacks, where):
    """Let the job's ``size`` ranks reach ``MPI_Init`` while the crowds hold on;
    once each has printed its sum, and the crowds have held for :data:`HOLD` s
    and seen no more happen, count the crowds' connections the job holds
    (``where``: per crowd, the job's processes there and their ``/proc/PID/net``),
    then let it end: its stdout, its stderr, the tallies and the counts."""
    (out / "go").touch()
    said = b""
    while said.count(b"sum ") < size:
        said += read_until(job.stdout, b"\n", timeout=120)
    tallies = []
    for attack in attacks:
        attack.stdin.write(b"report\n")
        attack.stdin.flush()
    for attack in attacks:
        tallies.append(json.loads(read_until(attack.stdout, b"\n", timeout=HOLD + 60)))
    # A connection the kernel completes late (a SYN cookie checked when the crowd
    # sends its junk again) is judged and closed as it comes: none may stay held.
    held = []
    for attack, (pids, net) in zip(attacks, where):
        wait_for(lambda: _held(pids, attack, net) == 0, 10)
        held.append(_held(pids, attack, net))
    for attack in attacks:
        attack.communicate(timeout=60)
    (out / "end").touch()
    stdout, stderr = job.communicate(timeout=120)
    return said + stdout, stderr, tallies, held


def _none_held(tally, held):
    """Every address was crowded, one at least let the crowd's connections
    complete (a door), and the job held none of them."""
    assert all(seen["tried"] == CONNECTIONS for seen in tally.values()), tally
    assert any(seen["completed"] for seen in tally.values()), tally
    assert held == 0, (held, tally)


@pytest.mark.remote
def test_another_user_crowding_a_remote_host_and_the_launcher_changes_nothing(
        crowd, sshbed, ompi4, tmp_path):
    """The same on an SSH test host's agent (the crowd in that host's network
    namespace) and, at once, at the launcher's ports (its agents' dial-back)."""
    from remote import renv
    sshbed.require_netns()
    home = sshbed.make_home(tmp_path / "home")
    tag = new_tag()
    out = tmp_path / "out"
    out.mkdir()
    job = subprocess.Popen(cmd("-H", "h1:2,h2:2", "-n", "4", "-x", "MSL_TEST_TAG", ompi4,
                               program("late_init.py"), str(out)),
                           env=clean_env(MSL_TEST_TAG=tag, **renv(home)),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           preexec_fn=_descriptor_limit)
    attacks = []
    try:
        assert wait_for(lambda: all((out / f"ready.{r}").exists() for r in range(4)), 90), \
            "ranks not ready"
        rank0 = int((out / "ready.0").read_text())
        with open(f"/proc/{rank0}/stat") as f:
            agent = int(f.read().rsplit(")", 1)[1].split()[1])
        there = _listening(_tree(agent), net=f"/proc/{agent}/net")
        here = _listening(_tree(job.pid))
        assert there and here, (there, here)
        attacks = [_crowd(crowd, there, netns=sshbed.host("h1").namespace),
                   _crowd(crowd, here)]
        stdout, stderr, tallies, held = _crowded(
            job, out, 4, attacks, [(_tree(agent), f"/proc/{agent}/net"),
                                   (_tree(job.pid), "/proc/net")])
    finally:
        job.kill()
        for a in attacks:
            a.kill()
        kill_tagged(tag)
    assert job.returncode == 0, stderr.decode()
    assert sorted(stdout.decode().splitlines()) == [f"sum 10 at {r}" for r in range(4)], stdout
    assert error_lines(stderr.decode()) == [], stderr.decode()
    for tally, count in zip(tallies, held):
        _none_held(tally, count)
