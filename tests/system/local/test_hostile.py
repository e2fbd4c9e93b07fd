"""Promises kept under hostile conditions: stalled readers, write errors, escaping
processes, hostile PMI peers, huge sizes, odd environments (one test or more per
observed break)."""

from __future__ import annotations

import fcntl
import os
import random
import resource
import select
import signal
import socket
import subprocess
import threading
import time
from typing import List

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import (PY, REPO, bytes_written, clean_env, cmd, kill_tagged, new_tag, one_error_line,
                     run, signal_pending, start, tagged_pids, wait_for, wait_pid)

from mslaunch.machine.terminal import HIGH_WATER

FLOOD = "import sys\nwhile True: sys.stdout.write('x' * 800 + '\\n')"


def _flooded(tag: str) -> bool:
    """Whether mslaunch holds output of its FLOOD ranks that nobody reads: once they
    have written more than its queue's high-water mark, all of it but what its
    reader's pipe or terminal took (1 MiB at most) and what waits in the ranks'
    own pipes is queued, and its ranks' output is no longer read."""
    ranks = []
    for pid in tagged_pids(tag):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f.read().split(b"\0")[1:2] == [b"-c"]:       # not mslaunch -m ...
                    ranks.append(pid)
        except OSError:
            pass
    return sum(bytes_written(pid) for pid in ranks) > HIGH_WATER


def _no_orphans(tag: str, timeout: float = 10) -> None:
    assert wait_for(lambda: tagged_pids(tag) == [], timeout), tagged_pids(tag)


# -- 1. a stalled reader of mslaunch's output -------------------------------------

def test_a_stalled_reader_does_not_delay_the_timeout():
    tag = new_tag()
    r, w = os.pipe()                       # nobody reads this until mslaunch has ended
    p = subprocess.Popen(cmd("--timeout", "2", "--grace", "1", "-n", "2", PY, "-c", FLOOD),
                         stdout=w, stderr=subprocess.PIPE, env=clean_env(MSL_TEST_TAG=tag))
    os.close(w)
    try:
        p.wait(timeout=30)
        err = p.stderr.read().decode()
        assert p.returncode == 110, err
        assert "timed out after 2 s" in err
        assert "not delivered" in err
        assert "Traceback" not in err
        _no_orphans(tag)
    finally:
        p.kill()
        p.wait()
        os.close(r)
        kill_tagged(tag)


def test_sigterm_is_served_while_the_reader_stalls():
    tag = new_tag()
    r, w = os.pipe()
    p = subprocess.Popen(cmd("--grace", "1", "-n", "2", PY, "-c", FLOOD), stdout=w,
                         stderr=subprocess.PIPE, env=clean_env(MSL_TEST_TAG=tag))
    os.close(w)
    try:
        # Wait until the pipe is full and mslaunch's own queue holds output.
        assert wait_for(lambda: _flooded(tag), 30)
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=30)
        assert p.returncode == 128 + signal.SIGTERM
        _no_orphans(tag)
    finally:
        p.kill()
        p.wait()
        os.close(r)
        kill_tagged(tag)


def test_double_ctrl_c_on_a_terminal_nobody_reads():
    import pty
    tag = new_tag()
    env = clean_env(MSL_TEST_TAG=tag)
    pid, master = pty.fork()
    if pid == 0:
        os.execve(PY, [PY, "-m", "mslaunch", "-n", "2", PY, "-c", FLOOD], env)
    try:
        # the terminal's buffer fills (never read here), and mslaunch's queue
        assert wait_for(lambda: _flooded(tag), 30)
        os.kill(pid, signal.SIGINT)
        # two Ctrl-Cs, not one: the first is delivered before the second is sent
        assert wait_for(lambda: not signal_pending(pid, signal.SIGINT), 10)
        os.kill(pid, signal.SIGINT)
        status = wait_pid(pid, 30)
        assert status is not None and os.waitstatus_to_exitcode(status) == 128 + signal.SIGINT
        _no_orphans(tag)
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except OSError:
            pass
        os.close(master)
        kill_tagged(tag)


# -- 2. a setsid child that keeps a rank's stdout ---------------------------------

