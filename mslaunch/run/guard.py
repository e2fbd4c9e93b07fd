"""The guard against orphans: no rank, and nothing a rank started, outlives the job.

Before the first rank starts, the launcher forks a small watchdog into its
own session.  The launcher tells it, over a pipe, the process group of every
rank it starts.  When the pipe reaches end-of-file without the final
``done`` line, the launcher died abruptly (SIGKILL, say); when ``done``
arrives, the job ended normally.  Either way the watchdog then terminates
every rank group still alive and every process whose initial environment
carries this job's ``MSLAUNCH_JOB`` marker (SIGTERM, then SIGKILL after the
grace period).  The marker catches ranks started in the instant before
their group was reported, and daemons that left their rank's group with
``setsid``.  The launcher does not wait for that sweep: it runs beside the
launcher's exit, off the job's critical path.
"""

from __future__ import annotations

import os
import signal
import time
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Iterable, Set

_IGNORED = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGPIPE",
            "SIGTSTP", "SIGTTIN", "SIGTTOU", "SIGALRM")


def marked_pids(marker: str) -> Set[int]:
    """Pids of processes whose initial environment holds ``MSLAUNCH_JOB=marker``."""
    needle = f"MSLAUNCH_JOB={marker}\0".encode()
    found = set()
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        if env.startswith(needle) or b"\0" + needle in env:
            found.add(int(entry))
    return found


def _signal_all(groups: Iterable[int], pids: Iterable[int], sig: int) -> bool:
    """Send ``sig`` to groups and pids; return True if any still existed."""
    alive = False
    for pgid in groups:
        try:
            os.killpg(pgid, sig)
            alive = True
        except OSError:
            pass
    for pid in pids:
        try:
            os.kill(pid, sig)
            alive = True
        except OSError:
            pass
    return alive


def terminate(groups: Iterable[int], marker: str, grace: float) -> None:
    """SIGCONT+SIGTERM every group and marked process, SIGKILL after ``grace``."""
    groups = set(groups)
    pids = marked_pids(marker)
    _signal_all(groups, pids, signal.SIGCONT)
    if not _signal_all(groups, pids, signal.SIGTERM):
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        time.sleep(0.05)
        if not _signal_all(groups, marked_pids(marker) | pids, 0):
            return
    _signal_all(groups, marked_pids(marker) | pids, signal.SIGKILL)


def _watch(read_fd: int, marker: str, grace: float) -> None:
    os.setsid()
    for name in _IGNORED:
        signal.signal(getattr(signal, name), signal.SIG_IGN)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.closerange(3, read_fd)
    os.closerange(read_fd + 1, 1 << 16)
    groups: Set[int] = set()
    buf = b""
    done = False
    while not done:
        try:
            data = os.read(read_fd, 4096)
        except OSError:
            data = b""
        if not data:
            break
        buf += data
        *lines, buf = buf.split(b"\n")
        for line in lines:
            if line == b"done":
                done = True
            elif line[:1] == b"+":
                groups.add(int(line[1:]))
            elif line[:1] == b"-":
                groups.discard(int(line[1:]))
    # After "done" the launcher has seen every rank group end, and a group id
    # may already name someone else's group: only the marker counts then.
    terminate(set() if done else groups, marker, grace)


class Watchdog:
    """Launcher side of the guard."""

    def __init__(self, marker: str, grace: float) -> None:
        read_fd, self._fd = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                _watch(read_fd, marker, grace)
            finally:
                os._exit(0)
        os.close(read_fd)
        self.pid = pid
        self._pending: list = []

    def add(self, pgid: int) -> None:
        """Note a rank group; sent at the next :meth:`flush` (one write, one wake-up)."""
        self._pending.append(f"+{pgid}\n")

    def remove(self, pgid: int) -> None:
        self._pending.append(f"-{pgid}\n")

    def flush(self) -> None:
        # Groups not yet sent when the launcher dies are still found by the
        # environment marker, so batching costs no safety.
        if self._fd >= 0 and self._pending:
            try:
                os.write(self._fd, "".join(self._pending).encode())
            except OSError:
                pass
        self._pending.clear()

    def close(self) -> None:
        """Normal end: the watchdog sweeps for leftovers and exits on its own.

        It is not waited for; if the launcher outlives it, the zombie goes
        with the launcher's own exit.
        """
        if self._fd < 0:
            return
        self._pending = ["done\n"]
        self.flush()
        os.close(self._fd)
        self._fd = -1
