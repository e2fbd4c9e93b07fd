"""Supervision of a running job: the policy.

The :class:`Supervisor` starts every rank of a :class:`Plan` through
:class:`~mslaunch.run.local.LocalRanks` and runs one event loop over their
output, their exits, the PMI sockets, mslaunch's terminal and a self-pipe
for signals.  The first rank that fails (non-zero exit, death by a signal,
``MPI_Abort``, leaving MPI without finalizing, or exiting while its peers
wait for it in MPI) is the root cause: the other ranks' process groups get
SIGCONT and SIGTERM, and SIGKILL after the grace period.  The same happens
on ``--timeout``, on a stop signal, and when output cannot be written (a
full disk, a rank file over ``ulimit -f``).  The job is over when every
rank has been reaped, every output stream has ended and mslaunch's
terminal has taken everything -- or, once the job is being stopped, when
the grace period has passed with the terminal's reader still not reading.
"""

from __future__ import annotations

import os
import signal
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Optional

    from ..pmi.server import PMIServer
    from .output import Terminal

from ..plan import TIMEOUT_EXIT
from ..spec import JobResult, JobSpec, Plan, RankResult, RankSpec
from .guard import Watchdog
from .local import LocalRanks
from .loop import Loop, Timer
from .output import Console, RankOutput, line_prefix
from .spawn import seal_inherited_fds, signal_name

_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
_STOPPING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class _Rank:
    """Mutable bookkeeping of one rank."""

    __slots__ = ("spec", "pid", "outputs", "code", "signal", "reason", "ended", "pmi_lost")

    def __init__(self, spec: RankSpec) -> None:
        self.spec = spec
        self.pid = 0
        self.outputs: List[RankOutput] = []
        self.code: Optional[int] = None
        self.signal: Optional[int] = None
        self.reason = ""
        self.ended = False
        self.pmi_lost = False

    @property
    def failed(self) -> bool:
        return self.signal is not None or bool(self.code) or bool(self.reason)

    @property
    def tail(self) -> bytes:
        return self.outputs[-1].tail if self.outputs else b""

    def result(self) -> RankResult:
        return RankResult(rank=self.spec.rank, host=self.spec.host.name, pid=self.pid,
                          returncode=self.code, signal=self.signal, reason=self.reason,
                          stderr_tail=self.tail)


