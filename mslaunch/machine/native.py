"""Native stacks of a running process, read from outside with ptrace.

elfutils' ``eu-stack`` is preferred: it stops the process only while it
unwinds (about 10 ms for a Python rank in MPI, read with the libraries'
call-frame information, symbols from their dynamic tables, so a stripped
``libmpi`` still names its exported ``MPI_*`` entry points).  ``gdb`` is the
fallback; it keeps the process stopped while it loads symbols, near a
second, so it is used only for ranks that have no other stack (not for
Python ranks that dump their own).  Both need the right to trace: the same user and, under Yama's
``ptrace_scope=1``, an ancestor's place or the rank's ``PR_SET_PTRACER``
permission (which mslaunch's Python hook gives, see :mod:`.pydump`); in a
container, ``CAP_SYS_PTRACE`` where the seccomp profile asks for it.  A
refusal is turned into one line that says which of these is missing.
"""

from __future__ import annotations

import os
import shutil

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Optional, Tuple

#: The names of frames of the Python interpreter: native frames above the
#: innermost of these are the interpreter's; below it, what Python called.
_INTERPRETER = ("_PyEval", "PyEval", "_PyObject_", "PyObject_", "_PyFunction", "method_vectorcall",
                "cfunction_", "_Py_", "Py_", "pymain_", "_PyRun", "PyRun", "run_mod", "run_eval")
#: Frames of a communication library's own API: what the rank called and waits in.
_ENTRY_POINTS = ("MPI_", "PMPI_", "ncclGroupEnd", "ncclAllReduce", "ncclBroadcast",
                 "ncclReduce", "ncclAllGather", "ncclSend", "ncclRecv", "shmem_", "gloo::")
#: C library frames at the very end of a stack under an unnamed library
#: frame: where a polling library yields or sleeps, which changes from one
#: look to the next.
_LEAF_SYSCALLS = ("sched_yield", "__sched_yield", "__GI_sched_yield", "poll", "__poll",
                  "epoll_wait", "nanosleep", "clock_nanosleep", "__clock_nanosleep",
                  "usleep", "futex_wait", "__futex_abstimed_wait_common", "pthread_cond_wait",
                  "___pthread_cond_wait", "read", "__libc_read", "recv", "__libc_recv")


def tool() -> Optional[List[str]]:
    """The argv prefix of the native reader here (the pid goes last), or None."""
    eu = shutil.which("eu-stack")
    if eu:
        return [eu, "-m", "-p"]
    gdb = shutil.which("gdb")
    if gdb:
        return [gdb, "-q", "-batch", "-nx", "-ex", "set debuginfod enabled off",
                "-ex", "set pagination off", "-ex", "thread apply all bt", "-p"]
    return None


def parse(text: str) -> Dict[int, List[Tuple[str, str]]]:
    """``{tid: [(function or "", module), ...]}``, innermost first, from
    ``eu-stack -m`` or gdb's ``thread apply all bt``."""
    threads: Dict[int, List[Tuple[str, str]]] = {}
    frames: Optional[List[Tuple[str, str]]] = None
    for line in text.splitlines():
        if line.startswith("TID "):
            tid = line[4:].rstrip(":")
            frames = threads.setdefault(int(tid) if tid.isdigit() else -len(threads), [])
        elif line.startswith("Thread ") and "(LWP " in line:
            lwp = line.split("(LWP ", 1)[1].split(")", 1)[0]
            frames = threads.setdefault(int(lwp) if lwp.isdigit() else -len(threads), [])
        elif line.startswith("#") and frames is not None:
            frames.append(_frame(line))
    return threads


def _frame(line: str) -> Tuple[str, str]:
    words = line.split(None, 2)
    rest = words[2] if len(words) > 2 else ""
    if " - /" in rest or rest.startswith("- /"):          # eu-stack -m
        func, _, module = rest.rpartition("- ")
        return func.strip(), os.path.basename(module.strip())
    # gdb: "0x... in func (args) from /lib/x.so" or "func (args) at file.c:12"
    if rest.startswith("in "):
        rest = rest[3:]
    elif words[1:2] and not words[1].startswith("0x"):
        rest = " ".join(words[1:])
    func = rest.split(" (", 1)[0].strip()
    module = rest.rsplit(" from ", 1)[1].strip() if " from " in rest else ""
    return ("" if func == "??" else func), os.path.basename(module)


#: What a compiler appends to a function's name for its clones and cold parts.
_CLONES = (".constprop.", ".isra.", ".part.", ".cold", ".lto_priv.")


