"""A signal to a Python rank's main thread, sent only where its frames are whole.

faulthandler's dump of the thread that takes its signal runs in C, inside
the signal handler, and walks that thread's frames as they stand.  A thread
interrupted while it pushes or pops a frame is walked half-way through the
change: from CPython 3.11 on (frames on the interpreter's own stack), that
killed the rank with SIGSEGV, about one signal in two thousand to a thread
running Python (3.11, 3.12), one in a few dozen (3.13).

So :func:`to_main_thread` stops the rank (SIGSTOP, for a fraction of a
millisecond), reads where its main thread stands (:func:`_frames_whole`),
sends the signal to that thread (tgkill) only if it waits in a system call
other than one that maps memory, or runs code outside the interpreter, the C
library and the loader (an MPI library's busy wait, a kernel of torch's),
and continues the rank (SIGCONT); the handler runs as the thread goes on,
from where it stood.  Those reads need the right to trace the rank (Yama's
``ptrace_scope`` 2 or 3 denies it to a user).  A rank that is stopped
already, or traced (a native reader of this process's, a debugger), is left
alone: elfutils' attach to a rank it finds stopped stops it again as it
detaches, so after our SIGCONT the rank would stay stopped.
"""

from __future__ import annotations

import _thread
import os

from .procs import proc_state

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Literal, Optional

    #: What :func:`to_main_thread` did.
    Sent = Literal["sent", "ran", "not permitted", "stopped", "gone"]

#: Seconds a rank is given to stop (SIGSTOP) for a look at its main thread.
STOP_WAIT = 0.1
#: By ``os.uname().machine``: the system call instruction (the one a thread
#: stopped in a system call has just run), and the numbers of the calls that map
#: memory (the interpreter unmaps a piece of its frame stack while the frame that
#: was on it is still the current one).
_MACHINES = {"x86_64": (b"\x0f\x05", frozenset({9, 10, 11, 12, 25, 28})),
             "aarch64": (b"\x01\x00\x00\xd4", frozenset({214, 215, 216, 222, 226, 233}))}
#: Code a thread may run in the middle of a change to its frames: the
#: interpreter's own, the C library's (memory it allocates, copies and frees
#: for the interpreter) and the dynamic loader's (a symbol bound on first use).
_INTERPRETER = ("libpython", "libc.so", "libc-", "ld-linux", "ld-musl", "libc.musl")

#: Held while a rank is stopped for a look at its main thread, and while a
#: tracer of this process's is counted in or out (:data:`_traced`).
_lock = _thread.allocate_lock()
#: Ranks a reader started by this process traces (eu-stack, gdb, py-spy), by pid.
_traced: Dict[int, int] = {}


def tracing(pid: int, more: int) -> None:
    """A reader of this process's starts (``more`` 1) or stops (-1) tracing ``pid``;
    it waits for a look at the rank's main thread under way."""
    with _lock:
        count = _traced.get(pid, 0) + more
        if count > 0:
            _traced[pid] = count
        else:
            _traced.pop(pid, None)


def to_main_thread(pid: int, signum: int) -> Sent:
    """Send ``signum`` to ``pid``'s main thread itself, only where its frames are
    whole: "sent"; "ran" (it ran the interpreter's code, or a tracer holds the
    rank: ask again); "not permitted"; "stopped" (by someone else: left so); or
    "gone".  tgkill, as a signal sent to the process may be taken by another
    thread, whose stack would then be read as the main one."""
    import signal
    with _lock:
        held = _held(pid)
        if held in ("stopped", "gone"):
            return held
        if held == "traced" or _traced.get(pid):
            return "ran"
        os.kill(pid, signal.SIGSTOP)
        try:
            if not _stopped(pid):
                return "ran"
            whole = _frames_whole(pid)
            if whole is None:
                return "not permitted"
            if not whole:
                return "ran"
            _tgkill(pid, signum)
            return "sent"
        finally:
            # (a SIGCONT also drops a SIGSTOP still pending: a rank in
            # uninterruptible sleep past STOP_WAIT is not left to stop later)
            os.kill(pid, signal.SIGCONT)


def _held(pid: int) -> Literal["running", "traced", "stopped", "gone"]:
    """"running", "traced", "stopped" (state T or t, untraced) or "gone", from
    ``pid``'s status."""
    state, tracer = "", "0"
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"State:"):
                    state = line.split()[1].decode()
                elif line.startswith(b"TracerPid:"):
                    tracer = line.split()[1].decode()
                    break
    except (OSError, IndexError):
        return "gone"
    if not state or state in "ZX":
        return "gone"
    if tracer != "0":
        return "traced"
    return "stopped" if state in "Tt" else "running"


def _stopped(pid: int) -> bool:
    """Whether ``pid``'s main thread (the process's own state) stops (T) within
    :data:`STOP_WAIT`."""
    import time
    deadline = time.monotonic() + STOP_WAIT
    while True:
        state = proc_state(pid)
        if state in ("T", ""):
            return state == "T"
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.0001)


def _frames_whole(pid: int) -> Optional[bool]:
    """Whether ``pid``'s stopped main thread stands where its frames are whole: in a
    system call (other than one that maps memory), or running code outside the
    interpreter, the C library and the loader; None if this process may not tell
    (the right to trace the rank; x86_64 and aarch64 only).

    The kernel's number of a thread stopped on its way out of a page fault is the
    fault's error code, which reads as a system call: a thread in a system call has
    the machine's system call instruction just before its next one (read in
    ``/proc/PID/mem``)."""
    machine = _MACHINES.get(os.uname().machine)
    if machine is None:
        return None
    insn, memory_calls = machine
    try:
        with open(f"/proc/{pid}/task/{pid}/syscall", "rb") as f:
            fields = f.read().split()
        nr, pc = int(fields[0]), int(fields[-1], 16)
        if nr >= 0:
            fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY | os.O_CLOEXEC)
            try:
                before = os.pread(fd, len(insn), pc - len(insn))
            finally:
                os.close(fd)
            if before == insn:
                return nr not in memory_calls
        return _outside_interpreter(pid, pc)
    except PermissionError:
        return None
    except (OSError, ValueError, IndexError):     # ("running": not stopped after all)
        return False


def _outside_interpreter(pid: int, pc: int) -> bool:
    """Whether ``pc`` lies in a file's code other than the interpreter's, the C
    library's or the loader's (see :data:`_INTERPRETER`; anonymous code may be a
    JIT's of the interpreter)."""
    exe = os.readlink(f"/proc/{pid}/exe")
    with open(f"/proc/{pid}/maps", "rb") as f:
        data = f.read()
    for line in data.splitlines():
        dash = line.find(b"-")
        space = line.find(b" ", dash)
        if not int(line[:dash], 16) <= pc < int(line[dash + 1:space], 16):
            continue
        fields = line.split(None, 5)
        path = fields[5].decode("utf-8", "replace") if len(fields) > 5 else ""
        return b"x" in fields[1] and path.startswith("/") and path != exe and \
            not os.path.basename(path).startswith(_INTERPRETER)
    return False


_libc: List[object] = []


def _tgkill(pid: int, signum: int) -> None:
    import ctypes
    if not _libc:
        _libc.append(ctypes.CDLL(None, use_errno=True))
    tgkill = getattr(_libc[0], "tgkill", None)
    if tgkill is None:                  # (a C library older than glibc 2.30)
        os.kill(pid, signum)
        return
    if tgkill(pid, pid, signum) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
