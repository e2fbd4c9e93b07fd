"""End-to-end tests of local jobs: real mslaunch commands, real rank processes."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time

import pytest

from helpers import (PY, all_gone, clean_env, cmd, cmdline, kill_tagged, new_tag, one_error_line, program,
                     run, start, tagged_pids, wait_for, wait_lines)
from requires import require


def env_of(out: bytes):
    return [json.loads(line) for line in out.decode().splitlines()]


# -- environment -----------------------------------------------------------
def test_rank_variables_of_every_ecosystem():
    names = ["OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
             "OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_NODE_RANK", "OMPI_UNIVERSE_SIZE",
             "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", "RANK_ID",
             "RANK_SIZE", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
             "MASTER_ADDR", "MASTER_PORT", "PMI_FD"]
    r = run("-n", "3", "--oversubscribe", "--tag-output", PY, program("show_env.py"), *names)
    assert r.returncode == 0, r.stderr
    rows = {}
    for line in r.stdout.decode().splitlines():
        m = re.match(r"\[1,(\d+)\]<stdout>:(.*)", line)
        assert m, line
        rows[int(m.group(1))] = json.loads(m.group(2))
    assert sorted(rows) == [0, 1, 2]
    ports = {row["MASTER_PORT"] for row in rows.values()}
    assert len(ports) == 1 and int(ports.pop()) > 0
    for rank, row in rows.items():
        for name in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "RANK_ID", "RANK",
                     "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_NODE_RANK",
                     "MPI_LOCALRANKID", "LOCAL_RANK"):
            assert row[name] == str(rank), name
        for name in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "RANK_SIZE", "WORLD_SIZE",
                     "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "LOCAL_WORLD_SIZE"):
            assert row[name] == "3", name
        assert row["MASTER_ADDR"] == "127.0.0.1"
        assert int(row["OMPI_UNIVERSE_SIZE"]) >= 2
        assert row["PMI_FD"] is not None


def test_stale_launcher_variables_are_scrubbed_and_user_values_kept():
    env = clean_env(PMI_RANK="7", PMIX_NAMESPACE="old", OMPI_COMM_WORLD_RANK="9",
                    PRTE_LAUNCHED="1", HYDI_CONTROL_FD="5", OMPI_MCA_foo="x",
                    MASTER_PORT="23456", MY_SETTING="kept")
    r = run("-n", "1", PY, program("show_env.py"), "PMI_RANK", "PMIX_NAMESPACE",
            "OMPI_COMM_WORLD_RANK", "PRTE_LAUNCHED", "HYDI_CONTROL_FD", "OMPI_MCA_foo",
            "MASTER_PORT", "MY_SETTING", env=env)
    assert r.returncode == 0, r.stderr
    row = env_of(r.stdout)[0]
    # PMIx is served to every job: the namespace is this job's, not the stale one
    assert (row.pop("PMIX_NAMESPACE") or "old") != "old", row
    assert row == {"PMI_RANK": "0", "OMPI_COMM_WORLD_RANK": "0",
                   "PRTE_LAUNCHED": None, "HYDI_CONTROL_FD": None, "OMPI_MCA_foo": "x",
                   "MASTER_PORT": "23456", "MY_SETTING": "kept"}


def test_exports_x_genv_env_mca_and_mpmd_contexts():
    env = clean_env(FROM_LAUNCHER="yes")
    names = ["A", "B", "G", "FROM_LAUNCHER", "OMPI_MCA_btl", "RANK"]
    r = run("--oversubscribe", "-genv", "G", "global", "-mca", "btl", "self",
            "-n", "1", "-x", "A=first", "-x", "FROM_LAUNCHER", PY, program("show_env.py"), *names,
            ":", "-n", "2", "-env", "B", "second", PY, program("show_env.py"), *names,
            env=env)
    assert r.returncode == 0, r.stderr
    rows = sorted(env_of(r.stdout), key=lambda row: int(row["RANK"]))
    assert rows[0] == {"A": "first", "B": None, "G": "global", "FROM_LAUNCHER": "yes",
                       "OMPI_MCA_btl": "self", "RANK": "0"}
    for row in rows[1:]:
        assert row["A"] is None and row["B"] == "second" and row["G"] == "global"
    assert [row["RANK"] for row in rows] == ["0", "1", "2"]


def test_wdir_sets_the_working_directory(tmp_path):
    r = run("-n", "1", "-wdir", str(tmp_path), PY, "-c", "import os; print(os.getcwd())")
    assert r.stdout.decode().strip() == str(tmp_path)


@pytest.mark.parametrize("option", [["-x", "MSL_UNSET_VAR"], ["-envlist", "MSL_UNSET_VAR"],
                                    ["-genvlist", "MSL_UNSET_VAR"]])
def test_an_unset_variable_asked_for_is_one_warning_naming_it(option):
    r = run(*option, "-n", "1", "true", env=clean_env())
    assert r.returncode == 0, r.stderr
    assert r.stderr.decode().splitlines() == [
        "mslaunch: warning: MSL_UNSET_VAR is not set in the environment: not exported"]


def test_a_missing_wdir_is_one_error_line_naming_it(tmp_path):
    gone = str(tmp_path / "gone")
    r = run("-n", "2", "-wdir", gone, "true")
    assert r.returncode == 127, r.stderr
    assert f"working directory {gone!r} of rank 0 does not exist" in one_error_line(r.stderr)
    (tmp_path / "file").write_text("")
    r = run("-n", "2", "-wdir", str(tmp_path / "file"), "true")
    assert r.returncode == 127, r.stderr
    assert f"working directory {str(tmp_path / 'file')!r} of rank 0 is not a directory" in \
        one_error_line(r.stderr)


def _session_run(tmpdir):
    """``--set-cwd-to-session-dir -n 2``: each rank's working directory, as it says it."""
    r = run("--set-cwd-to-session-dir", "-n", "2", PY, "-c",
            "import os; open('made', 'w').close(); print(os.getcwd())",
            env=clean_env(TMPDIR=str(tmpdir)))
    assert r.returncode == 0, r.stderr
    return sorted(r.stdout.decode().split())


def test_each_rank_runs_in_a_fresh_directory_of_its_own_removed_at_the_end(tmp_path):
    top = tmp_path / f"mslaunch.{os.uname().nodename}.{os.getuid()}"
    r = run("--set-cwd-to-session-dir", "-n", "2", PY, "-c",
            "import os; print(os.getcwd(), oct(os.stat('../..').st_mode & 0o777))",
            env=clean_env(TMPDIR=str(tmp_path)))
    assert r.returncode == 0, r.stderr
    cwds, modes = zip(*sorted(line.split() for line in r.stdout.decode().splitlines()))
    assert len(set(cwds)) == 2 and all(c.startswith(f"{top}/kvs_") for c in cwds), cwds
    assert [os.path.basename(c) for c in cwds] == ["0", "1"]
    assert modes == ("0o700", "0o700")
    # the job's own went with it, and this user's folder of them with the last job
    assert not top.exists(), os.listdir(top)


