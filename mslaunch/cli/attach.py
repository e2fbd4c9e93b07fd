"""Finding a running job of this user and asking it something (mslaunch-stacks, -top).

Every job's launcher listens on ``PID.sock`` in this user's private
directory (see :func:`mslaunch.machine.procs.private_dir`; both of its
candidates are searched).  A job is named by its launcher's pid, by its job
id (the kvsname ``-v`` prints, or its start), or not at all: this user's only
job, or, among several, the one started from the caller's terminal, else from
its session (said on stderr, with how to name another).  A socket nobody listens on any more (its launcher was
killed before its guard cleaned up) is removed.
"""

from __future__ import annotations

import json
import os
import socket
from typing import Any, Dict, List, Optional, Tuple

from ..core.errors import LaunchError


def _sockets() -> List[Tuple[int, str]]:
    from ..machine.procs import private_dirs
    found: Dict[int, str] = {}
    for base in private_dirs():
        for name in os.listdir(base):
            stem, _, ext = name.partition(".")
            if ext == "sock" and stem.isdigit():
                found.setdefault(int(stem), os.path.join(base, name))
    return sorted(found.items())


def ask(path: str, request: Dict[str, Any], timeout: float) -> Dict[str, Any]:
    """One request to the job at ``path``, one answer (LaunchError if none)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(path)
        try:
            sock.sendall(json.dumps(request).encode() + b"\n")
        except BrokenPipeError:
            pass        # refused before it read: its reason may be waiting below
        buf = b""
        while not buf.endswith(b"\n"):
            data = sock.recv(1 << 20)
            if not data:
                break
            buf += data
    except socket.timeout:
        raise LaunchError(f"the job did not answer in {timeout:g} s") from None
    except (ConnectionRefusedError, FileNotFoundError):
        raise LaunchError("the job has ended") from None
    except OSError as err:
        raise LaunchError(f"cannot reach the job: {err.strerror or err}") from None
    finally:
        sock.close()
    try:
        answer = json.loads(buf.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise LaunchError("the job's answer is not JSON (it may have ended meanwhile)") from None
    if not isinstance(answer, dict):
        raise LaunchError("the job's answer is not a JSON object")
    if "error" in answer:
        raise LaunchError(f"the job says: {answer['error']}")
    return answer


def find_job(name: Optional[str]) -> Tuple[str, Dict[str, Any]]:
    """The socket and ``info`` of the job named ``name`` (see the module docstring)."""
    sockets = _sockets()
    named = [(pid, path) for pid, path in sockets if name == str(pid)]
    if named:
        sockets = named              # a pid: only that job is asked
    live = []
    silent: List[Tuple[int, str]] = []
    for pid, path in sockets:
        try:
            live.append((pid, path, ask(path, {"op": "info"}, 5.0)))
        except LaunchError as err:
            if "ended" in str(err):
                try:
                    os.unlink(path)          # its launcher died: nobody listens
                except OSError:
                    pass
            else:
                silent.append((pid, str(err)))
    if name is None:
        if len(live) == 1:
            return live[0][1], live[0][2]
        if not live and silent:
            raise LaunchError(_silent(*silent[0]))
        if not live:
            raise LaunchError("no running mslaunch job of this user on this machine"
                              + _without_socket())
        jobs = ", ".join(f"{pid} ({info.get('kvsname')})" for pid, _, info in live)
        chosen = _callers(live)
        if chosen is not None:
            (pid, path, info), where = chosen
            others = ", ".join(str(p) for p, _, _ in live if p != pid)
            import sys
            sys.stderr.write(f"mslaunch: {len(live)} jobs of yours run; this {where}'s is "
                             f"launcher {pid} ({info.get('kvsname')}); name another by its "
                             f"launcher pid: {others}\n")
            return path, info
        raise LaunchError(f"{len(live)} jobs run, none of this terminal or session; name one "
                          f"by its launcher pid or job id: {jobs}")
    for pid, path, info in live:
        if name == str(pid) or str(info.get("kvsname", "")).startswith(name):
            return path, info
    for pid, why in silent:
        if name == str(pid):
            raise LaunchError(_silent(pid, why))
    raise LaunchError(f"no running mslaunch job {name!r} of this user on this machine "
                      f"(jobs: {', '.join(str(p) for p, _, _ in live) or 'none'})"
                      + _without_socket(name))


def _session_and_terminal(pid: str) -> Tuple[int, int]:
    """A process's session and controlling terminal (0: none), from /proc."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return int(fields[3]), int(fields[4])
    except (OSError, IndexError, ValueError):
        return -1, -1


def _callers(live: List[Tuple[int, str, Dict[str, Any]]]):
    """The one job of ``live`` started from the caller's terminal, else from its
    session, with which of the two; None when neither names exactly one."""
    session, terminal = _session_and_terminal("self")
    seen = {pid: _session_and_terminal(str(pid)) for pid, _, _ in live}
    for where, mine, index in (("terminal", terminal, 1), ("session", session, 0)):
        if mine <= 0:
            continue
        found = [job for job in live if seen[job[0]][index] == mine]
        if len(found) == 1:
            return found[0], where
    return None


def _silent(pid: int, err: str) -> str:
    """Why the job of launcher ``pid`` could not be asked, and whether it is stopped."""
    lead = "the job did not answer"
    text = (f"the job of launcher {pid}{err[len('the job'):]}" if err.startswith(lead)
            else f"the job of launcher {pid}: {err}")
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stopped = f.read().rsplit(b")", 1)[1].split()[0] in (b"T", b"t")
    except (OSError, IndexError):
        stopped = False
    return text + (f": it is stopped (kill -CONT {pid})" if stopped else "")


def _without_socket(name: Optional[str] = None) -> str:
    """Which launchers of this user run here without a control socket (the msrun
    mode, ``--mpi openmpi``), said after a search found no job."""
    uid, found = os.getuid(), {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or (name is not None and entry != name):
            continue
        try:
            if os.stat(f"/proc/{entry}").st_uid != uid:
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().decode("utf-8", "replace").split("\0")
            with open(f"/proc/{entry}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if "mslaunch" in argv[1:3] and argv[argv.index("mslaunch") - 1] == "-m" \
                or os.path.basename(argv[1] if len(argv) > 1 else "") == "mslaunch":
            found[int(entry)] = (ppid, argv)
    said = []
    for pid, (ppid, argv) in sorted(found.items()):
        if found.get(ppid, (0, None))[1] == argv:
            continue                 # the launcher's own guard
        mode = ("--mpi openmpi" if "--mpi=openmpi" in argv or any(
            a == "--mpi" and b == "openmpi" for a, b in zip(argv, argv[1:]))
                else "msrun mode" if any(a.startswith("--worker_num") for a in argv)
                else "")
        said.append(f"{pid}{' (' + mode + ')' if mode else ''}")
    if not said:
        return ""
    return (f"; {', '.join(said[:5])} run mslaunch with no control socket (the msrun "
            f"mode and --mpi openmpi have none, a job has none until it starts)")
