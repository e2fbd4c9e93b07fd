"""The exception tree of mslaunch.

Every error the launcher raises on purpose derives from :class:`LaunchError`.
Only the command-line boundary (:mod:`mslaunch.cli`) catches them; it prints
the message as one line and exits with :attr:`LaunchError.exit_code`.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, Iterable, Optional

#: Exit status of a job stopped by ``--timeout`` (Open MPI 4 uses the same).
TIMEOUT_EXIT = 110
#: Exit status of a job ended by ``--stall-exit`` (see :mod:`mslaunch.inspect.stall`).
STALL_EXIT = 111

#: Exit status when a host is lost (its agent, its connection or its network):
#: no rank's own status can be known then.  ssh and Hydra use the same.
HOST_LOST_EXIT = 255


class LaunchError(Exception):
    """A failure the user can act on; the message is shown as one line.

    ``exit_code`` is mslaunch's exit status for it: the class's, unless given."""

    exit_code = 1

    def __init__(self, message: str = "", exit_code: Optional[int] = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class HostsFailed(LaunchError):
    """Hosts that could not be started, or were lost before the job's ranks
    started: ``failed`` maps each to why, in a few words; ``unreachable`` are
    those of them that could not be reached or stopped answering (rather than
    refused: a host key, a login, a missing Python).  ``started`` holds the
    agents that did start (a starter's connections, by host), which whoever
    catches this uses or closes."""

    def __init__(self, message: str, failed: Dict[str, str],
                 started: Optional[Dict[str, Any]] = None,
                 unreachable: Iterable[str] = (),
                 exit_code: Optional[int] = None) -> None:
        super().__init__(message, exit_code)
        self.failed = dict(failed)
        self.started = dict(started or {})
        self.unreachable = tuple(unreachable)


class NoHostLeft(LaunchError):
    """Every host of the job was left out (lost, failed its health check)."""


class Stopped(LaunchError):
    """mslaunch was asked to stop (SIGINT, SIGTERM, SIGHUP) where no job ran to
    take it (between two attempts of a job, during its health check): the
    signal's exit status, 128 + N."""

    def __init__(self, message: str, signal: int) -> None:
        super().__init__(message, 128 + signal)
        self.signal = signal


class TimedOut(LaunchError):
    """``--timeout`` ended the job where no attempt ran to say so (during its health
    check): exit status 110."""

    exit_code = TIMEOUT_EXIT


class UsageError(LaunchError):
    """Bad command line: unknown flag, bad number, conflicting options."""

    exit_code = 2


class HostfileError(UsageError):
    """A malformed or unreadable host list; the message names FILE:LINE."""


class PlanError(LaunchError):
    """The job cannot be placed on the hosts given (e.g. too few slots)."""


class SpawnError(LaunchError):
    """A rank could not be started (program not found, bad working dir)."""

    exit_code = 127


def one_line(text: object, limit: int = 500) -> str:
    """``text`` cut to ``limit`` characters with control characters escaped, so
    that what a peer or a file supplies can never break a message in two."""
    text = str(text)[:limit]
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def os_error_reason(err: OSError) -> str:
    """A short reason for an OSError, with a hint when descriptors or processes ran out."""
    if err.errno in (24, 23):          # EMFILE, ENFILE (no import: no descriptor needed)
        return "too many open files (raise the limit: ulimit -n)"
    if err.errno == 11:                # EAGAIN, as fork and posix_spawn say it
        return "no process can be started now (a limit on processes: ulimit -u, a cgroup's " \
               "pids.max)"
    return err.strerror or str(err)
