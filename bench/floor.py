"""The launch floor: the least a Python launcher can do.

Usage: ``python bench/floor.py N cmd [args...]``

Starts N copies of the command with :class:`subprocess.Popen` (each inherits
this process's stdin, stdout, stderr and environment), waits for all of them,
and exits with the first non-zero exit status seen, in order of exit (a rank
killed by signal S counts as 128+S), or 0.  No PMI, no output relay, no
signal handling: every launcher pays at least this much.
"""

from __future__ import annotations

import os
import subprocess
import sys
TYPE_CHECKING = False
if TYPE_CHECKING:   # importing typing would add milliseconds to the floor
    from typing import Dict, List


def main(argv: List[str]) -> int:
    if len(argv) < 2 or not argv[0].isdigit() or int(argv[0]) < 1:
        sys.stderr.write("usage: floor.py N cmd [args...]\n")
        return 2
    count, command = int(argv[0]), argv[1:]
    try:
        procs: Dict[int, subprocess.Popen] = {}
        for _ in range(count):
            proc = subprocess.Popen(command)
            procs[proc.pid] = proc
    except OSError as err:
        sys.stderr.write(f"floor.py: {command[0]}: {err.strerror}\n")
        for proc in procs.values():
            proc.kill()
            proc.wait()
        return 127
    first = 0
    while procs:
        pid, status = os.wait()
        proc = procs.pop(pid, None)
        if proc is None:
            continue
        code = os.waitstatus_to_exitcode(status)
        code = 128 - code if code < 0 else code
        proc.returncode = code          # already reaped; keeps Popen from waiting again
        if code and not first:
            first = code
    return first


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