def test_the_folder_of_session_directories_stays_for_a_job_still_in_it(tmp_path):
    top = tmp_path / f"mslaunch.{os.uname().nodename}.{os.getuid()}"
    top.mkdir(mode=0o700)
    (top / "kvs_another_job").mkdir()
    _session_run(tmp_path)
    assert os.listdir(top) == ["kvs_another_job"]


def test_a_session_directory_made_first_by_another_user_is_not_used(tmp_path):
    # Its name is no secret: another user who makes it first (open to all) would
    # choose what the ranks find in their working directory.
    require(os.geteuid() == 0, "root, to give a directory to another user")
    top = tmp_path / f"mslaunch.{os.uname().nodename}.{os.getuid()}"
    top.mkdir(mode=0o777)
    (top / "planted").write_text("x")
    os.chown(top, 65534, 65534)
    tmp_path.chmod(0o755)
    cwds = _session_run(tmp_path)
    assert len(set(cwds)) == 2 and not any(c.startswith(f"{top}/") for c in cwds), cwds
    assert all(c.startswith(f"{top}.kvs_") for c in cwds), cwds
    assert os.listdir(top) == ["planted"]
    # the job's own went with it (its control socket's folder, $TMPDIR/mslaunch-UID,
    # removed by the job's watchdog once mslaunch has exited)
    assert wait_for(lambda: sorted(os.listdir(tmp_path)) == [top.name], 30), \
        os.listdir(tmp_path)


# The ways a rank starts in a directory other than the launcher's: this C
# library's, and the forked child used where the C library has no chdir action.
@pytest.fixture(params=["as-is", "forked"])
def spawn_way(request, monkeypatch):
    if request.param == "forked":
        from mslaunch.machine import spawndir
        monkeypatch.setattr(spawndir, "_loaded", [None])
    return request.param


def rank_spec(cwd, argv, rank=0, **kw):
    from mslaunch.core.spec import Host, RankSpec
    here = Host(name="localhost", slots=1, max_slots=None, local=True, node_id=0)
    return RankSpec(rank=rank, app=0, host=here, local_rank=rank, local_size=1,
                    argv=tuple(argv), env=kw.pop("env", clean_env()), cwd=str(cwd),
                    stdout_path=None, stderr_path=None, **kw)


def start_rank(spec):
    """A rank started as the launcher starts it; its output, once it has ended."""
    from mslaunch.machine.spawn import LocalProcess
    r, w = os.pipe()
    null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    try:
        proc = LocalProcess(spec, spec.env, stdin=null, stdout=w, stderr=w)
    finally:
        os.close(w)
        os.close(null)
    with open(r, "rb") as out:
        text = out.read().decode()
    assert proc.reap() == (0, None), text
    return proc, text


def test_ranks_elsewhere_never_move_the_launchers_directory(tmp_path, monkeypatch, spawn_way):
    """The launcher's threads (SSH connections, reapers, hosts' start-ups) share
    its working directory: while ranks start in theirs, a relative path must
    still mean what it meant.  Another thread looks at every instant that
    anything in this process changes directory, and one looks all along."""
    launch, there = tmp_path / "launch", tmp_path / "there"
    launch.mkdir()
    there.mkdir()
    (launch / "marker").write_text("launch")
    monkeypatch.chdir(launch)
    me, seen = os.getpid(), []

    def look():
        try:
            with open("marker") as f:
                text = f.read()
        except OSError as err:
            text = str(err)
        seen.append((os.getcwd(), os.path.abspath("."), text))

    def watching(change):
        def changed(*args):
            change(*args)
            if os.getpid() == me:         # (a forked rank changes its own)
                thread = threading.Thread(target=look)
                thread.start()
                thread.join()
        return changed

    monkeypatch.setattr(os, "chdir", watching(os.chdir))
    monkeypatch.setattr(os, "fchdir", watching(os.fchdir))
    watched, done = threading.Event(), threading.Event()

    def watch():
        while not done.is_set():
            look()
            watched.set()

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        assert watched.wait(10)
        outputs = {start_rank(rank_spec(there, ["sh", "-c", "pwd -P"], rank))[1]
                   for rank in range(64)}
    finally:
        done.set()
        watcher.join()
    assert outputs == {os.path.realpath(there) + "\n"}
    assert seen and set(seen) == {(str(launch), str(launch), "launch")}
    assert os.getcwd() == str(launch)


def test_a_rank_elsewhere_starts_as_every_rank_does(tmp_path, spawn_way):
    """In its directory (a relative program found there), leading a process
    group of its own or a session, SIGPIPE and SIGXFSZ at their defaults (the
    launcher ignores them), with its streams and the inheritable descriptors
    only, and exactly its environment."""
    there = tmp_path / "there"
    there.mkdir()
    prog = there / "prog"
    prog.write_text("#!/bin/sh\n"
                    "pwd -P; cut -d' ' -f5,6 /proc/$$/stat\n"
                    "grep SigIgn /proc/$$/status; env | sort\n"
                    "for fd in $FDS; do [ -e /proc/$$/fd/$fd ] && echo has $fd; done; exit 0\n")
    prog.chmod(0o755)
    kept, sealed = os.pipe()
    os.set_inheritable(kept, True)
    try:
        env = {"PATH": "/usr/bin:/bin", "FDS": f"{kept} {sealed}", "ONLY": "this"}
        for session in (False, True):
            proc, text = start_rank(rank_spec(there, ["./prog"], env=env, session=session))
            lines = text.splitlines()
            assert lines[0] == os.path.realpath(there)
            group, sid = map(int, lines[1].split())
            assert group == proc.pid and sid == (proc.pid if session else os.getsid(0))
            ignored = int(lines[2].split()[1], 16)
            assert not ignored & (1 << (signal.SIGPIPE - 1) | 1 << (signal.SIGXFSZ - 1))
            assert sorted(lines[3:-1]) == sorted(f"{k}={v}" for k, v in
                                                 dict(env, PWD=lines[0]).items()), text
            assert lines[-1] == f"has {kept}"
    finally:
        os.close(kept)
        os.close(sealed)


