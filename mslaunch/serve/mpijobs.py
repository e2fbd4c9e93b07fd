"""The MPI jobs of a launch: the first one, and every job its ranks spawn.

:class:`MPIJobs` keeps each job's PMI (:class:`~mslaunch.mpi.pmi.job.PMIJob`),
answers what remote hosts' agents relay for their ranks, and carries out
``MPI_Comm_spawn``: the new job is placed on the job's hosts
(:func:`~mslaunch.plan.spawn.plan_spawn`), gets a kvsname and a key-value
space holding the pairs the parent put for it (``PARENT_ROOT_PORT_NAME``),
and its processes join the supervision of the launch -- the same failure
policy, output relay and files, signals, timeouts, orphan guard and
shared-memory cleanup as the first job's ranks.  The spawning rank's
request is answered once every new process has started, or with the
reason it could not be (the parent's ``MPI_Comm_spawn`` then fails and
the job goes on).  Published names are shared by all jobs, so that a
parent and its children can meet with ``MPI_Publish_name`` and
``MPI_Lookup_name``.
"""

from __future__ import annotations

import os
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Optional, Tuple

    from ..mpi.early import EarlyMPI, SingletonProbe
    from ..mpi.pmi.singletons import SingletonFiles
    from ..mpi.pmi.server import PMIServer
    from ..core.spec import RankSpec, SpawnRequest
    from .pmixjobs import LauncherPMIx
    from ..mpi.pmi.state import LocalJobState
    from ..seams import AgentHost, ServedJob

from ..core.errors import LaunchError, PlanError
from ..mpi.pmi.files import xml_for_ranks
from ..mpi.early import SINGLETON_POLL
from ..mpi.pmi.job import PMIJob

#: Seconds a closed PMI connection waits for its process's exit status (a crash
#: and a rank that left MPI without finalizing look the same until then): the
#: status follows at once, unless the process is slow to die (a busy machine,
#: a handler of its own) or, on a remote host, its agent is slow to report it.
LOST_PMI_SETTLE = 1.0


