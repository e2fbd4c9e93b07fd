"""A PMIx server (the real library, in this process) whose thread is stuck in an
upcall, as libpmix's own thread was once seen stuck on a lock: its ``close``
must still come back.

Usage: pmix_stuck_close.py TMPDIR SHMDIR PROGRAM... -- two ranks of PROGRAM (an
Open MPI program) connect; the library's thread then blocks in the "connected"
upcall until the close has been timed.  Prints ``closed <result> <seconds>``.
The ranks' shared-memory segments go in SHMDIR, as under mslaunch (its caller
removes it): ranks that outlive this process, killed, leave none in /dev/shm.
"""

import os
import subprocess
import sys
import threading
import time

from mslaunch.machine.loop import Loop
from mslaunch.mpi.pmix import lib as L
from mslaunch.mpi.early import BACKING_VARIABLES, UCX_DIR_VARIABLE
from mslaunch.mpi.pmix.layout import Layout
from mslaunch.mpi.pmix.server import PMIxServer

entered, release = threading.Event(), threading.Event()


def stuck(self, proc, server_object, cbfunc, cbdata):
    entered.set()
    release.wait()
    return L.OPERATION_SUCCEEDED


PMIxServer._connected = stuck          # bound as the server is made

tmpdir, shm, program = sys.argv[1], sys.argv[2], sys.argv[3:]
segments = {name: shm for name in (*BACKING_VARIABLES, UCX_DIR_VARIABLE)}
server = PMIxServer(Loop(), L.load(), tmpdir, None)
server.start()
ns = server.namespace(Layout("stuck", ["here"], [0, 0], [0, 0], 2, 0), None,
                      lambda *args: None, lambda rank: None)
ranks = [subprocess.Popen(program, env={**os.environ, **ns.env(rank, os.environ), **segments},
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
         for rank in range(2)]
try:
    if not entered.wait(60):
        print("no rank connected", flush=True)
    else:
        began = time.monotonic()
        ok = server.close(patience=1.0)
        print("closed", ok, round(time.monotonic() - began, 1), flush=True)
finally:
    release.set()
    for p in ranks:
        p.kill()
        p.wait()
os._exit(0)        # the library's thread may still be finishing its stop