def test_a_rank_whose_directory_went_is_one_clear_error(tmp_path, spawn_way):
    """A directory removed between the check before the start and the rank's
    spawn is named as the check names it (the C library's spawn says only
    "No such file or directory", of the directory or of the program)."""
    from mslaunch.core.errors import SpawnError
    gone = tmp_path / "gone"
    with pytest.raises(SpawnError) as caught:
        start_rank(rank_spec(gone, ["true"], rank=3))
    assert str(caught.value) == f"working directory {str(gone)!r} of rank 3 does not exist"


def test_launcher_environment_is_not_changed_by_rank_environments():
    code = ("import os, mslaunch.cli.mpirun as c, mslaunch.run.attempt as l\n"
            "before = dict(os.environ)\n"
            "job = c.parse_args(['-n', '2', '-x', 'Z=1', 'true'])\n"
            "l.build_plan(job)\n"
            "assert dict(os.environ) == before\n")
    r = subprocess.run([PY, "-c", code], env=clean_env(), capture_output=True)
    assert r.returncode == 0, r.stderr


# -- output ----------------------------------------------------------------
def test_output_filename_layout_padding_and_empty_files(tmp_path):
    r = run("-n", "11", "--oversubscribe", "--output-filename", "logs", PY, "-c",
            "import os,sys; r=int(os.environ['RANK']); print('out', r);"
            " r % 2 and print('err', r, file=sys.stderr)", cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    for rank in range(11):
        d = tmp_path / "logs" / "1" / f"rank.{rank:02d}"
        assert (d / "stdout").read_text() == f"out {rank}\n"
        assert (d / "stderr").read_text() == (f"err {rank}\n" if rank % 2 else "")
    # still copied to the terminal
    assert sorted(r.stdout.decode().splitlines()) == sorted(f"out {i}" for i in range(11))


def test_output_filename_nocopy_and_nojobid(tmp_path):
    r = run("-n", "2", "--output-filename", f"{tmp_path}/d:nocopy,nojobid", PY, "-c",
            "print('hi')")
    assert r.returncode == 0 and r.stdout == b""
    assert (tmp_path / "d" / "rank.0" / "stdout").read_text() == "hi\n"
    assert (tmp_path / "d" / "rank.1" / "stderr").exists()


def test_merge_stderr_to_stdout_merges_at_the_source(tmp_path):
    r = run("-n", "1", "--merge-stderr-to-stdout", "--output-filename", str(tmp_path), "sh",
            "-c", "echo a; echo b >&2; echo c")
    assert r.returncode == 0
    assert r.stdout == b"a\nb\nc\n" and r.stderr == b""
    d = tmp_path / "1" / "rank.0"
    assert (d / "stdout").read_bytes() == b"a\nb\nc\n"
    assert not (d / "stderr").exists()


def test_tag_output_timestamp_and_prepend_rank():
    r = run("-n", "2", "--tag-output", "sh", "-c", "echo x; echo y >&2")
    assert sorted(r.stdout.decode().splitlines()) == ["[1,0]<stdout>:x", "[1,1]<stdout>:x"]
    assert sorted(r.stderr.decode().splitlines()) == ["[1,0]<stderr>:y", "[1,1]<stderr>:y"]
    r = run("-n", "2", "-l", "sh", "-c", "echo x")
    assert sorted(r.stdout.decode().splitlines()) == ["[0] x", "[1] x"]
    r = run("-n", "1", "--timestamp-output", "--tag-output", "echo", "x")
    assert re.fullmatch(r"\w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4}\[1,0\]<stdout>:x\n",
                        r.stdout.decode()), r.stdout


def test_hydras_disable_hostname_propagation():
    line = ["-n", "1", "sh", "-c", "echo ${PMI_HOSTNAME-unset}"]
    assert run(*line).stdout.decode().split() == [os.uname().nodename]
    assert run("-disable-hostname-propagation", *line).stdout.decode().split() == ["unset"]
    assert run("-nameserver", "localhost:1", *line).returncode == 0


def test_a_pattern_file_may_be_a_device_and_runs_of_restarts_append(tmp_path):
    r = run("-n", "2", "-errfile-pattern", "/dev/null", "sh", "-c", "echo out; echo err >&2")
    assert r.returncode == 0 and r.stderr == b"" and r.stdout == b"out\nout\n", r
    r = run("--max-restarts", "1", "-n", "1", "-outfile-pattern", "o.%r", "sh", "-c",
            "echo run $MSLAUNCH_RESTART_COUNT; exit 1", cwd=str(tmp_path))
    assert r.returncode == 1, r.stderr
    assert (tmp_path / "o.0").read_text() == "run 0\nrun 1\n"


def test_an_unknown_pattern_is_one_error_line():
    r = run("-n", "1", "-outfile-pattern", "out.%x", "true")
    assert r.returncode == 2 and one_error_line(r.stderr).startswith(
        "mslaunch: error: -outfile-pattern 'out.%x': unknown pattern '%x'"), r.stderr


LINE_WRITER = r"""
import os, sys
rank = int(os.environ['RANK'])
for i in range(300):
    # one line written in three pieces, so a naive relay would splice ranks
    for piece in (f'rank{rank}-', f'line{i}-', 'end\n'):
        os.write(1, piece.encode())
"""


def test_lines_of_different_ranks_are_never_spliced():
    r = run("-n", "4", "--oversubscribe", PY, "-c", LINE_WRITER)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.decode().splitlines()
    assert len(lines) == 1200
    for line in lines:
        assert re.fullmatch(r"rank\d-line\d+-end", line), line
    for rank in range(4):
        mine = [line for line in lines if line.startswith(f"rank{rank}-")]
        assert mine == [f"rank{rank}-line{i}-end" for i in range(300)]


def test_binary_data_and_partial_last_line_are_kept_exactly(tmp_path):
    payload = bytes(range(256)) * 64 + b"no newline at the end"
    src = tmp_path / "blob"
    src.write_bytes(payload)
    r = run("-n", "1", "--output-filename", str(tmp_path / "o"), "cat", str(src))
    assert r.stdout == payload
    assert (tmp_path / "o" / "1" / "rank.0" / "stdout").read_bytes() == payload


@pytest.mark.parametrize("pty", ["", "--no-pty"])
def test_every_byte_across_the_read_buffers_growth(tmp_path, pty):
    """The ranks' read buffer starts small and grows once a rank writes fast:
    small writes, a burst, small writes again, in both streams of several
    ranks, arrive byte for byte (the rank files) and in order."""
    code = ("import os, sys\n"
            "r = int(os.environ['OMPI_COMM_WORLD_RANK'])\n"
            "def out(fd, data):\n"
            "    while data:\n"
            "        data = data[os.write(fd, data):]\n"
            "for i in range(50):\n"
            "    out(1, b'%d small %d\\n' % (r, i)); out(2, b'e%d\\n' % i)\n"
            "out(1, bytes(range(256)) * 16384)\n"
            "for i in range(50):\n"
            "    out(1, b'%d after %d\\n' % (r, i))\n"
            "out(1, b'tail without newline')\n")
    args = [pty] if pty else []
    r = run(*args, "-n", "3", "--oversubscribe", "--output-filename", str(tmp_path), PY,
            "-c", code, timeout=120)
    assert r.returncode == 0, r.stderr
    for rank in range(3):
        want = b"".join(b"%d small %d\n" % (rank, i) for i in range(50)) + \
            bytes(range(256)) * 16384 + \
            b"".join(b"%d after %d\n" % (rank, i) for i in range(50)) + b"tail without newline"
        d = tmp_path / "1" / f"rank.{rank}"
        assert (d / "stdout").read_bytes() == want
        assert (d / "stderr").read_bytes() == b"".join(b"e%d\n" % i for i in range(50))


def test_no_byte_lost_when_ranks_exit_right_after_writing(tmp_path):
    code = ("import os; os.write(1, b'x' * 3_000_000); os.write(2, b'y' * 100_000);"
            " os._exit(0)")
    r = run("-n", "3", "--oversubscribe", "--output-filename", str(tmp_path), PY, "-c", code)
    assert r.returncode == 0
    # Unterminated output of different ranks is kept apart by newlines on the
    # terminal; the rank files hold exactly the bytes written.
    assert r.stdout.count(b"x") == 9_000_000 and r.stdout.strip(b"x\n") == b""
    assert r.stderr.count(b"y") == 300_000 and r.stderr.strip(b"y\n") == b""
    for rank in range(3):
        d = tmp_path / "1" / f"rank.{rank}"
        assert (d / "stdout").stat().st_size == 3_000_000
        assert (d / "stderr").stat().st_size == 100_000


def test_partial_lines_of_two_ranks_do_not_splice_on_the_terminal():
    r = run("-n", "2", "sh", "-c", 'printf "from-$RANK"')
    out = r.stdout.decode()
    assert sorted(out.split("\n")) == ["from-0", "from-1"]


@pytest.mark.parametrize("writer", ["yes", "python", "python-no-pty"])
def test_a_closed_reader_ends_an_endless_writer_like_a_shell_pipeline(writer):
    """``yes`` dies of SIGPIPE; Python ignores it and exits 1 of the write's error
    (EIO on its pseudo-terminal, EPIPE on a pipe), as it would in a shell
    pipeline: either way the job ends 141, with no summary blaming a rank."""
    tag = new_tag()
    argv = ["yes"] if writer == "yes" else \
        [*(["--no-pty"] if writer == "python-no-pty" else []), PY, "-c",
         "while True: print(1)"]
    p = start("-n", "2", *argv, env=clean_env(MSL_TEST_TAG=tag))
    try:
        assert p.stdout.readline() in (b"y\n", b"1\n")
        p.stdout.close()
        assert p.wait(timeout=20) == 128 + signal.SIGPIPE
        err = p.stderr.read().decode()
        if writer == "yes":
            assert err == ""
        else:       # the ranks' own tracebacks, as a shell shows them; none of mslaunch's
            assert "Error" in err and "mslaunch:" not in err, err
        assert wait_for(lambda: tagged_pids(tag) == [], 5)
    finally:
        p.kill()
        kill_tagged(tag)


# -- stdin -----------------------------------------------------------------
READ_STDIN = "import os,sys; print(os.environ['RANK'], repr(sys.stdin.read()))"


def test_stdin_goes_to_rank_0_only_by_default():
    r = run("-n", "2", PY, "-c", READ_STDIN, input=b"hello")
    assert sorted(r.stdout.decode().splitlines()) == ["0 'hello'", "1 ''"]


@pytest.mark.parametrize("source", ["file", "devnull", "closed"])
def test_stdin_all_from_files_devices_or_nothing(tmp_path, source):
    data = tmp_path / "in"
    data.write_bytes(b"line\n" * 50000)
    cmd = [PY, "-m", "mslaunch", "-n", "2", "--stdin", "all", "sh", "-c", "wc -c"]
    if source == "closed":
        r = subprocess.run(["sh", "-c", '"$@" <&-', "sh", *cmd], capture_output=True,
                           env=clean_env(), timeout=60)
    else:
        with open(data if source == "file" else os.devnull, "rb") as f:
            r = subprocess.run(cmd, stdin=f, capture_output=True, env=clean_env(), timeout=60)
    assert r.returncode == 0, r.stderr
    want = "250000" if source == "file" else "0"
    assert r.stdout.decode().split() == [want, want]


def test_closed_stdout_and_stdin_of_mslaunch_are_harmless():
    r = subprocess.run(["sh", "-c", '"$@" >&- <&-', "sh", PY, "-m", "mslaunch", "-n", "1",
                        "sh", "-c", "cat; echo done >&2"],
                       capture_output=True, env=clean_env(), timeout=60)
    assert r.returncode == 0
    assert r.stderr == b"done\n"


def test_stdin_all_none_and_rank():
    r = run("-n", "3", "--oversubscribe", "--stdin", "all", PY, "-c", READ_STDIN,
            input=b"data\n" * 1000)
    assert sorted(r.stdout.decode().splitlines()) == [f"{i} {'data' + chr(10)!r}".replace(
        "'data\\n'", repr("data\n" * 1000)) for i in range(3)]
    r = run("-n", "2", "--stdin", "none", PY, "-c", READ_STDIN, input=b"x")
    assert sorted(r.stdout.decode().splitlines()) == ["0 ''", "1 ''"]
    r = run("-n", "2", "--stdin", "1", PY, "-c", READ_STDIN, input=b"x")
    assert sorted(r.stdout.decode().splitlines()) == ["0 ''", "1 'x'"]


# -- failures and exit codes -----------------------------------------------
def test_first_failure_aborts_the_job_with_its_exit_code_and_summary():
    tag = new_tag()
    code = ("import os,sys,time; r=int(os.environ['RANK'])\n"
            "if r == 1:\n"
            "    time.sleep(0.3); print('boom happened', file=sys.stderr); sys.exit(3)\n"
            "time.sleep(30)\n")
    t0 = time.monotonic()
    r = run("-n", "3", "--oversubscribe", "--grace", "2", PY, "-c", code,
            env=clean_env(MSL_TEST_TAG=tag))
    elapsed = time.monotonic() - t0
    try:
        assert r.returncode == 3
        assert elapsed < 15
        err = r.stderr.decode()
        assert re.search(r"mslaunch: rank 1 \(pid \d+ on \S+\) exited with code 3", err), err
        assert "boom happened" in err
        assert all_gone(tag), tagged_pids(tag)
    finally:
        kill_tagged(tag)


def test_signal_death_gives_128_plus_signal():
    r = run("-n", "2", "--grace", "1", "sh", "-c",
            'if [ $RANK = 1 ]; then kill -SEGV $$; fi; sleep 20')
    assert r.returncode == 128 + signal.SIGSEGV
    assert b"killed by signal 11 (SIGSEGV)" in r.stderr


PIPE_PEERS = """
import os, signal, sys
if os.environ["RANK"] == "1":
    f = os.open(sys.argv[1], os.O_RDONLY)
    os.read(f, 1)
    os.kill(os.getpid(), signal.SIGSEGV)
signal.signal(signal.SIGPIPE, signal.SIG_DFL)
f = os.open(sys.argv[1], os.O_WRONLY)
while True:
    os.write(f, b"x" * 4096)
"""


def test_a_peer_s_death_is_the_cause_not_the_broken_pipe_it_leaves(tmp_path):
    """Rank 0 writes to rank 1, which dies: rank 0 dies of SIGPIPE in the same
    instant, seen in either order; the death is the cause, the SIGPIPE what followed."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    r = run("-n", "2", PY, "-c", PIPE_PEERS, str(fifo))
    err = r.stderr.decode()
    assert r.returncode == 128 + signal.SIGSEGV, err
    assert re.search(r"mslaunch: rank 1 \(pid \d+ on \S+\) was killed by signal 11", err), err


#: Rank 0 releases its descriptors half a second before its exit can be seen (its
#: main thread ends alone; a thread with a table of its own exits later), as a
#: crashed rank's sockets close before its exit on a busy machine; rank 1, its
#: peer, exits 1 when rank 0's end of a FIFO closes, 0.2 s later.
EARLY_CLOSE = """
import ctypes, os, platform, signal, sys, threading, time
if os.environ["RANK"] == "1":
    f = os.open(sys.argv[1], os.O_RDONLY)
    while os.read(f, 4096):
        pass
    time.sleep(0.2)
    sys.exit(1)
signal.signal(signal.SIGTERM, signal.SIG_IGN)      # the stop rank 1's exit brings
f = os.open(sys.argv[1], os.O_WRONLY)
libc = ctypes.CDLL(None, use_errno=True)
alone = threading.Event()

def linger():
    assert libc.unshare(0x400) == 0                 # CLONE_FILES
    os.close(f)
    try:
        os.close(1023)                              # the life pipe's copy
    except OSError:
        pass
    alone.set()
    time.sleep(0.5)
    os._exit(3)

threading.Thread(target=linger).start()
alone.wait()
libc.syscall({"x86_64": 60, "aarch64": 93}[platform.machine()], 0)   # SYS_exit: this thread
"""


def test_a_rank_is_dated_by_its_descriptors_close_not_by_its_exit_seen_later(tmp_path):
    """The peer that exits of rank 0's closed FIFO, after its close and before its
    exit is seen, is what followed: rank 0 is the cause (machine.spawn.life_pipe)."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    r = run("-n", "2", "--grace", "5", PY, "-c", EARLY_CLOSE, str(fifo))
    err = r.stderr.decode()
    assert r.returncode == 3, err
    assert re.search(r"mslaunch: rank 0 \(pid \d+ on \S+\) exited with code 3", err), err
    assert re.search(r"then rank 1 \(pid \d+ on \S+\) exited with code 1, \d+ ms later", err), err


@pytest.mark.parametrize("flags", [
    ["-mca", "orte_abort_on_non_zero_status", "0"],
    ["--mca", "orte_abort_on_non_zero_status", "false"],
    ["--prtemca", "state_base_error_non_zero_exit", "0"],
    ["--runtime-options", "error-nonzero-status=false"],
    ["-disable-auto-cleanup"],
    [],  # via the environment variable below
])
def test_keep_going_runs_every_rank_to_the_end(flags, tmp_path):
    env = clean_env()
    if not flags:
        env["OMPI_MCA_orte_abort_on_non_zero_status"] = "0"
    # Rank 1 ends once mslaunch has reaped rank 2 (its /proc entry is gone).
    code = ("import os,sys,time; r=int(os.environ['RANK']); d=sys.argv[1]\n"
            "open(f'{d}/pid{r}', 'w').write(str(os.getpid())); open(f'{d}/done{r}', 'w').close()\n"
            "if r == 1:\n"
            "    while not os.path.exists(f'{d}/pid2') or not open(f'{d}/pid2').read():\n"
            "        time.sleep(0.01)\n"
            "    while os.path.exists('/proc/' + open(f'{d}/pid2').read()):\n"
            "        time.sleep(0.01)\n"
            "sys.exit({0: 0, 1: 5, 2: 4}[r])\n")
    r = run(*flags, "-n", "3", "--oversubscribe", PY, "-c", code, str(tmp_path), env=env)
    assert sorted(os.listdir(tmp_path)) == ["done0", "done1", "done2", "pid0", "pid1", "pid2"]
    assert r.returncode == 4  # rank 2 ends first with 4; rank 1's 5 comes later
    assert b"2 of 3 rank(s) failed" in r.stderr


def test_abort_kills_grandchildren_in_the_rank_process_group():
    tag = new_tag()
    code = 'if [ $RANK = 1 ]; then sleep 0.5; exit 2; fi; sleep 60 & sleep 61 & wait'
    try:
        r = run("-n", "2", "--grace", "1", "sh", "-c", code, env=clean_env(MSL_TEST_TAG=tag))
        assert r.returncode == 2
        assert wait_for(lambda: tagged_pids(tag) == [], 3)
    finally:
        kill_tagged(tag)


def test_leftover_children_of_a_successful_rank_are_not_orphaned():
    tag = new_tag()
    try:
        r = run("-n", "1", "--grace", "1", "sh", "-c", "sleep 60 & echo started",
                env=clean_env(MSL_TEST_TAG=tag), timeout=20)
        assert r.returncode == 0 and r.stdout == b"started\n"
        assert wait_for(lambda: tagged_pids(tag) == [], 3)
    finally:
        kill_tagged(tag)


def test_daemons_that_left_their_rank_group_do_not_outlive_the_job():
    tag = new_tag()
    daemon = ("import os, time\n"
              "if os.fork() == 0:\n"
              "    os.setsid(); os.closerange(0, 3); time.sleep(60)\n"
              "print('started', flush=True)\n")
    try:
        r = run("-n", "1", "--grace", "1", PY, "-c", daemon, env=clean_env(MSL_TEST_TAG=tag),
                timeout=30)
        assert r.returncode == 0 and r.stdout == b"started\n"
        assert wait_for(lambda: tagged_pids(tag) == [], 5), tagged_pids(tag)
    finally:
        kill_tagged(tag)


def test_running_out_of_descriptors_is_one_error_line_and_no_orphans():
    import resource
    tag = new_tag()

    def low_limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (48, 48))

    try:
        r = subprocess.run([PY, "-m", "mslaunch", "-n", "40", "--oversubscribe", "sleep", "60"],
                           env=clean_env(MSL_TEST_TAG=tag), capture_output=True, timeout=60,
                           preexec_fn=low_limit)
        assert r.returncode != 0
        assert "too many open files" in one_error_line(r.stderr)
        assert wait_for(lambda: tagged_pids(tag) == [], 10), tagged_pids(tag)
    finally:
        kill_tagged(tag)


