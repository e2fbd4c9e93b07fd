"""A rank that logs the signals it gets to a file, then exits as told.

usage: trap.py LOGDIR [exit-on-signal: yes|no]
Writes 'ready' when its handlers are installed, one line per signal.
"""
import os
import signal
import sys
import time

logdir, leave = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "yes") == "yes"
rank = os.environ.get("RANK", "?")
path = os.path.join(logdir, f"rank{rank}.log")


def log(text):
    with open(path, "a") as f:
        f.write(text + "\n")


def handler(signum, frame):
    log(signal.Signals(signum).name)
    if leave and signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        sys.exit(0)


for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
    signal.signal(s, handler)
log("ready")
deadline = time.time() + 60
while time.time() < deadline:
    time.sleep(0.05)
