"""A training loop with a checkpoint, for jobs run with --max-restarts.

    train_loop.py DIR FAULT [STEPS]

Every step is an allreduce; rank 0 keeps the step reached in DIR/checkpoint
after each one, and a restarted attempt resumes from it.  In the first attempt
(``MSLAUNCH_RESTART_COUNT`` 0) at step 3, FAULT happens:

kill     rank 1 SIGKILLs itself
abort    rank 1 calls MPI_Abort(5)
hold     every rank writes DIR/held.RANK and sleeps outside MPI, for good (a hang,
         or a host whose link the test cuts)
always   rank 1 exits 3, in every attempt, before MPI_Init
none     nothing

Each rank writes DIR/attempt.A.RANK: its host, and both restart counts; rank 0
prints the result: the sum over all steps of the allreduced values, the same
whatever attempts it took.
"""

import os
import socket
import sys
import time

out, fault = sys.argv[1], sys.argv[2]
steps = int(sys.argv[3]) if len(sys.argv) > 3 else 8
attempt = int(os.environ["MSLAUNCH_RESTART_COUNT"])
rank_env = int(os.environ["RANK"])
with open(os.path.join(out, f"attempt.{attempt}.{rank_env}"), "w") as f:
    f.write(f"{socket.gethostname()} {os.environ['MSLAUNCH_RESTART_COUNT']} "
            f"{os.environ['TORCHELASTIC_RESTART_COUNT']} {os.environ['MSLAUNCH_MAX_RESTARTS']}\n")
if fault == "always" and rank_env == 1:
    sys.exit(3)

from mpi4py import MPI  # noqa: E402

c = MPI.COMM_WORLD
checkpoint = os.path.join(out, "checkpoint")
state = [0, 0]          # step, sum
if os.path.exists(checkpoint):
    with open(checkpoint) as f:
        state = [int(x) for x in f.read().split()]
step, total = state
while step < steps:
    total += c.allreduce(step * (c.rank + 1))
    step += 1
    if c.rank == 0:
        with open(checkpoint + ".tmp", "w") as f:
            f.write(f"{step} {total}")
        os.replace(checkpoint + ".tmp", checkpoint)
    c.barrier()
    if step == 3 and attempt == 0:
        if fault == "kill" and c.rank == 1:
            os.kill(os.getpid(), 9)
        elif fault == "abort" and c.rank == 1:
            c.Abort(5)
        elif fault == "hold":
            open(os.path.join(out, f"held.{c.rank}"), "w").close()
            while True:
                time.sleep(1)
    time.sleep(0.05)
if c.rank == 0:
    print("result", step, total, flush=True)
