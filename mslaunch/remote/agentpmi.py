"""An agent's PMI: a server for each job with ranks on this host, the job-wide part at the launcher.

The job's ranks, and those of every job spawned onto this host, are served
PMI here (:class:`~mslaunch.pmi.job.PMIJob`) with a
:class:`~mslaunch.pmi.state.RelayJobState` that sends fences and questions
to the launcher in ``PMI`` frames; :class:`AgentPMI` is those jobs' owner:
it relays their events (abort, lost, started, spawn, log) upward, and the
launcher's ``PMI`` frames (fence results, answers, spawned jobs) down.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

    from ..machine.guard import Watchdog
    from ..machine.loop import Loop
    from ..pmi.singletons import SingletonFiles, SingletonProbe
    from ..spec import RankSpec
    from .endpoint import Endpoint

from ..pmi.files import xml_for_ranks
from ..pmi.job import PMIJob
from . import link


class AgentPMI:
    """See the module docstring; ``on_job`` starts a spawned job's ranks here."""

    def __init__(self, loop: Loop, end: Endpoint,
                 on_job: Callable[[Dict[str, Any]], None]) -> None:
        self.loop = loop
        self.end = end
        self.on_job = on_job
        self.jobs: Dict[str, PMIJob] = {}     # by kvsname: the job's, and spawned ones
        self.probe: Optional[SingletonProbe] = None   # see mslaunch.pmi.singletons
        self.leftovers: Optional[SingletonFiles] = None   # of Open MPI ranks stopped here
        self.guard: Optional[Watchdog] = None
        self.trace = False
        self.port_range: Optional[Tuple[int, int]] = None   # of the JOB frame

    def start_probe(self, marker: str, specs: Sequence[RankSpec]) -> None:
        """Watch for ranks that start Open MPI alone (see :mod:`mslaunch.pmi.singletons`)."""
        from ..pmi.singletons import SingletonProbe
        try:
            self.probe = SingletonProbe(marker, specs)
        except OSError:
            pass

    def stopping(self, pids: List[int]) -> None:
        """The ranks ``pids`` (process group leaders) are to be stopped: stop them,
        noting what their Open MPI processes made in /dev/shm (removed by :meth:`close`)."""
        from ..pmi.singletons import SingletonFiles, runs_open_mpi
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
        from ..pmi.state import RelayJobState
        size, appnums = job["size"], job["appnums"]
        state = RelayJobState(
            kvsname=kvsname, size=size, process_mapping=job["process_mapping"],
            universe_size=job["universe_size"], appnums=appnums,
            local_ranks=[s.rank for s in specs], send=self.up,
            hwloc_xml=xml_for_ranks(self.guard) if self.guard is not None else None)
        pj = PMIJob(self, number=number, state=state, keys={s.rank: s.key for s in specs},
                    spawner=spawner)
        pj.probe = self.probe
        pj.serve(self.loop, appnums, job["process_mapping"], tcp=job["pmi"] == "port",
                 trace=self.trace, port_range=self.port_range)
        self.jobs[kvsname] = pj
        if self.guard is not None and number != 1:
            self.guard.keep(kvsname)
        return pj

    def close(self) -> None:
        """Stop serving; remove the jobs' shared memory segments, the probe, and what
        stopped Open MPI ranks left (call it once the ranks are gone)."""
        if self.jobs:
            from ..pmi.files import remove_shm_segments
            for pj in self.jobs.values():
                pj.close()
                remove_shm_segments(pj.kvsname)
        if self.probe is not None:
            self.probe.close()
        if self.leftovers is not None:
            self.leftovers.remove()

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

    # -- what the PMI servers report (keys of the launcher's numbering) ----------
    def pmi_abort(self, key: int, code: int, message: str) -> None:
        self.up({"op": "abort", "rank": key, "code": code, "message": message[:200]})

    def pmi_lost(self, key: int) -> None:
        self.up({"op": "lost", "rank": key})

    def pmi_started(self, pj: PMIJob, rank: int) -> None:
        self.up({"op": "started", "rank": pj.keys[rank]})

    def pmi_log(self, message: str) -> None:
        self.end.send(link.encode(link.LOG, {"message": f"PMI: {message}"}))

    def pmi_spawn(self, pj: PMIJob, rank: int, request, reply) -> None:
        """A rank here spawns: the launcher places and starts the new job."""
        from .jobframe import spawn_request_body

        def answered(value: object) -> None:
            if isinstance(value, list) and value and (value[0] is None or isinstance(
                    value[0], str)):
                reply(*value[:2])
            else:
                reply("the launcher gave no usable answer")

        pj.state.ask(dict(spawn_request_body(request), op="spawn",  # type: ignore[attr-defined]
                          rank=pj.keys[rank]), answered)
