"""The suite's own scheduling (tests/conftest.py): under pytest-xdist's loadgroup, as
scripts/test.sh runs it, each module is one unit of work, handed out longest first."""

from __future__ import annotations

import os

import pytest


@pytest.mark.parametrize("i", range(4))
def test_this_module_runs_whole_on_one_worker(request, tmp_path_factory, i):
    """Each of the module's tests notes its worker in a file that all the run's
    workers share; each finds only its own worker there."""
    if not request.config.getoption("loadgroup", False):
        pytest.skip("not run by pytest-xdist with --dist loadgroup")
    shared = tmp_path_factory.getbasetemp().parent
    notes = shared / f"suite-order-{os.environ['PYTEST_XDIST_TESTRUNUID']}"
    with open(notes, "a") as f:
        f.write(os.environ["PYTEST_XDIST_WORKER"] + "\n")
    assert set(notes.read_text().split()) == {os.environ["PYTEST_XDIST_WORKER"]}
