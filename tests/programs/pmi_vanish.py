"""mpi4py rank for tests/rooms/mpi/test_pmi.py: the last rank leaves with os._exit(0) after init."""
import os

from mpi4py import MPI

comm = MPI.COMM_WORLD
if comm.Get_rank() == comm.Get_size() - 1:
    os._exit(0)
comm.Barrier()
