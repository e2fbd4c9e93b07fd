"""Hangs reported without a timeout: ``--stall-report S``, and ``--timeout``'s stacks.

:class:`StallWatch` looks at the job every few seconds.  While any rank
writes output, nothing else happens: a job that prints costs a timer.  Once
no rank has written for a sampling interval, it reads every rank's stacks
(see :func:`~mslaunch.inspect.control.gather`: a Python rank's main thread dumps its
own frames, native frames are read with a pause of milliseconds).  When no rank has written and no
rank's stack has changed between samples for ``S`` seconds, the merged
report is printed, from one look at every thread (the job goes on); it
is printed again only when the
picture changes (another rank set, another frame), and the watch starts
over once a rank writes again.  The samples see a Python rank's main
thread's frames and every thread's CPU: a rank whose main thread waits
while another thread moves on without output, CPU or data counts as
stalled.  With ``--stall-exit`` the job is ended
there instead, with exit status :data:`STALL_EXIT`.

A rank computing moves between samples; one validating or checkpointing
writes, or its stack moves, while the others wait in a collective.  A hot
loop on one line shows the same frames at every sample, so a rank that is
runnable, or used a quarter of a CPU since the last sample, outside a
communication call counts as working (a rank spinning inside MPI waits).
A rank that moved data since the last sample (its TCP sockets' byte
counters, its reads and writes: a long collective over a slow link) works,
and one blocked reading the standard input mslaunch forwards to it waits
for a person (see :mod:`mslaunch.machine.activity`).  What still looks
stalled is one call longer than ``S`` that moves nothing mslaunch can count
(a collective over shared memory or RDMA whose peers never come, which is
a stall; a huge read of a file system that ``/proc/PID/io`` does not see):
it costs a report, and the job goes on.  The report comes within ``S``, one
sampling interval and one look at every thread after the last output.

:func:`timeout_stacks` is ``--timeout`` with ``--get-stack-traces``: the
same merged, labelled report, read without stopping a rank, before the
job is ended.
"""

from __future__ import annotations

import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Optional, Tuple

    from .stacktree import RankStacks
    from ..seams import LookedAt

from ..core.errors import STALL_EXIT
#: A rank using more of a CPU than this between samples, outside a
#: communication call (:data:`COMMUNICATION`), computes.
BUSY_SHARE = 0.25
#: The kernel's state letter of a process on a CPU or waiting for one (``/proc/PID/stat``).
RUNNABLE = "R"
COMMUNICATION = ("MPI_", "PMPI_", "nccl", "shmem_", "gloo::")
#: Seconds each rank has to answer one sample.
SAMPLE_TIMEOUT = 10.0


def interval(seconds: float) -> float:
    """Seconds between samples: a quarter of ``S``, from 0.5 s to a minute."""
    return min(60.0, max(0.5, seconds / 4))


