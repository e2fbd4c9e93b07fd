"""Agents start from the host's own mslaunch when it is the launcher's, byte for
byte, and are sent the package otherwise: over SSH and under srun.

The host's "installed" mslaunch is a copy of this checkout's package in a
temporary directory, put on the agent's Python path by a ``--remote-python``
wrapper (the hosts share this machine's file system).  Whether the agent
imported that copy shows in the copy itself: Python writes the compiled
modules it imports from there into its ``__pycache__``; an agent that was sent
the package imports from memory and writes nothing.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import List, Optional

import pytest

from helpers import PY, REPO, clean_env, cmd, new_tag, tagged_pids, wait_for
from slurm import cmdline, finish, salloc

pytestmark = pytest.mark.remote

SHOW = "import os, socket; print(os.environ['OMPI_COMM_WORLD_RANK'], socket.gethostname())"


def host_install(tmp_path: Path, *, version: Optional[str] = None, broken: bool = False,
                 bad_bytecode: bool = False, layout: str = "pythonpath") -> Path:
    """A copy of the package in ``tmp_path/site`` (another ``version``, or one
    module ``broken``, or a compiled module that does not load) and a Python
    wrapper that has it on its path; the wrapper's path.

    ``layout`` says how the wrapper's Python finds the copy: ``pythonpath``
    (``PYTHONPATH``), ``venv`` (installed in a virtual environment's
    site-packages, ``tmp_path/site`` a link to it; the wrapper runs the
    environment's Python with no ``PYTHONPATH``), ``pth`` (in ``tmp_path/site``,
    named by a ``.pth`` file of such an environment, as an older editable install),
    ``finder`` (named by the finder module of such an environment's ``.pth``, as
    setuptools' editable install since its version 64)."""
    site = tmp_path / "site"
    venv_python = None
    if layout != "pythonpath":
        subprocess.run([PY, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True)
        venv_python = tmp_path / "venv" / "bin" / "python"
        (packages,) = (tmp_path / "venv" / "lib").glob("python3*/site-packages")
        if layout == "venv":
            site.symlink_to(packages)
        elif layout == "pth":
            (packages / "mslaunch_dev.pth").write_text(f"# a development copy\n{site}\n")
        else:
            # what `pip install -e` writes with setuptools 64 or later: a .pth
            # that imports a finder module mapping the package to its folder
            finder = "__editable___mslaunch_0_1_0_finder"
            (packages / "__editable__.mslaunch-0.1.0.pth").write_text(
                f"import {finder}; {finder}.install()\n")
            (packages / f"{finder}.py").write_text(
                "from __future__ import annotations\nimport sys\n\n"
                f"MAPPING: dict[str, str] = {{'mslaunch': {str(site / 'mslaunch')!r}}}\n"
                "NAMESPACES: dict[str, list[str]] = {}\n\n\n"
                "def install():\n    sys.path.append(MAPPING['mslaunch'].rsplit('/', 1)[0])\n")
    shutil.copytree(Path(REPO) / "mslaunch", site / "mslaunch",
                    ignore=shutil.ignore_patterns("__pycache__"))
    init = site / "mslaunch" / "__init__.py"
    if version is not None:
        text = init.read_text()
        assert '__version__ = "' in text
        init.write_text(text.replace('__version__ = "', f'__version__ = "{version}', 1))
    if broken:
        (site / "mslaunch" / "agent" / "agent.py").write_text("this is not Python\n")
    if bad_bytecode:
        # The sources are the launcher's; the agent's compiled module, which
        # Python trusts by its header (source time and size), is garbage.
        subprocess.run([PY, "-m", "compileall", "-q", str(site / "mslaunch")], check=True)
        pyc = next((site / "mslaunch" / "agent" / "__pycache__").glob("agent.*.pyc"))
        pyc.write_bytes(pyc.read_bytes()[:16] + b"\xff" * 64)
    wrapper = tmp_path / "python"
    run = f"PYTHONPATH={site} exec {PY}" if venv_python is None else \
        f"unset PYTHONPATH\nexec {venv_python}"
    wrapper.write_text(f"#!/bin/sh\nunset PYTHONDONTWRITEBYTECODE\n{run} \"$@\"\n")
    wrapper.chmod(0o755)
    return wrapper


def with_cache(tmp_path: Path, installed: Path) -> Path:
    """A wrapper of ``installed`` whose agents keep their cache in ``tmp_path/cache``."""
    wrapper = tmp_path / "python-with-cache"
    wrapper.write_text(f"#!/bin/sh\nXDG_CACHE_HOME={tmp_path / 'cache'} exec {installed} \"$@\"\n")
    wrapper.chmod(0o755)
    return wrapper


def imported_from(wrapper: Path) -> bool:
    """Whether an agent imported the copy (its compiled agent module was written)."""
    cache = wrapper.parent / "site" / "mslaunch" / "agent" / "__pycache__"
    return any(p.name.startswith("agent.") for p in cache.glob("*.pyc")) if cache.exists() \
        else False


def ssh_run(home: str, wrapper: Optional[Path], tag: str, *extra: str):
    env = clean_env(HOME=home, MSL_TEST_TAG=tag)
    python = ["--remote-python", str(wrapper)] if wrapper else []
    return subprocess.run(cmd("-v", *python, "-n", "2", "-H", "h1,h2", "-x", "MSL_TEST_TAG",
                              *extra, PY, "-c", SHOW), capture_output=True, timeout=90,
                          env=env)


def ranks_ran(out: bytes) -> bool:
    return sorted(out.decode().split("\n")[:-1]) == ["0 h1", "1 h2"]


# -- over SSH ------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["pythonpath", "venv", "pth", "finder"])
def test_ssh_agents_start_from_the_hosts_identical_mslaunch(sshbed, home, tmp_path, layout):
    wrapper = host_install(tmp_path, layout=layout)
    tag = new_tag()
    r = ssh_run(home, wrapper, tag)
    assert r.returncode == 0 and ranks_ran(r.stdout), r.stderr
    err = r.stderr.decode()
    root = (tmp_path / "site").resolve() / "mslaunch"
    for host in ("h1", "h2"):
        assert f"mslaunch: {host}: agent started from the host's mslaunch at {root} (" \
            in err, err
    assert imported_from(wrapper)
    # What the launcher sent before the job: the bootstrap alone.
    sent = [int(n) for n in re.findall(r"host's mslaunch at .* \((\d+) bytes sent\)", err)]
    assert len(sent) == 2 and all(n < 16 << 10 for n in sent), err
    assert wait_for(lambda: not tagged_pids(tag), 10)


def test_ssh_the_hosts_digest_is_kept_and_an_edit_is_still_seen(sshbed, home, tmp_path):
    """The host's digest of its copy is kept in the user's cache with the files'
    sizes and times: the next job reads it instead of hashing every source,
    and an edit that keeps a file's size is still seen (its time changed)."""
    installed = host_install(tmp_path)
    wrapper = with_cache(tmp_path, installed)
    r = ssh_run(home, wrapper, new_tag())
    assert r.returncode == 0 and ranks_ran(r.stdout), r.stderr
    kept = list((tmp_path / "cache" / "mslaunch").glob("host-digest-*"))
    assert len(kept) == 1, kept
    from mslaunch.backends.agents.bundle import _package_files, package_digest
    assert kept[0].read_text().split()[1] == package_digest(_package_files())
    stamp = kept[0].read_text().split()[0]
    module = tmp_path / "site" / "mslaunch" / "backends" / "agents" / "starters" / "slurm.py"
    original = module.read_bytes()
    module.write_bytes(original.replace(b"#: ", b"#:-", 1))      # the same size
    assert len(module.read_bytes()) == len(original)
    r = ssh_run(home, wrapper, new_tag())
    assert r.returncode == 0 and ranks_ran(r.stdout), r.stderr
    err = r.stderr.decode()
    assert err.count("agent package sent (") == 2 and "differs from the launcher's" in err, err
    assert kept[0].read_text().split()[0] != stamp
    module.write_bytes(original)
    r = ssh_run(home, wrapper, new_tag())
    assert r.returncode == 0 and ranks_ran(r.stdout), r.stderr
    assert r.stderr.decode().count("agent started from the host's mslaunch") == 2, r.stderr


def test_ssh_agents_run_the_hosts_copy_from_its_code_cache(sshbed, home, tmp_path):
    """An agent started from the host's copy writes the copy's code cache as it
    ends (mslaunch/machine/codecache.py), and the next agents run the agent's
    modules from it: with the copy's compiled files removed, none is written
    again, where an import of the agent module would write its own."""
    installed = host_install(tmp_path)
    wrapper = with_cache(tmp_path, installed)
    r = ssh_run(home, wrapper, new_tag())
    assert r.returncode == 0 and ranks_ran(r.stdout), r.stderr
    assert imported_from(installed)
    (made,) = (tmp_path / "cache" / "mslaunch").glob("code-*.bin")
    assert b"mslaunch.agent.agent" in made.read_bytes()
    for compiled in (tmp_path / "site" / "mslaunch").rglob("__pycache__"):
        shutil.rmtree(compiled)
    r = ssh_run(home, wrapper, new_tag())
    assert r.returncode == 0 and ranks_ran(r.stdout), r.stderr
    assert r.stderr.decode().count("agent started from the host's mslaunch") == 2, r.stderr
    assert not imported_from(installed)


def test_ssh_a_host_without_mslaunch_is_sent_the_package(sshbed, home, tmp_path):
    # A Python with nothing installed: a fresh virtual environment.
    subprocess.run([PY, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True)
    r = ssh_run(home, tmp_path / "venv" / "bin" / "python", new_tag())
    assert r.returncode == 0 and ranks_ran(r.stdout), r.stderr
    for host in ("h1", "h2"):
        assert f"mslaunch: {host}: agent package sent (" in r.stderr.decode()
    assert "no mslaunch on the host's Python path" in r.stderr.decode()


def test_ssh_a_host_with_another_version_is_sent_the_package(sshbed, home, tmp_path):
    wrapper = host_install(tmp_path, version="0.0.0.other")
    r = ssh_run(home, wrapper, new_tag())
    assert r.returncode == 0 and ranks_ran(r.stdout), r.stderr
    err = r.stderr.decode()
    assert err.count("agent package sent (") == 2, err
    assert "mslaunch 0.0.0.other" in err and "is not the launcher's" in err, err
    assert not imported_from(wrapper)


@pytest.mark.parametrize("how", ["broken", "bad_bytecode"])
def test_ssh_a_host_whose_copy_is_broken_is_sent_the_package(sshbed, home, tmp_path, how):
    wrapper = host_install(tmp_path, **{how: True})
    r = ssh_run(home, wrapper, new_tag())
    assert r.returncode == 0 and ranks_ran(r.stdout), r.stderr
    err = r.stderr.decode()
    assert err.count("agent package sent (") == 2, err
    assert ("differs from the launcher's" if how == "broken" else "does not import") in err
    # An agent that did not import had begun its host's guard: nothing of it is left.
    from remote import no_agents
    assert wait_for(lambda: no_agents(sshbed, ["h1", "h2"]), 15)


def _forks_of(pid: int) -> List[int]:
    """Children of ``pid`` running its own command line (an agent's watchdogs)."""
    mine = cmdline(pid)
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            kids = [int(k) for k in f.read().split()]
    except OSError:
        return []
    return [k for k in kids if mine and cmdline(k) == mine]


def test_ssh_an_agent_that_falls_back_to_the_sent_package_keeps_one_guard(sshbed, home,
                                                                            tmp_path):
    """The agent begins its host's guard before it imports the rest of itself;
    when the host's copy then does not import, the agent of the package sent
    keeps that guard. A second guard of the same marker made the first one,
    closed, end the job's ranks 30 s later (without a cgroup)."""
    wrapper = host_install(tmp_path, bad_bytecode=True)
    tag = new_tag()
    env = clean_env(HOME=home, MSL_TEST_TAG=tag, MSLAUNCH_CGROUP="0")
    p = subprocess.Popen(cmd("-v", "--remote-python", str(wrapper), "-n", "2", "-H", "h1,h2",
                             "-x", "MSL_TEST_TAG", "sleep", "60"), env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    def ranks() -> List[int]:
        found = []
        for pid in tagged_pids(tag):
            try:
                with open(f"/proc/{pid}/comm") as f:
                    if f.read().strip() == "sleep":
                        found.append(pid)
            except OSError:
                pass
        return found

    try:
        assert wait_for(lambda: len(ranks()) == 2, 60), p.poll()
        agents = set()
        for rank in ranks():
            with open(f"/proc/{rank}/stat", "rb") as f:
                agents.add(int(f.read().rsplit(b")", 1)[1].split()[1]))
        assert len(agents) == 2
        for agent in agents:
            assert len(_forks_of(agent)) == 1, _forks_of(agent)
    finally:
        p.terminate()
        out, err = p.communicate(timeout=60)
    assert err.decode().count("agent package sent (") == 2, err
    assert wait_for(lambda: not tagged_pids(tag), 15)


def test_ssh_the_switch_sends_the_package_to_every_host(sshbed, home, tmp_path):
    wrapper = host_install(tmp_path)
    env_off = clean_env(HOME=home, MSLAUNCH_HOST_PACKAGE="0")
    r = subprocess.run(cmd("-v", "--remote-python", str(wrapper), "-n", "2", "-H", "h1,h2",
                           PY, "-c", SHOW), capture_output=True, timeout=90, env=env_off)
    assert r.returncode == 0 and ranks_ran(r.stdout), r.stderr
    assert r.stderr.decode().count("not looked for (MSLAUNCH_HOST_PACKAGE=0)") == 2


# -- under srun ------------------------------------------------------------------


def srun_job(bed, tmp_path: Path, wrapper: Path):
    tag = new_tag()
    p = salloc(bed, tag, "-v", "--remote-python", str(wrapper), "-n", "2", PY, "-c", SHOW,
               per_node=1, cwd=tmp_path)
    rc, out, err = finish(p)
    assert rc == 0 and ranks_ran(out.encode()), err
    assert wait_for(lambda: not tagged_pids(tag), 10)
    return err


@pytest.mark.parametrize("layout", ["pythonpath", "venv"])
def test_srun_agents_start_from_the_hosts_identical_mslaunch(slurmbed, tmp_path, layout):
    wrapper = host_install(tmp_path, layout=layout)
    err = srun_job(slurmbed, tmp_path, wrapper)
    for host in ("h1", "h2"):
        assert f"mslaunch: {host}: agent started from the host's mslaunch at " \
               f"{(tmp_path / 'site').resolve() / 'mslaunch'} (" in err, err
    assert imported_from(wrapper)


def test_srun_a_host_with_another_version_is_sent_the_package(slurmbed, tmp_path):
    wrapper = host_install(tmp_path, version="0.0.0.other")
    err = srun_job(slurmbed, tmp_path, wrapper)
    assert err.count("agent package sent (") == 2 and "is not the launcher's" in err, err
    assert not imported_from(wrapper)


def test_srun_a_host_whose_copy_is_broken_is_sent_the_package(slurmbed, tmp_path):
    wrapper = host_install(tmp_path, broken=True)
    err = srun_job(slurmbed, tmp_path, wrapper)
    assert err.count("agent package sent (") == 2 and "differs from the launcher's" in err, err


def test_srun_timeline_with_two_v(slurmbed, tmp_path):
    """``-v -v`` prints the phases of bringing the nodes up, once, in order."""
    tag = new_tag()
    p = salloc(slurmbed, tag, "-v", "-v", "-n", "2", PY, "-c", SHOW, per_node=1, cwd=tmp_path)
    rc, out, err = finish(p)
    assert rc == 0 and ranks_ran(out.encode()), err
    assert err.count("mslaunch: timeline (ms since mslaunch started):") == 1, err
    # The step starts while the launcher builds its supervisor, before it waits for the agents.
    events = ["srun started", "starting the agents", "dialled back (first h", "agent answered: ",
              "agent said hello (first h", "ready (programs checked)", "ranks started (h"]
    lines = err.splitlines()
    at = [next(i for i, line in enumerate(lines) if event in line) for event in events]
    assert at == sorted(at), err
    assert wait_for(lambda: not tagged_pids(tag), 10)
