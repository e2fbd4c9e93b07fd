import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pytest

REQUIRE_ALL = os.environ.get("MSLAUNCH_TEST_REQUIRE_ALL") == "1"

# The multi-host SSH test bed's fixtures (sshbed, sshbeds).
pytest_plugins = ["sshbed", "slurmbed", "shmcheck"]


def require(ok: bool, reason: str) -> None:
    """Skip when a needed piece is missing, or fail when the suite must be complete."""
    if ok:
        return
    if REQUIRE_ALL:
        pytest.fail(f"required for this test run: {reason}")
    pytest.skip(reason)


@pytest.fixture
def bin_dir(tmp_path):
    """``python`` on PATH as msrun wants it (the venv's, as an activated venv has)."""
    from helpers import PY
    d = tmp_path / "bin"
    d.mkdir()
    (d / "python").symlink_to(PY)
    return d


_mpich_probe = []


def mpich_ready() -> bool:
    """Whether this interpreter's mpi4py runs on the MPICH wheel (probed once)."""
    if not _mpich_probe:
        import subprocess
        from helpers import PY, clean_env
        probe = subprocess.run([PY, "-c", "from mpi4py import MPI; "
                                "print(MPI.Get_library_version())"],
                               capture_output=True, env=clean_env(), timeout=60)
        _mpich_probe.append(probe.returncode == 0 and b"MPICH" in probe.stdout)
    return _mpich_probe[0]


@pytest.fixture(scope="session")
def mpich():
    require(mpich_ready(), "mpi4py with the MPICH wheel (pip install '.[mpi]')")
