"""What a newcomer meets: one line for every failure, torchrun's and msrun's habits,
``--help`` topics, and the Python entry point (failures and the job report:
test_failure_reports.py)."""

from __future__ import annotations

import os
import signal
import subprocess
from typing import List, Optional

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import PY, REPO, clean_env, cmd, one_error_line, run, wait_for
from listeners import BAD_KINDS, bad_hosts_config
from remote import no_agents

# -- never a traceback: every kind of SSH failure is one line -------------------------


@pytest.mark.parametrize("kind", BAD_KINDS)
def test_a_port_that_is_not_a_working_sshd_is_one_line(listeners, kind, tmp_path):
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(bad_hosts_config(listeners))
    r = subprocess.run(cmd("--ssh-timeout", "2", "-H", kind, "-n", "1", "true"),
                       capture_output=True, timeout=60, env=clean_env(HOME=str(home)))
    assert r.returncode == 1
    line = one_error_line(r.stderr)
    assert f"{kind} (connect: " in line
    expected = {"not-ssh": "no SSH banner", "dropped": "no SSH banner",
                "mid-handshake": "closed during the key exchange", "silent": "timed out after 2 s"}
    assert expected[kind] in line, line


def test_every_ssh_failure_kind_together_is_one_line_naming_each_host(sshbed, listeners,
                                                                       tmp_path):
    home = sshbed.make_home(tmp_path / "home", user_config_extra=bad_hosts_config(listeners))
    sshbed.refuse_logins("h3")
    sshbed.rekey_host("h2")
    hosts = ",".join([*BAD_KINDS, "h2", "h3"])
    r = subprocess.run(cmd("--ssh-timeout", "2", "-v", "-H", hosts, "-n", "6", "true"),
                       capture_output=True, timeout=90, env=clean_env(HOME=home))
    assert r.returncode == 1
    text = r.stderr.decode()
    # -v adds mslaunch's own lines; still no traceback, and one error line.
    assert "Traceback" not in text and "File \"" not in text, text
    errors = [line for line in text.splitlines() if line.startswith("mslaunch: error:")]
    assert len(errors) == 1, text
    for host in (*BAD_KINDS, "h2", "h3"):       # grouped by reason: "dropped, not-ssh (..."
        assert f" {host} (" in errors[0] or f" {host}, " in errors[0], text
    assert "h2 (host key: " in errors[0] and "CHANGED" in errors[0], text
    assert "h3 (authentication: " in errors[0], text
    assert "6 of 6" in errors[0], text


@pytest.mark.parametrize("kind", [*BAD_KINDS, "key-changed", "login-refused"])
def test_every_ssh_failure_kind_through_the_openssh_client_is_one_line(sshbed, listeners,
                                                                       tmp_path, kind):
    home = sshbed.make_home(tmp_path / "home", user_config_extra=bad_hosts_config(listeners)
                            + "Host silent\n  ConnectTimeout 2\n")
    host = {"key-changed": "h2", "login-refused": "h3"}.get(kind, kind)
    if kind == "key-changed":
        sshbed.rekey_host("h2")
    if kind == "login-refused":
        sshbed.refuse_logins("h3")
    config = os.path.join(home, ".ssh", "config")
    r = subprocess.run(cmd("--mca", "plm_rsh_agent", "ssh", "--mca", "plm_rsh_args",
                           f"-F {config}", "-H", f"h1,{host}", "-n", "2", "true"),
                       capture_output=True, timeout=120, env=clean_env(HOME=home))
    assert r.returncode == 1
    line = one_error_line(r.stderr)
    assert f"nothing was started: {host} (" in line and "1 of 2" in line, line
    assert wait_for(lambda: no_agents(sshbed), 15)


