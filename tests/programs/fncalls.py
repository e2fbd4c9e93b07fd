"""Functions that mslaunch.launch and torch's elastic_launch call on their ranks
(found there by this module's name: tests/programs is on the ranks' path)."""

import os
import sys


def times_ten(x):
    """x * 10 + the rank, printing a line first."""
    print(f"rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']} says hi", flush=True)
    return x * 10 + int(os.environ["RANK"])


def where(tag):
    return (tag, int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]))


def fail_in(rank, code=None, signal=None):
    """Raise in ``rank`` (or exit with ``code``, or kill itself with ``signal``)."""
    if os.environ["RANK"] == str(rank):
        if signal is not None:
            os.kill(os.getpid(), signal)
        if code is not None:
            sys.exit(code)
        raise KeyError(f"no such key in rank {rank}")
    return "fine"


def flaky(rank):
    """Fails in ``rank`` in the first attempt only; its attempt otherwise."""
    attempt = int(os.environ.get("MSLAUNCH_RESTART_COUNT", "0"))
    if attempt == 0 and os.environ["RANK"] == str(rank):
        raise RuntimeError("the first attempt fails")
    return attempt


def big(size):
    """``size`` bytes of this rank's, with lines of output around them."""
    rank = int(os.environ["RANK"])
    sys.stdout.write(f"partial line of rank {rank} without a newline")
    sys.stdout.flush()
    return bytes([rank]) * size


class Unpicklable(Exception):
    def __init__(self, handle):
        super().__init__("holds a handle")
        self.handle = handle

    def __reduce__(self):
        raise TypeError("cannot pickle this one")


def unpicklable(rank):
    if os.environ["RANK"] == str(rank):
        raise Unpicklable(lambda: None)


def gloo_sum():
    """The sum of the ranks, by gloo's all-reduce (torch's variables set by the launcher)."""
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    total = torch.tensor([float(os.environ["RANK"])])
    dist.all_reduce(total)
    dist.destroy_process_group()
    return total.item()


def echo(value):
    """The argument itself, back (an instance of a class of the caller's script)."""
    return value


def noted():
    err = ValueError("the real message")
    err.add_note("a hint the function added")
    raise err


def sleeper(tagdir):
    """Say it started (a file per rank in ``tagdir``), then sleep."""
    import time
    open(os.path.join(tagdir, os.environ["RANK"]), "w").close()
    time.sleep(600)
