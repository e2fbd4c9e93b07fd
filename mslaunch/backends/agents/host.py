"""The launcher's handle on one remote host: its agent, seen through the link.

A :class:`RemoteHost` sits beside :class:`~mslaunch.machine.local.LocalRanks`
behind the same seam: the supervisor starts, signals and waits for both the
same way, and hears the same events -- ranks started and exited, output to
feed into the ranks' sinks, PMI -- so its policy (abort, timeouts, files,
the summary) is written once.

Output flows under credit: the agent may send ``credit`` bytes of output
before the launcher grants more, and the launcher grants them back only as
the terminal takes them, so a stalled reader of mslaunch's output stops the
ranks on every host (they block in ``write``) while exits, signals and PMI
keep moving on the same link.
"""

from __future__ import annotations

import os
import time
from ...core import signal

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, Optional, Protocol, Sequence, Tuple

    from ...machine.loop import Loop
    from ...machine.output import RankOutput
    from ...machine.stdin import StdinFanout
    from ...core.spec import RankSpec
    from ...core.states import HostState
    from .starters.starter import AgentConnection

    MakeSinks = Callable[[RankSpec], Tuple[RankOutput, Optional[RankOutput]]]

    class HostListener(Protocol):
        """What a host reports to (the job's fleet, which tells the supervisor)."""

        def rank_started(self, key: int, pid: int) -> None: ...

        def rank_exited(self, key: int, code: Optional[int], sig: Optional[int],
                        at: Optional[float] = None) -> None: ...

        def host_message(self, host: RemoteHost, text: str) -> None: ...

        def host_ready(self, host: RemoteHost) -> None: ...

        def host_paused(self, host: RemoteHost) -> None: ...

        def host_failed(self, host: RemoteHost, message: str, code: object) -> None: ...

        def host_lost(self, host: RemoteHost, reason: str) -> None: ...

        def host_log(self, host: RemoteHost, text: str) -> None: ...

        def pmi_from_agent(self, host: RemoteHost, message: Dict[str, Any]) -> None: ...

        def stdin_taken(self, host: RemoteHost, rank: int, count: int) -> None: ...

from ...core.states import DONE, LOST, NEW, PREPARED, READY, RUNNING
from ...wire import frames, link
from ...machine import timeline
from ...wire.endpoint import Endpoint
from ...wire.jobframe import CREDIT


#: Seconds an agent has, past the job's grace period, to stop its ranks and exit.
EXIT_MARGIN = 2.0

#: Frames an agent sends only about started ranks.
_AFTER_START = (link.STARTED, link.EXITED, link.DONE)