def test_setsid_child_holding_stdout_is_stopped_without_a_crash():
    tag = new_tag()
    r = run("-n", "1", "bash", "-c", "setsid sleep 30 & exit 0", ":", "-n", "1", "true",
            env=clean_env(MSL_TEST_TAG=tag))
    try:
        assert r.returncode == 0, r.stderr
        assert b"Traceback" not in r.stderr and b"Errno" not in r.stderr
        _no_orphans(tag)
    finally:
        kill_tagged(tag)


def test_setsid_child_with_a_hung_rank_and_timeout_gives_110():
    tag = new_tag()
    r = run("--timeout", "2", "--grace", "1", "-n", "1", "bash", "-c",
            "setsid sleep 30 & sleep 60", env=clean_env(MSL_TEST_TAG=tag))
    try:
        assert r.returncode == 110, r.stderr
        assert b"Traceback" not in r.stderr
        _no_orphans(tag)
    finally:
        kill_tagged(tag)


def test_setsid_child_does_not_hide_the_failure_summary():
    tag = new_tag()
    r = run("-n", "1", "bash", "-c", "setsid sleep 30 & echo oops >&2; exit 5",
            env=clean_env(MSL_TEST_TAG=tag))
    try:
        assert r.returncode == 5, r.stderr
        err = r.stderr.decode()
        assert "exited with code 5" in err and "oops" in err
        _no_orphans(tag)
    finally:
        kill_tagged(tag)


# -- 3. output that cannot be written ----------------------------------------------

def test_stdout_on_a_full_device_is_one_error_line_and_stops_the_job():
    tag = new_tag()
    with open("/dev/full", "wb") as full:
        p = subprocess.run(cmd("-n", "2", "sh", "-c", "echo hello; sleep 30"), stdout=full,
                           stderr=subprocess.PIPE, env=clean_env(MSL_TEST_TAG=tag), timeout=60)
    try:
        err = p.stderr.decode()
        assert p.returncode == 1, err
        assert "mslaunch: error: cannot write to mslaunch's stdout: No space left on device" \
            in err
        assert "Traceback" not in err
        _no_orphans(tag)
    finally:
        kill_tagged(tag)


def test_a_rank_file_over_the_file_size_limit_stops_the_job(tmp_path):
    tag = new_tag()

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, resource.RLIM_INFINITY))

    code = "import sys, time\nsys.stdout.write('y' * 300000)\nsys.stdout.flush()\ntime.sleep(30)"
    p = subprocess.run(cmd("-n", "1", "--output-filename", str(tmp_path / "out"), PY, "-c", code),
                       capture_output=True, env=clean_env(MSL_TEST_TAG=tag), preexec_fn=limit,
                       timeout=60)
    try:
        err = p.stderr.decode()
        assert p.returncode == 1, err
        assert f"cannot write {tmp_path}/out/1/rank.0/stdout: File too large" in err
        assert "Traceback" not in err
        _no_orphans(tag)
    finally:
        kill_tagged(tag)


def test_a_non_blocking_stdout_is_waited_on_and_gets_every_byte():
    r, w = os.pipe()
    fcntl.fcntl(w, fcntl.F_SETFL, fcntl.fcntl(w, fcntl.F_GETFL) | os.O_NONBLOCK)
    code = "import sys\nfor i in range(2000): sys.stdout.write(str(i % 10) * 1023 + '\\n')"
    p = subprocess.Popen(cmd("-n", "1", PY, "-c", code), stdout=w, stderr=subprocess.PIPE,
                         env=clean_env())
    os.close(w)
    got = bytearray()
    try:
        while True:
            time.sleep(0.002)              # a slow reader
            chunk = os.read(r, 65536)
            if not chunk:
                break
            got += chunk
        p.wait(timeout=60)
        assert p.returncode == 0, p.stderr.read()
        assert len(got) == 2000 * 1024
        assert got == b"".join(str(i % 10).encode() * 1023 + b"\n" for i in range(2000))
    finally:
        p.kill()
        p.wait()
        os.close(r)


# -- 4. idle connections to the -pmi-port listener ----------------------------------

ATTACKED_RANK = """
import os, sys, time
if os.environ['RANK'] == '0':
    with open(sys.argv[1] + '.tmp', 'w') as f:
        f.write(os.environ['PMI_PORT'])
    os.rename(sys.argv[1] + '.tmp', sys.argv[1])
time.sleep(2.0)
from mpi4py import MPI
c = MPI.COMM_WORLD
print('sum', c.allreduce(c.rank + 1), flush=True)
"""


