"""The agent: runs one host's ranks for a launcher on another machine.

It is started over SSH (see :mod:`mslaunch.backends.agents.bootstrap`), needs nothing on the host
but Python, and talks to the launcher over its stdin and stdout (see
:mod:`mslaunch.wire.link`).  Its life:

1. write the link's start mark and ``HELLO`` (protocol, host name, Python);
2. on ``JOB``: build this host's ranks -- environment on top of the login
   environment (or as the launcher forwards it), working directory (the
   launcher's when it exists here, else the home directory, with a warning),
   programs found with the ranks' own ``PATH`` -- and answer ``READY``, or
   ``ERROR`` with the first problem;
3. on ``START``: start the ranks as the launcher would locally
   (:class:`~mslaunch.machine.local.LocalRanks`: own process groups, pipes, a
   job cgroup or subreaper, the watchdog), serve them PMI over inherited
   sockets with the job-wide part relayed to the launcher
   (:class:`~mslaunch.mpi.pmi.state.RelayJobState`), send their output as
   ``OUTPUT`` frames within the credit the launcher grants, and their exits;
4. deliver ``SIGNAL`` frames to rank process groups and ``STDIN`` to the
   ranks that read the launcher's stdin;
5. when every rank has ended (and every stream and rank group with it),
   send ``DONE``; on ``BYE`` stop what is left and exit.  On ``NEXT`` instead
   (a job started again, ``--max-restarts``), forget the job and wait for the
   next ``JOB`` on the same link; an agent left waiting longer than ``NEXT``
   says exits.

If the link ends (end-of-file: the launcher died, the SSH connection
dropped) or the launcher falls silent for longer than the heartbeat allows
(a partition sends no end-of-file), every rank of this host is stopped
(SIGCONT and SIGTERM, SIGKILL after the grace period) before the agent
exits.  If the agent itself is killed, its watchdog does the same.

The streams (output sinks, credit, the stdin relay) are :mod:`.agentio`'s,
the PMI side :mod:`mslaunch.serve.agentpmi`'s.
"""

from __future__ import annotations

import os
from ..core import signal
from ..core import socket
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Optional, Set, Tuple

    from ..mpi.pmix.host import PMIxHost

from ..core.errors import LaunchError
from ..machine.guard import Watchdog
from ..machine.local import LocalRanks, python_program
from ..machine.loop import Loop
from ..machine.spawn import check_startable, seal_inherited_fds
from ..core.spec import RankSpec, replace, scrub_env
from ..wire import frames, link
from ..wire.endpoint import Endpoint
from ..mpi.pmi.files import is_kvsname
from .agentio import LinkOutput, Outflow, StdinRelay
from .agentlook import AgentLook
from ..serve.agentpmi import AgentPMI
from ..wire.jobframe import read_job, read_spawned

_STOPPING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _warm_up() -> None:
    """Import what the job's start needs (its output connection, PMI and the door
    of PMIx, pseudo-terminals, the Python ranks' hook) while the launcher answers
    the greeting: this host would only wait."""
    import termios  # noqa: F401

    from ..machine import pydump, trees  # noqa: F401
    from ..mpi.pmi import mcaparams, server, singletons  # noqa: F401
    from ..mpi.pmix import door, fabric, host, layout, template  # noqa: F401
    from ..wire import dialback  # noqa: F401


