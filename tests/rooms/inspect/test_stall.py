"""--stall-report and --stall-exit on real jobs: a stuck job is reported (and the
job goes on, or ends with 111), a job that prints or computes is not."""

from __future__ import annotations

import subprocess
import time

import pytest

from helpers import (PY, clean_env, kill_tagged, new_tag, program, read_until, run, start,
                     tagged_pids, wait_for)


pytestmark = pytest.mark.usefixtures("mpich", "eu_stack")


def test_stall_report_names_the_stuck_rank_once_and_the_job_goes_on(tmp_path):
    tag = new_tag()
    release = tmp_path / "release"
    p = start("--stall-report", "2", "-n", "4", "--oversubscribe", PY,
              program("stuck_ranks.py"), "stuck", str(release), env=clean_env(MSL_TEST_TAG=tag))
    try:
        head = read_until(p.stderr, b"outlier(s): rank 3 on ", 90)
        # The fault: the stall goes on for four more --stall-report periods after it
        # was reported; the same picture is not reported again.
        time.sleep(4 * 2)
        release.write_text("go")
        out, rest = p.communicate(timeout=90)
    finally:
        p.kill()
        p.communicate()
        kill_tagged(tag)
    err = (head + rest).decode()
    assert p.returncode == 0, err
    assert sorted(x for x in out.decode().splitlines() if x.startswith("done")) == \
        [f"done {i} 6" for i in range(4)]
    # once for this picture (a slow MPI start-up may have been reported before it)
    assert err.count("outlier(s): rank 3 on ") == 1, err
    assert err.count("(in load_batch), apart from the 3 rank(s)") == 1, err
    assert "--stall-report 2" in err and "+ rank 3 on " in err and "[outlier]" in err, err
    assert "the job goes on" in err


def test_stall_exit_ends_the_stalled_job_with_111(tmp_path):
    tag = new_tag()
    t0 = time.monotonic()
    r = run("--stall-report", "2", "--stall-exit", "-n", "3", "--oversubscribe", PY,
            program("stuck_ranks.py"), "stuck", str(tmp_path / "never"),
            env=clean_env(MSL_TEST_TAG=tag), timeout=120)
    err = r.stderr.decode()
    assert r.returncode == 111, err
    assert "mslaunch: stalled for" in err and "ending the stalled job" in err, err
    assert time.monotonic() - t0 < 60
    assert wait_for(lambda: tagged_pids(tag) == [], 10)


def test_no_stall_report_for_a_job_that_prints():
    code = ("import time\nfor i in range(40):\n    print(i, flush=True)\n    time.sleep(0.2)\n")
    r = run("--stall-report", "1", "-n", "2", PY, "-c", code, timeout=60)
    assert r.returncode == 0, r.stderr
    assert b"stalled" not in r.stderr, r.stderr


def test_no_stall_report_for_a_job_that_computes_silently():
    # A hot loop on one line: its stack looks the same at every sample, but the
    # rank uses the CPU outside any communication call.
    code = ("import time\nend = time.time() + 8\n"
            "while time.time() < end: x = sum(i * i for i in range(2000))\n")
    r = run("--stall-report", "1", "-n", "1", PY, "-c", code, timeout=60)
    assert r.returncode == 0, r.stderr
    assert b"stalled" not in r.stderr, r.stderr


def test_a_silent_sleeping_job_is_reported_and_a_native_one_too():
    r = run("--stall-report", "1", "--stall-exit", "-n", "2", "sleep", "30", timeout=60)
    err = r.stderr.decode()
    assert r.returncode == 111, err
    assert "+ ranks 0-1 (2) on " in err and "nanosleep" in err, err


@pytest.mark.parametrize("args, seconds", [
    ((), 300.0), (("--stall-report", "0"), None), (("--stall-report", "7.5"), 7.5),
    (("--get-stack-traces",), 60.0), (("--get-stack-traces", "--timeout", "9"), 300.0),
    (("--get-stack-traces", "--stall-report", "20"), 20.0)])
