"""The suite leaves no job cgroup behind: a pytest plugin (loaded by conftest.py).

mslaunch puts each job (and each remote host's agent) in a cgroup of its own,
``mslaunch-<launcher pid>-w<watchdog pid>-n<pid namespace>-<job>``, removed once
the job is over.  At the end of the session, a cgroup of that name that was not
there at its start and whose launcher and watchdog are both gone is the suite's
(a job of another session still runs), left behind: it is reported, removed, and
fails the run.
"""

from __future__ import annotations

import os
import time
from typing import Dict, List, Set, Tuple

import pytest


def cgroup2_root() -> str:
    """Where the cgroup v2 tree is mounted ("" if nowhere)."""
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                if right.split(" ", 1)[0] == "cgroup2":
                    return left.split()[4]
    except OSError:
        pass
    return ""


def job_cgroups() -> Set[str]:
    """Every job cgroup of mslaunch's in the tree, nested ones too."""
    root = cgroup2_root()
    found: Set[str] = set()
    for where, dirs, _ in os.walk(root) if root else ():
        found |= {os.path.join(where, d) for d in dirs if d.startswith("mslaunch-")}
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False


def _dead(path: str) -> bool:
    """Whether the launcher and the watchdog that a cgroup's name names are gone."""
    parts = os.path.basename(path).split("-", 4)
    try:
        launcher, watchdog = int(parts[1]), int(parts[2][1:])
    except (IndexError, ValueError):
        return False
    return not _alive(launcher) and not _alive(watchdog)


def _remove(path: str) -> None:
    for where, dirs, _ in sorted(os.walk(path), key=lambda w: -len(w[0])):
        for d in dirs:
            try:
                os.rmdir(os.path.join(where, d))
            except OSError:
                pass
    try:
        os.rmdir(path)
    except OSError:
        pass


_start: List[Set[str]] = []
#: (when, test) as each test starts, to name the test a cgroup left was made in
#: (in one process; with workers, the cgroup's time says when)
_tests: List[Tuple[float, str]] = []


def pytest_sessionstart(session) -> None:
    if not hasattr(session.config, "workerinput"):
        _start.append(job_cgroups())


def pytest_runtest_logstart(nodeid, location) -> None:
    _tests.append((time.time(), nodeid))


def _made_during(path: str) -> str:
    try:
        made = os.stat(path).st_ctime
    except OSError:
        return "?"
    before = [name for at, name in _tests if at <= made]
    return before[-1] if before else time.strftime("%H:%M:%S", time.localtime(made))


@pytest.hookimpl(trylast=True)      # after the session's fixtures (the test beds) are gone
def pytest_sessionfinish(session, exitstatus) -> None:
    if not _start:
        return
    before = _start.pop()
    left: Dict[str, str] = {}
    deadline = time.monotonic() + 5     # a watchdog removes its cgroup just after its job
    while True:
        left = {p: _made_during(p) for p in job_cgroups() - before if _dead(p)}
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    if not left:
        return
    for path in left:
        _remove(path)
    rep = session.config.pluginmanager.get_plugin("terminalreporter")
    text = (f"cgroupcheck: the suite's jobs left {len(left)} cgroup(s) (removed now): "
            + ", ".join(f"{p} (made during {made})" for p, made in sorted(left.items())))
    if rep is not None:
        rep.write_sep("=", text, red=True)
    session.exitstatus = 1
