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
    assert first["served"] == []
    (made,) = _files(tmp_path)
    assert stat.S_IMODE(made.stat().st_mode) == 0o600
    assert f"-{sys.implementation.cache_tag}.bin" in made.name
    written = made.stat().st_ino
    r, second = _launch(package, tmp_path, "-n", "2", "echo", "hi")
    assert r.stdout == b"hi\nhi\n"
    # the launch's own modules, the supervisor and what reaches the MPI services among them
    assert {"mslaunch.cli", "mslaunch.cli.mpirun", "mslaunch.run.supervise",
            "mslaunch.mpi.early"} <= set(second["served"]), second
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


def test_a_module_compiled_after_the_file_was_written_runs_from_it_again(package, tmp_path):
    edited = package / "mslaunch" / "cli" / "options.py"
    with open(edited, "a") as f:
        f.write("\n_EDITED = True\n")
    # (its bytecode stale, and not written under PYTHONDONTWRITEBYTECODE)
    _, first = _launch(package, tmp_path)
    _, second = _launch(package, tmp_path)
    assert "mslaunch.cli.options" not in second["served"]
    assert "mslaunch.cli.mpirun" in second["served"]
    subprocess.run([PY, "-m", "compileall", "-q", str(edited)], check=True)
    _launch(package, tmp_path)           # (the file written again, with it)
    (made,) = _files(tmp_path)
    written = made.stat().st_ino
    _, fourth = _launch(package, tmp_path)
    assert "mslaunch.cli.options" in fourth["served"], fourth
    assert made.stat().st_ino == written


@pytest.mark.parametrize("damage", ["truncated", "garbage", "sized", "writable", "foreign"])
def test_a_damaged_file_or_one_another_user_could_write_is_not_read(package, tmp_path,
                                                                     damage):
    _launch(package, tmp_path)
    (made,) = _files(tmp_path)
    damaged = made.stat().st_ino
    if damage == "truncated":
        made.write_bytes(made.read_bytes()[:made.stat().st_size // 2])
    elif damage == "garbage":
        made.write_bytes(b"\0" * 4096)
    elif damage == "sized":          # (the right first line, then a size past the end)
        made.write_bytes(made.read_bytes()[:16] + (1 << 62).to_bytes(8, "little"))
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
    assert st.st_ino != damaged
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


def test_the_file_of_an_installation_gone_a_week_is_removed(package, tmp_path):
    other, gone = tmp_path / "other", tmp_path / "gone"
    for copy in (other, gone):
        shutil.copytree(package, copy)
        _launch(copy, tmp_path)
    files = _files(tmp_path)
    shutil.rmtree(gone)
    for path in files:
        os.utime(path, (path.stat().st_atime, path.stat().st_mtime - 8 * 86400))
    _launch(package, tmp_path)          # (writes its own, and looks at the others)
    left = _files(tmp_path)
    # the other installation's, still there, stays; the one gone goes
    assert len(left) == 2 and len(set(left) - set(files)) == 1, (files, left)


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


#: Runs ``import mslaunch.zz_probe`` from the file while another thread is in the
#: middle of importing ``slowmod``, which the probe imports, and which imports
#: another module once the probe has begun: the import system's module locks,
#: not one lock over everything (which would hold both threads forever).
_THREADS = """
import sys, threading
from mslaunch.machine import codecache
codecache.start()
import slowsync
t = threading.Thread(target=lambda: __import__("slowmod"))
t.start()
slowsync.started.wait()
import mslaunch.zz_probe
t.join()
print(mslaunch.zz_probe.Y, "mslaunch.zz_probe" in codecache.served)
codecache.save()
"""


def test_a_module_run_from_the_file_waits_for_another_thread_s_import(package, tmp_path):
    (tmp_path / "slowsync.py").write_text("import threading\nstarted, proceed = "
                                          "threading.Event(), threading.Event()\n")
    (tmp_path / "slowmod.py").write_text("import slowsync\nslowsync.started.set()\n"
                                         "slowsync.proceed.wait()\nimport colorsys\nX = 1\n")
    (package / "mslaunch" / "zz_probe.py").write_text(
        "import slowsync\nslowsync.proceed.set()\nimport slowmod\nY = slowmod.X\n")
    subprocess.run([PY, "-m", "compileall", "-q", str(package / "mslaunch")], check=True)
    env = clean_env(PYTHONPATH=f"{package}:{tmp_path}", XDG_CACHE_HOME=str(tmp_path / "cache"),
                    PYTHONDONTWRITEBYTECODE="1")
    for served in ("False", "True"):        # (the first run writes the file)
        r = subprocess.run([PY, "-S", "-c", _THREADS], capture_output=True, env=env,
                           timeout=60, cwd=str(tmp_path))
        assert r.returncode == 0, r.stderr
        assert r.stdout.decode().split() == ["1", served]


def test_a_package_that_imports_its_module_runs_it_once(package, tmp_path):
    """``import mslaunch.plan.place`` first: the package's ``__init__`` imports
    ``.place`` itself (and binds the name to a function of it)."""
    env = clean_env(PYTHONPATH=str(package), XDG_CACHE_HOME=str(tmp_path / "cache"),
                    PYTHONDONTWRITEBYTECODE="1")
    program = ("import sys\nfrom mslaunch.machine import codecache\ncodecache.start()\n"
               "import mslaunch.plan.place\n"
               "print(type(sys.modules['mslaunch.plan'].place).__name__, "
               "codecache.served.count('mslaunch.plan.place'))\ncodecache.save()\n")
    outs = []
    for _ in range(2):
        r = subprocess.run([PY, "-S", "-c", program], capture_output=True, env=env, timeout=60,
                           cwd=str(tmp_path))
        assert r.returncode == 0, r.stderr
        outs.append(r.stdout.decode().split())
    assert outs == [["function", "0"], ["function", "1"]]


def test_optimized_runs_have_a_file_of_their_own(package, tmp_path):
    subprocess.run([PY, "-O", "-m", "compileall", "-q", str(package / "mslaunch")], check=True)
    _launch(package, tmp_path)
    _launch(package, tmp_path, flags=("-O",))
    assert sorted(f.name.endswith("-o1.bin") for f in _files(tmp_path)) == [False, True]
    _, notes = _launch(package, tmp_path, flags=("-O",))
    assert "mslaunch.run.supervise" in notes["served"]


def test_hash_based_bytecode_is_not_served_and_not_looked_for_again(package, tmp_path):
    subprocess.run([PY, "-m", "compileall", "-q", "-f", "--invalidation-mode",
                    "checked-hash", str(package / "mslaunch")], check=True)
    _launch(package, tmp_path)
    (made,) = _files(tmp_path)
    written = made.stat().st_ino
    r, notes = _launch(package, tmp_path)
    assert notes["served"] == []
    assert made.stat().st_ino == written
