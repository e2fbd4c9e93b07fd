"""Jobs on the SSH test bed's hosts: their environment, running them, the agents
they leave, and the rank programs several modules' remote cases share."""

from __future__ import annotations

import os
import subprocess

from helpers import clean_env, cmd, tagged_pids, wait_for

FAST_BEAT = "0.3,5"        # heartbeat every 0.3 s, lost after 5 misses


def renv(home: str, **extra: str):
    """The environment of a job run with HOME ``home`` (a test bed HOME: its ssh_config
    reaches the hosts), plus ``extra``."""
    env = clean_env(HOME=home, **extra)
    if "UCX_TLS" not in extra:
        env["UCX_TLS"] = "tcp"                # MPI between namespace hosts goes over TCP
    for name, value in bed_mpi_network(home).items():
        env.setdefault(name, value)
    return env


def bed_mpi_network(home: str) -> dict:
    """The variables that keep this machine's MPI ranks on the bed of ``home``
    (:meth:`sshbed.SSHBed.mpi_network`); none for a HOME made otherwise."""
    from sshbed import MPI_NET_FILE
    try:
        with open(os.path.join(home, MPI_NET_FILE)) as f:
            return dict(line.rstrip("\n").split("=", 1) for line in f if "=" in line)
    except FileNotFoundError:
        return {}


def run_remote(home: str, *args: str, timeout: float = 90, env=None, **kw):
    return subprocess.run(cmd(*args), capture_output=True, timeout=timeout,
                          env=env or renv(home), **kw)


def on_a_terminal(env, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """mslaunch ``args`` with its stderr on a terminal (a pseudo-terminal read here
    until every writer has closed it); stdout a pipe."""
    import os
    import pty
    master, slave = pty.openpty()
    try:
        p = subprocess.Popen(cmd(*args), stdout=subprocess.PIPE, stderr=slave, env=env)
        os.close(slave)
        said = b""
        while True:
            try:
                data = os.read(master, 4096)
            except OSError:         # EIO: every writer of the terminal has closed it
                break
            if not data:
                break
            said += data
        assert p.stdout is not None
        out = p.stdout.read()
        p.stdout.close()
        return subprocess.CompletedProcess(p.args, p.wait(timeout=timeout), out, said)
    finally:
        os.close(master)


def agents(bed, host, watchdogs: bool = True):
    """Agent processes on a host (the bootstrap one-liner they were started with),
    with or without their watchdogs (forks of the agent, hence the same command)."""
    found = {}
    for pid in bed.host_pids(host):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"exec(b.read(int(b.readline())))" not in f.read():
                    continue
            with open(f"/proc/{pid}/stat", "rb") as f:
                found[pid] = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError):
            pass
    return [pid for pid, parent in found.items() if watchdogs or parent not in found]


def no_agents(bed, hosts=None) -> bool:
    """Whether no agent runs on ``hosts`` (every host of ``bed`` by default)."""
    return all(not agents(bed, h) for h in (hosts or bed.hosts))


def settle(tag: str, bed, timeout: float = 15) -> None:
    """Assert that the job tagged ``tag`` is gone, and every agent on ``bed`` with it."""
    assert wait_for(lambda: tagged_pids(tag) == [], timeout), tagged_pids(tag)
    assert wait_for(lambda: no_agents(bed), timeout)


#: A rank that notes each stop signal (and SIGUSR1) in DIR/RANK.SIG, and DIR/RANK.up
#: once its handlers are in place: ``python -c TRAP DIR``.
TRAP = """
import os, signal, sys, time
def handler(sig, frame):
    with open(os.path.join(sys.argv[1], f"{os.environ['RANK']}.{sig}"), "w"):
        pass
    if sig != signal.SIGUSR1:
        sys.exit(0)
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1):
    signal.signal(s, handler)
open(os.path.join(sys.argv[1], f"{os.environ['RANK']}.up"), "w").close()
for _ in range(600):
    time.sleep(0.1)
"""


def start_sleepers(home, tag, *extra, hosts="h1,h2", helpers=""):
    """A job of one ``sleep`` rank per host, once every rank runs (``helpers``:
    ``MSLAUNCH_SSH_HELPERS``, if given)."""
    n = len(hosts.split(","))
    env = renv(home, MSL_TEST_TAG=tag, MSLAUNCH_HEARTBEAT=FAST_BEAT)
    if helpers:
        env["MSLAUNCH_SSH_HELPERS"] = helpers
    p = subprocess.Popen(cmd(*extra, "-H", hosts, "-n", str(n), "-x", "MSL_TEST_TAG",
                             "sleep", "120"),
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def sleeping() -> int:
        count = 0
        for pid in tagged_pids(tag):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    count += f.read().startswith(b"sleep\0")
            except OSError:
                pass
        return count
    assert wait_for(lambda: sleeping() == n, 30), (p.poll(), tagged_pids(tag))
    return p


#: An mpi4py rank that prints its rank, host, node-local peers and an allreduce as
#: JSON: ``python -c MPI_PROG ok|abort|crash``.
MPI_PROG = """
import json, os, socket, sys
from mpi4py import MPI
c = MPI.COMM_WORLD
shared = c.Split_type(MPI.COMM_TYPE_SHARED)
members = shared.allgather(c.rank)
total = c.allreduce(c.rank)
what = sys.argv[1]
if what == "abort" and c.rank == 3:
    c.Abort(17)
if what == "crash" and c.rank == 2:
    import ctypes; ctypes.string_at(0)
if what != "ok":
    c.Barrier()
print(json.dumps({"rank": c.rank, "host": socket.gethostname(), "shared": members,
                  "sum": total, "kvs": os.environ["MSLAUNCH_JOB"]}), flush=True)
"""
