"""Agents started by an rsh agent, on real sshd hosts (network namespaces).

The OpenSSH client itself (``--mca plm_rsh_agent ssh``, Hydra's
``-launcher-exec``) and a stand-in for the MPI Operator v1's ``kubexec.sh``
(``kubectl exec POD -- /bin/sh -c "$*"``, no stdin: here ``nsenter`` into the
host's namespaces) start the same agent as paramiko, which dials back.  The
SSH faults matrix runs on both: the launcher, an agent or the command
killed, the session dropped, the host partitioned; no orphan on any host.
Bad commands give one error line naming the host and the command.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess

import pytest

from helpers import PY, cmd, error_lines, kill_tagged, new_tag, tagged_pids, wait_for
from remote import FAST_BEAT, agents, no_agents, renv, settle
from rsh import cfg_of, kubexec

pytestmark = pytest.mark.remote


@pytest.fixture(params=["ssh", "kubexec"])
def way(request, sshbed, rsh_home, tmp_path):
    """The options that start the agents with the OpenSSH client or kubexec.sh."""
    if request.param == "ssh":
        return ["--mca", "plm_rsh_agent", "ssh : rsh", "--mca", "plm_rsh_args",
                f"-F {cfg_of(rsh_home)}"]
    return ["--mca", "plm_rsh_agent", kubexec(sshbed, tmp_path)]


def run_rsh(home, *args, env=None, timeout=90):
    return subprocess.run(cmd(*args), capture_output=True, timeout=timeout,
                          env=env or renv(home))


def test_ranks_output_files_and_exit_code_through_the_agent(sshbed, rsh_home, way, tmp_path):
    # rank 1 fails only once rank 0 has written everything (a marker file on
    # the shared file system): its failure must not stop rank 0 before it ran
    marker = tmp_path / "rank0-done"
    prog = ("import os,socket,sys,time;r=int(os.environ['OMPI_COMM_WORLD_RANK']);"
            "print('rank',r,socket.gethostname(),flush=True);"
            "sys.stdout.write('x'*300000+'\\n');sys.stdout.flush();"
            f"r==0 and open({str(marker)!r},'w').close();"
            f"r==1 and [time.sleep(0.01) for _ in iter(lambda: os.path.exists({str(marker)!r}), True)];"
            "sys.exit(7 if r==1 else 0)")
    r = run_rsh(rsh_home, *way, "-H", "h1,h2", "-n", "2", "--output-filename",
                str(tmp_path / "out"), PY, "-c", prog)
    assert r.returncode == 7, r.stderr
    lines = r.stdout.decode().splitlines()
    assert "rank 0 h1" in lines and "rank 1 h2" in lines
    assert r.stdout.count(b"x" * 300000 + b"\n") == 2
    for rank, host in ((0, "h1"), (1, "h2")):    # and the same bytes in Open MPI 4's files
        data = (tmp_path / "out" / "1" / f"rank.{rank}" / "stdout").read_bytes()
        assert data == f"rank {rank} {host}\n".encode() + b"x" * 300000 + b"\n"
    assert wait_for(lambda: no_agents(sshbed), 15)


def test_hydra_launcher_exec_and_its_variables_start_the_openssh_client(sshbed, rsh_home, tmp_path):
    r = run_rsh(rsh_home, "-launcher", "ssh", "-launcher-exec", "ssh", "-bootstrap-exec-args",
                f"-F {cfg_of(rsh_home)}", "-hosts", "h1,h3", "-n", "2", "hostname")
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.split()) == [b"h1", b"h3"]
    r = run_rsh(rsh_home, "-hosts", "h2", "-n", "1", "hostname",
                env=renv(rsh_home, HYDRA_LAUNCHER_EXEC="ssh",
                         HYDRA_LAUNCHER_EXTRA_ARGS=f"-F {cfg_of(rsh_home)}"))
    assert r.returncode == 0, r.stderr
    assert r.stdout == b"h2\n"
    # Extra arguments alone: the OpenSSH client with them (paramiko has no -F).
    r = run_rsh(rsh_home, "-hosts", "h4", "-n", "1", "hostname",
                env=renv(rsh_home, I_MPI_HYDRA_BOOTSTRAP_EXEC_EXTRA_ARGS="-F /nonexistent/cfg"))
    assert r.returncode == 1 and b"h4" in r.stderr and b"/nonexistent/cfg" in r.stderr


def test_a_launch_agent_wrapper_runs_the_agents(sshbed, rsh_home, way, tmp_path):
    """Open MPI's --launch-agent 'WRAPPER... orted' (a container's runner, say): the
    agent runs through WRAPPER, with the launcher's own dial-back variables."""
    from slurm import wrapper_script
    r = run_rsh(rsh_home, *way, "--launch-agent", f"{wrapper_script(tmp_path)} orted",
                "-H", "h1,h2", "-n", "2", "hostname")
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.split()) == [b"h1", b"h2"]
    assert sorted((tmp_path / "wrapped").read_text().split("\n")[:-1]) == \
        ["h1 env", "h2 env"]
    assert wait_for(lambda: no_agents(sshbed), 15)


