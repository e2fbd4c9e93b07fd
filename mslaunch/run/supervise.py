"""Supervision of a running job: exits, abort policy, signals and timeouts.

The :class:`Supervisor` starts every rank of a :class:`Plan`, then runs one
event loop over the ranks' output pipes, their pidfds, the PMI sockets and a
self-pipe for signals.  The first rank that fails (non-zero exit, death by a
signal, ``MPI_Abort``, or a PMI connection closed before finalize) is the
root cause: the other ranks' process groups get SIGCONT and SIGTERM, and
SIGKILL after the grace period.  The job is over when every rank has been
reaped and every output pipe has reached end-of-file.
"""

from __future__ import annotations

import os
import signal
import time
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Optional

    from ..pmi.server import PMIServer

from ..errors import LaunchError
from ..plan import TIMEOUT_EXIT
from ..spec import JobResult, JobSpec, Plan, RankResult, RankSpec
from .guard import Watchdog, marked_pids
from .loop import Loop, Timer
from .output import Console, RankStream, StdinFanout, line_prefix
from .spawn import LocalProcess, os_error_reason, seal_inherited_fds, signal_name

_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
_STOPPING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class _Rank:
    """Mutable bookkeeping of one running rank."""

    __slots__ = ("spec", "proc", "streams", "code", "signal", "reason", "ended",
                 "stderr", "pmi_lost")

    def __init__(self, spec: RankSpec) -> None:
        self.spec = spec
        self.proc: Optional[LocalProcess] = None
        self.streams: List[RankStream] = []
        self.code: Optional[int] = None
        self.signal: Optional[int] = None
        self.reason = ""
        self.ended = False
        self.stderr: Optional[RankStream] = None
        self.pmi_lost = False

    def result(self) -> RankResult:
        tail = self.stderr.tail if self.stderr is not None else b""
        return RankResult(rank=self.spec.rank, host=self.spec.host.name,
                          pid=self.proc.pid if self.proc else 0, returncode=self.code,
                          signal=self.signal, reason=self.reason, stderr_tail=tail)


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
        self.timed_out = False
        self.stop_signal: Optional[int] = None  # the first stop signal received
        self.killing: Optional[Timer] = None
        self.terminating = False
        self.pmi: Optional[PMIServer] = None
        self.stdin_fanout: Optional[StdinFanout] = None
        self.watchdog: Optional[Watchdog] = None
        self._sweep: Optional[Timer] = None
        self._flush_timer: Optional[Timer] = None
        self._stdin_is_tty = os.isatty(0)
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
        try:
            self.watchdog = Watchdog(self.plan.kvsname, self.job.grace)
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
            self.loop.close()
        return self._result()

    def _start_all(self) -> None:
        job, plan = self.job, self.plan
        if job.mpi == "pmi":
            from ..pmi.server import PMIServer
            self.pmi = PMIServer(self.loop, kvsname=plan.kvsname, size=len(plan.ranks),
                                 process_mapping=plan.process_mapping,
                                 universe_size=plan.universe_size,
                                 appnums=[r.app for r in plan.ranks], listener=self)
            if job.pmi_port:
                self.pmi.listen_tcp()
        stdin_pipes: Dict[int, int] = {}
        _raise_fd_limit(8 * len(self.ranks) + 64)
        try:
            for rank in self.ranks:
                try:
                    self._start(rank, stdin_pipes)
                except OSError as err:
                    raise LaunchError(f"cannot start rank {rank.spec.rank}: "
                                      f"{os_error_reason(err)}") from None
        finally:
            if self.pmi is not None:
                self.pmi.release_child_fds()
        assert self.watchdog is not None
        self.watchdog.flush()
        if stdin_pipes:
            self.stdin_fanout = StdinFanout(self.loop, 0, stdin_pipes)

    def _open_log(self, path: Optional[str]) -> Optional[int]:
        if path is None:
            return None
        os.makedirs(os.path.dirname(path), exist_ok=True)
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)

    def _start(self, rank: _Rank, stdin_pipes: Dict[int, int]) -> None:
        spec, out = rank.spec, self.job.output
        env = dict(spec.env)
        if self.pmi is not None:
            if self.job.pmi_port:
                env.update(self.pmi.tcp_env(spec.rank))
            else:
                env["PMI_FD"] = str(self.pmi.child_fd(spec.rank))
        try:
            files = (self._open_log(spec.stdout_path), self._open_log(spec.stderr_path))
        except OSError as err:
            raise LaunchError(f"cannot create output file: {err.filename}: {err.strerror}") \
                from None
        out_r, out_w = os.pipe()
        err_r, err_w = (None, out_w) if out.merge_stderr else os.pipe()
        stdin_w = None
        how = spec.stdin
        if how == "inherit" and self._stdin_is_tty:
            how = "pipe"     # a background group reading the terminal would be stopped
        if how == "inherit":
            stdin = 0
        elif how == "pipe":
            stdin, stdin_w = os.pipe()
        else:
            stdin = devnull_fd()
        try:
            rank.proc = LocalProcess(spec, env, stdin=stdin, stdout=out_w, stderr=err_w)
        except LaunchError:
            for fd in (out_r, err_r, stdin_w) + files:
                if fd is not None:
                    os.close(fd)
            raise
        finally:
            # The child has its copies; keep only our ends.  Its PMI socket end
            # must go now: every inheritable descriptor reaches the next rank.
            if self.pmi is not None:
                self.pmi.release_child_fds(spec.rank)
            os.close(out_w)
            if err_r is not None:
                os.close(err_w)
            if how == "pipe":
                os.close(stdin)
        if stdin_w is not None:
            stdin_pipes[spec.rank] = stdin_w
        assert self.watchdog is not None
        self.watchdog.add(rank.proc.pgid)
        console = self.console if out.copy_to_terminal else None
        opts = dict(tag=out.tag, timestamp=out.timestamp, rank_prefix=out.rank_prefix)
        rank.streams.append(RankStream(
            self.loop, out_r, stream=1, console=console, file_fd=files[0],
            prefix=line_prefix(spec.rank, "stdout", **opts), keep_tail=err_r is None))
        if err_r is not None:
            rank.streams.append(RankStream(
                self.loop, err_r, stream=2, console=console, file_fd=files[1],
                prefix=line_prefix(spec.rank, "stderr", **opts), keep_tail=True))
        rank.stderr = rank.streams[-1]
        self.loop.add_reader(rank.proc.pidfd, lambda: self._on_exit(rank))
        if self.job.report_bindings:
            self.console.message(_binding_line(spec, rank.proc.pid))
        if self.job.verbose:
            self.console.message(f"mslaunch: started rank {spec.rank} (pid {rank.proc.pid}) "
                                 f"on {spec.host.name}: {' '.join(spec.argv)}")

    # -- events -----------------------------------------------------------
    def _on_exit(self, rank: _Rank) -> None:
        assert rank.proc is not None
        self.loop.forget(rank.proc.pidfd)
        rank.code, rank.signal = rank.proc.reap()
        rank.ended = True
        if rank.signal is not None or rank.code:
            self._fail(rank, "", rank.signal + 128 if rank.signal else rank.code or 1,
                       abort=not self.job.keep_going)
        elif rank.pmi_lost:
            self._check_lost(rank)
        if rank.proc.group_alive():
            # Leftover children of an ended rank would become orphans.
            rank.proc.signal(signal.SIGCONT)
            rank.proc.signal(signal.SIGTERM)
            self._arm_kill()
        elif self.watchdog is not None:
            self.watchdog.remove(rank.proc.pgid)
            if self._flush_timer is None:
                self._flush_timer = self.loop.call_later(1.0, self._flush_watchdog)

    def _flush_watchdog(self) -> None:
        self._flush_timer = None
        if self.watchdog is not None:
            self.watchdog.flush()

    def _on_signals(self, fd: int) -> None:
        try:
            data = os.read(fd, 512)
        except BlockingIOError:
            return
        for sig in data:
            self._on_signal(sig)

    def _on_signal(self, sig: int) -> None:
        live = [r for r in self.ranks if r.proc is not None and not r.ended]
        if sig == signal.SIGINT and self.stop_signal is not None:
            if not self.job.quiet:
                self.console.message("mslaunch: second SIGINT: killing all ranks")
            self._signal_groups(signal.SIGKILL)
            return
        if sig in _STOPPING:
            if self.stop_signal is None:
                self.stop_signal = int(sig)
            if not self.job.quiet and sig == signal.SIGINT:
                self.console.message(f"mslaunch: forwarding SIGINT to {len(live)} rank(s); "
                                     f"press Ctrl-C again to kill them")
            self._signal_groups(sig)
            self.terminating = True
            self._arm_kill()
        else:
            self._signal_groups(sig)

    def _on_timeout(self) -> None:
        if self._finished():
            return
        self.timed_out = True
        live = sum(1 for r in self.ranks if r.proc is not None and not r.ended)
        self.console.message(f"mslaunch: job timed out after {self.job.timeout:g} s "
                             f"(--timeout); terminating {live} rank(s); exit status "
                             f"{TIMEOUT_EXIT}")
        self._terminate()

    # PMI listener ---------------------------------------------------------
    def pmi_abort(self, rank: int, code: int, message: str) -> None:
        r = self.ranks[rank]
        code &= 0xFF
        self._fail(r, f"called MPI_Abort with exit code {code}", code, abort=True)

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

    def pmi_log(self, message: str) -> None:
        if not self.job.quiet:
            self.console.message(f"mslaunch: PMI: {message}")

    # -- policy -----------------------------------------------------------
    def _fail(self, rank: _Rank, reason: str, code: int, *, abort: bool) -> None:
        if reason and not rank.reason:
            rank.reason = reason
        if self.root is None and self.stop_signal is None and not self.timed_out:
            if abort or self.job.keep_going:
                self.root = rank
                self.root_code = code
        if abort and not self.terminating:
            self._terminate()

    def _terminate(self) -> None:
        self.terminating = True
        self._signal_groups(signal.SIGCONT)
        self._signal_groups(signal.SIGTERM)
        self._arm_kill()

    def _signal_groups(self, sig: int) -> None:
        for r in self.ranks:
            if r.proc is not None:
                r.proc.signal(sig)

    def _arm_kill(self) -> None:
        if self.killing is None:
            self.killing = self.loop.call_later(self.job.grace, self._kill_all)

    def _kill_all(self) -> None:
        self.killing = None
        self._signal_groups(signal.SIGKILL)

    def _finished(self) -> bool:
        if not all(r.ended or r.proc is None for r in self.ranks):
            return False
        if all(s.closed for r in self.ranks for s in r.streams):
            return True
        # Every rank is reaped but a pipe is still open: something outside
        # the rank's group holds it.  Give it a moment, then sweep.
        if self._sweep is None:
            self._sweep = self.loop.call_later(0.2, self._sweep_leftovers)
        return False

    def _sweep_leftovers(self) -> None:
        if any(r.proc is not None and r.proc.group_alive() for r in self.ranks):
            self._sweep = self.loop.call_later(0.1, self._sweep_leftovers)
            return
        for pid in marked_pids(self.plan.kvsname):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        for r in self.ranks:
            for s in r.streams:
                s.drain()

    # -- end --------------------------------------------------------------
    def _cleanup(self) -> None:
        leftovers = [r for r in self.ranks if r.proc is not None and r.proc.group_alive()]
        if leftovers:
            for r in leftovers:
                r.proc.signal(signal.SIGCONT)  # type: ignore[union-attr]
                r.proc.signal(signal.SIGTERM)  # type: ignore[union-attr]
            deadline = time.monotonic() + self.job.grace
            while time.monotonic() < deadline and any(r.proc.group_alive() for r in leftovers):  # type: ignore[union-attr]
                time.sleep(0.02)
            for r in leftovers:
                r.proc.signal(signal.SIGKILL)  # type: ignore[union-attr]
        for r in self.ranks:
            if r.proc is not None and not r.ended:
                r.proc.signal(signal.SIGKILL)
                r.code, r.signal = r.proc.reap()
                r.ended = True
            for s in r.streams:
                if not s.closed:
                    s.drain()
        if self.stdin_fanout is not None:
            self.stdin_fanout.close()
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

    def _result(self) -> JobResult:
        results = tuple(r.result() for r in self.ranks)
        if self.root is not None:
            root = results[self.root.spec.rank]
            # A rank stopped by a broken pipe because mslaunch's own reader
            # went away (``| head``) is the shell's quiet SIGPIPE, not news.
            quiet = root.signal == signal.SIGPIPE and not self.console.is_open(1)
            return JobResult(exit_code=self.root_code, ranks=results, root_cause=root,
                             message="" if quiet else self._summary(self.root))
        if self.timed_out:
            return JobResult(exit_code=TIMEOUT_EXIT, ranks=results,
                             message="")
        if self.stop_signal is not None:
            return JobResult(exit_code=128 + self.stop_signal, ranks=results,
                             message=f"mslaunch: stopped by {signal_name(self.stop_signal)}")
        return JobResult(exit_code=0, ranks=results)

    def _summary(self, rank: _Rank) -> str:
        spec = rank.spec
        who = f"rank {spec.rank} (pid {rank.proc.pid if rank.proc else '?'} on {spec.host.name})"
        if rank.reason:
            what = rank.reason
        elif rank.signal is not None:
            what = f"was killed by signal {rank.signal} ({signal_name(rank.signal)})"
        else:
            what = f"exited with code {rank.code}"
        failed = [r for r in self.ranks if r.signal is not None or r.code or r.reason]
        if self.job.keep_going:
            head = f"mslaunch: {len(failed)} of {len(self.ranks)} rank(s) failed; first: {who} {what}"
        else:
            others = sum(1 for r in self.ranks if r is not rank and r.proc is not None)
            head = f"mslaunch: {who} {what}; terminated the job" + \
                (f" ({others} other rank(s))" if others else "")
        tail = rank.stderr.tail if rank.stderr is not None else b""
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


_devnull_fd: Optional[int] = None


def devnull_fd() -> int:
    """One shared /dev/null descriptor for ranks that get no stdin."""
    global _devnull_fd
    if _devnull_fd is None:
        _devnull_fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    return _devnull_fd


def _binding_line(spec: RankSpec, pid: int) -> str:
    where = f"[{spec.host.name}:{pid}] MCW rank {spec.rank}"
    if not spec.cpus:
        return f"{where} is not bound (or bound to all available processors)"
    ncpu = os.cpu_count() or 1
    mask = "/".join("B" if c in spec.cpus else "." for c in range(ncpu))
    cpus = ",".join(str(c) for c in spec.cpus)
    return f"{where} bound to cpu {cpus}: [{mask}]"
