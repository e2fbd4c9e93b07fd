"""The job report: a JSON record of a finished job, for tools.

Written on request (``--report-json FILE`` in the mpirun dialect,
``--report_json=FILE`` in msrun's) and merged into msrun mode's
``mslaunch_job.json``.  The format is stable: fields are only ever added,
and ``version`` is raised when one changes meaning (see the reference page
``docs/reference/job-report.md``)::

    {"format": "mslaunch-job-report", "version": 1,
     "status": "succeeded" | "failed" | "timed-out" | "stalled" | "stopped"
               | "output-failed" | "stopped-by-peer" | "not-started",
     "exit_code": N, "message": "...", "start": T, "end": T,
     "launcher": {"pid": N, "host": "...", "version": "..."},
     "first_failure": null | RANK,
     "failures": [{"at": T, "rank": N, "job": N, "host": "...", "reason": "..."}, ...],
     "ranks": [RANK, ...],
     "attempts": [ATTEMPT, ...]}          (with --max-restarts only)

    RANK = {"rank": N, "job": N, "name": "rank N" | "worker N" | ...,
            "host": "...", "pid": N | null, "start": T | null, "end": T | null,
            "exit_code": N | null, "signal": N | null, "signal_name": "SIGKILL" | null,
            "reason": "...", "restarts": N}

    ATTEMPT = {"attempt": N, "start": T, "end": T, "exit_code": N, "cause": "...",
               "hosts": ["...", ...], "lost": ["...", ...], "left_out": ["...", ...],
               "restart_seconds": S | null, "stall_report": "..." (if it stalled)}

Times are seconds since the epoch (floats), as this machine's clock saw the
events; ``exit_code`` is null for a rank killed by a signal or never ended.
``failures`` is the cause (``first_failure``) and what failed after it before
the job was stopped, each once, with when it happened (a remote host's time
put on this clock); empty when nothing failed.  With ``--max-restarts``, the
top-level fields describe the last attempt, and ``attempts`` every one: what
ended it, the hosts it ran on and those it lost (left out of the next), and
how long after the previous attempt's failure its ranks were all running.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, Optional

    from ..core.spec import Attempt

    from ..core.spec import JobResult, RankResult

from .. import __version__
from ..core.errors import LaunchError, UsageError
from ..machine.spawn import signal_name
from ..machine.osfiles import write_whole

FORMAT = "mslaunch-job-report"
VERSION = 1

#: JobResult.ending -> the report's status (None: the job ran to its end).
_STATUS = {"failure": "failed", "timeout": "timed-out", "stall": "stalled", "signal": "stopped",
           "output": "output-failed", "remote": "stopped-by-peer"}
#: The message of an ending whose line mslaunch printed while the job ran.
_SAID = {"timed-out": "the job timed out (--timeout)",
         "stalled": "the job stalled (--stall-report with --stall-exit)",
         "output-failed": "mslaunch's output could not be written",
         "stopped-by-peer": "another node stopped the job"}


def rank_record(r: RankResult) -> Dict[str, Any]:
    """One rank (or process) of the report."""
    return {"rank": r.rank, "job": r.job, "name": r.name or f"rank {r.rank}", "host": r.host,
            "pid": r.pid or None, "start": r.start, "end": r.end,
            "exit_code": r.returncode if r.signal is None else None, "signal": r.signal,
            "signal_name": signal_name(r.signal) if r.signal is not None else None,
            "reason": r.reason, "restarts": r.restarts,
            "error": {"message": r.error, "traceback": r.error_traceback, "file": r.error_file}
            if r.error or r.error_traceback else None}


def status_of(result: JobResult) -> str:
    if result.ending in _STATUS:
        return _STATUS[result.ending]
    if result.root_cause is not None or result.exit_code:
        return "failed"
    return "succeeded"


def build(result: Optional[JobResult], start: float, error: str = "",
          exit_code: Optional[int] = None) -> Dict[str, Any]:
    """The report of a job that ran (``result``), or that could not start (``error``)."""
    ranks = [rank_record(r) for r in result.ranks] if result is not None else []
    first = None
    if result is not None and result.root_cause is not None:
        first = rank_record(result.root_cause)
    message = error or (result.message.split("\n", 1)[0] if result is not None else "")
    if message.startswith("mslaunch: "):
        message = message[len("mslaunch: "):]
    status = status_of(result) if result is not None else "not-started"
    return {
        "format": FORMAT, "version": VERSION, "status": status,
        "exit_code": result.exit_code if result is not None else exit_code,
        "message": message or _SAID.get(status, ""), "start": start, "end": time.time(),
        "launcher": {"pid": os.getpid(), "host": os.uname().nodename, "version": __version__},
        "first_failure": first, "ranks": ranks,
        "failures": [{"at": at, "rank": r.rank, "job": r.job, "host": r.host,
                      "reason": r.reason or rank_record(r)["signal_name"] or
                      f"exit code {r.returncode}"}
                     for at, r in (result.failures if result is not None else ())],
        **({"attempts": [attempt_record(a) for a in result.attempts]}
           if result is not None and result.attempts else {}),
    }


def attempt_record(a: Attempt) -> Dict[str, Any]:
    """One attempt of a job run with ``--max-restarts``."""
    return {"attempt": a.number, "start": a.start, "end": a.end, "exit_code": a.exit_code,
            "cause": a.cause, "hosts": list(a.hosts), "lost": list(a.lost),
            "left_out": list(a.left_out),
            "restart_seconds": None if a.restart_seconds is None
            else round(a.restart_seconds, 3),
            **({"stall_report": a.stall_report} if a.stall_report else {})}


def check_writable(path: str, flag: str = "--report-json") -> None:
    """Refuse, before the job starts, a report that could not be written at its end."""
    directory = os.path.dirname(path) or "."
    if not os.path.isdir(directory):
        raise UsageError(f"{flag} {path}: no directory {directory}")
    mode = _mode(path)
    if stat.S_ISREG(mode) and os.path.realpath(path).startswith(("/proc/", "/sys/")):
        # (root's os.access says yes to /proc/version, whose write then fails)
        raise UsageError(f"{flag} {path}: a file of the kernel's, not one a report can be "
                         f"written to")
    if stat.S_ISDIR(mode):
        ok = False
    elif _in_place(path, mode):
        ok = os.access(path, os.W_OK)       # its directory need not be writable
    else:
        ok = os.access(directory, os.W_OK | os.X_OK)
    if not ok:
        raise UsageError(f"{flag} {path}: cannot be written here")


def write(path: str, report: Dict[str, Any], flag: str = "--report-json") -> None:
    """Write the report to ``path``.  A regular file (or a new one) is written
    whole, a temporary file renamed over it, so a reader never sees half of it;
    a symlink's file gets it, the link stays.  A FIFO, a terminal, a device or a
    descriptor (``/dev/stdout``, ``/dev/fd/N``) is written in place, never
    replaced (a file behind a descriptor is appended to)."""
    data = (json.dumps(report, indent=1) + "\n").encode()
    mode = _mode(path)
    try:
        if _in_place(path, mode):
            _write_in_place(path, data)
        else:
            write_whole(os.path.realpath(path), data)
    except OSError as err:
        reason = "a FIFO with no reader" if err.errno == errno.ENXIO and \
            stat.S_ISFIFO(mode) else err.strerror
        raise LaunchError(f"{flag} {path}: {reason}") from None


def _mode(path: str) -> int:
    """The file type of ``path`` (a symlink followed); a regular file's if none yet."""
    try:
        return os.stat(path).st_mode
    except OSError:
        return stat.S_IFREG


def _in_place(path: str, mode: int) -> bool:
    """Whether the report is written into the file as it is: a FIFO, a terminal,
    a device, or a descriptor's name (``/dev/stdout`` even for a file behind it)."""
    return not stat.S_ISREG(mode) or os.path.abspath(path).startswith(("/dev/", "/proc/"))




def _write_in_place(path: str, data: bytes) -> None:
    # O_NONBLOCK: a FIFO nobody reads fails (ENXIO) instead of blocking the end
    # of the job; blocking again for the writes themselves.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        os.set_blocking(fd, True)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)
