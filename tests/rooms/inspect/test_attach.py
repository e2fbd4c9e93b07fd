"""mslaunch-stacks and mslaunch-top without a job named, when several jobs of the
user run: the one started from the caller's terminal or session, said on stderr
with how to name another; none of them, one line that lists them."""

from __future__ import annotations

import json
import os
import subprocess

from helpers import PY, REPO, clean_env, kill_tagged, new_tag, start, wait_for

STACKS = os.path.join(REPO, "scripts", "mslaunch-stacks")
TOP = os.path.join(REPO, "scripts", "mslaunch-top")

#: Run in a session of its own: job A from this session, then mslaunch-stacks
#: without a job (or the tool and options given after the tag), from the same
#: session; prints A's pid, the tool's status and its output as JSON.
CALLER = r"""
import json, os, subprocess, sys, time
py, stacks, tag, *tool = sys.argv[1:]
job = subprocess.Popen([py, "-m", "mslaunch", "-n", "1", "-x", "MSL_TEST_TAG", "sleep", "300"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
try:
    deadline = time.monotonic() + 60
    while subprocess.run([py, stacks, str(job.pid), "--json"], capture_output=True).returncode:
        if time.monotonic() > deadline or job.poll() is not None:
            sys.exit("job A never answered")
        time.sleep(0.1)
    r = subprocess.run([py, *(tool or [stacks, "--json"])], capture_output=True)
    print(json.dumps({"pid": job.pid, "rc": r.returncode, "out": r.stdout.decode(),
                      "err": r.stderr.decode()}))
finally:
    job.kill()
    job.wait()
"""


def _answering_job(env, **kw):
    """A one-rank job of this test's, once it answers mslaunch-stacks."""
    job = start("-n", "1", "-x", "MSL_TEST_TAG", "sleep", "300", env=env, **kw)
    if not wait_for(lambda: subprocess.run([PY, STACKS, str(job.pid), "--json"],
                                           capture_output=True, env=env).returncode == 0,
                    timeout=60):
        job.kill()
        job.wait()
        raise AssertionError("the job never answered")
    return job


def test_the_caller_s_session_names_its_job(tmp_path):
    tag = new_tag()
    env = clean_env(MSL_TEST_TAG=tag)
    other = _answering_job(env)
    try:
        done = subprocess.run([PY, "-c", CALLER, PY, STACKS, tag], capture_output=True,
                              env=env, timeout=120, start_new_session=True)
        assert done.returncode == 0, done.stderr
        got = json.loads(done.stdout)
        assert got["rc"] == 0, got["err"]
        assert f"this session's is launcher {got['pid']} (" in got["err"], got["err"]
        assert "name another by its launcher pid: " in got["err"]
        assert str(other.pid) in got["err"].split("name another by its launcher pid: ")[1]
        assert json.loads(got["out"])["ranks"]
        # from a session of neither of two jobs: the jobs are listed, none chosen
        third = _answering_job(env, start_new_session=True)
        try:
            alone = subprocess.run([PY, STACKS], capture_output=True, env=env, timeout=60,
                                   start_new_session=True)
        finally:
            third.kill()
            third.wait()
        assert alone.returncode != 0
        said = alone.stderr.decode()
        assert "none of this terminal or session; name one by its launcher pid" in said, said
        assert str(other.pid) in said and str(third.pid) in said
    finally:
        other.kill()
        other.wait()
        kill_tagged(tag)


def test_mslaunch_top_takes_the_caller_s_job_too(tmp_path):
    tag = new_tag()
    env = clean_env(MSL_TEST_TAG=tag)
    other = _answering_job(env)
    try:
        done = subprocess.run([PY, "-c", CALLER, PY, STACKS, tag, TOP, "--once"],
                              capture_output=True, env=env, timeout=120,
                              start_new_session=True)
        assert done.returncode == 0, done.stderr
        got = json.loads(done.stdout)
        assert got["rc"] == 0, got["err"]
        assert f"this session's is launcher {got['pid']} (" in got["err"], got["err"]
        assert f"(launcher pid {got['pid']})" in got["out"], got["out"]
    finally:
        other.kill()
        other.wait()
        kill_tagged(tag)
