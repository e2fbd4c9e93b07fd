"""The suite leaves /dev/shm as it found it: a pytest plugin (loaded by conftest.py).

The README's test command runs the suite in a mount namespace of its own
with a /dev/shm of its own (an empty tmpfs) and says so in ``OWN_SHM_VAR``:
then everything there at the end that was not there at the start is the
suite's, however briefly it was held, and nothing needs sampling.

Otherwise other jobs on the machine (other test sessions too) create files in /dev/shm;
a file counts as this session's when one of its processes was seen holding it:
a thread samples, every fraction of a second, the /dev/shm files that the
processes below pytest (the test beds' hosts and daemons included) or carrying
this session's tag in their environment have open or mapped.  At the end, every such file that is still there
and was not there at the start, and that no process holds any more, is reported,
removed, and fails the run.
"""

from __future__ import annotations

import os
import threading
from typing import Dict, Iterable, Set, Tuple

import pytest

SHM = "/dev/shm"
#: In the environment of this session's processes (other sessions may run at once).
SESSION_VAR = "MSL_TEST_SESSION"
#: Set by scripts/test.sh when /dev/shm is a tmpfs of the suite's own.
OWN_SHM_VAR = "MSL_TEST_OWN_SHM"
Ident = Tuple[int, int]          # (device, inode)


def shm_files() -> Dict[Ident, str]:
    """The regular files directly in /dev/shm, by (device, inode)."""
    found = {}
    try:
        with os.scandir(SHM) as entries:
            for e in entries:
                try:
                    if e.is_file(follow_symlinks=False):
                        st = e.stat(follow_symlinks=False)
                        found[(st.st_dev, st.st_ino)] = e.path
                except OSError:
                    continue
    except OSError:
        pass
    return found


def held_by(pid: int) -> Set[Ident]:
    """The /dev/shm files ``pid`` has mapped or open."""
    held: Set[Ident] = set()
    prefix = SHM.encode() + b"/"
    try:
        with open(f"/proc/{pid}/maps", "rb") as f:
            for line in f:
                fields = line.split(None, 5)
                if len(fields) == 6 and fields[5].startswith(prefix):
                    major, minor = fields[3].split(b":")
                    held.add((os.makedev(int(major, 16), int(minor, 16)), int(fields[4])))
        for fd in os.listdir(f"/proc/{pid}/fd"):
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(SHM + "/"):
                st = os.stat(f"/proc/{pid}/fd/{fd}")
                held.add((st.st_dev, st.st_ino))
    except (OSError, ValueError):
        pass
    return held


