"""The release: the sdist and the wheel build, pass twine's check, carry the
version the changelog has a section for, paramiko as a dependency, and the man
page; the man page and the shell completions are what the option records make."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tarfile
import zipfile

import pytest

import mslaunch
from helpers import PY, REPO
from mslaunch.cli import manpage
from mslaunch.cli.completion import completion
from mslaunch.cli.options import SPELLINGS, typed_spellings
from requires import require


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    src = tmp_path_factory.mktemp("src") / "mslaunch"
    # a copy of the checkout's files git knows of: nothing built or cached goes in
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True,
                            check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        if os.path.exists(os.path.join(REPO, name)):
            os.makedirs(os.path.dirname(src / name), exist_ok=True)
            shutil.copy2(os.path.join(REPO, name), src / name)
    r = subprocess.run([PY, "-m", "build", "--no-isolation", "--outdir", str(out), str(src)],
                       capture_output=True, timeout=300)
    assert r.returncode == 0, r.stderr.decode()[-3000:]
    return out


def test_the_sdist_and_the_wheel_of_this_version(dist):
    version = mslaunch.__version__
    names = sorted(os.listdir(dist))
    assert names == [f"mslaunch-{version}-py3-none-any.whl", f"mslaunch-{version}.tar.gz"]
    r = subprocess.run([PY, "-m", "twine", "check", "--strict", *(str(dist / n) for n in names)],
                       capture_output=True, timeout=120)
    assert r.returncode == 0, r.stdout.decode() + r.stderr.decode()
    with zipfile.ZipFile(dist / names[0]) as wheel:
        files = wheel.namelist()
        metadata = wheel.read(f"mslaunch-{version}.dist-info/METADATA").decode()
    assert re.search(r"^Requires-Dist: paramiko>=3$", metadata, re.M), metadata
    assert f"mslaunch-{version}.data/data/share/man/man1/mslaunch.1" in files
    with tarfile.open(dist / names[1]) as sdist:
        assert f"mslaunch-{version}/man/mslaunch.1" in sdist.getnames()
    with open(os.path.join(REPO, "CHANGELOG.md")) as f:
        changelog = f.read()
    assert re.search(rf"^## {re.escape(version)} \(\d{{4}}-\d\d-\d\d\)$", changelog, re.M)


def test_the_man_page_is_the_option_records_and_groff_reads_it_cleanly():
    with open(os.path.join(REPO, "man", "mslaunch.1")) as f:
        shipped = f.read()
    assert shipped == manpage.man_page(), "run scripts/options_table.py"
    require(shutil.which("groff") is not None, "groff (apt install groff-base)")
    r = subprocess.run(["groff", "-man", "-ww", "-z", os.path.join(REPO, "man", "mslaunch.1")],
                       capture_output=True, timeout=60)
    assert r.returncode == 0 and r.stderr == b"", r.stderr
    shown = subprocess.run(["groff", "-man", "-Tutf8", "-P-cbou",
                            os.path.join(REPO, "man", "mslaunch.1")],
                           capture_output=True, timeout=60).stdout.decode()
    for phrase in ("--hostfile", "--map-by", "--max-restarts", "--output-filename",
                   "EXIT STATUS", "TORCHRUN DIALECT", f"mslaunch {mslaunch.__version__}"):
        assert phrase.replace("-", "\u2010") in shown or phrase in shown, phrase


def _bash_completes(word: str):
    script = completion("bash", typed_spellings())
    r = subprocess.run(["bash", "-c", script + f"COMP_WORDS=(mslaunch {word}); COMP_CWORD=1; "
                        "_mslaunch; printf '%s\\n' \"${COMPREPLY[@]}\""],
                       capture_output=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return r.stdout.decode().split()


def test_bash_completes_every_option_of_the_table():
    assert _bash_completes("--hostf") == ["--hostfile"]
    every = _bash_completes("-")
    for name in SPELLINGS:
        assert ("--" + name if len(name) > 1 else "-" + name) in every, name
    done = subprocess.run([PY, "-m", "mslaunch", "--completion", "bash"], capture_output=True)
    assert done.returncode == 0 and done.stdout.decode() == completion("bash", typed_spellings())


def test_zsh_reads_its_completion_script():
    require(shutil.which("zsh") is not None, "zsh (apt install zsh)")
    script = completion("zsh", typed_spellings())
    r = subprocess.run(["zsh", "-n", "-c", script], capture_output=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert "--map-by" in script.split("compadd -- ", 1)[1].split("\n", 1)[0]