def test_stall_report_seconds_and_what_get_stack_traces_alone_means(args, seconds):
    from mslaunch.cli import mpirun
    job = mpirun.parse_args([*args, "-n", "1", "true"], environ={}, cwd="/")
    assert job.stall_report == seconds and not job.stall_exit


def test_a_new_picture_is_reported_again(tmp_path):
    """The stuck rank moves on to another wait without printing: a second report."""
    release = tmp_path / "release"
    second = tmp_path / "release.2"
    tag = new_tag()
    p = start("--stall-report", "2", "-n", "3", "--oversubscribe", PY,
              program("stuck_ranks.py"), "twice", str(release), env=clean_env(MSL_TEST_TAG=tag))
    try:
        # each wait let go once it was reported
        head = read_until(p.stderr, b"(in load_batch), apart from", 90)
        release.write_text("go")
        head += read_until(p.stderr, b"(in save_state), apart from", 90)
        second.write_text("go")
        _, rest = p.communicate(timeout=90)
    finally:
        p.kill()
        p.communicate()
        kill_tagged(tag)
    err = (head + rest).decode()
    assert p.returncode == 0, err
    assert err.count("(in load_batch), apart from") == 1, err
    assert err.count("(in save_state), apart from") == 1, err
    assert err.index("(in load_batch)") < err.index("(in save_state)")


def test_a_rank_waiting_for_the_input_mslaunch_forwards_is_not_stalled():
    """Rank 0 reads its stdin (forwarded by mslaunch, nothing typed for 8 s), rank 1
    waits for it in a barrier: a person is expected, not a hang."""
    import subprocess

    from helpers import cmd
    code = ("import sys\nfrom mpi4py import MPI\n"
            "line = sys.stdin.readline() if MPI.COMM_WORLD.rank == 0 else ''\n"
            "MPI.COMM_WORLD.Barrier()\nprint('got', repr(line), flush=True)\n")
    tag = new_tag()
    p = subprocess.Popen(cmd("--stall-report", "2", "-n", "2", PY, "-c", code),
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env=clean_env(MSL_TEST_TAG=tag))
    try:
        # rank 0 is in its read, and stays there past several stall samples: the
        # situation under test, nobody typing for four --stall-report periods
        assert wait_for(lambda: _reads_stdin(tag), 30)
        time.sleep(4 * 2)
        out, err = p.communicate(b"hello\n", timeout=60)
    finally:
        p.kill()
        kill_tagged(tag)
    assert p.returncode == 0, err
    assert b"got 'hello\\n'" in out and b"stalled" not in err, err


def _reads_stdin(tag):
    from mslaunch.machine.activity import reads_stdin
    return any(reads_stdin(pid) for pid in tagged_pids(tag))


