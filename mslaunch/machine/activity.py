"""Whether a process is moving data or waiting for input, for the stall watch.

A rank inside a long collective over a slow link shows the same stack at
every sample, and so does a hung one.  What tells them apart is the bytes:

* the kernel's counters of its TCP sockets (``tcpi_bytes_acked`` and
  ``tcpi_bytes_received``, read for every TCP socket of this network
  namespace in one ``sock_diag`` netlink dump and matched to the process's
  socket descriptors): MPI over TCP, and ``send``/``recv``, which
  ``/proc/PID/io`` does not count;
* ``/proc/PID/io``'s ``rchar`` (``read``/``readv`` of files, pipes and
  sockets).  Not ``wchar``: a Python rank writes its own stack dump when the
  stall watch samples it, which would count as work; its output shows anyway.

A rank whose main thread sits in ``read`` on its standard input waits for
what mslaunch forwards (a person at the terminal): not a stall either.  No
privilege is needed beyond being the process's user (``/proc/PID/syscall``
needs the right to trace it: the agent or launcher is its parent).
"""

from __future__ import annotations

import os
import struct

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, Iterable, Set

_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST_DUMP = 0x1 | 0x300
_NLMSG_DONE, _NLMSG_ERROR = 3, 2
_INET_DIAG_INFO = 2
_MSG = struct.Struct("=BBBB48xIIIII")     # inet_diag_msg: ..., uid, inode
_ATTR = struct.Struct("=HH")
#: Offsets of tcpi_bytes_acked and tcpi_bytes_received in struct tcp_info (Linux 4.1+).
_ACKED, _RECEIVED = 120, 128
#: The read system call's number, by machine.
_READ = {"x86_64": 0, "aarch64": 63, "ppc64le": 3, "s390x": 3, "riscv64": 63}


def _inodes(pid: int) -> Set[int]:
    """The inodes of the sockets ``pid`` has open."""
    found: Set[int] = set()
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return found
    for name in names:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue
        if target.startswith("socket:["):
            found.add(int(target[8:-1]))
    return found


def _tcp_counts() -> Dict[int, int]:
    """Bytes acknowledged plus received of every TCP socket here, by inode."""
    import socket
    counts: Dict[int, int] = {}
    try:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG)
    except OSError:
        return counts
    with sock:
        sock.settimeout(2.0)
        for family in (socket.AF_INET, socket.AF_INET6):
            request = struct.pack("=BBBxI48x", family, socket.IPPROTO_TCP,
                                  1 << (_INET_DIAG_INFO - 1), 0xFFFFFFFF)
            try:
                sock.send(struct.pack("=IHHII", 16 + len(request), _SOCK_DIAG_BY_FAMILY,
                                      _NLM_F_REQUEST_DUMP, 1, 0) + request)
                _read_dump(sock, counts)
            except OSError:
                continue
    return counts


def _read_dump(sock, counts: Dict[int, int]) -> None:
    while True:
        data = sock.recv(1 << 16)
        at = 0
        while at + 16 <= len(data):
            length, kind = struct.unpack_from("=IH", data, at)
            if kind in (_NLMSG_DONE, _NLMSG_ERROR) or length < 16:
                return
            body, end = at + 16, at + length
            if body + _MSG.size <= end:
                inode = _MSG.unpack_from(data, body)[-1]
                counts[inode] = _info_bytes(data, body + _MSG.size, end)
            at += (length + 3) & ~3
        if not data:
            return


def _info_bytes(data: bytes, at: int, end: int) -> int:
    while at + 4 <= end:
        length, kind = _ATTR.unpack_from(data, at)
        if length < 4:
            break
        if kind == _INET_DIAG_INFO and length - 4 >= _RECEIVED + 8:
            acked, received = (struct.unpack_from("=Q", data, at + 4 + off)[0]
                               for off in (_ACKED, _RECEIVED))
            return acked + received
        at += (length + 3) & ~3
    return 0


def _io_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/io", "rb") as f:
            fields = dict(line.split(b":", 1) for line in f.read().splitlines() if b":" in line)
        return int(fields[b"rchar"])
    except (OSError, KeyError, ValueError):
        return -1


def moved(pids: Iterable[int]) -> Dict[int, int]:
    """A count for each of ``pids`` that grows when it moves data (see the module
    docstring); -1 for a process that cannot be read."""
    pids = list(pids)
    if not pids:
        return {}
    tcp = _tcp_counts()
    out: Dict[int, int] = {}
    for pid in pids:
        io = _io_bytes(pid)
        out[pid] = -1 if io < 0 else io + sum(tcp.get(i, 0) for i in _inodes(pid))
    return out


def reads_stdin(pid: int) -> bool:
    """Whether ``pid``'s main thread is blocked in ``read`` on its standard input."""
    number = _READ.get(os.uname().machine)
    try:
        with open(f"/proc/{pid}/syscall", "rb") as f:
            fields = f.read().split()
    except OSError:
        return False
    return number is not None and len(fields) > 1 and fields[0] == str(number).encode() \
        and int(fields[1], 16) == 0
