"""One-process parents that spawn, the patterns of MPICH's spawn tests that a
one-rank Open MPI job must run (our own programs, written after what those
tests do).

    spawn_patterns.py conacc [data]   spawn a connector, then an acceptor (one
        process each, two spawns); the acceptor opens a port and sends its name
        through the parent to the connector; they connect and accept, (with
        ``data``) the acceptor sends 123, both disconnect, and each meets the
        parent in a barrier
    spawn_patterns.py tree N          spawn N children one at a time, each told
        to spawn N-1 of its own, and so on: every process reports how many
        processes its subtree had
    spawn_patterns.py pool            mpi4py.futures' MPIPoolExecutor with two
        workers maps a function over 8 numbers

The parent prints ``No Errors`` (and, for ``tree``, ``processes K``) when
all went as it should, and exits 1 otherwise.
"""

import sys

from mpi4py import MPI

ME = [sys.executable, __file__]


def conacc(data):
    self = MPI.COMM_SELF
    extra = ["data"] if data else []
    connector = self.Spawn(ME[0], [ME[1], "connector"] + extra, maxprocs=1)
    acceptor = self.Spawn(ME[0], [ME[1], "acceptor"] + extra, maxprocs=1)
    port = acceptor.recv(source=0, tag=0)
    connector.send(port, dest=0, tag=0)
    acceptor.Barrier()
    connector.Barrier()
    ok = acceptor.recv(source=0, tag=1) and connector.recv(source=0, tag=1)
    acceptor.Disconnect()
    connector.Disconnect()
    return ok


def conacc_child(role, data):
    parent = MPI.Comm.Get_parent()
    ok = parent != MPI.COMM_NULL
    if role == "acceptor":
        port = MPI.Open_port()
        parent.send(port, dest=0, tag=0)
        comm = MPI.COMM_SELF.Accept(port)
        MPI.Close_port(port)
        if data:
            comm.send(123, dest=0, tag=7)
    else:
        port = parent.recv(source=0, tag=0)
        comm = MPI.COMM_SELF.Connect(port)
        if data:
            ok = ok and comm.recv(source=0, tag=7) == 123
    comm.Disconnect()
    parent.Barrier()
    parent.send(ok, dest=0, tag=1)
    parent.Disconnect()


def tree(n):
    """This process's subtree: the processes in it, all counted."""
    count = 1
    for _ in range(n):
        child = MPI.COMM_WORLD.Spawn(ME[0], [ME[1], "tree", str(n - 1)], maxprocs=1)
        if child.Get_remote_size() != 1:
            return 0
        children = child
        count += children.recv(source=0, tag=2)
        children.Disconnect()
    return count


def pool():
    from mpi4py.futures import MPIPoolExecutor
    with MPIPoolExecutor(max_workers=2) as executor:
        got = list(executor.map(pow, range(8), [2] * 8))
    return got == [i * i for i in range(8)]


def main(argv):
    mode = argv[0]
    parent = MPI.Comm.Get_parent()
    if mode in ("connector", "acceptor"):
        conacc_child(mode, argv[1:] == ["data"])
        return 0
    if mode == "tree" and parent != MPI.COMM_NULL:
        parent.send(tree(int(argv[1])), dest=0, tag=2)
        parent.Disconnect()
        return 0
    if mode == "tree":
        count = tree(int(argv[1]))
        print(f"processes {count}", flush=True)
        ok = count > 0
    elif mode == "conacc":
        ok = conacc(argv[1:] == ["data"])
    elif mode == "pool":
        ok = pool()
    else:
        print(f"unknown mode {mode}", flush=True)
        return 2
    print(" No Errors" if ok else " Found errors", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
