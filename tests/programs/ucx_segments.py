"""An MPICH rank that prints the UCX segments it maps (its ``UCX_POSIX_DIR`` too),
then rank 1 is SIGKILLed, as a crash would: what it had made stays where UCX put it."""

import os
import signal

from mpi4py import MPI

c = MPI.COMM_WORLD
c.Barrier()
with open("/proc/self/maps") as f:
    mine = sorted({line.split(None, 5)[5].strip() for line in f
                   if len(line.split(None, 5)) == 6 and "/ucx_shm_posix_" in line})
print("segments", c.rank, os.environ.get("UCX_POSIX_DIR"), *mine, flush=True)
c.Barrier()
if c.rank == 1:
    os.kill(os.getpid(), signal.SIGKILL)
c.Barrier()
