"""An mpi4py program for tests/system/openmpi/test_pmix.py: ``MODE [OUT]``.

show      print "rank R of N SUM LIBRARY" after an allreduce, and "host R HOSTNAME"
abort     rank 1 calls MPI_Abort(7) while the others sleep (outside MPI)
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
follow    rank 3 SIGKILLs rank 1 (its pid in OUT/pid.1; the test hosts share one
          machine) and calls MPI_Abort(14) at once; the others wait in a barrier
wait      write this rank's PMIX_NAMESPACE, PMIX_SERVER_URI4, PMI_PORT and PMI_ID to
          OUT/job.RANK (JSON), and wait after MPI_Init until OUT/go exists, then
          meet the others in a barrier: "done R"
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
    # The others wait outside MPI: a rank in a collective with rank 1 may abort on
    # its broken connection before rank 1's own abort reaches its host's agent (Open
    # MPI 5 closes its connections first), and two aborts are not ordered by cause.
    c.barrier()
    if c.rank == 1:
        c.Abort(7)
    time.sleep(60)
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
elif mode == "wait":
    import json
    out = sys.argv[2]
    names = ("PMIX_NAMESPACE", "PMIX_SERVER_URI4", "PMI_PORT", "PMI_ID")
    with open(os.path.join(out, f"job.{c.rank}.new"), "w") as f:
        json.dump({n: os.environ.get(n) for n in names}, f)
    os.rename(os.path.join(out, f"job.{c.rank}.new"), os.path.join(out, f"job.{c.rank}"))
    while not os.path.exists(os.path.join(out, "go")):
        time.sleep(0.05)
    c.barrier()
    print("done", c.rank, flush=True)
elif mode == "follow":
    out = sys.argv[2]
    if c.rank == 1:
        with open(os.path.join(out, "pid.1"), "w") as f:
            f.write(str(os.getpid()))
    c.barrier()
    if c.rank == 3:
        # the death and the abort both at once, from here: nothing of the job's stop
        # can reach this host in between (this rank runs; the stop needs three)
        with open(os.path.join(out, "pid.1")) as f:
            os.kill(int(f.read()), 9)
        c.Abort(14)
    c.barrier()