GUESSED_RANK = """
import os, sys, time
path = sys.argv[1] + '.' + os.environ['PMI_RANK']
with open(path + '.new', 'w') as f:        # whole once it is there: renamed when written
    f.write(os.environ['PMI_PORT'] + ' ' + os.environ['PMI_ID'])
os.rename(path + '.new', path)
while not os.path.exists(sys.argv[1] + '.go'):
    time.sleep(0.01)
from mpi4py import MPI
MPI.COMM_WORLD.barrier()
"""


def _guessed_job(base: str, tag: str):
    """A two-rank job serving PMI over TCP whose ranks wait for ``BASE.go`` before
    MPI_Init: the launcher, the PMI port and rank 1's secret."""
    p = start("-pmi-port", "-n", "2", PY, "-c", GUESSED_RANK, base,
              env=clean_env(MSL_TEST_TAG=tag))
    try:
        assert wait_for(lambda: all(os.path.exists(f"{base}.{r}") for r in (0, 1)), 60)
        where, secret = open(f"{base}.1").read().split()
        return p, int(where.rsplit(":", 1)[1]), int(secret)
    except BaseException:        # (the job is the caller's only once it is returned)
        p.kill()
        p.communicate()
        kill_tagged(tag)
        raise


def test_a_wrong_pmi_id_is_answered_late_and_real_ranks_still_join(mpich, tmp_path):
    # A process that may reach the PMI port guesses the 31-bit PMI_IDs of ranks not
    # yet in MPI_Init: each wrong guess is answered (its connection closed) only
    # seconds later, and a real rank from the same address still joins at once.
    base = str(tmp_path / "rank")
    tag = new_tag()
    p, port, secret = _guessed_job(base, tag)
    try:
        guesses = []
        for i in range(40):
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            s.sendall(f"cmd=initack pmiid={secret % (2**31 - 2) + 1 + i}\n".encode())
            guesses.append(s)
        # held: no answer yet, not closed (none is readable)
        assert select.select(guesses, [], [], 0.5)[0] == []
        open(f"{base}.go", "w").close()              # the real ranks join meanwhile
        out, err = p.communicate(timeout=60)
        for s in guesses:
            s.settimeout(30)
            assert s.recv(4096) == b""               # then closed, with no word
            s.close()
    finally:
        p.kill()
        p.communicate()
        kill_tagged(tag)
    assert p.returncode == 0, err


def _flood(port: int, secret: int, count: int, seconds: float) -> List[float]:
    """``count`` connections to ``port``, each sending one wrong PMI_ID as soon as it
    is connected; for each closed within ``seconds``, how long after it connected.

    (From the connect, not the send: on a busy machine the server may accept a
    connection before its guess arrives, and close it unread when the time to
    speak, counted from the accept, runs out first; that close tells nothing.)"""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, count + 256)), hard))
    poller, sent, waits = select.epoll(), {}, []
    socks, began = {}, {}
    try:
        for i in range(count):
            s = socket.socket()
            s.setblocking(False)
            began[s.fileno()] = time.monotonic()
            s.connect_ex(("127.0.0.1", port))
            guess = (secret + 1 + i) % (2**31 - 2) + 1
            socks[s.fileno()] = (s, guess)
            # The guess goes at once where the connection is made already (room in
            # the listener's queue): on a busy machine, sent only once every
            # connection is opened, the first ones' guesses came after the server
            # had taken them, and made room (evicted them, unread) a second later.
            try:
                s.send(f"cmd=initack pmiid={guess}\n".encode())
            except OSError:
                poller.register(s.fileno(), select.EPOLLOUT)
            else:
                sent[s.fileno()] = time.monotonic()
                poller.register(s.fileno(), select.EPOLLIN)
        deadline = time.monotonic() + seconds
        while socks and time.monotonic() < deadline:
            for fd, _mask in poller.poll(0.1):
                s, guess = socks[fd]
                if fd not in sent:
                    try:
                        s.send(f"cmd=initack pmiid={guess}\n".encode())
                    except OSError:
                        continue
                    sent[fd] = time.monotonic()
                    poller.modify(fd, select.EPOLLIN)
                    continue
                try:
                    data = s.recv(4096)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                assert data == b"", data        # no word but the connection's end
                waits.append(time.monotonic() - began[fd])
                poller.unregister(fd)
                s.close()
                del socks[fd]
    finally:
        for s, _ in socks.values():
            s.close()
        poller.close()
    return waits