class Agent:
    """One host's part of a job; see the module docstring."""

    def __init__(self, in_fd: int, out_fd: int, job: str, guard: Optional[Watchdog],
                 new_guard: Callable[[str, float], Watchdog]) -> None:
        """``guard``: the host's guard for ``job``, begun before the agent's
        import (see :mod:`.agentmain`); ``new_guard(kvsname, grace)`` makes one."""
        self.loop = Loop()
        self.endpoint = Endpoint(self.loop, in_fd, out_fd, on_frame=self._on_frame,
                                 on_closed=self._link_closed)
        self.endpoint.farewell = lambda silent: frames.encode(
            frames.Gone(silent=max(0.01, round(silent, 2))))
        self.in_fd, self.out_fd = in_fd, out_fd
        self._fresh_job()
        self.guard: Optional[Watchdog] = guard
        self._new_guard = new_guard
        self.finished = False
        self.waiting = False          # told NEXT: waits for a next job, runs nothing
        self.grace = 5.0
        self.reason = ""
        self.preloaded: List[str] = []
        # The job's name from the greeting ("" if none or not a name): the guard's.
        self.named = job if is_kvsname(job) else ""

    def _fresh_job(self, pmix: Optional[PMIxHost] = None) -> None:
        """What belongs to one job, new (at the start, and on NEXT with ``pmix``, the
        retired server of the job before, which its library cannot start twice)."""
        # Ranks' output goes to the link itself, or a connection of its own.
        self.output = Outflow(self.loop, self.endpoint)
        self.stdin = StdinRelay(self.loop, self.endpoint)
        self.pmi = AgentPMI(self.loop, self.endpoint, on_job=self._spawned, pmix=pmix)
        self.look = AgentLook(self.loop, self.endpoint)      # STACKS and TOP
        self.job: Dict[str, Any] = {}
        self.specs: List[RankSpec] = []
        self.local: Optional[LocalRanks] = None
        self.exited: Set[int] = set()
        self.done_sent = False

    # -- life -----------------------------------------------------------------
    def run(self) -> int:
        for sig in _STOPPING:
            signal.signal(sig, self._on_stop_signal)
        try:
            if self.named and self.guard is None:
                # The guard's cgroup takes the kernel 5 to 20 ms to enter: made
                # before the greeting, it is ready by the time the ranks start.
                self.guard = self._new_guard(self.named, self.grace)
            from ..core.cputopo import to_wire
            from ..machine.topology import cached_topology
            self.endpoint.send(link.SYNC + link.encode(link.HELLO, {
                "protocol": link.PROTOCOL, "host": socket.gethostname(), "pid": os.getpid(),
                "python": sys.version.split()[0], "topology": to_wire(cached_topology())}))
            _warm_up()
            self.loop.run_until(lambda: self.finished)
        finally:
            self._shutdown()
        return 0 if not self.reason else 1

    def _on_stop_signal(self, signum, frame) -> None:
        # Someone stopped the agent itself: end the ranks, then exit.
        self.reason = self.reason or f"agent stopped by signal {signum}"
        self.finished = True

    def _link_closed(self, reason: str) -> None:
        if self.finished:
            return
        self.finished = True
        if self.waiting:
            # An exit of 0, as on BYE: a waiting agent has no ranks, so nothing
            # failed on this host.
            try:
                sys.stderr.write(f"mslaunch agent on {socket.gethostname()}: no next job "
                                 f"came: {reason}\n")
            except (OSError, ValueError):
                pass
            return
        self.reason = self.reason or f"lost the launcher: {reason}"

    def _output_closed(self, reason: str) -> None:
        # Before the ranks start and once they have all ended, the output connection
        # has nothing to carry: the launcher may close it (a job kept for its next
        # attempt, on NEXT, which may come after), and only the link itself says
        # whether the launcher is still there.
        if self.local is not None and not self.done_sent:
            self._link_closed(reason or "its output connection was closed")

    def _live_pids(self) -> List[int]:
        return [r.proc.pid for r in (self.local.ranks.values() if self.local else ())
                if r.proc is not None and not r.ended]

    def _shutdown(self) -> None:
        if self.local is not None:
            self.pmi.stopping(self._live_pids())
            self.local.close(time.monotonic() + self.grace)
        self.look.close()
        self.pmi.close()
        if self.guard is not None:
            self.guard.close()
        self._unlink_preloaded()
        if self.reason:
            try:
                sys.stderr.write(f"mslaunch agent on {socket.gethostname()}: {self.reason}\n")
                sys.stderr.flush()
            except (OSError, ValueError):
                pass
        for end in {self.output.link, self.endpoint}:
            if not end.closed:
                end.flush(time.monotonic() + 2.0)
        if self.output.link is not self.endpoint:
            self.output.link.close("")
        self.loop.close()

    def _unlink_preloaded(self) -> None:
        from ..machine.osfiles import unlink_quietly
        for path in self.preloaded:
            unlink_quietly(path)
        self.preloaded = []

    def fail(self, message: str, code: int = 1) -> None:
        """Report a problem that ends this host's part of the job."""
        self.endpoint.send(frames.encode(frames.Error(message=message, code=code)))

    # -- frames from the launcher ------------------------------------------------
    def _on_frame(self, kind: int, body: bytes) -> None:
        if kind == link.BEAT:
            return
        if kind == link.OUTPUT:
            raise link.LinkError("OUTPUT frames go the other way")
        if kind == link.STDIN:
            rank, _, data = link.decode_binary(body)
            self.stdin.feed(rank, data)
            return
        if kind == link.JOB:
            self._prepare(link.decode_json(kind, body))
            return
        frame = frames.from_launcher(kind, body)
        if isinstance(frame, frames.Signal):
            self._signal(frame)
        elif isinstance(frame, frames.Credit):
            self.output.grant(frame.bytes)
        elif isinstance(frame, frames.Unwanted):
            if self.local is not None:
                self.local.abandon(frame.rank, frame.stream)
        elif isinstance(frame, frames.Pmi):
            self.pmi.from_launcher(frame.message)
        elif isinstance(frame, frames.Next):
            self._next(frame.idle, frame.heartbeat)
        elif isinstance(frame, frames.Look):
            self.look.on_frame(frame, {
                r.spec.key: r.proc.pid for r in (self.local.ranks.values() if self.local else ())
                if r.proc is not None and not r.ended})
        elif isinstance(frame, frames.Bare) and frame.kind == link.START:
            self._start()
        else:                       # BYE
            self.finished = True

    def _signal(self, frame: frames.Signal) -> None:
        sig, ranks = frame.sig, frame.ranks
        if ranks is None and sig == signal.SIGCONT:
            self.endpoint.pause_watch(False)
        if self.local is not None and sig < 65:
            if sig == signal.SIGTERM and ranks is None:
                self.local.catch_up()
                self.pmi.stopping(self._live_pids())
            self.local.signal(sig, ranks)
        if ranks is None and sig == signal.SIGTSTP:
            # The launcher stops (a Ctrl-Z): its silence means nothing until it
            # says it goes on; it waits for this answer before it stops.
            self.endpoint.pause_watch()
            self.endpoint.send(frames.encode(frames.Bare(link.PAUSED)))

    # -- NEXT: kept for the job's next attempt -----------------------------------
    def _next(self, idle: float, beat: Optional[Tuple[float, int]]) -> None:
        """Forget a job whose ranks have all ended, or that never started (or wait
        for a first one: a spare host's agent); keep the link, the guard (whose
        marker names this agent's directories) and this host's PMIx server (its
        library cannot start twice in one process).  While it waits, the agent
        beats as its job did (or as ``beat`` says) and exits once the launcher has
        been silent for ``idle`` s: a spare host is watched, and watches."""
        if not 0 < idle <= 3600 or (self.local is not None and not self.done_sent):
            raise link.LinkError("NEXT while ranks run, or without a wait")
        if self.local is not None:
            self.local.close(time.monotonic() + self.grace)
        if self.guard is not None:
            # What the ranks left (detached from their groups and pipes) goes now,
            # as a guard's close would take it: nothing of one attempt meets the next.
            for pid in self.guard.leftovers():
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        self.look.close()
        pmix = self.pmi.close(keep_pmix=True)
        self._unlink_preloaded()
        if self.output.link is not self.endpoint:
            self.output.link.flush(time.monotonic() + 2.0)
            self.output.link.close("")
        if self.job:
            interval, misses = self.job["heartbeat"]
        else:
            interval, misses = beat if beat is not None else (1.0, 5)
        self._fresh_job(pmix)
        self.waiting = True
        self.endpoint.start_heartbeat(float(interval), int(misses), patience=idle)

    # -- JOB: this host's ranks ---------------------------------------------------
    def _prepare(self, body: Dict[str, Any]) -> None:
        got = time.time()           # for the launcher's reading of this host's clock
        if self.job:
            raise link.LinkError("a second JOB frame")
        self.job = job = read_job(body, socket.gethostname())
        self.waiting = False
        self.grace = job["grace"]
        self.output.credit = job["credit"]
        self.endpoint.start_heartbeat(*job["heartbeat"])
        self.specs = [self._spec(spec) for spec in job["ranks"]]
        if self.guard is not None:
            # Made at the greeting, or kept from this agent's first job: one guard,
            # and one cgroup, for the agent's whole life (a second guard's cgroup
            # would be made inside the first's, which its end empties).
            self.guard.set_grace(self.grace)
        else:
            self.guard = self._new_guard(job["kvsname"], self.grace)
        self.pmi.guard = self.guard
        self.pmi.trace = bool(job.get("trace"))
        self.pmi.port_range = job["port_range"]
        warnings = self._fix_cwd()
        from ..machine.samepython import same_programs
        self.specs, notes, more = same_programs(self.specs, job["here"])
        warnings += more
        try:
            self._preload(job["files"])
            check_startable(self.specs)
        except LaunchError as err:
            self.fail(str(err), err.exit_code)
            return
        direct = self._dial_back(job["data"])
        self.endpoint.send(frames.encode(frames.Ready(
            warnings=tuple(warnings), notes=tuple(notes), clock=[got, time.time()],
            direct=direct)))

    def _dial_back(self, data: Optional[Dict[str, Any]]) -> bool:
        """Open the connection of its own for output, when the launcher offers one."""
        if not isinstance(data, dict):
            return False
        from ..wire.dialback import dial
        from ..wire.endpoint import SocketEndpoint
        addresses, port = data.get("addresses"), data.get("port")
        token, cert = data.get("token"), data.get("cert")
        if not (isinstance(addresses, list) and all(isinstance(a, str) for a in addresses)
                and isinstance(port, int) and 0 < port < 65536 and isinstance(token, str)
                and token.isascii() and (cert is None or isinstance(cert, str))):
            raise link.LinkError("JOB: data is not {addresses, port, token, cert}")
        try:
            sock = dial(addresses, port, token, cert)
        except ValueError as err:
            raise link.LinkError(f"JOB: data: {err}") from None
        if sock is None:
            return False

        def refuse(kind: int, body: bytes) -> None:
            raise link.LinkError("the output connection carries nothing inward")

        self.output.link = SocketEndpoint(self.loop, sock, on_frame=refuse,
                                          on_closed=self._output_closed)
        self.output.lines = cert is None
        return True

    def _spec(self, spec: RankSpec) -> RankSpec:
        """A rank as the frame sent it, with its whole environment composed here."""
        env = scrub_env(os.environ) if spec.inherit == "remote" else {}
        prefix = spec.path_prefix
        if prefix:
            for var, sub in (("PATH", "bin"), ("LD_LIBRARY_PATH", "lib")):
                old = env.get(var)
                env[var] = f"{prefix}/{sub}" + (f":{old}" if old else "")
        env.update(self.job["common_env"])
        env.update(spec.env)
        env.setdefault("PYTHONUNBUFFERED", "1")
        return replace(spec, env=env)

    def _preload(self, files: List[Dict[str, Any]]) -> None:
        """Copy the preloaded files into the ranks' directories (removed at the end)."""
        if not files:
            return
        import base64
        for directory in dict.fromkeys(s.cwd for s in self.specs if not s.session_dir):
            for item in files:
                name = str(item["name"])
                if "/" in name or name in ("", ".", ".."):
                    raise link.LinkError("a preloaded file with a bad name")
                path = os.path.join(directory, name)
                try:
                    data = base64.b64decode(item["data"], validate=True)
                except ValueError:
                    raise link.LinkError("JOB: a preloaded file is not base64") from None
                try:
                    with open(path, "rb") as f:
                        same = f.read(len(data) + 1) == data
                    if same:
                        continue       # already there (a shared file system): leave it be
                    raise LaunchError(f"--preload: {path} on {socket.gethostname()} exists "
                                      f"and differs; not overwritten")
                except FileNotFoundError:
                    pass
                except OSError as err:
                    raise LaunchError(f"--preload: cannot read {path} on "
                                      f"{socket.gethostname()}: {err.strerror}") from None
                try:
                    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL,
                                 int(item["mode"]) & 0o777)
                    with open(fd, "wb") as f:
                        f.write(data)
                except OSError as err:
                    raise LaunchError(f"--preload: cannot write {path} on "
                                      f"{socket.gethostname()}: {err.strerror}") from None
                self.preloaded.append(path)

    def _fix_cwd(self) -> List[str]:
        """The launcher's directory where it exists here; else the home directory."""
        launch_dir = self.job["launch_dir"]
        home = os.path.expanduser("~")
        warnings: List[str] = []
        for i, spec in enumerate(self.specs):
            if spec.cwd == launch_dir and not os.path.isdir(spec.cwd):
                if not warnings:
                    warnings.append(f"working directory {spec.cwd} does not exist here; "
                                    f"ranks start in {home}")
                self.specs[i] = replace(spec, cwd=home)
        return warnings

    # -- START ----------------------------------------------------------------
    def _start(self) -> None:
        if not self.job or self.local is not None:
            raise link.LinkError("START without a JOB, or twice")
        job = self.job
        seal_inherited_fds()
        assert self.guard is not None
        self.guard.keep(job["kvsname"])
        pmi = pmi_env = None
        if job["pmi"]:
            self.pmi.start_probe(self.guard.marker, self.specs)
            self._watch_singletons()
            try:
                pj = self.pmi.new_job(1, job["kvsname"], job, self.specs, None)
            except LaunchError as err:      # no free port of the job's range here
                self.fail(str(err), err.exit_code)
                return
            pmi, pmi_env = pj.inherited, pj.env
        merge = job["merge_stderr"]

        def sinks(spec: RankSpec):
            return (LinkOutput(self.output, spec.key, 1),
                    None if merge else LinkOutput(self.output, spec.key, 2))

        if any(python_program(spec) for spec in self.specs):
            from ..machine.pydump import make_dir
            from ..machine.procs import refused_private
            self.look.dumps = make_dir(self.guard)
            dumps = self.look.dumps
            for why in refused_private():
                self.endpoint.send(frames.encode(frames.Log(message=f"warning: {why}: " + (
                    f"the Python ranks' hook is in {os.path.dirname(dumps)}" if dumps else
                    "its Python ranks are read without their hook"))))
        self.local = LocalRanks(self.loop, self.specs, self, sinks=sinks, guard=self.guard,
                                grace=self.grace, merge_stderr=merge, pmi=pmi,
                                pmi_env=pmi_env, stdin_fd=None, pty=job["pty"],
                                dumps=self.look.dumps)
        self.pmi.local = self.local
        self._started: Dict[int, int] = {}
        try:
            self.local.start()
        except LaunchError as err:
            self.fail(str(err), err.exit_code)
            return
        finally:
            if self._started:
                self.endpoint.send(frames.encode(frames.Started(tuple(self._started.items()))))
        self.stdin.attach(self.local.stdin_pipes)
        self.guard.step_out()
        self.loop.call_later(0.1, self._check_done)

    def _spawned(self, message: Dict[str, Any]) -> None:
        """A job spawned elsewhere has processes here: start them now."""
        job = read_spawned(message, self.job["host"], len(self.job["ranks"]))
        if self.local is None or job["kvs"] in self.pmi.jobs:
            raise link.LinkError("a spawned job before START, or twice")
        specs = [self._spec(spec) for spec in job["ranks"]]
        known = {s.key for s in self.specs}
        if any(s.key in known for s in specs):
            raise link.LinkError("a spawned job reuses a process number")
        self._started = {}
        pj = self.pmi.new_job(job["number"], job["kvs"], job, specs, job["spawner"])
        error = None
        try:
            check_startable(specs)
            self.local.add(specs, pj.inherited, pj.env)
        except LaunchError as err:
            error = str(err)
            # Only what started is this host's to see through; the rest never will.
            for s in specs:
                entry = self.local.ranks.get(s.key)
                if entry is not None and entry.proc is None:
                    del self.local.ranks[s.key]
        finally:
            self.specs += [s for s in specs if s.key in self.local.ranks]
            self.done_sent = False
            if self._started:
                self.endpoint.send(frames.encode(frames.Started(tuple(self._started.items()))))
        self.pmi.up({"op": "spawned", "kvs": job["kvs"], "error": error})
        if self.guard is not None:
            self.guard.step_out()
        self.loop.call_later(0.1, self._check_done)

    # -- LocalRanks listener -----------------------------------------------------
    def rank_started(self, rank: int, pid: int) -> None:
        self._started[rank] = pid

    def _report_singletons(self) -> None:
        """Ranks that started Open MPI alone (see mslaunch.mpi.pmi.singletons): tell the launcher."""
        probe = self.pmi.probe
        if probe is not None:
            from ..mpi.pmi.singletons import runs_a_launcher
            pids = {r.spec.key: r.proc.pid for r in (self.local.ranks.values() if self.local
                                                      else ()) if r.proc is not None}
            for key, size in probe.check():
                nested = size == 1 and key in pids and key not in probe.certain \
                    and runs_a_launcher(pids[key])
                self.pmi.up({"op": "singleton", "rank": key, "size": size,
                             "backing": probe.backing is not None,
                             "launcher": nested, **self.pmi.pmix_said(key)})

    def _watch_singletons(self) -> None:
        self._report_singletons()
        if self.pmi.probe is not None and not self.finished:
            self.loop.call_later(0.5, self._watch_singletons)

    def rank_exited(self, rank: int, code: Optional[int], sig: Optional[int],
                    at: float) -> None:
        self._report_singletons()
        at = self.pmi.before_stop(rank, at)
        self.pmi.exited(rank, code, sig, at)
        self.exited.add(rank)
        self.stdin.drop(rank)
        self.endpoint.send(frames.encode(frames.Exited(rank=rank, code=code, signal=sig,
                                                       at=at,
                                                       stop_at=self.pmi.stop_at)))
        self._check_done()

    def _check_done(self) -> None:
        if self.done_sent or self.local is None:
            return
        if len(self.exited) == len(self.specs) and not self.local.busy:
            self.done_sent = True
            self.endpoint.send(frames.encode(frames.Bare(link.DONE)))
        elif len(self.exited) == len(self.specs):
            self.loop.call_later(0.05, self._check_done)


def main(job: str, guard: Optional[Watchdog],
         new_guard: Callable[[str, float], Watchdog],
         at_end: Callable[[], None] = lambda: None) -> int:
    """Run the agent on this process's stdin and stdout (as the bootstrap does,
    through :func:`.agentmain.begin`); ``job`` is the job's name its greeting
    gave, if any, ``guard`` its guard if begun, ``at_end`` what runs once
    everything is sent (the code cache written, if it should be)."""
    # Nothing else may write to the link: mslaunch's own output goes to stderr.
    link_out = os.dup(1)
    os.dup2(2, 1)
    try:
        code = Agent(0, link_out, job, guard, new_guard).run()
    except KeyboardInterrupt:
        code = 130
    # Everything is closed and sent; tearing the interpreter down would only
    # keep the launcher waiting for the end of the link.
    try:
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    at_end()
    os._exit(code)
