"""A silent rank whose threads run Python all the time, for SECONDS.

    thread_churn.py SECONDS

Two threads at a time recurse and return (pushing and popping frames) and
new ones are started as they end; the main thread does the same.  Nothing is
printed before the end, so a stall watch keeps sampling it; it prints
"survived" and ends with 0.
"""

import sys
import threading
import time


def deep(n: int) -> int:
    return 1 if n == 0 else deep(n - 1) + 1


def work() -> None:
    for _ in range(200):
        deep(200)


end = time.monotonic() + float(sys.argv[1])


def churn() -> None:
    while time.monotonic() < end:
        pair = [threading.Thread(target=work) for _ in range(2)]
        for t in pair:
            t.start()
        for t in pair:
            t.join()


starter = threading.Thread(target=churn)
starter.start()
while time.monotonic() < end:
    deep(300)
starter.join()
print("survived", flush=True)
