"""Failures that people and tools can read: every failed rank of a keep-going job,
the user's own frame in a Python rank's tail, and the JSON job report in both dialects."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from typing import Dict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import PY, REPO, clean_env, cmd, one_error_line, run, wait_for
from listeners import bad_hosts_config


# -- failures that people and tools can read -----------------------------------------

KEEP_GOING = ["--mca", "orte_abort_on_non_zero_status", "0"]
# ranks 1 and 2 exit with 3, 3 is killed, 5 exits with 4: in that order, each once
# mslaunch has collected the one before (its pid, noted in DIR, is gone); 0 and 4
# succeed.  python -c FATES DIR
FATES = ("import os, sys, time\nr = int(os.environ['RANK'])\nd = sys.argv[1]\n"
         "order = [1, 2, 3, 5]\n"
         "if r in order and r != 1:\n"
         "    before = os.path.join(d, str(order[order.index(r) - 1]))\n"
         "    while not os.path.exists(before) or os.path.exists(\n"
         "            '/proc/' + open(before).read()):\n"
         "        time.sleep(0.01)\n"
         "with open(os.path.join(d, f'{r}.new'), 'w') as f:\n    f.write(str(os.getpid()))\n"
         "os.replace(os.path.join(d, f'{r}.new'), os.path.join(d, str(r)))\n"
         "if r in (1, 2): sys.exit(3)\nif r == 3: os.kill(os.getpid(), 9)\n"
         "if r == 5: sys.exit(4)\n")


def test_keep_going_lists_every_failed_rank_with_its_host(tmp_path):
    r = run(*KEEP_GOING, "-n", "6", "--oversubscribe", PY, "-c", FATES, str(tmp_path))
    assert r.returncode == 3
    err = r.stderr.decode()
    host = os.uname().nodename
    assert "mslaunch: 4 of 6 rank(s) failed; first: rank " in err, err
    assert "mslaunch: the failed ranks:\n" in err, err
    assert f"    ranks 1-2 on {host} exited with code 3\n" in err, err
    assert f"    rank 3 on {host} was killed by signal 9 (SIGKILL)\n" in err, err
    assert f"    rank 5 on {host} exited with code 4" in err, err
    assert "rank 0 on" not in err and "rank 4 on" not in err


LIBRARY = """
def deep(n):
    if n == 0:
        raise ValueError("the library says no")
    return deep(n - 1)
"""

USER = """
import sys
sys.path.insert(0, sys.argv[1])
import biglib

def prepare():
    print("some output first", file=sys.stderr)

def train():
    return biglib.deep(12)   # the user's own line