def test_sigkilled_launcher_leaves_no_orphans(tmp_path):
    tag = new_tag()
    code = "sleep 60 & sleep 61 & echo up > $0/up$RANK; wait"
    p = start("-n", "2", "sh", "-c", code, str(tmp_path), env=clean_env(MSL_TEST_TAG=tag))
    try:
        assert wait_for(lambda: len(os.listdir(tmp_path)) == 2, 10)
        assert len(tagged_pids(tag)) >= 6
        p.kill()
        p.wait()
        assert wait_for(lambda: tagged_pids(tag) == [], 10), tagged_pids(tag)
    finally:
        p.kill()
        kill_tagged(tag)


def test_timeout_kills_the_job_with_exit_110():
    tag = new_tag()
    try:
        t0 = time.monotonic()
        r = run("-n", "2", "--timeout", "1", "--grace", "1", "sleep", "30",
                env=clean_env(MSL_TEST_TAG=tag))
        assert r.returncode == 110
        assert time.monotonic() - t0 < 10
        assert b"timed out after 1 s" in r.stderr
        assert all_gone(tag), tagged_pids(tag)
        r = run("-n", "1", "sleep", "30", env=clean_env(MSL_TEST_TAG=tag, MPIEXEC_TIMEOUT="1"))
        assert r.returncode == 110
    finally:
        kill_tagged(tag)