def _plain(func: str) -> str:
    """``func`` without a symbol version (``@GLIBC_2.2.5``) or clone suffix."""
    func = func.split("@", 1)[0]
    for clone in _CLONES:
        at = func.find(clone)
        if at > 0:
            func = func[:at]
    return func


def cython_name(func: str) -> str:
    """A Cython function's dotted name (``__pyx_pw_6mpi4py_3MPI_4Comm_293allreduce``
    is ``mpi4py.MPI.Comm.allreduce``); other names as they are."""
    for prefix in ("__pyx_pw_", "__pyx_pf_", "__pyx_f_"):
        if func.startswith(prefix):
            break
    else:
        return func
    rest, parts = func[len(prefix):].split(".", 1)[0], []
    while rest:
        digits = len(rest) - len(rest.lstrip("0123456789"))
        size = int(rest[:digits]) if digits else 0
        end = digits + size
        if digits and size <= len(rest) - digits and rest[end:end + 1] in ("_", ""):
            parts.append(rest[digits:end])
            rest = rest[end + 1:]
        else:
            parts.append(rest[digits:])       # a counter and the function's own name
            break
    return ".".join(p for p in parts if p) or func


def labels(frames: List[Tuple[str, str]], below_python: bool) -> Tuple[str, ...]:
    """One thread's native frames as labels, outermost first: unnamed frames
    of one module in a row become one ``?? (module)``; with ``below_python``,
    only what lies below the interpreter's innermost frame."""
    if below_python:
        inner = [i for i, (f, m) in enumerate(frames) if f.startswith(_INTERPRETER)
                 or _interpreter_module(m)]
        frames = frames[:inner[0]] if inner else frames
    out: List[str] = []
    for func, module in reversed(frames):
        func = cython_name(_plain(func))
        text = f"{func or '??'} ({module})" if module else (func or "??")
        if not out or out[-1] != text or func:
            out.append(text)
    # Below the MPI call, a progress engine spins through frames that change
    # from one look to the next: the call is where the rank waits.
    for i, text in enumerate(out):
        if text.startswith(_ENTRY_POINTS):
            del out[i + 1:]
            break
    # A polling library's leaf (its yield or poll under its own unnamed frames)
    # changes from one look to the next: it says nothing the frame above does not.
    while len(out) > 1 and out[-2].startswith("?? (") and \
            out[-1].split(" (", 1)[0] in _LEAF_SYSCALLS:
        out.pop()
    return tuple(out)


def _interpreter_module(module: str) -> bool:
    """Whether ``module`` is the Python interpreter: its library, or an executable
    that has it inside (Debian's ``python3.11``, stripped: its own functions have
    no name there, and are the interpreter's, not what the rank waits in)."""
    if module.startswith("libpython"):
        return True
    rest = module[len("python"):] if module.startswith("python") else "x"
    return all(c.isdigit() or c == "." for c in rest.rstrip("dm"))


def refusal(output: str) -> Optional[str]:
    """Why the reader could not attach (from its output), or None if it did."""
    low = output.lower()
    if "operation not permitted" in low or "not permitted" in low:
        return "not permitted"
    if "no such process" in low:
        return "the process is gone"
    return None


def why_not_permitted() -> str:
    """What keeps this process from tracing its ranks, and how to get it."""
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            scope = f.read().strip()
    except OSError:
        scope = ""
    status = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                name, _, value = line.partition(":")
                status[name] = value.strip()
    except OSError:
        pass
    ptrace_cap = bool(int(status.get("CapEff", "0") or "0", 16) >> 19 & 1)
    if scope in ("2", "3"):
        who = "only admins" if scope == "2" else "nobody"
        return (f"kernel.yama.ptrace_scope={scope} lets {who} trace (an admin can set it "
                f"to 1 or 0 with sysctl)")
    if status.get("Seccomp", "0") != "0":
        return ("a seccomp filter refuses ptrace (a container: run it with --cap-add SYS_PTRACE, "
                "or in Kubernetes add SYS_PTRACE to securityContext.capabilities)")
    if scope == "1" and not ptrace_cap:
        return ("kernel.yama.ptrace_scope=1 lets only a process's ancestors trace it (Python "
                "ranks allow mslaunch; others need sysctl kernel.yama.ptrace_scope=0 "
                "or CAP_SYS_PTRACE)")
    return "no right to trace the process (another user's or not dumpable; CAP_SYS_PTRACE would do)"
