"""Python ranks' own stack dumps: CPython's faulthandler, armed on a signal.

A Python rank started by mslaunch finds a ``sitecustomize`` module first on
its path (the job's private directory on this host, see :func:`prepare`).
It puts the user's ``sys.path`` and ``PYTHONPATH`` back as they were, arms
two signals that write Python stacks to a file of its own in that directory
(below), and then imports the next
``sitecustomize`` on the path, if any, so a site's own hook still runs.
Under Yama's ``ptrace_scope=1`` it also names the agent (or launcher) as a
process allowed to trace it (``PR_SET_PTRACER``), so that a native stack
reader the agent starts may read it.  And it ends the rank with 1 after an
uncaught exception while mpi4py's MPI is up (``MSLAUNCH_EXCEPTION_EXIT=0``
in the rank's environment turns that off).

:data:`MAIN_SIGNAL` is faulthandler's own (``faulthandler.register(...,
all_threads=False)``), sent to the main thread: its handler runs in C,
inside the signal handler, so a main thread blocked in a C call (an MPI
collective) still answers with its own stack, and the dump costs
microseconds.  That walk has a race of its own: a thread interrupted while
it pushes or pops a frame is walked half-way through the change.  From
CPython 3.11 on, that killed the rank with SIGSEGV.  So :data:`MAIN_SIGNAL`
is sent only while the main thread stands where its frames are whole (see
:mod:`.mainthread`); a main thread found running the interpreter's code is
asked again later (:data:`RAN`).

A walk of every thread's frames from a signal handler is worse, whatever the
version: faulthandler's dump of every thread walks them without the GIL, and
a thread that runs Python frees and reuses them under it -- the rank died of
SIGSEGV in about one dump in five thousand with two threads running Python,
one in ten when it started threads all the time (CPython 3.11). So
:data:`SIGNAL` has a Python handler of the hook's instead, which the main
thread runs between two of its Python steps, holding the GIL, and which
dumps every thread from there: it cannot fault. A main thread in native code
does not run it until it returns; a rank that has not answered
:data:`SIGNAL` within :data:`FALLBACK` seconds is asked for its main thread
alone (its report says so), and is then asked that way only until the dump
of every thread comes after all (see :data:`_deaf`). The stall watch, which
samples a quiet job every few seconds for as long as it runs, reads the main
threads alone.

A signal is sent only when the rank's ``SigCgt`` mask shows it is caught,
since its default action would end the rank; the hook leaves both ignored
at the interpreter's end.  What is not a Python interpreter, or one started
with ``-S``/``-I``, has no dump (native frames only).
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Mapping, Optional, Tuple

    from .guard import Watchdog

#: The signal the ranks' faulthandler answers: real-time, so no program or
#: MPI library uses it already (SIGRTMAX - 7 on Linux).
SIGNAL = 57
#: The signal that dumps only the thread that takes it (sent to the main thread
#: itself, see :mod:`.mainthread`): the stall watch's samples, and the main
#: thread read again when a rank has more threads than faulthandler writes
#: (:data:`MAX_THREADS`), which it lists newest first.
MAIN_SIGNAL = SIGNAL - 1
#: faulthandler's limit of threads in one dump (then a line "...").
MAX_THREADS = 100
#: Seconds a rank is given to dump every thread (its main thread's next Python
#: step) before it is asked for its main thread alone.
FALLBACK = 0.5
#: The hook's Python handler of :data:`SIGNAL`: its own frame is left out of dumps.
HANDLER = "_mslaunch_dump"
#: :func:`ask`'s answer when the rank's main thread was running the
#: interpreter's code (see :mod:`.mainthread`), or the rank was held by a
#: tracer: nothing was sent, and it may be asked again.
RAN = -1
#: :func:`ask`'s answer when this process may not read where the rank's main
#: thread stands (the right to trace it), or not tell on this machine (x86_64
#: and aarch64 only): nothing was sent.
NOT_PERMITTED = -2
#: The variable that arms the hook: ``DIR|SIGNAL|TRACER_PID|HAD_PYTHONPATH``.
VARIABLE = "MSLAUNCH_STACKS"

#: The hook, a file of this package (read through this module's loader, which may
#: be an agent's bundle, never imported).
HOOK_FILE = os.path.join(os.path.dirname(__file__), "rankhook.py")


def prepare(directory: str) -> bool:
    """Write the hook into ``directory`` (private to this user); False if it cannot.

    Its bytecode for this Python is written beside it: ranks run with
    ``PYTHONDONTWRITEBYTECODE`` (or a read-only cache) would otherwise compile
    it at every start, near 2 ms each.  That bytecode is the one the package's
    installation compiled, when it is there and current: compiling it here
    would cost the launch as much."""
    path = os.path.join(directory, "sitecustomize.py")
    try:
        source = globals()["__loader__"].get_data(HOOK_FILE)
        if not isinstance(source, bytes):
            return False
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with open(fd, "wb") as f:
            f.write(source)
    except (OSError, AttributeError):     # a loader that cannot read the package's files
        return False
    try:
        # The import system's own module, frozen and always loaded; by its name in
        # sys.modules, as ``importlib._bootstrap_external`` would import the
        # ``importlib`` package (and ``warnings``) first.
        external = sys.modules["_frozen_importlib_external"]
        MAGIC_NUMBER, cache_from_source = external.MAGIC_NUMBER, external.cache_from_source
        st = os.stat(path)
        head = MAGIC_NUMBER + bytes(4) + (int(st.st_mtime) & 0xFFFFFFFF).to_bytes(4, "little") \
            + (st.st_size & 0xFFFFFFFF).to_bytes(4, "little")
        cached = cache_from_source(path)
        os.makedirs(os.path.dirname(cached), 0o700, exist_ok=True)
        fd = os.open(cached, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with open(fd, "wb") as f:
            f.write(head + _compiled(source, MAGIC_NUMBER, cache_from_source))
    except (OSError, ImportError, ValueError, SyntaxError):
        pass
    return True


def _compiled(source: bytes, magic: bytes, cache_from_source) -> bytes:
    """The hook's code, marshalled: from the package's own bytecode if it was
    compiled from this very source (a timestamp-checked one; the import sets the
    file name the code names), else compiled now."""
    try:
        with open(cache_from_source(HOOK_FILE), "rb") as f:
            data = f.read()
        st = os.stat(HOOK_FILE)
        if data[:4] == magic and data[4:8] == bytes(4) and \
                int.from_bytes(data[8:12], "little") == int(st.st_mtime) & 0xFFFFFFFF and \
                int.from_bytes(data[12:16], "little") == len(source) & 0xFFFFFFFF:
            return data[16:]
    except OSError:
        pass
    import marshal
    return marshal.dumps(compile(source, HOOK_FILE, "exec"))


def make_dir(guard: Watchdog) -> Optional[str]:
    """This process's private directory for its Python ranks' dumps, with the
    hook in it (removed by ``guard``'s watchdog at the end, or should this
    process die); None if it cannot be made."""
    from .procs import in_private

    def made(base: str) -> Optional[str]:
        path = os.path.join(base, f"{os.uname().nodename}.{os.getpid()}.py")
        guard.private(path)     # told before it exists: this process may be killed after
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        except OSError:
            return None
        return path

    def drop(path: str) -> None:
        try:
            os.rmdir(path)
        except OSError:
            pass

    path = in_private(made, lambda path: path, drop)
    if path is None:
        return None
    return path if prepare(path) else None


def rank_env(directory: str, env: Mapping[str, str], tracer: int) -> Dict[str, str]:
    """The variables that arm the hook in a Python rank whose environment is ``env``."""
    old = env.get("PYTHONPATH")
    return {"PYTHONPATH": directory + (os.pathsep + old if old is not None else ""),
            VARIABLE: f"{directory}|{SIGNAL}|{tracer}|{0 if old is None else 1}"}


def armed(pid: int, signum: int = SIGNAL) -> bool:
    """Whether ``pid`` catches ``signum`` (its hook ran): only then may it be sent."""
    return _in_mask(f"/proc/{pid}/status", b"SigCgt:", signum)


def _in_mask(status: str, field: bytes, signum: int) -> bool:
    """Whether the signal set ``field`` of the ``status`` file of a process (or of
    one of its threads) holds ``signum``."""
    try:
        with open(status, "rb") as f:
            for line in f:
                if line.startswith(field):
                    return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    except (OSError, ValueError):
        pass
    return False


def dump_path(directory: str, pid: int) -> str:
    return os.path.join(directory, f"{pid}.txt")


def forget_dumps(directory: str) -> None:
    """Remove the dump files of ranks that have ended (every ``PID.txt``): the
    directory and its hook stay for the ranks of a next attempt; the guard's
    watchdog removes them once the job is over (a directory's removal waits for
    the file system)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        if name.endswith(".txt") and name[:-4].isdigit():
            try:
                os.unlink(os.path.join(directory, name))
            except OSError:
                pass