@pytest.mark.remote
def test_a_long_collective_over_a_slow_link_is_not_a_stall_and_a_hang_still_is(sshbed, ompi4,
                                                                              tmp_path):
    """One Allreduce of 40 MB between h1 and h2 whose links are limited to 20 Mbit/s
    (tc's token bucket: this kernel has no netem) takes about 16 s, and nothing is
    printed meanwhile: --stall-report 5 says nothing.  The same job with rank 1 never
    joining is reported, and --stall-exit ends it."""
    from remote import renv, run_remote, settle
    python = ompi4       # Open MPI's TCP between hosts (the mpich wheel's finds a way round)
    sshbed.require_netns()
    home = sshbed.make_home(tmp_path / "home")
    hosts = [sshbed.host(name) for name in ("h1", "h2")]
    for h in hosts:
        subprocess.run(["ip", "netns", "exec", h.namespace, "tc", "qdisc", "replace", "dev",
                        "eth0", "root", "tbf", "rate", "20mbit", "burst", "32kbit",
                        "latency", "400ms"], check=True)
    code = ("import sys, time\nfrom mpi4py import MPI\nc = MPI.COMM_WORLD\n"
            "a = bytearray(40 << 20)\nc.Barrier()\nt = time.time()\n"
            "if c.rank == 0 or sys.argv[1] == 'both':\n"
            "    c.Allreduce(MPI.IN_PLACE, [a, MPI.BYTE], op=MPI.BOR)\n"
            "else:\n    time.sleep(120)\n"
            "print('took', round(time.time() - t), flush=True)\n")
    tag = new_tag()
    try:
        ok = run_remote(home, "-H", "h1:1,h2:1", "-n", "2", "--stall-report", "5", "-x",
                        "MSL_TEST_TAG", python, "-c", code, "both",
                        env=renv(home, MSL_TEST_TAG=tag), timeout=180)
        settle(tag, sshbed)
        hung = run_remote(home, "-H", "h1:1,h2:1", "-n", "2", "--stall-report", "5",
                          "--stall-exit", "-x", "MSL_TEST_TAG", python, "-c", code, "one",
                          env=renv(home, MSL_TEST_TAG=tag), timeout=180)
        settle(tag, sshbed)
    finally:
        kill_tagged(tag)
        for h in hosts:
            subprocess.run(["ip", "netns", "exec", h.namespace, "tc", "qdisc", "del", "dev",
                            "eth0", "root"], check=False)
    took = [int(line.split()[1]) for line in ok.stdout.decode().splitlines()
            if line.startswith("took")]
    assert ok.returncode == 0, ok.stderr
    assert min(took) >= 10, took          # a collective longer than twice S
    assert b"stalled" not in ok.stderr, ok.stderr
    assert hung.returncode == 111, hung.stderr
    assert b"stalled for" in hung.stderr, hung.stderr


@pytest.mark.parametrize("where", ["local", pytest.param("remote", marks=pytest.mark.remote)])
def test_the_watch_samples_ranks_whose_threads_run_python_without_crashing_them(
        request, tmp_path, where):
    """Sampled every half second for 10 s while their threads start, recurse and end:
    a dump of every thread at each sample killed such a rank with SIGSEGV in two
    jobs of three (faulthandler walks frames that another thread frees), the main
    thread's own dump never does."""
    tag = new_tag()
    hosts: tuple = ()
    env = clean_env(MSL_TEST_TAG=tag)
    if where == "remote":
        from remote import renv
        bed = request.getfixturevalue("sshbed")
        env = renv(bed.make_home(tmp_path / "home"), MSL_TEST_TAG=tag)
        hosts = ("-H", "h1:2,h2:2")
    r = run("--stall-report", "1", "-n", "4", "--oversubscribe", *hosts, PY,
            program("thread_churn.py"), "10", env=env, timeout=180)
    err = r.stderr.decode()
    assert r.returncode == 0, err
    assert r.stdout.decode().split() == ["survived"] * 4, (r.stdout, err)
    assert "stalled" not in err, err
    if where == "remote":
        from remote import settle
        settle(tag, bed)
    assert wait_for(lambda: tagged_pids(tag) == [], 10)


def test_the_stall_report_shows_every_thread_though_samples_read_the_main_one(tmp_path):
    code = ("import threading\n"
            "def worker_4711():\n    threading.Event().wait()\n"
            "threading.Thread(target=worker_4711, daemon=True).start()\n"
            "def main_4711():\n    threading.Event().wait()\n"
            "main_4711()\n")
    tag = new_tag()
    r = run("--stall-report", "1", "--stall-exit", "-n", "2", PY, "-c", code,
            env=clean_env(MSL_TEST_TAG=tag), timeout=120)
    err = r.stderr.decode()
    assert r.returncode == 111, err
    assert "main_4711" in err and "worker_4711" in err, err
    assert wait_for(lambda: tagged_pids(tag) == [], 10)