def test_stdin_reaches_remote_ranks(sshbed, rsh_home, way):
    prog = ("import sys;print(sys.stdin.read().upper(),flush=True)")
    p = subprocess.run(cmd(*way, "-H", "h2", "-n", "1", PY, "-c", prog), input=b"hello",
                       capture_output=True, timeout=60, env=renv(rsh_home))
    assert p.returncode == 0, p.stderr
    assert p.stdout == b"HELLO\n"


def test_signals_reach_remote_ranks(sshbed, rsh_home, way, tmp_path):
    """SIGUSR1 is forwarded and the job goes on; SIGINT stops every rank (130)."""
    from remote import TRAP
    tag = new_tag()
    marks = tmp_path / "marks"
    marks.mkdir()
    p = subprocess.Popen(cmd(*way, "-H", "h1,h2", "-n", "2", "-x", "MSL_TEST_TAG", PY, "-c",
                             TRAP, str(marks)), env=renv(rsh_home, MSL_TEST_TAG=tag),
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert wait_for(lambda: {"0.up", "1.up"} <= set(os.listdir(marks)), 30)
        p.send_signal(signal.SIGUSR1)
        assert wait_for(lambda: {"0.10", "1.10"} <= set(os.listdir(marks)), 10)
        assert p.poll() is None
        p.send_signal(signal.SIGINT)
        assert p.wait(timeout=30) == 128 + signal.SIGINT
        # SIGINT reaches the ranks as SIGTERM (as Open MPI does) or as itself
        got = sorted(f.split(".")[0] for f in os.listdir(marks)
                     if f.split(".")[1] in (str(int(signal.SIGINT)), str(int(signal.SIGTERM))))
        assert got == ["0", "1"], os.listdir(marks)
        assert wait_for(lambda: tagged_pids(tag) == [], 15)
        assert wait_for(lambda: no_agents(sshbed), 15)
    finally:
        p.kill()
        p.wait()
        kill_tagged(tag)


# -- the faults matrix ----------------------------------------------------------------

def _start_sleepers(home, tag, way, hosts="h1,h2"):
    p = subprocess.Popen(cmd(*way, "-H", hosts, "-n", str(len(hosts.split(","))),
                             "-x", "MSL_TEST_TAG", "sleep", "120"),
                         env=renv(home, MSL_TEST_TAG=tag, MSLAUNCH_HEARTBEAT=FAST_BEAT),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert wait_for(lambda: len(_sleeps(tag)) == len(hosts.split(",")), 30), p.poll()
    return p


def _sleeps(tag):
    found = []
    for pid in tagged_pids(tag):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f.read().startswith(b"sleep\0"):
                    found.append(pid)
        except OSError:
            pass
    return found


def _commands(tag, name):
    """The launcher's rsh command processes (they carry the launcher's environment)."""
    found = []
    for pid in tagged_pids(tag):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                words = f.read().split(b"\0")
        except OSError:
            continue
        if os.path.basename(words[0]) in (b"ssh", b"sh") and name.encode() in words[:6]:
            found.append(pid)
    return found


def _ends_with_host_lost(p, tag, bed, host, *also):
    """``also``: texts the error must hold; a tuple of texts: one of them."""
    try:
        _, err = p.communicate(timeout=30)
        assert p.returncode == 255, err
        assert f"lost host {host}".encode() in err, err
        for text in also:
            choices = text if isinstance(text, tuple) else (text,)
            assert any(t.encode() in err for t in choices), err
        settle(tag, bed)
    finally:
        p.kill()
        p.wait()
        kill_tagged(tag)


def test_sigkilled_launcher_leaves_nothing_on_any_host(sshbed, rsh_home, way):
    tag = new_tag()
    p = _start_sleepers(rsh_home, tag, way)
    try:
        p.kill()
        p.wait()
        settle(tag, sshbed)
    finally:
        kill_tagged(tag)


def test_a_sigkilled_agent_ends_the_job_and_its_ranks(sshbed, rsh_home, way):
    tag = new_tag()
    p = _start_sleepers(rsh_home, tag, way)
    victims = agents(sshbed, "h2", watchdogs=False)
    assert len(victims) == 1
    os.kill(victims[0], signal.SIGKILL)
    _ends_with_host_lost(p, tag, sshbed, "h2")


def test_the_command_dying_ends_the_job_and_the_remote_ranks(sshbed, rsh_home, way):
    # The SSH client or kubectl exec killed: the remote agent lives on, unseen;
    # the launcher cuts its link, the agent stops its rank.
    tag = new_tag()
    p = _start_sleepers(rsh_home, tag, way)
    victims = _commands(tag, "h1")
    assert victims, tagged_pids(tag)
    for pid in victims:
        os.kill(pid, signal.SIGKILL)
    _ends_with_host_lost(p, tag, sshbed, "h1", "which ran the agent, ended (killed by SIGKILL)")


def test_a_dropped_ssh_session_ends_the_job(sshbed, rsh_home):
    tag = new_tag()
    p = _start_sleepers(rsh_home, tag, ["--mca", "plm_rsh_agent", "ssh", "--mca", "plm_rsh_args",
                                    f"-F {cfg_of(rsh_home)}"])
    assert sshbed.drop_session_children("h1")
    _ends_with_host_lost(p, tag, sshbed, "h1")


def test_a_partitioned_host_is_noticed_by_heartbeat_on_both_sides(sshbed, rsh_home, way):
    sshbed.require_netns("a network partition")
    tag = new_tag()
    p = _start_sleepers(rsh_home, tag, way)
    sshbed.link_down("h2")
    try:
        # The agent on h2, cut off, stops its rank by itself.  The launcher's own
        # heartbeat says so; or, when the agent gives up first, the kubexec
        # stand-in (not cut off: it enters the host's namespaces) ends with it.
        said = ("no sign of life", "kubexec.sh, which ran the agent, ended (status 1)") \
            if way[-1].endswith("kubexec.sh") else "no sign of life"
        _ends_with_host_lost(p, tag, sshbed, "h2", said)
    finally:
        sshbed.link_up("h2")


# -- commands that do not start an agent ------------------------------------------------

@pytest.mark.parametrize("agent, said", [
    ("/no/such/rsh : nosuchrsh", "plm_rsh_agent '/no/such/rsh : nosuchrsh': neither "
                                 "/no/such/rsh nor nosuchrsh is on PATH"),
    ("sh -c 'echo denied >&2; exit 3' x", "h2 (ended with status 3 before the agent dialled "
                                           "back: denied)"),
    ("sh -c 'echo Welcome to junk; echo more junk' x", "h2 (ended with status 0 before the "
                                                        "agent dialled back: more junk)"),
    ("sh -c 'exec sleep 60' x", "h2 (did not dial back within 15 s"),
])
def test_a_bad_command_gives_one_line_and_starts_nothing(sshbed, rsh_home, tmp_path, agent, said):
    tag = new_tag()
    # h1 is reached (its agent dials back) and must be stopped again.
    wrapper = tmp_path / "either.sh"
    wrapper.write_text(f"#!/bin/sh\nif [ \"$1\" = h1 ]; then exec ssh -F {cfg_of(rsh_home)} "
                       f"\"$@\"; fi\nexec {agent} \"$@\"\n")
    wrapper.chmod(0o755)
    real = agent if agent.startswith("/no/") else str(wrapper)
    r = run_rsh(rsh_home, "--ssh-timeout", "5", "--mca", "plm_rsh_agent", real, "-H", "h1,h2",
                "-n", "2", "-x", "MSL_TEST_TAG", "sleep", "30",
                env=renv(rsh_home, MSL_TEST_TAG=tag))
    err = r.stderr.decode()
    assert r.returncode == 1, err
    lines = error_lines(err)
    assert len(lines) == 1 and lines[0].startswith("mslaunch: error: "), err
    assert said in err
    if not agent.startswith("/no/"):
        assert f"with '{wrapper} HOST ...'" in err and "1 of 2" in err
    settle(tag, sshbed)


def test_hosts_that_fail_alike_are_counted_and_told_once(sshbed, tmp_path):
    """Four hosts whose keys the OpenSSH client does not know: every run says
    "4 of 4", and the reason once (it was "1 of 4" to "4 of 4" as the hosts'
    failures happened to arrive)."""
    home = sshbed.make_home(tmp_path / "home", known=[])
    os.rename(os.path.join(home, ".ssh", "config"), cfg_of(home))
    for _ in range(3):
        r = run_rsh(home, "--mca", "plm_rsh_agent", "ssh", "--mca", "plm_rsh_args",
                    f"-F {cfg_of(home)}", "-H", "h1,h2,h3,h4", "-n", "4", "true")
        err = r.stderr.decode()
        assert r.returncode == 1 and len(error_lines(err)) == 1, err
        assert "on 4 of 4 remote host(s)" in err, err
        assert err.count("Host key verification failed") == 1, err
        assert "h1-h4 (ended with status 255 before the agent dialled back: " in err, \
            err
    assert wait_for(lambda: no_agents(sshbed), 15)


def test_an_unreachable_host_is_named_by_the_ssh_client(sshbed, tmp_path):
    unreachable = f"198.18.{sshbed.k}.99"
    home = sshbed.make_home(tmp_path / "home", user_config_extra=f"Host h9\n  HostName "
                            f"{unreachable}\n  ConnectTimeout 1\n")
    os.rename(os.path.join(home, ".ssh", "config"), cfg_of(home))
    r = run_rsh(home, "--mca", "plm_rsh_agent", "ssh", "--mca", "plm_rsh_args",
                f"-F {cfg_of(home)}", "-H", "h1,h9", "-n", "2", "true")
    err = r.stderr.decode()
    assert r.returncode == 1 and len(error_lines(err)) == 1, err
    assert "h9 (ended with status 255" in err and unreachable in err
    assert wait_for(lambda: no_agents(sshbed), 15)


# -- Grid Engine and LSF: their agents, chosen inside their allocations ------------------

def _stand_in(bed, path, expect: str) -> None:
    """``CMD [expected options] HOST command``: the command run on HOST (its
    namespaces entered), as qrsh -inherit and blaunch do; other options refused."""
    cases = "".join(f"  {h.name}) pid={h.pid};;\n" for h in bed.hosts)
    with open(path, "w") as f:
        f.write(f"#!/bin/sh\nfor o in {expect}; do [ \"$1\" = \"$o\" ] || "
                "{ echo \"stand-in: unexpected option $1\" >&2; exit 2; }; shift; done\n"
                "host=$1; shift\ncase $host in\n" + cases +
                "  *) echo \"error: $host is not a host of this job\" >&2; exit 1;;\nesac\n"
                "exec nsenter -t $pid -n -u -m -- /bin/sh -c \"$*\" </dev/null\n")
    os.chmod(path, 0o755)


def test_grid_engine_hosts_slots_and_qrsh_inherit(sshbed, tmp_path):
    sshbed.require_netns("the qrsh stand-in")
    qrsh_dir = tmp_path / "sge" / "bin" / "lx-amd64"
    qrsh_dir.mkdir(parents=True)
    _stand_in(sshbed, qrsh_dir / "qrsh", "-inherit -nostdin -V")
    pe = tmp_path / "pe_hostfile"
    pe.write_text("h1 2 all.q@h1 UNDEFINED\nh2 1 all.q@h2 UNDEFINED\n")
    env = renv(str(tmp_path), PE_HOSTFILE=str(pe), JOB_ID="42", SGE_ROOT=str(tmp_path / "sge"),
               ARC="lx-amd64")
    for line in (["hostname"], ["-launcher", "sge", "hostname"]):     # (Hydra's word for it)
        r = run_rsh(str(tmp_path), *line, env=env)
        assert r.returncode == 0, r.stderr
        assert sorted(r.stdout.split()) == [b"h1", b"h1", b"h2"]
    assert wait_for(lambda: no_agents(sshbed), 15)


def test_lsf_hosts_slots_and_blaunch(sshbed, tmp_path):
    sshbed.require_netns("the blaunch stand-in")
    bindir = tmp_path / "lsf"
    bindir.mkdir()
    _stand_in(sshbed, bindir / "blaunch", "")
    for extra in ({"LSB_MCPU_HOSTS": "h3 1 h4 2"},
                  {"LSB_DJOB_HOSTFILE": str(tmp_path / "djob")}):
        (tmp_path / "djob").write_text("h3\nh4\nh4\n")
        env = renv(str(tmp_path), LSB_JOBID="7", LSF_BINDIR=str(bindir),
                   I_MPI_HYDRA_BOOTSTRAP="lsf", **extra)      # (Intel MPI's word for it)
        r = run_rsh(str(tmp_path), "hostname", env=env)
        assert r.returncode == 0, r.stderr
        assert sorted(r.stdout.split()) == [b"h3", b"h4", b"h4"]
    assert wait_for(lambda: no_agents(sshbed), 15)


# -- Kubernetes' MPI Operator v1: kubexec.sh as the rsh agent -----------------------------

def test_mpi_operator_v1_launcher_runs_mpi_on_the_worker_pods(sshbed, tmp_path, mpich):
    from remote import MPI_PROG
    sshbed.require_netns("the kubexec stand-in")
    # The operator's kubexec.sh takes pod names: these map to the bed's hosts.
    script = kubexec(sshbed, tmp_path)
    text = open(script).read().replace("  h1)", "  job-worker-0)").replace("  h2)",
                                                                          "  job-worker-1)")
    with open(script, "w") as f:
        f.write(text)
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("job-worker-0 slots=2\njob-worker-1 slots=2\n")
    # The launcher pod's environment, as the operator's controller sets it.
    env = renv(str(tmp_path), OMPI_MCA_plm_rsh_agent=script,
               OMPI_MCA_orte_default_hostfile=str(hostfile), OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    r = run_rsh(str(tmp_path), "-np", "4", "-x", "UCX_TLS", PY, "-c", MPI_PROG, "ok",
                env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    rows = sorted((json.loads(x) for x in r.stdout.decode().splitlines()),
                  key=lambda row: row["rank"])
    assert [row["host"] for row in rows] == ["h1", "h1", "h2", "h2"]
    assert [row["sum"] for row in rows] == [6] * 4
    assert all(sorted(row["shared"]) == ([0, 1] if row["rank"] < 2 else [2, 3]) for row in rows)
    assert wait_for(lambda: no_agents(sshbed), 15)


@pytest.fixture
def gridengine(sshbed, tmp_path):
    import gebed
    from requires import require
    require(not gebed.missing(), "Grid Engine (apt-get install gridengine-master "
                                 "gridengine-exec gridengine-client): "
                                 + ", ".join(gebed.missing()))
    sshbed.require_netns("a Grid Engine cell")
    cell = gebed.GridEngine(sshbed, str(tmp_path / "ge")).start()
    yield cell
    cell.stop()


def test_a_real_grid_engine_job_runs_ranks_through_qrsh_inherit(sshbed, gridengine, tmp_path):
    from helpers import REPO
    job = tmp_path / "job.sh"
    job.write_text(f"#!/bin/sh\nPYTHONPATH={REPO} {PY} -m mslaunch -v {PY} -c "
                   "'import os,socket;print(os.environ[\"OMPI_COMM_WORLD_RANK\"],"
                   "socket.gethostname())'\necho rc=$?\n")
    job.chmod(0o755)
    out, err = tmp_path / "out", tmp_path / "err"
    r = gridengine.qsub(str(job), 4, str(out), str(err))
    assert r.returncode == 0, (r.stdout, r.stderr)
    lines = out.read_text().splitlines()
    assert lines[-1] == "rc=0", (lines, err.read_text())
    # $round_robin: one slot on each of the bed's hosts, in PE_HOSTFILE's order.
    rows = [ln.split() for ln in lines[:-1]]
    assert sorted(r[0] for r in rows) == [str(i) for i in range(4)], lines
    assert sorted(r[1] for r in rows) == sorted(h.name for h in sshbed.hosts), lines
    said = err.read_text()
    assert "qrsh -inherit -nostdin -V HOST" in said, said
    assert wait_for(lambda: no_agents(sshbed), 15)


#: The launcher pod's variables of MPI Operator v2 (v2beta1), by MPI implementation, as
#: its controller sets them (mpi_job_controller.go), and its hostfile's line for a worker.
V2_LAUNCHER = {
    "OpenMPI": ({"OMPI_MCA_orte_keep_fqdn_hostnames": "true",
                 "OMPI_MCA_orte_default_hostfile": "{hostfile}",
                 "OMPI_MCA_plm_rsh_args": "-o ConnectionAttempts=10",
                 "OMPI_MCA_orte_set_default_slots": "2",
                 "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"},
                "{name} slots=2\n"),
    "Intel": ({"I_MPI_HYDRA_HOST_FILE": "{hostfile}",
               "I_MPI_HYDRA_BOOTSTRAP_EXEC_EXTRA_ARGS": "-o ConnectionAttempts=10",
               "I_MPI_PERHOST": "2"},
              "{name}:2\n"),
    "MPICH": ({"HYDRA_HOST_FILE": "{hostfile}",
               "HYDRA_LAUNCH_EXTRA_ARGS": "-o ConnectionAttempts=10"},
              "{name}:2\n"),
}


@pytest.mark.parametrize("implementation", sorted(V2_LAUNCHER))
def test_mpi_operator_v2_launcher_reaches_the_workers_sshd_with_openssh(
        sshbed, tmp_path, mpich, implementation):
    """v2: sshd in the workers, the launcher pod's ssh and the controller's settings
    for each MPI implementation it knows."""
    from remote import MPI_PROG
    workers = {f"job-worker-{i}.job.default.svc": h for i, h in enumerate(sshbed.hosts[:2])}
    extra = "".join(f"Host {name}\n  HostName {h.addr}\n  Port {h.port}\n"
                    for name, h in workers.items())
    home = sshbed.make_home(tmp_path / "home", user_config_extra=extra)
    variables, line = V2_LAUNCHER[implementation]
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("".join(line.format(name=name) for name in workers))
    # The pod's ssh reads its config (here through HOME/bin/ssh, which passes -F).
    env = renv(home, PATH=f"{home}/bin:" + os.environ["PATH"],
               **{k: v.format(hostfile=hostfile) for k, v in variables.items()})
    os.rename(os.path.join(home, ".ssh", "config"), cfg_of(home))   # no paramiko way there
    said = tmp_path / "ssh-args"
    with open(os.path.join(home, "bin", "ssh"), "w") as f:
        f.write(f'#!/bin/sh\necho "$@" >> "{said}"\n'
                f'exec {shutil.which("ssh")} -F "{cfg_of(home)}" "$@"\n')
    r = run_rsh(home, "-np", "4", "-x", "UCX_TLS", PY, "-c", MPI_PROG, "ok", env=env,
                timeout=120)
    assert r.returncode == 0, r.stderr
    rows = sorted((json.loads(x) for x in r.stdout.decode().splitlines()),
                  key=lambda row: row["rank"])
    assert [row["host"] for row in rows] == ["h1", "h1", "h2", "h2"]
    assert [row["sum"] for row in rows] == [6] * 4
    # the operator's extra arguments reached the ssh that started each worker's agent
    calls = said.read_text().splitlines()
    assert sorted(c.split(" job-worker-")[1].split()[0] for c in calls) == ["0.job.default.svc",
                                                                          "1.job.default.svc"]
    assert all(c.startswith("-o ConnectionAttempts=10 ") for c in calls), calls
    assert wait_for(lambda: no_agents(sshbed), 15)


@pytest.mark.parametrize("agent", ["openssh", "paramiko"])
def test_eight_hosts_failing_alike_are_one_line_naming_all_eight(sshbeds, tmp_path, agent):
    """Ten runs each: every run names all eight hosts, in one range, in one line."""
    bed = sshbeds.get(8)
    home = bed.make_home(tmp_path / "home", known=[])
    way: list = []
    if agent == "openssh":
        os.rename(os.path.join(home, ".ssh", "config"), cfg_of(home))
        way = ["--mca", "plm_rsh_agent", "ssh", "--mca", "plm_rsh_args", f"-F {cfg_of(home)}"]
    hosts = ",".join(f"h{i}" for i in range(1, 9))
    for _ in range(10):
        r = run_rsh(home, *way, "-H", hosts, "-n", "8", "true")
        err = r.stderr.decode()
        assert r.returncode == 1 and len(error_lines(err)) == 1, err
        given_up = re.search(r"; ([h0-9, -]+) still starting, given up$", err.rstrip("\n"))
        if given_up is None:
            assert "on 8 of 8 remote host(s)" in err and ": h1-h8 (" in err, err
        else:
            # A machine too busy to run eight ssh clients together: the hosts whose
            # ssh had not yet failed when the others' time was up are named too.
            failed = re.search(r"nothing was started: ([h0-9, -]+) \(", err)
            assert failed is not None and " of 8 remote host(s)" in err, err
            assert _numbers(failed.group(1)) | _numbers(given_up.group(1)) == set(range(1, 9)), err
    assert wait_for(lambda: no_agents(bed), 15)


def test_a_host_still_starting_when_another_failed_is_named_given_up(sshbed, rsh_home, tmp_path):
    # h1's rsh agent fails at once; h2's never ends: the start is given up once
    # h2 has had its time to fail alike, and h2 is named with the failed h1.
    tag = new_tag()
    wrapper = tmp_path / "rsh"
    wrapper.write_text('#!/bin/sh\n[ "$1" = h1 ] && { echo "h1 refuses" >&2; exit 255; }\n'
                       'exec sleep 300\n')
    wrapper.chmod(0o755)
    r = run_rsh(rsh_home, "--mca", "plm_rsh_agent", str(wrapper), "-H", "h1,h2", "-n", "2",
                "true", env=renv(rsh_home, MSL_TEST_TAG=tag))
    err = r.stderr.decode()
    try:
        assert r.returncode == 1 and len(error_lines(err)) == 1, err
        assert "on 1 of 2 remote host(s)" in err and \
            "nothing was started: h1 (ended with status 255 before the agent dialled back: " \
            "h1 refuses); h2 still starting, given up\n" in err, err
        assert wait_for(lambda: tagged_pids(tag) == [], 15), tagged_pids(tag)   # h2's ended
    finally:
        kill_tagged(tag)


def _numbers(ranges: str) -> set:
    """The host numbers of ``h1-h4, h6``."""
    out = set()
    for first, last in re.findall(r"h(\d+)(?:-h(\d+))?", ranges):
        out.update(range(int(first), int(last or first) + 1))
    return out


def test_at_most_plm_rsh_num_concurrent_hosts_start_at_once(sshbed, rsh_home, tmp_path):
    """Open MPI's ``plm_rsh_num_concurrent``: with 1, the rsh agent runs for the
    next host only once the previous host's agent has answered.  The rsh agent
    here waits 1 s before it connects: one at a time, each host's start comes
    after the previous host's connection; all at once, every start comes first."""
    log = tmp_path / "starts"
    wrapper = tmp_path / "slow-ssh"
    wrapper.write_text("#!/bin/sh\n"
                       f"echo \"$(date +%s.%N) start $1\" >> {log}\n"
                       "sleep 1\n"
                       f"echo \"$(date +%s.%N) connect $1\" >> {log}\n"
                       f"exec ssh -F {cfg_of(rsh_home)} \"$@\"\n")
    wrapper.chmod(0o755)
    hosts = ["h1", "h2", "h3"]

    def starts(*extra):
        log.unlink(missing_ok=True)
        r = run_rsh(rsh_home, "--mca", "plm_rsh_agent", str(wrapper), *extra, "-H", ",".join(hosts),
                    "-n", "3", "hostname")
        assert r.returncode == 0, r.stderr
        assert sorted(r.stdout.decode().split()) == hosts, r.stdout
        return [line.split()[1] for line in log.read_text().splitlines()]

    # one at a time: each start after the previous one connected (and answered)
    assert starts("--mca", "plm_rsh_num_concurrent", "1") == ["start", "connect"] * 3
    # by default, every start before the first one connects
    assert starts()[:3] == ["start"] * 3


@pytest.mark.parametrize("cgroup", ["1", "0"])
def test_a_local_ranks_leftover_is_stopped_and_the_ssh_clients_are_not(sshbed, rsh_home, cgroup):
    """Once the local ranks ended, what holds their pipes is stopped as a
    leftover; the ``ssh`` clients that hold the hosts' sessions are the
    launcher's children too, and are not leftovers."""
    tag = new_tag()
    try:
        r = run_rsh(rsh_home, "--mca", "plm_rsh_agent", "ssh", "--mca", "plm_rsh_args",
                    f"-F {cfg_of(rsh_home)}", "--grace", "1", "-H", "localhost,h1,h2",
                    "-x", "MSL_TEST_TAG", "-n", "1", "sh", "-c",
                    "setsid sleep 60 & echo started", ":",
                    "-n", "2", "sh", "-c", "sleep 3; echo done",
                    env=renv(rsh_home, MSL_TEST_TAG=tag, MSLAUNCH_CGROUP=cgroup))
        assert r.returncode == 0, r.stderr
        assert sorted(r.stdout.decode().split()) == ["done", "done", "started"]
        settle(tag, sshbed)
    finally:
        kill_tagged(tag)