#: Ranks that did not dump when last sent a signal, by (pid, signal), with
#: their dump file's size then: a rank that blocks it, or installed its own
#: handler for it, is not sent it again (its handler is the program's, not
#: ours) until its file grows (a late dump: it was only slow, or its main
#: thread was in native code).
_deaf: Dict[Tuple[int, int], int] = {}


#: Reads of each rank's dump under way in this process (looks at once: two
#: mslaunch-stacks, a stall sample and a timeout): its file is emptied, and the
#: rank called deaf, only by a read that is alone.
_reading: Dict[int, int] = {}


def begin(pid: int) -> None:
    _reading[pid] = _reading.get(pid, 0) + 1


def done(directory: str, pid: int, offset: int, answered: bool,
         unanswered: Tuple[int, ...] = ()) -> None:
    """A read of ``pid``'s dump asked at ``offset`` ends; ``answered`` or not;
    ``unanswered``: signals it was sent that it did not answer (deaf to them
    from now, see :data:`_deaf`)."""
    alone = _reading.get(pid, 1) <= 1
    if _reading.get(pid, 1) <= 1:
        _reading.pop(pid, None)
    else:
        _reading[pid] -= 1
    if not alone:
        return
    if answered:
        consumed(directory, pid)
        for signum in unanswered:
            _deaf[(pid, signum)] = 0
        return
    try:
        size = os.stat(dump_path(directory, pid)).st_size
    except OSError:
        return
    if size == offset:          # nothing written since the signal: it did not answer
        for signum in unanswered:
            _deaf[(pid, signum)] = size


