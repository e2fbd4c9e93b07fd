"""A Slurm allocation's end named when the answer comes late: asked at a stop
signal, scontrol still answering when the job is over is not the job's to end
(its guard empties the job's cgroup), and its answer is said before mslaunch
exits.

scontrol here is a stand-in (no slurmctld): it answers once the launcher has
left the job's cgroup, which it does only at the job's very end; the real
scontrol is asked in tests/system/slurm/test_slurm_spares.py.
"""

from __future__ import annotations

import signal
import subprocess

from helpers import all_gone, clean_env, cmd, kill_tagged, new_tag, tagged_pids, wait_for

STANDIN = """#!/bin/sh
while grep -q /mslaunch- /proc/$PPID/cgroup; do sleep 0.01; done
echo "JobId=7 JobName=x JobState=CANCELLED Reason=None Dependency=(null)"
"""


def test_an_answer_still_out_when_the_job_ends_is_said(tmp_path):
    (tmp_path / "scontrol").write_text(STANDIN.format(folder=tmp_path))
    (tmp_path / "scontrol").chmod(0o755)
    tag = new_tag()
    env = clean_env(MSL_TEST_TAG=tag, SLURM_JOB_ID="7", SLURM_JOB_NODELIST="localhost")
    env["PATH"] = f"{tmp_path}:{env['PATH']}"
    rank = f"cat /proc/self/cgroup > {tmp_path}/rank-cgroup; exec sleep 600"
    p = subprocess.Popen(cmd("-H", "localhost", "-n", "1", "sh", "-c", rank), env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert wait_for(lambda: any(_is_sleep(pid) for pid in tagged_pids(tag)), 60)
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
        kill_tagged(tag)
    text = err.decode(errors="replace")
    assert p.returncode == 143, text
    # (the job had a cgroup of its own, which the guard empties at its end)
    assert "/mslaunch-" in (tmp_path / "rank-cgroup").read_text()
    said = [line for line in text.splitlines() if line.startswith("mslaunch: Slurm ended")]
    assert said == ["mslaunch: Slurm ended the job's allocation (job 7: CANCELLED): it was "
                    "cancelled"], text
    assert all_gone(tag, 15)


def _is_sleep(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().split(b"\0")[0] == b"sleep"
    except OSError:
        return False
