"""Supervision of a running job: the policy.

The :class:`Supervisor` starts every rank of a :class:`Plan` through the rank
handles its backend (:mod:`mslaunch.backends.backend`) hands it -- this machine's
:class:`~mslaunch.machine.local.LocalRanks`, one
:class:`~mslaunch.backends.agents.host.RemoteHost` per remote host, srun's step, Open
MPI's mpirun -- and runs one event loop over their output, their exits, the
PMI sockets, mslaunch's terminal and a self-pipe for signals.  Every handle
sits behind one seam (:class:`~mslaunch.seams.RankHandle`) and every way ranks start
behind another, so the policy is written once, for every way.  The first
rank that fails (non-zero exit, death by a signal, ``MPI_Abort``, leaving MPI
without finalizing, or exiting while its peers wait for it in MPI) is the
root cause: the other ranks' process groups get SIGCONT and SIGTERM, and
SIGKILL after the grace period.  The same happens on ``--timeout``, on a stop
signal, and when output cannot be written (a full disk, a rank file over
``ulimit -f``).  The job is over when every rank has been reaped, every output
stream has ended and mslaunch's terminal has taken everything -- or, once the
job is being stopped, when the grace period has passed with the terminal's
reader still not reading.
"""

from __future__ import annotations

import os
from ..core import signal
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

    from ..machine.output import RankOutput
    from ..machine.stdin import StdinFanout
    from ..machine.terminal import Terminal
    from ..backends.agents.host import RemoteHost
    from ..core.states import Ending
    from ..backends.backend import Backend
    from ..inspect.control import Inspector
    from ..inspect.stall import StallWatch
    from ..mpi.early import EarlyMPI, Services
    from .pause import Pause
    from ..serve.mpijobs import MPIJobs
    from ..seams import Closable, RankEvents, RankHandle, RankState
    from ..backends.session import Session

from ..core.errors import HOST_LOST_EXIT
from ..machine.guard import Watchdog
from ..machine.local import LocalRanks, python_program
from ..machine.loop import Loop, Timer
from ..machine.output import rank_sinks
from ..machine.terminal import GIVE_UP_AFTER
from ..machine.spawn import raise_fd_limit, seal_inherited_fds, signal_name
from ..mpi.pmi.files import remove_singleton_segment
from ..core.states import (FAILURE, OUTPUT, PMI, REMOTE, RESTARTED_ENDINGS, SIGNAL, STALL,
                           TIMEOUT)
from ..core.spec import JobResult, JobSpec, Plan, RankSpec, replace
from .failures import Failures, ended_result
from ..rankbook import Rank as _Rank
from .lent import Events, Lent, Looked, Reported, Served
from .looking import OUTPUT_EVERY, LookingInside

_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2,
              signal.SIGTSTP)
_STOPPING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

_pending_stop: List[int] = []          # see _note_stop


