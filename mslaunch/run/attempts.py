"""Carrying a job through failures (``--max-restarts N``): the attempt loop.

An attempt is one whole run of the job, by one supervisor.  When it fails (a
rank's non-zero exit or signal, ``MPI_Abort``, a rank gone without
``MPI_Finalize``, a lost host, a stall with ``--stall-exit``), its supervisor
has stopped every rank on every host and removed what they left, as for any
failed job; then the job starts again: the same program and rank numbers, a
fresh job name (PMI/PMIx namespace) and rendezvous port, the attempt's number
in ``MSLAUNCH_RESTART_COUNT`` (and torchrun's ``TORCHELASTIC_RESTART_COUNT``).
Hosts lost during an attempt are left out of the next one; their ranks take
the slots that the job did not need (spares).  A job stopped by a signal, by
``--timeout`` or because its output could not be written is not started
again, nor one that could not start at all.

After ``N`` restarts, the job ends with its last failure's code, as it would
without the option.  An attempt that fails within :data:`QUICK` seconds of its
start after one that did the same waits a back-off (:func:`backoff`).

The loop itself is here; what runs one attempt is given (``run_one``), so that
this policy knows nothing of starters or plans.
"""

from __future__ import annotations

import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, List, Optional, Tuple

    from ..core.spec import AttemptOutcome

    #: The health check: given the hosts left out and the seconds left of
    #: --timeout (None: no limit), the hosts where it failed.
    Check = Callable[[Tuple[str, ...], Optional[float]], Tuple[str, ...]]


from ..core.errors import TIMEOUT_EXIT, HostsFailed, LaunchError, Stopped, TimedOut
from ..machine.spawn import signal_name
from ..core.spec import Attempt, JobResult, replace
from ..core.states import RESTARTED_ENDINGS, SIGNAL, STALL, TIMEOUT

#: An attempt that fails within this many seconds of its start is a quick one.
QUICK = 10.0
#: The longest back-off between two attempts, in seconds.
MAX_BACKOFF = 8.0


def backoff(quick: int) -> float:
    """Seconds to wait before the next attempt after ``quick`` quick failures in
    a row: none after the first (the point is to be running again at once),
    then 0.5 s, doubling up to :data:`MAX_BACKOFF` (a program that can never
    start does not spin)."""
    if quick <= 1:
        return 0.0
    return min(0.5 * 2 ** (quick - 2), MAX_BACKOFF)


def restartable(result: JobResult) -> bool:
    """Whether a job that ended so is started again (restarts left or not): not
    when mslaunch was asked to stop, also while a failure was stopping the job."""
    return result.exit_code != 0 and result.ending in RESTARTED_ENDINGS \
        and result.stop_signal is None


def cause_of(result: JobResult) -> str:
    """The failure that ended an attempt, in one line (its console message's first)."""
    line = result.message.split("\n", 1)[0]
    if line.startswith("mslaunch: "):
        line = line[len("mslaunch: "):]
    if not line and result.ending == STALL:
        line = "the job stalled (--stall-exit)"
    return line or f"the job ended with exit status {result.exit_code}"


def run_attempts(job, run_one: Callable[..., AttemptOutcome],
                 say: Callable[[str], None],
                 stopped: Callable[[], Optional[int]] = lambda: None,
                 check: Optional[Check] = None
                 ) -> JobResult:
    """Run ``job`` (a :class:`~mslaunch.core.spec.JobSpec` with ``max_job_restarts``)
    until an attempt succeeds, cannot be started again, or no restart is left.

    ``run_one(job, left_out, note, launched)`` runs one attempt of ``job`` (whose
    ``attempt`` says which, and ``timeout_left`` what is left of ``--timeout``)
    without the hosts ``left_out``; ``note`` is the line its ranks' output files
    get before what the attempt appends to them, and ``launched()`` is called
    once its ranks have all been started.  It returns an :class:`AttemptOutcome`.
    ``say`` prints one of mslaunch's lines; ``stopped()`` is the stop signal that
    came between two attempts, if any.  ``check(left_out, timeout_left)``, the
    user's health check (``--health-check``), runs before every attempt and names
    the hosts where it failed: they are left out from then on.
    """
    return _Attempts(job, run_one, say, stopped, check).run()