prepare()
train()
"""


def test_the_tail_of_a_python_failure_keeps_the_users_own_frame(tmp_path):
    lib = tmp_path / "lib" / "python3.99" / "site-packages"
    lib.mkdir(parents=True)
    (lib / "biglib.py").write_text(LIBRARY)
    (tmp_path / "train.py").write_text(USER)
    # (the ranks' output in files only: the tail is not on the terminal above the summary)
    r = run("--output-filename", f"{tmp_path}/out:nocopy", "-n", "1", PY, "train.py",
            str(lib), cwd=str(tmp_path))
    assert r.returncode == 1
    err = r.stderr.decode()
    shown = err[err.index("mslaunch: last lines of rank 0"):].splitlines()[1:]
    assert shown[0] == "    Traceback (most recent call last):", err
    # the user's last frame and its line, the raising frame, the exception
    assert any('train.py", line 10, in train' in line for line in shown), err
    assert any("biglib.deep(12)   # the user's own line" in line for line in shown), err
    assert any("frames not shown" in line for line in shown), err
    assert any('biglib.py", line 4, in deep' in line for line in shown), err
    assert shown[-1] == "    ValueError: the library says no", err
    assert len(shown) <= 14, err


def test_a_failed_rank_s_stderr_right_above_the_summary_is_not_shown_again(tmp_path):
    r = run("-n", "2", PY, "-c", "import os, sys\n"
            "if os.environ['RANK'] == '1': raise ValueError('the one traceback')",
            cwd=str(tmp_path))
    assert r.returncode == 1
    err = r.stderr.decode()
    assert err.count("ValueError: the one traceback") == 1, err
    assert "last lines of" not in err and "mslaunch: rank 1 (pid" in err, err


def test_a_tail_written_to_another_file_than_the_summary_is_shown_under_it(tmp_path):
    # stdout and stderr are two pipes here: the traceback, merged into stdout, is not
    # above the summary on stderr
    r = run("-n", "1", "--merge-stderr-to-stdout", PY, "-c", "raise ValueError('merged')",
            cwd=str(tmp_path))
    assert r.returncode == 1
    assert b"ValueError: merged" in r.stdout
    err = r.stderr.decode()
    assert "last lines of rank 0's stdout+stderr:" in err and "ValueError: merged" in err, err


def test_shown_tail_in_short():
    from mslaunch.run.tails import shown_tail
    plain = "\n".join(f"line {i}" for i in range(30))
    assert shown_tail(plain) == [f"line {i}" for i in range(20, 30)]
    short = "Traceback (most recent call last):\n  File \"a.py\", line 1, in <module>\n" \
            "    f()\nKeyError: 'x'\n"
    assert shown_tail(short) == short.rstrip("\n").split("\n")
    frames = "".join(f'  File "/usr/lib/python3.11/site-packages/m.py", line {i}, in f\n'
                     f"    f()\n" for i in range(20))
    cut = frames + "RuntimeError: deep\n"          # its header and the user's frame cut off
    out = shown_tail(cut)
    assert out[0] == "Traceback (most recent call last):" and out[-1] == "RuntimeError: deep"
    assert out[1] == "  ... 19 frames not shown ..." and len(out) == 5
    # a rank on a pseudo-terminal: CR LF, and Python 3.13's colours
    coloured = ("Traceback (most recent call last):\r\n"
                '  File \x1b[35m"/home/u/net.py"\x1b[0m, line \x1b[35m3\x1b[0m, in '
                '\x1b[35m<module>\x1b[0m\r\n    main()\r\n' + frames.replace("\n", "\r\n")
                + "\x1b[1;35mRuntimeError\x1b[0m: \x1b[35mdeep\x1b[0m\r\n")
    out = shown_tail(coloured)
    assert out[1] == '  File "/home/u/net.py", line 3, in <module>' and out[2] == "    main()"
    assert out[-1] == "RuntimeError: deep" and "\x1b" not in "".join(out)


def test_shown_tail_keeps_the_first_cause_of_a_chained_traceback_and_is_printable():
    from mslaunch.run.tails import LINE_CHARS, shown_tail
    first = ("Traceback (most recent call last):\n"
             '  File "/home/u/net.py", line 8, in main\n    load()\n'
             '  File "/usr/lib/python3.11/json/decoder.py", line 353, in raw_decode\n'
             "    obj, end = self.scan_once(s, idx)\n"
             "json.decoder.JSONDecodeError: Expecting value: line 1 column 1 (char 0)\n\n")
    second = ("Traceback (most recent call last):\n"
              '  File "/home/u/net.py", line 14, in <module>\n    main()\n'
              '  File "/home/u/net.py", line 10, in main\n    fallback()\n'
              "TypeError: expected str, not int\n")
    for chained in ("During handling of the above exception, another exception occurred:",
                    "The above exception was the direct cause of the following exception:"):
        out = shown_tail(first + chained + "\n\n" + second)
        assert out == ["json.decoder.JSONDecodeError: Expecting value: line 1 column 1 (char 0)",
                       "", chained, ""] + second.rstrip("\n").split("\n"), out
    # A binary blob, a progress bar rewritten with CR, a line with no end: printable
    # lines of bounded length, a terminal's view of the bar.
    blob = bytes(range(256)).decode("utf-8", "replace") * 3
    bar = " 10%|#         |\r 50%|#####     |\r 90%|######### |\n"
    out = shown_tail(bar + "x" * 20000 + "\n" + blob)
    assert out[0] == " 90%|######### |" and out[1].endswith(f"... ({20000 - LINE_CHARS} more "
                                                             "characters)")
    assert all(line.replace("\t", " ").isprintable() and len(line) < LINE_CHARS + 40
               for line in out), out
    assert "\\x07" in "".join(out) and "\x1b" not in "".join(out)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([
    "Traceback (most recent call last):", '  File "/home/u/x.py", line 3, in f',
    '  File "/v/lib/python3.12/site-packages/t.py", line 9, in g', "    code()",
    "    ^^^^^^", "ValueError: v", "During handling of the above exception, another "
    "exception occurred:", "", "plain output", "  [Previous line repeated 5 more times]"]),
    max_size=60))
def test_shown_tail_never_fails_and_keeps_the_end(lines):
    from mslaunch.run.tails import TAIL_LINES, shown_tail
    text = "\n".join(lines)
    out = shown_tail(text)
    last = text.rstrip("\n").split("\n")[-1]
    assert out and out[-1] in (last, "    ...") or out[-1] == last
    assert len(out) <= TAIL_LINES + 12
    original = set(text.split("\n"))
    for line in out:
        assert line in original or line.startswith(("  ... ", "Traceback (")) \
            or line == "    ...", line


def _report(path) -> Dict:
    with open(path) as f:
        report = json.load(f)
    assert report["format"] == "mslaunch-job-report" and report["version"] == 1
    return report


def test_the_json_report_of_a_job_names_every_ranks_end(tmp_path):
    path = tmp_path / "job.json"
    r = run(*KEEP_GOING, "--report-json", str(path), "-n", "6", "--oversubscribe", PY, "-c",
            FATES, str(tmp_path))
    assert r.returncode == 3
    report = _report(path)
    host = os.uname().nodename
    assert report["status"] == "failed" and report["exit_code"] == 3
    first = report["first_failure"]
    assert report["message"].startswith(f"4 of 6 rank(s) failed; first: rank {first['rank']} ")
    assert first["rank"] == 1 and first["exit_code"] == 3
    ends = {r["rank"]: (r["exit_code"], r["signal"], r["signal_name"]) for r in report["ranks"]}
    assert ends == {0: (0, None, None), 1: (3, None, None), 2: (3, None, None),
                    3: (None, 9, "SIGKILL"), 4: (0, None, None), 5: (4, None, None)}
    for rank in report["ranks"]:
        assert rank["host"] == host and rank["pid"] > 0 and rank["name"] == f"rank {rank['rank']}"
        assert report["start"] <= rank["start"] <= rank["end"] <= report["end"]
    assert report["launcher"]["host"] == host


def test_the_json_report_of_a_success_a_timeout_and_a_job_that_never_started(tmp_path,
                                                                            listeners):
    path = tmp_path / "ok.json"
    r = run("--report-json", str(path), "-n", "2", "true")
    assert r.returncode == 0 and r.stderr == b""
    report = _report(path)
    assert report["status"] == "succeeded" and report["exit_code"] == 0
    assert report["first_failure"] is None and [x["exit_code"] for x in report["ranks"]] == [0, 0]
    r = run("--report-json", str(path), "--timeout", "1", "-n", "2", "sleep", "30")
    assert r.returncode == 110
    report = _report(path)
    assert report["status"] == "timed-out" and report["exit_code"] == 110
    assert report["message"] == "the job timed out (--timeout)"
    assert {x["signal_name"] for x in report["ranks"]} == {"SIGTERM"}
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(bad_hosts_config(listeners))
    r = subprocess.run(cmd("--report-json", str(path), "-H", "dropped", "-n", "1", "true"),
                       capture_output=True, timeout=60, env=clean_env(HOME=str(home)))
    assert r.returncode == 1
    report = _report(path)
    assert report["status"] == "not-started" and report["exit_code"] == 1
    assert report["ranks"] == [] and "dropped (connect: " in report["message"]


def test_a_report_that_could_not_be_written_is_refused_before_the_job_starts(tmp_path):
    marker = tmp_path / "ran"
    for argv in (["--report-json", str(tmp_path / "no" / "r.json"), "-n", "1"],
                 ["--worker_num=1", "--local_worker_num=1", "--join=True",
                  f"--report_json={tmp_path / 'no' / 'r.json'}"]):
        r = run(*argv, "touch", str(marker), cwd=str(tmp_path))
        assert r.returncode == 2 and not marker.exists()
        line = one_error_line(r.stderr)
        assert f"r.json: no directory {tmp_path / 'no'}" in line, line


def test_msrun_mode_reports_every_process_in_its_record_and_on_request(tmp_path, bin_dir):
    script = tmp_path / "net.py"
    script.write_text("import os, sys\nif os.environ.get('RANK_ID') == '1': sys.exit(7)\n")
    env = clean_env(PATH=f"{bin_dir}:{os.environ['PATH']}")
    r = subprocess.run(cmd("--worker_num=2", "--local_worker_num=2", "--join=True",
                           "--report_json=job.json", "net.py"), cwd=str(tmp_path), env=env,
                       capture_output=True, timeout=60)
    assert r.returncode == 7, r.stderr
    report = _report(tmp_path / "job.json")
    assert report["status"] == "failed" and report["exit_code"] == 7
    names = {x["name"]: x for x in report["ranks"]}
    assert set(names) == {"scheduler", "worker 0", "worker 1"}
    assert names["worker 1"]["exit_code"] == 7 and report["first_failure"]["name"] == "worker 1"
    # --join=False: the record it always keeps has the same fields, its own unchanged
    logs = tmp_path / "logs"
    r = subprocess.run(cmd("--worker_num=2", "--local_worker_num=2", f"--log_dir={logs}",
                           "net.py"), cwd=str(tmp_path), env=env, capture_output=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    r = subprocess.run(cmd(f"--wait_job={logs}"), env=env, capture_output=True, timeout=60)
    assert r.returncode == 7
    record = _report(logs / "mslaunch_job.json")
    assert record["state"] == "ended" and record["exit_code"] == 7
    assert isinstance(record["supervisor"], int) and record["log_dir"] == str(logs)
    processes = {p["name"]: p for p in record["processes"]}
    assert set(processes) == {"scheduler", "worker 0", "worker 1"}
    assert processes["worker 1"]["exit_code"] == 7 and processes["worker 1"]["pid"] > 0
    assert processes["worker 1"]["host"] == os.uname().nodename


def test_the_job_report_page_names_every_field_of_the_report():
    from mslaunch.run import jobreport
    from mslaunch.core.spec import JobResult, RankResult
    with open(os.path.join(REPO, "docs", "reference", "job-report.md")) as f:
        text = f.read()
    rank = RankResult(rank=0, host="h", pid=1, returncode=3)
    report = jobreport.build(JobResult(exit_code=3, ranks=(rank,), root_cause=rank), 0.0)
    assert f'"version": {jobreport.VERSION}' in text and jobreport.FORMAT in text
    for key in [*report, *report["ranks"][0], *report["launcher"]]:
        assert f"`{key}`" in text, key
    for status in ("succeeded", "failed", "timed-out", "stopped", "output-failed",
                   "stopped-by-peer", "not-started"):
        assert f'`"{status}"`' in text, status


def test_the_json_report_of_a_stopped_job(tmp_path):
    import signal
    path = tmp_path / "job.json"
    p = subprocess.Popen(cmd("--report-json", str(path), "-n", "2", "sh", "-c",
                             f"touch {tmp_path}/up$RANK; exec sleep 30"),
                         env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert wait_for(lambda: all((tmp_path / f"up{r}").exists() for r in (0, 1))
                        or p.poll() is not None, 30, 0.02)
        assert p.poll() is None, p.communicate()
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 128 + signal.SIGTERM
    report = _report(path)
    assert report["status"] == "stopped" and report["exit_code"] == 143
    assert report["message"] == "stopped by SIGTERM"
    assert [x["signal_name"] for x in report["ranks"]] == ["SIGTERM", "SIGTERM"]


def test_the_json_report_names_the_remote_host_of_each_rank(sshbed, tmp_path):
    home = sshbed.make_home(tmp_path / "home")
    path = tmp_path / "job.json"
    r = subprocess.run(cmd("--report-json", str(path), "-H", "h1,h2", "-n", "2", "sh", "-c",
                           "echo $$; exit $RANK"), capture_output=True, timeout=90,
                       env=clean_env(HOME=home))
    assert r.returncode == 1, r.stderr
    report = _report(path)
    pids = sorted(int(w) for w in r.stdout.split())
    ranks = {x["rank"]: x for x in report["ranks"]}
    assert ranks[0]["host"] == "h1" and ranks[1]["host"] == "h2"
    assert (ranks[0]["exit_code"], ranks[1]["exit_code"]) == (0, 1)
    assert sorted(x["pid"] for x in report["ranks"]) == pids
    assert report["first_failure"]["host"] == "h2"


def test_a_report_to_a_device_needs_no_writable_directory(monkeypatch):
    # Not root (whose os.access says yes to everything): /dev is not the user's to
    # write, /dev/stdout is.
    from mslaunch.core.errors import UsageError
    from mslaunch.run.jobreport import check_writable
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: p != "/dev" and real(p, mode))
    check_writable("/dev/stdout")
    check_writable("/dev/null")
    with pytest.raises(UsageError, match="/dev/report.json: cannot be written here"):
        check_writable("/dev/report.json")


def test_a_report_into_a_file_of_the_kernels_is_refused_before_the_job(tmp_path):
    # Even for root, whom os.access lets write /proc/version: the job does not run
    # only to fail its report at the end.
    from mslaunch.core.errors import UsageError
    from mslaunch.run.jobreport import check_writable
    for path in ("/proc/version", "/proc/self/status", "/sys/kernel/mm/transparent_hugepage/enabled"):
        if os.path.isfile(path):
            with pytest.raises(UsageError, match="a file of the kernel's"):
                check_writable(path)
    link = tmp_path / "r.json"
    link.symlink_to("/proc/version")
    with pytest.raises(UsageError, match="a file of the kernel's"):
        check_writable(str(link))
    out = tmp_path / "out.json"
    with open(out, "w") as f:        # a descriptor's file is the file's, not the kernel's
        check_writable(f"/proc/self/fd/{f.fileno()}")
    r = run("--report-json", "/proc/version", "-n", "1", "true")
    assert r.returncode == 2 and r.stderr == (
        b"mslaunch: error: --report-json /proc/version: a file of the kernel's, not one a "
        b"report can be written to\n"), r.stderr


def test_a_report_into_a_fifo_or_through_a_symlink_is_written_there_not_replaced(tmp_path):
    # A FIFO (a tool reading the report as it comes, like `--report-json >(jq .)`),
    # /dev/stdout or a device is written in place: replacing it with a file would
    # leave the reader waiting, or, as root, replace /dev/stdout itself.
    fifo = tmp_path / "report.fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        r = run("--report-json", str(fifo), "-n", "1", "true")
        assert r.returncode == 0 and r.stderr == b"", r.stderr
        assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
        data = os.read(reader, 1 << 16)
    finally:
        os.close(reader)
    assert json.loads(data)["status"] == "succeeded"
    # A symlink stays one: its file gets the report.
    target = tmp_path / "reports" / "last.json"
    target.parent.mkdir()
    link = tmp_path / "job.json"
    link.symlink_to(target)
    r = run("--report-json", str(link), "-n", "1", "true")
    assert r.returncode == 0 and link.is_symlink() and _report(target)["exit_code"] == 0
    # A descriptor (/dev/stdout, /dev/fd/N) is written in place: a file behind it
    # keeps the ranks' output and gets the report after it.
    out = tmp_path / "out.txt"
    with open(out, "wb") as f:
        r = subprocess.run(cmd("--report-json", "/dev/fd/1", "-n", "1", "echo", "hi"),
                           stdout=f, stderr=subprocess.PIPE, timeout=60, env=clean_env())
    assert r.returncode == 0 and r.stderr == b"", r.stderr
    head, _, rest = out.read_bytes().partition(b"\n")
    assert head == b"hi" and json.loads(rest)["status"] == "succeeded"
    # Nobody reads the FIFO: one error line, no hang, and the job's status kept (1 for
    # a job that succeeded, as for any report that could not be written at the end).
    r = run("--report-json", str(fifo), "-n", "1", "true", timeout=30)
    assert r.returncode == 1 and stat.S_ISFIFO(os.lstat(fifo).st_mode)
    line = one_error_line(r.stderr)
    assert f"--report-json {fifo}: " in line and "no reader" in line, line
    # A job that cannot start keeps its own error (and status) too.
    r = run("--report-json", str(fifo), "-n", "1", "no-such-program-here", timeout=30)
    assert r.returncode == 127
    assert r.stderr.decode().splitlines() == [
        f"mslaunch: error: --report-json {fifo}: a FIFO with no reader",
        "mslaunch: error: program 'no-such-program-here' of rank 0 not found in PATH or the "
        "working directory (or not executable)"], r.stderr
