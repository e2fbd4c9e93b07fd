"""An agent's PMI: a server for each job with ranks on this host, the job-wide part at the launcher.

The job's ranks, and those of every job spawned onto this host, are served
PMI here (:class:`~mslaunch.mpi.pmi.job.PMIJob`) with a
:class:`~mslaunch.mpi.pmi.state.RelayJobState` that sends fences and questions
to the launcher in ``PMI`` frames; :class:`AgentPMI` is those jobs' owner:
it relays their events (abort, lost, started, spawn, log) upward, and the
launcher's ``PMI`` frames (fence results, answers, spawned jobs) down.

The first job's ranks here are served PMIx as well (:mod:`mslaunch.mpi.pmix`),
by a server of this agent's; a fence of theirs that spans hosts goes to the
launcher as a ``pmix_fence`` operation and comes back whole as
``pmix_fence_done`` (see :mod:`mslaunch.serve.pmixjobs`).
"""

from __future__ import annotations

import itertools
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

    from ..machine.guard import Watchdog
    from ..machine.local import LocalRanks
    from ..machine.loop import Loop
    from ..mpi.early import SingletonProbe
    from ..mpi.pmi.singletons import SingletonFiles
    from ..mpi.pmix.host import PMIxHost
    from ..core.spec import RankSpec
    from ..wire.endpoint import Endpoint

from ..mpi.pmi.files import xml_for_ranks
from ..mpi.pmi.job import PMIJob
from ..wire import link
from .modex import ModexAsks