class _Attempts:
    """:func:`run_attempts`'s loop and what it keeps between attempts."""

    def __init__(self, job, run_one: Callable[..., AttemptOutcome], say: Callable[[str], None],
                 stopped: Callable[[], Optional[int]],
                 check: Optional[Check]) -> None:
        self.job, self.run_one, self.say, self.stopped, self.check = \
            job, run_one, say, stopped, check
        self.limit = job.max_job_restarts
        self.attempts: List[Attempt] = []
        self.left_out: Tuple[str, ...] = ()
        self.number = 0
        self.last: Optional[JobResult] = None
        self.failed_at: Optional[float] = None
        self.launched: List[float] = []
        self.note = ""
        self.announce: Tuple[str, str] = ("", "")
        self.began = time.monotonic()

    def on_launched(self) -> None:
        self.launched.append(time.time())
        if self.announce[0]:
            took = self.launched[-1] - self.failed_at if self.failed_at is not None else 0.0
            self.say(f"{self.announce[0]}{max(0.0, took):.2f}{self.announce[1]}")

    def run(self) -> JobResult:
        quick, wait = 0, 0.0
        while True:
            ended = self._before(wait)
            if ended is not None:
                return ended
            wait = 0.0
            start = time.time()
            self.launched.clear()
            try:
                if self.check is not None:
                    self.left_out = tuple(dict.fromkeys(self.left_out + self.check(
                        self.left_out, self._job().timeout_left)))
                outcome = self.run_one(self._job(), self.left_out, self.note, self.on_launched)
            except HostsFailed as err:
                if self._without(err):
                    continue
                return self._not_again(err)
            except LaunchError as err:
                return self._not_again(err)
            self.last = result = outcome.result
            took = self.launched[0] - self.failed_at \
                if self.launched and self.failed_at is not None else None
            self.attempts.append(Attempt(
                number=self.number, start=start, end=time.time(), exit_code=result.exit_code,
                cause=cause_of(result) if result.exit_code else "", hosts=outcome.hosts,
                lost=outcome.lost, left_out=self.left_out, restart_seconds=took,
                stall_report=result.stall_report))
            if not restartable(result) or self.number >= self.limit:
                if restartable(result) and self.limit:
                    self.say(f"mslaunch: no restart left ({self.limit} of {self.limit} used); "
                             f"the job ends with exit status {result.exit_code}")
                return replace(result, attempts=tuple(self.attempts))
            quick = quick + 1 if self.attempts[-1].end - start < QUICK else 0
            wait = backoff(quick)
            self._next(outcome, wait)

    def _job(self):
        job = replace(self.job, attempt=self.number)
        if job.timeout is None:
            return job
        return replace(job, timeout_left=max(0.01, job.timeout
                                             - (time.monotonic() - self.began)))

    def _without(self, err: HostsFailed) -> bool:
        """Whether the job starts again (the same attempt) without hosts that could
        not be reached, or were lost, before its ranks started: a job that may be
        started again does so while slots remain; that costs no restart."""
        gone = tuple(n for n in err.failed if n not in self.left_out)
        if not self.limit or not gone or set(err.failed) - set(err.unreachable):
            return False
        self.left_out = tuple(dict.fromkeys(self.left_out + gone))
        self.say(f"mslaunch: {err}; {', '.join(gone)} left out, the start goes on on the "
                 f"hosts left")
        return True

    def _not_again(self, err: LaunchError) -> JobResult:
        """An attempt that cannot start (no host left for its ranks, a host that no
        longer answers, a stop signal during the health check): the job ends with
        the last failure (or the stop's code)."""
        if isinstance(err, Stopped):
            self.say(f"mslaunch: {err}; the job ends")
            return JobResult(exit_code=err.exit_code, ending=SIGNAL, stop_signal=err.signal,
                             attempts=tuple(self.attempts))
        if isinstance(err, TimedOut):
            self.say(f"mslaunch: {err}; exit status {TIMEOUT_EXIT}")
            return JobResult(exit_code=TIMEOUT_EXIT, ending=TIMEOUT,
                             attempts=tuple(self.attempts))
        if self.last is None:
            raise err
        self.say(f"mslaunch: the job was not started again: {err}")
        return replace(self.last, attempts=tuple(self.attempts))

    def _next(self, outcome: AttemptOutcome, wait: float) -> None:
        """What the next attempt is told, once this one failed."""
        result = outcome.result
        self.failed_at = result.failures[0][0] if result.failures else self.attempts[-1].end
        self.left_out = tuple(dict.fromkeys(self.left_out + outcome.lost))
        self.number += 1
        cause = self.attempts[-1].cause
        out = f"; left out: {', '.join(outcome.lost)} (lost)" if outcome.lost else ""
        pause = f", {wait:g} s of it a back-off (a failure soon after the start)" if wait else ""
        self.announce = (f"mslaunch: restart {self.number} of {self.limit}: the job runs "
                         f"again, ", f" s after its failure{pause}{out}")
        self.note = (f"mslaunch: restart {self.number} of {self.limit} of the job (the previous "
                     f"attempt: {cause})\n")

    def _before(self, wait: float) -> Optional[JobResult]:
        """Wait ``wait`` s before the next attempt; its end when a stop signal came
        (meanwhile, or between two attempts) or ``--timeout`` is over."""
        deadline = time.monotonic() + wait
        if self.job.timeout is not None:     # (a back-off is cut short by --timeout)
            deadline = min(deadline, self.began + self.job.timeout)
        if wait and self.job.verbose:
            self.say(f"mslaunch: a back-off of {wait:g} s before restart {self.number}")
        while True:
            sig = self.stopped()
            if sig is not None:
                what = f"during the back-off before restart {self.number}" \
                    if wait and self.number else "between two attempts"
                return self._not_again(Stopped(f"stopped by {signal_name(sig)} {what}", sig))
            left = deadline - time.monotonic()
            if left <= 0:
                break
            time.sleep(min(left, 0.05))
        timeout = self.job.timeout
        if timeout is not None and self.last is not None \
                and time.monotonic() - self.began >= timeout:
            self.say(f"mslaunch: job timed out after {timeout:g} s ({self.job.timeout_source}) "
                     f"before restart {self.number}; exit status {TIMEOUT_EXIT}")
            return JobResult(exit_code=TIMEOUT_EXIT, ending=TIMEOUT,
                             attempts=tuple(self.attempts))
        return None
