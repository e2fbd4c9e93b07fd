"""mslaunch inside a real Slurm allocation: agents started with srun, dialling back.

The cluster is the Slurm test bed (:mod:`slurmbed`): slurmctld and one slurmd
per network-namespace node (h1, h2), clients in the root namespace.  Under
``salloc`` mslaunch runs in the root namespace, which is not a node, so every
node's ranks run under an agent that ``srun`` started there; under ``sbatch``
mslaunch runs on h1 and starts h1's ranks itself.
"""

from __future__ import annotations

import os
import re
import signal
import time

import pytest

from helpers import (PY, clean_env, cmd, hosts_saying, kill_tagged, new_tag, socket_inodes,
                     tagged_pids, wait_for)
from netbed import parent_pid
from slurm import benv, cmdline, finish, left_on_nodes, salloc, sbatch_lines, wrapper_script

pytestmark = pytest.mark.remote

SHOW = ("import os, socket; print(os.environ['OMPI_COMM_WORLD_RANK'], socket.gethostname(), "
        "os.environ.get('SLURM_PROCID', '-'), flush=True)")


def test_ranks_run_on_every_node_through_srun_with_files_on_the_launcher(slurmbed, tmp_path):
    tag = new_tag()
    p = salloc(slurmbed, tag, "-n", "4", "--output-filename", str(tmp_path / "log"),
               "--merge-stderr-to-stdout", "-v", PY, "-c", SHOW, cwd=tmp_path)
    rc, out, err = finish(p)
    assert rc == 0, err
    rows = sorted(line.split() for line in out.splitlines() if line[:1].isdigit())
    assert [r[:2] for r in rows] == [["0", "h1"], ["1", "h1"], ["2", "h2"], ["3", "h2"]], out
    assert all(r[2] == "-" for r in rows), "the agent's srun task identity leaked to ranks"
    assert "with srun" in err, err
    # plain, as the link itself is
    assert hosts_saying(err, "output on a connection of its own (plain TCP)") == ["h1", "h2"], err
    # Each agent said its bytecode version when it dialled back, one of ours: it
    # was sent the bootstrap compiled, not its source (some 9 KB).
    from mslaunch.backends.agents.bootstrap import bootstrap_code
    code = len(bootstrap_code())
    sent = [int(n) for n in re.findall(r"agent started from the host's mslaunch at .* "
                                       r"\((\d+) bytes sent\)", err)]
    assert len(sent) == 2 and all(code < n < code + 1024 for n in sent), (code, err)
    for rank, host in enumerate(["h1", "h1", "h2", "h2"]):
        text = (tmp_path / "log" / "1" / f"rank.{rank}" / "stdout").read_text()
        assert text.split()[:2] == [str(rank), host]
    assert wait_for(lambda: not left_on_nodes(slurmbed, tag), 10)
    assert all(not slurmbed.task_pids(h) for h in (1, 2))


def test_a_launch_agent_wrapper_runs_the_agents_under_srun(slurmbed, tmp_path):
    tag = new_tag()
    p = salloc(slurmbed, tag, "--launch-agent", f"{wrapper_script(tmp_path)} orted", "-n", "4",
               PY, "-c", SHOW, cwd=tmp_path)
    rc, out, err = finish(p)
    assert rc == 0, err
    assert sorted(line.split()[1] for line in out.splitlines() if line[:1].isdigit()) == \
        ["h1", "h1", "h2", "h2"]
    # each node's agent was started through the wrapper, the dial-back variables set inside
    assert sorted((tmp_path / "wrapped").read_text().split("\n")[:-1]) == ["h1 env", "h2 env"]
    assert wait_for(lambda: not left_on_nodes(slurmbed, tag), 10)


def _listening_ports(pid: int) -> list:
    """The TCP ports ``pid`` listens on (this network namespace's tables)."""
    inodes = socket_inodes(pid)
    ports = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                cols = line.split()
                if cols[3] == "0A" and cols[9] in inodes:
                    ports.append((cols[1].rsplit(":", 1)[0], int(cols[1].rsplit(":", 1)[1], 16)))
    return ports


