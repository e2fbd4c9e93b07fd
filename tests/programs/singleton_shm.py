"""An Open MPI rank that records the /dev/shm files it holds after MPI_Init, then waits.

argv: OUT_DIR SECONDS [ignore-term] [map=PATH] [make=PATH].  Writes
OUT_DIR/shm.<pid>, a line "<device> <inode> <path>" per file it made (or
mapped with map=); with
ignore-term, a SIGTERM is not obeyed but noted as OUT_DIR/term.<pid>;
map=PATH maps an existing file, make=PATH creates and maps PATH.<pid>.
"""

import mmap
import os
import signal
import sys
import threading
import time

out, seconds = sys.argv[1], float(sys.argv[2])
if "ignore-term" in sys.argv[3:]:
    # Before MPI_Init, since the refusal may come while the rank is still in it; and
    # not a Python handler, which would run only once MPI_Init returns (a second or
    # more under load: past a short --grace, so the SIGKILL came first).  SIGTERM
    # is blocked in every thread (Open MPI's inherit the mask) and taken by sigwait.
    def _note_terms() -> None:
        while True:
            signal.sigwait({signal.SIGTERM})
            open(os.path.join(out, f"term.{os.getpid()}"), "w").close()

    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    threading.Thread(target=_note_terms, daemon=True).start()


def _idents() -> set:
    found = set()
    for name in os.listdir("/dev/shm"):
        try:
            st = os.lstat(os.path.join("/dev/shm", name))
        except OSError:
            continue
        found.add((st.st_dev, st.st_ino))
    return found


# What was there before: a segment of the same name left by an earlier job is
# opened again, not made, so it is not this rank's (map= files are recorded).
before = _idents()

from mpi4py import MPI  # noqa: E402,F401  (MPI_Init: Open MPI creates its segment)

kept = []
for arg in sys.argv[3:]:
    if arg.startswith(("map=", "make=")):
        path = arg.split("=", 1)[1]
        if arg.startswith("make="):
            path = f"{path}.{os.getpid()}"
            with open(path, "wb") as f:
                f.truncate(4096)
        with open(path, "r+b") as f:
            kept.append(mmap.mmap(f.fileno(), 4096))
held = set()
with open("/proc/self/maps") as maps:
    for line in maps:
        fields = line.split(None, 5)
        if len(fields) == 6 and fields[5].startswith("/dev/shm/"):
            path = fields[5].strip()
            st = os.stat(path)
            if (st.st_dev, st.st_ino) not in before or any(
                    arg == f"map={path}" for arg in sys.argv[3:]):
                held.add(f"{st.st_dev} {st.st_ino} {path}")
tmp = os.path.join(out, f".shm.{os.getpid()}")
with open(tmp, "w") as f:
    f.write("".join(line + "\n" for line in sorted(held)))
os.rename(tmp, os.path.join(out, f"shm.{os.getpid()}"))
time.sleep(seconds)