class MPIJobs:
    """The launch's MPI jobs; see the module docstring.  ``served``: the job they serve, as
    its supervisor lends it."""

    def __init__(self, served: ServedJob) -> None:
        self.served = served
        self.jobs: Dict[str, PMIJob] = {}        # by kvsname
        self.first: Optional[PMIJob] = None
        self.names: Dict[str, str] = {}          # published names, of every job
        self.probe: Optional[SingletonProbe] = None   # see mslaunch.mpi.early
        self.hwloc_xml: Optional[str] = None          # see mslaunch.mpi.pmi.files
        self.leftovers: Optional[SingletonFiles] = None   # of refused Open MPI singletons
        self.nested_said = False
        self.pmix: Optional[LauncherPMIx] = None      # PMIx beside PMI (mslaunch.mpi.pmix)
        self.naming: List[int] = []      # numbers of spawned jobs whose name is sought

    # -- the first job ------------------------------------------------------------
    def start_first(self, local: bool, topology: bool = True,
                    early: Optional[EarlyMPI] = None):
        """The first job's PMI; returns (inherited server, env function) for its local
        ranks (``topology``: whether its ranks may read this machine's, see
        :mod:`mslaunch.mpi.pmi.files`).  With ``early``, its ranks here started
        already with what it made (see :mod:`mslaunch.mpi.early`), which is taken over."""
        served = self.served
        plan, job = served.plan, served.job
        if early is not None:
            self.probe, self.hwloc_xml = early.probe, early.hwloc_xml
        else:
            from ..mpi.early import SingletonProbe
            try:
                self.probe = SingletonProbe(served.watchdog.marker,
                                            [r for r in plan.ranks if r.host.local])
            except OSError:
                self.probe = None                    # no temporary directory: no check
            self.hwloc_xml = xml_for_ranks(served.watchdog) if topology else None
        appnums = [r.app for r in plan.ranks]
        first = self._new(1, plan.kvsname, len(plan.ranks), plan.process_mapping, appnums,
                          {r.rank: r.key for r in plan.ranks}, None)
        self.first = first
        from .pmixjobs import LauncherPMIx
        self.pmix = LauncherPMIx(self.served, self.jobs)
        if not local:
            return None, None
        first.serve(served.loop, appnums, plan.process_mapping, tcp=job.pmi_port,
                    trace=job.verbose >= 2, port_range=job.port_range)
        if early is not None:
            first.adopt(early.ours, early.theirs)
            # its kvsname kept for the watchdog now, before any rank can learn it
            served.watchdog.flush()
        if self.pmix is not None:
            self.pmix.serve_first(first, early)
        return first.inherited, first.env

    def universe(self) -> int:
        """``MPI_UNIVERSE_SIZE`` as Hydra gives it: ``-usize`` if given, else unknown (-1)."""
        usize = self.served.job.usize
        if usize is None:
            return -1
        return usize or self.served.plan.universe_size

    def _new(self, number: int, kvsname: str, size: int, mapping: str, appnums,
             keys: Dict[int, int], spawner: Optional[str]) -> PMIJob:
        universe, hwloc_xml = self.universe(), self.hwloc_xml

        def state() -> LocalJobState:
            from ..mpi.pmi.state import LocalJobState
            return LocalJobState(kvsname=kvsname, size=size, process_mapping=mapping,
                                 universe_size=universe, appnums=appnums, names=self.names,
                                 hwloc_xml=hwloc_xml)
        pj = PMIJob(self, number=number, kvsname=kvsname, size=size, state=state, keys=keys,
                    spawner=spawner)
        pj.probe = self.probe
        self.jobs[kvsname] = pj
        self.served.watchdog.keep(kvsname)
        return pj

    def of(self, spec: RankSpec) -> Optional[PMIJob]:
        for pj in self.jobs.values():
            if pj.number == spec.job:
                return pj
        return None

    # -- what the PMI servers report -------------------------------------------------
    def pmix_names(self, pj: PMIJob, request: Dict[str, Any],
                   done: Callable[[Any], None]) -> None:
        if self.pmix is not None:
            self.pmix.names(pj.kvsname, request, done)

    def pid_of(self, key: int) -> Optional[int]:
        return self.served.ranks[key].pid if 0 <= key < len(self.served.ranks) else None

    def pmi_abort(self, key: int, code: int, message: str, at: Optional[float] = None) -> None:
        r = self.served.ranks[key]
        code &= 0xFF
        # An abort must never look like success: a code that is 0 modulo 256
        # (MPI_Abort(comm, 0) or 256) ends the job with status 1.
        shown = f"exit code {code}" if code else "exit code 0 (exit status 1)"
        self.served.fail(r, f"called MPI_Abort with {shown}", code or 1, abort=True, at=at,
                      mpi_abort=True)

    def pmi_lost(self, key: int, at: Optional[float] = None) -> None:
        r = self.served.ranks[key]
        at = at or time.time()
        r.pmi_lost = at if r.pmi_lost is None else min(r.pmi_lost, at)
        if r.ended:
            self.check_lost(r, at)
        else:
            # The socket closes while the process exits, a moment before its
            # exit status can be read: let the exit tell a crash from a rank
            # that left MPI without finalizing.
            run = r.restarts
            self.served.loop.call_later(LOST_PMI_SETTLE, lambda: self.check_lost(r, at)
                                     if r.restarts == run else None)   # (not a later run's)

    def left(self, r) -> None:
        """Rank ``r`` ended with status 0: a failure if it left PMI early, or without
        joining the MPI the others of its job use."""
        if r.pmi_lost is not None:
            self.check_lost(r)
        else:
            self.check_left_mpi(r)

    def check_lost(self, r, at: Optional[float] = None) -> None:
        """Rank ``r``'s PMI connection closed (at the earliest of ``at``, when that
        was first seen and when it ended): a failure unless its exit is one already."""
        if r.signal is not None or r.code:
            return  # a failure in its own right, already handled
        self.served.fail(r, "exited without MPI_Finalize (its PMI connection closed early)"
                      if r.ended else "closed its PMI connection without MPI_Finalize",
                      1, abort=True,
                      at=min([t for t in (at, r.pmi_lost, r.end) if t] or [time.time()]))

    def pmi_log(self, message: str) -> None:
        self.served.log(f"PMI: {message}")

    def pmi_started(self, pj: PMIJob, rank: int) -> None:
        # A rank that already ended without MPI can never join its job now.
        served = self.served
        for r in served.ranks:
            if r.spec.job == pj.number and r.ended and not r.failed:
                self.check_left_mpi(r)
        if self.pmix is not None:
            self.pmix.check_mixed(pj)

    def process_ended(self, spec: RankSpec) -> None:
        """A rank here ended.  One that left PMIx without finalizing is marked lost (see
        :meth:`check_lost`); a spawned job whose processes here have all ended needs
        its server no more (its TCP listener, under -pmi-port, would otherwise stay)."""
        pj = self.of(spec)
        r = self.served.ranks[spec.key]
        if pj is not None and spec.host.local and not r.code and r.signal is None \
                and pj.left_pmix(spec.rank):
            end = r.end or time.time()
            r.pmi_lost = end if r.pmi_lost is None else min(r.pmi_lost, end)
        if pj is None or pj.number == 1 or not pj.serving:
            return
        if all(r.ended for r in self.served.ranks
               if r.spec.job == pj.number and r.spec.host.local):
            pj.close()

    def check_left_mpi(self, r) -> None:
        """A rank that ended (status 0) without MPI while its job uses it: they would hang."""
        pj = self.of(r.spec)
        if pj is None or not pj.started or r.spec.rank in pj.started or r.failed:
            return
        others = sorted(pj.started)
        who = ", ".join(map(str, others[:8])) + (" ..." if len(others) > 8 else "")
        self.served.fail(r, f"exited with code 0 without joining MPI (it never initialized "
                          f"PMI) while rank(s) {who} did; they would wait for it forever",
                       1, abort=True)

    def watch_singletons(self) -> None:
        """Look for Open MPI singletons now and then, until the job ends."""
        self.check_singletons()
        if self.served.ending is None:
            self.served.loop.call_later(SINGLETON_POLL, self.watch_singletons)

    def check_singletons(self) -> None:
        """End the launch if a rank here started Open MPI alone (see mslaunch.mpi.pmi.singletons)."""
        if self.probe is not None:
            for key, size in self.probe.check():
                self.singleton(key, size)

    def singleton(self, key: int, size: int, nested_launcher: bool = False,
                  backing: Optional[bool] = None, nopmix: Optional[str] = None,
                  served: Optional[bool] = None, joined: bool = True) -> None:
        """Rank ``key`` reported an Open MPI world of ``size`` (see mslaunch.mpi.pmi.singletons);
        for a remote host's: ``nopmix`` why it serves no PMIx, ``served`` whether it does,
        ``joined`` whether the rank connected to it."""
        from ..mpi.pmi.singletons import runs_a_launcher
        if not 0 <= key < len(self.served.ranks):
            return
        r = self.served.ranks[key]
        pj = self.of(r.spec)
        if pj is None:
            return
        if served is None:
            served = r.spec.host.local and pj.pmix is not None
            joined = served and pj.joined_pmix(r.spec.rank)
        # a served rank's world without its connection here is a job of its own
        launcher = nested_launcher or (served and not joined and size != 1) or (
            r.spec.host.local and r.pid and not r.ended and self.probe is not None
            and key not in self.probe.certain and runs_a_launcher(r.pid))
        if served and not launcher and size in (0, pj.size):
            return      # an Open MPI rank of this very job, served PMIx (4's says size 0)
        if size != 1 or launcher:
            self._nested(r, backing)
            return
        if pj.size < 2:
            return
        if self.served.ending is None:
            self._note_leftovers()
        self.served.fail(r, self._singleton_message(r.spec.host.local, nopmix), 1, abort=True)

    def _singleton_message(self, local: bool, nopmix: Optional[str]) -> str:
        """Why a singleton, and the fix: the host's missing PMIx library, if that is why."""
        from ..mpi.pmi.singletons import singleton_message
        from ..mpi.pmix.lib import FIX
        problem = (self.pmix.problem if self.pmix is not None else None) if local else nopmix
        if problem:
            return singleton_message(why=problem, fix=FIX)
        return singleton_message()

    def _nested(self, r, backing: Optional[bool]) -> None:
        """A rank runs an Open MPI job of its own: say once what it inherits
        (``backing``: whether its host gave it the job's segment directory;
        None: this machine's probe knows)."""
        if backing is None:
            backing = self.probe is not None and self.probe.backing is not None
        if self.nested_said or not backing:
            return                # the user's own directory, or none of this job's
        self.nested_said = True
        self.served.log(f"rank {r.spec.rank} runs an Open MPI job of its own; its ranks inherit "
                     f"OMPI_MCA_btl_sm/vader_backing_directory, a directory of this job on "
                     f"{r.spec.host.name} only: on other hosts their shared memory is off "
                     f"(--mpi none for a job of launchers, or set the variables yourself)")

    def _note_leftovers(self) -> None:
        """Stop this host's ranks, noting what their Open MPI processes made in /dev/shm."""
        from ..mpi.pmi.singletons import SingletonFiles
        served = self.served
        if self.leftovers is None:
            self.leftovers = SingletonFiles(served.watchdog.keep, served.watchdog.flush)
        covered = served.spoken_for
        self.leftovers.stop([x.pid for x in served.ranks if x.spec.host.local and x.pid
                             and not x.ended and x.spec.key not in covered], served.loop)
        for looker in served.lookers.values():
            looker.end_singletons()

    def hang_report(self) -> List[str]:
        """Why a job may hang: ranks that never initialized MPI while the others of
        their job did (they wait for them in ``MPI_Init``), or ranks missing from a
        barrier others wait in."""
        lines = []
        for pj in self.jobs.values():
            job = f" of job {pj.number}" if pj.number != 1 else ""
            live = {r.spec.rank for r in self.served.ranks
                    if r.spec.job == pj.number and not r.ended}
            never = sorted(r for r in live if r not in pj.started)
            if pj.started and never:
                lines.append(f"{len(pj.started)} rank(s){job} initialized MPI and wait in "
                             f"MPI_Init for rank(s) {self._ranks(pj, never)}, which never "
                             f"did")
                continue
            missing = pj.state.waiting_for()  # type: ignore[attr-defined]
            if missing and len(missing) < pj.size:
                lines.append(f"{pj.size - len(missing)} rank(s){job} were waiting in a "
                             f"barrier (MPI_Init or a fence) for rank(s) "
                             f"{self._ranks(pj, missing)}, which never entered it")
        return lines

    def _ranks(self, pj: PMIJob, ranks: List[int]) -> str:
        """``1, 2 on host`` for ranks of ``pj`` (at most 16 shown)."""
        shown = ", ".join(map(str, ranks[:16])) + (" ..." if len(ranks) > 16 else "")
        keys = [pj.keys.get(r) for r in ranks]
        hosts = sorted({self.served.ranks[k].spec.host.name for k in keys if k is not None})
        return f"{shown} on {', '.join(hosts[:8])}"

    def reported(self) -> int:
        return len(self.first.started) if self.first is not None else 0

    # -- agents --------------------------------------------------------------
    def from_agent(self, host: AgentHost, message: Dict[str, Any]) -> None:
        """PMI traffic of a remote host's ranks (see :class:`~mslaunch.mpi.pmi.state.RelayJobState`)."""
        from ..wire import link
        op = message.get("op")
        if not self.jobs:
            raise link.LinkError("PMI frame in a job without PMI")
        if op in ("abort", "lost", "started", "singleton"):
            key = link.field(message, "rank", int, f"PMI {op}")
            if key not in host.ranks:
                raise link.LinkError(f"PMI {op} for rank {key}, not on this host")
            if op == "singleton":
                self.singleton(key, link.field(message, "size", int, "PMI singleton"),
                               message.get("launcher") is True,
                               backing=message.get("backing") is True,
                               nopmix=str(message["nopmix"])[:300]
                               if message.get("nopmix") else None,
                               served=message.get("pmix") is True,
                               joined=message.get("joined") is not False)
            elif op == "abort":
                self.pmi_abort(key, link.field(message, "code", int, "PMI abort"),
                               str(message.get("message", "")), host.local_time(message.get("at")))
            elif op == "lost":
                self.pmi_lost(key, host.local_time(message.get("at")))
            else:
                spec = self.served.ranks[key].spec
                pj = self.of(spec)
                if pj is not None:
                    if message.get("pmix") is True:
                        pj.pmix_in.add(spec.rank)
                    pj.started.add(spec.rank)
                    self.pmi_started(pj, spec.rank)
            return
        if op in ("pmix_fence", "pmix_names", "pmix_modex", "pmix_modex_done"):
            if self.pmix is None:
                raise link.LinkError("PMIx frame in a job without PMIx")
            self.pmix.from_agent(host, message)
            return
        if op not in ("fence", "get", "publish", "lookup", "unpublish", "spawn"):
            raise link.LinkError(f"unknown PMI operation {str(op)[:20]!r}")
        pj = self.jobs.get(str(message.get("kvs", "")))
        if pj is None:
            raise link.LinkError(f"PMI {op} for an unknown job")
        state = pj.state
        if op == "fence":
            ranks = link.field(message, "ranks", list, "PMI fence")
            pairs = link.field(message, "pairs", dict, "PMI fence")
            if not all(type(r) is int and pj.keys.get(r, -1) in host.ranks for r in ranks) \
                    or not all(isinstance(k, str) and isinstance(v, str)
                               for k, v in pairs.items()):
                raise link.LinkError("PMI fence: bad ranks or pairs")
            problem = state.remote_fence(ranks, pairs, lambda delta: host.send_pmi(  # type: ignore[attr-defined]
                {"op": "fence_done", "kvs": pj.kvsname, "pairs": delta}))
            if problem:
                raise link.LinkError(f"PMI fence: {problem}")
            return
        ask = link.field(message, "ask", int, f"PMI {op}")

        def answer(*value: object) -> None:
            host.send_pmi({"op": "answer", "kvs": pj.kvsname, "ask": ask,
                           "value": list(value) if op == "spawn" else value[0]})

        if op == "get":
            state.kvs_get(-1, str(link.field(message, "key", str, "PMI get")), answer)
        elif op == "publish":
            state.publish(link.field(message, "service", str, "PMI publish"),
                          link.field(message, "port", str, "PMI publish"), answer)
        elif op == "lookup":
            state.lookup(link.field(message, "service", str, "PMI lookup"), answer)
        elif op == "unpublish":
            state.unpublish(link.field(message, "service", str, "PMI unpublish"), answer)
        elif op == "spawn":
            from ..wire.jobframe import read_spawn, read_spawn_env
            key = link.field(message, "rank", int, "PMI spawn")
            if key not in host.ranks:
                raise link.LinkError(f"PMI spawn for rank {key}, not on this host")
            pmix = message.get("pmix") is True          # an Open MPI rank's (PMIx_Spawn)
            self.pmi_spawn(pj, self.served.ranks[key].spec.rank, read_spawn(message), answer,
                           extra_env=read_spawn_env(message) if pmix else (), pmix=pmix)

    # -- MPI_Comm_spawn ---------------------------------------------------------
    def pmix_spawn(self, parent: PMIJob, rank: int, commands: List[Any],
                   env: List[Tuple[str, str]], reply: Callable[..., None]) -> None:
        """An Open MPI rank here spawns (``PMIx_Spawn``): as an MPICH rank's spawn,
        its children served PMIx too, with the variables its application names."""
        from ..mpi.pmix import spawn_request
        self.pmi_spawn(parent, rank, spawn_request(commands), reply, extra_env=tuple(env),
                       pmix=True)

    def pmi_spawn(self, parent: PMIJob, rank: int, request: SpawnRequest,
                  reply: Callable[..., None], extra_env: Tuple[Tuple[str, str], ...] = (),
                  pmix: bool = False) -> None:
        served = self.served
        number = max([*self.naming, *(pj.number for pj in self.jobs.values())]) + 1
        kvsname = f"{served.plan.kvsname}_{number}"
        if served.ending is not None:
            reply("the job is ending")
            return
        spawner = next(r.spec for r in served.ranks
                       if r.spec.job == parent.number and r.spec.rank == rank)
        context_env = served.job.apps[spawner.app].env if parent.number == 1 else \
            parent.context_env
        context_env = tuple(context_env) + extra_env
        if not pmix:
            self._spawn(parent, rank, request, reply, number, kvsname, context_env, pmix)
            return
        from ..mpi.pmix import sibling_names
        search = sibling_names(kvsname, parent.kvsname)
        self.naming.append(number)       # (another spawn may begin meanwhile)

        def named() -> None:
            # a slice of the search at each turn of the loop: see sibling_names
            name = None if served.ending is not None else next(search)
            if name is None and served.ending is None:
                served.loop.call_later(0, named)
                return
            self.naming.remove(number)
            if name is None:
                reply("the job is ending")
            else:
                self._spawn(parent, rank, request, reply, number, name, context_env, pmix)
        named()

    def _spawn(self, parent: PMIJob, rank: int, request: SpawnRequest,
               reply: Callable[..., None], number: int, kvsname: str,
               context_env: Tuple[Tuple[str, Optional[str]], ...], pmix: bool) -> None:
        served = self.served
        who = f"rank {rank}" + (f" of job {parent.number}" if parent.number != 1 else "")
        try:
            specs, mapping = self._plan(request, number, kvsname, context_env)
            self._check_programs(specs)
            if pmix and self.pmix is None:
                raise PlanError("this launch serves no PMIx to spawned Open MPI processes")
            agentless = sorted({s.host.name for s in specs
                                if not s.host.local and s.host.name not in served.hosts})
            if agentless:        # (--launcher srun: srun started the job's ranks)
                raise PlanError(f"no agent of mslaunch's runs on {', '.join(agentless[:3])} "
                                f"to start the processes there")
        except (PlanError, LaunchError) as err:
            self.pmi_log(f"{who} could not spawn: {err}")
            reply(str(err))
            return
        pj = self._new(number, kvsname, len(specs), mapping, [s.app for s in specs],
                       {s.rank: s.key for s in specs}, parent.kvsname)
        pj.context_env = context_env
        for key, value in request.preput:
            pj.state.kvs_put(-1, key, value)
        if served.job.verbose:
            served.console.message(f"mslaunch: {who} spawned job {number}: {len(specs)} "
                                f"process(es) of {request.commands[0].program}")
        local = [s for s in specs if s.host.local]
        remote: Dict[str, List[RankSpec]] = {}
        for s in specs:
            if not s.host.local:
                remote.setdefault(s.host.name, []).append(s)
        served.add_ranks(specs)
        waiting = set(remote)
        failed: List[str] = []

        def give_up(problem: str) -> None:
            # The spawn fails in the parent only: what did start of it is
            # stopped and forgotten, outside the failure policy.
            self.pmi_log(f"{who} could not spawn: {problem}")
            served.abandon([s.key for s in specs])
            pj.close()
            reply(problem)

        def host_answered(name: str, problem: Optional[str]) -> None:
            if problem:
                failed.append(f"on {name}: {problem}")
            waiting.discard(name)
            if not waiting:
                give_up(failed[0]) if failed else reply(None, kvsname)

        layout = self.pmix.spawned_layout(specs, served.plan.universe_size, (
            parent.kvsname, rank)) if pmix and self.pmix is not None else None
        if layout is not None and self.pmix is not None:
            self.pmix.introduce(parent, pj, specs, layout)
        if local:
            pj.serve(served.loop, [s.app for s in specs], mapping, tcp=served.job.pmi_port,
                     trace=served.job.verbose >= 2, port_range=served.job.port_range)
            if layout is not None and self.pmix is not None:
                self.pmix.serve_spawned(pj, specs, layout)
            try:
                served.start_local(local, pj.inherited, pj.env)
            except LaunchError as err:
                give_up(str(err))
                return
        if not remote:
            reply(None, kvsname)
            return
        from functools import partial
        for name, host_specs in remote.items():
            try:
                served.hosts[name].spawn(pj, host_specs, mapping, partial(host_answered, name),
                                         pmix=layout)
            except LaunchError as err:              # (its ranks' output files)
                host_answered(name, str(err))

    def _plan(self, request: SpawnRequest, number: int, kvsname: str, context_env):
        from ..hosts import is_local
        from ..plan.spawn import plan_spawn
        served = self.served
        live: Dict[str, int] = {}
        for r in served.ranks:
            if not r.ended:
                live[r.spec.host.name] = live.get(r.spec.host.name, 0) + 1
        return plan_spawn(served.job, served.plan, request, number=number, kvsname=kvsname,
                          first_key=len(served.ranks), live=live, environ=os.environ,
                          oversubscribe=served.plan.oversubscribe, is_local=is_local,
                          hosts=served.plan.hosts + tuple(h for h in served.plan.spare_hosts
                                                       if h.local or h.name in served.hosts),
                          context_env=context_env)

    @staticmethod
    def _check_programs(specs) -> None:
        from ..machine.spawn import check_startable
        check_startable([s for s in specs if s.host.local])

    # -- end ------------------------------------------------------------------
    def close(self) -> None:
        from ..mpi.pmi.files import remove_shm_segments
        for pj in self.jobs.values():
            pj.close()
            remove_shm_segments(pj.kvsname)
        if self.pmix is not None:
            self.pmix.close()
        if self.probe is not None:
            self.probe.close()
        if self.leftovers is not None:
            self.leftovers.remove()

    def stats(self, ranks: int) -> str:
        """``MSLAUNCH_PMI_STATS``: messages served and time spent, all jobs together."""
        servers: List[PMIServer] = [pj.server for pj in self.jobs.values()
                                    if pj.server is not None]
        total = sum(s.stats["total"] for s in servers)
        busy = sum(s.busy_seconds for s in servers)
        return f"{total} messages from {ranks} ranks in {busy:.4f} s"
