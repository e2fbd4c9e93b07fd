"""An mpi4py program each of whose processes is a one-rank MPI job of its own
(msrun mode, --mpi none): "pid PID" once MPI is up; the process whose RANK_ID
(or RANK) is 1 then exits with 3, the others wait to be stopped."""

import os
import sys
import time

from mpi4py import MPI

assert MPI.COMM_WORLD.size == 1
print("pid", os.getpid(), flush=True)
sys.stdout.flush()
if os.environ.get("RANK_ID", os.environ.get("RANK")) == "1":
    time.sleep(1.0)
    sys.exit(3)
time.sleep(120)
