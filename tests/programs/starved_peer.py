"""Two ranks on two hosts, joined by a TCP connection: ``python starved_peer.py PORT RANK0_HOST``.

Rank 1 keeps its host's agent from the CPU for half a second (fifo_spin.py,
as a busy host keeps it) and dies by SIGSEGV meanwhile; rank 0 dies by
SIGSEGV when the connection ends, as an MPI library can on a dead peer.
Rank 0's death is seen at once, rank 1's half a second late: the job's cause
is rank 1 only if its death is dated when it happened.
"""

import os
import signal
import socket
import subprocess
import sys
import time

port = int(sys.argv[1])
rank = int(os.environ["PMI_RANK"])
cpus = sorted(os.sched_getaffinity(0))
held, rest = cpus[-1], set(cpus[:-1])
agent = os.getppid()
os.sched_setaffinity(0, rest)
if rank == 0:
    os.sched_setaffinity(agent, rest)
    listener = socket.create_server(("", port))
    conn, _ = listener.accept()
    conn.recv(1)
    os.kill(os.getpid(), signal.SIGSEGV)
else:
    while True:
        try:
            conn = socket.create_connection((sys.argv[2], port))
            break
        except ConnectionRefusedError:
            time.sleep(0.01)     # rank 0 not listening yet
    spin = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fifo_spin.py")
    spinner = subprocess.Popen([sys.executable, spin, str(held), "0.5", str(agent)],
                               stdout=subprocess.PIPE)
    spinner.stdout.readline()
    os.kill(os.getpid(), signal.SIGSEGV)
