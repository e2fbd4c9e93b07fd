"""A PMIx host (the real library, in this process) whose server starts aside, as a
knock at its door starts it: what waits for the start, and what the loop does
meanwhile.

Usage: pmix_aside.py MODE DIRECTORY FIFO

- ``guest``: the start waits on FIFO (the library writes its address there);
  a guest job made known meanwhile is queued, not waited for; once FIFO is
  read, the knocker is let in and the guest job registered.
- ``restart``: the attempt ends during the start (the door closed, its
  knocker with it) and the next attempt's loop takes the server over.
- ``fail``: the server cannot start (PMIX_MCA_gds names no store): the
  knocker is closed, and so is the next one.
- ``alone``: no door, nothing started: a guest job made known starts the
  server aside and is queued; the loop turns meanwhile; once FIFO is read, the
  guest job is registered.
- ``wait``: no door, nothing started: a job served here waits for the start,
  its host's ``keepalive`` called meanwhile (the second call reads FIFO).

Prints one line per step; ``done`` at the end.  Runs in a process of its own:
a library whose server failed, or was started once, is not started again.
"""

import os
import socket
import sys
import time

from mslaunch.machine.loop import Loop
from mslaunch.mpi.pmix.door import Door
from mslaunch.mpi.pmix.host import PMIxHost
from mslaunch.mpi.pmix.layout import Layout

mode, directory, fifo = sys.argv[1:4]
if mode == "fail":
    os.environ["PMIX_MCA_gds"] = "nosuch"
else:
    os.environ["PMIX_MCA_ptl_tcp_report_uri"] = fifo


def turn(loop, until, what, limit=60.0):
    deadline = time.monotonic() + limit
    while not until():
        if time.monotonic() > deadline:
            print(f"stuck: {what}", flush=True)
            os._exit(1)
        loop.run_once(0.05)


def knock(door):
    client = socket.create_connection(("127.0.0.1", door.port))
    client.setblocking(False)
    return client


def closed(client):
    try:
        return client.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


class Job:
    """What a served job's namespace asks of its job while no rank connects."""

    pmix = None

    def pid_of(self, rank):
        return None


loop = Loop()
host = PMIxHost(loop, directory, lambda line: print("log", line, flush=True),
                lambda nspace, rank, done: done(None))
if mode not in ("alone", "wait"):
    host.door = door = Door(loop, "127.0.0.1", host._wake)
    client = knock(door)
    turn(loop, lambda: door.state != "asleep", "the knock")
if mode == "alone":
    host.guest(Layout("guestjob", ["elsewhere"], [0, 0], [0, 0], 2, -1))
    print("guest queued", host.server is None, flush=True)
    turns = [0]

    def count():
        turns[0] += 1
        return turns[0] >= 3
    turn(loop, count, "the loop's turns")
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    turn(loop, lambda: host.server is not None and "guestjob" in host.server.namespaces,
         "the guest registered")
    print("registered", flush=True)
    os.close(reader)
elif mode == "wait":
    readers = []

    def keepalive():
        readers.append(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK) if len(readers) == 1
                       else None)
    host.keepalive = keepalive
    served = host.serve(Job(), Layout("waitjob", ["here"], [0], [0], 1, 0),
                        lambda signature, sequence, blob, done: None)
    print("served", served, len(readers) >= 2, flush=True)
    os.close(readers[1])
elif mode == "fail":
    turn(loop, lambda: closed(client), "the knocker closed")
    print("closed", "PMIx_server_init failed" in (host.problem or ""), flush=True)
    again = knock(door)
    turn(loop, lambda: closed(again), "the next knocker closed")
    print("closed again", flush=True)
elif mode == "guest":
    host.guest(Layout("guestjob", ["elsewhere"], [0, 0], [0, 0], 2, -1))
    print("guest queued", host.server is None, flush=True)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)     # lets the library's write by
    turn(loop, lambda: bool(door.pairs), "the knocker let in")
    assert host.server is not None
    print("let in", "guestjob" in host.server.namespaces, flush=True)
    os.close(reader)
elif mode == "restart":
    host.retire()
    turn(loop, lambda: closed(client), "the knocker closed with its attempt")
    loop.close()
    loop = Loop()
    host.adopt(loop, lambda line: print("log", line, flush=True),
               lambda nspace, rank, done: done(None))
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    turn(loop, lambda: host.server is not None, "the server taken over")
    print("taken over", host.server.loop is loop and host.server.inbox.loop is loop, flush=True)
    os.close(reader)
host.close()
print("done", flush=True)