def test_library_messages_are_one_line_each_with_two_v(listeners, tmp_path):
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(bad_hosts_config(listeners))
    r = subprocess.run(cmd("-v", "-v", "--ssh-timeout", "2", "-H", "dropped", "-n", "1", "true"),
                       capture_output=True, timeout=60, env=clean_env(HOME=str(home)))
    text = r.stderr.decode()
    assert r.returncode == 1 and "Traceback" not in text and "  File " not in text, text
    assert "mslaunch: debug: paramiko.transport: " in text, text


THREAD_DIES = """
import threading
from mslaunch.core import liblogs
liblogs.route(["paramiko"])
space = {"__name__": "mslaunch.somewhere"}
exec("def fails():\\n    raise ValueError('lost')\\n", space)
def users():
    raise KeyError("the user's own")
for target, name in ((space["fails"], "connect-0"), (users, "user-thread")):
    t = threading.Thread(target=target, name=name)
    t.start()
    t.join()
print("went on")
"""


def test_a_thread_of_mslaunchs_that_dies_is_one_line_and_others_keep_their_traceback():
    r = subprocess.run([PY, "-c", THREAD_DIES], capture_output=True, timeout=30, env=clean_env())
    err = r.stderr.decode()
    assert r.returncode == 0 and r.stdout == b"went on\n", err
    assert "mslaunch: internal error in connect-0: ValueError: lost\n" in err
    # a thread of the program that called mslaunch is not mslaunch's to quieten
    assert "KeyError: \"the user's own\"" in err and err.count("Traceback") == 1, err


def test_an_unexpected_error_is_one_line():
    import contextlib
    import io
    from mslaunch.cli import main
    errs = io.StringIO()
    with contextlib.redirect_stderr(errs):
        status = main(["-n", "1", "true"], run=lambda job: int("a bug"))
    assert status == 1
    assert errs.getvalue() == ("mslaunch: error: internal error: ValueError: invalid literal for "
                               "int() with base 10: 'a bug' (a bug in mslaunch; "
                               "MSLAUNCH_TRACEBACK=1 shows where)\n")


# -- torchrun's and msrun's habits ------------------------------------------------------

def _error_of(argv: List[str], cwd: Optional[str] = None) -> str:
    """mslaunch's stderr for a command line that is refused before anything runs."""
    r = run(*argv, cwd=cwd, timeout=30)
    assert r.returncode == 2, r
    return one_error_line(r.stderr)


def test_a_python_script_that_is_not_executable_runs_with_python(tmp_path):
    script = tmp_path / "hello.py"
    script.write_text("import os, sys\nprint('hello from', os.environ['RANK'], "
                      "os.path.basename(sys.argv[0]), sys.argv[1:])\n")
    script.chmod(0o644)
    r = run("-n", "2", "hello.py", "a", cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.decode().splitlines()) == [
        "hello from 0 hello.py ['a']", "hello from 1 hello.py ['a']"]
    r = run("-v", "-n", "1", "hello.py", cwd=str(tmp_path))
    assert b"note: hello.py is not executable: running it as 'python" in r.stderr, r.stderr


def test_a_script_with_a_hash_bang_that_is_not_executable_runs_with_its_interpreter(tmp_path):
    script = tmp_path / "job"
    script.write_text(f"#!{PY} -u\nimport os, sys\nprint(sys.executable == {PY!r}, "
                      f"os.environ['RANK'])\n")
    script.chmod(0o644)
    r = run("-n", "2", "./job", cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.split()) == [b"0", b"1", b"True", b"True"]


def test_an_executable_script_the_kernel_cannot_start_is_refused_with_the_fix(tmp_path):
    # "Exec format error" and "No such file or directory" for a file that is there.
    (tmp_path / "train.py").write_text("print('no #! line')\n")
    (tmp_path / "win.py").write_bytes(f"#!{PY}\r\nprint('CR LF')\r\n".encode())
    for name, says in (("train.py", "has no '#!' line to run it with: add '#!/usr/bin/env "
                                    "python3' as its first line, or name python (mslaunch "
                                    "[options] python train.py)"),
                       ("win.py", "has a '#!' line ending in a carriage return (Windows line "
                                  "ends): convert it (dos2unix win.py)")):
        (tmp_path / name).chmod(0o755)
        r = run("-n", "1", name, cwd=str(tmp_path))
        assert r.returncode == 127
        line = one_error_line(r.stderr)
        assert line.startswith(f"mslaunch: error: program {name!r} of rank 0 {says}"), line


