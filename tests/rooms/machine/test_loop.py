"""The event loop's pause of a reader, and make_room, the listeners' admission rule."""

from __future__ import annotations

import os
import time

from mslaunch.machine.loop import Loop
from mslaunch.machine.peers import make_room


def _run_for(loop: Loop, seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        loop.run_once(0.01)


def test_a_paused_reader_is_read_again_after_the_pause():
    loop = Loop()
    r, w = os.pipe()
    calls = []
    try:
        loop.add_reader(r, lambda: calls.append(os.read(r, 10)))
        os.write(w, b"x")
        loop.pause_reader(r, 0.2)
        _run_for(loop, 0.1)
        assert calls == []
        _run_for(loop, 0.3)
        assert calls == [b"x"]
    finally:
        loop.close()
        os.close(r)
        os.close(w)


def test_a_reader_forgotten_or_replaced_during_its_pause_stays_so():
    loop = Loop()
    r, w = os.pipe()
    calls = []
    try:
        os.write(w, b"x")
        loop.add_reader(r, lambda: calls.append("old"))
        loop.pause_reader(r, 0.05)
        loop.forget(r)
        _run_for(loop, 0.2)
        assert calls == []
        loop.add_reader(r, lambda: calls.append("old"))
        loop.pause_reader(r, 0.05)
        loop.add_reader(r, lambda: (calls.append("new"), loop.remove_reader(r)))
        _run_for(loop, 0.2)
        assert calls == ["new"]
    finally:
        loop.close()
        os.close(r)
        os.close(w)


class _Conn:
    def __init__(self, age: float) -> None:
        self.accepted = time.monotonic() - age


def test_make_room_pushes_out_only_strangers_that_had_their_time():
    held = {i: _Conn(age) for i, age in enumerate([5.0, 1.0, 0.01])}
    dropped = []

    def drop(c: _Conn) -> None:
        key = next(k for k, v in held.items() if v is c)
        dropped.append(key)
        del held[key]

    assert make_room(held.values, 4, drop, grace=0.5) == 0.0 and dropped == []
    assert make_room(held.values, 2, drop, grace=0.5) == 0.0 and dropped == [0, 1]
    wait = make_room(held.values, 1, drop, grace=0.5)
    assert 0.4 < wait <= 0.5 and dropped == [0, 1] and list(held) == [2]


ACCEPT_WITHOUT_DESCRIPTORS = r"""
import os, resource, socket, subprocess, sys, time
from mslaunch.machine.loop import Loop
from mslaunch.machine.peers import accept_strangers
loop = Loop()
lsock = socket.socket()
lsock.bind(("127.0.0.1", 0))
lsock.listen(64)
lsock.setblocking(False)
port = lsock.getsockname()[1]
# connections made by a child, so that they cost this process nothing
child = subprocess.Popen([sys.executable, "-c",
    "import socket, sys, time\n"
    "s = [socket.create_connection(('127.0.0.1', %d)) for _ in range(20)]\n"
    "sys.stdout.write('ok'); sys.stdout.flush(); time.sleep(30)" % port],
    stdout=subprocess.PIPE)
assert child.stdout.read(2) == b"ok"
held, notes, calls = [], [], [0]
def on_accept():
    calls[0] += 1
    for sock, _ in accept_strangers(loop, lsock, lambda: held, 100, held.remove, notes.append):
        held.append(sock)
loop.add_reader(lsock.fileno(), on_accept)
used = len(os.listdir("/proc/self/fd"))
resource.setrlimit(resource.RLIMIT_NOFILE, (used + 2, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
end = time.monotonic() + 1.2
while time.monotonic() < end:
    loop.run_once(0.05)
child.kill()
print(len(held), calls[0], len(notes), notes[0] if notes else "")
"""


def test_a_listener_out_of_descriptors_rests_instead_of_spinning():
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-c", ACCEPT_WITHOUT_DESCRIPTORS],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    held, calls, notes, first = r.stdout.split(maxsplit=3)
    # a few accepted until the limit; then a look every 0.5 s, not thousands
    assert 0 < int(held) < 20 and int(calls) <= 6 and int(notes) >= 1, r.stdout
    assert "accept failed" in first and "Too many open files" in first


def test_events_are_dated_when_they_happened_not_when_the_loop_got_a_cpu():
    """An event comes while the loop sleeps (a byte in a pipe, written by the one
    that then keeps the loop's thread from its CPU for 0.4 s: a SCHED_FIFO
    spinner, as a busy machine would keep it): the callback runs 0.4 s late, yet
    ``events_at`` dates the event.  (Not a child's death: the dying child must
    get a CPU of its own to end, which on a busy machine can itself take that
    long.)"""
    import subprocess
    import sys
    from helpers import program
    from requires import require
    require(os.geteuid() == 0, "a SCHED_FIFO spinner needs root")
    cpus = sorted(os.sched_getaffinity(0))
    assert len(cpus) >= 2, "needs two CPUs"
    held = cpus[-1]
    r, w = os.pipe()
    loop, seen = Loop(), []
    loop.add_reader(r, lambda: seen.append((loop.events_at(), time.time())))
    spin = subprocess.Popen([sys.executable, program("fifo_spin.py"), str(held), "0.4",
                             str(os.getpid()), f"fd:{w}"], stdout=subprocess.PIPE,
                            pass_fds=(w,))
    try:
        while not seen:
            loop.run_once(30)
        wrote = float(spin.stdout.read().split()[1])
    finally:
        os.sched_setaffinity(0, set(cpus))
        loop.close()
        os.close(r)
        os.close(w)
        spin.kill()
        spin.wait()
    at, ran = seen[0]
    assert ran - wrote > 0.3, "the loop was not kept from its CPU"
    assert -0.01 < at - wrote < 0.15, (at - wrote, ran - wrote)
