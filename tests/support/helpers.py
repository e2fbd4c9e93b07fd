"""Shared helpers for tests that run mslaunch as a real command."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
import uuid
from typing import Dict, List, Optional, Sequence, Set

#: tests/support (this module's folder), tests/ and the repository's root
SUPPORT = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(SUPPORT)
REPO = os.path.dirname(TESTS)
PROGRAMS = os.path.join(TESTS, "programs")
DATA = os.path.join(TESTS, "data")
PY = sys.executable
STALE = ("PMI_", "PMIX_", "OMPI_", "PRTE_", "HYDI_", "SLURM_", "PBS_", "MASTER_")


def clean_env(**extra: str) -> Dict[str, str]:
    """The test process's environment without launcher leftovers, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(STALE)
           and k not in ("MPIEXEC_TIMEOUT", "PYTHONUNBUFFERED")}
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    # The test beds add and remove network interfaces in this namespace while other
    # workers' ranks start; UCX (MPICH's wheel) then writes errors about an interface
    # gone between its listing and its query into the ranks' stdout, and a worker
    # that opened one as it went fails MPI_Init ("No such device").  Ranks of one
    # machine need no network: jobs across the beds' hosts set tcp (remote.renv).
    env.setdefault("UCX_LOG_LEVEL", "fatal")
    env.setdefault("UCX_TLS", "self,sm")
    env.update(extra)
    return env


def cmd(*args: str) -> List[str]:
    return [PY, "-m", "mslaunch", *args]


def run(*args: str, input: Optional[bytes] = None, timeout: float = 60,
        env: Optional[Dict[str, str]] = None, cwd: Optional[str] = None,
        stdin=None) -> subprocess.CompletedProcess:
    """Run mslaunch to completion; stdout and stderr are captured as bytes."""
    return subprocess.run(cmd(*args), input=input, stdin=stdin, capture_output=True,
                          timeout=timeout, env=env or clean_env(), cwd=cwd)