class AgentPMI:
    """See the module docstring; ``on_job`` starts a spawned job's ranks here."""

    def __init__(self, loop: Loop, end: Endpoint,
                 on_job: Callable[[Dict[str, Any]], None],
                 pmix: Optional[PMIxHost] = None) -> None:
        self.loop = loop
        self.stop_at: Optional[float] = None     # when the launcher's stop came (see stopping)
        self.exiting_at_stop: Set[int] = set()  # pids already on their way out then
        self.end = end
        self.on_job = on_job
        self.jobs: Dict[str, PMIJob] = {}     # by kvsname: the job's, and spawned ones
        self.probe: Optional[SingletonProbe] = None   # see mslaunch.mpi.pmi.singletons
        self.leftovers: Optional[SingletonFiles] = None   # of Open MPI ranks stopped here
        self.guard: Optional[Watchdog] = None
        self.trace = False
        self.port_range: Optional[Tuple[int, int]] = None   # of the JOB frame
        self.local: Optional[LocalRanks] = None       # this host's ranks, once started
        # The server of an earlier job of this agent's, retired (see close), if any.
        self.pmix: Optional[PMIxHost] = pmix
        if pmix is not None:     # (its log as the next job's trace says, once known)
            pmix.adopt(loop, lambda message: self.pmi_log(message) if self.trace else None,
                       self._fetch, end.beat_now)
        self.fences: Dict[Tuple[str, str, int], Callable[[bytes], None]] = {}
        self.names_waiting: Dict[int, Tuple[str, Callable[[Any], None]]] = {}
        self.modex = ModexAsks()
        self._asks = itertools.count(1)

    def start_probe(self, marker: str, specs: Sequence[RankSpec]) -> None:
        """Watch for ranks that start Open MPI alone (see :mod:`mslaunch.mpi.pmi.singletons`)."""
        from ..mpi.early import SingletonProbe
        try:
            self.probe = SingletonProbe(marker, specs)
        except OSError:
            pass

    def stopping(self, pids: List[int]) -> None:
        """The ranks ``pids`` (process group leaders) are to be stopped: stop them,
        noting what their Open MPI processes made in /dev/shm (removed by :meth:`close`)."""
        if self.stop_at is None:
            self.stop_at = time.time()
            from ..machine.procs import exiting
            self.exiting_at_stop = {pid for pid in pids if exiting(pid)}
        from ..mpi.pmi.singletons import SingletonFiles, runs_open_mpi
        if self.probe is None or not pids or not runs_open_mpi(pids):
            return
        if self.leftovers is None:
            guard = self.guard
            self.leftovers = SingletonFiles(guard.keep if guard else None,
                                            guard.flush if guard else None)
        self.leftovers.stop(pids, self.loop)

    def new_job(self, number: int, kvsname: str, job: Dict[str, Any],
                specs: List[RankSpec], spawner: Optional[str]) -> PMIJob:
        """PMI for this host's ranks of one job, the job-wide part at the launcher."""
        from ..mpi.pmi.state import RelayJobState
        size, appnums = job["size"], job["appnums"]
        state = RelayJobState(
            kvsname=kvsname, size=size, process_mapping=job["process_mapping"],
            universe_size=job["universe_size"], appnums=appnums,
            local_ranks=[s.rank for s in specs], send=self.up,
            hwloc_xml=xml_for_ranks(self.guard) if self.guard is not None else None)
        pj = PMIJob(self, number=number, kvsname=kvsname, size=size, state=state,
                    keys={s.rank: s.key for s in specs}, spawner=spawner)
        pj.probe = self.probe
        pj.serve(self.loop, appnums, job["process_mapping"], tcp=job["pmi"] == "port",
                 trace=self.trace, port_range=self.port_range)
        self.jobs[kvsname] = pj
        if job.get("pmix_nodes") and specs and (number == 1 or job.get("pmix_parent")):
            self._serve_pmix(pj, job, specs)
        if self.guard is not None and number != 1:
            self.guard.keep(kvsname)
        return pj

    def _serve_pmix(self, pj: PMIJob, job: Dict[str, Any], specs: List[RankSpec]) -> None:
        from ..mpi.pmix import oversubscribed
        from ..mpi.pmix.layout import Layout, app_commands
        from ..core.procmap import parse_process_mapping
        nodes = job["pmix_nodes"]
        parent = job.get("pmix_parent")
        if parent:                  # a job an Open MPI rank spawned (remote.jobframe)
            node_of = job["pmix_node_of"]
            here = nodes.index(specs[0].host.name) if specs[0].host.name in nodes else -1
        else:
            try:
                node_of = parse_process_mapping(job["process_mapping"], pj.size)
            except ValueError:
                return
            here = specs[0].host.node_id
        if not 0 <= here < len(nodes) or any(not 0 <= n < len(nodes) for n in node_of):
            return
        layout = Layout(pj.kvsname, nodes, node_of, job["appnums"], job["pmix_universe"], here,
                        oversubscribed(specs), parent=(parent[0], parent[1]) if parent else None,
                        commands=app_commands(specs))

        def relay(signature: str, sequence: int, blob: bytes,
                  done: Callable[[bytes], None]) -> None:
            from ..mpi.pmix.exchange import encode_blob
            self.fences[(pj.kvsname, signature, sequence)] = done
            self.up({"op": "pmix_fence", "kvs": pj.kvsname, "sig": signature,
                     "seq": sequence, "blob": encode_blob(blob)})
        self._host(pj.kvsname).serve(pj, layout, relay)

    def pmix_said(self, key: int) -> Dict[str, object]:
        """What a singleton report says of PMIx here: served to the rank's job, or why not."""
        for pj in self.jobs.values():
            rank = next((r for r, k in pj.keys.items() if k == key), None)
            if pj.pmix is not None and rank is not None:
                return {"pmix": True, "joined": pj.joined_pmix(rank)}
        problem = self.pmix.problem if self.pmix is not None else None
        return {"nopmix": problem[:300]} if problem else {}

    def exited(self, key: int, code: Optional[int], sig: Optional[int], at: float) -> None:
        """A rank here ended (at ``at``): one that left PMIx without finalizing is lost."""
        if code or sig is not None:
            return
        for pj in self.jobs.values():
            for rank, k in pj.keys.items():
                if k == key and pj.left_pmix(rank):
                    self.pmi_lost(key, at)
                    return

    def pmix_names(self, pj: PMIJob, request: Dict[str, Any],
                   done: Callable[[Any], None]) -> None:
        """A rank's publish, lookup or unpublish: the names live at the launcher."""
        ask = next(self._asks)
        self.names_waiting[ask] = (request["what"], done)
        self.up({"op": "pmix_names", "kvs": pj.kvsname, "ask": ask, **request})

    def _names_done(self, message: Dict[str, Any]) -> None:
        waiting = self.names_waiting.pop(link.field(message, "ask", int, "PMIx names"), None)
        if waiting is None:
            raise link.LinkError("PMIx names answer for no question of this host")
        what, done = waiting
        value = message.get("value")
        if what == "lookup":
            if not isinstance(value, dict) or not all(
                    isinstance(v, list) and len(v) == 3 and isinstance(v[0], str)
                    and isinstance(v[1], str) and type(v[2]) is int for v in value.values()):
                raise link.LinkError("PMIx lookup answer: not names")
            done({k: tuple(v) for k, v in value.items()})
        else:
            done(value if isinstance(value, str) else None)

    def pmix_spawn(self, pj: PMIJob, rank: int, commands: List[Any],
                   env: List[Tuple[str, str]], reply: Callable[..., None]) -> None:
        """An Open MPI rank here spawns (``PMIx_Spawn``): the launcher places and
        starts the new job, as for an MPICH rank's, its children served PMIx."""
        from ..mpi.pmix import spawn_request
        self.pmi_spawn(pj, rank, spawn_request(commands), reply,
                       {"pmix": True, "env": [list(e) for e in env]})

    def _host(self, kvsname: str) -> PMIxHost:
        """This agent's PMIx, made on first use."""
        if self.pmix is None:
            from ..mpi.pmi.files import pmix_dir
            from ..mpi.pmix.host import PMIxHost
            marker = self.guard.marker if self.guard is not None else kvsname
            self.pmix = PMIxHost(self.loop, pmix_dir(marker),
                                 self.pmi_log if self.trace else (lambda message: None),
                                 self._fetch, self.end.beat_now)
        return self.pmix

    def _guest(self, message: Dict[str, Any]) -> None:
        """A job with no process here, made known to this host's server (see
        :meth:`mslaunch.mpi.pmix.host.PMIxHost.guest`)."""
        from ..mpi.pmix.layout import Layout
        from ..mpi.pmi.files import is_kvsname
        from ..wire.jobframe import read_guest
        kvs = message.get("kvs")
        if not isinstance(kvs, str) or not is_kvsname(kvs):
            raise link.LinkError("PMIx guest job without a name")
        nodes, node_of, appnums, universe = read_guest(message)
        self._host(kvs).guest(Layout(kvs, nodes, node_of, appnums, universe, -1))

    def _fetch(self, nspace: str, rank: int, done: Callable[[Optional[bytes]], None]) -> None:
        """A process's data for this host's server, asked of the launcher."""
        self.modex.ask(nspace, rank, done, self.up)

    def _local_modex(self, nspace: str, rank: int,
                     done: Callable[[Optional[bytes]], None]) -> None:
        if self.pmix is None:
            done(None)
        else:
            self.pmix.local_modex(nspace, rank, done)

    def before_stop(self, key: int, at: float) -> float:
        """When rank ``key`` here ended, or left PMIx: ``at``, but just before the
        launcher's stop if the process was exiting already when the stop came.  Its
        end is then not the stop's doing, though on a busy host its exit (or the
        PMIx library's sight of its lost connection) may be read after the stop."""
        if self.stop_at is not None and self.pid_of(key) in self.exiting_at_stop:
            return min(at, self.stop_at - 1e-6)
        return at

    def pid_of(self, key: int) -> Optional[int]:
        r = self.local.ranks.get(key) if self.local is not None else None
        return r.proc.pid if r is not None and r.proc is not None else None

    def close(self, keep_pmix: bool = False) -> Optional[PMIxHost]:
        """Stop serving; remove the jobs' shared memory segments, the probe, and what
        stopped Open MPI ranks left (call it once the ranks are gone).  With
        ``keep_pmix``, the PMIx server only forgets the jobs and is returned, for
        the next job of this agent (see :meth:`~mslaunch.mpi.pmix.host.PMIxHost.adopt`)."""
        if self.jobs:
            from ..mpi.pmi.files import remove_shm_segments
            for pj in self.jobs.values():
                pj.close()
                remove_shm_segments(pj.kvsname)
        kept = None
        if self.pmix is not None:
            if keep_pmix:
                self.pmix.retire()
                kept = self.pmix
            else:
                self.pmix.close()
        if self.probe is not None:
            self.probe.close()
        if self.leftovers is not None:
            self.leftovers.remove()
        return kept

    # -- the launcher's side -----------------------------------------------------
    def up(self, message: Dict[str, object]) -> None:
        """A ``PMI`` frame to the launcher."""
        self.end.send(link.encode(link.PMI, message))

    def from_launcher(self, message: Dict[str, Any]) -> None:
        """A ``PMI`` frame from the launcher."""
        op = message.get("op")
        if op == "job":
            self.on_job(message)
            return
        if op == "pmix_fence_done":
            self._fence_done(message)
            return
        if op == "pmix_names_done":
            self._names_done(message)
            return
        if op in ("pmix_modex", "pmix_modex_done"):
            self.modex.received(message, self.up, self._local_modex)
            return
        if op == "pmix_guest":
            self._guest(message)
            return
        if op not in ("fence_done", "answer"):
            raise link.LinkError(f"unknown PMI operation {str(op)[:20]!r}")
        pairs: Dict[Any, Any] = {}      # from the wire: checked below
        if op == "fence_done":
            pairs = link.field(message, "pairs", dict, "PMI fence_done")
            if not all(isinstance(k, str) and isinstance(v, str) for k, v in pairs.items()):
                raise link.LinkError("PMI fence_done: pairs must be strings")
        if not self.jobs:
            raise link.LinkError("PMI frame without a PMI job")
        pj = self.jobs.get(str(message.get("kvs", "")))
        if pj is None:
            raise link.LinkError("PMI frame for an unknown job")
        if op == "fence_done":
            pj.state.fence_done(pairs)  # type: ignore[attr-defined]
        else:
            pj.state.answer(link.field(message, "ask", int, "PMI answer"),  # type: ignore[attr-defined]
                            message.get("value"))

    def _fence_done(self, message: Dict[str, Any]) -> None:
        from ..mpi.pmix.exchange import decode_blob
        key = (link.field(message, "kvs", str, "PMIx fence_done"),
               link.field(message, "sig", str, "PMIx fence_done"),
               link.field(message, "seq", int, "PMIx fence_done"))
        done = self.fences.pop(key, None)
        if done is None:
            raise link.LinkError("PMIx fence_done for no fence of this host")
        try:
            done(decode_blob(message.get("blob")))
        except ValueError as err:
            raise link.LinkError(f"PMIx fence_done: {err}") from None

    # -- what the PMI servers report (keys of the launcher's numbering) ----------
    def pmi_abort(self, key: int, code: int, message: str,
                  at: Optional[float] = None) -> None:
        self.up({"op": "abort", "rank": key, "code": code, "message": message[:200],
                 "at": at or time.time(), "stop_at": self.stop_at})

    def pmi_lost(self, key: int, at: Optional[float] = None) -> None:
        self.up({"op": "lost", "rank": key, "at": self.before_stop(key, at or time.time()),
                 "stop_at": self.stop_at})

    def pmi_started(self, pj: PMIJob, rank: int) -> None:
        self.up({"op": "started", "rank": pj.keys[rank], "pmix": rank in pj.pmix_in})

    def pmi_log(self, message: str) -> None:
        self.end.send(link.encode(link.LOG, {"message": f"PMI: {message}"}))

    def pmi_spawn(self, pj: PMIJob, rank: int, request, reply,
                  extra: Optional[Dict[str, Any]] = None) -> None:
        """A rank here spawns: the launcher places and starts the new job."""
        from ..wire.jobframe import spawn_request_body

        def answered(value: object) -> None:
            if isinstance(value, list) and value and (value[0] is None or isinstance(
                    value[0], str)):
                reply(*value[:2])
            else:
                reply("the launcher gave no usable answer")

        pj.state.ask(dict(spawn_request_body(request), op="spawn",  # type: ignore[attr-defined]
                          rank=pj.keys[rank], **(extra or {})), answered)
