"""Ranks that wait before ``MPI_Init`` (tests/system/remote/test_shared_node.py): ``OUT``.

Each writes ``OUT/ready.RANK`` and waits until ``OUT/go`` exists, then imports
mpi4py (``MPI_Init``), sums the ranks plus one in an allreduce and prints
``sum S at R``; then waits until ``OUT/end`` exists.
"""

import os
import sys
import time

out = sys.argv[1]
rank = os.environ.get("PMI_RANK") or os.environ["OMPI_COMM_WORLD_RANK"]
with open(os.path.join(out, f"ready.{rank}"), "w") as f:
    f.write(str(os.getpid()))
while not os.path.exists(os.path.join(out, "go")):
    time.sleep(0.05)
from mpi4py import MPI  # noqa: E402  (MPI_Init, only now)

c = MPI.COMM_WORLD
print(f"sum {c.allreduce(c.rank + 1)} at {c.rank}", flush=True)
while not os.path.exists(os.path.join(out, "end")):
    time.sleep(0.05)
