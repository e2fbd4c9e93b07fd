"""msrun mode with real MindSpore (the CPU wheel): what MindSpore itself reads.

One small job on this machine: the scheduler and two workers do one
all-reduce over MindSpore's own CPU collectives.  It checks what depends on
MindSpore: ``--master_addr`` given as a host name (MindSpore's scheduler
accepts only an IP), ``MSRUN_CPU_LIST`` read back by MindSpore's own
bind-core code, and the thread count a worker finds at exec, before MindSpore
sets it (``OMP_NUM_THREADS``, as importing MindSpore sets it in msrun).  The
job across two nodes is in test_msrun_nodes.py.
"""

from __future__ import annotations

import json
import os
import subprocess

from helpers import PY, all_gone, clean_env, cmd, kill_tagged, new_tag, program, tagged_pids
from mindspore_runs import mindspore_flake, need_mindspore, rows

REAL = program("ms_real.py")


def venv_env(**extra: str) -> dict:
    """``python`` on PATH is the venv's own (as msrun wants an activated venv)."""
    env = clean_env(**extra)
    env["PATH"] = f"{os.path.dirname(PY)}:{env['PATH']}"
    return env


def test_a_real_mindspore_job_with_a_host_name_as_master_addr(tmp_path):
    need_mindspore()
    tag = new_tag()
    env = venv_env(MSL_TEST_TAG=tag)
    try:
        for attempt in range(2):
            port = 20000 + (os.getpid() + attempt) % 20000
            r = subprocess.run(cmd("--worker_num=2", "--local_worker_num=2",
                                   "--master_addr=localhost", f"--master_port={port}",
                                   f"--log_dir=L{attempt}", "--join=True",
                                   "--cluster_time_out=60", "--bind_core=True", REAL),
                               capture_output=True, env=env, cwd=tmp_path, timeout=110)
            logs = {p.name: p.read_text() for p in (tmp_path / f"L{attempt}").iterdir()}
            if r.returncode == 0 or not mindspore_flake(r.stdout.decode(), logs):
                break
            print(f"attempt {attempt}: MindSpore's own failure, not mslaunch's; again")
        assert r.returncode == 0, (r.stdout.decode()[-3000:], logs.get("scheduler.log", "")[-2000:])
        online = os.sysconf("SC_NPROCESSORS_ONLN")
        for i in range(2):
            (row,) = rows(logs[f"worker_{i}.log"])
            assert (row["rank"], row["size"], row["sum"]) == (i, 2, 3.0)
            got = row["at_exec"]
            assert got["MS_SCHED_HOST"] == "127.0.0.1"           # the name, resolved
            assert got["MASTER_PORT"] != str(port)
            assert got["OMP_NUM_THREADS"] == str(min(max(online // 2 // 4, 1), 16))
            assert row["isatty"] is False
            # MindSpore's own bind-core code reads msrun's list format
            assert row["cpu_strategy"] == {"main": json.loads(got["MSRUN_CPU_LIST"])}
    finally:
        kill_tagged(tag)
    assert all_gone(tag), tagged_pids(tag)


def test_mindspore_asking_for_mpirun_gets_msrun_dialect_hint(tmp_path):
    need_mindspore()
    script = tmp_path / "net.py"
    script.write_text("from mindspore.communication import init\ninit()\n")
    tag = new_tag()
    r = subprocess.run(cmd("-n", "2", PY, str(script)), capture_output=True,
                       env=clean_env(MSL_TEST_TAG=tag), cwd=tmp_path, timeout=110)
    assert r.returncode == 1, r.stderr
    lines = r.stderr.decode().splitlines()
    assert "without using 'mpirun'" in r.stderr.decode()
    assert lines[-1] == (f"mslaunch: MindSpore wants its own launcher's variables: run it in "
                         f"msrun's dialect, e.g. mslaunch --worker_num=2 --local_worker_num=2 "
                         f"{script}")
    assert all_gone(tag), tagged_pids(tag)
