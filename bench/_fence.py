"""A PMI-1 client for bench/scale.py: every rank puts a key and fences twice;
rank 0 prints how long the second fence took (every rank is up by then)."""

import os
import socket
import time

_sock = socket.socket(fileno=int(os.environ["PMI_FD"]))
_buf = b""


def ask(line: str) -> str:
    global _buf
    _sock.sendall(line.encode())
    while b"\n" not in _buf:
        data = _sock.recv(4096)
        if not data:
            raise SystemExit("the PMI server closed the connection")
        _buf += data
    reply, _, _buf = _buf.partition(b"\n")
    return reply.decode()


rank = int(os.environ["PMI_RANK"])
ask("cmd=init pmi_version=1 pmi_subversion=1\n")
kvs = ask("cmd=get_my_kvsname\n").split("kvsname=")[1].split()[0]
ask(f"cmd=put kvsname={kvs} key=a{rank} value={'x' * 64}\n")
ask("cmd=barrier_in\n")
start = time.perf_counter()
ask(f"cmd=put kvsname={kvs} key=b{rank} value={'y' * 64}\n")
ask("cmd=barrier_in\n")
took = time.perf_counter() - start
ask("cmd=finalize\n")
if rank == 0:
    print(f"fence_ms {took * 1000:.2f}", flush=True)
