"""mpi4py rank for tests/rooms/mpi/test_pmi.py: prints one line with the allreduce of ranks."""
import sys

from mpi4py import MPI

comm = MPI.COMM_WORLD
total = comm.allreduce(comm.Get_rank())
shared = comm.Split_type(MPI.COMM_TYPE_SHARED).Get_size()
print(f"rank={comm.Get_rank()} size={comm.Get_size()} sum={total} shared={shared} "
      f"lib={MPI.Get_library_version().split()[0]}", flush=True)
sys.exit(0)