def is_deaf(pid: int, signum: int = SIGNAL) -> bool:
    return (pid, signum) in _deaf


def ask(directory: str, pid: int, signum: int = SIGNAL, again: bool = False) -> Optional[int]:
    """Signal ``pid`` to dump; the dump file's size before, or None if not armed
    (or it did not answer the last signal, see :data:`_deaf`), or, for
    :data:`MAIN_SIGNAL`, :data:`RAN` or :data:`NOT_PERMITTED` (nothing sent);
    ``again``: within a read already begun (see :func:`begin`)."""
    if not armed(pid, signum):
        return None
    try:
        size = os.stat(dump_path(directory, pid)).st_size
    except OSError:
        return None
    for key in [k for k in _deaf if k[0] == pid]:
        if size > _deaf[key]:
            del _deaf[key]          # a late dump came: it answers after all
    if (pid, signum) in _deaf:
        return None
    try:
        if signum == MAIN_SIGNAL:
            from .mainthread import to_main_thread
            sent = to_main_thread(pid, signum)
            if sent != "sent":
                return {"ran": RAN, "not permitted": NOT_PERMITTED}.get(sent)
        else:
            os.kill(pid, signum)
    except OSError:
        return None
    if not again:
        begin(pid)
    return size


def answer(directory: str, pid: int, offset: int) -> Optional[str]:
    """The dump written after ``offset`` once it is complete (it ends with a
    frame line and has not grown since the last look), else None."""
    path = dump_path(directory, pid)
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read(16 << 20)     # hundreds of threads fit
    except OSError:
        return None
    if not data.endswith(b"\n"):
        return None
    return data.decode("utf-8", "replace")


#: Seconds a dump that has stopped growing is taken as whole although its rank's
#: main thread still blocks :data:`MAIN_SIGNAL` (a program that blocks it itself).
STEADY = 0.5


def dumping(pid: int) -> bool:
    """Whether ``pid``'s main thread is in the middle of a dump: it blocks
    :data:`MAIN_SIGNAL` for the dump's whole length (the kernel does, while
    faulthandler's handler of it runs; the hook does, around its dump of every
    thread), and a dump is written in many small writes, between which a loaded
    machine may leave it for milliseconds."""
    return _in_mask(f"/proc/{pid}/task/{pid}/status", b"SigBlk:", MAIN_SIGNAL)


def consumed(directory: str, pid: int) -> None:
    """Empty a dump file once read: a job sampled for days would fill the
    directory otherwise (the rank appends, so its next dump starts at 0)."""
    try:
        os.truncate(dump_path(directory, pid), 0)
    except OSError:
        pass


def parse(text: str) -> List[Tuple[str, ...]]:
    """faulthandler's dump as threads of frame labels, outermost first; the main
    thread (listed last: the oldest) first."""
    threads: List[List[str]] = []
    every = every_thread(text)
    skip = False
    for line in text.splitlines():
        if line.startswith(("Thread 0x", "Current thread 0x", "Stack (most recent")):
            # (a main thread's own dump that came right after a dump of every
            # thread repeats a thread of it)
            skip = every and line.startswith("Stack (most recent")
            if not skip:
                threads.append([])
        elif skip:
            continue
        elif line.startswith("  File ") and threads:
            # '  File "path", line N in func'
            rest = line[len('  File "'):]
            path, _, tail = rest.rpartition('", line ')
            num, _, func = tail.partition(" in ")
            if path.startswith("<frozen importlib") or func == HANDLER:
                continue            # the import system's own frames, as tracebacks hide them
            threads[-1].append(f"{func} ({os.path.basename(path)}:{num})")
        elif line == "  ..." and threads:
            threads[-1].append("...")          # a thread deeper than faulthandler writes
    ordered = [tuple(reversed(t)) for t in threads if t]
    if len(ordered) > 1 and not truncated(text):
        ordered = [ordered[-1]] + ordered[:-1]
    return ordered


def every_thread(text: str) -> bool:
    """Whether a dump is one of every thread (else a thread's own stack)."""
    return "\nThread 0x" in "\n" + text or "\nCurrent thread 0x" in "\n" + text


def truncated(text: str) -> bool:
    """Whether a dump stopped at faulthandler's limit of threads (the oldest, the
    main thread, is then missing)."""
    return text.endswith("\n...\n")
