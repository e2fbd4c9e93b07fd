"""The least a Python launcher can do before its ranks run, for ``timeline.py``:
``python -S bench/_spawn_floor.py plain|cgroup N PROGRAM ARGS...``.

``plain`` spawns the ``N`` processes at once and waits for them.  ``cgroup``
first makes a cgroup beside its own and moves itself into it, as mslaunch's
orphan guard does before the first rank starts (so that every process of the
job starts inside), then spawns and waits; at the end it moves back and
removes the cgroup.  Exits 3 where no cgroup can be made.
"""

import os
import sys


def _cgroup_home():
    mount = None
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            if right.split(" ", 1)[0] == "cgroup2":
                mount = left.split()[4]
    with open("/proc/self/cgroup") as f:
        own = next((line[3:].strip() for line in f if line.startswith("0::")), None)
    return None if mount is None or own is None else os.path.normpath(mount + "/" + own)


def _move(directory, pid):
    fd = os.open(os.path.join(directory, "cgroup.procs"), os.O_WRONLY)
    try:
        os.write(fd, str(pid).encode())
    finally:
        os.close(fd)


def main():
    how, count, argv = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    home = path = None
    if how == "cgroup":
        home = _cgroup_home()
        if home is None:
            return 3
        path = os.path.join(home, f"mslaunch-floor-{os.getpid()}")
        try:
            os.mkdir(path)
            _move(path, os.getpid())
        except OSError:
            return 3
    pids = [os.posix_spawn(argv[0], argv, os.environ) for _ in range(count)]
    for pid in pids:
        os.waitpid(pid, 0)
    if path is not None:
        _move(home, os.getpid())
        os.rmdir(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