class StallWatch:
    """See the module docstring; ``view`` is what it sees of the job."""

    def __init__(self, view: LookedAt, seconds: float, end_job: bool = False) -> None:
        self.view = view
        self.seconds = seconds
        self.end_job = end_job
        self.every = interval(seconds)
        self.written = -1
        self.quiet_since = time.monotonic()
        self.signature: Optional[Tuple[Any, ...]] = None
        self.same_since = 0.0
        self.reported: Optional[Tuple[Any, ...]] = None
        self.report = ""            # the last report's text, as printed
        self.sampling = False
        self.cpu: Dict[int, Tuple[float, float]] = {}     # rank -> (when, CPU seconds)
        self.moved: Dict[int, int] = {}                   # rank -> its data count
        self._tick()       # made one interval into the job (see Supervisor._watch_stall)

    def _tick(self) -> None:
        view = self.view
        if view.ending is not None:
            return
        now = time.monotonic()
        # A sample falls due when S have passed since the output stopped, not at
        # the next interval: the report comes within S and one interval of it.
        due = self.quiet_since + self.seconds - now
        view.loop.call_later(due if 0.05 < due < self.every else self.every, self._tick)
        written = self._written()
        if written != self.written:
            self.written, self.quiet_since = written, now
            self.signature = None            # the picture moved: start over
            self.reported = None
            return
        if self.sampling or now - self.quiet_since < self.every:
            return
        if not any(r.pid and not r.ended for r in view.ranks):
            return
        self.sampling = True
        from .control import gather
        # (each node of a job of one command per node watches its own ranks)
        # Samples read each Python rank's main thread alone: a dump of every
        # thread, taken every few seconds of a job that runs for days, would
        # crash a rank whose threads run Python (see machine.pydump).
        gather(view, min(SAMPLE_TIMEOUT, self.seconds), view.dumps,
               lambda stacks: self._sampled(stacks, written), here_only=True, main_only=True)

    def _written(self) -> int:
        """Bytes the ranks have written so far, all streams."""
        return sum(o.written for r in self.view.ranks for o in r.outputs)

    def _computing(self, stacks: List[RankStacks], now: float) -> bool:
        """Whether a rank used most of a CPU since the last sample outside a
        communication call: it computes (a hot loop on one line looks the same
        from one sample to the next), so the job is not stalled.  A rank that
        spins inside MPI waits, however busy."""
        from .stacktree import in_call
        busy = False
        for r in stacks:
            before = self.cpu.get(r.rank)
            self.cpu[r.rank] = (now, r.cpu)
            share = 0.0
            if before is not None and r.cpu >= 0 and before[1] >= 0 and now > before[0]:
                share = (r.cpu - before[1]) / (now - before[0])
            # Runnable (on a loaded machine a computing rank may get little CPU),
            # or using the CPU, and not waiting in a communication call.
            if (r.state == RUNNABLE or share > BUSY_SHARE) and not in_call(r, COMMUNICATION):
                busy = True
            # Moving data (a long collective over a slow link), or waiting for the
            # input mslaunch forwards to it: not stalled (see machine.activity).
            moved = self.moved.get(r.rank, -1)
            self.moved[r.rank] = r.moved
            if r.stdin or 0 <= moved < r.moved:
                busy = True
        return busy

    def _sampled(self, stacks: List[RankStacks], written: int) -> None:
        from .stacktree import merge, signature
        self.sampling = False
        view = self.view
        now = time.monotonic()
        if view.ending is not None or written != self._written():
            return
        report = merge(stacks)
        sig = signature(report)
        busy = self._computing(stacks, now)
        if sig != self.signature or busy:
            self.signature, self.same_since = sig, now
            return
        quiet = now - self.quiet_since
        if now - self.same_since + self.every < self.seconds or quiet < self.seconds:
            return
        if sig == self.reported:
            return
        self.reported = sig
        # The report shows every thread: one dump of all threads per report, of
        # a job whose ranks were found waiting, risks little; one at every
        # sample, for days, would in time crash a rank whose threads run Python.
        self.sampling = True
        from .control import gather
        gather(view, min(SAMPLE_TIMEOUT, self.seconds), view.dumps,
               lambda stacks: self._report(stacks, quiet, written), here_only=True)

    def _report(self, stacks: List[RankStacks], quiet: float, written: int) -> None:
        from .control import report_text
        self.sampling = False
        view = self.view
        if view.ending is not None:
            return
        if written != self._written():
            self.reported = None             # it wrote meanwhile: not stalled after all
            return
        _, text = report_text(stacks, view, f"stalled for {quiet:.0f} s or more (no output, no "
                                           f"stack changed, no data moved; --stall-report "
                                           f"{self.seconds:g}): stacks")
        view.console.message(text.rstrip("\n"))
        self.report = text
        if self.end_job:
            view.console.message(f"mslaunch: ending the stalled job (--stall-exit); "
                                f"exit status {STALL_EXIT}")
            view.end_stalled()
        elif not view.job.quiet:
            view.console.message("mslaunch: the job goes on; this report comes again if the "
                                "picture changes (end it with Ctrl-C, or run with --stall-exit)")


def timeout_stacks(view: LookedAt, then: Callable[[], None]) -> None:
    """``--get-stack-traces`` on ``--timeout``: print the merged report, then ``then()``."""
    from .control import gather, report_text

    def done(stacks: List[RankStacks]) -> None:
        _, text = report_text(stacks, view, "stacks at the timeout")
        view.console.message(text.rstrip("\n"))
        then()
    view.console.message("mslaunch: reading every rank's stacks (the ranks keep running)...")
    gather(view, SAMPLE_TIMEOUT, view.dumps, done)
