"""An mpi4py program whose rank ``R`` (or every rank: ``all``) raises
ZeroDivisionError while the others wait in a barrier: ``R``.  Each rank's
exit handlers print "atexit R" (they do not run when the rank ends at once)."""

import atexit
import sys
import time

from mpi4py import MPI

c = MPI.COMM_WORLD
atexit.register(lambda: print("atexit", c.rank, flush=True))
if sys.argv[1] in (str(c.rank), "all"):
    time.sleep(0.2)
    print(1 / 0)
c.Barrier()