class Supervisor:
    """Runs one job to its end and reports a :class:`JobResult`."""

    def __init__(self, job: JobSpec, plan: Plan, console: Optional[Console] = None) -> None:
        self.job = job
        self.plan = plan
        self.console = console or Console()
        self.loop = Loop()
        self.ranks = [_Rank(spec) for spec in plan.ranks]
        self.root: Optional[_Rank] = None
        self.root_code = 0
        self.ending: Optional[str] = None     # failure | timeout | signal | output
        self.stop_signal: Optional[int] = None
        self.output_error = ""
        self.undelivered = 0
        self.killing: Optional[Timer] = None
        self._give_up: Optional[Timer] = None
        self.pmi: Optional[PMIServer] = None
        self.watchdog: Optional[Watchdog] = None
        self.local: Optional[LocalRanks] = None
        self._old_handlers: Dict[int, object] = {}

    # -- start ------------------------------------------------------------
    def run(self) -> JobResult:
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        old_wakeup = signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        for sig in _FORWARDED:
            self._old_handlers[sig] = signal.signal(sig, _noop)
        self.loop.add_reader(wake_r, lambda: self._on_signals(wake_r))
        self.started = time.monotonic()
        seal_inherited_fds()
        self.console.attach(self.loop, self._terminal_failed)
        try:
            self.watchdog = Watchdog(self.plan.kvsname, self.job.grace)
            if self.job.verbose:
                self.console.message(f"mslaunch: orphan guard: {self.watchdog.mechanism}")
            self._start_all()
            if self.job.timeout is not None:
                self.loop.call_later(self.job.timeout, self._on_timeout)
            self.loop.run_until(self._finished)
        finally:
            self._cleanup()
            signal.set_wakeup_fd(old_wakeup)
            for sig, handler in self._old_handlers.items():
                signal.signal(sig, handler)  # type: ignore[arg-type]
            os.close(wake_r)
            os.close(wake_w)
            self.console.attach(None)
            self.loop.close()
        return self._result()

    def _start_all(self) -> None:
        job, plan = self.job, self.plan
        pmi_env = None
        if job.mpi == "pmi":
            from ..pmi.server import PMIServer
            self.pmi = PMIServer(self.loop, kvsname=plan.kvsname, size=len(plan.ranks),
                                 process_mapping=plan.process_mapping,
                                 universe_size=plan.universe_size,
                                 appnums=[r.app for r in plan.ranks], listener=self)
            assert self.watchdog is not None
            self.watchdog.add_kvsname(plan.kvsname)
            if job.pmi_port:
                self.pmi.listen_tcp()
                pmi_env = self.pmi.tcp_env
            else:
                pmi = self.pmi
                pmi_env = lambda rank: {"PMI_FD": str(pmi.child_fd(rank))}  # noqa: E731
        _raise_fd_limit(8 * len(self.ranks) + 64)
        self.local = LocalRanks(self.loop, plan.ranks, self, sinks=self._sinks,
                                guard=self.watchdog,  # type: ignore[arg-type]
                                grace=job.grace, merge_stderr=job.output.merge_stderr,
                                pmi=self.pmi if not job.pmi_port else None, pmi_env=pmi_env)
        self.local.start()

    def _open_log(self, path: Optional[str]) -> Optional[int]:
        if path is None:
            return None
        from ..errors import LaunchError
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        except OSError as err:
            raise LaunchError(f"cannot create output file: {err.filename}: {err.strerror}") \
                from None

    def _sinks(self, spec: RankSpec):
        """The output sinks of one rank: stdout (merged or not) and stderr."""
        out, rank = self.job.output, self.ranks[spec.rank]
        terminal = self.console if out.copy_to_terminal else None
        opts = dict(tag=out.tag, timestamp=out.timestamp, rank_prefix=out.rank_prefix)
        merged = out.merge_stderr
        for stream, name, path in ((1, "stdout", spec.stdout_path), (2, "stderr", spec.stderr_path)):
            if stream == 2 and merged:
                break
            rank.outputs.append(RankOutput(
                terminal=terminal.terminal(stream) if terminal else None,
                file_fd=self._open_log(path), file_name=path or "",
                prefix=line_prefix(spec.rank, name, **opts),  # type: ignore[arg-type]
                keep_tail=(stream == 2 or merged), on_error=self._output_failed))
        return rank.outputs[0], (None if merged else rank.outputs[1])

    # -- rank events --------------------------------------------------------
    def rank_started(self, rank: int, pid: int) -> None:
        r = self.ranks[rank]
        r.pid = pid
        if self.job.report_bindings:
            self.console.message(_binding_line(r.spec, pid))
        if self.job.verbose:
            self.console.message(f"mslaunch: started rank {rank} (pid {pid}) "
                                 f"on {r.spec.host.name}: {' '.join(r.spec.argv)}")

    def rank_exited(self, rank: int, code: Optional[int], sig: Optional[int]) -> None:
        r = self.ranks[rank]
        r.code, r.signal, r.ended = code, sig, True
        if sig is not None or code:
            self._fail(r, "", 128 + sig if sig is not None else code or 1,
                       abort=not self.job.keep_going)
        elif r.pmi_lost:
            self._check_lost(r)
        else:
            self._check_left_mpi(r)

    def _on_signals(self, fd: int) -> None:
        try:
            data = os.read(fd, 512)
        except BlockingIOError:
            return
        for sig in data:
            self._on_signal(sig)

    def _live(self) -> List[_Rank]:
        return [r for r in self.ranks if r.pid and not r.ended]

    def _on_signal(self, sig: int) -> None:
        if sig == signal.SIGINT and self.stop_signal is not None:
            if not self.job.quiet:
                self.console.message("mslaunch: second SIGINT: killing all ranks")
            self._signal_all(signal.SIGKILL)
            self._give_up_output()
            return
        if sig in _STOPPING:
            live = self._live()
            if self.stop_signal is None:
                self.stop_signal = int(sig)
                if not self.job.quiet and sig == signal.SIGINT and live:
                    self.console.message(f"mslaunch: forwarding SIGINT to {len(live)} rank(s); "
                                         f"press Ctrl-C again to kill them")
            if self.ending is None:
                self.ending = "signal"
            self._signal_all(sig)
            self._arm_kill()
            if not live:
                self._give_up_output()
        else:
            self._signal_all(sig)

    def _on_timeout(self) -> None:
        if self._finished() or self.ending is not None:
            return
        self.ending = "timeout"
        live = len(self._live())
        self.console.message(f"mslaunch: job timed out after {self.job.timeout:g} s "
                             f"(--timeout); terminating {live} rank(s); exit status "
                             f"{TIMEOUT_EXIT}")
        self._terminate()

    # -- output errors -------------------------------------------------------
    def _terminal_failed(self, terminal: Terminal) -> None:
        self._output_failed(f"cannot write to mslaunch's {terminal.name}: {terminal.error}")

    def _output_failed(self, message: str) -> None:
        if self.output_error:
            return
        self.output_error = message
        self.console.message(f"mslaunch: error: {message}; stopping the job")
        if self.ending is None:
            self.ending = "output"
            self._terminate()

    # -- PMI listener ---------------------------------------------------------
    def pmi_abort(self, rank: int, code: int, message: str) -> None:
        r = self.ranks[rank]
        code &= 0xFF
        # An abort must never look like success: a code that is 0 modulo 256
        # (MPI_Abort(comm, 0) or 256) ends the job with status 1.
        shown = f"exit code {code}" if code else "exit code 0 (exit status 1)"
        self._fail(r, f"called MPI_Abort with {shown}", code or 1, abort=True)

    def pmi_lost(self, rank: int) -> None:
        r = self.ranks[rank]
        r.pmi_lost = True
        if r.ended:
            self._check_lost(r)
        else:
            # The socket closes while the process exits, a moment before its
            # exit status can be read: let the exit tell a crash from a rank
            # that left MPI without finalizing.
            self.loop.call_later(0.2, lambda: self._check_lost(r))

    def _check_lost(self, r: _Rank) -> None:
        if r.signal is not None or r.code:
            return  # a failure in its own right, already handled
        self._fail(r, "exited without MPI_Finalize (its PMI connection closed early)"
                   if r.ended else "closed its PMI connection without MPI_Finalize",
                   1, abort=True)

    def pmi_started(self, rank: int) -> None:
        # A rank that already ended without MPI can never join this one.
        for r in self.ranks:
            if r.ended and not r.failed:
                self._check_left_mpi(r)

    def _check_left_mpi(self, r: _Rank) -> None:
        """A rank that ended (status 0) without MPI while others use it: they would hang."""
        pmi = self.pmi
        rank = r.spec.rank
        if pmi is None or not pmi.started or rank in pmi.started or r.failed:
            return
        others = sorted(pmi.started)
        who = ", ".join(map(str, others[:8])) + (" ..." if len(others) > 8 else "")
        self._fail(r, f"exited with code 0 without joining MPI (it never initialized PMI) "
                      f"while rank(s) {who} did; they would wait for it forever",
                   1, abort=True)

    def pmi_log(self, message: str) -> None:
        if not self.job.quiet:
            self.console.message(f"mslaunch: PMI: {message}")

    # -- policy -----------------------------------------------------------
    def _fail(self, rank: _Rank, reason: str, code: int, *, abort: bool) -> None:
        if reason and not rank.reason:
            rank.reason = reason
        if self.root is None and self.ending is None and (abort or self.job.keep_going):
            self.root = rank
            self.root_code = code
        if abort and self.ending is None:
            self.ending = "failure"
            self._terminate()

    def _terminate(self) -> None:
        self._signal_all(signal.SIGCONT)
        self._signal_all(signal.SIGTERM)
        self._arm_kill()

    def _signal_all(self, sig: int) -> None:
        if self.local is not None:
            self.local.signal(sig)

    def _arm_kill(self) -> None:
        if self.killing is None:
            self.killing = self.loop.call_later(self.job.grace, self._kill_all)
        if self._give_up is None:
            # A stopped job does not wait for a terminal nobody reads.
            self._give_up = self.loop.call_later(self.job.grace + 0.5, self._give_up_output)

    def _kill_all(self) -> None:
        self.killing = None
        self._signal_all(signal.SIGKILL)

    def _give_up_output(self) -> None:
        if self.console.pending:
            self.undelivered = self.console.give_up()

    def _finished(self) -> bool:
        if self.local is not None and self.local.busy:
            return False
        if not all(o.finished for r in self.ranks for o in r.outputs):
            return False
        return not self.console.pending

    # -- end --------------------------------------------------------------
    def _cleanup(self) -> None:
        if self.local is not None:
            self.local.close(self.job.grace)
        if self.pmi is not None:
            if os.environ.get("MSLAUNCH_PMI_STATS"):
                self.console.message(
                    f"mslaunch: PMI: {self.pmi.stats['total']} messages from "
                    f"{len(self.ranks)} ranks in {self.pmi.busy_seconds:.4f} s "
                    f"(job {time.monotonic() - self.started:.3f} s)")
            self.pmi.close()
            from ..pmi.shm import remove_shm_segments
            remove_shm_segments(self.plan.kvsname)
        if self.watchdog is not None:
            self.watchdog.close()
        if self.undelivered:
            self.console.message(f"mslaunch: {self.undelivered} byte(s) of rank output were "
                                 f"not delivered: the terminal was not being read when the "
                                 f"job was stopped")

    def _result(self) -> JobResult:
        results = tuple(r.result() for r in self.ranks)
        if self.root is not None:
            root = results[self.root.spec.rank]
            # A rank stopped by a broken pipe because mslaunch's own reader
            # went away (``| head``) is the shell's quiet SIGPIPE, not news.
            quiet = root.signal == signal.SIGPIPE and not self.console.is_open(1)
            return JobResult(exit_code=self.root_code, ranks=results, root_cause=root,
                             message="" if quiet else self._summary(self.root))
        if self.ending == "timeout":
            return JobResult(exit_code=TIMEOUT_EXIT, ranks=results)
        if self.ending == "signal" and self.stop_signal is not None:
            return JobResult(exit_code=128 + self.stop_signal, ranks=results,
                             message=f"mslaunch: stopped by {signal_name(self.stop_signal)}")
        if self.ending == "output":
            return JobResult(exit_code=1, ranks=results)
        return JobResult(exit_code=0, ranks=results)

    def _summary(self, rank: _Rank) -> str:
        spec = rank.spec
        who = f"rank {spec.rank} (pid {rank.pid or '?'} on {spec.host.name})"
        if rank.reason:
            what = rank.reason
        elif rank.signal is not None:
            what = f"was killed by signal {rank.signal} ({signal_name(rank.signal)})"
        else:
            what = f"exited with code {rank.code}"
        failed = [r for r in self.ranks if r.failed]
        if self.job.keep_going and self.ending != "failure":
            head = f"mslaunch: {len(failed)} of {len(self.ranks)} rank(s) failed; first: {who} {what}"
        else:
            others = sum(1 for r in self.ranks if r is not rank and r.pid)
            head = f"mslaunch: {who} {what}; terminated the job" + \
                (f" ({others} other rank(s))" if others else "")
        tail = rank.tail
        lines = tail.decode("utf-8", "replace").rstrip("\n").split("\n")[-10:]
        if tail.strip():
            stream = "stdout+stderr" if self.job.output.merge_stderr else "stderr"
            head += f"\nmslaunch: last lines of rank {spec.rank}'s {stream}:\n" + \
                "\n".join("    " + line for line in lines)
        return head


def _raise_fd_limit(needed: int) -> None:
    """Lift the soft open-file limit towards ``needed`` (each rank holds ~5 fds)."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            pass


def _noop(signum, frame) -> None:  # the wakeup fd carries the signal number
    pass


def _binding_line(spec: RankSpec, pid: int) -> str:
    where = f"[{spec.host.name}:{pid}] MCW rank {spec.rank}"
    if not spec.cpus:
        return f"{where} is not bound (or bound to all available processors)"
    ncpu = os.cpu_count() or 1
    mask = "/".join("B" if c in spec.cpus else "." for c in range(ncpu))
    cpus = ",".join(str(c) for c in spec.cpus)
    return f"{where} bound to cpu {cpus}: [{mask}]"
