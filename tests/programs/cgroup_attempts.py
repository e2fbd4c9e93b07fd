"""A rank of a restartable job that says where it runs: ``python cgroup_attempts.py DIR``.

Prints its attempt, rank, parent pid and cgroup (v2); rank 1 fails attempt 0
once rank 0 has printed, so that the job runs twice.
"""

import os
import sys
import time

with open("/proc/self/cgroup") as f:
    cgroup = [line[3:].strip() for line in f if line.startswith("0::")][0]
attempt, rank = os.environ["MSLAUNCH_RESTART_COUNT"], os.environ["PMI_RANK"]
print(attempt, rank, os.getppid(), cgroup, flush=True)
said = os.path.join(sys.argv[1], attempt)
if rank == "0":
    open(said, "w").close()
elif attempt == "0":
    while not os.path.exists(said):
        time.sleep(0.01)       # rank 0 has not printed yet
    sys.exit(5)
