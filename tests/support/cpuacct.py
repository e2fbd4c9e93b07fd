"""The CPU each test module cost, its processes' and all they started: a pytest
plugin (loaded by conftest.py), at work only when ``MSLAUNCH_TEST_CPU`` names a
file and this process may make cgroups (root, cgroup v2).

Each process that runs tests (each xdist worker) moves itself into a cgroup of
its own, ``msl-cpu-<pid>/leaf`` at the top of the tree; what it starts is born
there, the test beds' daemons and what they start too, and mslaunch makes its
jobs' cgroups beside the launcher's own, inside ``msl-cpu-<pid>``.  Since each
module runs whole on one worker, the growth of that cgroup's CPU time while a
module runs is the module's (its fixtures' set-up and teardown included; the
session's beds' idle daemons count where they run).  A line per module goes to
the file: ``MODULE CPU_SECONDS WALL_SECONDS``, appended as each module ends.
"""

from __future__ import annotations

import os
import time
from typing import List

from cgroupcheck import cgroup2_root

_state: dict = {}


def _usage(path: str) -> float:
    with open(os.path.join(path, "cpu.stat")) as f:
        for line in f:
            key, _, value = line.partition(" ")
            if key == "usage_usec":
                return int(value) / 1e6
    return 0.0


def _move(cgroup: str) -> None:
    with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
        f.write(str(os.getpid()))


def pytest_configure(config) -> None:
    out = os.environ.get("MSLAUNCH_TEST_CPU")
    if not out or (config.getoption("numprocesses", None) and
                   not hasattr(config, "workerinput")):
        return                          # (xdist's controller runs no test)
    mount = cgroup2_root()
    if not mount or os.geteuid() != 0:
        return
    with open("/proc/self/cgroup") as f:
        own = next((line[3:].strip() for line in f if line.startswith("0::")), "/")
    top = os.path.join(mount, f"msl-cpu-{os.getpid()}")
    os.makedirs(os.path.join(top, "leaf"), exist_ok=True)
    _move(os.path.join(top, "leaf"))
    _state.update(out=out, top=top, home=os.path.join(mount, own.lstrip("/")), module=None)


def _close_module() -> None:
    module = _state.get("module")
    if module is None:
        return
    cpu = _usage(_state["top"]) - _state["cpu"]
    wall = time.monotonic() - _state["wall"]
    fd = os.open(_state["out"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{module} {cpu:.1f} {wall:.1f}\n".encode())
    finally:
        os.close(fd)
    _state["module"] = None


def pytest_runtest_logstart(nodeid: str, location) -> None:
    if "top" not in _state:
        return
    module = nodeid.split("::", 1)[0]
    if module != _state["module"]:
        _close_module()
        _state.update(module=module, cpu=_usage(_state["top"]), wall=time.monotonic())


def pytest_sessionfinish(session) -> None:
    if "top" in _state:
        _close_module()


def pytest_unconfigure(config) -> None:
    if "top" not in _state:
        return
    top = _state.pop("top")
    try:
        _move(_state["home"])
    except OSError:
        return
    leftover: List[str] = [os.path.join(top, "leaf"), top]
    deadline = time.monotonic() + 10
    for path in leftover:
        while True:
            try:
                os.rmdir(path)
                break
            except FileNotFoundError:
                break
            except OSError:             # (a job's cgroup inside, its removal under way)
                if time.monotonic() > deadline:
                    break
                time.sleep(0.1)
