"""The suite's /dev/shm check (tests/support/shmcheck.py) fails a run that leaves a file
there, and passes one that removes what it made: a small suite run by pytest."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from helpers import SUPPORT, clean_env, new_tag

LEAK = '''
import os, subprocess, sys, time

def test_makes_a_file():
    path = "/dev/shm/{name}"
    # a child makes it and holds it {hold} s, as a rank would
    subprocess.run([sys.executable, "-c",
                    "import time; f = open(%r, 'wb'); f.write(b'x'); time.sleep({hold})" % path],
                   check=True)
    if {remove}:
        os.unlink(path)
'''


@pytest.mark.parametrize("remove", [False, True])
def test_a_file_left_in_dev_shm_fails_the_run(tmp_path, remove):
    # As the README's test command runs the suite, the small one gets a /dev/shm
    # of its own (the suite's is shared by its parallel workers), where a file
    # held for no time at all is caught; otherwise the sampler needs a few rounds.
    own = os.environ.get("MSL_TEST_OWN_SHM") == "1"
    name = f"mslaunch-test-{new_tag()}"
    (tmp_path / "test_leak.py").write_text(
        LEAK.format(name=name, hold=0 if own else 1.0, remove=remove))
    env = clean_env(PYTHONPATH=SUPPORT + os.pathsep + clean_env()["PYTHONPATH"])
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
            "-p", "shmcheck", str(tmp_path / "test_leak.py")]
    if own:                     # (the variable goes through clean_env)
        argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                'mount -t tmpfs tmpfs /dev/shm || exit 99; "$@"; rc=$?; '
                'echo "left:$(ls -A /dev/shm)"; exit $rc', "sh", *argv]
    r = subprocess.run(argv, capture_output=True, env=env, cwd=str(tmp_path), timeout=120)
    out = r.stdout.decode()
    try:
        if remove:
            assert r.returncode == 0, out
            assert "shmcheck" not in out
        else:
            assert r.returncode == 1, out
            assert "shmcheck: the suite's processes left 1 file(s) in /dev/shm" in out, out
            assert name in out and "test_makes_a_file" in out, out
            # removed by the check
            assert ("left:\n" in out) if own else not os.path.exists(f"/dev/shm/{name}")
    finally:
        if os.path.exists(f"/dev/shm/{name}"):
            os.unlink(f"/dev/shm/{name}")