def test_a_script_named_like_an_option_or_with_a_tab_in_its_hash_bang_runs(tmp_path):
    # "python -v.py" would be python's -v option: the file is named by a path.
    (tmp_path / "-v.py").write_text("import sys\nprint('ran', sys.argv[1:])\n")
    r = run("-n", "1", "--", "-v.py", "-x", cwd=str(tmp_path))
    assert r.returncode == 0 and r.stdout == b"ran ['-x']\n", r
    # The kernel ends the interpreter's name at a space or a tab.
    (tmp_path / "job").write_text(f"#!{PY}\t-S\nimport sys\nprint(sys.flags.no_site)\n")
    r = run("-n", "1", "job", cwd=str(tmp_path))
    assert r.returncode == 0 and r.stdout == b"1\n", r


def test_a_script_that_cannot_run_is_refused_with_what_to_type(tmp_path):
    (tmp_path / "bad").write_text("#!/no/such/python3\nprint(1)\n")
    line = _error_of(["-n", "2", "bad"], cwd=str(tmp_path))
    assert "'/no/such/python3'" in line and "does not exist" in line
    assert line.endswith("name one: mslaunch -n 2 python3 bad"), line
    (tmp_path / "plain.sh").write_text("echo hi\n")
    r = run("-n", "1", "plain.sh", cwd=str(tmp_path))
    assert r.returncode == 127
    line = one_error_line(r.stderr)
    assert "is not executable: chmod +x plain.sh" in line
    # A compiled program without its bit: sh cannot run it, so only chmod is proposed.
    with open("/bin/true", "rb") as src:
        (tmp_path / "a.out").write_bytes(src.read())
    (tmp_path / "net.py").mkdir()
    for program, says in (("a.out", "is not executable: chmod +x a.out"),
                          ("net.py", "is a directory")):
        r = run("-n", "1", program, cwd=str(tmp_path))
        assert r.returncode == 127
        line = one_error_line(r.stderr)
        assert line.endswith(f"program {program!r} of rank 0 {says}"), line


def test_report_state_without_a_timeout_says_it_does_nothing():
    r = run("--report-state-on-timeout", "-n", "1", "true")
    assert r.returncode == 0
    assert r.stderr.decode() == ("mslaunch: warning: --report-state-on-timeout acts on a timeout "
                                 "only, and none is set: add --timeout SECONDS (or set "
                                 "MPIEXEC_TIMEOUT)\n"), r.stderr
    # --get-stack-traces alone means stall reports after 60 s (tests/rooms/inspect/test_stall.py): no warning
    r = run("--get-stack-traces", "-n", "1", "true")
    assert r.returncode == 0 and r.stderr == b"", r.stderr
    r = run("--get-stack-traces", "--report-state-on-timeout", "--timeout", "30", "-n", "1",
            "true")
    assert r.returncode == 0 and r.stderr == b"", r.stderr