def test_a_flood_of_wrong_pmi_ids_learns_each_verdict_only_seconds_later(mpich, tmp_path):
    # Past the connections held at once, the door takes no new one until one is
    # answered: a flood learns no verdict sooner than one guess does (before, past
    # 256 held, every further wrong guess was cut off at once: ~200 verdicts/s).
    from mslaunch.mpi.pmi.tcp import HELD, TARPIT
    base = str(tmp_path / "rank")
    tag = new_tag()
    p, port, secret = _guessed_job(base, tag)
    try:
        waits = _flood(port, secret, 3 * HELD, 3 * TARPIT)
        open(f"{base}.go", "w").close()
        out, err = p.communicate(timeout=60)
    finally:
        p.kill()
        p.communicate()
        kill_tagged(tag)
    assert p.returncode == 0, err
    assert len(waits) >= HELD // 2, len(waits)        # the flood was answered...
    assert min(waits) > TARPIT * 0.9, sorted(waits)[:5]   # ...never at once


def test_idle_connections_to_the_pmi_port_never_lock_out_real_ranks(mpich, tmp_path):
    portfile = str(tmp_path / "port")
    p = start("-pmi-port", "-n", "2", PY, "-c", ATTACKED_RANK, portfile)
    stop = threading.Event()
    opened = [0]

    def attack(port: int) -> None:
        held = []
        deadline = time.monotonic() + 6
        while not stop.is_set() and time.monotonic() < deadline and opened[0] < 20000:
            held = [s for s in held if not _closed(s)]
            while len(held) < 150 and opened[0] < 20000:
                s = socket.socket()
                s.settimeout(1)
                try:
                    s.connect(("127.0.0.1", port))
                    s.setblocking(False)
                except OSError:
                    s.close()
                    break
                held.append(s)
                opened[0] += 1
            time.sleep(0.01)                    # the attack's pace: the fault itself
        for s in held:
            s.close()

    try:
        assert wait_for(lambda: os.path.exists(portfile), 20)
        port = int(open(portfile).read().rsplit(":", 1)[1])
        attacker = threading.Thread(target=attack, args=(port,))
        attacker.start()
        out, err = p.communicate(timeout=90)
        stop.set()
        attacker.join()
        assert p.returncode == 0, err
        assert out.decode().count("sum 3") == 2
        assert opened[0] > 150
        pmi_lines = [x for x in err.decode().splitlines() if x.startswith("mslaunch: PMI")]
        assert len(pmi_lines) <= 12, pmi_lines
    finally:
        stop.set()
        p.kill()
        p.wait()


def _closed(s: socket.socket) -> bool:
    try:
        return s.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


# -- 5. a rank that leaves without MPI while its peers wait in MPI_Init --------------

LEAVER = """
import os, sys
if os.environ['RANK'] == '1':
    if sys.argv[1] == 'junk':
        fd = int(os.environ['PMI_FD'])
        os.write(fd, b'garbage that is no PMI at all\\n')
    sys.exit(0)
from mpi4py import MPI
MPI.COMM_WORLD.Barrier()
print('never')
"""


@pytest.mark.parametrize("mode", ["fd", "port", "junk"])
def test_a_rank_leaving_without_mpi_ends_the_job(mpich, mode):
    tag = new_tag()
    flags = ["-pmi-port"] if mode == "port" else []
    r = run("--timeout", "60", *flags, "-n", "3", PY, "-c", LEAVER, mode,
            env=clean_env(MSL_TEST_TAG=tag), timeout=90)
    try:
        err = r.stderr.decode()
        assert r.returncode == 1, err
        assert "rank 1 (pid" in err and "without joining MPI" in err, err
        assert b"never" not in r.stdout
        _no_orphans(tag)
    finally:
        kill_tagged(tag)


# -- 6. --stdin all with a rank that does not read ---------------------------------

def test_stdin_all_goes_on_when_a_rank_exits_without_reading():
    data = os.urandom(5 << 20)
    code = ("import os, sys\n"
            "if os.environ['RANK'] == '1': sys.exit(0)\n"
            "print(os.environ['RANK'], len(sys.stdin.buffer.read()))")
    r = run("--stdin", "all", "-n", "3", PY, "-c", code, input=data, timeout=60)
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.decode().split("\n")[:-1]) == [f"0 {5 << 20}", f"2 {5 << 20}"]


# -- 7. processes that clear their environment and leave the job -------------------