def test_a_stranger_on_the_dial_back_port_does_not_hold_up_the_agents(slurmbed, tmp_path):
    """While the agents start (slowed here by a remote Python that waits), a
    stranger connects to the port they dial back to and trickles bytes that
    never make a token: the agents are greeted all the same, and the stranger
    is cut off."""
    import socket
    import threading
    tag = new_tag()
    slow = tmp_path / "slow-python"
    slow.write_text(f"#!/bin/sh\nsleep 3\nexec {PY} \"$@\"\n")
    slow.chmod(0o755)
    p = salloc(slurmbed, tag, "--remote-python", str(slow), "-n", "2", PY, "-c", SHOW,
               per_node=1)
    stop = threading.Event()
    cut = []

    def trickle(port: int) -> None:
        with socket.create_connection((address, port), 5) as s:
            s.settimeout(0.5)
            while not stop.is_set():
                try:
                    s.sendall(b"x")
                    if s.recv(1) == b"":
                        cut.append(True)
                        return
                except socket.timeout:
                    continue
                except OSError:
                    cut.append(True)
                    return

    try:
        def port_of_launcher():
            for pid in tagged_pids(tag):
                try:
                    argv = cmdline(pid).split(b"\0")
                    if argv[1:3] != [b"-m", b"mslaunch"]:
                        continue      # not the launcher (salloc, srun)
                    ports = _listening_ports(pid)
                except OSError:
                    continue
                # the dial-back listener: IPv4, on every address (the agents
                # dial the address Slurm gives them) or the one towards the nodes
                ports = [x for x in ports if len(x[0]) == 8]
                if ports:
                    return ports[0]
            return None
        assert wait_for(lambda: port_of_launcher() is not None, 20), "no dial-back port seen"
        hexaddr, port = port_of_launcher()
        address = socket.inet_ntoa(bytes.fromhex(hexaddr)[::-1]) if hexaddr.strip("0") \
            else slurmbed.gateway
        stranger = threading.Thread(target=trickle, args=(port,))
        stranger.start()
        rc, out, err = finish(p, timeout=45)   # the agents wait 60 s for a greeting
        assert rc == 0, err
        assert sorted(line.split()[1] for line in out.splitlines()) == ["h1", "h2"], out
        assert wait_for(lambda: bool(cut), 10), "the stranger was never cut off"
    finally:
        stop.set()
        p.kill()
        p.wait()
    assert wait_for(lambda: not left_on_nodes(slurmbed, tag), 10)


def test_a_stalled_reader_does_not_stop_the_timeout_of_ranks_under_srun(slurmbed, tmp_path):
    """Output left in the agents' sockets for a splice into a pipe nobody
    reads is given up once the stopped job's grace period ends, and counted."""
    tag = new_tag()
    flood = "import sys\nwhile True: sys.stdout.write('x' * 800 + '\\n')"
    r, w = os.pipe()
    p = slurmbed.popen(["salloc", "-N", "2", "--ntasks-per-node=1", "-Q",
                        *cmd("--timeout", "3", "--grace", "1", "-n", "2", PY, "-c", flood)],
                       env=None, base_env=benv(slurmbed, tag), stdout=w, stderr=-1,
                       cwd=tmp_path)
    os.close(w)
    try:
        _, err = p.communicate(timeout=60)
        assert p.returncode == 110, err
        assert re.search(rb"mslaunch: \d+ byte\(s\) of rank output were not delivered", err), err
        assert wait_for(lambda: not left_on_nodes(slurmbed, tag), 10)
    finally:
        p.kill()
        p.wait()
        os.close(r)
        kill_tagged(tag)


def test_mpi_allreduce_across_nodes(slurmbed, mpich, tmp_path):
    tag = new_tag()
    code = ("from mpi4py import MPI; import socket; c = MPI.COMM_WORLD; "
            "print(c.rank, socket.gethostname(), c.allreduce(1), flush=True)")
    p = salloc(slurmbed, tag, "-n", "4", "-x", "UCX_TLS", PY, "-c", code, cwd=tmp_path)
    rc, out, err = finish(p, 120)
    assert rc == 0, err
    rows = sorted(line.split() for line in out.splitlines())
    assert rows == [["0", "h1", "4"], ["1", "h1", "4"], ["2", "h2", "4"], ["3", "h2", "4"]]