@pytest.mark.parametrize("argv, expected", [
    (["--nproc_per_node=2"], "that is torchrun's; in mslaunch: -n 2 (ranks of the whole job) "
                             "or -N 2 (ranks per host"),
    (["--nproc-per-node", "4"], "-n 4 (ranks of the whole job) or -N 4"),
    (["--nnodes=2"], "-H h1,h2 or --hostfile FILE"),
    (["--node-rank", "0"], "one mslaunch command starts the ranks of every host"),
    (["--master_addr=10.0.0.1"], "MASTER_ADDR is set for the ranks"),
    (["--master-port", "29500"], "MASTER_PORT is set for the ranks"),
    (["--rdzv_backend=c10d"], "there is no rendezvous"),
    (["--rdzv-endpoint=h1:29400"], "there is no rendezvous"),
    (["--standalone"], "without -H or --hostfile the job runs on this machine"),
    (["--hostfiel", "hf"], "(did you mean --hostfile? see mslaunch --help)"),
    (["--tag-ouput"], "(did you mean --tag-output?"),
    (["--oversubscrib"], "(did you mean --oversubscribe?"),
    (["--worker-num=2", "--local-worker-num=2"], "(did you mean msrun's --worker_num? see "
                                                 "mslaunch --help msrun)"),
    (["--workr_num=2"], "(did you mean msrun's --worker_num?"),
    (["-nn", "2"], "(did you mean -n? see mslaunch --help)"),
])
def test_torchrun_flags_and_misspellings_get_the_mslaunch_spelling(argv, expected):
    # -n 1 first: some of torchrun's words are msrun's too, which would switch dialects
    line = _error_of(["-n", "1", *argv, "x.py"])
    assert line.startswith(f"mslaunch: error: unknown option {argv[0]!r}")
    assert expected in line, line


@pytest.mark.parametrize("argv, expected", [
    (["--worker_num=16", "--nproc_per_node=8"], "in mslaunch: --local_worker_num=8"),
    (["--node_rank=0", "--worker_num=4", "--nnodes=2"],
     "--worker_num=(nodes x --local_worker_num)"),
    (["--worker_num=2", "--rdzv_endpoint=h1:29400"], "--master_addr=HOST --master_port=PORT"),
    (["--worker_num=2", "--local_workr_num=2"], "(did you mean --local_worker_num?"),
])
def test_torchrun_flags_in_msruns_dialect_get_msruns_spelling(argv, expected):
    line = _error_of([*argv, "x.py"])
    assert "msrun dialect: unknown option" in line and expected in line, line


def test_msruns_default_worker_count_is_named_as_a_default():
    line = _error_of(["--worker_num=2", "x.py"])
    assert ("--local_worker_num=8 (msrun's default, not given) is more than --worker_num=2; "
            "give --local_worker_num=2 for one node") in line, line
    line = _error_of(["--local_worker_num=2", "--worker_num=4", "--node_rank=2", "x.py"])
    assert "beyond --worker_num=4" in line and "(msrun's default" not in line, line
    line = _error_of(["--local_worker_num=9", "x.py"])
    assert "--worker_num=8 (msrun's default, not given); give --worker_num=9 or more" in line


@settings(max_examples=200, deadline=None)
@given(name=st.text("abcdefghijklmnopqrstuvwxyz_-0123456789", min_size=1, max_size=20),
       value=st.text(min_size=0, max_size=12))
def test_any_unknown_option_in_msruns_dialect_is_one_line(name, value):
    from mslaunch.cli.common import msrun_names
    from mslaunch.cli.msrun import parse_msrun
    from mslaunch.core.errors import UsageError
    if msrun_names(name) or name in ("verbose", "quiet", "no-pty"):
        return          # (a name, or a start of one or of several)
    with pytest.raises(UsageError) as err:
        parse_msrun(["--worker_num=2", f"--{name}={value}", "x.py"])
    text = str(err.value)
    assert text.startswith("msrun dialect: unknown option ") and name in text, text
    assert text.isprintable() and "mslaunch" in text, text


# -- --help: examples, the docs, a topic ------------------------------------------------

