"""Looking inside a running job: its control socket, stacks and live view.

The supervisor listens on a Unix socket in this user's private directory
(see :func:`mslaunch.run.attempt.open_control`); this module is
imported only when someone connects (``mslaunch-stacks``, ``mslaunch-top``)
or when the job itself wants its stacks (``--stall-report``, ``--timeout``
with ``--get-stack-traces``).  A client sends one JSON line and gets one
back:

* ``{"op": "info"}``: the job (kvsname, launcher pid, ranks, hosts, argv);
* ``{"op": "stacks", "timeout": S}``: every running rank's stacks, merged
  (:mod:`mslaunch.inspect.stacktree`'s JSON form), read on this machine in a thread
  and by every agent over its link (``STACKS`` frames), with one deadline;
* ``{"op": "top"}``: per rank host, pid, state, CPU %, RSS, seconds since
  its last output and that line, and the job's timeline so far.

Connections from another user are refused (``SO_PEERCRED``), also when the
job is root's, although the directory already keeps them out; root may
connect to any user's job (it may trace their processes anyway).
"""

from __future__ import annotations

import os
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Optional, Tuple

    from .stacktree import RankStacks, Report
    from ..seams import LookedAt, RankState

from . import admitted, job_info
from ..mpi.pmi.files import public_id
from ..wire import link
from ..machine.osfiles import read_ready

#: Bytes a request may have.
MAX_REQUEST = 64 << 10
#: The longest a client may ask the job to spend reading stacks.
MAX_TIMEOUT = 60.0


def title(view: LookedAt, what: str, stacks: Optional[List[RankStacks]] = None) -> str:
    """The report's first line; with ``stacks``, of those ranks (other nodes' too)."""
    live = [r for r in view.ranks if r.pid and not r.ended and r.spec.job == 1]
    count = len(live) if stacks is None else len(stacks)
    hosts = len({r.spec.host.name for r in live} if stacks is None else {s.host for s in stacks})
    return (f"mslaunch: {what} of {count} running rank(s) on {hosts} host(s), job "
            f"{public_id(view.plan.kvsname)} (launcher pid {os.getpid()}), innermost frames last")


def gather(view: LookedAt, timeout: float, dumps: Optional[str],
           done: Callable[[List[RankStacks]], None], here_only: bool = False,
           main_only: bool = False) -> None:
    """Read every running rank's stacks, here and on every host, and (unless
    ``here_only``) on the job's other nodes (one command per node), within
    ``timeout`` seconds; ``done(stacks)`` on the loop, once.  ``main_only``:
    a Python rank's main thread alone writes its frames (see
    :mod:`mslaunch.machine.pydump`)."""
    live = [r for r in view.ranks if r.pid and not r.ended and r.spec.job == 1]
    by_key = {r.spec.key: r for r in live}
    got: Dict[int, Dict[str, Any]] = {}
    lookers = view.lookers
    # what each place may speak for: its own ranks (an agent never for another host's);
    # this machine's ranks are read here unless a looker speaks for them (srun's)
    allowed = {name: set(host.ranks) for name, host in lookers.items()}
    covered = view.spoken_for
    allowed["local"] = {k for k, r in by_key.items() if r.spec.host.local and k not in covered}
    waiting = {"local"} if allowed["local"] else set()
    finished: List[bool] = []
    elsewhere: List[RankStacks] = []

    def finish() -> None:
        if finished:
            return
        finished.append(True)
        timer.cancel()
        out = []
        for key, r in sorted(by_key.items(), key=lambda kv: kv[1].spec.rank):
            entry = got.get(key)
            out.append(_rank_stacks(r, entry))
        mine = {s.rank for s in out}
        out.extend(s for s in elsewhere if s.rank not in mine)
        done(sorted(out, key=lambda s: s.rank))

    def from_nodes(rows: List[Any]) -> None:
        from .stacktree import ranks_from_json
        for item in rows:
            try:
                elsewhere.extend(ranks_from_json([item]))
            except ValueError:
                pass                    # a node's malformed row: that rank is not shown
        waiting.discard("nodes")
        if not waiting:
            finish()

    def arrived(where: str, ranks: Optional[Dict[Any, Any]]) -> None:
        waiting.discard(where)
        here: Dict[int, Dict[str, Any]] = {}
        for key, entry in (ranks or {}).items():
            k = int(key) if isinstance(key, str) and key.isdigit() else key
            if k in by_key and k in allowed[where] and isinstance(entry, dict):
                here[k] = entry
        for k, entry in here.items():
            # merged on the host: the same threads as another rank of that host
            same = entry.get("threads_of")
            if same is not None and "threads" not in entry:
                other = here.get(same) if type(same) is int else None
                entry = dict(entry, threads=other.get("threads") if other else None)
            got[k] = entry
        if not waiting:
            finish()

    asked = not here_only and view.elsewhere(timeout, from_nodes)
    if asked:
        waiting.add("nodes")
    # (the node service waits its nodes' answers 2 s past the timeout)
    timer = view.loop.call_later(timeout + (3.0 if asked else 2.0), finish)
    for name, host in lookers.items():
        waiting.add(name)
        if not host.look(link.STACKS, {"timeout": timeout, "main": main_only},
                         lambda ranks, n=name: arrived(n, ranks)):
            waiting.discard(name)
    if "local" in waiting:
        from ..machine.stacks import read_in_background
        pids = {r.spec.key: r.pid for r in live if r.spec.key in allowed["local"]}
        read_in_background(view.loop, pids, dumps, timeout, lambda res: arrived("local", res),
                           main_only)
    if not waiting:
        finish()


