"""Hung mpi4py jobs for the stack tests: python stuck_ranks.py MODE RELEASE_FILE

  stuck     the last rank blocks in load_batch() until RELEASE_FILE exists; the
            others wait in an allreduce for it; then every rank prints "done"
  deadlock  ranks 0 and 1 both wait in recv for each other, for ever (the test
            stops the job)
  twice     as stuck, but the last rank then waits in save_state() until
            RELEASE_FILE.2 exists, printing nothing in between
"""
import os
import sys
import time

from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
mode, release = sys.argv[1], sys.argv[2]


def load_batch():
    while not os.path.exists(release):
        time.sleep(0.05)
    return rank


def save_state():
    while not os.path.exists(release + ".2"):
        time.sleep(0.05)


def step():
    batch = load_batch() if rank == size - 1 else rank
    if mode == "twice" and rank == size - 1:
        save_state()
    return comm.allreduce(batch)


def recv_from_peer():
    return comm.recv(source=1 - rank)


def main():
    print(f"started {rank}", flush=True)
    if mode in ("stuck", "twice"):
        total = step()
    else:
        total = recv_from_peer()
    comm.Barrier()
    print(f"done {rank} {total}", flush=True)


main()
