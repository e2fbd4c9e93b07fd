"""An mpi4py program for tests/test_pmix.py: ``MODE [OUT]``.

show      print "rank R of N SUM LIBRARY" after an allreduce, and "host R HOSTNAME"
abort     rank 1 calls MPI_Abort(7) while the others wait in a barrier
kill      rank 1 SIGKILLs itself inside an allreduce the others are in
exit0     rank 1 exits with status 0 after MPI_Init, without MPI_Finalize
connect   rank 0 accepts, the others connect (MPI_Comm_accept/connect), then every
          rank publishes, looks up and unpublishes a name; "connected R N" and
          "named R"
spawn     every rank spawns 2 children together (MPI_Comm_spawn), which send
          their rank to the parents' rank 0: "children [0, 1]" and "child R of 2",
          and "childhost R HOSTNAME"
hold      record the /dev/shm files this rank holds in OUT/shm.RANK and its
          PMIx server's directories in OUT/dirs.RANK, say "ready", and wait in a
          barrier for a minute
"""

import os
import socket
import sys
import time

from mpi4py import MPI

c = MPI.COMM_WORLD
mode = sys.argv[1]
if mode == "show":
    total = c.allreduce(c.rank)
    print("rank", c.rank, "of", c.size, total, MPI.Get_library_version().split(",")[0],
          flush=True)
    print("host", c.rank, socket.gethostname(), flush=True)
elif mode == "abort":
    if c.rank == 1:
        c.Abort(7)
    c.barrier()
elif mode == "kill":
    c.barrier()
    if c.rank == 1:
        os.kill(os.getpid(), 9)
    c.allreduce(1)
elif mode == "exit0":
    if c.rank == 1:
        os._exit(0)
    c.barrier()
elif mode == "connect":
    others = c.Split(0 if c.rank else MPI.UNDEFINED, c.rank)
    if c.rank == 0:
        port = MPI.Open_port()
        c.send(port, dest=1)
        inter = MPI.COMM_SELF.Accept(port)
        MPI.Close_port(port)
    else:
        port = c.recv(source=0) if c.rank == 1 else None
        inter = others.Connect(port, root=0)
    print("connected", c.rank, inter.remote_size, flush=True)
    inter.Disconnect()
    name = f"pmix-test-{c.rank}"
    MPI.Publish_name(name, f"port-{c.rank}")
    c.barrier()
    peer = (c.rank + 1) % c.size
    assert MPI.Lookup_name(f"pmix-test-{peer}") == f"port-{peer}"
    c.barrier()
    MPI.Unpublish_name(name, f"port-{c.rank}")
    print("named", c.rank, flush=True)
elif mode == "spawn":
    inter = c.Spawn(sys.executable, [__file__, "child"], maxprocs=2)
    if c.rank == 0:
        print("children", sorted(inter.recv(source=i) for i in range(2)), flush=True)
    inter.Disconnect()
elif mode == "child":
    parent = MPI.Comm.Get_parent()
    print("child", c.rank, "of", c.size, flush=True)
    print("childhost", c.rank, socket.gethostname(), flush=True)
    parent.send(c.rank, dest=0)
    parent.Disconnect()
elif mode == "hold":
    c.barrier()
    held = set()
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(None, 5)
            if len(fields) == 6 and fields[5].startswith("/dev/shm/"):
                held.add(fields[5].rstrip("\n").replace(" (deleted)", ""))
    with open(os.path.join(sys.argv[2], f"shm.{c.rank}"), "w") as f:
        f.write("".join(p + "\n" for p in sorted(held)))
    dirs = {os.environ[k] for k in ("PMIX_SERVER_TMPDIR", "PMIX_SYSTEM_TMPDIR")}
    with open(os.path.join(sys.argv[2], f"dirs.{c.rank}"), "w") as f:
        f.write("".join(p + "\n" for p in sorted(dirs)))
    print("ready", flush=True)
    time.sleep(60)
    c.barrier()