def _signal_job(tmp_path, sig, leave="yes", second=None, grace=2):
    tag = new_tag()
    p = start("-n", "2", "--grace", str(grace), PY, program("trap.py"), str(tmp_path), leave,
              env=clean_env(MSL_TEST_TAG=tag))
    try:
        for r in range(2):
            assert wait_lines(str(tmp_path / f"rank{r}.log"), 1)
        signalled = time.monotonic()
        p.send_signal(sig)
        if second:
            for r in range(2):                  # the first reached the ranks (as SIGTERM)
                assert wait_lines(str(tmp_path / f"rank{r}.log"), 2)
            p.send_signal(second)
        out, err = p.communicate(timeout=20)
        took = time.monotonic() - signalled
        logs = [(tmp_path / f"rank{r}.log").read_text().split() for r in range(2)]
        return p.returncode, logs, err, tag, took
    finally:
        p.kill()
        kill_tagged(tag)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_stop_signals_stop_the_ranks_with_sigterm(tmp_path, sig):
    rc, logs, err, tag, _ = _signal_job(tmp_path, sig)
    assert all(log == ["ready", "SIGTERM"] for log in logs), logs
    assert rc == 128 + sig
    assert all_gone(tag), tagged_pids(tag)


def test_ranks_ignoring_sigterm_are_killed_after_grace(tmp_path):
    rc, logs, err, tag, took = _signal_job(tmp_path, signal.SIGTERM, leave="no")
    assert logs == [["ready", "SIGTERM"]] * 2
    assert rc == 128 + signal.SIGTERM
    assert 1.9 < took < 15
    assert all_gone(tag), tagged_pids(tag)


