"""An mpi4py rank program for tests: python mpi_job.py CHECK [args].

Each check prints one JSON line per rank (or fails loudly); abort, crash and
noinit print the job's name ({"kvs": ...}) from rank 0 first:
  basic     allreduce, bcast, a point-to-point ring, Comm.Split, shared groups
  abort N   rank size-1 calls MPI.Abort(N) after a barrier; the others wait in one
  crash     rank 1 dies by SIGKILL inside an allreduce loop; others keep reducing
  noinit    rank 1 exits 0 with os._exit right after MPI init (no Finalize)
  rankenv   compare RANK_ID etc. with COMM_WORLD
"""
import json
import os
import signal
import sys
import time

from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
check = sys.argv[1]
if check in ("abort", "crash", "noinit") and rank == 0:
    # The job's name: its shared-memory segments are named after it.
    print(json.dumps({"kvs": os.environ["MSLAUNCH_JOB"]}), flush=True)

if check == "basic":
    total = comm.allreduce(rank)
    root_value = comm.bcast({"from": 0, "data": list(range(5))} if rank == 0 else None)
    right, left = (rank + 1) % size, (rank - 1) % size
    got = comm.sendrecv(rank, dest=right, source=left)
    half = comm.Split(color=rank % 2, key=rank)
    shared = comm.Split_type(MPI.COMM_TYPE_SHARED)
    print(json.dumps({
        "rank": rank, "size": size, "sum": total, "bcast": root_value, "ring": got,
        "split": [half.Get_rank(), half.Get_size(), half.allreduce(rank)],
        "shared": [shared.Get_rank(), shared.Get_size()],
        "lib": MPI.Get_library_version().split()[0],
        "env": [os.environ.get("RANK_ID"), os.environ.get("PMI_RANK")],
    }), flush=True)
elif check == "abort":
    comm.Barrier()
    if rank == size - 1:
        comm.Abort(int(sys.argv[2]))
    comm.Barrier()
    time.sleep(60)
elif check == "crash":
    for i in range(100000):
        comm.allreduce(i)
        if rank == 1 and i == 200:
            os.kill(os.getpid(), signal.SIGKILL)
elif check == "noinit":
    comm.Barrier()
    if rank == 1:
        os._exit(0)
    comm.Barrier()
    time.sleep(60)
elif check == "rankenv":
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    print(json.dumps({k: os.environ.get(k) for k in (
        "RANK_ID", "RANK_SIZE", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
        | {"mpi": [rank, size, node.Get_rank(), node.Get_size()]}), flush=True)
