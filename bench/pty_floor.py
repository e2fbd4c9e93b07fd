"""The relay floor through pseudo-terminals: the least any pty relay can cost.

Usage: ``python bench/pty_floor.py N cmd [args...]``

Starts N copies of the command, each with its stdout on a pseudo-terminal
of its own, set up as mslaunch sets it up (no echo, output processing
off), and copies whatever the terminals give to this process's stdout with
a bare ``epoll`` loop: each terminal is read until it is empty (or 1 MiB
was read), and the bytes are written on at once, unchanged, with no line handling, no files, no
flow control.  What remains is the kernel's cost of a pseudo-terminal (its
line discipline hands the reader a few KiB at a time), which bounds the
throughput of every launcher that gives ranks a terminal, Open MPI's
included.  Exit status as ``floor.py``.
"""

from __future__ import annotations

import os
import select
import sys
import termios


def open_pty():
    master, slave = os.openpty()
    attrs = termios.tcgetattr(slave)
    attrs[1] &= ~termios.OPOST
    attrs[3] &= ~(termios.ECHO | termios.ECHONL)
    termios.tcsetattr(slave, termios.TCSANOW, attrs)
    return master, slave


def write_all(data: memoryview) -> None:
    while data:
        data = data[os.write(1, data):]


def main(argv) -> int:
    if len(argv) < 2 or not argv[0].isdigit() or int(argv[0]) < 1:
        sys.stderr.write("usage: pty_floor.py N cmd [args...]\n")
        return 2
    count, command = int(argv[0]), argv[1:]
    poll = select.epoll()
    masters = set()
    pids = []
    for _ in range(count):
        master, slave = open_pty()
        pid = os.posix_spawnp(command[0], command, os.environ,
                              file_actions=[(os.POSIX_SPAWN_DUP2, slave, 1)])
        os.close(slave)
        os.set_blocking(master, False)
        poll.register(master, select.EPOLLIN)
        masters.add(master)
        pids.append(pid)
    buf = bytearray(1 << 20)
    view = memoryview(buf)
    while masters:
        for fd, _ in poll.poll():
            filled, n = 0, -1
            while filled < len(buf) - 65536:
                try:
                    n = os.readv(fd, [view[filled:]])
                except BlockingIOError:
                    break
                except OSError:
                    n = 0          # EIO: the last writer has gone
                if n == 0:
                    break
                filled += n
            write_all(view[:filled])
            if n == 0:
                poll.unregister(fd)
                os.close(fd)
                masters.discard(fd)
    first = 0
    for pid in pids:
        code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        code = 128 - code if code < 0 else code
        if code and not first:
            first = code
    return first


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