def test_a_failing_rank_on_one_node_ends_every_node_with_its_code(slurmbed, tmp_path):
    tag = new_tag()
    code = ("import os, sys, time; r = int(os.environ['OMPI_COMM_WORLD_RANK']); "
            "time.sleep(0.5) if r == 3 else time.sleep(60); sys.exit(7)")
    t0 = time.monotonic()
    p = salloc(slurmbed, tag, "-n", "4", "--grace", "1", PY, "-c", code, cwd=tmp_path)
    rc, out, err = finish(p)
    assert rc == 7, err
    assert time.monotonic() - t0 < 30
    assert "rank 3" in err and "h2" in err, err
    assert wait_for(lambda: not left_on_nodes(slurmbed, tag), 10), left_on_nodes(slurmbed, tag)


def test_a_child_a_rank_left_to_init_is_ended_by_the_agents(slurmbed, tmp_path):
    # Slurm's proctrack/linuxproc (the bed's) loses a process reparented to init, as
    # `(sleep 300 &)` is; the agents' guard does not (docs/guides/slurm.md).
    tag = new_tag()
    mark = tmp_path / "left"
    code = f"(sleep 300 & echo $! > {mark}.$OMPI_COMM_WORLD_RANK); exit 0"
    try:
        rc, out, err = finish(salloc(slurmbed, tag, "--launcher", "slurm", "-n", "2", "sh",
                                     "-c", code, cwd=tmp_path))
        assert rc == 0, err
        pids = [int((tmp_path / f"left.{r}").read_text()) for r in (0, 1)]
        assert wait_for(lambda: not [pid for pid in pids if b"sleep" in cmdline(pid)], 10), \
            pids
        assert wait_for(lambda: not left_on_nodes(slurmbed, tag), 10), \
            left_on_nodes(slurmbed, tag)
    finally:
        kill_tagged(tag)


def _running(bed, tag, count: int = 4):
    p = salloc(bed, tag, "-n", str(count), "--grace", "1", PY, "-c",
               "import time; print('up', flush=True); time.sleep(120)")
    # Every rank started (each one carries the tag; so do mslaunch and srun).
    assert wait_for(lambda: len([pid for h in (1, 2) for pid in bed.task_pids(h)
                                 if pid in set(tagged_pids(tag))]) >= count + 2, 30), \
        bed.diagnostics()
    return p


def test_ctrl_c_stops_every_node(slurmbed):
    tag = new_tag()
    p = _running(slurmbed, tag)
    launcher = [pid for pid in tagged_pids(tag) if b"mslaunch" in
                cmdline(pid) and pid != p.pid]
    try:
        os.kill(launcher[0], signal.SIGINT)
        rc, out, err = finish(p)
        assert rc == 130, err
        assert wait_for(lambda: not left_on_nodes(slurmbed, tag), 10)
    finally:
        kill_tagged(tag)


def _kill_srun(tag: str) -> None:
    """SIGKILL srun's process group (srun and its helper); its tasks outlive it,
    so mslaunch must notice and end them itself."""
    sruns = [pid for pid in tagged_pids(tag)
             if b"mslaunch-agents" in cmdline(pid)
             and open(f"/proc/{pid}/comm").read().strip() == "srun"]
    top = [pid for pid in sruns if parent_pid(pid) not in sruns]   # not srun's helper
    assert len(top) == 1, sruns
    os.killpg(top[0], signal.SIGKILL)


