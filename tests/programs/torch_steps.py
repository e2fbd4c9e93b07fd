"""A torchrun worker that trains in steps from a checkpoint (gloo): each step
all-reduces the step's number and adds it, divided by the world size, to a
total, so that the total is the same whatever the nodes and restarts; rank 0
writes ``$CKPT/state.json`` after each step and prints ``result TOTAL`` at
the end.  ``FAIL_RANK``/``FAIL_AT``/``FAIL_TIMES``: that rank exits 7 at that
step while the restart count is below ``FAIL_TIMES``."""

import json
import os
import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
path = os.path.join(os.environ["CKPT"], "state.json")
state = {"step": 0, "total": 0}
if os.path.exists(path):
    with open(path) as f:
        state = json.load(f)
steps = int(os.environ["STEPS"])
pause = float(os.environ.get("PAUSE", "0.05"))
print(f"rank {rank} of {world} from step {state['step']} restart {restart}", flush=True)
while state["step"] < steps:
    if (os.environ.get("FAIL_RANK") == str(rank) and state["step"] == int(os.environ["FAIL_AT"])
            and restart < int(os.environ.get("FAIL_TIMES", "1"))):
        sys.exit(7)
    t = torch.tensor([state["step"]])
    dist.all_reduce(t)
    state["total"] += int(t) // world
    state["step"] += 1
    if rank == 0:
        with open(path + ".new", "w") as f:
            json.dump(state, f)
        os.replace(path + ".new", path)
    time.sleep(pause)
if rank == 0:
    print("result", state["total"], flush=True)
dist.destroy_process_group()
