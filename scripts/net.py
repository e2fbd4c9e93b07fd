"""A tiny stand-in for a training script: prints rank, size and loss lines.

Reads its rank from the variables mslaunch (or mpirun) exports.  When
mpi4py is installed it also averages the loss across ranks with a real MPI
allreduce, so the demo shows MPI working under mslaunch (not in msrun mode,
whose processes MindSpore connects, not MPI).
"""

import math
import os
import socket

rank = int(os.environ.get("RANK_ID", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
size = int(os.environ.get("RANK_SIZE", os.environ.get("OMPI_COMM_WORLD_SIZE", "1")))

comm = None
if "MS_ROLE" not in os.environ:     # under msrun each process is a job of its own, not MPI
    try:
        from mpi4py import MPI
        comm = MPI.COMM_WORLD
        assert comm.Get_rank() == rank and comm.Get_size() == size
    except ImportError:
        pass

print(f"rank {rank} of {size} on {socket.gethostname()}, pid {os.getpid()}"
      + (f", MPI: {MPI.Get_library_version().splitlines()[0]}" if comm else ""))
for step in range(0, 50, 10):
    loss = 2.3 * math.exp(-step / 25) + 0.01 * rank
    if comm is not None:
        loss = comm.allreduce(loss) / size
    print(f"epoch: 0, step: {step}, loss is {loss:.7f}")