class RemoteHost:
    """One remote host of the job; see the module docstring."""

    def __init__(self, loop: Loop, conn: AgentConnection, specs: Sequence[RankSpec],
                 fleet: HostListener, make_sinks: MakeSinks, *, pmi_port: bool = False,
                 verbose: int = 0) -> None:
        self.loop = loop
        self.conn = conn
        self.name = conn.name
        self.specs = list(specs)
        self.ranks = {s.key for s in specs}
        self.fleet = fleet            # what it reports to
        #: Each rank's stdout and stderr sinks (one for both when merged), which
        #: this host feeds, and finishes as its agent reports each stream's end (the
        #: supervisor finishes those of a host lost, or of a spawn abandoned).
        self.make_sinks = make_sinks
        self.sinks = {s.key: make_sinks(s) for s in specs}
        self.pmi_port = pmi_port
        self.verbose = verbose
        self.started_seen = False
        self.state: HostState = NEW   # changed by _become alone
        self.owed = 0                 # output credit not yet returned
        self.exited: set = set()
        self.unwanted: set = set()    # (rank, stream) nobody takes any more, told
        self.stdin_taken: Dict[int, int] = {}
        self.endpoint = Endpoint(loop, conn.fd, conn.fd, on_frame=self._on_frame,
                                 on_closed=self._on_closed)
        #: The host's clock less this one's, read as the job was sent (see
        #: :func:`clock_offset`), to put the times the agent reports on this clock.
        self.clock_offset = 0.0
        self._job_sent = 0.0
        #: When the launcher's stop reached the agent (this clock), once it said so:
        #: what its ranks do after that may be the stop's doing.
        self.stop_reached: Optional[float] = None
        self.output: Optional[Endpoint] = None    # the agent's own output connection
        self._spawns: Dict[str, Any] = {}          # kvsname -> callback(problem)
        self._looks: Dict[int, Any] = {}           # STACKS/TOP id -> callback(ranks)
        self._look_id = 0
        self.kept = False                 # its link handed on to the next attempt (keep)
        #: Lost, but not by its own fault: its agent gave up on this launcher, which
        #: was not running for longer than the heartbeat allows (stopped, starved).
        self.blameless = False
        self.pausing = False              # told SIGTSTP (a Ctrl-Z), its PAUSED awaited
        #: The latest time (this clock) of what the agent reported: a loss of the
        #: host is later than anything it said.
        self.latest = 0.0

    def _become(self, state: HostState) -> None:
        """Every change of the host's state (see :data:`~mslaunch.core.states.HostState`),
        said in ``-v``."""
        if state != self.state:
            if self.verbose:
                self.fleet.host_log(self, f"{self.state} -> {state}")
            self.state = state

    # -- commands -------------------------------------------------------------
    def prepare(self, frame: Dict[str, Any]) -> None:
        interval, misses = frame["heartbeat"]
        self.endpoint.start_heartbeat(interval, misses)
        self._job_sent = time.time()
        self.endpoint.send(link.encode(link.JOB, frame))
        self._become(PREPARED)

    def start(self) -> None:
        if self.state == READY:
            self._become(RUNNING)
            timeline.mark("start sent", self.name)
            self.endpoint.send(frames.encode(frames.Bare(link.START)))

    @property
    def hears_signals(self) -> bool:
        """Its agent has its ranks (started or about to be): a signal reaches them."""
        return self.state in (RUNNING, READY)

    @property
    def at_fault(self) -> bool:
        """Lost by a fault of its own (its agent, its link, its network), not because
        this launcher went unheard: a host to leave out of a new attempt."""
        return self.state == LOST and not self.blameless

    def signal(self, sig: int, ranks: Optional[Sequence[int]] = None) -> None:
        if self.hears_signals:
            if ranks is not None:
                ranks = tuple(r for r in ranks if r in self.ranks)
            else:
                self.pausing = sig == signal.SIGTSTP      # the agent answers PAUSED
            self.endpoint.send(frames.encode(frames.Signal(sig=int(sig), ranks=ranks)))

    def spawn(self, pj, specs: Sequence[RankSpec], mapping: str, done,
              pmix: Optional[Dict[str, Any]] = None) -> None:
        """Start a spawned job's processes on this host; ``done(problem or None)``;
        ``pmix``: the PMIx layout of a job an Open MPI rank spawned."""
        from ...wire.jobframe import spawn_frame
        if self.state not in (RUNNING, DONE) or self.endpoint.closed:
            done(f"host {self.name} is not running")
            return
        sinks = {s.key: self.make_sinks(s) for s in specs}   # (LaunchError: nothing changed)
        self.specs += specs
        self.ranks.update(s.key for s in specs)
        self.sinks.update(sinks)
        self._become(RUNNING)            # busy again until the agent is done anew
        self._spawns[pj.kvsname] = done
        self.send_pmi(dict(spawn_frame(pj.number, pj.kvsname, pj.spawner or "", specs, pj.size,
                                       mapping, [pj.state.appnum(r) for r in range(pj.size)],
                                       pj.state.universe_size, self.pmi_port), **(pmix or {})))

    def look(self, kind: int, body: Dict[str, Any], done) -> bool:
        """Ask the agent for its ranks' stacks (``link.STACKS``) or usage
        (``link.TOP``); ``done(ranks or None)`` when it answers or is lost."""
        if self.state != RUNNING or self.endpoint.closed:
            return False
        self._look_id += 1
        self._looks[self._look_id] = done
        self.endpoint.send(frames.encode(frames.Look(kind=kind, id=self._look_id,
                                                     timeout=body.get("timeout", 10.0),
                                                     main=body.get("main") is True)))
        return True

    def end_singletons(self) -> None:
        """Refused Open MPI singletons: the agent ends its own as the job's stop
        reaches it, noting what they leave (see :mod:`mslaunch.serve.agentpmi`)."""

    def send_pmi(self, message: Dict[str, Any]) -> None:
        self.endpoint.send(link.encode(link.PMI, message))

    def beat_now(self) -> None:
        self.endpoint.beat_now()

    def send_stdin(self, rank: int, data: bytes) -> None:
        self.endpoint.send(link.encode_stdin(rank, data))

    @property
    def busy(self) -> bool:
        # (a spare host not started yet runs nothing to wait for)
        return self.state not in (DONE, LOST) and (self.state == RUNNING or bool(self.ranks))

    def release(self) -> None:
        self.say_bye()

    def keep(self, idle: float) -> bool:
        """The job starts again (``--max-restarts``): when every rank here has ended
        (or none started), its output is all in and the link is sound, tell the
        agent ``NEXT`` (to wait for its next job while this launcher is heard from
        within ``idle`` s) and let go of the link without closing it, for the next
        attempt's handle; True if kept, else it goes as usual."""
        if self.state not in (DONE, READY) or self.endpoint.closed \
                or not self._output_finished():
            return False
        self.endpoint.send(frames.encode(frames.Next(idle=float(idle))))
        clean = self.endpoint.detach(time.monotonic() + 2.0)
        if self.output is not None:
            self.output.close("")
        self.kept = clean
        return clean

    def say_bye(self) -> None:
        """End of the job: the agent stops what is left of its ranks and exits."""
        import time
        if self.kept:
            return
        if not self.endpoint.closed:
            self.endpoint.send(frames.encode(frames.Bare(link.BYE)))
            self.endpoint.flush(time.monotonic() + 2.0)
            if self.state != LOST:
                self._become(DONE)
            self.endpoint.close("")
        if self.output is not None:
            self.output.close("")

    def close(self, deadline: float) -> None:
        """After :meth:`say_bye`: wait for the agent to exit (until ``deadline`` and
        :data:`EXIT_MARGIN` more), then close."""
        import time
        if self.kept:
            return
        self.say_bye()
        deadline += EXIT_MARGIN
        if self.state == LOST:
            deadline = time.monotonic() + 0.5   # nobody to wait for
        self.conn.wait_exit(deadline)
        self.conn.close(wait=max(0.1, deadline - time.monotonic()), gone=self.state == LOST)
        os.close(self.conn.fd)

    def attach_output(self, sock, first: bytes, about: str = "") -> None:
        """The agent dialled back: its ranks' output arrives on ``sock`` from now on
        (``about``, the rest of its token line, says nothing here)."""
        from ...wire.endpoint import InboundTLSEndpoint, SocketEndpoint

        def on_frame(kind: int, body: bytes) -> None:
            if kind == link.LINES:       # read whole: its line ends do not matter here
                rank, stream, _, data = link.decode_lines(body)
                self._output(rank, stream, data)
            elif kind == link.OUTPUT:
                self._output(*link.decode_binary(body))
            else:
                raise link.LinkError(f"{link.NAMES[kind]} frame on the output connection")

        def on_closed(reason: str) -> None:
            if not reason or self.state == LOST or self._output_finished():
                return
            if self.endpoint.closed:
                self._lost_if_cut(reason)
            else:
                self.endpoint.close(f"its output connection: {reason}")

        tls = hasattr(sock, "pending")
        if tls:
            self.output = InboundTLSEndpoint(self.loop, sock, on_frame=on_frame,
                                             on_closed=on_closed)
        elif hasattr(os, "splice"):
            from ...wire.splice import SplicingEndpoint
            self.output = SplicingEndpoint(self.loop, sock, on_frame=on_frame,
                                           on_closed=on_closed, host=self)
        else:
            self.output = SocketEndpoint(self.loop, sock, on_frame=on_frame, on_closed=on_closed)
        if self.verbose:
            self.fleet.host_message(
                self, f"output on a connection of its own ({'TLS' if tls else 'plain TCP'})")
        if first:
            self.output.deliver(first)

    def _output_finished(self) -> bool:
        return all(o is None or o.finished for k in self.ranks for o in self.sinks[k])

    # -- frames from the agent ---------------------------------------------------
    def _on_frame(self, kind: int, body: bytes) -> None:
        if kind == link.OUTPUT:
            self._output(*link.decode_binary(body))
            return
        if kind == link.BEAT:
            return
        frame = frames.from_agent(kind, body)
        if kind in _AFTER_START and self.state != RUNNING:
            raise link.LinkError(f"{link.NAMES[kind]} before START")
        _HANDLERS[type(frame)](self, frame)

    def _ready(self, frame: frames.Ready) -> None:
        if self.state != PREPARED:
            raise link.LinkError("READY before JOB, or twice")
        fleet = self.fleet
        for text in frame.warnings + (frame.notes if self.verbose else ()):
            fleet.host_message(self, text)
        self.clock_offset = clock_offset(self._job_sent, frame.clock, time.time())
        self._become(READY)
        timeline.mark("ready (programs checked)", self.name)
        fleet.host_ready(self)

    def _started(self, frame: frames.Started) -> None:
        if not self.started_seen:
            self.started_seen = True
            timeline.ranks_started(self.name)
        for rank, _ in frame.pids:
            self._check_rank(rank)
        for rank, pid in frame.pids:
            self.fleet.rank_started(rank, pid)

    def _exited(self, frame: frames.Exited) -> None:
        self._check_rank(frame.rank)
        if frame.rank in self.exited:
            raise link.LinkError(f"rank {frame.rank} exited twice")
        self.exited.add(frame.rank)
        self._note_stop(frame.stop_at)
        at = self.local_time(frame.at)
        self.latest = max(self.latest, at)
        self.fleet.rank_exited(frame.rank, frame.code, frame.signal, at)

    def _pmi(self, frame: frames.Pmi) -> None:
        message = frame.message
        if message.get("op") == "spawned":
            done = self._spawns.pop(str(message.get("kvs")), None)
            if done is None:
                raise link.LinkError("PMI spawned: for no spawn")
            error = message.get("error")
            done(str(error)[:300] if error is not None else None)
        else:
            self._note_stop(message.get("stop_at"))
            self.fleet.pmi_from_agent(self, message)

    def _error(self, frame: frames.Error) -> None:
        if self.state in (PREPARED, NEW):
            self._become(LOST)
            self.fleet.host_failed(self, frame.message, frame.code)
        else:
            self.endpoint.close(f"the agent reported: {frame.message}")

    def _looked(self, frame: frames.Looked) -> None:
        done = self._looks.pop(frame.id, None)
        if done is not None:
            done(frame.ranks)

    def _gone(self, frame: frames.Gone) -> None:
        self.blameless = True
        self.endpoint.close(f"mslaunch itself did not run for {frame.silent:.1f} s (stopped "
                            f"or starved): its agent there took it for lost and ended its "
                            f"ranks")

    def _bare(self, frame: frames.Bare) -> None:
        if frame.kind == link.PAUSED:     # the agent heard that this launcher stops
            if not self.pausing:
                raise link.LinkError("PAUSED unasked")
            self.pausing = False
            self.fleet.host_paused(self)
        elif not self._spawns:   # (a DONE sent before the agent heard of a spawn: another comes)
            self._become(DONE)

    def _output(self, rank: int, stream: int, data) -> None:
        sink = self.output_sink(rank, stream)
        if not data:
            sink.finish()
            return
        sink.feed(data)
        self.output_taken(sink, len(data))
        if not sink.wanted and (rank, stream) not in self.unwanted:
            # (mslaunch's stdout closed, ``| head``: the rank is to meet a broken pipe)
            self.unwanted.add((rank, stream))
            self.endpoint.send(frames.encode(frames.Unwanted(rank=rank, stream=stream)))

    def output_sink(self, rank: int, stream: int):
        """Where output of ``rank`` on ``stream`` goes (LinkError if it may not come)."""
        if self.state not in (RUNNING, DONE):
            raise link.LinkError("OUTPUT before START")
        self._check_rank(rank)
        out, err = self.sinks[rank]
        if stream not in (1, 2):
            raise link.LinkError(f"output of rank {rank} on stream {stream}")
        return err or out if stream == 2 else out

    def output_taken(self, sink, count: int) -> None:
        """``count`` bytes of output were passed on: their credit goes back,
        unless the terminal is full (then when it has room)."""
        self.owed += count
        if sink.congested:
            sink.wait_for_room(self)
        elif self.owed >= CREDIT // 4:
            self.resume()

    def _check_rank(self, rank: int) -> None:
        if rank not in self.ranks:
            raise link.LinkError(f"rank {rank} does not run on this host")

    def resume(self) -> None:
        """Return the output credit held back (the terminal takes output again)."""
        if self.owed and not self.endpoint.closed:
            self.endpoint.send(frames.encode(frames.Credit(bytes=self.owed)))
            self.owed = 0

    def _on_closed(self, reason: str) -> None:
        if not reason or self.state == LOST:
            if self.output is not None:
                self.output.close("")
            return
        if self.state == DONE and not self.ranks:
            # A spare (no rank): its agent stands by for spawned jobs and for the
            # job's next attempt; silent or gone, it is lost.
            self._lost(reason)
            return
        if self.state == DONE:
            # Every rank ended; the agent should still be waiting for BYE.
            # Output may yet be on its way on the output connection.
            if self.output is not None and not self.output.closed:
                self.loop.call_later(1.0, lambda: self._lost_if_cut(reason))
            else:
                self._lost_if_cut(reason)
            return
        if self.output is not None:
            self.output.close("")
        self._lost(reason)

    def local_time(self, at: Any) -> float:
        """A time the agent reported (its clock's), on this one's: now if it is not
        a time, and never later than now (the two clocks were read with an error)."""
        now = time.time()
        if type(at) not in (int, float) or not 0 < at < 1e11:
            return now
        return min(at - self.clock_offset, now)

    def _note_stop(self, at: Any) -> None:
        if at is not None and self.stop_reached is None:
            self.stop_reached = self.local_time(at)

    def lost_at(self) -> float:
        """A lost host's end, on this clock: when the loss was noticed (the loop
        woke to the link's end or to the heartbeat's deadline), and after the
        last thing the agent reported, whose time came through another clock.
        Not when it was last heard from: the host may have lived on silently
        until then, and a rank's death another agent reported meanwhile came
        first (a kill on one host, another host's link cut a few ms later)."""
        return max(self.loop.events_at(), self.latest + 0.001)

    def _lost_if_cut(self, reason: str) -> None:
        if self.state == DONE and not self._output_finished():
            if self.output is not None:
                self.output.close("")
            self._lost(reason)

    def _lost(self, reason: str) -> None:
        self._become(LOST)
        tail = self.conn.stderr_tail.decode("utf-8", "replace").strip().splitlines()
        if self.blameless:
            pass                 # (the agent's own words say the same)
        elif self.conn.ended_because:
            reason = self.conn.ended_because
        elif tail:
            reason += f"; the agent said: {tail[-1][:200]}"
        # The job lost what was starting there too (a failure), then the spawn fails.
        self.fleet.host_lost(self, reason)
        spawns, self._spawns = self._spawns, {}
        for done in spawns.values():
            done(f"lost host {self.name}")
        looks, self._looks = self._looks, {}
        for look in looks.values():
            look(None)


