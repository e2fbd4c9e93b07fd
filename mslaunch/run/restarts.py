"""A job run with ``--max-restarts`` or ``--health-check``: what each attempt is
given, around the attempt loop of :mod:`.attempts` (the policy).

Every attempt runs under the run's one orphan guard (one cgroup: a guard of its
own for each would move the launcher into the first attempt's cgroup and make
the next one's inside it, where the first guard's end would reach it), with a
job name of its own, without the hosts left out so far, and with the agents the
attempt before kept (:mod:`mslaunch.backends.agents.keptagents`), watched while they wait.  What an
attempt left behind is ended before the next starts.  The health check is an
attempt of its own, one process per host.  Stop signals that come between two
attempts, when no supervisor runs to take them, are noted for the loop.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, List, Mapping, Optional, Sequence, Tuple

    from ..core.spec import HostEntry, JobResult, JobSpec
    from ..backends.session import Session

from ..mpi.pmi.files import new_kvsname
from ..core.spec import AttemptOutcome, replace
from ..core.states import TIMEOUT
from .attempts import run_attempts
from .attempt import JobPlanning, run_attempt


def run_restartable(job: JobSpec, environ: Mapping[str, str], session: Session,
                    kvsname: str, hosts: Callable[[], Sequence[HostEntry]]) -> JobResult:
    """Run ``job`` until an attempt succeeds or cannot start again (see
    :func:`.attempts.run_attempts`); ``kvsname``: the first attempt's name."""
    from ..core import signal
    import os

    from ..wire.endpoint import HEARTBEAT, RESTART_HEARTBEAT, heartbeat_setting
    from ..backends.agents.keptagents import KeptAgents
    kept = session.kept = KeptAgents(session.console.message, heartbeat_setting(
        environ.get("MSLAUNCH_HEARTBEAT"), RESTART_HEARTBEAT if job.max_job_restarts
        else HEARTBEAT))
    session.attempts = True
    attempts = _Attempts(job, environ, session, kvsname, hosts)
    stops: List[int] = []

    def suspend(signum, frame) -> None:
        # Ctrl-Z between two attempts: the waiting agents hear it (an attempt's
        # supervisor forwards it to its ranks and hosts itself).
        kept.pause()
        os.kill(os.getpid(), signal.SIGSTOP)

    old = {sig: signal.signal(sig, lambda signum, frame: stops.append(signum))
           for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    old[signal.SIGTSTP] = signal.signal(signal.SIGTSTP, suspend)
    # However it was stopped (SIGSTOP too), mslaunch goes on with a SIGCONT.
    old[signal.SIGCONT] = signal.signal(signal.SIGCONT, lambda signum, frame: kept.resume())
    try:
        return run_attempts(job, attempts.run_one, attempts.say,
                            lambda: stops[0] if stops else None,
                            check=attempts.check if job.health_check else None)
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


class _Attempts:
    """What :func:`run_restartable` gives the attempt loop: one attempt's run, the
    health check, and mslaunch's lines between attempts."""

    def __init__(self, job: JobSpec, environ: Mapping[str, str], session: Session,
                 kvsname: str, hosts: Callable[[], Sequence[HostEntry]]) -> None:
        self.job, self.environ, self.session, self.hosts = job, environ, session, hosts
        self.first = [kvsname]

    def _guarded(self, run: Callable[[str], AttemptOutcome]) -> AttemptOutcome:
        name = self.first.pop() if self.first else new_kvsname()
        try:
            return run(name)
        finally:
            self.session.guard.sweep(self.job.grace)

    def run_one(self, job_k: JobSpec, left_out: Tuple[str, ...], note: str,
                launched: Callable[[], None]) -> AttemptOutcome:
        job, session = self.job, self.session
        session.follows = "restart" if job_k.attempt < job.max_job_restarts else "none"
        if job_k.attempt and job.stdin != "none":
            # mslaunch's stdin is the first attempt's: what a failed attempt's rank
            # had read of it cannot be known to its program's checkpoint.
            if job_k.attempt == 1 and _reads_input():
                self.say("mslaunch: stdin goes to the first attempt only: the restarted "
                         "job's ranks read end-of-file (a job that resumes from a checkpoint "
                         "reads its input from a file)")
            job_k = replace(job_k, stdin="none")
        kept = session.kept
        assert kept is not None
        # Spare hosts whose waiting agents were lost are left out before the plan
        # (and said lost, with the attempt's, to the loop).
        without = tuple(dict.fromkeys(left_out + tuple(kept.check())))
        outcome = self._guarded(lambda name: run_attempt(
            job_k, self.environ, session, JobPlanning(job_k, self.environ, name, self.hosts,
                                                      without), note, launched))
        lost = outcome.lost + tuple(n for n in kept.lost
                                    if n not in left_out and n not in outcome.lost)
        return AttemptOutcome(outcome.result, outcome.hosts, lost)

    def check(self, left_out: Tuple[str, ...], timeout_left: Optional[float]) -> Tuple[str, ...]:
        """The health check (:mod:`.health`) on the hosts but ``left_out``, within the
        ``timeout_left`` s of ``--timeout`` if given: the hosts where it failed."""
        from .health import HEALTH_TIMEOUT, failed_hosts, health_job
        job, session = self.job, self.session
        session.follows = "health"
        check = health_job(job)
        by_job = timeout_left is not None and timeout_left < HEALTH_TIMEOUT
        if by_job:
            check = replace(check, timeout_left=timeout_left)
        outcome = self._guarded(lambda name: run_attempt(
            check, self.environ, session, JobPlanning(check, self.environ, name, self.hosts,
                                                      left_out), tell=False))
        sig = outcome.result.stop_signal
        if sig is not None:       # a stop, not the hosts' failure
            from ..core.errors import Stopped
            from ..machine.spawn import signal_name
            raise Stopped(f"stopped by {signal_name(sig)} during the --health-check", sig)
        if by_job and outcome.result.ending == TIMEOUT:
            from ..core.errors import TimedOut
            raise TimedOut(f"job timed out after {job.timeout:g} s ({job.timeout_source}), "
                           f"during the --health-check")
        failed = failed_hosts(outcome.result)
        for host, how in failed:
            if host in outcome.lost:      # (its loss and why were said as it happened)
                self.say(f"mslaunch: {host}, lost during the --health-check, is left out")
            else:
                self.say(f"mslaunch: --health-check failed on {host} ({how}): the host is "
                         f"left out")
        return tuple(host for host, _ in failed)

    def say(self, line: str) -> None:
        self.session.console.message(line)


def _reads_input() -> bool:
    """Whether mslaunch's stdin has something to read (not /dev/null, not closed)."""
    import os
    try:
        st, null = os.fstat(0), os.stat(os.devnull)
    except OSError:
        return False
    return (st.st_rdev, st.st_ino) != (null.st_rdev, null.st_ino)