def test_second_sigint_kills_at_once(tmp_path):
    rc, logs, err, tag, took = _signal_job(tmp_path, signal.SIGINT, leave="no",
                                           second=signal.SIGINT, grace=60)
    assert logs == [["ready", "SIGTERM"]] * 2
    assert took < 40  # the second Ctrl-C kills long before the 60 s grace is over
    assert rc == 128 + signal.SIGINT


def test_usr1_and_usr2_are_forwarded(tmp_path):
    tag = new_tag()
    p = start("-n", "2", PY, program("trap.py"), str(tmp_path), env=clean_env(MSL_TEST_TAG=tag))
    try:
        for r in range(2):
            assert wait_lines(str(tmp_path / f"rank{r}.log"), 1)
        p.send_signal(signal.SIGUSR1)
        for r in range(2):
            assert wait_lines(str(tmp_path / f"rank{r}.log"), 2)
        p.send_signal(signal.SIGUSR2)
        for r in range(2):
            assert wait_lines(str(tmp_path / f"rank{r}.log"), 3)
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=20)
        for r in range(2):
            assert (tmp_path / f"rank{r}.log").read_text().split() == \
                ["ready", "SIGUSR1", "SIGUSR2", "SIGTERM"]
    finally:
        p.kill()
        kill_tagged(tag)


# -- placement, binding, hosts ----------------------------------------------
def test_too_many_ranks_is_an_error_naming_slots_and_oversubscribe():
    r = run("-H", "localhost:2", "-n", "3", "true")
    assert r.returncode == 1
    line = one_error_line(r.stderr)
    assert "3 ranks" in line and "2 slots" in line and "--oversubscribe" in line


@pytest.mark.parametrize("argv", [["-n", "1", "true"],
                                  ["--worker_num=1", "--local_worker_num=1", "true"]],
                         ids=["mpirun", "msrun"])
def test_a_switch_set_to_neither_on_nor_off_is_one_error_line(argv):
    r = run(*argv, env=clean_env(MSLAUNCH_PTY="off", MSLAUNCH_OUTPUT_TLS="tls"))
    assert r.returncode == 2
    assert one_error_line(r.stderr) == ("mslaunch: error: MSLAUNCH_OUTPUT_TLS='tls': not a "
                                        "switch value (on: 1, yes, true, on; off: 0, no, "
                                        "false, off)")


