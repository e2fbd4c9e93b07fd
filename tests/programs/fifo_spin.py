"""Keep one CPU from a sleeping process for a while, as a busy machine does:
``python fifo_spin.py CPU SECONDS PID[,PID...] [KILL_PID | fd:N]``.

Pins each PID (its main thread) to CPU and waits until every one sleeps;
then takes CPU itself at SCHED_FIFO, kills KILL_PID if given (SIGKILL) or
writes a byte to its inherited descriptor N, says ``spinning TIME`` on stdout
(``time.time()`` of that moment), spins for SECONDS and exits.  (A write is an
event at once; a killed process must itself get a CPU to die, which on a busy
machine can take longer than the spin.)  A PID woken meanwhile waits, runnable, for the CPU until
the spin ends.  Needs CAP_SYS_NICE; the kernel keeps 5% of each second for
ordinary processes, so SECONDS stays below 0.9.
"""

import os
import signal
import sys
import time

cpu, seconds = int(sys.argv[1]), float(sys.argv[2])
pids = [int(p) for p in sys.argv[3].split(",")]
event = sys.argv[4] if len(sys.argv) > 4 else ""


def all_asleep() -> bool:
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] != "S":
                return False
    return True


for pid in pids:
    os.sched_setaffinity(pid, {cpu})
os.sched_setaffinity(0, {cpu})
while True:
    while not all_asleep():
        time.sleep(0.001)
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
    # Holding the CPU now: a PID still asleep stays off it until the spin ends.
    if all_asleep():
        break
    os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
if event.startswith("fd:"):
    os.write(int(event[3:]), b"!")
elif event:
    os.kill(int(event), signal.SIGKILL)
os.write(1, f"spinning {time.time()!r}\n".encode())
end = time.monotonic() + seconds
while time.monotonic() < end:
    pass