def _rank_stacks(r: RankState, entry: Optional[Dict[str, Any]]) -> RankStacks:
    # the stacks' records are imported only when stacks are read: their
    # dataclasses cost a remote job's start-up 29 ms of imports
    from .stacktree import RankStacks
    spec = r.spec
    if entry is None:
        return RankStacks(rank=spec.rank, host=spec.host.name, pid=r.pid, answered=False)
    threads = entry.get("threads") or []
    ok = isinstance(threads, list) and all(
        isinstance(t, list) and all(isinstance(f, str) for f in t) for t in threads)
    return RankStacks(rank=spec.rank, host=spec.host.name, pid=r.pid,
                      threads=tuple(tuple(f[:300] for f in t) for t in threads) if ok else (),
                      note=str(entry.get("note") or "")[:1000] if ok else
                      "the agent's answer was malformed",
                      answered=bool(entry.get("answered", True)),
                      state=str(entry.get("state") or "")[:4],
                      cpu=_cpu(entry.get("cpu")),
                      moved=entry["moved"] if type(entry.get("moved")) is int else -1,
                      stdin=entry.get("stdin") is True)


def _cpu(value: Any) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    return float(value) if ok else -1.0


def last_line(r: RankState) -> str:
    """The last non-empty line a rank wrote (as far as it was kept)."""
    for out in reversed(r.outputs):
        text = out.tail.rstrip(b"\n").rsplit(b"\n", 1)[-1]
        if text.strip():
            return text.decode("utf-8", "replace")[-200:]
    return ""


def top_rows(view: LookedAt, usage: Dict[int, Dict[str, Any]], now: float) -> List[Dict[str, Any]]:
    rows = []
    for r in view.ranks:
        spec = r.spec
        u = usage.get(spec.key) or {}
        state = u.get("state") or ("ended" if r.ended else ("starting" if not r.pid else "?"))
        if r.ended:
            state = "exit " + (str(r.code) if r.signal is None else f"sig {r.signal}")
        quiet = r.last_output
        rows.append({"rank": spec.rank, "job": spec.job, "host": spec.host.name, "pid": r.pid,
                     "state": state, "cpu": u.get("cpu"), "rss": u.get("rss"),
                     "quiet": None if quiet is None else round(now - quiet, 1),
                     "line": last_line(r)})
    return rows


def timeline(view: LookedAt) -> List[Tuple[float, str]]:
    """The job's events so far, in seconds since it started: ranks started, failed."""
    start: float = view.started
    events: List[Tuple[float, str]] = []
    import sys
    marks = sys.modules.get("mslaunch.machine.timeline")
    for when, event, host in getattr(marks, "_marks", None) or []:
        events.append((when - start, f"{event}{' (' + host + ')' if host else ''}"))
    started = sorted(r.started_at for r in view.ranks if r.started_at)
    if started:
        first, last = started[0], started[-1]
        events.append((first - start, "first rank started"))
        if len(started) > 1:
            events.append((last - start, f"{len(started)} ranks started"))
    for r in view.ranks:
        ended = r.ended_at
        if ended and r.failed:
            from ..machine.spawn import how_ended
            events.append((ended - start, f"rank {r.spec.rank} on {r.spec.host.name} "
                                          f"{r.reason or how_ended(r.code, r.signal)}"))
    return sorted(events)