def _table() -> Dict[int, int]:
    """pid -> parent pid of every process."""
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    table[int(entry)] = int(f.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    return table


def _tagged(pid: int, needle: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return needle in f.read().split(b"\0")
    except OSError:
        return False


def suite_processes(root: int, needle: bytes) -> Set[int]:
    """The processes below ``root``, and elsewhere (daemons that left) those whose
    environment holds ``needle``, this session's ``SESSION_VAR=...``."""
    table = _table()
    kids: Dict[int, list] = {}
    for pid, ppid in table.items():
        kids.setdefault(ppid, []).append(pid)
    found, todo = set(), [root]
    while todo:
        for child in kids.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    found |= {pid for pid in table
              if pid not in found and pid != root and _tagged(pid, needle)}
    return found


_skipped: Dict[int, bool] = {}


def _mindspore(pid: int) -> bool:
    """Whether ``pid`` is a MindSpore process of msrun mode (decided once per pid):
    those are not sampled.  They never run Open MPI, and reading the maps of
    MindSpore's many-threaded processes five times a second made their
    cluster's start-up time out."""
    if pid not in _skipped:
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                _skipped[pid] = any(v.startswith(b"MS_ROLE=") for v in f.read().split(b"\0"))
        except OSError:
            _skipped[pid] = False
    return _skipped[pid]


def in_use(pids: Iterable[int], sampling: bool = False) -> Set[Ident]:
    held: Set[Ident] = set()
    for pid in pids:
        if not (sampling and _mindspore(pid)):
            held |= held_by(pid)
    return held


class ShmWatch:
    """Samples what the suite's processes hold in /dev/shm (see the module docstring)."""

    def __init__(self, interval: float = 0.2) -> None:
        import uuid
        os.environ[SESSION_VAR] = uuid.uuid4().hex
        self.needle = f"{SESSION_VAR}={os.environ[SESSION_VAR]}".encode()
        # Only a fresh tmpfs of its own is empty at the start: with the variable
        # set by mistake on a shared /dev/shm, the check samples as elsewhere.
        self.own = os.environ.get(OWN_SHM_VAR) == "1" and not os.listdir(SHM)
        self.start = set(shm_files())
        self.start_names = set(os.listdir(SHM)) if self.own else set()
        self.named: Dict[str, str] = {}       # own /dev/shm: a new name -> its test
        self.seen: Set[Ident] = set()
        self.first: Dict[Ident, str] = {}     # the test running when a file was first seen
        self.test = ""
        self.interval = interval
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="shmcheck", daemon=True)
        if not self.own:
            self.thread.start()

    def _run(self) -> None:
        me = os.getpid()
        while not self.stop.wait(self.interval):
            if not os.path.isdir(SHM):
                return
            new = in_use(suite_processes(me, self.needle), sampling=True) - self.start - self.seen
            for ident in new:
                self.first[ident] = self.test
            self.seen |= new

    def finish(self) -> Dict[Ident, str]:
        """Stop sampling; remove the suite's files left in /dev/shm and return them,
        each with the test that was running when it was first seen."""
        if self.own:
            return self._finish_own()
        self.stop.set()
        self.thread.join()
        now = shm_files()
        left = {i: p for i, p in now.items() if i in self.seen and i not in self.start}
        if left:
            held = in_use(int(e) for e in os.listdir("/proc") if e.isdigit())
            left = {i: p for i, p in left.items() if i not in held}
        for path in left.values():
            try:
                os.unlink(path)
            except OSError:
                pass
        return {i: f"{os.path.basename(p)} (seen first during {self.first.get(i) or '?'})"
                for i, p in left.items()}

    def next_test(self, nodeid: str) -> None:
        if self.own:      # what is new since the last test started is that test's
            for name in set(os.listdir(SHM)) - self.start_names - set(self.named):
                self.named[name] = self.test
        self.test = nodeid

    def _finish_own(self) -> Dict[Ident, str]:
        """In a /dev/shm of the suite's own: whatever is new there is the suite's
        (files, and directories with what is in them)."""
        import shutil
        left = {}
        for name in sorted(set(os.listdir(SHM)) - self.start_names):
            path = os.path.join(SHM, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            left[(st.st_dev, st.st_ino)] = (f"{name} (made during "
                                            f"{self.named.get(name) or self.test or '?'})")
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                try:
                    os.unlink(path)
                except OSError:
                    pass
        return left


_watch = []


def pytest_runtest_logstart(nodeid, location) -> None:
    if _watch:
        _watch[0].next_test(nodeid)


def pytest_sessionstart(session) -> None:
    if os.path.isdir(SHM) and not hasattr(session.config, "workerinput"):
        _watch.append(ShmWatch())


@pytest.hookimpl(trylast=True)      # after the session's fixtures (the test beds) are gone
def pytest_sessionfinish(session, exitstatus) -> None:
    if not _watch:
        return
    left = _watch.pop().finish()
    if left:
        rep = session.config.pluginmanager.get_plugin("terminalreporter")
        text = (f"shmcheck: the suite's processes left {len(left)} file(s) in {SHM} "
                f"(removed now): " + ", ".join(sorted(left.values())))
        if rep is not None:
            rep.write_sep("=", text, red=True)
        session.exitstatus = 1