def test_a_killed_srun_is_noticed_after_unused_agents_were_let_go(slurmbed):
    """Placement by core needs every node's agent first; the one the plan leaves
    without ranks is closed at once, which must not make mslaunch take srun's
    later end for its own doing."""
    tag = new_tag()
    p = salloc(slurmbed, tag, "--mpi", "none", "--map-by", "core", "-n", "1", "--grace", "1",
               PY, "-c", "import time; print('up', flush=True); time.sleep(120)")
    try:
        assert wait_for(lambda: any(pid in set(tagged_pids(tag)) for h in (1, 2)
                                    for pid in slurmbed.task_pids(h)
                                    if b"time.sleep" in cmdline(pid)), 30), slurmbed.diagnostics()
        _kill_srun(tag)
        rc, out, err = finish(p)
        assert rc == 255 and "srun, which ran the agents, ended (killed by SIGKILL)" in err, err
        assert wait_for(lambda: not left_on_nodes(slurmbed, tag), 15), \
            left_on_nodes(slurmbed, tag)
    finally:
        kill_tagged(tag)


@pytest.mark.parametrize("fault", ["agent", "slurmd", "scancel", "srun"])
def test_a_lost_node_or_a_cancelled_job_ends_the_job_and_leaves_nothing(slurmbed, fault):
    tag = new_tag()
    p = _running(slurmbed, tag)
    try:
        agents = {pid for pid in slurmbed.task_pids(2) if pid in set(tagged_pids(tag))
                  and b"mslaunch-dial" in cmdline(pid)}
        if fault == "agent":
            # The agent, not its watchdog (a fork of it, with the same command line):
            # the watchdog is what stops the ranks of an agent that was killed.
            top = [pid for pid in agents if parent_pid(pid) not in agents]
            assert len(top) == 1, agents
            os.kill(top[0], signal.SIGKILL)
        elif fault == "slurmd":
            # The node freezes, then everything on it dies at once: its agent says
            # nothing more (the death of its ranks neither), the node is lost.
            assert agents
            for pid in agents:
                os.kill(pid, signal.SIGSTOP)
            slurmbed.crash(2)
        elif fault == "srun":
            _kill_srun(tag)
        else:
            job = slurmbed.run(["squeue", "-h", "-o", "%i"]).stdout.split()
            assert job
            slurmbed.run(["scancel", *job])
        rc, out, err = finish(p)
        assert rc != 0
        if fault == "agent":
            assert rc == 255 and "h2" in err, err
        elif fault == "srun":
            assert rc == 255 and "srun, which ran the agents, ended (killed by SIGKILL)" in err, err
        elif fault == "slurmd":
            assert rc == 255 and "h2" in err, err
        assert wait_for(lambda: not left_on_nodes(slurmbed, tag), 15), \
            left_on_nodes(slurmbed, tag)
    finally:
        kill_tagged(tag)


def test_an_sbatch_script_runs_unchanged_with_the_batch_node_local(slurmbed, tmp_path):
    rows = [r[:2] for r in sbatch_lines(slurmbed, tmp_path, "-n 4", SHOW)]
    assert rows == [["0", "h1"], ["1", "h1"], ["2", "h2"], ["3", "h2"]], rows


def test_launcher_choice_outside_and_inside_an_allocation(slurmbed, tmp_path):
    r = slurmbed.run(cmd("--launcher", "slurm", "-n", "1", "true"),
                     base_env=clean_env())
    assert r.returncode == 2 and "not inside a Slurm allocation" in r.stderr
    tag = new_tag()
    # on h1 by name: a node just freed by the job before may still be completing, and
    # Slurm then gives the other one
    p = salloc(slurmbed, tag, "--launcher", "local", "-n", "2", "true", nodes=1, per_node=2,
               nodelist="h1")
    rc, out, err = finish(p)
    assert rc == 1 and "--launcher local: h1 is not this machine" in err, err
    p = salloc(slurmbed, tag, "-H", "h1,198.51.100.9", "--launcher", "slurm", "-n", "2",
               "true", nodes=1, per_node=2, nodelist="h1")
    rc, out, err = finish(p)
    assert rc == 1 and "--launcher slurm: 198.51.100.9 is not a node of Slurm job" in err, err



ANCESTRY = ("import os, socket\n"
            "pid, names = os.getppid(), []\n"
            "while pid > 1:\n"
            "    with open(f'/proc/{pid}/stat') as f: st = f.read()\n"
            "    names.append(st[st.index('(') + 1:st.rindex(')')])\n"
            "    pid = int(st[st.rindex(')') + 2:].split()[1])\n"
            "print(os.environ['OMPI_COMM_WORLD_RANK'], socket.gethostname(),\n"
            "      'sshd' in names, 'slurmstepd' in names, flush=True)\n")