def test_help_is_one_screen_naming_every_dialect_and_help_all_has_every_option():
    r = run("--help")
    assert r.returncode == 0
    out = r.stdout.decode()
    assert len(out.splitlines()) <= 60 and max(map(len, out.splitlines())) <= 80
    usage, about = out.split("\n\n", 2)[:2]
    for dialect in ("torchrun", "DeepSpeed", "msrun"):
        assert dialect in usage, dialect
    assert "torch.distributed.launch" in about and "mpirun" in about
    assert "\nexamples:\n  mslaunch -n 4 python train.py" in out
    assert "docs/" in out and "mslaunch --help TOPIC" in out
    every = run("--help", "all").stdout.decode()
    for text in ("Placement and binding:", "--nproc_per_node", "--num_gpus",
                 "msrun dialect", "\nexamples:\n"):
        assert text in every, text


@pytest.mark.parametrize("topic, has, lacks", [
    ("mapping", ["Placement and binding:", "--map-by", "--bind-to"], ["--output-filename"]),
    ("binding", ["--bind-to"], ["--ssh-config"]),
    ("output", ["--output-filename", "--tag-output"], ["--map-by"]),
    ("remote", ["--ssh-config", "--launch-agent"], ["--map-by"]),
    ("msrun", ["--local_worker_num", "--report_json"], ["--map-by"]),
    ("torchrun", ["--nproc_per_node", "--rdzv_endpoint", "--local_worker_num=N"], ["--map-by"]),
    ("examples", ["mslaunch -n 2 hello.py"], ["--map-by"]),
    ("deepspeed", ["--num_gpus", "--include", ".deepspeed_env"], ["--map-by"]),
])
def test_help_with_a_topic_prints_that_topic(topic, has, lacks):
    r = run("--help", topic)
    assert r.returncode == 0 and r.stderr == b""
    out = r.stdout.decode()
    for text in has:
        assert text in out, (topic, text)
    for text in lacks:
        assert text not in out, (topic, text)
    assert "docs/" in out


def test_help_with_an_unknown_topic_names_the_topics():
    r = run("-h", "nosuch")
    assert r.returncode == 2 and r.stdout == b""
    line = one_error_line(r.stderr)
    assert "--help 'nosuch': no such topic" in line and "mapping" in line


# -- Python: mslaunch.run ------------------------------------------------------------------

RUN_FROM_PYTHON = """
import sys
import mslaunch
assert [m for m in sys.modules if m.startswith("mslaunch")] == ["mslaunch"], "not lazy"
print("ok", mslaunch.run(["-n", "2", "true"]), flush=True)
print("failed", mslaunch.run(["-n", "2", sys.executable, "-c",
                              "import os, sys; sys.exit(3 if os.environ['RANK'] == '1' else 0)"]),
      flush=True)
print("usage", mslaunch.run(["--no-such-option", "x"]), flush=True)
try:
    mslaunch.run("-n 2 true")
except TypeError as err:
    print("string refused", flush=True)
print("still here", flush=True)
"""


