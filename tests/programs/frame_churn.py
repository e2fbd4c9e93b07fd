"""A silent rank whose main thread pushes and pops frames all the time, between
short system calls, for SECONDS.

    frame_churn.py SECONDS

Its frames are entered from C and left by exceptions, between which it asks
the kernel for its parent's pid, and gives up its CPU now and then; it prints
"survived" at the end and ends with 0.
"""

import os
import sys
import time


class Lazy:
    def __getattr__(self, name):
        raise AttributeError(name)


def churn_4713(lazy: Lazy) -> None:
    # (a frame entered from C, through a slot, and left by an exception: the
    # dump of a main thread interrupted there killed it most often)
    for _ in range(16):
        try:
            lazy.missing  # noqa: B018  (the attribute lookup is the point)
        except AttributeError:
            pass


end = time.monotonic() + float(sys.argv[1])
lazy = Lazy()
i = 0
while time.monotonic() < end:
    churn_4713(lazy)
    os.getppid()
    i += 1
    if i % 64 == 0:
        time.sleep(0)
print("survived", flush=True)
