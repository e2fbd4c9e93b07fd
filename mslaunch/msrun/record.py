"""``--join=False``: a detached supervisor, and the record a script can follow.

msrun's default returns at once and leaves its processes on their own: a
failure then ends nothing, and a hang-up of the terminal or a SIGTERM leaves
orphans.  Here mslaunch returns at once too -- after printing msrun's lines,
each process's pid and where the record is -- but a detached mslaunch (its
own session, deaf to the terminal's hang-up) supervises the job as
``--join=True`` would: the first failure ends every process (on every node),
nothing is orphaned.  Its messages go to ``mslaunch.log`` in the log
directory, and it keeps ``mslaunch_job.json`` there up to date::

    {"supervisor": PID, "state": "running" | "ended", "exit_code": null | N,
     "log_dir": ..., "processes": [{"name": "worker 0", "pid": ...}]}

Once the job has ended, the record also holds the fields of the job report
(:mod:`mslaunch.run.jobreport`: ``format``, ``version``, ``status``,
``first_failure``, ``ranks`` ...), and each process the report's fields of
its rank (``host``, ``start``, ``end``, ``exit_code``, ``signal`` ...).

``mslaunch --wait_job=LOG_DIR`` waits for the job and exits with its
status; ``mslaunch --stop_job=LOG_DIR`` stops it (SIGTERM to the
supervisor, which stops everything) and exits with its status.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional

from ..core.errors import LaunchError
from ..core.spec import MsrunSpec
from ..machine.osfiles import write_whole

RECORD = "mslaunch_job.json"
LOG = "mslaunch.log"


def _write(log_dir: str, record: Dict[str, Any]) -> None:
    path = os.path.join(log_dir, RECORD)
    write_whole(path, (json.dumps(record, indent=1) + "\n").encode())


def read(log_dir: str) -> Dict[str, Any]:
    """The record in ``log_dir``: a file of this user's, not a link (``--stop_job``
    signals the pid it names)."""
    import stat
    path = os.path.join(log_dir, RECORD)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as err:
        raise LaunchError(f"{path}: {err.strerror} (no detached job there?)") from None
    with open(fd, "rb") as f:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
            raise LaunchError(f"{path}: not a job record of this user's (owner uid "
                              f"{info.st_uid})")
        try:
            record = json.loads(f.read(1 << 24))
        except ValueError:
            raise LaunchError(f"{path}: not a job record") from None
    pid = record.get("supervisor") if isinstance(record, dict) else None
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 1:
        raise LaunchError(f"{path}: not a job record")
    return record


def detach(spec: MsrunSpec) -> int:
    """Start the detached supervisor; return 0 once the job runs (or the error's code)."""
    from .node import log_dir, run_node
    log_dir(spec.log_dir)
    sys.stdout.flush()
    sys.stderr.flush()
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        code = 1
        try:
            code = _supervise(spec, write_fd, run_node)
        finally:
            os._exit(code)
    os.close(write_fd)
    data = b""
    while True:
        chunk = os.read(read_fd, 65536)
        if not chunk:
            break
        data += chunk
    os.close(read_fd)
    try:
        news = json.loads(data.decode()) if data else {}
    except ValueError:
        news = {}
    if "lines" not in news:
        # It ended before the job ran: its status, and its words.
        _, status = os.waitpid(pid, 0)
        text = news.get("error") or f"the detached supervisor ended (see {spec.log_dir}/{LOG})"
        sys.stderr.write(f"mslaunch: error: {text}\n")
        return os.waitstatus_to_exitcode(status) or 1
    if not spec.quiet:
        for line in news["lines"]:
            sys.stdout.write(line + "\n")
        procs = ", ".join(f"{name} pid {p}" for name, p in news["pids"].items())
        sys.stdout.write(f"mslaunch: the job runs detached (supervisor pid {pid}; {procs}); "
                         f"record: {os.path.join(spec.log_dir, RECORD)}; "
                         f"mslaunch --wait_job={spec.log_dir} waits for it, "
                         f"--stop_job={spec.log_dir} stops it\n")
    return 0


def _supervise(spec: MsrunSpec, news_fd: int, run_node) -> int:
    """The detached child: a session of its own, messages to the log, the record kept."""
    os.setsid()
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    from ..machine.osfiles import open_own
    log = open_own(os.path.join(spec.log_dir, LOG), append=True, mode=0o600)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.close(null)
    record: Dict[str, Any] = {"supervisor": os.getpid(), "state": "starting",
                              "exit_code": None, "log_dir": spec.log_dir, "processes": [],
                              "started": time.time()}
    told: List[bool] = []

    def announce(lines: List[str], pids: Dict[str, int]) -> None:
        record["state"] = "running"
        record["processes"] = [{"name": name, "pid": p} for name, p in pids.items()]
        _write(spec.log_dir, record)
        os.write(news_fd, json.dumps({"lines": lines, "pids": pids}).encode())
        os.close(news_fd)
        told.append(True)

    def finished(report: Dict[str, Any]) -> None:
        # The job report's fields join the record's (whose keys stay as they were);
        # each process gains its host, times and exit code or signal.
        keep = {k: record[k] for k in ("supervisor", "state", "log_dir", "started")}
        record.update(report)
        record.update(keep)
        record["processes"] = report["ranks"]

    code = 1
    try:
        code = run_node(spec, announce=announce, on_result=finished)
    except LaunchError as err:
        code = err.exit_code
        if not told:
            os.write(news_fd, json.dumps({"error": str(err)}).encode())
        sys.stderr.write(f"mslaunch: error: {err}\n")
    finally:
        if not told:
            try:
                os.close(news_fd)
            except OSError:
                pass
        record.update(state="ended", exit_code=code, ended=time.time())
        try:
            _write(spec.log_dir, record)
        except OSError:
            pass
        sys.stdout.flush()
        sys.stderr.flush()
    return code


def wait_job(log_dir: str, stop: bool = False) -> int:
    """``--wait_job`` / ``--stop_job``: the job's exit status once it has ended."""
    record = read(log_dir)
    pid = record["supervisor"]
    if record.get("state") != "ended":
        if stop and _alive(pid, record):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        while _alive(pid, record):
            time.sleep(0.1)
        record = read(log_dir)
    code = record.get("exit_code")
    if not isinstance(code, int):
        raise LaunchError(f"the job's supervisor (pid {pid}) is gone without a status "
                          f"(killed?); see {os.path.join(log_dir, LOG)}")
    return code


def _alive(pid: int, record: Dict[str, Any]) -> bool:
    """Whether the job's supervisor still runs: an mslaunch of this user's, started
    when the record says (a reused pid is someone else)."""
    try:
        owner = os.stat(f"/proc/{pid}").st_uid
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            mine = b"mslaunch" in f.read()
    except (OSError, IndexError):
        return False
    started = record.get("started")
    if isinstance(started, float) and abs(_started_at(int(fields[19])) - started) > 5.0:
        return False                   # (its clock's start, against the record's)
    return mine and owner == os.geteuid() and fields[0] != b"Z" and \
        read_state(record) != "ended"


def _started_at(ticks: int) -> float:
    """When a process started, in seconds since the epoch, from its start in clock
    ticks after the boot (``/proc/PID/stat``)."""
    with open("/proc/stat", "rb") as f:
        boot = next(int(line.split()[1]) for line in f if line.startswith(b"btime "))
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def read_state(record: Dict[str, Any]) -> Optional[str]:
    try:
        return read(record["log_dir"]).get("state")
    except LaunchError:
        return None
