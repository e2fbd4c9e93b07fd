"""mslaunch/machine/stacks.py reading a Python rank's dump: a dump whose writer is
held up in the middle (a loaded machine leaves a rank for milliseconds between two
of faulthandler's small writes) is read whole, never cut after its first line."""

from __future__ import annotations

import subprocess
import sys

from mslaunch.machine import pydump
from mslaunch.machine.stacks import read

#: A rank's writer side, slowed: on the hook's signal it blocks the main-thread
#: signal, as the hook does around its dump, writes the dump's first line, is held
#: up, then writes the rest.
WRITER = f"""
import os, signal, sys, time
fd = os.open(os.path.join(sys.argv[1], "%d.txt" % os.getpid()),
             os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
def dump(signum, frame):
    signal.pthread_sigmask(signal.SIG_BLOCK, ({pydump.MAIN_SIGNAL},))
    try:
        os.write(fd, b"Current thread 0x00007f0000000001 (most recent call first):\\n")
        time.sleep(float(sys.argv[2]))
        os.write(fd, b'  File "train.py", line 7 in step\\n')
        os.write(fd, b'  File "train.py", line 12 in <module>\\n')
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, ({pydump.MAIN_SIGNAL},))
signal.signal({pydump.SIGNAL}, dump)
if sys.argv[3] == "always":          # a program that blocks it itself, for good
    signal.pthread_sigmask(signal.SIG_BLOCK, ({pydump.MAIN_SIGNAL},))
    dump = lambda signum, frame: (os.write(fd, b"Current thread 0x00007f0000000001 "
                                           b"(most recent call first):\\n"
                                           b'  File "train.py", line 12 in <module>\\n'))
    signal.signal({pydump.SIGNAL}, dump)
print("armed", flush=True)
while True:
    time.sleep(0.01)
"""


def _writer(tmp_path, pause: float, blocks: str = "while dumping") -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), str(pause), blocks],
                         stdout=subprocess.PIPE)
    assert p.stdout is not None and p.stdout.readline() == b"armed\n"
    return p


def test_a_dump_held_up_after_its_first_line_is_read_whole(tmp_path):
    p = _writer(tmp_path, 0.3)
    try:
        got = read({0: p.pid}, str(tmp_path), 10, want_native=False)[0]
        assert got["threads"] == [["<module> (train.py:12)", "step (train.py:7)"]], got
        assert p.poll() is None
    finally:
        p.kill()
        p.wait()
        p.stdout.close()  # type: ignore[union-attr]


def test_a_program_that_blocks_the_main_thread_signal_itself_is_still_read(tmp_path):
    # its main thread looks as if dumping for good: the dump is taken once it has
    # stopped growing for a while
    p = _writer(tmp_path, 0, "always")
    try:
        assert pydump.dumping(p.pid)
        got = read({0: p.pid}, str(tmp_path), 10, want_native=False)[0]
        assert got["threads"] == [["<module> (train.py:12)"]], got
    finally:
        p.kill()
        p.wait()
        p.stdout.close()  # type: ignore[union-attr]
