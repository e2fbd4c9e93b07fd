"""Every rank's stacks on this machine, read without stopping the job.

:func:`read` takes ``{rank: pid}`` and gives back, per rank, its threads as
frame labels (outermost first) and a note on what is missing:

* Python frames from the rank itself (:mod:`.pydump`: faulthandler armed on
  a signal by mslaunch's hook; the dump of every thread needs no ptrace
  right and does not stop the rank; the main thread's own, the right to
  trace it and a pause of a fraction of a millisecond), or from ``py-spy
  dump`` when the rank has no hook and py-spy is installed (the ``stacks``
  extra; it needs the right to trace). With ``main_only`` (the stall watch's
  samples) only the main thread writes its own: see :mod:`.pydump` for why a
  dump of every thread is kept for looks a person asked for;
* native frames from ``eu-stack`` (or ``gdb``) for every rank, appended
  below a Python rank's innermost interpreter frame (the MPI call under
  ``allreduce``), and a rank's whole stack when it is not Python.

The ranks are read at once, each with the same deadline, and a rank that
gives nothing by then is reported as such, never waited for.  A Python rank
is read natively first and asked for its dump after that read: the dump's
signal interrupts what its main thread waits in, and a native read during the
dump would show the dump's own writes in place of that wait.  It blocks: the
launcher and the agents call it from a thread of its own.

:func:`state_report` is ``--report-state-on-timeout``'s block.
"""

from __future__ import annotations

import os
import time

from . import mainthread, native, pydump
from .procs import proc_state

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Sequence, Tuple

#: Programs that run a rank's real program as their child (a shell script, a
#: pinning or timing wrapper): a Python child of theirs is read in their place.
WRAPPERS = ("sh", "dash", "bash", "zsh", "ksh", "busybox", "env", "timeout", "nice",
            "numactl", "taskset", "stdbuf", "chrt", "time", "setsid")
#: Readers run at once on one machine at most (each a process of its own).
PARALLEL = 16


def is_python(pid: int) -> bool:
    try:
        exe = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
    except OSError:
        return False
    return exe.startswith("python") or exe.startswith("pypy")


def _exe(pid: int) -> str:
    try:
        return os.path.basename(os.readlink(f"/proc/{pid}/exe"))
    except OSError:
        return "?"


