"""The suite's own scheduling (tests/conftest.py): under pytest-xdist's loadgroup, as
scripts/test.sh runs it, each module is one unit of work, handed out longest first."""

from __future__ import annotations

import pytest


def test_this_module_runs_whole_on_one_worker(request):
    if not request.config.getoption("loadgroup", False):
        pytest.skip("not run by pytest-xdist with --dist loadgroup")
    assert request.node.nodeid.endswith("@test_suite_order"), request.node.nodeid
