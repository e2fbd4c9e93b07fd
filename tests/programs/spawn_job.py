"""MPI_Comm_spawn cases for the tests: ``spawn_job.py MODE [ARGS]`` (parent) or
``spawn_job.py child MODE [ARGS]`` (a spawned process).

The parent prints one JSON line with what its children reported; children
print a line of their own ("child R of N") to stdout.
"""

import json
import os
import socket
import sys
import time

from mpi4py import MPI

HERE = os.path.abspath(__file__)


def report():
    env = os.environ
    return {"rank": MPI.COMM_WORLD.Get_rank(), "size": MPI.COMM_WORLD.Get_size(),
            "spawned": env.get("PMI_SPAWNED"), "job": env.get("MSLAUNCH_JOB"),
            "appnum": MPI.COMM_WORLD.Get_attr(MPI.APPNUM), "cwd": os.getcwd(),
            "argv": sys.argv[1:], "host": env.get("PMI_HOSTNAME") or socket.gethostname(),
            "pid": os.getpid()}


def child(mode, args):
    parent = MPI.Comm.Get_parent()
    rank = MPI.COMM_WORLD.Get_rank()
    print(f"child {rank} of {MPI.COMM_WORLD.Get_size()}", flush=True)
    if mode == "nested" and rank == 0:
        grand = MPI.COMM_SELF.Spawn(sys.executable, [HERE, "child", "leaf"], maxprocs=1)
        leaf = grand.recv(source=0)
        grand.Disconnect()
        info = dict(report(), grandchild=leaf)
    else:
        info = report()
    if mode == "leaf":
        parent.send(info, dest=0)
        parent.Disconnect()
        return 0
    if mode == "lookup":
        port = MPI.Lookup_name("mslaunch-test-service")
        comm = MPI.COMM_SELF.Connect(port)
        comm.send({"hello": rank}, dest=0)
        comm.Disconnect()
    parent.gather(info, root=0)
    parent.Disconnect()
    if mode == "fail":
        return int(args[0])
    if mode == "sleep":
        time.sleep(600)
    return 0


def spawn(comm, mode, n, args=(), **kw):
    return comm.Spawn(sys.executable, [HERE, "child", mode, *args], maxprocs=n, **kw)


def parent(mode, args):
    me = MPI.COMM_WORLD.Get_rank()
    out = {"parent": me, "universe": MPI.COMM_WORLD.Get_attr(MPI.UNIVERSE_SIZE)}
    if mode == "multiple":
        inter = MPI.COMM_SELF.Spawn_multiple(
            [sys.executable, sys.executable],
            [[HERE, "child", "basic", "a"], [HERE, "child", "basic", "b"]], [1, 2])
    elif mode == "info":
        info = MPI.Info.Create()
        for pair in args:
            key, _, value = pair.partition("=")
            info.Set(key, value)
        try:
            inter = spawn(MPI.COMM_SELF, "basic", 1, info=info)
        except MPI.Exception as err:
            out["error"] = err.Get_error_class()
            print(json.dumps(out), flush=True)
            return 0
    elif mode == "program":
        # A bare program name, found through the info key path=.
        info = MPI.Info.Create()
        info.Set("path", args[0])
        try:
            inter = MPI.COMM_SELF.Spawn(args[1], [HERE, "child", "basic"], maxprocs=1,
                                        info=info)
        except MPI.Exception as err:
            out["error"] = err.Get_error_class()
            print(json.dumps(out), flush=True)
            return 0
    elif mode == "publish":
        port = MPI.Open_port()
        MPI.Publish_name("mslaunch-test-service", port)
        inter = spawn(MPI.COMM_SELF, "lookup", 1)
        conn = MPI.COMM_SELF.Accept(port)
        out["accepted"] = conn.recv(source=0)
        conn.Disconnect()
        MPI.Unpublish_name("mslaunch-test-service", port)
        MPI.Close_port(port)
    elif mode == "world":
        # Every rank takes part; rank 0 of COMM_WORLD is the root of the spawn.
        inter = spawn(MPI.COMM_WORLD, args[0] if args else "basic", 2)
        if me != 0:
            inter.gather(None, root=MPI.PROC_NULL)
            inter.Disconnect()
            return 0
    else:
        n = int(args[0]) if args else 2
        inter = spawn(MPI.COMM_SELF, mode, n, args[1:])
    out["children"] = inter.gather(None, root=MPI.ROOT)
    inter.Disconnect()
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "child":
        sys.exit(child(sys.argv[2], sys.argv[3:]))
    sys.exit(parent(sys.argv[1], sys.argv[2:]))
