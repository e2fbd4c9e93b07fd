"""A PyTorch DDP training loop (gloo) with a checkpoint, as torchrun's users write
one, for jobs run with --max-restarts.

    train_ddp.py DIR FAULT

It resumes from DIR/checkpoint.pt when ``TORCHELASTIC_RESTART_COUNT`` says it
was restarted; in the first attempt, at step 3, FAULT happens (``kill``: rank 1
SIGKILLs itself; ``hold``: every rank writes DIR/held.RANK and sleeps, for good;
``none``: nothing).  Rank 0 prints the model's weights at the
end, the same whatever attempts it took.  Each rank writes DIR/attempt.A.RANK
with its host.
"""

import os
import socket
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

out, fault = sys.argv[1], sys.argv[2]
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
dist.init_process_group("gloo", init_method="env://")
rank = dist.get_rank()
with open(os.path.join(out, f"attempt.{attempt}.{rank}"), "w") as f:
    f.write(f"{socket.gethostname()}\n")
torch.manual_seed(0)
model = DistributedDataParallel(torch.nn.Linear(4, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
checkpoint = os.path.join(out, "checkpoint.pt")
step = 0
if attempt > 0 and os.path.exists(checkpoint):
    saved = torch.load(checkpoint)
    model.module.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    step = saved["step"]
while step < 8:
    g = torch.Generator().manual_seed(step * 100 + rank)
    x = torch.randn(16, 4, generator=g)
    loss = ((model(x) - x.sum(dim=1, keepdim=True)) ** 2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    step += 1
    if rank == 0:
        torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                    "step": step}, checkpoint + ".tmp")
        os.replace(checkpoint + ".tmp", checkpoint)
    dist.barrier()
    if step == 3 and attempt == 0 and fault == "kill" and rank == 1:
        os.kill(os.getpid(), 9)
    if step == 3 and attempt == 0 and fault == "hold":
        open(os.path.join(out, f"held.{rank}"), "w").close()
        time.sleep(3600)
if rank == 0:
    weights = [round(float(v), 5) for v in model.module.weight.flatten()]
    print("weights", weights, round(float(model.module.bias), 5), flush=True)
# every rank done before any tears its connections down, the group released by
# DDP and destroyed, and nothing of torch's left to the interpreter's finalization:
# torch 2.13's gloo aborted a rank at its end (SIGABRT, "terminate called without
# an active exception") in two full-suite runs on a busy machine, after a barrier
# and destroy_process_group with DDP's reducer still holding the group
dist.barrier()
del model, optimizer
dist.destroy_process_group()
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
