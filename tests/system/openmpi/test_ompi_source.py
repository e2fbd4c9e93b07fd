"""An Open MPI 4.1.4 built from source, as the MindSpore tutorials build it, under mslaunch.

Such a build brings no ``libpmix.so``: it embeds PMIx 3.2.3 in its
``lib/openmpi/mca_pmix_pmix3x.so`` component.  Its ranks are served by the
system's ``libpmix2`` where there is one, else by the PMIx inside that very
component (mslaunch.mpi.pmix.where.built_in), found through the build's ``mpirun``
on ``PATH`` or its ``lib`` on ``LD_LIBRARY_PATH``.  The build is made by
``scripts/build-openmpi4.sh`` (the README's test command runs it; about 8
minutes on 2 cores, once per machine), and a C program is compiled with its
``mpicc``.
"""

from __future__ import annotations

import os
import subprocess

import pytest
from requires import require
from helpers import clean_env, kill_tagged, new_tag, program, run, wait_for

from mslaunch.mpi.pmix.where import EMBEDDED, candidates

PREFIX = os.environ.get("MSLAUNCH_TEST_OMPI4_SOURCE") or os.path.join(
    os.environ.get("MSLAUNCH_TEST_CACHE") or os.path.expanduser("~/.cache/mslaunch-tests"),
    "openmpi-4.1.4")


# (the first test may wait for scripts/test.sh's build, which runs beside the suite)
pytestmark = pytest.mark.timeout(3600)


def _built_beside() -> None:
    """Wait for the build scripts/test.sh started in the background, when it did
    (``MSLAUNCH_TEST_OMPI4_BUILD_LOG``: its output; ``.rc`` beside it: its status,
    written when it ends); fail with its log's end when it failed."""
    log = os.environ.get("MSLAUNCH_TEST_OMPI4_BUILD_LOG")
    if not log or os.path.exists(os.path.join(PREFIX, ".built")):
        return
    assert wait_for(lambda: os.path.exists(log + ".rc"), 3000, interval=1), \
        f"scripts/build-openmpi4.sh still running after 50 minutes (its output: {log})"
    with open(log + ".rc") as f:
        status = f.read().strip()
    if status != "0":
        with open(log, errors="replace") as f:
            pytest.fail(f"scripts/build-openmpi4.sh failed ({status}):\n{f.read()[-3000:]}")


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    """(prefix, the compiled test program) of the source build."""
    _built_beside()
    mpicc = os.path.join(PREFIX, "bin", "mpicc")
    require(os.access(mpicc, os.X_OK), f"Open MPI 4.1.4 built from source in {PREFIX} "
                                       "(bash scripts/build-openmpi4.sh)")
    exe = str(tmp_path_factory.mktemp("ompi-source") / "ompi_c")
    subprocess.run([mpicc, program("ompi_c.c"), "-o", exe], check=True, timeout=120)
    return PREFIX, exe


def _job(build, *args, mode="show", **extra):
    prefix, exe = build
    tag = new_tag()
    env = clean_env(MSL_TEST_TAG=tag, **extra)
    env["PATH"] = os.path.join(prefix, "bin") + ":" + env.get("PATH", "")
    try:
        return run(*args, exe, mode, timeout=120, env=env)
    finally:
        kill_tagged(tag)


def _ranks(r, n):
    assert r.returncode == 0, r.stderr
    lines = sorted(x for x in r.stdout.decode().splitlines() if x.startswith("rank "))
    assert [x.split(" Open MPI")[0] for x in lines] == \
        [f"rank {i} of {n} {n * (n - 1) // 2}" for i in range(n)], r.stdout
    # the build's own library, not Debian's 4.1.4 ("package: Debian OpenMPI")
    assert all("v4.1.4" in x and "Debian" not in x for x in lines), lines
    return r.stdout.decode().splitlines()


def test_the_build_embeds_pmix_and_brings_no_libpmix(build):
    prefix, _ = build
    libs = os.listdir(os.path.join(prefix, "lib"))
    assert not [x for x in libs if x.startswith("libpmix")], libs
    assert os.path.exists(os.path.join(prefix, "lib", "openmpi", EMBEDDED))


def test_its_pmix_is_found_through_its_mpirun_or_its_library_path(build):
    prefix, _ = build
    plugin = os.path.join(prefix, "lib", "openmpi", EMBEDDED)
    assert candidates({"PATH": os.path.join(prefix, "bin") + ":/usr/bin"})[-1] == plugin
    assert candidates({"LD_LIBRARY_PATH": os.path.join(prefix, "lib")})[-1] == plugin
    assert plugin not in candidates({"PATH": "/usr/bin"})


@pytest.mark.parametrize("server", ["system", "embedded"])
def test_four_ranks_run_served_by_either_pmix(build, server):
    extra = {} if server == "system" else {
        "MSLAUNCH_PMIX_LIBRARY": os.path.join(build[0], "lib", "openmpi", EMBEDDED)}
    if server == "system":
        require(os.path.exists("/usr/lib/x86_64-linux-gnu/libpmix.so.2") or
                os.path.exists("/usr/lib/aarch64-linux-gnu/libpmix.so.2"),
                "the system's libpmix2 (apt-get install libpmix2)")
    r = _job(build, "-v", "-n", "4", **extra)
    _ranks(r, 4)
    if server == "embedded":
        assert b"PMIx server of 3.2.3" in r.stderr, r.stderr


def test_mpi_abort_ends_the_job_with_its_code(build):
    r = _job(build, "-n", "3", mode="abort")
    assert r.returncode == 7, r.stderr
    assert b"called MPI_Abort with exit code 7" in r.stderr, r.stderr


def test_without_any_pmix_the_job_is_refused_with_the_fix(build):
    r = _job(build, "-n", "2", MSLAUNCH_PMIX_LIBRARY="none")
    assert r.returncode == 1, r.stderr
    assert b"singleton" in r.stderr and b"libpmix2" in r.stderr, r.stderr


@pytest.mark.remote
def test_two_and_two_on_ssh_hosts(sshbed, build, tmp_path):
    from remote import renv, run_remote, settle
    prefix, exe = build
    home = sshbed.make_home(tmp_path / "home")
    tag = new_tag()
    try:
        r = run_remote(home, "-H", "h1:2,h2:2", "-n", "4", "-x", "MSL_TEST_TAG", exe, "show",
                       env=renv(home, MSL_TEST_TAG=tag), timeout=180)
        settle(tag, sshbed)
    finally:
        kill_tagged(tag)
    out = _ranks(r, 4)
    hosts = sorted(x.split()[1:] for x in out if x.startswith("host "))
    assert hosts == [["0", "h1"], ["1", "h1"], ["2", "h2"], ["3", "h2"]], out
