"""The release: the sdist and the wheel build, pass twine's check, carry the
version the changelog has a section for, paramiko as a dependency, and the man
page; the man page and the shell completions are what the option records make."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
import subprocess
import tarfile
import zipfile

import pytest

import mslaunch
from helpers import PY, REPO, clean_env, wait_for
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
    with tarfile.open(dist / names[1]) as sdist:
        shipped = sdist.getnames()
    for page in ("mslaunch.1", "mslaunch-top.1", "mslaunch-stacks.1"):
        assert f"mslaunch-{version}.data/data/share/man/man1/{page}" in files
        assert f"mslaunch-{version}/man/{page}" in shipped
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


@pytest.mark.parametrize("tool", ["mslaunch-top", "mslaunch-stacks"])
def test_the_inspection_commands_have_man_pages_of_their_usage(tool):
    with open(os.path.join(REPO, "man", tool + ".1")) as f:
        assert f.read() == manpage.tool_page(tool), "run scripts/options_table.py"
    require(shutil.which("groff") is not None, "groff (apt install groff-base)")
    page = os.path.join(REPO, "man", tool + ".1")
    r = subprocess.run(["groff", "-man", "-ww", "-z", page], capture_output=True, timeout=60)
    assert r.returncode == 0 and r.stderr == b"", r.stderr
    shown = subprocess.run(["groff", "-man", "-Tutf8", "-P-cbou", page], capture_output=True,
                           timeout=60).stdout.decode()
    assert "SYNOPSIS" in shown and "--version".replace("-", "\u2010") in shown or \
        "--version" in shown


def _bash_completes(word: str):
    script = completion("bash", typed_spellings())
    r = subprocess.run(["bash", "-c", script + f"COMP_LINE='mslaunch {word}'; "
                        "COMP_POINT=${#COMP_LINE}; _mslaunch; printf '%s\\n' \"${COMPREPLY[@]}\""],
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
    assert "--map-by" in script.split("if [[ $PREFIX == -* ]]", 1)[1]


def _home(tmp_path) -> str:
    """A HOME whose SSH config and known_hosts name hosts (and patterns, hashed names)."""
    ssh = tmp_path / "home" / ".ssh"
    ssh.mkdir(parents=True)
    (ssh / "config").write_text("Host node1 node2\n  HostName 10.0.0.1\nHost *.example !x\n"
                                "host gpu-a\n")
    (ssh / "known_hosts").write_text("nodeq,10.0.0.9 ssh-ed25519 AAAA\n"
                                     "[nodep]:2222 ssh-ed25519 AAAA\n"
                                     "|1|aGFzaGVk|aGFzaGVk ssh-ed25519 AAAA\n")
    return str(tmp_path / "home")


def _bash_in(home: str, words: str):
    script = completion("bash", typed_spellings())
    line = shlex.quote(f"mslaunch {words}")
    r = subprocess.run(["bash", "--norc", "-c", script + f"COMP_LINE={line}; "
                        "COMP_POINT=${#COMP_LINE}; _mslaunch; "
                        "printf '%s\\n' \"${COMPREPLY[@]}\""],
                       capture_output=True, timeout=30, env={**clean_env(), "HOME": home},
                       cwd=home)
    assert r.returncode == 0, r.stderr
    return r.stdout.decode().split()


def test_bash_completes_hosts_values_and_every_dialect_s_options(tmp_path):
    home = _home(tmp_path)
    assert _bash_in(home, "-H node") == ["node1", "node2", "nodep", "nodeq"]
    # bash replaces the part of the word after its last ':' or '=': the answers are that part
    assert _bash_in(home, "--host node1:2,no") == ["2,node1", "2,node2", "2,nodep", "2,nodeq"]
    assert _bash_in(home, "--host=nodeq,no") == ["nodeq,node1", "nodeq,node2", "nodeq,nodep",
                                                 "nodeq,nodeq"]
    assert _bash_in(home, "--map-by=c") == ["core"]
    assert _bash_in(home, "-H g") == ["gpu-a"]
    assert _bash_in(home, "--map-by c") == ["core"]
    assert "l3cache" in _bash_in(home, "--bind-to l")
    assert _bash_in(home, "--nproc-per-n") == ["--nproc-per-node"]
    assert _bash_in(home, "--num_g") == ["--num_gpus"]
    assert _bash_in(home, "--local_w") == ["--local_worker_num"]


def test_bash_never_runs_what_a_host_name_says_and_reads_known_hosts_alone(tmp_path):
    home = _home(tmp_path)
    ssh = os.path.join(home, ".ssh")
    with open(os.path.join(ssh, "config"), "a") as f:
        f.write("Host $(touch${IFS}ran) `touch${IFS}ran2`\n")
    assert _bash_in(home, "-H $") == ["$(touch${IFS}ran)"]
    assert _bash_in(home, "-H '`'") in ([], ["`touch${IFS}ran2`"])
    assert not os.path.exists(os.path.join(home, "ran"))
    assert not os.path.exists(os.path.join(home, "ran2"))
    os.unlink(os.path.join(ssh, "config"))          # (mawk stops at a file it cannot open)
    assert _bash_in(home, "-H node") == ["nodep", "nodeq"]


def _tmux_types(shell: list, setup: str, typed: str, env) -> str:
    """What a terminal shows after ``setup`` and then ``typed`` and Tab twice in ``shell``."""
    require(shutil.which("tmux") is not None, "tmux (apt-get install tmux)")
    sock = f"msl-comp-{os.getpid()}-{shell[0]}"
    tmux = ["tmux", "-L", sock, "-f", "/dev/null"]
    try:
        subprocess.run(tmux + ["new-session", "-d", "-x", "120", "-y", "20", "-s", "c", *shell],
                       check=True, env=env, timeout=30)
        subprocess.run(tmux + ["send-keys", "-t", "c", setup, "Enter"], check=True, timeout=30)
        subprocess.run(tmux + ["send-keys", "-t", "c", "echo setup-done", "Enter"], check=True,
                       timeout=30)

        def screen() -> str:
            return subprocess.run(tmux + ["capture-pane", "-p", "-t", "c"], capture_output=True,
                                  timeout=30).stdout.decode()
        assert wait_for(lambda: "\nsetup-done" in screen(), 30, 0.1), screen()
        subprocess.run(tmux + ["send-keys", "-t", "c", "clear", "Enter"], check=True, timeout=30)
        assert wait_for(lambda: "setup-done" not in screen(), 30, 0.1), screen()
        subprocess.run(tmux + ["send-keys", "-t", "c", typed, "Tab", "Tab"], check=True,
                       timeout=30)
        return screen
    except BaseException:
        subprocess.run(tmux + ["kill-server"], capture_output=True, timeout=30)
        raise


def _tmux_stop(shell: list) -> None:
    subprocess.run(["tmux", "-L", f"msl-comp-{os.getpid()}-{shell[0]}", "kill-server"],
                   capture_output=True, timeout=30)


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_a_real_shell_completes_hosts_from_the_ssh_config_and_map_by_s_values(tmp_path, shell):
    require(shutil.which(shell) is not None, f"{shell} (apt install {shell})")
    home = _home(tmp_path)
    env = {**clean_env(), "HOME": home, "TERM": "xterm", "PS1": "$ "}
    env.pop("TMUX", None)
    where = tmp_path / "completions"
    where.mkdir()
    if shell == "bash":
        (where / "mslaunch").write_text(completion("bash", typed_spellings()))
        argv = ["bash", "--norc", "--noprofile"]
        # (a list at the first Tab: the second may come before the first is done)
        setup = f"source {where}/mslaunch; bind 'set show-all-if-ambiguous on'"
    else:
        (where / "_mslaunch").write_text(completion("zsh", typed_spellings()))
        argv = ["zsh", "-f"]
        setup = f"PS1='$ '; fpath=({where} $fpath); autoload -U compinit; compinit -u"
    screen = _tmux_types(argv, setup, "mslaunch -H nod", env)
    try:
        assert wait_for(lambda: "node2" in screen() and "nodeq" in screen(), 30, 0.1), screen()
        subprocess.run(["tmux", "-L", f"msl-comp-{os.getpid()}-{shell}", "send-keys", "-t", "c",
                        "C-u", "mslaunch --map-by co", "Tab"], check=True, timeout=30)
        assert wait_for(lambda: "mslaunch --map-by core" in screen(), 30, 0.1), screen()
    finally:
        _tmux_stop(argv)


@pytest.mark.parametrize("compiled", [False, True], ids=["no-compile", "compiled"])
def test_a_package_installed_without_bytecode_is_compiled_once_into_the_user_s_cache(
        tmp_path, compiled):
    """``pip install --no-compile`` under ``PYTHONDONTWRITEBYTECODE=1`` (as images
    are): the launcher keeps its modules' bytecode in the user's cache, writes
    nothing beside the package, and the next launch reads it (nothing written
    again); a package that came compiled is read as it is, and no cache is made."""
    import compileall
    site = tmp_path / "site"
    shutil.copytree(os.path.join(REPO, "mslaunch"), site / "mslaunch",
                    ignore=shutil.ignore_patterns("__pycache__"))
    if compiled:
        assert compileall.compile_dir(str(site / "mslaunch"), quiet=1)
    cache = tmp_path / "cache" / "mslaunch" / "bytecode"
    env = clean_env(PYTHONPATH=str(site), PYTHONDONTWRITEBYTECODE="1", XDG_CACHE_HOME=str(tmp_path / "cache"))
    launch = [PY, "-c", "from mslaunch.__main__ import main; main()", "-n", "1", "true"]
    r = subprocess.run(launch, capture_output=True, env=env, timeout=60, cwd=tmp_path)
    assert r.returncode == 0, r.stderr

    def cached():
        return {str(p.relative_to(cache)): p.stat().st_mtime_ns
                for p in cache.rglob("*.pyc")}
    beside = sorted(site.rglob("__pycache__"))
    if compiled:
        assert not cache.exists()
        return
    assert beside == [], beside
    first = cached()
    assert any(name.endswith(os.path.join("mslaunch", "run", "launch.cpython-"
                                          f"{sys.version_info[0]}{sys.version_info[1]}.pyc"))
               for name in first), sorted(first)
    r = subprocess.run(launch, capture_output=True, env=env, timeout=60, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert cached() == first          # read, not compiled and written again


def test_nothing_is_kept_in_a_cache_another_user_could_write(tmp_path):
    """Root launching with a cache folder of another user's (a HOME kept by
    ``sudo``, say) keeps nothing there, bytecode or other: that user could
    replace it, and root would run it (or give it to its ranks)."""
    if os.geteuid() != 0:
        pytest.skip("needs root, to give the cache folder to another user")
    site = tmp_path / "site"
    shutil.copytree(os.path.join(REPO, "mslaunch"), site / "mslaunch",
                    ignore=shutil.ignore_patterns("__pycache__"))
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, 65534, 65534)
    env = clean_env(PYTHONPATH=str(site), PYTHONDONTWRITEBYTECODE="1", XDG_CACHE_HOME=str(theirs))
    r = subprocess.run([PY, "-c", "from mslaunch.__main__ import main; main()", "-n", "1",
                        "true"], capture_output=True, env=env, timeout=60, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert sorted(theirs.rglob("*")) == []
