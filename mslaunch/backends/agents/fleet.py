"""The remote hosts of a job: their agents, brought up before any rank starts.

A :class:`Fleet` starts an agent on every remote host through the job's
starter (:mod:`mslaunch.backends.agents.starters.starter`: paramiko's SSH or srun, chosen once),
plans the job again once with the topologies the agents report, sends away
the agents the final plan leaves without ranks, hands the others their
ranks in a job frame (:mod:`mslaunch.wire.jobframe`), opens the listener
the agents dial back to with their ranks' output, and relays the launcher's
stdin to remote ranks.  Imported only by jobs with remote hosts.

The fleet is what the hosts (:class:`~mslaunch.backends.agents.host.RemoteHost`) report
to; the policy stays with the supervisor, which hears of ranks started and
ended, and of ranks lost with a host, through its rank events
(:class:`~mslaunch.seams.RankEvents`).  Each host feeds and finishes its own
ranks' output sinks.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Sequence

    from .spares import Spares

    from ...wire.dialback import Listener
    from .host import RemoteHost, RemoteStdin
    from .starters.starter import Starter
    from ...core.spec import RankSpec
    from .keptagents import KeptAgents
    from ...machine.stdin import StdinFanout
    from ...seams import RankHandle
    from ..backend import LaunchView

from ...core.states import PMI, READY
from ...core.errors import HOST_LOST_EXIT, HostsFailed, LaunchError
from ...machine.spawn import signal_name
from ...plan import agent_hosts
from .starters.starter import let_go


def _warm_up(pmi: bool) -> None:
    """Import now what the job needs once every agent has said hello: the
    agents are on their way (srun's step) and this process would only wait."""
    from ...machine import stdin  # noqa: F401
    from ...plan import display  # noqa: F401
    if pmi:
        from ...serve import mpijobs  # noqa: F401
        from ...mpi.pmi import singletons  # noqa: F401


class Fleet:
    """See the module docstring; ``view`` is what the supervisor lends it."""

    def __init__(self, view: LaunchView, kept: Optional[KeptAgents] = None) -> None:
        self.view = view
        self.events = view.events             # where the hosts' ranks are reported
        self.cancelled = view.stop_requested  # a stop signal came while connecting
        self.kept = kept                      # agents waiting between attempts, if any
        self.hosts: Dict[str, RemoteHost] = {}
        self.conns: Dict[str, Any] = {}       # started, not yet handed their ranks
        self.listener: Optional[Listener] = None
        self.start_error: Optional[tuple] = None
        self.plain_link = False               # the agents' links are plain TCP (srun)
        self._stdin: Dict[int, RemoteStdin] = {}
        #: Hosts the job goes on without, and why: spares that could not be started
        #: or were lost before the ranks started (the job never needed them).
        self.left_out: Dict[str, str] = {}
        #: Hosts with ranks lost before the ranks started (their own fault).
        self.lost_early: Dict[str, str] = {}
        #: What hosts said while getting ready, by text (None: say it at once).
        self._said: Optional[Dict[str, List[str]]] = None
        #: Every handle of the job, as the supervisor holds them: this machine's
        #: ranks' (if any, first), then the hosts', growing by the spares that
        #: answer after the start (see :meth:`start_spares`).
        self.handles: List[RankHandle] = []
        self._spares: List[Spares] = []
        self._late: set = set()               # spares that joined since the start
        self._settings: Optional[tuple] = None

    # -- bringing the hosts up ---------------------------------------------------
    def connect(self, names: List[str], starter: Starter, replan) -> None:
        """Start an agent on every host of ``names`` with ``starter``; plan again
        with their topologies (``replan``, or None: the plan stands).  Agents of
        hosts the final plan does not use are sent away at once."""
        from ...machine import timeline
        view = self.view
        job = view.job
        if job.verbose >= 2:
            timeline.print_when_ranks_start(view.console.message)
        timeline.mark("starting the agents")
        if starter.begun:
            _warm_up(job.mpi == PMI)
        timeline.watch(names, view.console.status if not job.quiet else (lambda text: None),
                       starter.first_phase, in_place=view.console.status_in_place())
        answers = view.answer_while_starting(timeline.status)
        try:
            conns = self._start_agents(starter, names, replan is None)
        finally:
            if answers is not None:
                answers.close()
            timeline.unwatch()
        self.plain_link = starter.plain_link
        self.conns = conns
        if job.verbose:
            for name in sorted(conns):
                view.console.message(f"mslaunch: {name}: agent "
                                    f"{conns[name].hello.get('package') or 'started'}")
        timeline.mark("every agent said hello")
        if replan is not None:
            from ...core.cputopo import from_wire
            topologies = {}
            for name, conn in conns.items():
                try:
                    topologies[name] = from_wire(conn.hello.get("topology"))
                except ValueError:
                    pass      # the agent's host could not tell; assume one socket
            try:
                view.replanned(replan(topologies))
            except BaseException:
                self.let_go_all()
                raise
        used = set(agent_hosts(view.plan, job))
        for name in [n for n in conns if n not in used]:
            self._let_go(conns.pop(name))

    def _start_agents(self, starter: Starter, names: List[str],
                      final: bool) -> Dict[str, Any]:
        """An agent on every host of ``names`` that ``starter`` can start.  A host
        that cannot be started and gets no rank of the job (``final``: the plan
        stands) is left out, with one line, as Hydra starts only the hosts it
        needs; any other failure is the job's (HostsFailed)."""
        view = self.view
        say = view.console.message if view.job.verbose else None
        ranked = {r.host.name for r in view.plan.ranks} if final else set(names)
        conns: Dict[str, Any] = {}
        wanted = list(names)
        while True:
            try:
                conns.update(starter.start([n for n in wanted if n not in conns],
                                           cancelled=self.cancelled, say=say))
                return conns
            except HostsFailed as err:
                conns.update(err.started)
                err.started = {}
                if ranked & set(err.failed):
                    for conn in conns.values():
                        let_go(conn)
                    raise
                failed = err.failed
            self._leave_out(failed)
            wanted = [n for n in wanted if n not in failed]

    def _leave_out(self, failed: Dict[str, str]) -> None:
        """Hosts of no rank whose agents could not be started, with why: one line each why."""
        if not failed:
            return
        from ...hosts.ranges import host_ranges
        for why, hosts in _by_reason(failed).items():
            if not self.view.job.quiet:
                self.view.console.message(f"mslaunch: {host_ranges(hosts)}: cannot start the "
                                         f"agent ({why}); no rank goes there, so the job goes "
                                         f"on without {'it' if len(hosts) == 1 else 'them'}")
        self.left_out.update(failed)

    def prepare(self, remote_specs: Dict[str, List[RankSpec]]) -> None:
        """Hand the agents their ranks; wait until every host is ready.

        Nothing starts anywhere unless every host is ready: a missing program
        on one host is reported before any rank runs.
        """
        view = self.view
        job, conns = view.job, self.conns
        for name in conns:
            remote_specs.setdefault(name, [])     # spare hosts, for spawned jobs
        from ...machine import timeline
        timeline.mark("sending the agents their ranks")
        self._output_listener()
        for name, specs in remote_specs.items():
            # (a host whose ranks' output files cannot be made is not made: its
            # agent stays with the others, which are let go with the failure)
            self._hand(name, conns[name], specs)
            del conns[name]
        self._said = {}
        try:
            # Spare hosts (no rank) do not hold the start up: one that is ready
            # later starts then (host_ready).
            view.loop.run_until(lambda: self.start_error is not None or view.ending is not None
                               or all(h.state == READY or not h.ranks
                                      for h in self.hosts.values()))
        finally:
            self._say_grouped()
        if self.start_error is not None:
            message, code = self.start_error
            if self.lost_early and job.max_job_restarts:
                # A job that may start again goes on without the host: the agents
                # that are ready wait for the job's start on the hosts left.
                self.keep_hosts()
                raise HostsFailed(message, self.lost_early, unreachable=list(self.lost_early),
                                  exit_code=code)
            raise LaunchError(message, code)
        if view.ending is not None:
            stop = view.stop_signal or 15
            raise LaunchError(f"stopped by {signal_name(stop)} while the remote hosts were "
                              f"starting", 128 + stop)

    def _hand(self, name: str, conn: Any, specs: List[RankSpec]) -> None:
        """Host ``name`` of agent ``conn``, handed its ranks ``specs`` (none: a spare)."""
        from .host import RemoteHost
        from ...wire.jobframe import job_frame
        view, listener = self.view, self.listener
        job = view.job
        heartbeat, pmi = self._frame_settings()
        host = RemoteHost(view.loop, conn, specs, self, self.events.make_sinks,
                          pmi_port=job.pmi_port, verbose=job.verbose)
        self.hosts[name] = host
        self.handles.append(host)
        frame = job_frame(job, view.plan, name, specs, heartbeat, pmi,
                          view.mpi_jobs.universe() if view.mpi_jobs else -1)
        port = listener.port_of(conn.local_address or "") if listener else None
        if listener is not None and port is not None:
            from ...wire.dialback import new_token
            token = new_token()
            listener.expect(token, host.attach_output)
            frame["data"] = {"addresses": [conn.local_address], "port": port,
                             "token": token,
                             "cert": listener.cert_pem and listener.cert_pem.decode()}
        host.prepare(frame)

    def _frame_settings(self) -> tuple:
        """The heartbeat and PMI way every host's job frame gives, read once."""
        if self._settings is None:
            from ...wire.endpoint import HEARTBEAT, RESTART_HEARTBEAT, heartbeat_setting
            job = self.view.job
            # (the kept agents' is the job's, its health check's included)
            heartbeat = self.kept.heartbeat if self.kept is not None else heartbeat_setting(
                os.environ.get("MSLAUNCH_HEARTBEAT"),
                RESTART_HEARTBEAT if job.max_job_restarts else HEARTBEAT)
            self._settings = (heartbeat, None if job.mpi != PMI else
                              ("port" if job.pmi_port else "fd"))
        return self._settings

    # -- spares started beside the job -------------------------------------------
    def start_spares(self, names: List[str], starter: Starter,
                     carried: Sequence[Spares] = ()) -> None:
        """Start the agents of the spare hosts ``names`` (no rank in this attempt)
        in a thread, while the job starts without them: a spare that does not
        answer (its sshd stopped, its link down) never delays the start.  Each
        joins once it answers and the ranks have started (:meth:`watch_spares`),
        standing by for spawned jobs and, kept, for the next attempt; one that
        cannot be started is left out with one line.  ``carried``: spares still
        starting when the attempt before ended, which join this one the same way."""
        from .spares import Spares
        self._spares = list(carried)
        if names:
            self._spares.append(Spares(starter, names, self.cancelled))

    def watch_spares(self) -> None:
        """The ranks have started: the spares join as they answer."""
        from functools import partial
        for spares in self._spares:
            spares.watch(self.view.loop, partial(self._spares_answered, spares))

    def _spares_answered(self, spares: Spares) -> None:
        self._spares.remove(spares)
        for name, conn in spares.finish().items():
            if self.view.ending is None:
                self._late.add(name)
                self._hand(name, conn, [])
            else:
                if self.kept is not None and self.view.job.verbose:
                    self.view.console.message(f"mslaunch: {name}: agent started as the job "
                                             f"stopped (a spare host: kept for the next attempt)")
                self._let_go(conn)
        if spares.failed:
            self._leave_out(spares.failed)

    def _output_listener(self) -> Any:
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
        from ...wire.dialback import Listener, direct_output, output_tls
        if not direct_output():
            return None
        addresses = [c.local_address for c in self.conns.values() if c.local_address]
        if not addresses:
            return None
        view = self.view
        try:
            self.listener = Listener(view.loop, addresses, tls=output_tls() and not self.plain_link,
                                     log=self.events.log, port_range=view.job.port_range)
        except Exception as err:   # no cryptography, no ssl: the SSH channel will do
            if view.job.verbose:
                view.console.message(f"mslaunch: output stays in the SSH channels ({err})")
            return None
        return self.listener

    # -- what the hosts report (mslaunch.backends.agents.host.HostListener) -------------------
    def rank_started(self, key: int, pid: int) -> None:
        self.events.rank_started(key, pid)

    def rank_exited(self, key: int, code: Optional[int], sig: Optional[int],
                    at: Optional[float] = None) -> None:
        self.events.rank_exited(key, code, sig, at)

    def host_ready(self, host: RemoteHost) -> None:
        """A spare host that got ready after the job started starts too."""
        if self.view.launched:
            host.start()
            if host.name in self._late and self.view.job.verbose:
                self.view.console.message(f"mslaunch: {host.name}: agent started beside the "
                                         f"job (a spare host: no rank goes there)")

    def host_paused(self, host: RemoteHost) -> None:
        self.view.host_paused(host.name)

    def host_failed(self, host: RemoteHost, message: str, code: object) -> None:
        """A host could not get ready: the launch fails with ``message``."""
        if self.start_error is None:
            self.start_error = (f"on {host.name}: {message}",
                                code if isinstance(code, int) and 0 < code < 256 else 1)

    def host_message(self, host: RemoteHost, text: str) -> None:
        if self.view.job.quiet:
            return
        if self._said is not None:          # hosts that say the same are named once
            self._said.setdefault(text, []).append(host.name)
        else:
            self.view.console.message(f"mslaunch: {host.name}: {text}")

    def _say_grouped(self) -> None:
        said, self._said = self._said or {}, None
        if not said:
            return
        from ...hosts.ranges import host_ranges
        for text, names in said.items():
            self.view.console.message(f"mslaunch: {host_ranges(names)}: {text}")

    def host_log(self, host: RemoteHost, text: str) -> None:
        self.events.log(f"{host.name}: {text}")

    def host_lost(self, host: RemoteHost, reason: str) -> None:
        quiet = self.view.job.quiet
        watch = self.view.session.allocation_end
        if watch is not None:        # (a workload manager may have ended the allocation)
            watch.ask(self.view.loop)
        if not self.view.launched:
            if not host.ranks:           # a spare: the job can start without it
                self.left_out[host.name] = reason
                if not quiet:
                    self.view.console.message(f"mslaunch: lost spare host {host.name} before "
                                             f"the job started: {reason}; it is left out")
                return
            if not host.blameless:
                self.lost_early[host.name] = reason
            if self.start_error is None:
                self.start_error = (f"lost host {host.name} before the job started: "
                                    f"{reason}", HOST_LOST_EXIT)
            return
        stopping = self.view.ending is not None
        self.events.ranks_lost(host.ranks, reason, host.lost_at(), host.blameless)
        if quiet:
            return
        if host.blameless:
            self.view.console.message(f"mslaunch: {host.name}: {reason}")
        elif not host.ranks:
            self.view.console.message(f"mslaunch: lost spare host {host.name}: {reason}; it is "
                                     f"left out")
        elif stopping:
            # After the failure that stops the job, which its summary names: a
            # consequence, or at least later news, not the cause.
            self.view.console.message(f"mslaunch: lost host {host.name} while the job was "
                                     f"stopping: {reason}")
        else:
            self.view.console.message(f"mslaunch: lost host {host.name}: {reason}")

    def pmi_from_agent(self, host: RemoteHost, message: Dict[str, Any]) -> None:
        """PMI traffic of a remote host's ranks (see :class:`~mslaunch.serve.mpijobs.MPIJobs`)."""
        if self.view.mpi_jobs is None:
            from ...wire import link
            raise link.LinkError("PMI frame in a job without PMI")
        self.view.mpi_jobs.from_agent(host, message)

    # -- stdin --------------------------------------------------------------------
    def relay_stdin(self, local_pipes: Dict[int, int]) -> Optional[StdinFanout]:
        """The launcher's stdin to the ranks that read it, here (``local_pipes``) and
        on the hosts; returns the fan-out, or None when no rank reads stdin (or no
        host is left: this machine's ranks then read it themselves)."""
        if not self.hosts:
            return None
        from .host import RemoteStdin
        sinks: Dict[int, Any] = dict(local_pipes)
        for host in self.hosts.values():
            for spec in host.specs:
                if spec.stdin != "null":
                    sinks[spec.key] = self._stdin[spec.key] = RemoteStdin(host, spec.key)
        if not sinks:
            return None
        from ...machine.stdin import StdinFanout
        fanout = StdinFanout(self.view.loop, 0, sinks)
        for sink in self._stdin.values():
            sink.fanout = fanout
        return fanout

    def stdin_taken(self, host: RemoteHost, rank: int, count: int) -> None:
        sink = self._stdin.get(rank)
        if sink is not None:
            sink.taken(count)

    # -- end ----------------------------------------------------------------------
    def _let_go(self, conn) -> None:
        kept = self.kept
        if kept is not None:
            kept.put(conn, fresh=True)     # a spare host's agent, for a later attempt
        else:
            let_go(conn)

    def let_go(self, keep: bool) -> None:
        """Before the handles are released (see :class:`~mslaunch.seams.RemoteHosts`):
        ``keep``, the agents whose ranks have all ended wait for the next attempt."""
        if keep:
            self.keep_hosts()
        self.let_go_all()

    def let_go_all(self) -> None:
        """Agents started but never given their ranks go (or wait for the next attempt)."""
        for conn in self.conns.values():
            self._let_go(conn)
        self.conns = {}
        spares, self._spares = self._spares, []
        for starting in spares:
            for conn in starting.halt().values():
                self._let_go(conn)

    def keep_hosts(self) -> None:
        """The job starts again: the agents of hosts whose ranks have all ended wait
        for the next attempt rather than exit."""
        kept = self.kept
        if kept is None:
            return
        from .keptagents import IDLE
        for host in self.hosts.values():
            if host.keep(IDLE):
                kept.put(host.conn)
        # Spares still starting go on starting, for the next attempt.
        for spares in self._spares:
            spares.unwatch()
        kept.starting += self._spares
        self._spares = []

    def close_listener(self) -> None:
        if self.listener is not None:
            self.listener.close()


def _by_reason(failed: Dict[str, str]) -> Dict[str, List[str]]:
    """The hosts of ``failed`` grouped by why."""
    groups: Dict[str, List[str]] = {}
    for name, why in failed.items():
        groups.setdefault(why, []).append(name)
    return groups