#: What a host does with each frame its agent sends (see :func:`~mslaunch.wire.frames.from_agent`).
_HANDLERS: Dict[type, Callable[[RemoteHost, Any], None]] = {
    frames.Ready: RemoteHost._ready,
    frames.Started: RemoteHost._started,
    frames.Exited: RemoteHost._exited,
    frames.Pmi: RemoteHost._pmi,
    frames.StdinTaken: lambda host, frame: host.fleet.stdin_taken(host, frame.rank,
                                                                       frame.stdin),
    frames.Log: lambda host, frame: host.fleet.host_message(host, frame.message),
    frames.Error: RemoteHost._error,
    frames.Looked: RemoteHost._looked,
    frames.Gone: RemoteHost._gone,
    frames.Bare: RemoteHost._bare,
}


def clock_offset(sent: float, clock: Any, back: float) -> float:
    """The agent's clock less this one's, from one exchange: the job sent at
    ``sent``, the agent's ``clock`` (when it got the job, when it answered), the
    answer here at ``back``.  Neither way takes less than no time, so the offset
    lies between ``clock[1] - back`` and ``clock[0] - sent``: the value there
    nearest to 0 is taken, the least correction the exchange proves.  Clocks
    that agree (one machine's, or a cluster's under NTP) stay exact whatever
    the ways took; NTP's midpoint would be off by half their difference, which
    on a busy host is tens of milliseconds, enough to put one host's failure
    before another's that came first.  0 if ``clock`` is not two times."""
    if not isinstance(clock, list) or len(clock) != 2 or \
            not all(type(t) in (int, float) and 0 < t < 1e11 for t in clock):
        return 0.0
    low, high = clock[1] - back, clock[0] - sent
    if low > high:          # a clock stepped between the two readings
        return (low + high) / 2
    return min(max(0.0, low), high)


class RemoteStdin:
    """A remote rank's stdin, as a sink of the launcher's stdin fan-out.

    Bytes go out in ``STDIN`` frames; the agent says how many it wrote to
    the rank's pipe, and the fan-out stops reading mslaunch's stdin while
    too many are on their way.
    """

    def __init__(self, host: RemoteHost, rank: int) -> None:
        self.host = host
        self.rank = rank
        self.sent = 0
        self.done = 0
        self.fanout: Optional[StdinFanout] = None

    @property
    def backlog(self) -> int:
        return self.sent - self.done

    def push(self, data: bytes) -> None:
        self.sent += len(data)
        self.host.send_stdin(self.rank, data)

    def finish(self) -> None:
        self.host.send_stdin(self.rank, b"")

    def taken(self, count: int) -> None:
        self.done += count
        if self.fanout is not None:
            self.fanout.resume_if_room()

    def close(self) -> None:
        pass
