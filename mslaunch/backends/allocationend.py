"""Whether the allocation a job runs in was ended by its workload manager.

Slurm ends a whole allocation on a failed node (unless it was made with
``--no-kill``), at its time limit, on a cancel or a preemption: every step,
and salloc's or sbatch's own command, mslaunch, by a signal.  The job sees
only lost hosts and a stop signal, and no restart can help; so the first lost
host and the stop signal each ask ``scontrol`` how the allocation stands,
without waiting: the answer is read on the job's loop, and said once, the
moment it tells of an end.  slurmctld may take seconds to answer while it
ends the job's steps, and the workload manager kills mslaunch some seconds
after its signal (Slurm's ``KillWait``), so what is still unanswered when the
job is over gets a short time at most, once its report is written.
"""

from __future__ import annotations

import os
import time

from ..core import signal
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, List, Mapping, Optional

    from ..machine.guard import Watchdog
    from ..machine.loop import Loop
    from ..machine.spawn import Helper

#: What a question still unanswered at the job's end is given, in seconds.
LAST_WAIT = 2.0


class AllocationEnd:
    """The questions one run asks of its allocation, and the one line said."""

    def __init__(self, query: List[str], job: str,
                 ended_because: Callable[[str, str], str]) -> None:
        self._query = query
        self._job = job
        self._ended_because = ended_because
        self._proc: Optional[Helper] = None
        self._loop: Optional[Loop] = None
        self._read = bytearray()
        self._lost = False           # a lost host had a question asked
        self._stop_asked = False     # a stop had a question asked
        self._none = False           # no scontrol to ask
        #: Asked again while a question was out: None, "lost" or "stop".
        self._again: Optional[str] = None
        self.said = ""               # the line said, once said
        #: Where the line goes (None: straight to stderr, once the job's
        #: console is closed).
        self.say: Optional[Callable[[str], None]] = None

    def ask(self, loop: Optional[Loop], stop: bool = False) -> None:
        """How does the allocation stand?  The answer is read on ``loop``.  Each
        lost host asks (the first are often lost before the workload manager
        knows); a ``stop`` (the job stopped by a signal, or for want of hosts)
        asks once.  One question at a time: what comes while one is out is
        asked once it is answered, if it told of no end."""
        if self.said or self._none or (stop and self._stop_asked):
            return
        if self._proc is not None:
            if stop or self._again is None:
                self._again = "stop" if stop else "lost"
            self._follow(loop)
            return
        from ..machine.spawn import Helper
        if stop:
            self._stop_asked = True
        else:
            self._lost = True
        self._again = None
        self._read.clear()
        try:
            self._proc = Helper(self._query, None)
        except OSError:              # no scontrol here: nothing to say
            self._none = True
            return
        os.set_blocking(self._proc.stdout.fileno(), False)
        self._loop = None
        self._follow(loop)

    def _follow(self, loop: Optional[Loop]) -> None:
        """Read the answer on ``loop`` (an attempt's loop ends; the next is another)."""
        if loop is None or loop is self._loop or self._proc is None:
            return
        self._loop = loop
        loop.add_reader(self._proc.stdout.fileno(), self._readable)

    def _readable(self) -> None:
        if self._take():
            self._answered()

    def _take(self) -> bool:
        """Read what the answer has; whether it is whole (its end of file)."""
        assert self._proc is not None
        try:
            data = os.read(self._proc.stdout.fileno(), 65536)
        except BlockingIOError:
            return False
        except OSError:
            data = b""
        if data and len(self._read) < 65536:
            self._read += data
            return False
        return not data

    def _answered(self) -> None:
        proc, self._proc = self._proc, None
        assert proc is not None
        loop, self._loop = self._loop, None
        if loop is not None:
            loop.forget(proc.stdout.fileno())
        proc.stdout.close()
        from ..machine.spawn import wait_in_background
        wait_in_background(proc.pid)
        said = self._ended_because(self._job, self._read.decode("utf-8", "replace"))
        if said:
            self.said = said
            (self.say or _to_stderr)(f"mslaunch: {said}")
        elif self._again is not None:
            self.ask(loop, stop=self._again == "stop")

    def outlive(self, guard: Watchdog) -> None:
        """The job's guard is about to end what is left of the job: a question
        still out is not the job's, and leaves with the launcher."""
        if self._proc is not None:
            guard.release(self._proc.pid)

    def finish(self, stopped: bool) -> None:
        """The job is over (its report written): what is still unanswered gets
        :data:`LAST_WAIT` seconds at most.  A job that was ``stopped`` (by a
        signal, or for want of hosts) or lost hosts, and whose stop has not
        asked yet, asks now: the signal may have come between two attempts,
        and a job whose hosts the workload manager took may end before it is
        signalled, asked only while the manager still told of no end."""
        from ..machine.loop import wait_fd
        self._loop = None            # (the job's loops are closed)
        if stopped or self._lost:
            self.ask(None, stop=True)
        deadline = time.monotonic() + LAST_WAIT
        try:
            while self._proc is not None and not self.said:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                wait_fd(self._proc.stdout.fileno(), False, left)
                if self._take():
                    self._answered()
        finally:
            if self._proc is not None:
                self._give_up()

    def _give_up(self) -> None:
        proc, self._proc = self._proc, None
        assert proc is not None
        try:
            os.kill(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.stdout.close()
        from ..machine.spawn import wait_in_background
        wait_in_background(proc.pid)


def _to_stderr(line: str) -> None:
    try:
        os.write(2, line.encode("utf-8", "replace") + b"\n")
    except OSError:
        pass


def allocation_end(environ: Mapping[str, str]) -> Optional[AllocationEnd]:
    """What asks how the allocation this runs in stands; None outside one (only
    Slurm's is asked)."""
    if not environ.get("SLURM_JOB_ID"):
        return None
    from ..hosts.allocations.slurm import ended_because, job_query
    query = job_query(environ)
    if query is None:
        return None
    return AllocationEnd(query, query[-1], ended_because)
