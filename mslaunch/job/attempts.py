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

    from ..spec import JobResult

from ..errors import LaunchError
from ..spec import Attempt, replace

#: An attempt that fails within this many seconds of its start is a quick one.
QUICK = 10.0
#: The longest back-off between two attempts, in seconds.
MAX_BACKOFF = 8.0
#: How a job may end for it to be started again (:attr:`JobResult.ending`).
RESTARTED_ENDINGS = ("failure", "stall")


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
    return result.exit_code != 0 and ends_for_restart(result.ending, result.stop_signal)


def ends_for_restart(ending: Optional[str], stop_signal: Optional[int]) -> bool:
    """:func:`restartable` as a supervisor can tell it before its result is made
    (an ending of these kinds is a failure, whose code is not 0)."""
    return ending in RESTARTED_ENDINGS and stop_signal is None


def cause_of(result: JobResult) -> str:
    """The failure that ended an attempt, in one line (its console message's first)."""
    line = result.message.split("\n", 1)[0]
    if line.startswith("mslaunch: "):
        line = line[len("mslaunch: "):]
    if not line and result.ending == "stall":
        line = "the job stalled (--stall-exit)"
    return line or f"the job ended with exit status {result.exit_code}"


class AttemptOutcome:
    """What :func:`run_attempts` learns from one attempt's runner."""

    def __init__(self, result: JobResult, hosts: Tuple[str, ...] = (),
                 lost: Tuple[str, ...] = ()) -> None:
        self.result = result
        self.hosts = hosts            # the hosts it ran on
        self.lost = lost              # hosts lost during it


def run_attempts(job, run_one: Callable[..., AttemptOutcome],
                 say: Callable[[str], None],
                 sleep: Callable[[float], None] = time.sleep,
                 check: Optional[Callable[[Tuple[str, ...]], Tuple[str, ...]]] = None
                 ) -> JobResult:
    """Run ``job`` (a :class:`~mslaunch.spec.JobSpec` with ``max_job_restarts``)
    until an attempt succeeds, cannot be started again, or no restart is left.

    ``run_one(job, left_out, note, launched)`` runs one attempt of ``job`` (whose
    ``attempt`` says which) without the hosts ``left_out``; ``note`` is the line
    its ranks' output files get before what the attempt appends to them, and
    ``launched()`` is called once its ranks have all been started.  It returns
    an :class:`AttemptOutcome`.  ``say`` prints one of mslaunch's lines.
    ``check(left_out)``, the user's health check (``--health-check``), runs before
    every attempt and names the hosts where it failed: they are left out from
    then on.
    """
    limit = job.max_job_restarts
    attempts: List[Attempt] = []
    left_out: Tuple[str, ...] = ()
    quick, number = 0, 0
    last: Optional[JobResult] = None
    failed_at: Optional[float] = None
    launched: List[float] = []
    note = ""
    announce: Tuple[str, str] = ("", "")

    def on_launched() -> None:
        launched.append(time.time())
        if announce[0]:
            took = launched[-1] - failed_at if failed_at is not None else 0.0
            say(f"{announce[0]}{max(0.0, took):.2f}{announce[1]}")

    while True:
        start = time.time()
        launched.clear()
        try:
            if check is not None:
                left_out = tuple(dict.fromkeys(left_out + check(left_out)))
            outcome = run_one(replace(job, attempt=number), left_out, note, on_launched)
        except LaunchError as err:
            if last is None:
                raise
            # A later attempt that cannot start (no host left for its ranks, a
            # host that no longer answers): the job ends with the last failure.
            say(f"mslaunch: the job was not started again: {err}")
            return replace(last, attempts=tuple(attempts))
        last = result = outcome.result
        took = launched[0] - failed_at if launched and failed_at is not None else None
        attempts.append(Attempt(
            number=number, start=start, end=time.time(), exit_code=result.exit_code,
            cause=cause_of(result) if result.exit_code else "", hosts=outcome.hosts,
            lost=outcome.lost, left_out=left_out, restart_seconds=took,
            stall_report=result.stall_report))
        if not restartable(result) or number >= limit:
            if restartable(result) and limit:
                say(f"mslaunch: no restart left ({limit} of {limit} used); the job ends with "
                    f"exit status {result.exit_code}")
            return replace(result, attempts=tuple(attempts))
        quick = quick + 1 if attempts[-1].end - start < QUICK else 0
        wait = backoff(quick)
        failed_at = result.failures[0][0] if result.failures else attempts[-1].end
        left_out = tuple(dict.fromkeys(left_out + outcome.lost))
        number += 1
        cause = attempts[-1].cause
        gone = f"; left out: {', '.join(outcome.lost)} (lost)" if outcome.lost else ""
        pause = f", {wait:g} s of it a back-off (a failure soon after the start)" if wait else ""
        announce = (f"mslaunch: restart {number} of {limit}: the job runs again, ",
                    f" s after its failure{pause}{gone}")
        note = f"mslaunch: restart {number} of {limit} of the job (the previous attempt: {cause})\n"
        if wait:
            sleep(wait)
