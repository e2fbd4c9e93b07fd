import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pytest

REQUIRE_ALL = os.environ.get("MSLAUNCH_TEST_REQUIRE_ALL") == "1"

# The multi-host SSH test bed's fixtures (sshbed, sshbeds).
pytest_plugins = ["sshbed"]


def require(ok: bool, reason: str) -> None:
    """Skip when a needed piece is missing, or fail when the suite must be complete."""
    if ok:
        return
    if REQUIRE_ALL:
        pytest.fail(f"required for this test run: {reason}")
    pytest.skip(reason)
