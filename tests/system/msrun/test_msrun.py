"""msrun mode on one node: MindSpore's command lines, environment, logs, failures.

The golden environment is msrun 2.10's, as measured on a real msrun:
scheduler ``MS_ROLE=MS_SCHED MS_SCHED_HOST MS_SCHED_PORT MS_TOPO_TIMEOUT
MS_WORKER_NUM RANK_ID=0 RANK_SIZE``; worker i ``DEVICE_ID=i MS_NODE_ID=i
MS_ROLE=MS_WORKER MS_SCHED_HOST MS_SCHED_PORT MS_TOPO_TIMEOUT MS_WORKER_NUM
RANK_ID=i RANK_SIZE``.
"""

from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from requires import require
from helpers import (all_gone, clean_env, cmd, kill_tagged, new_tag, program, tagged_pids,
                     wait_for, wait_lines)

TASK = program("ms_task.py")
SCHED = ["MS_ROLE", "MS_SCHED_HOST", "MS_SCHED_PORT", "MS_TOPO_TIMEOUT", "MS_WORKER_NUM",
         "RANK_ID", "RANK_SIZE"]
WORKER = ["DEVICE_ID", "MS_NODE_ID", "MS_ROLE", "MS_SCHED_HOST", "MS_SCHED_PORT",
          "MS_TOPO_TIMEOUT", "MS_WORKER_NUM", "RANK_ID", "RANK_SIZE"]


def ms_env(bin_dir, tag: str = "", **extra: str):
    env = clean_env(MSL_TEST_TAG=tag or new_tag(), **extra)
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    return env


