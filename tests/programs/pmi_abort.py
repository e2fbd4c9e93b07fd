"""mpi4py rank for tests/rooms/mpi/test_pmi.py: rank 0 calls MPI.Abort(7), others wait."""
import time

from mpi4py import MPI

comm = MPI.COMM_WORLD
if comm.Get_rank() == 0:
    comm.Abort(7)
time.sleep(60)
