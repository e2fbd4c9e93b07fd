"""Supervision of a running job: the policy.

The :class:`Supervisor` starts every rank of a :class:`Plan` through
:class:`~mslaunch.machine.local.LocalRanks` and runs one event loop over their
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
# The C module: the same calls as signal's, without importing enum (milliseconds).
import _signal as signal
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Sequence, Tuple

    from ..remote.host import RemoteHost
    from .mpijobs import MPIJobs
    from ..machine.output import Terminal

from ..errors import HOST_LOST_EXIT, TIMEOUT_EXIT, LaunchError
from ..spec import JobResult, JobSpec, Plan, RankResult, RankSpec
from ..pmi.hwloc import GUARD_TASKS
from ..pmi.shm import after_launcher_death
from ..machine.guard import Watchdog
from ..machine.local import LocalRanks
from ..machine.loop import Loop, Timer
from ..machine.output import Console, RankOutput, line_prefix, xml_element
from ..machine.spawn import seal_inherited_fds, signal_name

_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
_STOPPING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

# A stop signal that arrives while the remote hosts are being connected
# (before the event loop runs) is noted here as well.
_pending_stop: List[int] = []


class _Rank:
    """Mutable bookkeeping of one rank."""

    __slots__ = ("spec", "pid", "outputs", "code", "signal", "reason", "ended", "pmi_lost",
                 "discarded", "restarts", "last_end")

    def __init__(self, spec: RankSpec) -> None:
        self.spec = spec
        self.pid = 0
        self.outputs: List[RankOutput] = []
        self.code: Optional[int] = None
        self.signal: Optional[int] = None
        self.reason = ""
        self.ended = False
        self.pmi_lost = False
        self.discarded = False    # of a spawn that failed: stopped, not a failure
        self.restarts = 0         # times started again (msrun's recovery)
        self.last_end = ""        # how the previous run ended, for the log's marker

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

    def __init__(self, job: JobSpec, plan: Plan, console: Optional[Console] = None, *,
                 connect: Sequence[str] = (), replan=None,
                 watchdog: Optional[Watchdog] = None, loop: Optional[Loop] = None,
                 cluster=None, restarts: int = 0, on_started=None) -> None:
        self.job = job
        self.plan = plan
        # Remote hosts to start agents on, and how to plan again with the
        # topologies they report (None: the plan stands).
        self.connect = list(connect)
        self.replan = replan
        self.console = console or Console()
        self.loop = loop or Loop()
        # Other nodes of an msrun-mode job (see mslaunch.msrun.node.Cluster):
        # told when this node ends the job, and telling it through remote_stop.
        self.cluster = cluster
        self.remote: Optional[Tuple[int, str]] = None
        self.restarts = restarts            # per process, on failure (msrun's recovery)
        self.on_started = on_started        # called with {label: pid} once all run
        self.ranks = [_Rank(spec) for spec in plan.ranks]
        self.root: Optional[_Rank] = None
        self.root_code = 0
        self.ending: Optional[str] = None     # failure | timeout | signal | output
        self.stop_signal: Optional[int] = None
        self.output_error = ""
        self.killing: Optional[Timer] = None
        self._give_up: Optional[Timer] = None
        self.mpi_jobs: Optional[MPIJobs] = None   # the PMI of this job and those it spawns
        self.watchdog: Optional[Watchdog] = watchdog   # started early by run_job, or here
        self.local: Optional[LocalRanks] = None
        self.hosts: Dict[str, RemoteHost] = {}
        self.stdin_fanout = None
        self._remote_stdin: Dict[int, Any] = {}
        self._start_error: Optional[Tuple[str, int]] = None
        self.launched = False
        self.listener = None
        self._srun = False                # the agents were started by srun
        self._old_handlers: Dict[int, object] = {}

    # -- start ------------------------------------------------------------
    def run(self) -> JobResult:
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        old_wakeup = signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        _pending_stop.clear()
        for sig in _FORWARDED:
            self._old_handlers[sig] = signal.signal(sig, _noop)
        self.loop.add_reader(wake_r, lambda: self._on_signals(wake_r))
        self.started = time.monotonic()
        seal_inherited_fds()
        self.console.attach(self.loop, self._terminal_failed)
        if self.job.output.xml:
            self.console.xml = True
            self.console.write(1, self, b"<mpirun>\n")
        if self.job.report_pid:
            self._report_pid(self.job.report_pid)
        try:
            if self.watchdog is None:
                self.watchdog = Watchdog(self.plan.kvsname, self.job.grace,
                                         tasks=GUARD_TASKS,
                                         on_death=after_launcher_death)
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
            if self.job.output.xml:
                self.console.write(1, self, b"</mpirun>\n")
            self.console.attach(None)
            if self.cluster is None:
                self.loop.close()          # else the node runner's, closed there
        result = self._result()
        if self.cluster is not None:
            self.cluster.finished(result.exit_code)
        return result

    def _report_pid(self, where: str) -> None:
        """--report-pid: ``-`` stdout, ``+`` stderr, else a file."""
        text = f"{os.getpid()}\n"
        if where in ("-", "+"):
            self.console.write(1 if where == "-" else 2, self, text.encode())
            return
        try:
            with open(where, "w") as f:
                f.write(text)
        except OSError as err:
            raise LaunchError(f"--report-pid {where}: {err.strerror}") from None

    def _start_all(self) -> None:
        conns = self._conns = self._connect_agents() if self.connect else {}
        job, plan = self.job, self.plan
        self._show_plan()
        from ..machine.spawn import check_startable
        check_startable(plan.ranks)
        local_specs = [r for r in plan.ranks if r.host.local]
        remote_specs: Dict[str, List[RankSpec]] = {}
        for r in plan.ranks:
            if not r.host.local:
                remote_specs.setdefault(r.host.name, []).append(r)
        pmi, pmi_env = None, None
        if job.mpi == "pmi":
            from .mpijobs import MPIJobs
            self.mpi_jobs = MPIJobs(self)
            pmi, pmi_env = self.mpi_jobs.start_first(bool(local_specs))
            self._watch_singletons()
        for name in conns:
            remote_specs.setdefault(name, [])     # spare hosts, for spawned jobs
        _raise_fd_limit(8 * len(local_specs) + 8 * len(remote_specs) + 64)
        if remote_specs:
            self._prepare_hosts(remote_specs, conns)
        if local_specs:
            self.local = LocalRanks(self.loop, local_specs, self, sinks=self._sinks,
                                    guard=self.watchdog,  # type: ignore[arg-type]
                                    grace=job.grace, merge_stderr=job.output.merge_stderr,
                                    pmi=pmi, pmi_env=pmi_env,
                                    stdin_fd=None if remote_specs else 0, pty=job.output.pty)
            self.local.start()
        self.launched = True
        for host in self.hosts.values():
            host.start()
        if remote_specs:
            self._relay_stdin()
        if self.on_started is not None:
            self.on_started({r.spec.label or f"rank {r.spec.rank}": r.pid for r in self.ranks})

    def _watch_singletons(self) -> None:
        assert self.mpi_jobs is not None
        self.mpi_jobs.check_singletons()
        if self.ending is None:
            self.loop.call_later(0.5, self._watch_singletons)

    @property
    def may_oversubscribe(self) -> bool:
        return self.plan.oversubscribe

    def abandon(self, keys: Sequence[int]) -> None:
        """Processes of a spawn that failed: kill what started, end what never did,
        and keep all of them out of the failure policy."""
        for key in keys:
            r = self.ranks[key]
            r.discarded = True
            if r.ended:
                continue
            if r.pid:
                if r.spec.host.local and self.local is not None:
                    self.local.signal(signal.SIGKILL, [key])
                elif r.spec.host.name in self.hosts:
                    self.hosts[r.spec.host.name].signal(signal.SIGKILL, [key])
            else:
                r.ended = True
                for out in r.outputs:
                    out.finish()

    def add_ranks(self, specs: Sequence[RankSpec]) -> None:
        """Processes of a spawned job join the supervision (keys follow on)."""
        for spec in specs:
            assert spec.key == len(self.ranks), "keys are dense"
            self.ranks.append(_Rank(spec))
            if not spec.host.local:
                self._sinks(spec)        # local ranks get theirs as they start

    def start_local(self, specs: Sequence[RankSpec], pmi, pmi_env) -> None:
        """Start a spawned job's processes on this machine."""
        live = sum(1 for r in self.ranks if r.spec.host.local and not r.ended)
        _raise_fd_limit(8 * (live + len(specs)) + 64)
        if self.local is None:
            job = self.job
            self.local = LocalRanks(self.loop, specs, self, sinks=self._sinks,
                                    guard=self.watchdog,  # type: ignore[arg-type]
                                    grace=job.grace, merge_stderr=job.output.merge_stderr,
                                    pmi=pmi, pmi_env=pmi_env, stdin_fd=None,
                                    pty=job.output.pty)
            self.local.start()
        else:
            self.local.add(specs, pmi, pmi_env)

    # -- remote hosts ---------------------------------------------------------
    def _connect_agents(self) -> Dict[str, Any]:
        """Start an agent on every remote host; plan again with their topologies.

        Agents of hosts the final plan does not use are sent away at once.
        """
        import sys

        from ..remote import ssh
        job = self.job
        spec = job.ssh
        pythons = [spec.remote_python] if spec.remote_python else [sys.executable, "python3"]
        options = ssh.Options(config=spec.config, user=spec.user, port=spec.port,
                              identity=spec.identity, accept_new=spec.accept_new,
                              connect_timeout=spec.connect_timeout, pythons=pythons)
        from ..remote import slurm
        how = slurm.choose(spec.launcher, os.environ)
        if how == "local":
            raise LaunchError(f"--launcher local: {', '.join(self.connect[:4])} "
                              f"{'is' if len(self.connect) == 1 else 'are'} not this machine")
        if job.verbose:
            self.console.message(f"mslaunch: starting agents on {len(self.connect)} "
                                 f"remote host(s) " + ("with srun" if how == "slurm"
                                                       else "over SSH"))
        self._srun = how == "slurm"
        conns: Dict[str, Any] = (
            slurm.connect_all(self.connect, pythons, cancelled=_stop_requested)
            if how == "slurm" else ssh.connect_all(self.connect, options,
                                                   cancelled=_stop_requested))
        if self.replan is not None:
            from ..machine.topology import from_wire
            topologies = {}
            for name, conn in conns.items():
                try:
                    topologies[name] = from_wire(conn.hello.get("topology"))
                except ValueError:
                    pass      # the agent's host could not tell; assume one socket
            try:
                self.plan = self.replan(topologies)
            except BaseException:
                for conn in conns.values():
                    _let_go(conn)
                raise
            self.ranks = [_Rank(spec) for spec in self.plan.ranks]
        used = {r.host.name for r in self.plan.ranks if not r.host.local}
        if job.mpi == "pmi" and not job.novm:
            used |= {h.name for h in self.plan.spare_hosts if not h.local}
        for name in [n for n in conns if n not in used]:
            _let_go(conns.pop(name))
        return conns

    def _show_plan(self) -> None:
        job, plan = self.job, self.plan
        if job.display_allocation or job.display_map or job.display_diffable or job.display_topo:
            from ..plan.display import display
            self.console.write(1, self, display(plan, job).encode())

    def _prepare_hosts(self, remote_specs: Dict[str, List[RankSpec]], conns) -> None:
        """Hand the agents their ranks; wait until every host is ready.

        Nothing starts anywhere unless every host is ready: a missing program
        on one host is reported before any rank runs.
        """
        from ..remote.endpoint import heartbeat_setting
        from ..remote.host import RemoteHost
        from ..remote.jobframe import job_frame
        job, plan = self.job, self.plan
        heartbeat = heartbeat_setting(os.environ.get("MSLAUNCH_HEARTBEAT"))
        pmi = None if job.mpi != "pmi" else ("port" if job.pmi_port else "fd")
        listener = self._output_listener(conns)
        for name, specs in remote_specs.items():
            conn = conns.pop(name)
            host = RemoteHost(self.loop, conn, specs, self)
            self.hosts[name] = host
            for s in specs:
                self._sinks(s)
            frame = job_frame(job, plan, name, specs, heartbeat, pmi,
                              self.mpi_jobs.universe() if self.mpi_jobs else -1)
            port = listener.port_of(conn.local_address or "") if listener else None
            if listener is not None and port is not None:
                from ..remote.dialback import new_token
                token = new_token()
                listener.expect(token, host.attach_output)
                frame["data"] = {"addresses": [conn.local_address], "port": port,
                                 "token": token, "cert": listener.cert_pem and listener.cert_pem.decode()}
            host.prepare(frame)
        self.loop.run_until(lambda: self._start_error is not None or self.ending is not None
                            or all(h.state == "ready" for h in self.hosts.values()))
        if self._start_error is not None:
            message, code = self._start_error
            err = LaunchError(message)
            err.exit_code = code
            raise err
        if self.ending is not None:
            err = LaunchError(f"stopped by {signal_name(self.stop_signal or 15)} while the "
                              f"remote hosts were starting")
            err.exit_code = 128 + (self.stop_signal or 15)
            raise err

    def _output_listener(self, conns) -> Any:
        """A listener for the agents' output connections, or None.

        Rank output then travels in plain TCP (token-checked, spliced into
        mslaunch's stdout where it can be) rather than in the SSH channel,
        decrypted by paramiko in Python, many times slower.  It listens only
        on the addresses this machine uses to reach the hosts.
        ``MSLAUNCH_DIRECT_OUTPUT=0`` keeps everything in SSH;
        ``MSLAUNCH_OUTPUT_TLS=1`` puts the connections in TLS, except those of
        agents that srun started: their link is plain TCP already, and output
        in TLS beside it would hide nothing the link does not show.
        """
        from ..remote.dialback import Listener, direct_output, output_tls
        if not direct_output():
            return None
        addresses = [c.local_address for c in conns.values() if c.local_address]
        if not addresses:
            return None
        try:
            self.listener = Listener(self.loop, addresses, tls=output_tls() and not self._srun,
                                     log=self.pmi_log_plain)
        except Exception as err:   # no cryptography, no ssl: the SSH channel will do
            if self.job.verbose:
                self.console.message(f"mslaunch: output stays in the SSH channels ({err})")
            return None
        return self.listener

    def pmi_log_plain(self, message: str) -> None:
        if not self.job.quiet:
            self.console.message(f"mslaunch: {message}")

    def _relay_stdin(self) -> None:
        """The launcher's stdin to the ranks that read it, on this host and others."""
        from ..remote.host import RemoteStdin
        sinks: Dict[int, Any] = dict(self.local.stdin_pipes) if self.local else {}
        for host in self.hosts.values():
            for spec in host.specs:
                if spec.stdin != "null":
                    sinks[spec.key] = self._remote_stdin[spec.key] = RemoteStdin(host,
                                                                                 spec.key)
        if sinks:
            from ..machine.output import StdinFanout
            self.stdin_fanout = StdinFanout(self.loop, 0, sinks)
            for sink in self._remote_stdin.values():
                sink.fanout = self.stdin_fanout

    def sink(self, rank: int, stream: int) -> Optional[RankOutput]:
        outputs = self.ranks[rank].outputs
        if stream == 1 or (stream == 2 and len(outputs) == 1):
            return outputs[0] if outputs else None
        return outputs[1] if stream == 2 and len(outputs) > 1 else None

    def host_ready(self, host: RemoteHost) -> None:
        pass

    def host_done(self, host: RemoteHost) -> None:
        pass

    def host_failed(self, host: RemoteHost, message: str, code: object) -> None:
        if self._start_error is None:
            self._start_error = (f"on {host.name}: {message}",
                                 code if isinstance(code, int) and 0 < code < 256 else 1)

    def host_message(self, host: RemoteHost, text: str) -> None:
        if not self.job.quiet:
            self.console.message(f"mslaunch: {host.name}: {text}")

    def host_lost(self, host: RemoteHost, reason: str) -> None:
        if not self.launched:
            if self._start_error is None:
                self._start_error = (f"lost host {host.name} before the job started: {reason}",
                                     HOST_LOST_EXIT)
            return
        # Ranks still running, and ranks that ended but whose output had not
        # all arrived: both lose something with the host.
        lost = [r for r in self.ranks if r.spec.key in host.ranks
                and (not r.ended or not all(out.finished for out in r.outputs))]
        for r in lost:
            if not r.reason:
                r.reason = (f"was lost with its host: {reason}" if not r.ended else
                            f"lost the end of its output with its host: {reason}")
            r.ended = True
            for out in r.outputs:
                out.finish()
        if lost:
            self._fail(lost[0], lost[0].reason, HOST_LOST_EXIT, abort=True)
        if not self.job.quiet:
            self.console.message(f"mslaunch: lost host {host.name}: {reason}")

    def stdin_taken(self, host: RemoteHost, rank: int, count: int) -> None:
        sink = self._remote_stdin.get(rank)
        if sink is not None:
            sink.taken(count)

    def pmi_from_agent(self, host: RemoteHost, message: Dict[str, Any]) -> None:
        """PMI traffic of a remote host's ranks (see :class:`~.jobs.MPIJobs`)."""
        if self.mpi_jobs is None:
            from ..remote import link
            raise link.LinkError("PMI frame in a job without PMI")
        self.mpi_jobs.from_agent(host, message)

    def _open_log(self, path: Optional[str], rank: _Rank) -> Optional[int]:
        """A rank's output file: new, or appended to after a marker line when the
        process is started again (msrun's recovery)."""
        if path is None:
            return None
        from ..errors import LaunchError
        how = os.O_APPEND if rank.restarts else os.O_TRUNC
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | how | os.O_CLOEXEC, 0o644)
            if rank.restarts:
                # Its own line, even when the last run ended mid-line.
                lead = b""
                if os.fstat(fd).st_size:
                    with open(path, "rb") as f:
                        f.seek(-1, os.SEEK_END)
                        lead = b"" if f.read(1) == b"\n" else b"\n"
                os.write(fd, lead + (f"mslaunch: restart {rank.restarts} of {self.restarts} "
                                     f"of {rank.spec.label or 'rank ' + str(rank.spec.rank)} "
                                     f"after {rank.last_end}\n").encode())
            return fd
        except OSError as err:
            raise LaunchError(f"cannot create output file: {err.filename}: {err.strerror}") \
                from None

    def _sinks(self, spec: RankSpec):
        """The output sinks of one rank: stdout (merged or not) and stderr."""
        out, rank = self.job.output, self.ranks[spec.key]
        shown = out.copy_to_terminal if spec.console is None else spec.console
        terminal = self.console if shown else None
        opts = dict(tag=out.tag, timestamp=out.timestamp, rank_prefix=out.rank_prefix)
        merged = out.merge_stderr
        label = (f"[{spec.label}] ".encode() if out.label_prefix and spec.label else None)
        for stream, name, path in ((1, "stdout", spec.stdout_path), (2, "stderr", spec.stderr_path)):
            if stream == 2 and merged:
                break
            rank.outputs.append(RankOutput(
                # --xml: one document, on stdout
                terminal=terminal.terminal(1 if out.xml else stream) if terminal else None,
                file_fd=self._open_log(path, rank), file_name=path or "",
                prefix=(lambda p=label: p) if label else line_prefix(
                    spec.rank, name, jobid=spec.job, **opts),  # type: ignore[arg-type]
                file_prefix=line_prefix(spec.rank, name, tag=out.tag, timestamp=out.timestamp,
                                        rank_prefix=False, jobid=spec.job),
                formatter=xml_element(name, spec.rank) if out.xml else None,
                keep_tail=(stream == 2 or merged), on_error=self._output_failed))
        return rank.outputs[0], (None if merged else rank.outputs[1])

    # -- rank events --------------------------------------------------------
    def rank_started(self, key: int, pid: int) -> None:
        r = self.ranks[key]
        r.pid = pid
        rank = r.spec.rank
        if self.job.report_bindings and (r.spec.cpus or self.job.bind_to != "none"):
            # Open MPI's line, with the launcher's pid; no line for an unbound rank.
            from ..machine.topology import report_binding
            topo = self.plan.topologies[r.spec.host.node_id] if self.plan.topologies else None
            text = report_binding(rank, topo, r.spec.cpus) if topo is not None else \
                f"MCW rank {rank} bound to cpus {r.spec.cpus}"
            self.console.message(f"[{r.spec.host.name}:{os.getpid():05d}] {text}")
        if self.job.verbose:
            job = f" of job {r.spec.job}" if r.spec.job != 1 else ""
            who = r.spec.label or f"rank {rank}{job}"
            self.console.message(f"mslaunch: started {who} (pid {pid}) "
                                 f"on {r.spec.host.name}: {' '.join(r.spec.argv)}")

    def rank_exited(self, key: int, code: Optional[int], sig: Optional[int]) -> None:
        if self.mpi_jobs is not None:
            self.mpi_jobs.check_singletons()
        r = self.ranks[key]
        r.code, r.signal, r.ended = code, sig, True
        if self.mpi_jobs is not None:
            self.mpi_jobs.process_ended(r.spec)
        if r.discarded:
            return
        if (sig is not None or code) and self._restart(r):
            return
        if sig is not None or code:
            self._fail(r, "", 128 + sig if sig is not None else code or 1,
                       abort=not self.job.keep_going)
        elif r.pmi_lost:
            self._check_lost(r)
        elif self.mpi_jobs is not None:
            self.mpi_jobs.check_left_mpi(r)

    def _restart(self, r: _Rank) -> bool:
        """msrun's recovery: start a failed process again, while restarts are left."""
        if not self.restarts or self.ending is not None or not r.spec.host.local \
                or self.local is None:
            return False
        if r.restarts >= self.restarts:
            r.reason = (f"{self._how_ended(r)}, after {r.restarts} restart(s) "
                        f"(the limit, --max_restarts)")
            return False
        r.restarts += 1
        r.last_end = self._how_ended(r)
        if not self.job.quiet:
            self.console.message(f"mslaunch: {r.spec.label or 'rank ' + str(r.spec.rank)} "
                                 f"{r.last_end}; starting it again ({r.restarts} of "
                                 f"{self.restarts} restarts)")
        r.outputs = []
        r.code = r.signal = None
        r.ended = False
        try:
            self.local.restart(r.spec.key)
        except LaunchError as err:
            r.ended = True
            r.reason = f"could not be started again: {err}"
            return False
        return True

    @staticmethod
    def _how_ended(r: _Rank) -> str:
        if r.signal is not None:
            return f"was killed by signal {r.signal} ({signal_name(r.signal)})"
        return f"exited with code {r.code}"

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
            # As Open MPI does: the ranks are stopped with SIGTERM (SIGKILL after
            # the grace period), whichever of INT, TERM, HUP mslaunch got, so
            # that a Ctrl-C of many Python ranks is not many tracebacks.
            live = self._live()
            if self.stop_signal is None:
                self.stop_signal = int(sig)
                if not self.job.quiet and sig == signal.SIGINT and live:
                    self.console.message(f"mslaunch: SIGINT: stopping {len(live)} rank(s); "
                                         f"press Ctrl-C again to kill them")
            if self.ending is None:
                self.ending = "signal"
                self._tell_cluster(128 + int(sig), f"stopped by {signal_name(int(sig))} on "
                                                   f"{os.uname().nodename}")
                self._terminate()
            if not live:
                self._give_up_output()
        else:
            self._signal_all(sig)

    def _on_timeout(self) -> None:
        if self._finished() or self.ending is not None:
            return
        self.ending = "timeout"
        live = self._live()
        self.console.message(f"mslaunch: job timed out after {self.job.timeout:g} s "
                             f"(--timeout); terminating {len(live)} rank(s); exit status "
                             f"{TIMEOUT_EXIT}")
        self._report_hang()
        if self.job.report_state:
            self._report_state()
        if self.job.stack_traces:
            from ..plan.display import job_id
            from ..machine.stacks import stack_traces
            self.console.message("mslaunch: waiting for stack traces (this may take a few "
                                 "moments)...")
            here = {r.spec.rank: r.pid for r in live if r.spec.host.local and r.spec.job == 1}
            for block in stack_traces(here, os.uname().nodename, job_id()):
                self.console.message(block)
            for host in self.hosts.values():
                host.request_stacks()
            # Python ranks write their stacks themselves; let them (and the
            # remote hosts' answers) arrive before the ranks are stopped.
            self.loop.call_later(3.0 if self.hosts else 1.0, self._terminate)
            return
        self._terminate()

    def _report_hang(self) -> None:
        """Name the ranks the others were waiting for in MPI (see :meth:`MPIJobs.hang_report`)."""
        for line in self.mpi_jobs.hang_report() if self.mpi_jobs is not None else []:
            self.console.message(f"mslaunch: PMI: {line}")

    def _report_state(self) -> None:
        from ..plan.display import job_id
        from ..machine.stacks import state_report
        rows = []
        for r in self.ranks:
            state = "RUNNING" if r.pid and not r.ended else ("TERMINATED" if r.ended
                                                             else "NOT STARTED")
            rows.append((r.spec.rank, r.spec.host.name, r.pid, state, r.code or 0))
        self.console.message(state_report(job_id(), rows, len(self.job.apps),
                                          self.mpi_jobs.reported() if self.mpi_jobs
                                          else 0).rstrip("\n"))

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
            self._tell_cluster(1, message)
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

    def pmi_log(self, message: str) -> None:
        if not self.job.quiet:
            self.console.message(f"mslaunch: PMI: {message}")

    # -- policy -----------------------------------------------------------
    def _fail(self, rank: _Rank, reason: str, code: int, *, abort: bool) -> None:
        if rank.discarded:
            return
        if reason and not rank.reason:
            rank.reason = reason
        if self.root is None and self.ending is None and (abort or self.job.keep_going):
            self.root = rank
            self.root_code = code
        if abort and self.ending is None:
            self.ending = "failure"
            self._tell_cluster(code, self._summary(rank).split("\n", 1)[0][len("mslaunch: "):])
            self._terminate()

    def _tell_cluster(self, code: int, message: str) -> None:
        if self.cluster is not None:
            self.cluster.failed(code, message)

    def remote_stop(self, code: int, message: str) -> None:
        """Another node (or the node service) ends the job: stop here too, with ``code``."""
        if self.ending is not None:
            return
        self.ending = "remote"
        self.remote = (code, message)
        if not self.job.quiet:
            self.console.message(f"mslaunch: {message}; stopping this node's processes")
        self._terminate()

    def _terminate(self) -> None:
        self._signal_all(signal.SIGCONT)
        self._signal_all(signal.SIGTERM)
        self._arm_kill()

    def _signal_all(self, sig: int) -> None:
        if self.local is not None:
            self.local.signal(sig)
        for host in self.hosts.values():
            host.signal(sig)

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
            self.console.give_up()

    def _finished(self) -> bool:
        if self.local is not None and self.local.busy:
            return False
        if any(h.busy for h in self.hosts.values()):
            return False
        if not all(o.finished for r in self.ranks for o in r.outputs):
            return False
        return not self.console.pending

    # -- end --------------------------------------------------------------
    def _cleanup(self) -> None:
        for conn in getattr(self, "_conns", {}).values():
            _let_go(conn)         # agents started but never given their ranks
        for host in self.hosts.values():
            host.say_bye()
        if self.stdin_fanout is not None:
            self.stdin_fanout.close()
        if self.local is not None:
            self.local.close(self.job.grace)
        deadline = time.monotonic() + self.job.grace + 2.0
        for host in self.hosts.values():
            host.close(deadline)
        if self.listener is not None:
            self.listener.close()
        if self.mpi_jobs is not None:
            if os.environ.get("MSLAUNCH_PMI_STATS"):
                self.console.message(
                    f"mslaunch: PMI: {self.mpi_jobs.stats(len(self.ranks))} "
                    f"(job {time.monotonic() - self.started:.3f} s)")
            self.mpi_jobs.close()
        if self.watchdog is not None:
            self.watchdog.close()
        if self.console.dropped:
            self.console.message(f"mslaunch: {self.console.dropped} byte(s) of rank output were "
                                 f"not delivered: the terminal was not being read when the "
                                 f"job was stopped")

    def _result(self) -> JobResult:
        results = tuple(r.result() for r in self.ranks)
        if self.root is not None:
            root = results[self.root.spec.key]
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
        if self.ending == "remote" and self.remote is not None:
            return JobResult(exit_code=self.remote[0], ranks=results)
        return JobResult(exit_code=0, ranks=results)

    def _summary(self, rank: _Rank) -> str:
        spec = rank.spec
        job = f" of spawned job {spec.job}" if spec.job != 1 else ""
        name = spec.label or f"rank {spec.rank}{job}"
        who = f"{name} (pid {rank.pid or '?'} on {spec.host.name})"
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
            kind = "process(es)" if spec.label else "rank(s)"
            head = f"mslaunch: {who} {what}; terminated the job" + \
                (f" ({others} other {kind})" if others else "")
        tail = rank.tail
        lines = tail.decode("utf-8", "replace").rstrip("\n").split("\n")[-10:]
        if tail.strip():
            stream = "stdout+stderr" if self.job.output.merge_stderr else "stderr"
            whose = f"{spec.label}'s log" if spec.label else f"rank {spec.rank}'s {stream}"
            head += f"\nmslaunch: last lines of {whose}:\n" + \
                "\n".join("    " + line for line in lines)
        return head


def _let_go(conn) -> None:
    """Send an agent that will get no ranks away: ``BYE`` (it exits 0), then close.

    Only cutting the link would make it exit 1, and under Slurm that ends
    every other agent of the step (srun runs them with ``--kill-on-bad-exit``)."""
    from ..remote import link
    try:
        os.write(conn.fd, link.encode(link.BYE))
    except OSError:
        pass
    conn.close()


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


def _noop(signum, frame) -> None:
    # The wakeup fd carries the signal number to the loop; before the loop
    # runs (remote hosts connecting) it is noted here too.
    if signum in _STOPPING:
        _pending_stop.append(signum)


def _stop_requested() -> bool:
    return bool(_pending_stop)