def test_bind_to_core_sets_affinity_and_report_bindings():
    ncpu = len(os.sched_getaffinity(0))
    r = run("-n", "2", "--oversubscribe", "--bind-to", "core", "--report-bindings", PY, "-c",
            "import os; print(os.environ['RANK'], sorted(os.sched_getaffinity(0)))")
    assert r.returncode == 0, r.stderr
    got = dict(line.split(" ", 1) for line in r.stdout.decode().splitlines())
    assert got == {str(i): str([i % ncpu]) for i in range(2)}
    # Open MPI 4.1.4's own line.
    lines = sorted(r.stderr.decode().splitlines())
    assert re.fullmatch(r"\[\S+:\d+\] MCW rank 0 bound to socket 0\[core 0\[hwt 0(-\d)?\]\]: "
                        r"\[B+(/\.+)*\].*", lines[0]), lines
    r = run("-n", "1", "-bind-to", "none", PY, "-c",
            "import os; print(len(os.sched_getaffinity(0)))")
    assert r.stdout.decode().strip() == str(ncpu)


def test_dry_run_starts_nothing_and_display_map(tmp_path):
    marker = tmp_path / "ran"
    r = run("--dry-run", "-H", "node01:2,node02:2", "--map-by", "node", "-n", "4",
            "touch", str(marker))
    assert r.returncode == 0, r.stderr
    assert not marker.exists()
    out = r.stdout.decode()
    assert "Data for node: node01" in out and "Data for node: node02" in out
    assert re.search(r"rank 0 on node01", out) and re.search(r"rank 1 on node02", out)
    r = run("--display-map", "-n", "1", "true")
    assert r.returncode == 0 and b"JOB MAP" in r.stdout


def test_hostfile_with_local_names_runs_without_ssh(tmp_path):
    # (Remote names are tested on real SSH hosts in test_remote.py: a name
    # that is not one would be looked up in the DNS.)
    hf = tmp_path / "hosts"
    hf.write_text(f"localhost slots=2  # this machine\n{os.uname().nodename}:1\n")
    r = run("--hostfile", str(hf), PY, "-c", "import os; print(os.environ['RANK'])")
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.decode().split()) == ["0", "1", "2"]


def test_this_machines_own_addresses_run_locally():
    from mslaunch.hosts.local import _local_ipv4_addresses
    own = sorted(a for a in _local_ipv4_addresses() if not a.startswith("127."))
    addr = own[0] if own else "127.0.0.1"
    r = run("-H", f"{addr}:1", "sh", "-c", "echo $RANK")
    assert r.returncode == 0, r.stderr
    assert r.stdout == b"0\n"


def test_double_dash_ends_the_options():
    r = run("-n", "1", "--", "echo", "-n", "x")
    assert r.returncode == 0 and r.stdout == b"x"


def test_slurm_allocation_sizes_the_job(tmp_path):
    env = clean_env(SLURM_JOB_NODELIST="localhost", SLURM_TASKS_PER_NODE="3",
                    SLURM_JOB_NUM_NODES="1")
    r = run(PY, "-c", "import os; print(os.environ['RANK'])", env=env)
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.decode().split()) == ["0", "1", "2"]


def test_pbs_nodefile_sizes_the_job(tmp_path):
    nodes = tmp_path / "nodes"
    nodes.write_text("localhost\nlocalhost\n")
    r = run(PY, "-c", "import os; print(os.environ['WORLD_SIZE'])",
            env=clean_env(PBS_NODEFILE=str(nodes)))
    assert r.stdout.decode().split() == ["2", "2"]


# -- bad input ---------------------------------------------------------------
@pytest.mark.parametrize("args, words", [
    (["--frobnicate", "true"], "unknown option '--frobnicate'"),
    ([], "no program"),
    (["-n", "2"], "no program"),
    (["-n", "zero", "true"], "-n: expected a whole number"),
    (["-n", "-1", "true"], "-n: must be at least 0"),
    (["--timeout", "3 s", "true"], "--timeout"),
    (["--map-by", "diagonal", "true"], "--map-by diagonal"),
    (["--bind-to", "moon", "true"], "--bind-to moon"),
    (["-H", "a:x", "true"], "-H"),
    (["--hostfile", "/nonexistent/hosts", "true"], "/nonexistent/hosts"),
    (["-n", "1", "true", ":", "true"], "MPMD"),
    (["--stdin", "many", "true"], "--stdin"),
    (["-x"], "-x: missing value"),
    (["--timeout", "1e300", "true"], "--timeout"),
    (["--grace", "inf", "true"], "--grace"),
    (["-n", "99999999999", "--oversubscribe", "true"], "-n: at most"),
    (["-n", "2", "--stdin", "5", "true"], "--stdin 5"),
    (["-wdir", "", "true"], "empty directory"),
    (["--preload-files", "/nonexistent/f", "true"], "--preload-files /nonexistent/f: no such file"),
    (["--preload-files", "/", "true"], "--preload-files /: not a file"),
    (["-iface", "eth0", "true"], "-iface: not supported by mslaunch: set the MPI library's"),
    (["-info"], "-info: not supported by mslaunch"),
    (["-n", "1", "--"], "after '--'"),
])
def test_bad_input_gives_one_error_line_and_status_2(args, words):
    r = run(*args)
    assert r.returncode == 2, r.stderr
    assert words in one_error_line(r.stderr)


def test_malformed_hostfile_names_file_and_line(tmp_path):
    hf = tmp_path / "hf"
    hf.write_text("# ok\nnode01 slots=2\nnode02 slots=abc\n")
    r = run("--hostfile", str(hf), "true")
    assert r.returncode == 2
    assert f"{hf}:3:" in one_error_line(r.stderr)


def test_missing_program_is_reported_before_anything_starts(tmp_path):
    marker = tmp_path / "ran"
    r = run("-n", "1", "touch", str(marker), ":", "-n", "1", "no-such-program-xyz")
    assert r.returncode == 127
    assert "no-such-program-xyz" in one_error_line(r.stderr)
    assert not marker.exists()


def test_verbose_names_each_started_rank():
    r = run("-v", "-n", "2", "true")
    assert r.returncode == 0
    assert re.findall(rb"started rank (\d) \(pid \d+\) on \S+: true", r.stderr) == [b"0", b"1"]


def test_help_and_version():
    r = run("--help")
    assert r.returncode == 0 and b"--output-filename" in r.stdout
    r = run("-V")
    assert r.returncode == 0 and r.stdout.startswith(b"mslaunch ")


def test_help_into_a_closed_pipe_ends_quietly_as_sigpipe_would():
    # ``mslaunch --help | true``: the reader is gone before the text is written
    read, write = os.pipe()
    os.close(read)
    try:
        r = subprocess.run(cmd("--help"), stdout=write, stderr=subprocess.PIPE, timeout=60,
                           env=clean_env())
    finally:
        os.close(write)
    assert r.returncode == 128 + signal.SIGPIPE and r.stderr == b"", r.stderr