def _sleepers(unique: str):
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            with open(f"/proc/{entry}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if unique.encode() in argv and state != b"Z":
            found.append(int(entry))
    return found


def _kill_sleepers(unique: str) -> None:
    for pid in _sleepers(unique):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


ESCAPES = {
    # a new session and an empty environment
    "setsid": "setsid -f env -i sleep {u} </dev/null >/dev/null 2>&1;",
    # only a new process group, an empty environment, still the rank's child
    "setpgid": ("env -i {py} -c 'import os; os.setpgid(0, 0); os.execv(\"/bin/sleep\", "
                "[\"sleep\", \"{u}\"])' </dev/null >/dev/null 2>&1 &"),
}


@pytest.mark.parametrize("guard", ["cgroup", "subreaper"])
@pytest.mark.parametrize("how", sorted(ESCAPES))
@pytest.mark.parametrize("ending", ["success", "failure", "sigkill"])
def test_processes_that_clear_their_environment_do_not_escape(guard, how, ending):
    unique = f"1107.{random.randrange(10**8):08d}"
    escape = ESCAPES[how].replace("{u}", unique).replace("{py}", PY)
    tail = {"success": "exit 0", "failure": "exit 3", "sigkill": "sleep 60"}[ending]
    env = clean_env(MSLAUNCH_CGROUP="0" if guard == "subreaper" else "1")
    p = start("-v", "-n", "2", "sh", "-c", f"{escape} {tail}", env=env)
    try:
        if ending == "sigkill":
            assert wait_for(lambda: len(_sleepers(unique)) == 2, 10)
            # In a cgroup they are the job's from their fork on.  Without one, the
            # watchdog looks at what the launcher adopted every 0.25 s, and says
            # nothing when it has: two looks' time (no event to wait for yet).
            if guard == "subreaper":
                time.sleep(0.6)
            p.kill()
            p.wait()
        else:
            _, err = p.communicate(timeout=60)
            assert p.returncode == (0 if ending == "success" else 3), err
            assert f"orphan guard: {guard}".encode() in err
        assert wait_for(lambda: _sleepers(unique) == [], 15), _sleepers(unique)
    finally:
        p.kill()
        p.wait()
        _kill_sleepers(unique)


def test_a_launcher_in_another_pid_namespace_leaves_a_live_job_alone():
    # Launchers in another pid namespace share the cgroup tree but not the
    # pids: the names of this job's cgroup must not look stale from there.
    tag = new_tag()
    p = start("-v", "-n", "1", PY, "-c", "import time; print('up', flush=True); "
              "time.sleep(2); print('survived', flush=True)",
              env=clean_env(MSL_TEST_TAG=tag))
    try:
        assert p.stdout.readline() == b"up\n"
        for _ in range(2):
            inner = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", *cmd(
                "-n", "1", "true")], capture_output=True, timeout=60, env=clean_env())
            assert inner.returncode == 0, inner.stderr
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        assert out == b"survived\n"
        assert b"orphan guard: cgroup" in err
    finally:
        p.kill()
        p.wait()
        kill_tagged(tag)


# -- 8. SIGKILL of mslaunch and MPICH's shared memory --------------------------------

SHM_RANK = """
import os, time
from mpi4py import MPI
MPI.COMM_WORLD.Barrier()
print(os.environ['MSLAUNCH_JOB'], flush=True)
time.sleep(60)
"""


def test_sigkilled_launcher_leaves_no_shared_memory(mpich):
    from mslaunch.mpi.pmi.files import shm_segments
    tag = new_tag()
    p = start("-n", "2", PY, "-c", SHM_RANK, env=clean_env(MSL_TEST_TAG=tag))
    try:
        kvsname = p.stdout.readline().decode().strip()
        assert kvsname.startswith("kvs_")
        assert shm_segments(kvsname)
        p.kill()
        p.wait()
        assert wait_for(lambda: shm_segments(kvsname) == [], 15), shm_segments(kvsname)
        _no_orphans(tag)
    finally:
        p.kill()
        p.wait()
        kill_tagged(tag)


# -- 9. lines never spliced on one terminal ----------------------------------------

