"""The command's start runs the package's modules from one file of the user's
cache (mslaunch/machine/codecache.py): written by the first launch, read by the next;
a module edited since runs as edited; a damaged file, or one another user
could have written, is not read; ``-X importtime`` sees every import.

Each test runs a copy of the package, compiled as an install is, with a cache
folder of its own."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import List, Tuple

import pytest

from helpers import PY, REPO, clean_env

#: The command as installed (no ``site``), noting at its exit which modules of
#: the package ran from the file, and whether ``import`` is the interpreter's own.
_WRAPPER = """
import builtins, json, os, sys
sys.argv = ["mslaunch"] + sys.argv[1:]
from mslaunch.machine import codecache
_exit, me = os._exit, os.getpid()
def noted(code):
    if os.getpid() == me:
        with open(os.environ["NOTES"], "w") as f:
            json.dump({"served": codecache.served,
                       "own_import": builtins.__import__ is not codecache._import}, f)
    _exit(code)
os._exit = noted
from mslaunch.__main__ import main
main()
"""


@pytest.fixture
def package(tmp_path) -> Path:
    """A compiled copy of the package, in a folder of its own."""
    root = tmp_path / "pkg"
    shutil.copytree(os.path.join(REPO, "mslaunch"), root / "mslaunch",
                    ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([PY, "-m", "compileall", "-q", str(root / "mslaunch")], check=True)
    return root


def _launch(package: Path, tmp_path: Path, *args: str, flags: Tuple[str, ...] = ()
            ) -> Tuple[subprocess.CompletedProcess, dict]:
    notes = tmp_path / "notes.json"
    if notes.exists():
        notes.unlink()
    env = clean_env(PYTHONPATH=str(package), XDG_CACHE_HOME=str(tmp_path / "cache"),
                    NOTES=str(notes), PYTHONDONTWRITEBYTECODE="1")
    r = subprocess.run([PY, "-S", *flags, "-c", _WRAPPER, *(args or ("-n", "1", "true"))],
                       capture_output=True, env=env, timeout=120, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    return r, json.loads(notes.read_text())


def _files(tmp_path: Path) -> List[Path]:
    return sorted((tmp_path / "cache" / "mslaunch").glob("code-*.bin"))


def test_the_first_launch_writes_the_file_and_the_next_runs_its_modules_from_it(
        package, tmp_path):
    _, first = _launch(package, tmp_path)
    assert first["served"] == [] and first["own_import"]
    (made,) = _files(tmp_path)
    assert stat.S_IMODE(made.stat().st_mode) == 0o600
    assert f"-{sys.implementation.cache_tag}.bin" in made.name
    written = made.stat().st_ino
    r, second = _launch(package, tmp_path, "-n", "2", "echo", "hi")
    assert r.stdout == b"hi\nhi\n"
    # the launch's own modules, the supervisor and the PMI services among them
    assert {"mslaunch.cli", "mslaunch.cli.mpirun", "mslaunch.run.supervise",
            "mslaunch.serve.mpijobs"} <= set(second["served"]), second
    assert second["own_import"]          # (given back once the launch waits)
    assert _files(tmp_path) == [made] and made.stat().st_ino == written   # (not written again)


def test_a_module_edited_after_the_file_was_written_runs_as_edited(package, tmp_path):
    _launch(package, tmp_path)
    edited = package / "mslaunch" / "cli" / "options.py"
    with open(edited, "a") as f:
        f.write("\nimport sys as _sys\n_sys.stderr.write('options as edited\\n')\n")
    for _ in range(2):           # the file written again in between, without it
        r, notes = _launch(package, tmp_path)
        assert r.stderr == b"options as edited\n"
        assert "mslaunch.cli.options" not in notes["served"]
        assert "mslaunch.cli.mpirun" in notes["served"]


@pytest.mark.parametrize("damage", ["truncated", "garbage", "writable", "foreign"])
def test_a_damaged_file_or_one_another_user_could_write_is_not_read(package, tmp_path,
                                                                     damage):
    _launch(package, tmp_path)
    (made,) = _files(tmp_path)
    if damage == "truncated":
        made.write_bytes(made.read_bytes()[:made.stat().st_size // 2])
    elif damage == "garbage":
        made.write_bytes(b"\0" * 4096)
    elif damage == "writable":
        made.chmod(0o666)
    else:
        if os.geteuid() != 0:
            pytest.skip("needs root, to give the file to another user")
        os.chown(made, 65534, 65534)
    r, notes = _launch(package, tmp_path)
    assert notes["served"] == [], notes
    # ... and it is written again, as this user's own
    st = made.stat()
    assert st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) == 0o600
    _, again = _launch(package, tmp_path)
    assert "mslaunch.run.supervise" in again["served"]


def test_importtime_sees_every_import(package, tmp_path):
    _launch(package, tmp_path)
    r, notes = _launch(package, tmp_path, flags=("-X", "importtime"))
    assert notes["served"] == []
    timed = {line.rsplit("|", 1)[1].strip() for line in r.stderr.decode().splitlines()
             if line.startswith("import time:")}
    assert {"mslaunch.cli.mpirun", "mslaunch.run.supervise"} <= timed


def test_the_file_of_an_installation_gone_is_removed(package, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(package, other)
    _launch(other, tmp_path)
    (theirs,) = _files(tmp_path)
    shutil.rmtree(other)
    _launch(package, tmp_path)          # (writes its own, and looks at the others)
    (ours,) = _files(tmp_path)
    assert ours != theirs


@pytest.mark.parametrize("closed", ["<&-", "<&- >&- 2>&-"])
def test_a_launch_with_its_standard_streams_closed_keeps_the_file_off_them(package,
                                                                            tmp_path, closed):
    """The file's descriptor is not 0, 1 or 2 of a command started without them:
    its ranks get /dev/null there, as without the file."""
    _launch(package, tmp_path)
    out = tmp_path / "out"
    env = clean_env(PYTHONPATH=str(package), XDG_CACHE_HOME=str(tmp_path / "cache"))
    r = subprocess.run(["sh", "-c", f'"$@" {closed}', "sh", PY, "-m", "mslaunch", "-n", "2",
                        "--stdin", "all", "sh", "-c", f"wc -c >> {out}"],
                       capture_output=True, env=env, timeout=60, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert out.read_text().split() == ["0", "0"]