def python_child(pid: int, depth: int = 3) -> Optional[int]:
    """The first Python process under ``pid``, a few generations down (a rank that
    is a shell script running python: its hook ran if the script passed it
    ``PYTHONPATH``, else py-spy reads it); None if there is none."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            children = [int(c) for c in f.read().split()]
    except (OSError, ValueError):
        return None
    for child in children:
        if is_python(child):
            return child
    for child in children if depth > 1 else ():
        found = python_child(child, depth - 1)
        if found is not None:
            return found
    return None


def read(ranks: Dict[int, int], dump_dir: Optional[str], timeout: float,
         want_native: bool = True, main_only: bool = False) -> Dict[int, Dict[str, Any]]:
    """``{rank: {"threads": [[label...]...], "note": str, "state": str,
    "answered": bool, "cpu": seconds, "moved": count, "stdin": bool}}`` for
    ``ranks`` (``{rank: pid}``) within ``timeout`` s (``moved`` and ``stdin``:
    see :mod:`.activity`)."""
    import subprocess

    from .cgroups import starting
    deadline = time.monotonic() + timeout
    results: Dict[int, Dict[str, Any]] = {}
    pending_py: Dict[int, _Asked] = {}
    pyspy = _which("py-spy")
    reader = native.tool() if want_native else None
    queue: List[Tuple[int, str, List[str]]] = []     # (rank, kind, argv)
    asked_after: List[int] = []     # Python ranks asked for their dump once read natively

    def ask(rank: int) -> None:
        if rank in asked_after:
            asked_after.remove(rank)
        _ask_python(rank, results[rank], dump_dir, pyspy, pending_py, queue, main_only)

    for rank, pid in ranks.items():
        results[rank] = _entry(pid)
        if _queue_readers(rank, results[rank], reader, dump_dir, queue, asked_after):
            ask(rank)
    if reader is None and want_native:
        for r in results.values():
            r["notes"].append("no native frames: neither eu-stack (elfutils) nor gdb is installed")
    running: List[Tuple[int, str, Any]] = []
    while (queue or running or pending_py) and time.monotonic() < deadline:
        while len(running) < PARALLEL:
            # One tracer at a time per process: a second ptrace attach (py-spy's
            # beside eu-stack's) fails with EPERM while the first holds it.
            busy = {item[0] for item in running}
            ready = next((i for i, item in enumerate(queue) if item[0] not in busy), None)
            if ready is None:
                break
            rank, kind, argv = queue.pop(ready)
            mainthread.tracing(results[rank]["pid"], 1)
            try:
                with starting():      # (this runs on a thread of its own)
                    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                            start_new_session=True)
            except OSError as err:
                mainthread.tracing(results[rank]["pid"], -1)
                results[rank]["notes"].append(f"{os.path.basename(argv[0])}: {err.strerror}")
                if kind == "native" and rank in asked_after:
                    ask(rank)
                continue
            running.append((rank, kind, proc))
        for item in list(running):
            rank, kind, proc = item
            if proc.poll() is not None:
                mainthread.tracing(results[rank]["pid"], -1)
                running.remove(item)
                out = proc.stdout.read().decode("utf-8", "replace")
                proc.stdout.close()
                results[rank][kind] = out
                if kind == "native" and rank in asked_after:
                    ask(rank)
        _poll_python(pending_py, results, dump_dir)
        time.sleep(0.005)
    _note_unanswered(results, running, pending_py, queue, dump_dir, timeout)
    out = {rank: _combine(r) for rank, r in results.items()}
    from .activity import moved, reads_stdin
    counts = moved(r["pid"] for r in results.values())
    for rank, r in results.items():
        out[rank].update(moved=counts.get(r["pid"], -1), stdin=reads_stdin(r["pid"]))
    return out


def _note_unanswered(results: Dict[int, Dict[str, Any]], running: List[Tuple[int, str, Any]],
                     pending_py: Dict[int, _Asked], queue: List[Tuple[int, str, List[str]]],
                     dump_dir: Optional[str], timeout: float) -> None:
    """At the deadline: end the readers still running and note, per rank, what
    gave no answer (a Python rank's dump still due is given up on)."""
    for rank, kind, proc in running:
        proc.kill()
        proc.wait()
        mainthread.tracing(results[rank]["pid"], -1)
        proc.stdout.close()
        results[rank]["notes"].append(f"the {kind} reader gave no answer in {timeout:g} s")
        results[rank]["late"] = True
    for rank, a in pending_py.items():
        if a.offset < 0:            # never sent: its main thread ran Python at each look
            results[rank]["notes"].append(_RAN)
            continue
        results[rank]["notes"].append(f"no Python dump in {timeout:g} s")
        results[rank]["late"] = True
        unanswered = (a.signum,) if a.signum == pydump.MAIN_SIGNAL else \
            (pydump.SIGNAL, pydump.MAIN_SIGNAL) if a.main_sent else (pydump.SIGNAL,)
        pydump.done(dump_dir, a.pid, a.offset, False,  # type: ignore[arg-type]
                    unanswered)
    for rank, kind, _ in queue:
        results[rank]["notes"].append(f"the {kind} reader did not start in {timeout:g} s")
        results[rank]["late"] = True


def _queue_readers(rank: int, r: Dict[str, Any], reader: Optional[List[str]],
                   dump_dir: Optional[str], queue: List[Tuple[int, str, List[str]]],
                   asked_after: List[int]) -> bool:
    """Queue the native reader of a rank that runs (``reader``: its command, if
    any); True if its Python dump is to be asked now.  A Python rank that will
    dump is read natively first, its main thread alone (the others are not
    walked: a rank of hundreds of threads takes seconds), and asked for its dump
    once that read is done (``asked_after``): a dump's signal interrupts what
    the main thread waits in, and a read during the dump would show the dump's
    own writes in its place."""
    pid, state, python = r["pid"], r["state"], r["python"]
    if not state or state == "Z":
        r["notes"].append("the process has ended")
        return False
    if state == "T":
        r["notes"].append("the process is stopped (SIGSTOP)")
    dumps = python and dump_dir is not None and (
        pydump.armed(pid, pydump.SIGNAL) or pydump.armed(pid, pydump.MAIN_SIGNAL))
    if reader is None:
        return python
    if "gdb" in reader[0] and dumps:
        # gdb would stop the rank for about a second; its Python frames suffice
        r["notes"].append("no native frames under Python: install elfutils "
                          "(eu-stack), which stops a rank for milliseconds")
        return True
    if dumps:
        queue.append((rank, "native", reader[:1] + ["-1"] + reader[1:] + [str(pid)]))
        asked_after.append(rank)
        return False
    queue.append((rank, "native", reader + [str(pid)]))
    return python


class _Asked:
    """A Python rank's dump asked for: of its ``pid`` from ``offset`` in its file
    (below 0: its main thread, not asked yet, see :data:`~.pydump.RAN`), by
    ``signum``; whether its main thread was then asked alone (``fell_back``), and
    sent that signal (``main_sent``); when to ask it again (``due``, 0: not)."""

    __slots__ = ("pid", "offset", "signum", "at", "fell_back", "main_sent", "due", "tries",
                 "most", "seen", "since")

    def __init__(self, pid: int, offset: int, signum: int, most: int = 0) -> None:
        self.pid, self.offset, self.signum = pid, offset, signum
        self.at = time.monotonic()
        self.fell_back = False
        self.main_sent = False
        self.due = 0.0
        self.tries = 0
        self.most = most                # looks at a main thread that runs code (0: no limit)
        self.seen = -1                  # the length of the dump last read, and since when
        self.since = self.at
        if offset == pydump.RAN:
            self.later()

    def later(self) -> None:
        """Its main thread ran code: ask it again after a back-off."""
        self.tries += 1
        self.due = time.monotonic() + min(0.5, 0.005 * 2 ** self.tries)

    def whole(self, text: str) -> bool:
        """Whether ``text``, read of the dump, may be all of it: the rank's main thread
        has left its dump (:func:`~.pydump.dumping`), or the text has not grown for
        :data:`~.pydump.STEADY` seconds."""
        now = time.monotonic()
        if len(text) != self.seen:
            self.seen, self.since = len(text), now
        return not pydump.dumping(self.pid) or now - self.since >= pydump.STEADY


def _poll_python(pending: Dict[int, _Asked], results: Dict[int, Dict[str, Any]],
                 dump_dir: Optional[str]) -> None:
    """Take the Python dumps that are complete; ask a rank that has not dumped every
    thread in time for its main thread alone (see :mod:`.pydump`), and a main thread
    that ran code at the last look again."""
    for rank, a in list(pending.items()):
        if a.due and time.monotonic() >= a.due:
            _ask_main_again(rank, a, pending, results, dump_dir)
        if a.offset < 0:
            continue
        text = pydump.answer(dump_dir, a.pid, a.offset)  # type: ignore[arg-type]
        if text is not None:
            # Read again once the writer is seen out of its dump: unchanged, it is whole.
            if a.whole(text) and \
                    pydump.answer(dump_dir, a.pid, a.offset) == text:  # type: ignore[arg-type]
                del pending[rank]
                alone = a.fell_back and not pydump.every_thread(text)
                pydump.done(dump_dir, a.pid, a.offset, True,  # type: ignore[arg-type]
                            (pydump.SIGNAL,) if alone else ())
                if alone:
                    results[rank]["notes"].append(_NATIVE)
                _python_dump(results[rank], text, dump_dir, pending, rank)
        elif not a.fell_back and a.signum == pydump.SIGNAL and \
                time.monotonic() - a.at >= pydump.FALLBACK:
            a.fell_back = True
            _ask_main_again(rank, a, pending, results, dump_dir)


def _ask_main_again(rank: int, a: _Asked, pending: Dict[int, _Asked],
                    results: Dict[int, Dict[str, Any]], dump_dir: Optional[str]) -> None:
    """Ask ``a``'s main thread for its own stack: at once, or again after it ran
    code at the last look."""
    a.due = 0.0
    first = a.offset < 0                # its main thread alone is asked, not yet sent
    offset = pydump.ask(dump_dir, a.pid, pydump.MAIN_SIGNAL, again=not first)  # type: ignore[arg-type]
    if offset == pydump.RAN and a.most and a.tries >= a.most:
        if first:
            del pending[rank]
            results[rank]["notes"].append(_RAN)
    elif offset == pydump.RAN:
        a.later()
    elif offset is None or offset == pydump.NOT_PERMITTED:
        if first:                       # nothing else was asked of it
            del pending[rank]
            results[rank]["notes"].append(_NOT_PERMITTED if offset is not None else
                                          "no Python frames: its main thread's own dump "
                                          "could not be asked")
    elif first:
        a.offset, a.at = offset, time.monotonic()
    else:
        a.main_sent = True


#: Looks a stall sample takes at a main thread that runs the interpreter's code:
#: such a rank computes (the watch counts its CPU), and each look stops it.
SAMPLE_LOOKS = 4


def _ask_main(rank: int, pid: int, r: Dict[str, Any], dump_dir: str,
              pending: Dict[int, _Asked], most: int = 0) -> bool:
    """Ask ``pid``'s main thread for its own stack, now or (it runs code) later, at
    most ``most`` times (0: until the deadline); False if it cannot be asked (a note
    says why where it matters)."""
    offset = pydump.ask(dump_dir, pid, pydump.MAIN_SIGNAL)
    if offset == pydump.NOT_PERMITTED:
        r["notes"].append(_NOT_PERMITTED)
        return False
    if offset is None:
        return False
    pending[rank] = _Asked(pid, offset, pydump.MAIN_SIGNAL, most)
    return True


def _ask_python(rank: int, r: Dict[str, Any], dump_dir: Optional[str], pyspy: Optional[str],
                pending: Dict[int, _Asked],
                queue: List[Tuple[int, str, List[str]]], main_only: bool = False) -> None:
    """Ask a Python rank for its dump (its main thread's alone with ``main_only``),
    else queue py-spy, else say why there is none."""
    pid = r["pid"]
    offset = None
    if dump_dir and main_only:
        if _ask_main(rank, pid, r, dump_dir, pending, SAMPLE_LOOKS):
            return
    elif dump_dir:
        offset = pydump.ask(dump_dir, pid, pydump.SIGNAL)
        # (deaf to SIGNAL: its main thread is asked for its own stack at once)
        if offset is None and pydump.is_deaf(pid) and _ask_main(rank, pid, r, dump_dir, pending):
            r["notes"].append(_MAIN_ALONE)
            return
    if offset is not None:
        pending[rank] = _Asked(pid, offset, pydump.SIGNAL)
    elif _NOT_PERMITTED in r["notes"]:
        return
    elif pyspy:
        queue.append((rank, "pyspy", [pyspy, "dump", "--pid", str(pid)]))
    elif pydump.is_deaf(pid):
        r["notes"].append(f"no Python frames: the rank did not answer signal {pydump.SIGNAL} "
                          f"before (it blocks it, or handles it itself), so it is not sent "
                          f"again")
    else:
        r["notes"].append("no Python frames: the rank has no mslaunch hook (started with -S "
                          "or -I, or not as python) and py-spy is not installed")


#: The notes of a rank read from its main thread alone: it ran native code past
#: :data:`~.pydump.FALLBACK`, or had not answered :data:`~.pydump.SIGNAL` before.
_NATIVE = (f"the main thread alone: it ran native code, where signal {pydump.SIGNAL}'s "
           f"dump of every thread waits for its next Python step")
_RAN = ("no Python frames: its main thread ran the interpreter's code at each look (its "
        "own dump is asked only where its frames are whole: see the stacks guide)")
_NOT_PERMITTED = ("no Python frames of its main thread: its own dump waits for a look at "
                  "its system call (/proc/PID/task/PID/syscall), which needs the right to "
                  "trace it, on x86_64 or aarch64")
_MAIN_ALONE = (f"the main thread alone: the rank did not answer signal {pydump.SIGNAL} before "
               f"(its main thread runs native code, or the program handles the signal "
               f"itself), which has every thread dumped between two Python steps")


def _entry(pid: int) -> Dict[str, Any]:
    """What :func:`read` gathers of one rank, to begin with (a wrapper's Python
    child in its place)."""
    state = proc_state(pid)
    python = is_python(pid)
    notes: List[str] = []
    if state and not python and _exe(pid) in WRAPPERS:
        child = python_child(pid)
        if child is not None:       # a shell script running python: read that
            notes.append(f"Python frames of its child {child} (the rank is "
                         f"{_exe(pid)}, which waits for it)")
            pid, python, state = child, True, proc_state(child)
    return {"pid": pid, "state": state, "python": python, "py": None, "native": None,
            "notes": notes}


def _python_dump(r: Dict[str, Any], text: str, dump_dir: Optional[str],
                 pending: Dict[int, _Asked], rank: int) -> None:
    """Keep a rank's dump; when it stopped at faulthandler's limit of threads
    (the main thread is the oldest, so missing), ask for the main thread alone."""
    if r["py"] is not None:
        r["py_main"] = text
        r["notes"].append(f"more than {pydump.MAX_THREADS} threads: the first "
                          f"{pydump.MAX_THREADS} and the main thread read on its own")
        return
    r["py"] = text
    if pydump.truncated(text) and dump_dir and _ask_main(rank, r["pid"], r, dump_dir, pending):
        return
    if pydump.truncated(text):
        r["notes"].append(f"more than {pydump.MAX_THREADS} threads: the first "
                          f"{pydump.MAX_THREADS} only, perhaps not the main thread")


def _which(name: str) -> Optional[str]:
    import shutil
    found = shutil.which(name)
    if found:
        return found
    import sys
    here = os.path.join(os.path.dirname(sys.executable), name)
    return here if os.access(here, os.X_OK) else None


def _combine(r: Dict[str, Any]) -> Dict[str, Any]:
    notes: List[str] = r["notes"]
    threads: List[Tuple[str, ...]] = []
    if r["py"] is not None:
        threads = pydump.parse(r["py"])
        if r.get("py_main"):
            threads = pydump.parse(r["py_main"])[:1] + threads
    elif r.get("pyspy") is not None:
        threads = _pyspy_threads(r["pyspy"], notes)
    nat = r["native"]
    frames: Dict[int, Any] = {}
    if nat is not None:
        frames = native.parse(nat)
        refused = native.refusal(nat) if not any(frames.values()) else None
        if refused == "not permitted":
            notes.append(f"no native frames: not permitted to trace: "
                         f"{native.why_not_permitted()}")
        elif refused:
            notes.append(f"no native frames: {refused}")
    main = frames.get(r["pid"]) or (next(iter(frames.values())) if frames else [])
    if r["python"] and threads:
        below = native.labels(main, below_python=True) if main else ()
        threads[0] = threads[0] + below
    elif not threads and frames:
        threads = [native.labels(f, below_python=False) for f in
                   [main] + [f for tid, f in frames.items() if f is not main] if f]
    return {"threads": [_bounded(t) for t in threads], "note": "; ".join(notes),
            "state": r["state"], "answered": bool(threads) or not r.get("late"),
            "cpu": cpu_seconds(r["pid"])}


#: Frames kept of one thread (outermost first): eu-stack stops at 256, Python's
#: own dump at 100; py-spy reads them all, and a deep recursion would make a
#: report deeper than the merge of reports can follow.
MAX_FRAMES = 256
_OUTER = 16


def _bounded(frames: Sequence[str]) -> List[str]:
    """``frames`` (innermost last), with those between the outermost few and the
    innermost ones said in one line when there are more than :data:`MAX_FRAMES`."""
    if len(frames) <= MAX_FRAMES:
        return list(frames)
    inner = MAX_FRAMES - _OUTER - 1
    left_out = len(frames) - _OUTER - inner
    return [*frames[:_OUTER], f"... {left_out} frames left out ...", *frames[-inner:]]


def cpu_seconds(pid: int) -> float:
    """The CPU time ``pid`` has used (user and system), or -1.0 if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICK
    except (OSError, IndexError, ValueError):
        return -1.0


def _pyspy_threads(text: str, notes: List[str]) -> List[Tuple[str, ...]]:
    """``py-spy dump``'s text as threads of labels, outermost first."""
    threads: List[List[str]] = []
    for line in text.splitlines():
        if line.startswith("Thread "):
            threads.append([])
        elif line.startswith("    ") and threads:
            threads[-1].append(line.strip())
    if not threads:
        refused = native.refusal(text)
        notes.append("py-spy: " + (native.why_not_permitted() if refused == "not permitted"
                                   else (text.strip().splitlines() or ["no answer"])[-1][:200]))
    return [tuple(reversed(t)) for t in threads if t]


def read_in_background(loop: Any, ranks: Dict[int, int], dump_dir: Optional[str],
                       timeout: float, done: Any, main_only: bool = False) -> None:
    """:func:`read` in a thread of its own; ``done(result)`` is then called on ``loop``
    (the event loop goes on meanwhile: output, heartbeats, PMI)."""
    import _thread
    wake_r, wake_w = os.pipe()
    box: List[Any] = []

    def work() -> None:
        try:
            box.append(read(ranks, dump_dir, timeout, main_only=main_only))
        except Exception as err:            # noqa: BLE001 (reported, never raised in a thread)
            box.append({rank: {"threads": [], "note": f"reading failed: {err}", "state": "",
                               "answered": True} for rank in ranks})
        finally:
            os.write(wake_w, b"x")

    def ready() -> None:
        loop.forget(wake_r)
        os.close(wake_r)
        os.close(wake_w)
        done(box[0])

    loop.add_reader(wake_r, ready)
    _thread.start_new_thread(work, ())


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def usage(pids: Dict[int, int],
          previous: Dict[int, Tuple[float, int]]) -> Dict[int, Dict[str, Any]]:
    """``{rank: {"state", "cpu", "rss"}}`` of ``{rank: pid}``: CPU % since the
    sample kept in ``previous`` (by pid; updated) or since the process
    started, resident memory in bytes."""
    now = time.monotonic()
    rows: Dict[int, Dict[str, Any]] = {}
    try:
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
    except (OSError, ValueError):
        uptime = 0.0
    for rank, pid in pids.items():
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            ticks = int(fields[11]) + int(fields[12])
            rss = int(fields[21]) * _PAGE
            state = fields[0].decode()
        except (OSError, IndexError, ValueError):
            rows[rank] = {"state": "gone", "cpu": None, "rss": None}
            continue
        before = previous.get(pid)
        if before is not None and now > before[0]:
            cpu = (ticks - before[1]) / _TICK / (now - before[0]) * 100
        else:
            age = uptime - int(fields[19]) / _TICK
            cpu = ticks / _TICK / age * 100 if age > 0 else 0.0
        previous[pid] = (now, ticks)
        rows[rank] = {"state": state, "cpu": round(cpu, 1), "rss": rss}
    return rows


def state_report(jobid: str, rows: List[Tuple[int, str, int, str, int]], napps: int,
                 reported: int) -> str:
    """``--report-state-on-timeout``: Open MPI's job and rank state block.

    ``rows`` are ``(rank, host, pid, state, exit code)``; ``reported`` counts
    the ranks that registered with the process manager (PMI initialized).
    """
    launched = sum(1 for r in rows if r[2])
    ended = sum(1 for r in rows if r[3] != "RUNNING")
    lines = [f"DATA FOR JOB: {jobid}",
             f"\tNum apps: {napps}\tNum procs: {len(rows)}\tJobState: RUNNING\tAbort: False",
             f"\tNum launched: {launched}\tNum reported: {reported}\tNum terminated: {ended}",
             "", "\tProcs:"]
    for rank, host, pid, state, code in rows:
        lines.append(f"\t\tRank: {rank}\tNode: {host}\tPID: {pid}\tState: {state}\t"
                     f"ExitCode {code}")
    return "\n".join(lines) + "\n"
