"""``--get-stack-traces``: every rank's stacks, when ``--timeout`` stops a hung job.

A hung distributed job is the hardest thing to debug, so this tries to show
where each rank is:

* a Python rank (its executable is a Python interpreter) runs with
  ``PYTHONFAULTHANDLER=1`` (set by the planner with this option) and gets
  SIGABRT: Python's faulthandler writes the traceback of every thread to
  its stderr, which mslaunch relays like any output, and the rank ends;
* any other rank is inspected from outside with ``gdb`` (all threads) or
  ``eu-stack`` when one is installed, and its stacks are printed in Open
  MPI's form (``STACK TRACE FOR PROC [[job,1],N] (host, PID pid)`` and one
  tab-indented line per frame).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Tuple

#: Seconds all debuggers together may take.
DEBUGGER_SECONDS = 20.0


def is_python(pid: int) -> bool:
    try:
        exe = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
    except OSError:
        return False
    return exe.startswith("python") or exe.startswith("pypy")


def _debugger(pid: int) -> List[str]:
    gdb = shutil.which("gdb")
    if gdb:
        return [gdb, "-q", "-batch", "-nx", "-ex", "set pagination off",
                "-ex", "thread apply all bt", "-p", str(pid)]
    eu = shutil.which("eu-stack")
    if eu:
        return [eu, "-p", str(pid)]
    return []


def stack_traces(ranks: Dict[int, int], host: str, jobid: str) -> List[str]:
    """Stack texts of the ranks ``{rank: pid}`` running on this host.

    Python ranks are sent SIGABRT and write their own stacks (nothing is
    returned for them); the others' stacks are returned as text blocks.
    """
    blocks: List[str] = []
    started: List[Tuple[int, int, subprocess.Popen]] = []
    for rank, pid in sorted(ranks.items()):
        if is_python(pid):
            try:
                os.kill(pid, signal.SIGABRT)
            except OSError:
                pass
            continue
        argv = _debugger(pid)
        head = f"STACK TRACE FOR PROC [{jobid},{rank}] ({host}, PID {pid})"
        if not argv:
            blocks.append(f"{head}\n\tFailed to find gdb or eu-stack on {host} to obtain "
                          f"stack traces")
            continue
        try:
            started.append((rank, pid, subprocess.Popen(argv, stdout=subprocess.PIPE,
                                                        stderr=subprocess.STDOUT,
                                                        stdin=subprocess.DEVNULL)))
        except OSError as err:
            blocks.append(f"{head}\n\t{argv[0]}: {err.strerror}")
    deadline = time.monotonic() + DEBUGGER_SECONDS
    for rank, pid, proc in started:
        head = f"STACK TRACE FOR PROC [{jobid},{rank}] ({host}, PID {pid})"
        try:
            out, _ = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        lines = [line for line in out.decode("utf-8", "replace").splitlines()
                 if line.startswith(("#", "Thread", "TID", "PID", "0x")) or "in " in line]
        blocks.append(head + "".join("\n\t" + line for line in lines or ["(no stack)"]))
    return blocks


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
