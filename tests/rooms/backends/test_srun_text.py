"""``--launcher srun``'s text (:mod:`mslaunch.backends.srunsteps.srun`), tested without Slurm.

The tasks' bash program runs for real here, as srun would run it on a node:
with ``SLURM_PROCID`` and ``SLURM_LAUNCH_NODE_IPADDR`` set, dialling a socket
of the test's, reading the rank's script from it and becoming the program.
What srun says of its tasks' ends is read from lines of the form Slurm
22.05 writes (copied from a run of the test bed).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from typing import Dict, List, Optional

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mslaunch.backends.srunsteps.srun import (
    TASK_VARIABLE,
    SrunLog,
    rank_script,
    split_env,
    srun_argv,
    task_ids,
    task_program,
    variable_problem,
)

BASH = shutil.which("bash")
pytestmark = pytest.mark.skipif(BASH is None, reason="no bash")

# Names bash gives a meaning of its own when the rank's program starts (the
# shell's working directory, its level...) are left out; variable_problem()
# refuses the names bash would not let the script set.
names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,12}", fullmatch=True).filter(
    lambda n: n not in ("PWD", "OLDPWD", "SHLVL", "_", "PATH") and variable_problem(n, "") is None)
# Text as the system decodes bytes: any character, and undecodable bytes as
# the surrogates U+DC80..U+DCFF (surrogateescape)
values = st.text(st.one_of(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"),
    st.integers(0xDC80, 0xDCFF).map(chr)), max_size=40)


def _run_task(script: bytes, argv: List[str], merged: bool = False, rank: int = 3,
              secret: str = "5ec7e7", extra: Optional[Dict[str, str]] = None) -> Dict[str, bytes]:
    """Run the tasks' program as srun would, answer its first connection with
    ``script``; what each connection presented and carried."""
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(4)
    lsock.settimeout(20)
    port = lsock.getsockname()[1]
    env = {"PATH": os.environ["PATH"], "SLURM_PROCID": str(rank),
           "SLURM_LAUNCH_NODE_IPADDR": "127.0.0.1",
           TASK_VARIABLE: task_program(secret, port, merged), **(extra or {})}
    p = subprocess.Popen([BASH, "-c", f'eval "${TASK_VARIABLE}"', "bash", *argv], env=env,
                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    got: Dict[str, bytes] = {}
    try:
        conns = []
        for n in range(1 if merged else 2):     # both connections first, in order
            conn, _ = lsock.accept()
            conn.settimeout(20)
            head = b""
            while b"\n" not in head:
                more = conn.recv(1)
                assert more, head
                head += more
            word, token, pid = head.decode().split()
            assert word == "mslaunch-dial" and pid == str(p.pid)
            assert token == f"{secret}{rank}{'oe'[n]}"
            conns.append((token[-1], conn))
        conns[0][1].sendall(script)
        for stream, conn in conns:
            data = b""
            while True:
                more = conn.recv(65536)
                if not more:
                    break
                data += more
            got[stream] = data
            conn.close()
        out, err = p.communicate(timeout=20)
        got["rc"] = str(p.returncode).encode()
        got["own stdout"], got["own stderr"] = out, err
    finally:
        lsock.close()
        if p.poll() is None:
            p.kill()
            p.wait()
    return got


def _zero_split(data: bytes) -> List[bytes]:
    return data.split(b"\0")[:-1]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(env=st.dictionaries(names, values, max_size=6),
       argv=st.lists(values, max_size=4), merged=st.booleans())
def test_a_task_gets_its_rank_s_variables_and_argv_exactly(env, argv, merged):
    script = rank_script(env, ["sh", "-c", 'printf "%s\\0" "$@"; env -0', "first", *argv],
                         None, pmi_port=4242)
    # The program prints its argv, then its environment, NUL-separated.
    got = _run_task(script, ["ignored"], merged)
    assert got["rc"] == b"0", got
    assert got["own stdout"] == got["own stderr"] == b"", got
    items = _zero_split(got["o"])
    assert items[:len(argv)] == [a.encode("utf-8", "surrogateescape") for a in argv]
    seen = dict(item.split(b"=", 1) for item in items[len(argv):] if b"=" in item)
    for k, v in env.items():
        assert seen[k.encode()] == v.encode("utf-8", "surrogateescape"), k


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(env=st.dictionaries(names, values, min_size=1, max_size=6))
def test_exported_values_arrive_byte_for_byte(env):
    script = rank_script(env, ["env", "-0"], None, pmi_port=4242)
    got = _run_task(script, [], merged=True)
    seen = dict(item.split(b"=", 1) for item in _zero_split(got["o"]))
    for k, v in env.items():
        assert seen[k.encode()] == v.encode("utf-8", "surrogateescape"), k
    assert seen[b"PMI_PORT"] == b"127.0.0.1:4242"
    assert TASK_VARIABLE.encode() not in seen           # the secret goes no further
    assert b"__mslaunch_s" not in seen


def test_output_is_passed_on_unchanged_on_two_connections(tmp_path):
    # An unfinished last line, binary bytes, and stderr apart from stdout.
    blob = bytes(range(256)) * 300
    (tmp_path / "blob").write_bytes(blob)
    script = rank_script({}, None, str(tmp_path))
    got = _run_task(script, ["sh", "-c", "cat blob; printf tail; printf 'e1\\ne2' >&2; exit 5"])
    assert got["o"] == blob + b"tail"
    assert got["e"] == b"e1\ne2"
    assert got["rc"] == b"5"


def test_a_missing_program_or_directory_is_said_in_one_line_by_the_task(tmp_path):
    # On the task's own stderr, which srun passes on to mslaunch's, before the
    # rank's streams are the connections; exit status 127, as with agents.
    for script, argv, said in (
            (rank_script({}, who="rank 3"), ["/no/such/program"],
             b"mslaunch: rank 3: /no/such/program: no such program (or not executable) on h9\n"),
            (rank_script({}, cwd=str(tmp_path / "gone"), who="rank 3"), ["true"],
             b"mslaunch: rank 3: working directory %s does not exist on h9\n"
             % str(tmp_path / "gone").encode())):
        got = _run_task(script, argv, extra={"SLURMD_NODENAME": "h9"})
        assert got["rc"] == b"127", got
        assert got["own stderr"] == said and got["o"] == got["e"] == b"", got
    # a file that cannot be run, by path or through PATH; a shell builtin
    (tmp_path / "plain").write_text("#!/bin/sh\n")
    for argv, path in (([str(tmp_path / "plain")], None), (["plain"], str(tmp_path)),
                       (["type"], None)):
        env = {"PATH": path + ":/usr/bin:/bin"} if path else {}
        got = _run_task(rank_script(env, who="rank 3"), argv, extra={"SLURMD_NODENAME": "h9"})
        assert got["rc"] == b"127", got
        assert got["own stderr"] == b"mslaunch: rank 3: %s: no such program (or not " \
            b"executable) on h9\n" % argv[0].encode(), got


def test_rank_script_refuses_what_bash_cannot_carry():
    for env in ({"1BAD": "x"}, {"X.Y": "x"}, {"GOOD": "a\0b"}, {"UID": "0"},
                {"SHELLOPTS": "xtrace"}, {"GOOD": "\ud800"}):
        assert variable_problem(*next(iter(env.items())))
        with pytest.raises(ValueError):
            rank_script(env)
    with pytest.raises(ValueError):
        rank_script({}, ["a\0"])
    with pytest.raises(ValueError):
        rank_script({}, ["\ud800"])


def test_bash_s_own_startup_variables_reach_the_rank_not_the_task_s_bash(tmp_path):
    # BASH_ENV is sourced by a non-interactive bash, and functions exported in the
    # environment would stand in for the program's commands: neither may touch it.
    from mslaunch.backends.srunsteps.srunranks import srun_environment
    from mslaunch.core.spec import Host, RankSpec
    marker = tmp_path / "sourced"
    (tmp_path / "bashenv").write_text(f"echo sourced >> {marker}\n")
    here = Host(name="h1", slots=1, max_slots=None, local=False, node_id=0)
    specs = [RankSpec(rank=0, app=0, host=here, local_rank=0, local_size=1, argv=("x",),
                      env={"A": "1"}, cwd=str(tmp_path), stdout_path=None, stderr_path=None)]
    env, own = srun_environment(specs, [{}], {"BASH_ENV": str(tmp_path / "bashenv"),
                                              "SHELLOPTS": "xtrace", "PMI_FD": "9",
                                              "KEEP": "yes"})
    assert "BASH_ENV" not in env and "SHELLOPTS" not in env and "PMI_FD" not in env
    assert env["KEEP"] == "yes" and env["A"] == "1"
    assert own == [{"BASH_ENV": str(tmp_path / "bashenv")}]
    got = _run_task(rank_script(own[0]), ["sh", "-c", 'printf "%s" "$BASH_ENV"'],
                    extra={"BASH_FUNC_printf%%": "() { echo hijacked; }",
                           "BASH_FUNC_exec%%": "() { echo hijacked; }"})
    assert got["rc"] == b"0" and got["o"] == str(tmp_path / "bashenv").encode(), got
    assert not marker.exists()


def test_split_env_keeps_what_differs_per_rank():
    common, own = split_env([{"A": "1", "B": "x", "C": "0"}, {"A": "1", "B": "y"}])
    assert common == {"A": "1"}
    assert own == [{"B": "x", "C": "0"}, {"B": "y"}]
    assert split_env([]) == ({}, [])


def test_srun_argv_places_each_task_on_its_node():
    argv = srun_argv(["h1", "h2", "h1"], 3, "0", "/some where", ["prog", "arg"])
    assert "--nodelist=h1,h2,h1" in argv and "--nodes=2" in argv and "--ntasks=3" in argv
    assert "--distribution=arbitrary" in argv and "--input=0" in argv and "-v" in argv
    assert "--chdir=/some where" in argv
    assert argv[-2:] == ["prog", "arg"]


@given(st.lists(st.tuples(st.integers(0, 5000), st.integers(0, 30)), min_size=1, max_size=6))
def test_task_lists_round_trip(ranges):
    text = ",".join(f"{a}-{a + n}" if n else str(a) for a, n in ranges)
    assert task_ids(text) == [t for a, n in ranges for t in range(a, a + n + 1)]


@given(st.text(max_size=30))
def test_task_lists_of_junk_raise_value_error_only(text):
    try:
        task_ids(text)
    except ValueError:
        pass


# What srun -v wrote in the test bed (Slurm 22.05), a failed and a clean task.
_RUN = """srun: defined options
srun: -------------------- --------------------
srun: jobid 2: nodes(2):`h[1-2]', cpu counts: 1(x2)
srun: launching StepId=2.0 on host h1, 1 tasks: 0
srun: launching StepId=2.0 on host h2, 1 tasks: 1
srun: launch/slurm: _task_start: Node h1, 1 tasks started
srun: launch/slurm: _task_finish: Received task exit notification for 1 task of StepId=2.0 (status=0x0009).
srun: error: h2: task 1: Killed
srun: launch/slurm: _task_finish: Received task exit notification for 1 task of StepId=2.0 (status=0x0000).
srun: launch/slurm: _task_finish: h1: task 0: Completed
srun: launch/slurm: _task_finish: Received task exit notification for 2 tasks of StepId=2.0 (status=0x0300).
srun: error: h3: tasks 2-3: Exited with exit code 3
srun: error: Unable to create step for job 9: something
srun: warning: a warning
slurmstepd-h1: error: *** STEP 2.0 ON h1 CANCELLED AT 2026-11-26T04:47:15 ***
"""


def test_srun_log_reads_each_task_s_end_and_shows_only_news():
    log = SrunLog()
    shown = [line for line in map(log.line, _RUN.splitlines()) if line is not None]
    assert log.step == "2.0"
    assert log.take() == [(1, None, 9), (0, 0, None), (2, 3, None), (3, 3, None)]
    assert log.take() == []
    assert shown == ["srun: error: Unable to create step for job 9: something",
                     "srun: warning: a warning"]
    everything = SrunLog(show_all=True)
    assert all(everything.line(line) == line for line in _RUN.splitlines())


@given(st.lists(st.text(max_size=120), max_size=20))
def test_srun_log_takes_any_line(lines):
    log = SrunLog()
    for line in lines:
        log.line(line)
    for task, code, sig in log.take():
        assert task >= 0 and (code is None) != (sig is None)


@given(st.lists(st.tuples(st.integers(0, 0xFFFF), st.lists(st.integers(0, 999), min_size=1,
                                                             max_size=4, unique=True),
                          st.sampled_from(["error: ", "launch/slurm: _task_finish: "]),
                          st.text(max_size=30)), max_size=6))
def test_srun_log_reads_every_end_srun_writes(ends):
    # A status line, then the line naming its tasks, with chatter between pairs.
    log = SrunLog()
    want = []
    for status, tasks, kind, chatter in ends:
        log.line(f"srun: launch/slurm: _task_finish: Received task exit notification for "
                 f"{len(tasks)} task(s) of StepId=7.0 (status=0x{status:04x}).")
        names = ",".join(map(str, tasks))
        log.line(f"srun: {kind}h3: task{'s' if len(tasks) > 1 else ''} {names}: ended")
        log.line("srun: " + chatter.replace("\n", " "))
        sig = status & 0x7F
        want += [(t, None, sig) if sig else (t, (status >> 8) & 0xFF, None) for t in tasks]
    assert log.take() == want
