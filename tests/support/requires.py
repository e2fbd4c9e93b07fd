"""What a test needs that may be missing here: skip without it, or fail when the run
must be complete (``MSLAUNCH_TEST_REQUIRE_ALL=1``, as scripts/test.sh sets it)."""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import List

import pytest

REQUIRE_ALL = os.environ.get("MSLAUNCH_TEST_REQUIRE_ALL") == "1"


def require(ok: bool, reason: str) -> None:
    """Skip when a needed piece is missing, or fail when the suite must be complete."""
    if ok:
        return
    if REQUIRE_ALL:
        pytest.fail(f"required for this test run: {reason}")
    pytest.skip(reason)


def need_eu_stack() -> None:
    """elfutils' eu-stack, which reads the native frames of running ranks."""
    require(shutil.which("eu-stack") is not None, "eu-stack (apt-get install elfutils)")


_mpich_probe: List[bool] = []


def mpich_ready() -> bool:
    """Whether this interpreter's mpi4py runs on the MPICH wheel (probed once)."""
    if not _mpich_probe:
        from helpers import PY, clean_env
        probe = subprocess.run([PY, "-c", "from mpi4py import MPI; "
                                "print(MPI.Get_library_version())"],
                               capture_output=True, env=clean_env(), timeout=60)
        _mpich_probe.append(probe.returncode == 0 and b"MPICH" in probe.stdout)
    return _mpich_probe[0]