class Inspector:
    """Serves the job's control socket; see the module docstring."""

    def __init__(self, view: LookedAt, sock: Any, dumps: Optional[str]) -> None:
        self.view = view
        self.sock = sock
        self.dumps = dumps
        self.cpu: Dict[int, Tuple[float, int]] = {}
        self.clients: Dict[int, Any] = {}
        # From now on the ranks' last lines are kept for the live view.
        for r in view.ranks:
            for out in r.outputs:
                out.keep_tail = True

    def accept(self) -> None:
        from ..core import socket
        while True:
            try:
                fd, _ = self.sock._accept()     # the C socket's accept: a descriptor
            except OSError:
                return
            conn = socket.socket(fileno=fd)
            if admitted(conn):
                conn.setblocking(False)
                _Client(self, conn)

    def handle(self, request: Any, reply: Callable[[Dict[str, Any]], None]) -> None:
        op = request.get("op") if isinstance(request, dict) else None
        view = self.view
        if op == "info":
            reply(self.info())
        elif op == "stacks":
            timeout = request.get("timeout", 10.0)
            if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) \
                    or not 0 < timeout <= MAX_TIMEOUT:
                reply({"error": f"timeout must be a number of seconds in (0, {MAX_TIMEOUT:g}]"})
                return

            def done(stacks: List[RankStacks]) -> None:
                from .stacktree import merge, to_json
                reply(to_json(merge(stacks, title(view, "stacks", stacks))))
            gather(view, float(timeout), self.dumps, done)
        elif op == "top":
            self.top(reply)
        else:
            reply({"error": "unknown request (info, stacks, top)"})

    def info(self) -> Dict[str, Any]:
        return job_info(self.view)

    def top(self, reply: Callable[[Dict[str, Any]], None]) -> None:
        from ..machine.stacks import usage
        view = self.view
        lookers = view.lookers
        covered = view.spoken_for
        here = {r.spec.key: r.pid for r in view.ranks if r.pid and not r.ended
                and r.spec.host.local and r.spec.key not in covered}
        rows: Dict[int, Dict[str, Any]] = usage(here, self.cpu)
        waiting = set()
        sent: List[bool] = []

        def finish() -> None:
            if sent:
                return
            sent.append(True)
            now = time.monotonic()
            for r in view.ranks:          # when each rank last wrote, to this look
                written = sum(o.written for o in r.outputs)
                if written != r.written:  # type: ignore[attr-defined]
                    r.written, r.last_output = written, now  # type: ignore[attr-defined]
            start = view.started
            reply({"job": self.info(), "rows": top_rows(view, rows, now),
                   "events": [[round(t, 3), text] for t, text in timeline(view)],
                   "now": round(now - start, 1)})

        def arrived(name: str, ranks: Optional[Dict[Any, Any]]) -> None:
            waiting.discard(name)
            mine = lookers[name].ranks       # an agent speaks for its own ranks only
            for key, entry in (ranks or {}).items():
                if isinstance(key, str) and key.isdigit() and int(key) in mine \
                        and isinstance(entry, dict):
                    cpu, rss = entry.get("cpu"), entry.get("rss")
                    rows[int(key)] = {
                        "state": str(entry.get("state") or "?")[:8],
                        "cpu": cpu if isinstance(cpu, (int, float)) else None,
                        "rss": rss if isinstance(rss, int) else None}
            if not waiting:
                finish()

        for name, host in lookers.items():
            waiting.add(name)
            if not host.look(link.TOP, {}, lambda ranks, n=name: arrived(n, ranks)):
                waiting.discard(name)
        if not waiting:
            finish()
        else:
            view.loop.call_later(3.0, finish)

    def close(self) -> None:
        for client in list(self.clients.values()):
            client.close()


class _Client:
    """One connection: a request line in, a reply line out, then closed."""

    def __init__(self, inspector: Inspector, conn: Any) -> None:
        self.inspector = inspector
        self.loop = inspector.view.loop
        self.conn = conn
        self.fd = conn.fileno()
        self.buf = b""
        self.out = b""
        self.closed = False
        inspector.clients[self.fd] = self
        self.loop.add_reader(self.fd, self._read)
        self.timer = self.loop.call_later(MAX_TIMEOUT + 10.0, self.close)

    def _read(self) -> None:
        data = read_ready(self.fd)
        if data is None:
            return
        if not data:
            self.close()
            return
        self.buf += data
        if b"\n" not in self.buf:
            if len(self.buf) > MAX_REQUEST:
                self.close()
            return
        self.loop.remove_reader(self.fd)
        line = self.buf.split(b"\n", 1)[0]
        import json
        try:
            request = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            self.reply({"error": "the request is not a JSON line"})
            return
        try:
            self.inspector.handle(request, self.reply)
        except Exception as err:        # noqa: BLE001 -- a look must never end the job
            self.reply({"error": f"mslaunch could not answer: {type(err).__name__}: {err}"})

    def reply(self, answer: Dict[str, Any]) -> None:
        if self.closed:
            return
        import json
        self.out = json.dumps(answer).encode() + b"\n"
        self._write()

    def _write(self) -> None:
        try:
            while self.out:
                sent = self.conn.send(self.out)
                self.out = self.out[sent:]
        except (BlockingIOError, InterruptedError):
            self.loop.add_writer(self.fd, self._write)
            return
        except OSError:
            pass
        self.close()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.timer.cancel()
        self.inspector.clients.pop(self.fd, None)
        self.loop.forget(self.fd)
        self.conn.close()


def report_text(stacks: List[RankStacks], view: LookedAt, what: str) -> Tuple[Report, str]:
    """The merged report of ``stacks`` and its text, for mslaunch's own messages."""
    from .stacktree import merge, render
    report = merge(stacks, title(view, what))
    return report, render(report)