class Supervisor(LookingInside):
    """Runs one job to its end and reports a :class:`JobResult`."""

    def __init__(self, job: JobSpec, plan: Plan, backend: Backend, session: Session, *,
                 control: Optional[Tuple[Any, str]] = None, note: str = "",
                 on_launched: Optional[Callable[[], None]] = None) -> None:
        self.job = job
        self.plan = plan
        self.backend = backend         # how the ranks start (see .backend)
        self.session = session         # what the attempts of this run share
        # A later attempt of a job run with --max-restarts (see .attempts): the line
        # its ranks' output files get before what it appends, and who hears that
        # its ranks have all been started.
        self.note = note
        self.on_launched = on_launched
        self.console = session.console
        self._own_loop = session.loop is None    # else the caller's, closed there
        self.loop = session.loop or Loop()
        self.remote: Optional[Tuple[int, str]] = None
        self.ranks = [_Rank(spec) for spec in plan.ranks]
        self.failures = Failures()          # the cause of a failed job, by time
        self.ending: Optional[Ending] = None
        self.stop_signal: Optional[int] = None
        self.output_error = ""
        self.killing: Optional[Timer] = None
        self._give_up: Optional[Timer] = None
        self.mpi_jobs: Optional[MPIJobs] = None   # the PMI of this job and those it spawns
        #: What the supervisor asks of them: they, or what stands for them until a
        #: rank asks (see mslaunch.mpi.early).
        self.mpi: Optional[Services] = None
        self.watchdog: Watchdog = session.guard
        self.local: Optional[LocalRanks] = None   # this machine's ranks, if any
        #: Every handle, as the backend gave them (the list grows by late spares).
        self.handles: List[RankHandle] = []
        self.stdin_fanout: Optional[StdinFanout] = None   # stdin, relayed to remote ranks too
        self.launched = False
        self.started = time.monotonic()      # (again as it runs)
        self.control = control     # (socket, path): mslaunch-stacks and mslaunch-top
        self.dumps: Optional[str] = None     # where local Python ranks dump their stacks
        self.inspector: Optional[Inspector] = None   # made on the first connection
        self.stall: Optional[StallWatch] = None      # --stall-report's watcher
        self._pausing: Optional[Pause] = None        # the last Ctrl-Z
        self.events: RankEvents = Events(self)     # what the rank handles report to

    @property
    def restarts(self) -> int:
        """How often each process may start again after it failed (msrun's recovery)."""
        return self.session.rank_restarts

    @property
    def hosts(self) -> Dict[str, RemoteHost]:
        remote = self.backend.remote_hosts
        return remote.hosts if remote is not None else {}

    @property
    def lookers(self) -> Dict[str, Any]:
        """What answers looks inside the job (``look(kind, body, done)``), by name:
        the remote hosts' agents, or srun's step."""
        return self.backend.lookers()

    def elsewhere(self, timeout: float, reply: Callable[[List[Any]], None]) -> bool:
        """Ask the job's other nodes for their workers' stacks (rows); False when
        the job has none."""
        nodes = self.backend.other_nodes
        return nodes is not None and nodes.ask_look(timeout, reply)

    @property
    def spoken_for(self) -> Set[int]:
        """The keys of the ranks the lookers answer for (the rest are read here)."""
        return set().union(*(set(h.ranks) for h in self.lookers.values()))

    def _handles(self) -> List[RankHandle]:
        """The backend's handles, and this machine's ranks' if a spawn made it later."""
        local = self.local
        return self.handles if local is None or local in self.handles else [local, *self.handles]

    # -- start ------------------------------------------------------------
    def run(self) -> JobResult:
        _pending_stop.clear()
        restore_signals = self.loop.catch_signals(_FORWARDED, self._on_signal,
                                                  early=_note_stop)
        self.started = time.monotonic()
        seal_inherited_fds()
        self.console.attach(self.loop, self._terminal_failed)
        kept = self.session.kept
        if kept is not None:     # agents waiting for a later attempt, watched meanwhile
            kept.watch(self.loop)
        if self.job.output.xml:
            self.console.xml = True
            self.console.write(1, self, b"<mpirun>\n")
        if self.job.report_pid:
            from .report import report_pid
            report_pid(Reported(self), self.job.report_pid)
        try:
            if self.job.verbose:
                self.console.message(f"mslaunch: orphan guard: {self.watchdog.mechanism}")
            if self.control is not None:
                self.loop.add_reader(self.control[0].fileno(), self._control_ready)
                if self.job.verbose:
                    self.log(f"see inside this job from another terminal: mslaunch-stacks "
                             f"{os.getpid()} (every rank's stacks), mslaunch-top {os.getpid()}")
            elif self.job.verbose and self.session.wants_control:
                self.log("no control socket (no private directory of this user's for it): "
                         "mslaunch-stacks and mslaunch-top cannot attach")
            self._say_refused()
            self._start_all()
            self._say_refused()       # (the Python ranks' hook directory is made there)
            self.loop.call_later(OUTPUT_EVERY, self._note_output)
            if self.job.stall_report:
                # The watch itself is imported at its first look: a short job never needs it.
                self.loop.call_later(min(60.0, max(0.5, self.job.stall_report / 4)),
                                     self._watch_stall)
            limit = self.job.timeout if self.job.timeout_left is None else self.job.timeout_left
            if limit is not None:
                self.loop.call_later(limit, self._on_timeout)
            self.loop.run_until(self._finished)
        finally:
            self._cleanup()
            restore_signals()
            if self.job.output.xml:
                self.console.write(1, self, b"</mpirun>\n")
            self.console.attach(None)
            if self._own_loop:
                self.loop.close()
        return self.backend.outcome(self._result())

    def _say_refused(self) -> None:
        """Said once: a place of this user's private directory another user made or may replace."""
        from ..machine.procs import refused_private
        where = (f"this job's control socket is in {os.path.dirname(self.control[1])}"
                 if self.control is not None else "mslaunch-stacks and mslaunch-top cannot attach")
        for why in refused_private():
            self.log(f"warning: {why}: {where}")

    def _start_all(self) -> None:
        job, backend = self.job, self.backend
        pmi, pmi_env = None, None
        serve = job.mpi == PMI and backend.serves_pmi
        if serve and backend.pmi_early:
            # The plan stands: the job's PMI is made while the places are reached
            # (the launcher only waits then), not once they are.
            pmi, pmi_env = self._start_pmi()
        lent = Lent(self)
        backend.connect(lent)
        nodes = backend.other_nodes
        if nodes is not None:
            nodes.listen(self.remote_stop, self.look_here)
        plan = self.plan                  # (maybe planned again with the hosts' topologies)
        if job.display_allocation or job.display_map or job.display_diffable or job.display_topo:
            from ..plan.display import display
            self.console.write(1, self, display(plan, job).encode())
        here = backend.here(plan)
        backend.check(plan)
        if serve and self.mpi is None:
            pmi, pmi_env = self._start_pmi()
        self.handles = backend.handles(lent, here, pmi, pmi_env)
        self.launched = True
        for handle in self._handles():
            handle.start()
        backend.started(lent)
        self.watchdog.step_out()
        remote = backend.remote_hosts
        if remote is not None:
            self.stdin_fanout = remote.relay_stdin(self.local.stdin_pipes if self.local else {})
        if self.on_launched is not None:
            self.on_launched()

    def _start_pmi(self):
        """The first job's PMI (see :class:`~mslaunch.serve.mpijobs.MPIJobs`), for the plan as it
        stands, or what stands for it until a rank asks (:mod:`mslaunch.mpi.early`); what its
        local ranks inherit."""
        backend, early = self.backend, None
        if backend.this_machine and backend.remote_hosts is None and backend.other_nodes is None \
                and not self.job.pmi_port and not self.session.attempts \
                and all(r.host.local for r in self.plan.ranks):
            # (before the agents backend connects, its remote_hosts is still None)
            from ..mpi.early import early_mpi
            early = early_mpi(Served(self), self._wake_mpi)
        if early is not None:
            self.mpi, pmi, pmi_env = early, early, early.env
        else:
            from ..serve.mpijobs import MPIJobs
            self.mpi = self.mpi_jobs = MPIJobs(Served(self))
            # (srun's step serves its ranks' PMI itself: none is "local", and none may be
            # given this machine's topology)
            pmi, pmi_env = self.mpi_jobs.start_first(bool(backend.here(self.plan)),
                                                     topology=backend.this_machine)
        self.mpi.watch_singletons()
        return pmi, pmi_env

    def _wake_mpi(self, early: EarlyMPI) -> MPIJobs:
        from ..serve.mpijobs import MPIJobs
        self.mpi_jobs = MPIJobs(Served(self))
        self.mpi_jobs.start_first(True, early=early)
        return self.mpi_jobs

    def local_ranks(self, specs: Sequence[RankSpec], pmi, pmi_env,
                    stdin_fd: Optional[int]) -> LocalRanks:
        """This machine's ranks ``specs``, as the job's own processes (their handle)."""
        raise_fd_limit(8 * len(specs) + 64)
        self.local = self._local_ranks(specs, pmi, pmi_env, stdin_fd)
        return self.local

    def _local_ranks(self, specs: Sequence[RankSpec], pmi, pmi_env,
                     stdin_fd: Optional[int]) -> LocalRanks:
        job = self.job
        if self.dumps is None and any(python_program(s) for s in specs):
            from ..machine.pydump import make_dir
            self.dumps = make_dir(self.watchdog)
        return LocalRanks(self.loop, specs, self.events, sinks=self.make_sinks,
                          guard=self.watchdog,
                          grace=job.grace, merge_stderr=job.output.merge_stderr,
                          pmi=pmi, pmi_env=pmi_env, stdin_fd=stdin_fd, pty=job.output.pty,
                          dumps=self.dumps)

    def answer_while_starting(self, status: Callable[[], str]) -> Optional[Closable]:
        """While the hosts start (before the loop runs), what answers the control
        socket: ``status()`` and the job's description; None without a socket."""
        if self.control is None:
            return None
        from ..inspect import job_info
        from ..inspect.startup import StartupAnswers
        return StartupAnswers(self.control[0], status, lambda: job_info(Looked(self)))

    @staticmethod
    def stop_requested() -> bool:
        """Whether a stop signal came while the remote hosts were being reached."""
        return bool(_pending_stop)

    def replanned(self, plan: Plan) -> None:
        """The plan made again with the remote hosts' topologies (before any rank runs)."""
        self.plan = plan
        self.ranks = [_Rank(spec) for spec in plan.ranks]

    def abandon(self, keys: Sequence[int]) -> None:
        """Processes of a spawn that failed: kill what started, end what never did,
        and keep all of them out of the failure policy."""
        for key in keys:
            r = self.ranks[key]
            r.discarded = True
            if r.ended:
                continue
            if r.pid:
                for handle in self._handles():
                    if key in handle.ranks:
                        handle.signal(signal.SIGKILL, [key])
            else:
                r.ended = True
                for out in r.outputs:
                    out.finish()

    def add_ranks(self, specs: Sequence[RankSpec]) -> None:
        """Processes of a spawned job join the supervision (keys follow on); their
        handles make their output sinks as they start them."""
        for spec in specs:
            assert spec.key == len(self.ranks), "keys are dense"
            self.ranks.append(_Rank(spec))

    def start_local(self, specs: Sequence[RankSpec], pmi, pmi_env) -> None:
        """Start a spawned job's processes on this machine."""
        live = sum(1 for r in self.ranks if r.spec.host.local and not r.ended)
        raise_fd_limit(8 * (live + len(specs)) + 64)
        if self.local is None:
            self.local = self._local_ranks(specs, pmi, pmi_env, stdin_fd=None)
            self.local.start()
        else:
            self.local.add(specs, pmi, pmi_env)

    def make_sinks(self, spec: RankSpec) -> Tuple[RankOutput, Optional[RankOutput]]:
        """The output sinks of one rank: stdout (merged or not) and stderr."""
        rank = self.ranks[spec.key]
        rank.outputs.extend(rank_sinks(self.job.output, spec, self.console, rank.restarts,
                                       self.restarts, rank.last_end, self._output_failed,
                                       marker=self.note, shared=self.session.shared_files))
        return rank.outputs[0], (rank.outputs[1] if len(rank.outputs) > 1 else None)

    # -- rank events --------------------------------------------------------
    def ranks_lost(self, keys, reason: str, at: Optional[float] = None,
                   blameless: bool = False) -> None:
        """A remote host, noticed lost at ``at``, was lost with ranks ``keys`` on it
        (see :class:`~mslaunch.backends.agents.fleet.Fleet`); ``blameless``: by this launcher's fault (its
        agent gave up on it), not the host's."""
        # Ranks still running, and ranks that ended but whose output had not
        # all arrived: both lose something with the host.
        lost = [r for r in self.ranks if r.spec.key in keys
                and (not r.ended or not all(out.finished for out in r.outputs))]
        how = "ended by its host's agent" if blameless else "lost with its host"
        for r in lost:
            if not r.reason:
                r.reason = (f"was {how}: {reason}" if not r.ended else
                            f"lost the end of its output ({how}): {reason}")
            r.end, r.ended = (r.end if r.ended else at or time.time()), True
            for out in r.outputs:
                out.finish()
        if lost:
            self.fail(lost[0], lost[0].reason, HOST_LOST_EXIT, abort=True, at=at, lost=True)

    def rank_started(self, key: int, pid: int) -> None:
        r = self.ranks[key]
        r.pid = pid
        r.start = time.time() if r.start is None else r.start   # (msrun's restarts)
        r.started_at = time.monotonic()
        if self.job.verbose or self.job.report_bindings:
            from .report import rank_started
            rank_started(Reported(self), r)

    def rank_exited(self, key: int, code: Optional[int], sig: Optional[int],
                    at: Optional[float] = None) -> None:
        """Rank ``key`` ended, at ``at`` (on this clock; now if None)."""
        if self.mpi is not None:
            self.mpi.check_singletons()
        r = self.ranks[key]
        r.code, r.signal, r.ended, r.end = code, sig, True, at or time.time()
        r.ended_at = time.monotonic()
        if self.mpi is not None:
            self.mpi.process_ended(r.spec)
        elif r.pid and r.start is not None and r.spec.host.local:
            remove_singleton_segment(r.pid, r.start)
        if r.discarded:
            return
        if (sig is not None or code) and self.restarts and self.ending is None \
                and r.spec.host.local and self.local is not None:
            from .report import restart
            if restart(Reported(self), self.local, r):
                return
        if sig is not None or code:
            self.fail(r, "", 128 + sig if sig is not None else code or 1,
                      abort=not self.job.keep_going, at=r.end)
        elif self.mpi is not None:
            self.mpi.left(r)

    def _live(self) -> List[RankState]:
        return [r for r in self.ranks if r.pid and not r.ended]

    def _on_signal(self, sig: int) -> None:
        if sig == signal.SIGTSTP:
            self._suspend()
            return
        if sig == signal.SIGINT and self.stop_signal is not None:
            if not self.job.quiet:
                self.console.message("mslaunch: second SIGINT: killing all ranks")
            self._signal_all(signal.SIGKILL)
            self.console.give_up()
            return
        if sig in _STOPPING:
            # As Open MPI does: the ranks are stopped with SIGTERM (SIGKILL after
            # the grace period), whichever of INT, TERM, HUP mslaunch got, so
            # that a Ctrl-C of many Python ranks is not many tracebacks.
            live = self._live()
            if self.stop_signal is None:
                self.stop_signal = int(sig)
                if self.session.allocation_end is not None:
                    self.session.allocation_end.ask(self.loop, stop=True)
                if not self.job.quiet and sig == signal.SIGINT and live:
                    what, them = (("the health check (--health-check)", "it")
                                  if self.job.is_check else (f"{len(live)} rank(s)", "them"))
                    self.console.message(f"mslaunch: SIGINT: stopping {what}; "
                                         f"press Ctrl-C again to kill {them}")
            if self._end_as(SIGNAL):
                self._tell_cluster(128 + int(sig), f"stopped by {signal_name(int(sig))} on "
                                                   f"{os.uname().nodename}")
                self._terminate()
            if not live:
                self.console.give_up()
        else:
            self._signal_all(sig)

    def _suspend(self) -> None:
        """Ctrl-Z (see :mod:`.pause`)."""
        if self._pausing is not None and not self._pausing.done:
            return
        self._signal_all(signal.SIGTSTP)
        from .pause import Pause
        self._pausing = Pause(self.loop, {name for name, host in self.hosts.items()
                                          if host.hears_signals}, self._signal_all)

    def host_paused(self, name: str) -> None:
        """A host's agent heard that this launcher stops (see :meth:`_suspend`)."""
        if self._pausing is not None:
            self._pausing.heard(name)

    def _on_timeout(self) -> None:
        if self._finished() or not self._end_as(TIMEOUT):
            return
        from .report import timed_out
        live = self._live()
        timed_out(Reported(self), live)
        if self.job.stack_traces and live:
            from ..inspect.stall import timeout_stacks
            timeout_stacks(Looked(self), self._terminate)    # stops the ranks once printed
        else:
            self._terminate()

    # -- output errors -------------------------------------------------------
    def _terminal_failed(self, terminal: Terminal) -> None:
        self._output_failed(f"cannot write to mslaunch's {terminal.name}: {terminal.error}")

    def _output_failed(self, message: str) -> None:
        if self.output_error:
            return
        self.output_error = message
        self.console.message(f"mslaunch: error: {message}; stopping the job")
        if self._end_as(OUTPUT):
            self._tell_cluster(1, message)
            self._terminate()

    def log(self, message: str) -> None:
        """One line of mslaunch's own, unless --quiet."""
        if not self.job.quiet:
            self.console.message(f"mslaunch: {message}")

    def _end_as(self, ending: Ending) -> bool:
        """The one change of :attr:`ending` (the first cause wins; said in ``-v``):
        True if ``ending`` is now the job's."""
        if self.ending is not None:
            return False
        self.ending = ending
        if self.job.verbose:
            self.log(f"the job ends: {ending}")
        return True

    # -- policy -----------------------------------------------------------
    def fail(self, rank: RankState, reason: str, code: int, *, abort: bool,
             at: Optional[float] = None, mpi_abort: bool = False, lost: bool = False) -> None:
        """``rank`` failed at ``at`` (this clock; now if None), by ``MPI_Abort`` if
        ``mpi_abort``, lost with its host if ``lost``; ``abort``: that ends the job."""
        if rank.discarded:
            return
        if reason and not rank.reason:
            rank.reason = reason
        if self.ending in (None, FAILURE):
            host = None if rank.spec.host.local else self.hosts.get(rank.spec.host.name)
            self.failures.note(rank, code, at or time.time(), abort or self.job.keep_going,
                               mpi_abort, self.failures.stopped_at if host is None
                               else host.stop_reached, self.job.grace, lost)
        if abort and self._end_as(FAILURE):
            self.failures.stopped(time.time())
            from .report import told
            self._tell_cluster(code, told(Reported(self), rank))
            self._terminate()

    def _tell_cluster(self, code: int, message: str) -> None:
        nodes = self.backend.other_nodes
        if nodes is not None:
            nodes.stop(code, message, restart=self.ending in RESTARTED_ENDINGS)

    def remote_stop(self, code: int, message: str) -> None:
        """Another node (or the node service) ends the job: stop here too, with ``code``."""
        if not self._end_as(REMOTE):
            return
        self.remote = (code, message)
        if not self.job.quiet:
            self.console.message(f"mslaunch: {message}; stopping this node's processes")
        self._terminate()

    def _terminate(self) -> None:
        self._signal_all(signal.SIGCONT)
        self._signal_all(signal.SIGTERM)
        self._arm_kill()

    def _signal_all(self, sig: int) -> None:
        for handle in self._handles():
            handle.signal(sig)

    def _arm_kill(self) -> None:
        if self.killing is None:
            self.killing = self.loop.call_later(self.job.grace, self._kill_all)
        if self._give_up is None:
            # A stopped job does not wait for a terminal nobody reads.
            self._give_up = self.loop.call_later(self.job.grace + GIVE_UP_AFTER, self.console.give_up)

    def _kill_all(self) -> None:
        self.killing = None
        self._signal_all(signal.SIGKILL)

    def _finished(self) -> bool:
        if any(handle.busy for handle in self._handles()):
            return False
        if not all(o.finished for r in self.ranks for o in r.outputs):
            return False
        return not self.console.pending

    # -- end --------------------------------------------------------------
    def _cleanup(self) -> None:
        self._close_control()
        remote = self.backend.remote_hosts
        if remote is not None:
            remote.let_go(self.session.keeps_agents(self.ending, self.stop_signal))
        for handle in self._handles():
            handle.release()
        if self.stdin_fanout is not None:
            self.stdin_fanout.close()
        if self.local is not None:
            self.local.close(time.monotonic() + self.job.grace)
        # Then the other handles share one grace period more (the hosts' agents were
        # told BYE already and stop their ranks meanwhile).
        deadline = time.monotonic() + self.job.grace
        for handle in [h for h in self._handles() if h is not self.local]:
            handle.close(deadline)
        self.backend.close()
        if self.mpi is not None:
            if os.environ.get("MSLAUNCH_PMI_STATS"):
                self.console.message(
                    f"mslaunch: PMI: {self.mpi.stats(len(self.ranks))} "
                    f"(job {time.monotonic() - self.started:.3f} s)")
            self.mpi.close()
        if self.session.kept is not None:
            self.session.kept.unwatch()
        if self.console.dropped:
            self.console.message(f"mslaunch: {self.console.dropped} byte(s) of rank output were "
                                 f"not delivered: the terminal was not being read when the "
                                 f"job was stopped")

    def _result(self) -> JobResult:
        results = tuple(r.result() for r in self.ranks)
        if self.failures.root is not None:
            from .report import failed_result
            result = failed_result(Reported(self), results)
        else:
            result = ended_result(self.ending, self.stop_signal, self.remote, results)
        if self.ending == STALL and self.stall is not None:
            result = replace(result, stall_report=self.stall.report)
        if self.stop_signal is not None:
            result = replace(result, stop_signal=self.stop_signal)
        return result


def _note_stop(signum: int) -> None:
    # A stop signal that arrives while the remote hosts are being connected
    # (before the event loop runs) is noted here as well.
    if signum in _STOPPING:
        _pending_stop.append(signum)