def _combined(*args: str, timeout: float = 60):
    p = subprocess.run(cmd(*args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       env=clean_env(), timeout=timeout)
    return p.returncode, p.stdout


def _pure(lines, letters=b"ABab"):
    for line in lines:
        if line.startswith(b"mslaunch:") or line.startswith(b"    "):
            continue
        assert len(set(line)) <= 1, line[:80]


def test_partial_stdout_and_stderr_lines_of_two_ranks_on_one_terminal():
    # Rank 0 leaves an unfinished stdout line (it ends with the stream); rank 1
    # then writes a whole line to stderr, which is the same terminal.
    code = ("import os, sys, time\n"
            "if os.environ['RANK'] == '0':\n"
            "    sys.stdout.write('A' * 10)\n"
            "else:\n"
            "    time.sleep(0.5); sys.stderr.write('B' * 10 + '\\n')\n")
    rc, out = _combined("-n", "2", PY, "-c", code)
    assert rc == 0
    lines = out.split(b"\n")
    _pure(lines)
    assert lines[:2] == [b"A" * 10, b"B" * 10]


def test_lines_longer_than_the_limit_are_not_spliced():
    code = ("import os, sys\n"
            "if os.environ['RANK'] == '0':\n"
            "    for _ in range(48): sys.stdout.write('a' * 65536)\n"
            "    sys.stdout.write('\\n')\n"
            "else:\n"
            "    for _ in range(3000): sys.stderr.write('b' * 50 + '\\n')\n")
    rc, out = _combined("-n", "2", PY, "-c", code)
    assert rc == 0
    lines = [x for x in out.split(b"\n") if x]
    _pure(lines)
    assert sum(len(x) for x in lines if x[:1] == b"a") == 48 * 65536
    assert sum(1 for x in lines if x[:1] == b"b") == 3000


def test_the_summary_is_never_glued_to_an_unfinished_line():
    code = "import sys\nsys.stdout.write('partial'); sys.stdout.flush(); sys.exit(3)"
    rc, out = _combined("-n", "1", PY, "-c", code)
    assert rc == 3
    assert b"\nmslaunch: rank 0 (pid" in out
    assert out.startswith(b"partial\n")


# -- 10. sizes without a bound ------------------------------------------------------

@pytest.mark.parametrize("args, env", [
    (["-H", "localhost:2147483647", "--dry-run", "true"], {}),
    (["--dry-run", "true"], {"SLURM_JOB_NODELIST": "localhost",
                             "SLURM_TASKS_PER_NODE": "2147483647"}),
    (["--dry-run", "true"], {"SLURM_JOB_NODELIST": "n[1-1000000]"}),
    (["--hostfile", "/dev/zero", "true"], {}),
    (["--dry-run", "true"], {"PBS_NODEFILE": "/dev/zero"}),
])
def test_huge_sizes_are_one_error_line(args, env):
    r = run(*args, env=clean_env(**env), timeout=60)
    assert r.returncode == 2, r.stderr          # a usage error, each of them
    line = one_error_line(r.stderr)
    assert len(line) < 300


def test_a_hostfile_slot_count_without_n_is_capped(tmp_path):
    hf = tmp_path / "hosts"
    hf.write_text("localhost slots=2147483647\n")
    r = run("--hostfile", str(hf), "--dry-run", "true", timeout=60)
    assert r.returncode == 2
    assert "give -n" in one_error_line(r.stderr)


# -- 11. odd environments ----------------------------------------------------------

def test_a_non_ascii_master_port_is_one_error_line():
    r = run("-n", "1", "true", env=clean_env(MASTER_PORT="²"))
    assert r.returncode == 2
    assert "MASTER_PORT" in one_error_line(r.stderr)


def test_starting_from_a_deleted_directory_is_one_error_line(tmp_path):
    gone = tmp_path / "gone"
    gone.mkdir()
    # (``python -m`` itself cannot start in a deleted directory; the command can.)
    launcher = [PY, "-c", "import sys; from mslaunch.__main__ import main; sys.exit(main())"]
    p = subprocess.run(["sh", "-c", f"cd {gone} && rmdir {gone} && exec \"$@\"", "sh",
                        *launcher, "-n", "1", "true"], capture_output=True,
                       env=clean_env(PYTHONPATH=REPO), timeout=60)
    assert p.returncode == 1, p.stderr
    assert "current directory no longer exists" in one_error_line(p.stderr)


@pytest.mark.parametrize("limit", [5, 6, 7])
def test_very_few_descriptors_is_one_error_line(limit):
    def few() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    p = subprocess.run(cmd("-n", "1", "echo", "ran"), capture_output=True, env=clean_env(),
                       preexec_fn=few, timeout=60)
    if p.returncode == 0:
        # Launched after all: then the rank really ran, and nothing was said.
        assert (p.stdout, p.stderr) == (b"ran\n", b""), p
    else:
        assert p.returncode == 1 and p.stdout == b"", p
        assert "too many open files" in one_error_line(p.stderr)


# -- 12. an aborted job never reports success -----------------------------------------

@pytest.mark.parametrize("code", [0, 256])
def test_mpi_abort_with_a_code_that_is_zero_modulo_256_is_a_failure(mpich, code):
    prog = f"from mpi4py import MPI\nMPI.COMM_WORLD.Abort({code})"
    r = run("-n", "2", PY, "-c", prog, timeout=60)
    assert r.returncode == 1, r.stderr
    assert b"called MPI_Abort" in r.stderr


def test_a_raw_abort_with_a_huge_code_is_a_failure():
    prog = ("import os, socket\n"
            "s = socket.socket(fileno=int(os.environ['PMI_FD']))\n"
            "s.sendall(b'cmd=init pmi_version=1 pmi_subversion=1\\n'); s.recv(200)\n"
            "s.sendall(b'cmd=abort exitcode=4294967296\\n')\n"
            "import time; time.sleep(5)")
    r = run("-n", "1", PY, "-c", prog, timeout=60)
    assert r.returncode != 0, r.stderr
    assert b"called MPI_Abort" in r.stderr


# -- smaller ones ------------------------------------------------------------------

@pytest.mark.parametrize("args", [["--bo\ngus", "true"], ["--bind-to", "moon\nx", "true"],
                                  ["--map-by", "x\ny", "true"], ["-x\n=1", "true"]])
def test_a_newline_in_a_bad_token_stays_on_one_line(args):
    r = run(*args)
    assert r.returncode == 2
    assert "\\n" in one_error_line(r.stderr)


def test_a_bad_interpreter_in_a_later_context_starts_nothing(tmp_path):
    script = tmp_path / "bad.sh"
    script.write_text("#!/nonexistent/interpreter\necho hi\n")
    script.chmod(0o755)
    marker = tmp_path / "ran"
    r = run("-n", "1", "touch", str(marker), ":", "-n", "1", str(script))
    assert r.returncode == 127
    assert "/nonexistent/interpreter" in one_error_line(r.stderr)
    assert not marker.exists()


def test_a_hostfile_error_shows_only_a_short_excerpt(tmp_path):
    hf = tmp_path / "secret"
    hf.write_text("root:$6$" + "x" * 400 + ":19000:0:99999:7:::\n")
    r = run("--hostfile", str(hf), "true")
    assert r.returncode == 2
    line = one_error_line(r.stderr)
    assert f"{hf}:1:" in line
    assert "x" * 50 not in line


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(
    st.sampled_from(["-n", "-np", "-H", "--host", "-x", "--map-by", "--bind-to", "--timeout",
                     "--output-filename", ":", "--", "-genv", "--stdin", "-N", "--mca",
                     "--oversubscribe", "-wdir", "--hostfile", "--grace", "--mpi",
                     "--tag-output", "-pmi-port", "true", "0", "-1", "2", "x=1", "a:b",
                     "ppr:2:node", "node", "all", "localhost:2"]),
    st.text(max_size=12)), max_size=12))
def test_fuzzed_command_lines_parse_or_fail_with_a_usage_error(argv):
    from mslaunch.cli.common import Exit
    from mslaunch.cli.mpirun import parse_args
    from mslaunch.core.errors import LaunchError
    try:
        parse_args(argv, environ={}, cwd="/tmp")
    except (LaunchError, Exit):
        pass


def test_kvs_puts_are_capped(monkeypatch):
    from mslaunch.mpi.pmi import state
    monkeypatch.setattr(state, "KVS_MAX_BYTES", 100_000)
    s = state.LocalJobState(kvsname="kvs_1_a", size=1, process_mapping="(vector,(0,1,1))",
                            universe_size=1, appnums=[0])
    stored = sum(s.kvs_put(0, f"k{i}", "v" * 1000) for i in range(500))
    assert 90 <= stored < 100
    assert not s.kvs_put(0, "one-more", "v" * 1000)
    assert s.kvs_put(0, "k0", "w" * 1000)        # replacing a value does not grow

