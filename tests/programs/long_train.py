"""A long training loop with a checkpoint, for the soak tests of --max-restarts.

    long_train.py DIR STEPS PERIOD [FAULT ...]

Every step is an allreduce followed by PERIOD seconds of "work"; rank 0 keeps
the step reached in DIR/checkpoint after each one, and a restarted attempt
resumes from it, so the job runs for about STEPS * PERIOD seconds whatever its
attempts.  Each FAULT is ``ATTEMPT:STEP:KIND``: in that attempt, once that step
is done, KIND happens:

kill     rank 1 SIGKILLs itself
abort    rank 1 calls MPI_Abort(5)
exit     rank 1 exits 3
hold     every rank writes DIR/held.ATTEMPT.RANK and sleeps outside MPI, for good
         (a host whose link the test then cuts)

Each rank writes DIR/attempt.A.RANK (its host) when it starts; rank 0 prints the
result, the same whatever attempts it took: ``result STEPS SUM``.
"""

import os
import socket
import sys
import time

out, steps, period = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
faults = {}
for word in sys.argv[4:]:
    attempt_s, step_s, kind = word.split(":")
    faults[(int(attempt_s), int(step_s))] = kind
attempt = int(os.environ["MSLAUNCH_RESTART_COUNT"])
with open(os.path.join(out, f"attempt.{attempt}.{os.environ['RANK']}"), "w") as f:
    f.write(socket.gethostname())

from mpi4py import MPI  # noqa: E402

c = MPI.COMM_WORLD
checkpoint = os.path.join(out, "checkpoint")
step, total = 0, 0
if os.path.exists(checkpoint):
    with open(checkpoint) as f:
        step, total = (int(x) for x in f.read().split())
while step < steps:
    total += c.allreduce(step * (c.rank + 1))
    step += 1
    if c.rank == 0:
        with open(checkpoint + ".tmp", "w") as f:
            f.write(f"{step} {total}")
        os.replace(checkpoint + ".tmp", checkpoint)
    c.barrier()
    kind = faults.get((attempt, step))
    if kind == "kill" and c.rank == 1:
        os.kill(os.getpid(), 9)
    elif kind == "abort" and c.rank == 1:
        c.Abort(5)
    elif kind == "exit" and c.rank == 1:
        os._exit(3)
    elif kind == "hold":
        open(os.path.join(out, f"held.{attempt}.{c.rank}"), "w").close()
        while True:
            time.sleep(1)
    time.sleep(period)
if c.rank == 0:
    print("result", step, total, flush=True)
