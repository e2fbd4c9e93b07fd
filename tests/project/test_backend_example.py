"""The worked example of a backend (docs/design.md, "Adding a backend: a worked
example"), run as the page prints it: its module written out, its table line
put before ``local``'s, and jobs run through it, which must meet the
supervisor's promises (each rank's output, the first failure's code, a
``--timeout`` that leaves nothing behind); and the conformance checks of
every backend and handle, run on it."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from conformance import check_backend, check_handle
from helpers import REPO, all_gone, clean_env, kill_tagged, new_tag

PAGE = os.path.join(REPO, "docs", "design.md")
SECTION = "### Adding a backend: a worked example"

#: Runs mslaunch with the example's line put before ``local``'s: DIR MSLAUNCH-ARGS...
RUNNER = """
import os, sys
sys.path.insert(0, sys.argv.pop(1))
from mslaunch.backends import backend
table = {"_local": None}      # backend.py's own, named in the line's block
exec(open(os.path.join(sys.path[0], "line.py")).read(), table)
nice = [row for row in table["BACKENDS"] if isinstance(row, tuple) and row[0] == "nice"]
row = nice[0][:3] + ("nicebackend",) + nice[0][4:]
backend.BACKENDS = backend.BACKENDS[:-1] + (row,) + backend.BACKENDS[-1:]
sys.argv = ["mslaunch", *sys.argv[1:]]
from mslaunch.__main__ import main
main()
"""


def _blocks():
    with open(PAGE, encoding="utf-8") as f:
        text = f.read()
    section = text[text.index(SECTION):]
    section = section[:section.index("\n## ")]
    return re.findall(r"```python\n(.*?)```", section, re.S)


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    where = tmp_path_factory.mktemp("example")
    module, line = _blocks()
    (where / "nicebackend.py").write_text(module)
    (where / "line.py").write_text(line)
    (where / "runner.py").write_text(RUNNER)
    return str(where)


def _run(example, *args, tag="", timeout=60):
    env = clean_env(MSLAUNCH_NICE="7", MSL_TEST_TAG=tag or new_tag())
    return subprocess.run([sys.executable, os.path.join(example, "runner.py"), example, *args],
                          env=env, capture_output=True, timeout=timeout)


def test_the_page_has_the_module_and_its_line():
    module, line = _blocks()
    assert "class NiceBackend(Backend)" in module and '"nice"' in line


def test_the_example_passes_the_conformance_checks(example):
    sys.path.insert(0, example)
    try:
        import nicebackend
    finally:
        sys.path.remove(example)
    check_backend(nicebackend.NiceBackend, "nice")
    check_handle(nicebackend.NiceRank)


def test_a_job_runs_through_the_example_each_rank_niced_and_its_output_its_own(example):
    done = _run(example, "-n", "3", "--tag-output", "sh", "-c", 'echo "$(nice) $RANK"')
    assert done.returncode == 0, done.stderr
    lines = sorted(done.stdout.decode().splitlines())
    niced = min(19, os.nice(0) + 7)        # (nice adds to what the test runs with)
    assert lines == [f"[1,{r}]<stdout>:{niced} {r}" for r in range(3)]


def test_the_first_failure_of_the_example_s_ranks_is_the_job_s(example):
    done = _run(example, "-n", "2", "sh", "-c", 'test "$RANK" = 1 && exit 3; sleep 600')
    assert done.returncode == 3
    assert b"rank 1" in done.stderr


def test_a_timeout_ends_the_example_s_ranks_and_leaves_nothing(example):
    tag = new_tag()
    try:
        done = _run(example, "-n", "2", "--timeout", "1", "sh", "-c",
                    "trap '' TERM; sleep 600", tag=tag)
        assert done.returncode == 110
        assert all_gone(tag)
    finally:
        kill_tagged(tag)