def test_launcher_ssh_inside_the_allocation_uses_ssh_on_the_same_nodes(slurmbed, tmp_path):
    """``--launcher ssh`` in an allocation: the agents come over SSH, not from an srun step."""
    from sshbed import SSHBed

    ssh_bed = SSHBed(str(tmp_path / "sshd")).start(2, net=slurmbed.net)
    with ssh_bed:
        home = ssh_bed.make_home(tmp_path / "home")
        for launcher, via in (("ssh", ["True", "False"]), ("slurm", ["False", "True"])):
            tag = new_tag()
            p = salloc(slurmbed, tag, "--launcher", launcher, "-n", "4", "-v",
                       "--output-filename", str(tmp_path / launcher), PY, "-c", ANCESTRY,
                       cwd=tmp_path, extra_env={"HOME": home})
            rc, out, err = finish(p, 90)
            assert rc == 0, err
            rows = sorted(line.split() for line in out.splitlines() if line[:1].isdigit())
            # Each rank's ancestors: sshd over SSH, slurmstepd from the srun step.
            assert rows == [[str(r), h, *via] for r, h in enumerate(["h1", "h1", "h2", "h2"])], \
                (launcher, out, err)
            assert ("over SSH" in err) == (launcher == "ssh"), err
            assert (tmp_path / launcher / "1" / "rank.3" / "stdout").read_text().split()[:2] == \
                ["3", "h2"]
            assert wait_for(lambda: not left_on_nodes(slurmbed, tag), 10), \
                left_on_nodes(slurmbed, tag)


def test_a_job_that_fails_after_the_step_started_leaves_nothing(slurmbed, tmp_path):
    """The step starts as soon as the nodes are known, while the launcher builds
    its supervisor; an error after that (here the --xml-file cannot be made)
    ends it: one line, and no srun or agent is left."""
    tag = new_tag()
    p = salloc(slurmbed, tag, "--xml-file", str(tmp_path / "no" / "such" / "out.xml"),
               "-n", "2", PY, "-c", SHOW, per_node=1)
    rc, out, err = finish(p)
    assert rc == 1 and err.count("mslaunch:") == 1 and "--xml-file" in err, err
    assert wait_for(lambda: not left_on_nodes(slurmbed, tag), 10), left_on_nodes(slurmbed, tag)


def test_srun_is_asked_its_version_once_per_installation(slurmbed, tmp_path):
    """srun's version (whether it takes --external-launcher) is kept in the
    cache with srun's path, size and time, so later jobs start the step without
    asking; a changed srun is asked again."""
    real = [d for d in os.environ.get("PATH", "").split(":")
            if os.access(os.path.join(d or ".", "srun"), os.X_OK)]
    assert real, "srun is not on PATH"
    bindir = tmp_path / "bin"
    bindir.mkdir()
    asked = tmp_path / "asked"
    srun = bindir / "srun"
    srun.write_text(f"#!/bin/sh\n[ \"$1\" = --version ] && echo asked >> {asked}\n"
                    f"exec {os.path.join(real[0], 'srun')} \"$@\"\n")
    srun.chmod(0o755)
    env = {"PATH": f"{bindir}:{os.environ['PATH']}", "XDG_CACHE_HOME": str(tmp_path / "cache")}

    def job() -> int:
        tag = new_tag()
        rc, out, err = finish(salloc(slurmbed, tag, "-n", "2", PY, "-c", SHOW, per_node=1,
                                     extra_env=env))
        assert rc == 0 and len(out.splitlines()) == 2, err
        assert wait_for(lambda: not left_on_nodes(slurmbed, tag), 10)
        return len(asked.read_text().splitlines()) if asked.exists() else 0

    assert job() == 1
    assert job() == 1
    os.utime(srun, ns=(time.time_ns(), time.time_ns() + 1_000_000_000))
    assert job() == 2