def test_run_from_python_returns_the_status_and_the_interpreter_goes_on(tmp_path):
    r = subprocess.run([PY, "-c", RUN_FROM_PYTHON], capture_output=True, timeout=60,
                       env=clean_env(), cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert r.stdout.decode().splitlines() == ["ok 0", "failed 3", "usage 2", "string refused",
                                              "still here"], r
    assert b"unknown option '--no-such-option'" in r.stderr


RUN_AGAIN = """
import os, sys
import mslaunch
def fds():
    return sorted(os.listdir("/proc/self/fd"))
mslaunch.run(["-n", "2", "true"])       # the first job may keep what every job shares
before = fds()
for argv in (["-n", "2", "true"], ["-n", "1", "false"], ["--xml-file", "out.xml", "-n", "1", "true"],
             ["--worker_num=1", "--local_worker_num=1", "--join=True", "--log_dir=logs", "true"],
             ["--mpi", "openmpi", "-n", "1", "true"]):
    mslaunch.run(argv)
print(" ".join(before), "|", " ".join(fds()), flush=True)
"""


def test_run_from_python_leaves_the_callers_logging_and_signals_alone(tmp_path):
    # The job runs in a child process: a -v -v job routes no logger of the caller's, and
    # the caller's signal handlers are its own again afterwards.
    program = ("import logging, signal, mslaunch\n"
               "before = signal.getsignal(signal.SIGTERM)\n"
               "print(mslaunch.run(['-v', '-v', '-n', '2', 'true']), flush=True)\n"
               "logging.getLogger('paramiko').warning('the caller still logs')\n"
               "print(signal.getsignal(signal.SIGTERM) is before, flush=True)\n")
    r = subprocess.run([PY, "-c", program], capture_output=True, timeout=60, env=clean_env(),
                       cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert r.stdout.decode().split() == ["0", "True"], r
    assert b"\nthe caller still logs\n" in b"\n" + r.stderr, r.stderr


def test_run_from_python_passes_sigterm_to_the_job(tmp_path):
    program = ("import os, signal, threading, mslaunch\n"
               "threading.Timer(2.0, os.kill, (os.getpid(), signal.SIGTERM)).start()\n"
               "print(mslaunch.run(['-n', '2', 'sleep', '30']), flush=True)\n")
    r = subprocess.run([PY, "-c", program], capture_output=True, timeout=60, env=clean_env(),
                       cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert r.stdout.decode().split() == ["143"], r


def test_run_from_python_raises_keyboard_interrupt_after_a_ctrl_c(tmp_path):
    """As subprocess.run: the job stops (its ranks got the Ctrl-C's stop), then
    KeyboardInterrupt, so that a sweep of jobs stops there."""
    program = ("import mslaunch\n"
               "try:\n"
               f"    mslaunch.run(['-n', '2', 'sh', '-c', 'touch {tmp_path}/up.$RANK; sleep 30'])\n"
               "except KeyboardInterrupt:\n"
               "    print('interrupted', flush=True)\n"
               "print('next job', mslaunch.run(['-n', '1', 'true']), flush=True)\n")
    p = subprocess.Popen([PY, "-c", program], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env=clean_env(), cwd=str(tmp_path), start_new_session=True)
    try:
        assert wait_for(lambda: all((tmp_path / f"up.{r}").exists() for r in (0, 1)), 30)
        os.killpg(p.pid, signal.SIGINT)           # the terminal's Ctrl-C: the whole group
        out, err = p.communicate(timeout=60)
    finally:
        p.kill()
        p.communicate()
    assert p.returncode == 0, err
    assert out.decode().split("\n")[:2] == ["interrupted", "next job 0"], (out, err)


def test_run_from_python_leaves_no_descriptor_behind(tmp_path):
    # stdout and stderr are pipes here (mslaunch writes them through descriptors of
    # its own), the --xml-file its file: each job closes what it opened.
    r = subprocess.run([PY, "-c", RUN_AGAIN], capture_output=True, timeout=120,
                       env=clean_env(), cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    before, after = r.stdout.decode().splitlines()[-1].split(" | ")
    assert before == after, r.stdout


def test_the_package_docstring_names_only_subpackages_that_exist():
    import re
    import mslaunch
    named = set(re.findall(r"``([a-z_.]+)``", mslaunch.__doc__ or "")) - {"mslaunch"}
    assert {"cli", "core", "run", "backends", "machine", "wire", "agent", "mpi", "plan"} <= named
    for name in named:
        path = os.path.join(REPO, "mslaunch", *name.split("."))
        assert os.path.isdir(path) or os.path.isfile(path + ".py"), name


# -- the documentation says what the code does -------------------------------------------

def _doc(*path: str) -> str:
    with open(os.path.join(REPO, "docs", *path)) as f:
        return f.read()


def test_the_torchrun_guide_has_every_torchrun_option_mslaunch_answers():
    from mslaunch.cli.hints import TORCHRUN, TORCHRUN_MSRUN
    text = _doc("guides", "torchrun.md")
    for name in [*TORCHRUN, *TORCHRUN_MSRUN]:
        assert f"`--{name}" in text, name
