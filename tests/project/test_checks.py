"""The project's own mypy and ruff settings catch what they are there to catch.

scripts/test.sh runs both over the package before the suite; these tests
hold the settings in pyproject.toml to their word on small modules made
for the purpose: mypy checks for Python 3.9 (a 3.10 name is an error), looks
inside unannotated functions, and wants every ignore named and needed; ruff
finds a closure over a loop variable and an unused import.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from requires import require
from helpers import REPO

MYPY_CASES = {
    "python_39": ("import os\n\ndef f(a: int, b: int) -> int:\n"
                  "    return os.splice(a, b, 1)\n", "attr-defined"),
    "untyped_body": ("def f():\n    x: int = 'text'\n    return x\n", "assignment"),
    "unnamed_ignore": ("x: int = 'one'  # type: ignore\n", "ignore-without-code"),
    "stale_ignore": ("x: int = 1  # type: ignore[assignment]\n", "unused-ignore"),
    "never_equal": ("def f(a: int) -> bool:\n    return a == 'one'\n", "comparison-overlap"),
}


def tool(name: str) -> str:
    found = shutil.which(name, path=os.path.dirname(sys.executable))
    require(found is not None, f"{name} (pip install '.[test]')")
    return found


@pytest.fixture(scope="module")
def mypy_cache(tmp_path_factory):
    """One cache for the module's runs (the standard library is read once)."""
    return tmp_path_factory.mktemp("mypy-cache")


def checked_by_mypy(tmp_path, cache, source: str) -> str:
    """mypy's report on one module, with the project's settings."""
    module = tmp_path / "probe.py"
    module.write_text(source)
    r = subprocess.run([tool("mypy"), "--config-file", os.path.join(REPO, "pyproject.toml"),
                        "--cache-dir", str(cache), str(module)],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    return r.stdout + r.stderr


@pytest.mark.parametrize("case", sorted(MYPY_CASES))
def test_mypy_settings_catch(tmp_path, mypy_cache, case):
    source, code = MYPY_CASES[case]
    report = checked_by_mypy(tmp_path, mypy_cache, source)
    assert f"[{code}]" in report, report


def test_mypy_passes_a_clean_module(tmp_path, mypy_cache):
    report = checked_by_mypy(tmp_path, mypy_cache,
                             "import os\n\ndef f() -> int:\n    return os.getpid()\n")
    assert "Success" in report, report


def test_ruff_settings_catch(tmp_path):
    # Checked as if it were a module of the package, with the project's settings.
    probe = os.path.join(REPO, "mslaunch", f"_ruff_probe_{os.getpid()}.py")
    source = ('"""A probe."""\nimport os\n\n\ndef later(names):\n    calls = []\n'
              "    for name in names:\n        calls.append(lambda: name)\n    return calls\n")
    r = subprocess.run([tool("ruff"), "check", "--no-cache", "--stdin-filename", probe,
                        "--output-format", "concise", "-"], input=source,
                       capture_output=True, text=True, timeout=120, cwd=REPO)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "F401" in r.stdout and "B023" in r.stdout, r.stdout
