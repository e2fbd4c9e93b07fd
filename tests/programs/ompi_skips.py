"""An mpi4py program for tests/system/openmpi/test_ompi_fabric.py: prints, after an allreduce,
"rank R of N pml=... btl=... LIBRARY" (the pml and btl settings in its environment)."""

import os

from mpi4py import MPI

c = MPI.COMM_WORLD
total = c.allreduce(1)
print("rank", c.rank, "of", total, "pml=%s" % os.environ.get("OMPI_MCA_pml"),
      "btl=%s" % os.environ.get("OMPI_MCA_btl"), MPI.Get_library_version().split(",")[0],
      flush=True)
