"""Jobs where ``pidfd_open`` fails: a kernel before 5.3 answers ENOSYS, a container
whose system-call filter predates the call EPERM (``tests/support/nopidfd.py``
makes both with a seccomp filter on mslaunch and all it starts).  The ranks'
and mpirun's ends are then looked for every 50 ms instead of watched: the
job runs, says the real exit code of the rank that failed first, stops the
others and leaves nothing behind, as with pidfds.  It failed every job
before ("cannot watch rank 0: Function not implemented")."""

from __future__ import annotations

import errno
import os
import subprocess

import pytest

from requires import require
from helpers import PY, SUPPORT, all_gone, clean_env, cmd, kill_tagged, new_tag
from ompi import DEBIAN_MPIRUN

NOPIDFD = os.path.join(SUPPORT, "nopidfd.py")
ERRNOS = pytest.mark.parametrize("err", [errno.ENOSYS, errno.EPERM], ids=["ENOSYS", "EPERM"])


def _run(err: int, *args: str, env=None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([PY, NOPIDFD, str(err), *cmd(*args)], capture_output=True,
                          env=env or clean_env(), timeout=timeout)


@ERRNOS
def test_the_filter_refuses_pidfd_open(err):
    # (without it, every test here would pass on a kernel with pidfds)
    r = subprocess.run([PY, NOPIDFD, str(err), PY, "-c",
                        "import os\ntry:\n os.pidfd_open(os.getpid())\nexcept OSError as e:\n"
                        " print(e.errno)"], capture_output=True, timeout=60)
    assert r.stdout == f"{err}\n".encode(), r


@ERRNOS
def test_a_job_runs_and_says_its_exit_code(err, tmp_path):
    # Each rank exits once both have written: the first to fail stops the other,
    # which under load could otherwise not have written yet.
    r = _run(err, "-n", "2", "sh", "-c",
             'echo "out $OMPI_COMM_WORLD_RANK"; echo err >&2; : > "$D/$OMPI_COMM_WORLD_RANK"; '
             'until [ -e "$D/0" ] && [ -e "$D/1" ]; do sleep 0.01; done; exit 3',
             env=clean_env(D=str(tmp_path)))
    assert r.returncode == 3, r.stderr
    assert sorted(r.stdout.splitlines()) == [b"out 0", b"out 1"]
    assert r.stderr.startswith(b"err\nerr\nmslaunch: rank "), r.stderr
    assert b"cannot watch" not in r.stderr
    ok = _run(err, "-n", "3", "true")
    assert ok.returncode == 0 and not ok.stderr, ok.stderr


@ERRNOS
def test_the_first_failure_stops_the_others_and_leaves_nothing(err):
    tag = new_tag()
    try:
        r = _run(err, "-n", "3", "sh", "-c",
                 '[ "$OMPI_COMM_WORLD_RANK" = 2 ] && exit 5; exec sleep 600',
                 env=clean_env(MSL_TEST_TAG=tag))
        assert r.returncode == 5, r.stderr
        assert b"rank 2 " in r.stderr and b"exited with code 5" in r.stderr, r.stderr
        assert all_gone(tag)
    finally:
        kill_tagged(tag)


@ERRNOS
def test_a_killed_rank_and_the_timeout(err):
    r = _run(err, "-n", "2", "sh", "-c", 'kill -9 $$')
    assert r.returncode == 137, r.stderr
    tag = new_tag()
    try:
        r = _run(err, "--timeout", "1", "-n", "2", "sleep", "600",
                 env=clean_env(MSL_TEST_TAG=tag))
        assert r.returncode == 110, r.stderr
        assert all_gone(tag)
    finally:
        kill_tagged(tag)


@ERRNOS
def test_the_open_mpi_mode_s_mpirun_is_looked_after_without_a_pidfd(err, tmp_path):
    require(os.path.exists(DEBIAN_MPIRUN), "Debian's Open MPI (openmpi-bin)")
    env = clean_env(PATH="/usr/bin:/bin", XDG_CACHE_HOME=str(tmp_path / "cache"))
    for name in ("LD_LIBRARY_PATH", "OPAL_PREFIX", "MSLAUNCH_OMPI_MPIRUN"):
        env.pop(name, None)
    r = _run(err, "--mpi", "openmpi", "-n", "2", "sh", "-c",
             'echo "rank $OMPI_COMM_WORLD_RANK"; exit 4', env=env, timeout=120)
    assert sorted(r.stdout.splitlines()) == [b"rank 0", b"rank 1"], r.stderr
    assert r.returncode == 4, r.stderr