def start(*args: str, env: Optional[Dict[str, str]] = None, cwd: Optional[str] = None,
          **kw) -> subprocess.Popen:
    return subprocess.Popen(cmd(*args), env=env or clean_env(), cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


def program(name: str) -> str:
    return os.path.join(PROGRAMS, name)


#: The prefix that runs a command as ``nobody`` (root runs it; util-linux's setpriv).
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def open_copies(prefix: str, *names: str) -> str:
    """A new directory that every user may read, with the test programs ``names``
    copied into it, for a test to run as another user (``nobody``); the caller
    removes it."""
    import shutil
    import tempfile
    where = tempfile.mkdtemp(prefix=prefix)
    os.chmod(where, 0o755)
    for name in names:
        shutil.copy(program(name), where)
        os.chmod(os.path.join(where, name), 0o755)
    return where


def new_tag() -> str:
    return uuid.uuid4().hex


def tagged_pids(tag: str) -> List[int]:
    """Pids of live processes whose environment holds ``MSL_TEST_TAG=tag``."""
    needle = f"MSL_TEST_TAG={tag}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{entry}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in env and state != b"Z":
            found.append(int(entry))
    return found


def all_gone(tag: str, timeout: float = 5.0) -> bool:
    """Whether every process tagged ``tag`` is gone (within ``timeout``: mslaunch's
    watchdog removes the job's cgroup just after mslaunch has exited)."""
    return wait_for(lambda: tagged_pids(tag) == [], timeout, 0.01)


def wait_for(predicate, timeout: float = 10.0, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def read_until(stream, needle: bytes, timeout: float = 60.0) -> bytes:
    """Read a child's pipe ``stream`` (its stdout or stderr) until ``needle`` has come;
    return all that was read.  ``communicate()`` then reads only the rest (it never
    saw these bytes: they were read from the file descriptor, past its buffer)."""
    fd = stream.fileno()
    got = b""
    deadline = time.monotonic() + timeout
    while needle not in got:
        left = deadline - time.monotonic()
        assert left > 0, f"no {needle!r} within {timeout} s; read: {got[-3000:]!r}"
        if select.select([fd], [], [], left)[0]:
            chunk = os.read(fd, 1 << 16)
            assert chunk, f"the stream ended before {needle!r}; read: {got[-3000:]!r}"
            got += chunk
    return got


def wait_pid(pid: int, timeout: float = 30.0) -> Optional[int]:
    """The wait status of child ``pid`` once it has ended (within ``timeout``), else None."""
    found: List[int] = []

    def ended() -> bool:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            found.append(status)
        return bool(found)
    wait_for(ended, timeout)
    return found[0] if found else None


def status_field(pid: int, name: str) -> str:
    """A field of /proc/PID/status ("" for a process that has gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key == name:
                    return value.strip()
    except OSError:
        pass
    return ""


def _in_set(pid: int, field: str, sig: int) -> bool:
    return bool(int(status_field(pid, field) or "0", 16) >> (sig - 1) & 1)


def signal_pending(pid: int, sig: int) -> bool:
    """Whether ``sig`` waits to be delivered to process ``pid`` (or one of its threads)."""
    return _in_set(pid, "SigPnd", sig) or _in_set(pid, "ShdPnd", sig)


def signal_caught(pid: int, sig: int) -> bool:
    """Whether process ``pid`` has a handler of its own for ``sig``."""
    return _in_set(pid, "SigCgt", sig)


def signal_ignored(pid: int, sig: int) -> bool:
    return _in_set(pid, "SigIgn", sig)


def comm(pid: int) -> str:
    """A process's name (its program's, as /proc/PID/comm has it); "" once it has gone."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def bytes_written(pid: int) -> int:
    """What process ``pid`` has written so far, in bytes (wchar of /proc/PID/io)."""
    try:
        with open(f"/proc/{pid}/io") as f:
            for line in f:
                if line.startswith("wchar:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def end_all(procs, tag: str) -> None:
    """Nothing of a test's launchers (``procs``, Popen objects) outlives it, whatever
    became of them: those still running are killed, then what carries ``tag``."""
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
    kill_tagged(tag)


def kill_tagged(tag: str) -> None:
    """Last-resort cleanup so a failing test leaves nothing behind.

    The job's watchdogs are spared a moment: SIGKILLed with the rest, they
    would leave the job's cgroup and session directories behind; once
    everything else is gone they remove them and end by themselves.  A
    watchdog is named in its job's cgroup (``mslaunch-<launcher>-w<watchdog>-...``),
    or, without one, is a launcher's or an agent's fork (its parent's command
    line)."""
    pids = tagged_pids(tag)
    if not pids:
        return
    watchdogs = {pid for pid in pids if _parent(pid) in pids
                 and cmdline(pid) == cmdline(_parent(pid))}
    watchdogs |= {w for pid in pids for w in _watchdog_of(pid)} & set(pids)
    for pid in pids:
        if pid not in watchdogs:
            _kill(pid)
    wait_for(lambda: not set(tagged_pids(tag)) & watchdogs, 15)
    for pid in tagged_pids(tag):
        _kill(pid)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


def _watchdog_of(pid: int) -> List[int]:
    """The watchdog named by the mslaunch cgroup ``pid`` is in, if any."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            parts = f.read().replace("\n", "/").split("/")
    except OSError:
        return []
    found = []
    for part in parts:
        fields = part.split("-")
        if len(fields) > 2 and fields[0] == "mslaunch" and fields[2][:1] == "w" \
                and fields[2][1:].isdigit():
            found.append(int(fields[2][1:]))
    return found


def _parent(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def cmdline(pid: int) -> bytes:
    """A process's command line, NUL-separated as /proc shows it (b"" once gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def wait_lines(path: str, count: int, timeout: float = 10.0) -> bool:
    def ready() -> bool:
        try:
            with open(path) as f:
                return len(f.read().splitlines()) >= count
        except OSError:
            return False
    return wait_for(ready, timeout)


#: The lines that name hosts still starting once one is late, and the start's end
#: (mslaunch.machine.timeline).
_PROGRESS = ("mslaunch: still starting after ", "mslaunch: every host up after ")


def error_lines(text: str) -> List[str]:
    """``text``'s lines but those naming hosts still starting (what a user sees
    while a slow start goes on, not what it ended with).  Written to a terminal,
    where that line is rewritten in place, each line is what remains shown: what
    follows its last carriage return and erase."""
    lines = text.replace("\r\n", "\n").split("\n")
    if lines[-1].rsplit("\r\x1b[K", 1)[-1] == "":
        lines.pop()                 # (the end of the last line, or a line cleared)
    shown = (line.rsplit("\r\x1b[K", 1)[-1] for line in lines)
    return [line for line in shown if not line.startswith(_PROGRESS)]


def one_error_line(stderr: bytes) -> str:
    """Assert stderr is exactly one 'mslaunch: error: ...' line (beside the names of
    hosts still starting, if one was late); return it."""
    text = stderr.decode()
    lines = error_lines(text)
    assert len(lines) == 1, text
    assert lines[0].startswith("mslaunch: error: "), text
    assert "Traceback" not in text
    return lines[0]


def seq(args: Sequence[str]) -> List[str]:
    return list(args)


def socket_inodes(pid: int) -> Set[str]:
    """The inodes of the sockets process ``pid`` holds (as /proc/net/tcp names them)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    return inodes


def hosts_saying(stderr: str, text: str) -> List[str]:
    """The hosts of the lines ``mslaunch: HOSTS: TEXT`` (hosts that said the same
    are named together, runs of numbers as ``h1-h3``), sorted."""
    import re
    found: List[str] = []
    for line in stderr.splitlines():
        if line.startswith("mslaunch: ") and line.endswith(": " + text):
            for part in line[len("mslaunch: "):-len(text) - 2].split(", "):
                m = re.fullmatch(r"(\D+)(\d+)-\1(\d+)", part)
                found += ([f"{m.group(1)}{i}" for i in range(int(m.group(2)), int(m.group(3)) + 1)]
                          if m else [part])
    return sorted(found)


class StderrLines:
    """A running process's stderr, read line by line in a thread as it comes."""

    def __init__(self, p) -> None:
        import threading
        self.lines: list = []
        self.thread = threading.Thread(target=self._read, args=(p.stderr,), daemon=True)
        self.thread.start()

    def _read(self, stream) -> None:
        for line in iter(stream.readline, b""):
            self.lines.append(line.decode("utf-8", "replace"))

    def said(self, text: str) -> bool:
        return any(text in line for line in list(self.lines))

    def text(self) -> str:
        self.thread.join(60)
        return "".join(self.lines)
