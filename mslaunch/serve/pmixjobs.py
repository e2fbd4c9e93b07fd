"""The launcher's PMIx: a server for its own ranks, and the fences that span hosts.

Beside the PMI of :class:`~.mpijobs.MPIJobs`, the first job's ranks here
are served PMIx (:class:`~mslaunch.mpi.pmix.host.PMIxHost`), so that an Open MPI
program runs under the same command line as an MPICH one; remote hosts'
agents serve their own ranks.  A fence whose ranks are on several hosts is
gathered here (:class:`~mslaunch.mpi.pmix.exchange.FenceExchange`): the local
server's part directly, the agents' in ``PMI`` frames of their own
operation (``pmix_fence`` up, ``pmix_fence_done`` down, the opaque data in
base64).
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, FrozenSet, List, Optional, Sequence, Tuple

    from ..mpi.early import EarlyMPI
    from ..mpi.pmi.job import PMIJob
    from ..mpi.pmix.exchange import FenceExchange
    from ..mpi.pmix.names import NameBoard
    from ..mpi.pmix.host import PMIxHost
    from .modex import ModexAsks
    from ..core.spec import RankSpec
    from ..seams import AgentHost, ServedJob

from ..mpi.pmix import oversubscribed

#: The launcher's name among a fence's hosts.
HERE = ""


class LauncherPMIx:
    """See the module docstring; ``jobs`` are the launch's PMI jobs by name (the
    dictionary of :class:`~.mpijobs.MPIJobs`, which adds to it)."""

    def __init__(self, served: ServedJob, jobs: Dict[str, PMIJob]) -> None:
        self.served = served
        self.jobs = jobs
        self.host: Optional[PMIxHost] = None
        self._exchange: Optional[FenceExchange] = None
        self._board: Optional[NameBoard] = None
        self._modex: Optional[ModexAsks] = None     # made when a remote host takes part
        self.layouts: Dict[str, Dict[str, Any]] = {}      # spawned jobs', by namespace

    @property
    def exchange(self) -> FenceExchange:
        """The fences that span hosts (made at the first; most jobs have none)."""
        if self._exchange is None:
            from ..mpi.pmix.exchange import FenceExchange
            self._exchange = FenceExchange(self._participants)
        return self._exchange

    @property
    def board(self) -> NameBoard:
        """Published names (made at the first publish or lookup)."""
        if self._board is None:
            from ..mpi.pmix.names import NameBoard
            self._board = NameBoard()
        return self._board

    def serve_first(self, pj: PMIJob, early: Optional[EarlyMPI] = None) -> None:
        """PMIx for the first job's ranks on this machine (``early``: what they were
        given before, see :mod:`mslaunch.mpi.early`)."""
        from ..mpi.pmi.files import pmix_dir
        from ..mpi.pmix.host import PMIxHost
        from ..mpi.pmix.layout import Layout, app_commands
        served = self.served
        plan = served.plan
        here = next(r.host.node_id for r in plan.ranks if r.host.local)
        local = [r for r in plan.ranks if r.host.local]
        layout = Layout(pj.kvsname, [h.name for h in plan.hosts],
                        [r.host.node_id for r in plan.ranks], [r.app for r in plan.ranks],
                        plan.universe_size, here, oversubscribed(local),
                        commands=app_commands(local))
        marker = served.watchdog.marker
        log = served.log if served.job.verbose else (lambda message: None)
        # With --max-restarts, one server for every attempt (see PMIxServer.move_to).
        session = served.session
        def keepalive() -> None:
            for host in served.hosts.values():
                host.beat_now()
        if session.pmix is not None:
            session.pmix.adopt(served.loop, log, self.fetch, keepalive)
            self.host = session.pmix
        else:
            self.host = PMIxHost(served.loop, early.directory if early is not None
                                 else pmix_dir(marker), log, self.fetch, keepalive)
            if session.attempts:
                session.pmix = self.host
            if early is not None and early.door is not None and early.kept is not None:
                self.host.open_door(early.door, *early.kept)

        def relay(signature: str, sequence: int, blob: bytes,
                  done: Callable[[bytes], None]) -> None:
            self.exchange.contribute(pj.kvsname, signature, sequence, HERE, blob, done)
        self.host.serve(pj, layout, relay)
        waiting = self.host.pending.get(pj.kvsname)
        if early is not None and waiting is not None:
            waiting.ranks.update(early.pmix_ranks)

    @staticmethod
    def spawned_layout(specs: Sequence[RankSpec], universe: int,
                       parent: Tuple[str, int]) -> Dict[str, Any]:
        """Where a job an Open MPI rank spawned runs, as its hosts' agents are told."""
        nodes: List[str] = []
        for s in specs:
            if s.host.name not in nodes:
                nodes.append(s.host.name)
        return {"pmix_nodes": nodes, "pmix_node_of": [nodes.index(s.host.name) for s in specs],
                "pmix_universe": universe, "pmix_parent": list(parent)}

    def serve_spawned(self, pj: PMIJob, specs: Sequence[RankSpec],
                      fields: Dict[str, Any]) -> None:
        """PMIx for a job an Open MPI rank spawned onto this machine; ``fields``
        are its :meth:`spawned_layout`."""
        from ..mpi.pmix.layout import Layout, app_commands
        if self.host is None:
            return
        nodes = fields["pmix_nodes"]
        name, rank = fields["pmix_parent"]
        local = [s for s in specs if s.host.local]
        layout = Layout(pj.kvsname, nodes, fields["pmix_node_of"], [s.app for s in specs],
                        fields["pmix_universe"],
                        nodes.index(next(s.host.name for s in specs if s.host.local)),
                        oversubscribed(local), parent=(name, rank),
                        commands=app_commands(local))

        def relay(signature: str, sequence: int, blob: bytes,
                  done: Callable[[bytes], None]) -> None:
            self.exchange.contribute(pj.kvsname, signature, sequence, HERE, blob, done)
        self.host.serve(pj, layout, relay)

    def check_mixed(self, pj: PMIJob) -> None:
        """End the launch if every rank of ``pj`` joined, some through PMI (MPICH),
        some through PMIx (Open MPI): each side would wait for the other forever."""
        if len(pj.started) < pj.size or not pj.pmix_in or pj.started <= pj.pmix_in:
            return
        pmi, pmix = min(pj.started - pj.pmix_in), min(pj.pmix_in)
        served = self.served
        r = next((r for r in served.ranks if r.spec.job == pj.number and r.spec.rank == pmi),
                 None)
        if r is not None:
            served.fail(r, f"initialized MPI through PMI (MPICH's) while rank {pmix} did "
                        f"through PMIx (Open MPI's): the ranks of one job must link one "
                        f"MPI, or each side waits for the other forever", 1, abort=True)

    @property
    def problem(self) -> Optional[str]:
        """Why this machine serves no PMIx, if it tried."""
        return self.host.problem if self.host is not None else None

    def _participants(self, kvs: str, signature: str) -> FrozenSet[str]:
        """The hosts (:data:`HERE` for this one) with a rank in a fence."""
        served = self.served
        hosts = set()
        from ..mpi.pmix.exchange import CONNECT_PREFIX
        if signature.startswith(CONNECT_PREFIX):
            signature = signature[len(CONNECT_PREFIX):]
        for item in signature.split(","):
            ns, _, rank = item.rpartition(":")
            pj = self.jobs.get(ns)
            if pj is None:
                raise ValueError(f"a fence of an unknown job {ns[:40]!r}")
            if rank == "*":
                keys = list(pj.keys.values())
            elif rank.isdigit() and int(rank) in pj.keys:
                keys = [pj.keys[int(rank)]]
            else:
                raise ValueError(f"a fence of rank {rank[:12]!r}, not of job {ns[:40]!r}")
            for key in keys:
                spec = served.ranks[key].spec
                hosts.add(HERE if spec.host.local else spec.host.name)
        return frozenset(hosts)

    def from_agent(self, host: AgentHost, message: Dict[str, Any]) -> None:
        """An agent's PMIx operation: names, direct modex, else its part of a fence."""
        op = message.get("op")
        if op == "pmix_names":
            self.names_from_agent(host, message)
        elif op in ("pmix_modex", "pmix_modex_done"):
            self.modex_from_agent(host, message)
        else:
            self._fence_from_agent(host, message)

    def _fence_from_agent(self, host: AgentHost, message: Dict[str, Any]) -> None:
        """An agent's part of a fence (``pmix_fence``)."""
        from ..wire import link
        kvs = link.field(message, "kvs", str, "PMIx fence")
        signature = link.field(message, "sig", str, "PMIx fence")
        sequence = link.field(message, "seq", int, "PMIx fence")
        if kvs not in self.jobs or f"{kvs}:" not in signature:
            raise link.LinkError("PMIx fence of an unknown job")
        try:
            from ..mpi.pmix.exchange import decode_blob, encode_blob
            blob = decode_blob(message.get("blob"))
            self.exchange.contribute(kvs, signature, sequence, host.name, blob, lambda whole: (
                host.send_pmi({"op": "pmix_fence_done", "kvs": kvs, "sig": signature,
                               "seq": sequence, "blob": encode_blob(whole)})))
        except ValueError as err:
            raise link.LinkError(f"PMIx fence: {err}") from None

    def names(self, kvs: str, request: Dict[str, Any], done: Callable[[Any], None]) -> None:
        """A rank's publish, lookup or unpublish (see :mod:`mslaunch.mpi.pmix.names`)."""
        what, rank = request["what"], request["rank"]
        if what == "publish":
            done(self.board.publish(request["pairs"], kvs, rank,
                                    bool(request.get("first_read"))))
        elif what == "lookup":
            self.board.lookup(request["keys"], bool(request.get("wait")), done)
        else:
            self.board.unpublish(request["keys"], kvs, rank)
            done(None)

    def names_from_agent(self, host: AgentHost, message: Dict[str, Any]) -> None:
        """An agent's ``pmix_names`` operation, answered with ``pmix_names_done``."""
        from ..wire import link
        kvs = link.field(message, "kvs", str, "PMIx names")
        ask = link.field(message, "ask", int, "PMIx names")
        rank = link.field(message, "rank", int, "PMIx names")
        what = message.get("what")
        pj = self.jobs.get(kvs)
        if pj is None or pj.keys.get(rank, -1) not in host.ranks:
            raise link.LinkError("PMIx names: a rank not on this host")
        request: Dict[str, Any] = {"what": what, "rank": rank}
        if what == "publish":
            pairs = link.field(message, "pairs", dict, "PMIx publish")
            if not all(isinstance(k, str) and isinstance(v, str) for k, v in pairs.items()):
                raise link.LinkError("PMIx publish: pairs must be strings")
            request.update(pairs=pairs, first_read=message.get("first_read") is True)
        elif what in ("lookup", "unpublish"):
            keys = link.field(message, "keys", list, f"PMIx {what}")
            if not all(isinstance(k, str) for k in keys):
                raise link.LinkError(f"PMIx {what}: keys must be strings")
            request.update(keys=keys, wait=message.get("wait") is True)
        else:
            raise link.LinkError(f"unknown PMIx names operation {str(what)[:20]!r}")
        self.names(kvs, request, lambda value: host.send_pmi(
            {"op": "pmix_names_done", "ask": ask,
             "value": {k: list(v) for k, v in value.items()} if what == "lookup" else value}))

    def _layout_of(self, pj: PMIJob) -> Dict[str, Any]:
        if pj.kvsname in self.layouts:
            return self.layouts[pj.kvsname]
        plan = self.served.plan
        return {"pmix_nodes": [h.name for h in plan.hosts],
                "pmix_node_of": [r.host.node_id for r in plan.ranks],
                "pmix_universe": plan.universe_size, "appnums": [r.app for r in plan.ranks]}

    def introduce(self, parent: PMIJob, child: PMIJob, specs: Sequence[RankSpec],
                  layout: Dict[str, Any]) -> None:
        """Make a spawned job known to the hosts of its parent job, and the parent
        job to the hosts of its children, so that each side's server asks for the
        other's data (direct modex) instead of waiting for it."""
        from ..mpi.pmix.layout import Layout
        self.layouts[child.kvsname] = dict(layout, appnums=[s.app for s in specs])
        hosts_of: Dict[str, set] = {parent.kvsname: set(), child.kvsname: set()}
        for pj in (parent, child):
            for key in pj.keys.values():
                spec = self.served.ranks[key].spec
                hosts_of[pj.kvsname].add(HERE if spec.host.local else spec.host.name)
        for pj, other in ((child, parent), (parent, child)):
            fields = self._layout_of(pj)
            for name in hosts_of[other.kvsname] - hosts_of[pj.kvsname]:
                if name == HERE:
                    if self.host is not None:
                        self.host.guest(Layout(pj.kvsname, fields["pmix_nodes"],
                                               fields["pmix_node_of"], fields["appnums"],
                                               fields["pmix_universe"], -1))
                elif name in self.served.hosts:
                    self.served.hosts[name].send_pmi(dict(fields, op="pmix_guest", kvs=pj.kvsname))

    # -- direct modex: a process's data, from the host that has it ----------------
    def fetch(self, nspace: str, rank: int, done: Callable[[Optional[bytes]], None]) -> None:
        """What process ``rank`` of job ``nspace`` put, asked of its host."""
        pj = self.jobs.get(nspace)
        key = pj.keys.get(rank) if pj is not None else None
        if key is None:
            done(None)
            return
        spec = self.served.ranks[key].spec
        if spec.host.local:
            if self.host is None:
                done(None)
            else:
                self.host.local_modex(nspace, rank, done)
            return
        remote = self.served.hosts.get(spec.host.name)
        if remote is None:
            done(None)
        else:
            self.modex().ask(nspace, rank, done, remote.send_pmi)

    def modex_from_agent(self, host: AgentHost, message: Dict[str, Any]) -> None:
        """An agent's question for a process's data (``pmix_modex``), or its answer to
        one of the launcher's (``pmix_modex_done``)."""
        self.modex().received(message, host.send_pmi, self.fetch)

    def modex(self) -> ModexAsks:
        """The direct modex over the link (its module only for jobs with remote hosts)."""
        if self._modex is None:
            from .modex import ModexAsks
            self._modex = ModexAsks()
        return self._modex

    def close(self) -> None:
        host = self.host
        carried = self.served.session.pmix is host
        if host is not None:
            if carried:
                host.retire()        # closed once the last attempt ended
            else:
                host.close()