def msrun(args, env, cwd, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(cmd(*args), capture_output=True, env=env, cwd=cwd, timeout=timeout)


def logs(log_dir) -> dict:
    return {p.name: p.read_text() for p in sorted(log_dir.iterdir()) if p.suffix == ".log"}


def env_of(text: str) -> dict:
    return json.loads(text.splitlines()[0])


def test_the_tutorials_command_line_runs_unchanged(bin_dir, tmp_path):
    tag = new_tag()
    r = msrun(["--worker_num=2", "--local_worker_num=2", "--master_port=8118",
               "--log_dir=msrun_log", "--join=True", "--cluster_time_out=300", TASK],
              ms_env(bin_dir, tag), tmp_path)
    assert r.returncode == 0, r.stderr
    log_dir = tmp_path / "msrun_log"
    assert oct(log_dir.stat().st_mode & 0o777) == "0o700"
    got = logs(log_dir)
    assert sorted(got) == ["scheduler.log", "worker_0.log", "worker_1.log"]
    sched = env_of(got["scheduler.log"])
    assert {k: sched.get(k) for k in SCHED} == {
        "MS_ROLE": "MS_SCHED", "MS_SCHED_HOST": "127.0.0.1", "MS_SCHED_PORT": "8118",
        "MS_TOPO_TIMEOUT": "300", "MS_WORKER_NUM": "2", "RANK_ID": "0", "RANK_SIZE": "2"}
    assert sched["ms_env"] == sorted(SCHED)          # nothing else of msrun's kind
    assert sched["session_leader"] is False          # msrun's workers only get sessions
    for i in range(2):
        w = env_of(got[f"worker_{i}.log"])
        assert {k: w.get(k) for k in WORKER} == {
            "DEVICE_ID": str(i), "MS_NODE_ID": str(i), "MS_ROLE": "MS_WORKER",
            "MS_SCHED_HOST": "127.0.0.1", "MS_SCHED_PORT": "8118", "MS_TOPO_TIMEOUT": "300",
            "MS_WORKER_NUM": "2", "RANK_ID": str(i), "RANK_SIZE": "2"}
        assert w["ms_env"] == sorted(WORKER)
        # the other launchers' variables, where known
        assert (w["RANK"], w["WORLD_SIZE"], w["LOCAL_RANK"], w["LOCAL_WORLD_SIZE"],
                w["MASTER_ADDR"]) == (str(i), "2", str(i), "2", "127.0.0.1")
        # MASTER_PORT: a free port, the same for all, not the one MindSpore's scheduler holds
        assert w["MASTER_PORT"].isdigit() and w["MASTER_PORT"] != "8118"
        assert w["MASTER_PORT"] == env_of(got["worker_0.log"])["MASTER_PORT"]
        # what importing MindSpore gives msrun's children, computed as MindSpore does
        online = os.sysconf("SC_NPROCESSORS_ONLN")
        assert (w["OMP_NUM_THREADS"], w["HCCL_CONNECT_TIMEOUT"],
                w["PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION"]) == (
                    str(min(max(online // 8, 1), 16)), "600", "python")
        assert w["isatty"] == [False, False]          # msrun's processes write to files
        assert w["session_leader"] is True
        assert got[f"worker_{i}.log"].endswith(f"stderr of MS_WORKER {i}\n")
    out = r.stdout.decode().splitlines()
    # msrun's console lines: the log paths under --log_dir as typed
    assert out[:3] == [
        f"Start scheduler process, log file:msrun_log/scheduler.log. Execute command: "
        f"python {TASK}",
        f"Start worker process with rank id:0, log file:msrun_log/worker_0.log. "
        f"Environment variable [RANK_ID=0] is exported. Execute command: python {TASK}",
        f"Start worker process with rank id:1, log file:msrun_log/worker_1.log. "
        f"Environment variable [RANK_ID=1] is exported. Execute command: python {TASK}"]
    # ... and msrun's logger's line on stderr
    assert "Distributed job is spawned. Waiting all processes to exit..." in \
        r.stderr.decode().splitlines()
    # --join=True: the workers' output on the console, prefixed; not the scheduler's
    assert "[worker 1] stderr of MS_WORKER 1" in out
    assert not any(line.startswith("[scheduler]") or '"MS_SCHED"' in line for line in out)
    assert all_gone(tag), tagged_pids(tag)


def test_options_by_a_unique_start_of_their_names_as_msruns_argparse(bin_dir, tmp_path):
    r = msrun(["--worker_n=2", "--local_w=2", "--master_p=8118", f"--log={tmp_path / 'l'}",
               "--jo=True", "--cluster_t", "300", TASK], ms_env(bin_dir), tmp_path)
    assert r.returncode == 0, r.stderr
    got = logs(tmp_path / "l")
    assert sorted(got) == ["scheduler.log", "worker_0.log", "worker_1.log"]
    assert env_of(got["worker_1.log"])["MS_TOPO_TIMEOUT"] == "300"
    # a start of several is one line naming them (msrun: argparse's "ambiguous option")
    r = msrun(["--worker_num=2", "--master=1", TASK], ms_env(bin_dir), tmp_path)
    assert r.returncode == 2
    assert r.stderr.decode().splitlines() == [
        "mslaunch: error: ambiguous option '--master': it could be --master_addr, "
        "--master_port"]


def test_a_node_rank_on_a_line_of_one_node_is_ignored_as_msrun_does(bin_dir, tmp_path):
    r = msrun(["--worker_num=2", "--local_worker_num=2", "--node_rank=3",
               f"--log_dir={tmp_path / 'l'}", "--join=True", TASK], ms_env(bin_dir), tmp_path)
    assert r.returncode == 0, r.stderr
    assert "mslaunch: warning: All workers will be spawned on this node, so 'node_rank': " \
        "[3] will be ignored." in r.stderr.decode().splitlines()
    got = logs(tmp_path / "l")
    assert [env_of(got[f"worker_{i}.log"])["RANK_ID"] for i in range(2)] == ["0", "1"]


def test_logs_are_truncated_each_run_and_named_by_worker_log_name(bin_dir, tmp_path):
    env = ms_env(bin_dir)
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    (log_dir / "worker_0.log").write_text("old content\n" * 100)
    r = msrun(["--worker_num=2", "--local_worker_num=2", f"--log_dir={log_dir}", "--join=True",
               TASK], env, tmp_path)
    assert r.returncode == 0, r.stderr
    assert "old content" not in (log_dir / "worker_0.log").read_text()
    host = os.uname().nodename
    r = msrun(["--worker_num=2", "--local_worker_num=2", f"--log_dir={tmp_path / 'named'}",
               "--join=True", "--worker_log_name=w_{hostname}_{ip}", TASK], env, tmp_path)
    assert r.returncode == 0, r.stderr
    assert sorted(logs(tmp_path / "named")) == [
        "scheduler.log", f"w_{host}_127.0.0.1_0.log", f"w_{host}_127.0.0.1_1.log"]


def test_tail_worker_log_picks_the_workers_shown(bin_dir, tmp_path):
    r = msrun(["--worker_num=3", "--local_worker_num=3", f"--log_dir={tmp_path / 'l'}",
               "--join=True", "--tail_worker_log=1", TASK], ms_env(bin_dir), tmp_path)
    assert r.returncode == 0, r.stderr
    shown = [x for x in r.stdout.decode().splitlines() if x.startswith("[")]
    assert shown and all(x.startswith("[worker 1] ") for x in shown)


def test_python_is_prepended_unless_the_script_is_an_interpreter(bin_dir, tmp_path):
    env = ms_env(bin_dir)
    r = msrun(["--worker_num=1", "--local_worker_num=1", f"--log_dir={tmp_path / 'a'}",
               "--join=True", TASK, "--lr=0.1", "x y"], env, tmp_path)
    assert r.returncode == 0, r.stderr
    assert env_of((tmp_path / "a" / "worker_0.log").read_text())["argv"] == ["--lr=0.1", "x y"]
    r = msrun(["--worker_num=1", "--local_worker_num=1", f"--log_dir={tmp_path / 'b'}",
               "--join=True", "python", TASK, "--lr=0.2"], env, tmp_path)
    assert r.returncode == 0, r.stderr
    assert env_of((tmp_path / "b" / "worker_0.log").read_text())["argv"] == ["--lr=0.2"]


def test_a_failing_worker_ends_the_job_fast_with_its_code(bin_dir, tmp_path):
    tag = new_tag()
    env = ms_env(bin_dir, tag, FAIL_RANK="1", SLEEP="60")
    t0 = time.monotonic()
    r = msrun(["--worker_num=3", "--local_worker_num=3", f"--log_dir={tmp_path / 'l'}",
               "--join=True", TASK], env, tmp_path)
    assert r.returncode == 3, r.stderr
    assert time.monotonic() - t0 < 20          # msrun: 40 s, and always status 1
    err = r.stderr.decode()
    assert "mslaunch: worker 1 (pid" in err and "exited with code 3; terminated the job" in err
    assert "last lines of worker 1's log:" in err and "stderr of MS_WORKER 1" in err
    assert all_gone(tag), tagged_pids(tag)    # the scheduler too


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_stop_signals_end_every_process(bin_dir, tmp_path, sig):
    tag = new_tag()
    env = ms_env(bin_dir, tag, SLEEP="60")
    p = subprocess.Popen(cmd("--worker_num=2", "--local_worker_num=2",
                             f"--log_dir={tmp_path / 'l'}", "--join=True", TASK),
                         env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        # the scheduler and both workers run their task (each prints a line first)
        assert wait_for(lambda: all(wait_lines(str(tmp_path / "l" / name), 1, 0) for name in
                                    ("scheduler.log", "worker_0.log", "worker_1.log")), 20)
        p.send_signal(sig)
        _, err = p.communicate(timeout=30)
        assert p.returncode == 128 + sig, err
        assert all_gone(tag), tagged_pids(tag)
    finally:
        p.kill()
        p.wait()
        kill_tagged(tag)


def test_bind_core_true_splits_the_cpus_and_the_map_form_is_honoured(bin_dir, tmp_path):
    cpus = sorted(os.sched_getaffinity(0))
    env = ms_env(bin_dir)
    r = msrun(["--worker_num=2", "--local_worker_num=2", f"--log_dir={tmp_path / 'a'}",
               "--join=True", "--bind_core=True", TASK], env, tmp_path)
    assert r.returncode == 0, r.stderr
    got = logs(tmp_path / "a")
    half = max(len(cpus) // 2, 1)
    blocks = [cpus[:half], cpus[half:] or cpus[:1]]
    for i in range(2):
        w = env_of(got[f"worker_{i}.log"])
        assert w["affinity"] == blocks[i]
        # msrun's format, read back by MindSpore with ast.literal_eval
        assert w["MSRUN_CPU_LIST"] == str(blocks[i])
        assert ast.literal_eval(w["MSRUN_CPU_LIST"]) == blocks[i]
    assert env_of(got["scheduler.log"])["affinity"] == cpus        # not pinned
    first, last = cpus[0], cpus[-1]
    mapping = json.dumps({"device0": [str(last)], "device1": [str(first)],
                          "scheduler": [str(last)]})
    r = msrun(["--worker_num=2", "--local_worker_num=2", f"--log_dir={tmp_path / 'b'}",
               "--join=True", f"--bind_core={mapping}", TASK], env, tmp_path)
    assert r.returncode == 0, r.stderr
    got = logs(tmp_path / "b")
    assert env_of(got["worker_0.log"])["affinity"] == [last]
    assert env_of(got["worker_1.log"])["affinity"] == [first]
    assert env_of(got["scheduler.log"])["affinity"] == [last]
    # msrun leaves MSRUN_CPU_LIST unset for the map form
    assert not any("MSRUN_CPU_LIST" in env_of(text) for text in got.values())


def test_bind_numa_pins_to_the_cpus_of_numa_nodes():
    from mslaunch.cli.msrun import parse_msrun
    from mslaunch.core.errors import PlanError
    from mslaunch.msrun.plan import bindings
    numa = [(0, 1), (2, 3)]
    spec = parse_msrun(["--worker_num=4", "--local_worker_num=4", "--bind_numa=True", "t.py"])
    assert bindings(spec, [0, 1, 2, 3], True, numa) == (None, [(0, 1), (0, 1), (2, 3), (2, 3)])
    spec = parse_msrun(["--worker_num=2", "--local_worker_num=2",
                        '--bind_numa={"device0":["1"],"device1":["0-1"],"scheduler":["0"]}',
                        "t.py"])
    assert bindings(spec, [0, 1, 2, 3], True, numa) == ((0, 1), [(2, 3), (0, 1, 2, 3)])
    spec = parse_msrun(["--worker_num=1", "--local_worker_num=1",
                        '--bind_numa={"device0":["2"]}', "t.py"])
    with pytest.raises(PlanError, match="NUMA node 2, which this node does not have"):
        bindings(spec, [0, 1, 2, 3], True, numa)
    spec = parse_msrun(["--worker_num=1", "--local_worker_num=1", "--bind_core=True",
                        "--bind_numa=True", "t.py"])     # --bind_core decides
    assert bindings(spec, [0, 1, 2, 3], False, numa) == (None, [(0, 1, 2, 3)])


def test_bind_numa_on_this_machine_and_its_file_form(bin_dir, tmp_path):
    env = ms_env(bin_dir)
    node0 = open("/sys/devices/system/node/node0/cpulist").read().strip()
    r = msrun(["--worker_num=1", "--local_worker_num=1", f"--log_dir={tmp_path / 'a'}",
               "--join=True", "--bind_numa=True", TASK], env, tmp_path)
    assert r.returncode == 0, r.stderr
    from mslaunch.core.cputopo import parse_cpulist
    assert env_of(logs(tmp_path / "a")["worker_0.log"])["MSRUN_CPU_LIST"] == \
        str(list(parse_cpulist(node0)))
    # msrun's older file form: a map of NUMA nodes, named to the processes
    (tmp_path / "bind.json").write_text('{"device0": ["0"]}')
    r = msrun(["--worker_num=1", "--local_worker_num=1", f"--log_dir={tmp_path / 'b'}",
               "--join=True", "--bind_numa=bind.json", TASK], env, tmp_path)
    assert r.returncode == 0, r.stderr
    w = env_of(logs(tmp_path / "b")["worker_0.log"])
    assert w["MSRUN_BIND_FILE"] == str(tmp_path / "bind.json") and "MSRUN_CPU_LIST" not in w
    assert w["affinity"] == list(parse_cpulist(node0))
    r = msrun(["--worker_num=1", "--local_worker_num=1", f"--log_dir={tmp_path / 'c'}",
               "--join=True", '--bind_numa={"device0":["63"]}', TASK], env, tmp_path)
    assert r.returncode == 1 and r.stderr.count(b"\n") == 1, r.stderr
    assert b"--bind_numa: device0 names NUMA node 63" in r.stderr
    # the map form pins, and leaves MSRUN_CPU_LIST unset (as for --bind_core's)
    r = msrun(["--worker_num=1", "--local_worker_num=1", f"--log_dir={tmp_path / 'd'}",
               "--join=True", '--bind_numa={"device0":["0"]}', TASK], env, tmp_path)
    assert r.returncode == 0, r.stderr
    w = env_of(logs(tmp_path / "d")["worker_0.log"])
    assert w["affinity"] == list(parse_cpulist(node0)) and "MSRUN_CPU_LIST" not in w


#: A worker that says its CPUs, its memory policy (numactl's own words) and the bind
#: file's variables, as one JSON line.
POLICY = """import json, os, subprocess
show = subprocess.run(["numactl", "--show"], capture_output=True, text=True).stdout
print(json.dumps({"role": os.environ.get("MS_ROLE"), "cpus": sorted(os.sched_getaffinity(0)),
                  "policy": show.splitlines()[0], "file": os.environ.get("MSRUN_BIND_FILE"),
                  "hash": os.environ.get("MSRUN_BIND_FILE_HASH")}))
"""


def test_bind_numa_s_json_file_binds_cpus_and_memory_as_msrun_does(bin_dir, tmp_path):
    import hashlib
    require(os.path.exists("/usr/bin/numactl"), "numactl (apt install numactl)")
    (tmp_path / "w.py").write_text(POLICY)
    last = sorted(os.sched_getaffinity(0))[-1]
    text = json.dumps({"bind_config": {"bind_cpu_mode": "cpu", "bind_memory_mode": "numa"},
                       "bind_cpu": {"device0": {"main": "0"}, "device_1": {"main": str(last)},
                                    "scheduler": {"main": str(last)}},
                       "bind_memory": {"device0": 0, "scheduler": "0"}})
    (tmp_path / "b.json").write_text(text)
    r = msrun(["--worker_num=2", "--local_worker_num=2", f"--log_dir={tmp_path / 'l'}",
               "--join=True", "--bind_numa=b.json", "w.py"], ms_env(bin_dir), tmp_path)
    assert r.returncode == 0, r.stderr
    got = {name: json.loads(text) for name, text in logs(tmp_path / "l").items()}
    digest = hashlib.sha256(text.encode()).hexdigest()
    assert {(g["file"], g["hash"]) for g in got.values()} == {(str(tmp_path / "b.json"), digest)}
    assert (got["scheduler.log"]["cpus"], got["scheduler.log"]["policy"]) == ([last], "policy: bind")
    assert (got["worker_0.log"]["cpus"], got["worker_0.log"]["policy"]) == ([0], "policy: bind")
    assert (got["worker_1.log"]["cpus"], got["worker_1.log"]["policy"]) == \
        ([last], "policy: default")
    # msrun's console line names numactl where it binds memory (CPUs are bound without taskset)
    assert "Execute command: numactl --membind 0 python w.py" in r.stdout.decode()
    # bind_cpu_mode "numa": the CPUs of the node named
    node0 = open("/sys/devices/system/node/node0/cpulist").read().strip()
    (tmp_path / "n.json").write_text(json.dumps({"bind_config": {"bind_cpu_mode": "numa"},
                                                 "bind_cpu": {"device0": 0}}))
    r = msrun(["--worker_num=1", "--local_worker_num=1", f"--log_dir={tmp_path / 'n'}",
               "--join=True", "--bind_numa=n.json", "w.py"], ms_env(bin_dir), tmp_path)
    assert r.returncode == 0, r.stderr
    from mslaunch.core.cputopo import parse_cpulist
    w = json.loads(logs(tmp_path / "n")["worker_0.log"])
    assert (w["cpus"], w["policy"]) == (list(parse_cpulist(node0)), "policy: default")


@pytest.mark.parametrize("content, words, code", [
    (None, "--bind_numa: the JSON file 'b.json' does not exist", 2),
    ("[1]", "should hold a JSON object", 2),
    ('{"bind_config": {"bind_cpu_mode": "bogus"}}', "'bind_cpu_mode' only supports", 2),
    ('{"bind_config": {"bind_memory_mode": "cpu"}}', "'bind_memory_mode' only supports", 2),
    ('{"bind_config": {"bind_cpu_mode": "cpu"}, "bind_cpu": {"gpu0": {"main": "0"}}}',
     "invalid key 'gpu0'", 2),
    ('{"bind_config": {"bind_cpu_mode": "cpu"}, "bind_cpu": {"device0": {"main": "9999"}}}',
     "device0 names CPU 9999, which this node does not have", 1),
    ('{"bind_config": {"bind_memory_mode": "numa"}, "bind_memory": {"device0": 63}}',
     "device0 names NUMA node 63", 1),
])
def test_a_bad_bind_numa_file_is_one_line_and_starts_nothing(bin_dir, tmp_path, content,
                                                              words, code):
    tag = new_tag()
    if content is not None:
        (tmp_path / "b.json").write_text(content)
    r = msrun(["--worker_num=1", "--local_worker_num=1", f"--log_dir={tmp_path / 'l'}",
               "--join=True", "--bind_numa=b.json", TASK], ms_env(bin_dir, tag), tmp_path)
    assert r.returncode == code, r.stderr
    lines = r.stderr.decode().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mslaunch: error: --bind_numa: "), lines
    assert words in lines[0], lines
    assert tagged_pids(tag) == []


def test_memory_bound_without_numactl_is_one_line(bin_dir, tmp_path):
    tag = new_tag()
    (tmp_path / "b.json").write_text('{"bind_config": {"bind_memory_mode": "numa"}, '
                                     '"bind_memory": {"device0": 0}}')
    env = ms_env(bin_dir, tag)
    env["PATH"] = str(bin_dir)           # (python, and no numactl)
    r = msrun(["--worker_num=1", "--local_worker_num=1", f"--log_dir={tmp_path / 'l'}",
               "--join=True", "--bind_numa=b.json", TASK], env, tmp_path)
    assert r.returncode == 1, r.stderr
    assert r.stderr.decode().splitlines() == [
        f"mslaunch: error: --bind_numa: {tmp_path / 'b.json'} binds memory "
        f"(bind_memory_mode \"numa\"), through numactl, which is not on PATH (Debian and "
        f"Ubuntu: apt install numactl)"]
    assert tagged_pids(tag) == []


def _mindspores_concat():
    """MindSpore's own function that puts its CPU plugin first in LD_LIBRARY_PATH,
    read from its installed source (importing MindSpore takes seconds)."""
    import importlib.util
    import textwrap
    found = importlib.util.find_spec("mindspore")
    require(found is not None, "MindSpore's CPU wheel (pip install mindspore==2.10.0 'numpy<2')")
    path = os.path.join(list(found.submodule_search_locations)[0], "run_check",
                        "_check_version.py")
    text = open(path).read()
    start = text.index("    def _concat_variable(")
    end = text.index("\n\n", start)
    namespace = {"os": os}
    exec(textwrap.dedent(text[start:end]), namespace)
    return namespace["_concat_variable"], list(found.submodule_search_locations)[0]


@given(st.lists(st.sampled_from(["", "/a", "/b", "/usr/lib", "PLUGIN"]), max_size=5))
@settings(max_examples=100, deadline=None)
def test_ld_library_path_is_as_importing_mindspore_makes_it(parts):
    from mslaunch.msrun.plan import first_on_path
    concat, _ = _mindspores_concat()
    entry = "/x/mindspore/lib/plugin/cpu"
    value = ":".join(p.replace("PLUGIN", entry) for p in parts) if parts else None
    saved = os.environ.get("LD_LIBRARY_PATH")
    try:
        if value is None:
            os.environ.pop("LD_LIBRARY_PATH", None)
        else:
            os.environ["LD_LIBRARY_PATH"] = value
        concat("LD_LIBRARY_PATH", entry)
        assert first_on_path(value, entry) == os.environ["LD_LIBRARY_PATH"]
    finally:
        if saved is None:
            os.environ.pop("LD_LIBRARY_PATH", None)
        else:
            os.environ["LD_LIBRARY_PATH"] = saved


def test_workers_get_mindspores_plugin_first_in_ld_library_path(bin_dir, tmp_path):
    _, top = _mindspores_concat()
    plugin = os.path.join(top, "lib", "plugin/cpu")
    env = ms_env(bin_dir, LD_LIBRARY_PATH="/opt/x:" + plugin)
    r = msrun(["--worker_num=1", "--local_worker_num=1", f"--log_dir={tmp_path / 'a'}",
               "--join=True", TASK], env, tmp_path)
    assert r.returncode == 0, r.stderr
    for name, text in logs(tmp_path / "a").items():
        assert env_of(text)["LD_LIBRARY_PATH"] == f"{plugin}:/opt/x", name


def test_threads_the_user_set_are_kept(bin_dir, tmp_path):
    env = ms_env(bin_dir, OMP_NUM_THREADS="3", HCCL_CONNECT_TIMEOUT="77")
    r = msrun(["--worker_num=1", "--local_worker_num=1", f"--log_dir={tmp_path / 'a'}",
               "--join=True", TASK], env, tmp_path)
    assert r.returncode == 0, r.stderr
    got = logs(tmp_path / "a")
    for name in ("worker_0.log", "scheduler.log"):
        w = env_of(got[name])
        assert (w["OMP_NUM_THREADS"], w["HCCL_CONNECT_TIMEOUT"]) == ("3", "77")
    assert not (tmp_path / "c" / "worker_0.log").exists()


def test_sim_level_runs_workers_without_a_scheduler(bin_dir, tmp_path):
    r = msrun(["--worker_num=2", "--local_worker_num=2", f"--log_dir={tmp_path / 'l'}",
               "--join=True", "--sim_level=1", TASK], ms_env(bin_dir), tmp_path)
    assert r.returncode == 0, r.stderr
    got = logs(tmp_path / "l")
    assert sorted(got) == ["worker_0.log", "worker_1.log"]
    w = env_of(got["worker_0.log"])
    assert w["MS_SIMULATION_LEVEL"] == "1" and "MS_ROLE" not in w and "MS_SCHED_HOST" not in w
    assert w["MS_WORKER_NUM"] == "2"                 # msrun exports it in a dry run too
    r = msrun(["--worker_num=4", "--local_worker_num=4", f"--log_dir={tmp_path / 'one'}",
               "--join=True", "--sim_level=0", "--sim_rank_id=3", TASK], ms_env(bin_dir),
              tmp_path)
    assert r.returncode == 0, r.stderr
    # msrun dry-runs the one rank as the only local worker: worker_0.log, no node id
    got = logs(tmp_path / "one")
    assert sorted(got) == ["worker_0.log"]
    w = env_of(got["worker_0.log"])
    assert (w["RANK_ID"], w["MS_WORKER_NUM"], w["DEVICE_ID"]) == ("3", "4", "0")
    assert "MS_NODE_ID" not in w
    # as msrun: MS_SIMULATION_LEVEL in the environment is a dry run, RANK_ID its rank
    r = msrun(["--worker_num=4", "--local_worker_num=4", f"--log_dir={tmp_path / 'env'}",
               "--join=True", TASK], ms_env(bin_dir, MS_SIMULATION_LEVEL="1", RANK_ID="2"),
              tmp_path)
    assert r.returncode == 0, r.stderr
    got = logs(tmp_path / "env")
    assert sorted(got) == ["worker_0.log"]
    w = env_of(got["worker_0.log"])
    assert (w["RANK_ID"], w["MS_SIMULATION_LEVEL"]) == ("2", "1") and "MS_ROLE" not in w


@pytest.mark.parametrize("args, words", [
    (["--worker_num=2", "--local_worker_num=3"], "--local_worker_num=3 is more than"),
    (["--master_port=70000"], "--master_port=70000: must be between 1 and 65535"),
    (["--worker_num=abc"], "--worker_num=abc: expected a whole number"),
    (["--bind_core={\"device0\": [\"0-\"]}"], "--bind_core"),
    (["--bind_core={not json"], "--bind_core: expected True, False or a JSON map"),
    (["--worker_num=4", "--local_worker_num=2", "--node_rank=2"], "--node_rank=2"),
    (["--join=maybe"], "--join=maybe: expected True or False"),
    (["--worker_num=2", "--local_worker_num=2"], "no task script given"),
])
def test_bad_command_lines_are_one_line_and_start_nothing(bin_dir, tmp_path, args, words):
    tag = new_tag()
    script = [] if words == "no task script given" else [TASK]
    r = msrun([f"--log_dir={tmp_path / 'l'}", "--join=True"] + args + script,
              ms_env(bin_dir, tag), tmp_path)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.decode().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mslaunch: error: ") and words in lines[0]
    assert not (tmp_path / "l").exists()
    assert tagged_pids(tag) == []


def test_recovery_starts_a_failed_worker_again(bin_dir, tmp_path):
    tag = new_tag()
    marks = tmp_path / "marks"
    marks.mkdir()
    env = ms_env(bin_dir, tag, MS_ENABLE_RECOVERY="1", MS_RECOVERY_PATH=str(tmp_path),
                 FAIL_RANK="1", FAIL_ONCE=str(marks), SLEEP="1")
    r = msrun(["--worker_num=2", "--local_worker_num=2", f"--log_dir={tmp_path / 'l'}",
               "--join=True", TASK], env, tmp_path)
    assert r.returncode == 0, r.stderr
    assert b"worker 1 exited with code 3; starting it again (1 of 3 restarts)" in r.stderr
    text = (tmp_path / "l" / "worker_1.log").read_text()
    first, marker, second = text.partition("mslaunch: restart 1 of 3 of worker 1 (the previous "
                                           "run exited with code 3)\n")
    assert marker and env_of(first)["RANK_ID"] == "1" and env_of(second)["RANK_ID"] == "1"
    assert env_of(second)["MS_NODE_ID"] == "1"
    assert all_gone(tag), tagged_pids(tag)


def test_recovery_has_a_limit(bin_dir, tmp_path):
    env = ms_env(bin_dir, MS_ENABLE_RECOVERY="1", FAIL_RANK="0", FAIL_CODE="5",
                 FAIL_AFTER="0", SLEEP="30")
    r = msrun(["--worker_num=2", "--local_worker_num=2", f"--log_dir={tmp_path / 'l'}",
               "--join=True", "--max_restarts=2", TASK], env, tmp_path)
    assert r.returncode == 5, r.stderr
    err = r.stderr.decode()
    assert err.count("starting it again") == 2
    assert "worker 0 (pid" in err and "after 2 restart(s) (the limit, --max_restarts)" in err


def test_join_false_returns_at_once_and_a_detached_supervisor_keeps_the_job(bin_dir,
                                                                           tmp_path):
    tag = new_tag()
    log_dir = tmp_path / "l"
    env = ms_env(bin_dir, tag, FAIL_RANK="1", FAIL_AFTER="2", SLEEP="60")
    t0 = time.monotonic()
    r = msrun(["--worker_num=2", "--local_worker_num=2", f"--log_dir={log_dir}", TASK], env,
              tmp_path)
    assert r.returncode == 0, r.stderr
    assert time.monotonic() - t0 < 10
    out = r.stdout.decode()
    assert "Start worker process with rank id:1" in out and "runs detached" in out
    record = json.loads((log_dir / "mslaunch_job.json").read_text())
    assert record["state"] == "running" and {p["name"] for p in record["processes"]} == \
        {"scheduler", "worker 0", "worker 1"}
    # The job goes on after mslaunch returned, and still ends on its first failure.
    w = subprocess.run(cmd(f"--wait_job={log_dir}"), capture_output=True, env=env, timeout=60)
    assert w.returncode == 3, w.stderr
    record = json.loads((log_dir / "mslaunch_job.json").read_text())
    assert record["state"] == "ended" and record["exit_code"] == 3
    assert "worker 1 (pid" in (log_dir / "mslaunch.log").read_text()
    assert all_gone(tag), tagged_pids(tag)


def test_a_detached_job_can_be_stopped(bin_dir, tmp_path):
    tag = new_tag()
    log_dir = tmp_path / "l"
    env = ms_env(bin_dir, tag, SLEEP="60")
    r = msrun(["--worker_num=2", "--local_worker_num=2", f"--log_dir={log_dir}", TASK], env,
              tmp_path)
    assert r.returncode == 0, r.stderr
    s = subprocess.run(cmd(f"--stop_job={log_dir}"), capture_output=True, env=env, timeout=60)
    assert s.returncode == 143, s.stderr
    assert all_gone(tag), tagged_pids(tag)


def _record(log_dir, pid: int, started: float) -> None:
    log_dir.mkdir()
    (log_dir / "mslaunch_job.json").write_text(json.dumps(
        {"supervisor": pid, "state": "running", "exit_code": None, "log_dir": str(log_dir),
         "processes": [], "started": started}))


def test_stop_job_signals_nothing_but_the_jobs_own_supervisor(tmp_path):
    # --stop_job sends SIGTERM to the pid the record names: a record another user
    # wrote (in a directory of theirs), or one naming a process that is no
    # supervisor of this user's (a reused pid), must not end that process.
    victim = subprocess.Popen(["sleep", "60"])
    try:
        mine = tmp_path / "mine"
        _record(mine, victim.pid, time.time())
        s = subprocess.run(cmd(f"--stop_job={mine}"), capture_output=True, timeout=60)
        assert s.returncode == 1 and b"gone without a status" in s.stderr, s.stderr
        assert victim.poll() is None
        if os.geteuid() == 0:
            theirs = tmp_path / "theirs"
            _record(theirs, victim.pid, time.time())
            os.chown(theirs / "mslaunch_job.json", 65534, 65534)
            s = subprocess.run(cmd(f"--stop_job={theirs}"), capture_output=True, timeout=60)
            assert s.returncode == 1 and b"not a job record of this user's" in s.stderr, \
                s.stderr
            assert victim.poll() is None
        for pid in (1, 0, -1, True):
            _record(tmp_path / f"pid{pid}", pid, time.time())       # type: ignore[arg-type]
            s = subprocess.run(cmd(f"--stop_job={tmp_path / f'pid{pid}'}"),
                               capture_output=True, timeout=60)
            assert s.returncode == 1 and b"not a job record" in s.stderr, s.stderr
    finally:
        victim.kill()
        victim.wait()


def test_a_log_dir_every_user_may_write_into_is_refused(bin_dir, tmp_path):
    # Anyone could put links there under the logs' names, and have the job write
    # (as its user) wherever they point.
    require(os.geteuid() == 0, "root, to give a directory to another user")
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chown(shared, 65534, 65534)
    shared.chmod(0o777)
    tmp_path.chmod(0o755)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    os.symlink(victim, shared / "worker_0.log")
    r = msrun(["--worker_num=1", "--local_worker_num=1", f"--log_dir={shared}", "--join=True",
               TASK], ms_env(bin_dir), tmp_path)
    assert r.returncode == 1, r.stderr
    assert r.stderr.decode().count("\n") == 1 and "writable by every user" in \
        r.stderr.decode(), r.stderr
    assert victim.read_text() == "precious"


def test_a_log_file_that_is_a_link_is_not_followed(bin_dir, tmp_path):
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    os.symlink(victim, log_dir / "worker_0.log")
    r = msrun(["--worker_num=1", "--local_worker_num=1", f"--log_dir={log_dir}", "--join=True",
               TASK], ms_env(bin_dir), tmp_path)
    assert r.returncode != 0 and "a symbolic link: not followed" in r.stderr.decode(), r.stderr
    assert victim.read_text() == "precious"


@pytest.mark.parametrize("args", [["--help", "all"], ["--worker_num=2", "-h"]])
def test_help_shows_every_msrun_option(args):
    r = subprocess.run(cmd(*args), capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    if args[0] == "--help":
        assert "mpirun" in r.stdout and "-H, --host" in r.stdout
    assert "msrun dialect" in r.stdout and "--local_worker_num" in r.stdout
    from mslaunch.cli.common import MSRUN_EXTRAS, MSRUN_OPTIONS
    for name in MSRUN_OPTIONS + MSRUN_EXTRAS:
        assert f"--{name}" in r.stdout, name


@pytest.mark.parametrize("dialect, flag, value, tty", [
    ("msrun", False, None, False), ("msrun", False, "1", True), ("msrun", False, "0", False),
    ("msrun", True, "1", False),
    ("mpirun", False, None, True), ("mpirun", False, "0", False), ("mpirun", True, "1", False),
])
def test_pty_or_pipes_by_one_rule_in_both_dialects(bin_dir, tmp_path, dialect, flag, value,
                                                   tty):
    """msrun's processes write to files (no terminal); mpirun's get a pty. --no-pty
    and MSLAUNCH_PTY then decide the same way in either dialect."""
    extra = {"MSLAUNCH_PTY": value} if value is not None else {}
    env = ms_env(bin_dir, **extra)
    if value is None:
        env.pop("MSLAUNCH_PTY", None)
    no_pty = ["--no-pty"] if flag else []
    if dialect == "msrun":
        r = msrun(["--worker_num=1", "--local_worker_num=1", f"--log_dir={tmp_path / 'l'}",
                   "--join=True", *no_pty, TASK], env, tmp_path)
        assert r.returncode == 0, r.stderr
        seen = env_of(logs(tmp_path / "l")["worker_0.log"])["isatty"][0]
    else:
        r = msrun(["-n", "1", *no_pty, "python", "-c",
                   "import sys; print(sys.stdout.isatty())"], env, tmp_path)
        assert r.returncode == 0, r.stderr
        seen = r.stdout.decode().strip() == "True"
    assert seen is tty


def test_pty_wanted_is_the_one_rule():
    from mslaunch.core.switches import pty_wanted
    for default in (True, False):
        assert pty_wanted({}, no_pty=False, default=default) is default
        assert pty_wanted({"MSLAUNCH_PTY": ""}, no_pty=False, default=default) is default
        assert pty_wanted({"MSLAUNCH_PTY": "yes"}, no_pty=False, default=default) is True
        assert pty_wanted({"MSLAUNCH_PTY": "off"}, no_pty=False, default=default) is False
        assert pty_wanted({"MSLAUNCH_PTY": "1"}, no_pty=True, default=default) is False


def test_the_hint_for_mindspore_scripts_fits_the_job():
    from mslaunch.run.report import msrun_hint
    assert msrun_hint(["vm", "vm"], ["python", "net.py", "--lr", "0.1"]).endswith(
        "e.g. mslaunch --worker_num=2 --local_worker_num=2 net.py --lr 0.1")
    # several hosts: per node, with the master and each node's rank; words quoted
    assert msrun_hint(["a", "a", "b", "b"], ["/usr/bin/python3", "my net.py"]).endswith(
        "e.g. mslaunch --worker_num=4 --local_worker_num=2 'my net.py' on each of the 2 nodes, "
        "with --master_addr=a and --node_rank=0..1")
    # uneven: each node its own count
    assert msrun_hint(["a", "a", "a", "b"], ["python", "net.py"]).endswith(
        "--worker_num=4 --local_worker_num=N net.py on each of the 2 nodes, with "
        "--master_addr=a and --node_rank=0..1 (N: 3 on a, 1 on b)")


def _singleton_segments(text: str):
    pids = [int(w) for line in text.splitlines() if line.startswith("pid ")
            for w in line.split()[1:2]]
    return pids, [p for p in pids if os.path.exists(f"/dev/shm/mpich_shm_{p:x}_0")]


@pytest.mark.parametrize("dialect", ["msrun", "mpi-none"])
def test_killed_mpich_singletons_leave_no_segment(dialect, bin_dir, tmp_path, mpich):
    """Each process is a one-rank MPICH job, its segment named after its pid: the
    ones the job stops (killed, they cannot remove it) leave nothing in /dev/shm."""
    from helpers import PY
    tag = new_tag()
    env = ms_env(bin_dir, tag)
    prog = program("singleton_fails.py")
    if dialect == "msrun":
        args = ["--worker_num=3", "--local_worker_num=3", f"--log_dir={tmp_path / 'l'}",
                "--join=True", PY, prog]
    else:
        args = ["--mpi", "none", "-n", "3", PY, prog]
    try:
        r = msrun(args, env, tmp_path)
    finally:
        kill_tagged(tag)
    assert r.returncode == 3, r.stderr
    text = r.stdout.decode() if dialect != "msrun" else "".join(logs(tmp_path / "l").values())
    pids, left = _singleton_segments(text)
    assert len(pids) == (4 if dialect == "msrun" else 3), text     # msrun: the scheduler too
    assert left == [], left