@pytest.mark.parametrize("args, code", [(["--version"], 0), (["--bogus"], 2),
                                        (["--dry-run", "-n", "2", "true"], 0),
                                        (["-n", "1", "true"], 0)])
def test_a_command_started_with_stdout_and_stderr_closed_says_nothing_and_ends_as_told(
        args, code):
    # (Python, started so, has no sys.stdout: it writes to /dev/null instead)
    r = subprocess.run(["sh", "-c", '"$@" >&- 2>&-; echo $?', "sh", *cmd(*args)],
                       capture_output=True, timeout=60, env=clean_env())
    assert r.stdout == f"{code}\n".encode(), (r.stdout, r.stderr)
    # and with stdout closed alone, stderr says no error
    r = subprocess.run(["sh", "-c", '"$@" >&-; echo $?', "sh", *cmd(*args)],
                       capture_output=True, timeout=60, env=clean_env())
    assert r.stdout == f"{code}\n".encode(), (r.stdout, r.stderr)
    assert (r.stderr == b"") == (code == 0), r.stderr


TTY_RANK = r"""
import os, signal, sys, time
rank = os.environ['RANK']
for s in (signal.SIGINT, signal.SIGTERM):
    signal.signal(s, lambda n, f: (print(f'rank{rank} got {signal.Signals(n).name}', flush=True),
                                   os._exit(0)))
print(f'rank{rank} ready', flush=True)
if rank == '0':
    print('rank0 read ' + sys.stdin.readline().strip(), flush=True)
# Short sleeps: a signal that lands after Python's last look at its signals
# and before the sleep's system call begins runs its handler only once that
# sleep ends.  The test's Ctrl-C follows rank 0's print at once, so under load
# it hit that window and the rank was SIGKILLed after the grace (mpirun would
# have done the same to it).
for _ in range(600):
    time.sleep(0.1)
"""


def test_terminal_stdin_reaches_rank_0_and_ctrl_c_stops_the_job():
    import pty
    tag = new_tag()
    env = clean_env(MSL_TEST_TAG=tag)
    pid, master = pty.fork()
    if pid == 0:  # the child: mslaunch as the terminal's foreground job
        os.execve(PY, [PY, "-m", "mslaunch", "-n", "2", PY, "-c", TTY_RANK], env)
    seen = b""

    def expect(text: bytes, timeout: float = 20) -> None:
        nonlocal seen
        deadline = time.monotonic() + timeout
        while text not in seen and time.monotonic() < deadline:
            import select
            if select.select([master], [], [], 0.1)[0]:
                try:
                    seen += os.read(master, 4096)
                except OSError:
                    break
        assert text in seen, seen

    try:
        expect(b"rank0 ready")
        expect(b"rank1 ready")
        os.write(master, b"hello\n")
        expect(b"rank0 read hello")
        os.write(master, b"\x03")           # Ctrl-C typed at the terminal
        expect(b"rank0 got SIGTERM")       # stopped as Open MPI stops them
        expect(b"rank1 got SIGTERM")
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 128 + signal.SIGINT
        assert wait_for(lambda: tagged_pids(tag) == [], 5)
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except OSError:
            pass
        os.close(master)
        kill_tagged(tag)


def test_a_job_run_with_and_waits_for_fg_to_read_the_terminal(tmp_path):
    # `mslaunch ... &` in an interactive shell, then keys typed while the shell's
    # next command runs: mslaunch, whose stdin is the terminal, must not read them
    # (the terminal would stop it: "Stopped (tty input)") until `fg` makes it the
    # foreground job again, when its rank gets what is typed.
    import shutil
    from requires import require
    require(shutil.which("tmux") is not None, "tmux (apt-get install tmux)")
    tag = new_tag()
    tmux = ["tmux", "-L", f"msl-bg-{tag[:12]}", "-f", "/dev/null"]
    env = clean_env(MSL_TEST_TAG=tag)
    env.pop("TMUX", None)
    env["PATH"] = f"{os.path.dirname(PY)}:{env['PATH']}"
    pidfile, go = tmp_path / "pid", tmp_path / "go"

    def screen() -> str:
        return subprocess.run(tmux + ["capture-pane", "-p", "-t", "bg"], capture_output=True,
                              timeout=30).stdout.decode()

    def keys(*what: str) -> None:
        subprocess.run(tmux + ["send-keys", "-t", "bg", *what], check=True, timeout=30)

    def stat(pid: int) -> list:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()

    def stopped(pid: int) -> bool:
        return stat(pid)[0] == "T"

    def foreground(pid: int) -> bool:
        fields = stat(pid)
        return fields[5] == fields[2]       # the terminal's process group is its own

    try:
        subprocess.run(tmux + ["new-session", "-d", "-x", "150", "-y", "30", "-s", "bg",
                               "bash --norc --noprofile -i"], check=True, env=env, timeout=30)
        # the shell's next command holds the terminal (and reads nothing) until `go`
        keys(f"mslaunch -n 1 sh -c 'read l; echo got:$l' & echo $! > {pidfile}; "
             f"while [ ! -e {go} ]; do sleep 0.05; done", "Enter")
        assert wait_for(lambda: any(b"read l" in cmdline(pid) for pid in tagged_pids(tag)),
                        30), screen()                          # its rank runs
        # the rank may run before the shell has written `$!`: wait for the whole line
        assert wait_for(lambda: pidfile.exists() and pidfile.read_text().endswith("\n"),
                        30), screen()
        launcher = int(pidfile.read_text())
        keys("x", "Enter")              # a line waits in the terminal, which mslaunch may read
        assert not wait_for(lambda: stopped(launcher), 2), "stopped by the terminal"
        go.touch()                      # the shell reads "x" (command not found)
        keys("jobs -l", "Enter")
        assert wait_for(lambda: re.search(r"\d+ (Running|Stopped)", screen()), 30), screen()
        assert re.search(r"\d+ Running .*mslaunch -n 1", screen()), screen()
        keys("fg", "Enter")
        # Typed before the shell has run `fg`, the line would go to the shell's
        # readline, which takes in what is already typed as it reads its own line.
        assert wait_for(lambda: foreground(launcher), 30), screen()
        keys("hello", "Enter")
        assert wait_for(lambda: "got:hello" in screen(), 30), screen()
        # the job ends, and its guard with its cgroup (the shell and tmux carry the tag too)
        assert wait_for(lambda: not any(b"mslaunch" in cmdline(pid) for pid in tagged_pids(tag)),
                        30)
    finally:
        subprocess.run(tmux + ["kill-server"], capture_output=True, timeout=30)
        kill_tagged(tag)
