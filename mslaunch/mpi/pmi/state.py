"""The job-wide PMI state behind the protocol handlers.

:class:`JobState` is the interface: KVS, barriers, node attributes and
published names, each answering through a callback so that an agent can
relay it.  :class:`LocalJobState` keeps all of it in this process.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Dict, List, Optional, Sequence, Tuple

    from ...core.spec import SpawnRequest

from .wire import VALLEN_MAX

#: Bytes of keys and values one job may store: MPICH puts one business card
#: (a few kilobytes) per node, so this is room for thousands of nodes, and a
#: flood of puts from a misbehaving rank cannot exhaust the launcher.
KVS_MAX_BYTES = 64 << 20


class PMIListener:
    """What the PMI server reports to the supervisor (a protocol of five
    methods: any object with the first three will do; ``pmi_started`` and
    ``pmi_spawn`` are optional)."""

    def pmi_abort(self, rank: int, code: int, message: str,
                  at: Optional[float] = None) -> None: ...

    def pmi_lost(self, rank: int, at: Optional[float] = None) -> None: ...

    def pmi_log(self, message: str) -> None: ...

    def pmi_started(self, rank: int) -> None:
        """Optional: ``rank`` initialized PMI for the first time."""

    def pmi_spawn(self, rank: int, request: SpawnRequest,
                  reply: Callable[..., None]) -> None:
        """Optional: ``rank`` asks for a new job; ``reply(None, kvsname)`` once it
        runs, ``reply(problem)`` when it cannot.  Without it spawns are refused."""
        reply("spawn_not_supported_here")


class JobState:
    """The job-wide state behind the protocol handlers.

    Anything that may need another host answers through a callback (called at
    most once, possibly later), so an agent can relay it.  ``barrier`` calls
    ``done`` when every rank of the job has entered; it raises ValueError if
    ``rank`` is already waiting.
    """

    kvsname: str
    size: int
    universe_size: int

    def appnum(self, rank: int) -> int:
        raise NotImplementedError

    def job_attr(self, key: str) -> Optional[str]:
        raise NotImplementedError

    def kvs_put(self, rank: int, key: str, value: str) -> bool:
        """Store a pair; False when the job's key-value space is full."""
        raise NotImplementedError

    def kvs_get(self, rank: int, key: str, reply: Callable[[Optional[str]], None]) -> None:
        raise NotImplementedError

    def barrier(self, rank: int, done: Callable[[], None]) -> None:
        raise NotImplementedError

    def node_attr_put(self, rank: int, key: str, value: str) -> None:
        raise NotImplementedError

    def node_attr_get(self, rank: int, key: str, wait: bool, reply: Callable[[Optional[str]], None]) -> None:
        raise NotImplementedError

    def publish(self, service: str, port: str, reply: Callable[[bool], None]) -> None:
        raise NotImplementedError

    def lookup(self, service: str, reply: Callable[[Optional[str]], None]) -> None:
        raise NotImplementedError

    def unpublish(self, service: str, reply: Callable[[bool], None]) -> None:
        raise NotImplementedError


class LocalJobState(JobState):
    """All of a job's PMI state in this process (the launcher's view).

    Ranks on other hosts take part through their agents: an agent enters the
    barrier once for all its ranks (:meth:`remote_fence`), bringing the
    pairs they put; when every rank of the job has entered, each agent gets
    the pairs put since the previous barrier, so that its ranks' gets are
    answered from its own cache.
    """

    def __init__(self, *, kvsname: str, size: int, process_mapping: str,
                 universe_size: int, appnums: Sequence[int],
                 names: Optional[Dict[str, str]] = None,
                 hwloc_xml: Optional[str] = None) -> None:
        self.kvsname = kvsname
        self.size = size
        self.universe_size = universe_size
        self._appnums = list(appnums)
        self._attrs: Dict[str, str] = {"universeSize": str(universe_size)}
        if hwloc_xml:
            self._attrs["PMI_hwloc_xmlfile"] = hwloc_xml    # see mslaunch.mpi.pmi.files
        # A mapping the client cannot hold is served as a miss (see module doc).
        if process_mapping and len(process_mapping) < VALLEN_MAX:
            self._attrs["PMI_process_mapping"] = process_mapping
        self._mapping = process_mapping
        self._nodes: Optional[List[int]] = None     # each rank's node, read at the first ask
        self._kvs: Dict[str, str] = {}
        self._kvs_bytes = 0
        self._in_barrier: Dict[int, Optional[Callable[[], None]]] = {}
        self._remote_waiters: List[Callable[[Dict[str, str]], None]] = []
        self._since_barrier: Dict[str, str] = {}
        self._node_attrs: Dict[Tuple[int, str], str] = {}
        self._node_waiters: Dict[Tuple[int, str], List[Callable[[Optional[str]], None]]] = {}
        # Published names; jobs that share them (a job and those it spawned)
        # pass the same dictionary.
        self._names: Dict[str, str] = {} if names is None else names

    def appnum(self, rank: int) -> int:
        return self._appnums[rank]

    def job_attr(self, key: str) -> Optional[str]:
        return self._attrs.get(key)

    def kvs_put(self, rank: int, key: str, value: str) -> bool:
        old = self._kvs.get(key)
        size = self._kvs_bytes + len(key) + len(value) - (len(key) + len(old) if old else 0)
        if size > KVS_MAX_BYTES:
            return False
        self._kvs[key] = value
        self._kvs_bytes = size
        self._since_barrier[key] = value
        return True

    def kvs_get(self, rank: int, key: str, reply: Callable[[Optional[str]], None]) -> None:
        reply(self._kvs.get(key))

    def barrier(self, rank: int, done: Callable[[], None]) -> None:
        if rank in self._in_barrier:
            raise ValueError(f"rank {rank} entered the barrier twice")
        self._in_barrier[rank] = done
        self._maybe_release()

    def remote_fence(self, ranks: Sequence[int], pairs: Dict[str, str],
                     done: Callable[[Dict[str, str]], None]) -> Optional[str]:
        """An agent's ranks enter the barrier with the pairs they put.

        ``done`` gets the pairs put by the whole job since the previous
        barrier once everyone has entered.  Returns an error text instead
        when the entry is not acceptable.
        """
        for rank in ranks:
            if not 0 <= rank < self.size or rank in self._in_barrier:
                return f"rank {rank} cannot enter the barrier (unknown or already in it)"
        for key, value in pairs.items():
            if not self.kvs_put(-1, key, value):
                return "the job's key-value space is full"
        for rank in ranks:
            self._in_barrier[rank] = None
        self._remote_waiters.append(done)
        self._maybe_release()
        return None

    def _maybe_release(self) -> None:
        if len(self._in_barrier) < self.size:
            return
        waiting, self._in_barrier = self._in_barrier, {}
        remote, self._remote_waiters = self._remote_waiters, []
        delta, self._since_barrier = self._since_barrier, {}
        for release in waiting.values():
            if release is not None:
                release()
        for send in remote:
            send(delta)

    def waiting_for(self) -> List[int]:
        """Ranks that have not entered a barrier some others are waiting in."""
        if not self._in_barrier:
            return []
        return [r for r in range(self.size) if r not in self._in_barrier]

    def _node_of(self, rank: int) -> int:
        if self._nodes is None:
            from ...core.procmap import parse_process_mapping
            try:
                self._nodes = parse_process_mapping(self._mapping, self.size)
            except ValueError:
                self._nodes = [0] * self.size
        return self._nodes[rank]

    def node_attr_put(self, rank: int, key: str, value: str) -> None:
        slot = (self._node_of(rank), key)
        self._node_attrs[slot] = value
        for reply in self._node_waiters.pop(slot, []):
            reply(value)

    def node_attr_get(self, rank: int, key: str, wait: bool, reply: Callable[[Optional[str]], None]) -> None:
        slot = (self._node_of(rank), key)
        value = self._node_attrs.get(slot)
        if value is None and wait:
            self._node_waiters.setdefault(slot, []).append(reply)
        else:
            reply(value)

    def publish(self, service: str, port: str, reply: Callable[[bool], None]) -> None:
        if service in self._names:
            reply(False)
        else:
            self._names[service] = port
            reply(True)

    def lookup(self, service: str, reply: Callable[[Optional[str]], None]) -> None:
        reply(self._names.get(service))

    def unpublish(self, service: str, reply: Callable[[bool], None]) -> None:
        reply(self._names.pop(service, None) is not None)




class RelayJobState(LocalJobState):
    """An agent's view: its own ranks' PMI, with the job-wide part at the launcher.

    Puts go to a local cache and, with the next barrier, to the launcher;
    the barrier is entered upstream once, when every rank of this host has
    entered it, and released when the launcher answers with the pairs of the
    whole job.  Gets are answered from the cache, and asked upstream only on
    a miss; published names live at the launcher.  Node attributes are this
    host's own business.  ``send`` carries one message (a dict) upstream;
    :meth:`answer` takes the launcher's replies.
    """

    def __init__(self, *, kvsname: str, size: int, process_mapping: str, universe_size: int,
                 appnums: Sequence[int], local_ranks: Sequence[int],
                 send: Callable[[Dict[str, object]], None],
                 hwloc_xml: Optional[str] = None) -> None:
        super().__init__(kvsname=kvsname, size=size, process_mapping=process_mapping,
                         universe_size=universe_size, appnums=appnums, hwloc_xml=hwloc_xml)
        self._local = set(local_ranks)
        self._send = send
        self._entered: Dict[int, Callable[[], None]] = {}
        self._pending: Dict[str, str] = {}
        self._asks: Dict[int, Callable[..., None]] = {}
        self._next_ask = 0

    def kvs_put(self, rank: int, key: str, value: str) -> bool:
        if not super().kvs_put(rank, key, value):
            return False
        self._pending[key] = value
        return True

    def kvs_get(self, rank: int, key: str, reply: Callable[[Optional[str]], None]) -> None:
        value = self._kvs.get(key)
        if value is not None:
            reply(value)
        else:
            self.ask({"op": "get", "key": key}, reply)

    def barrier(self, rank: int, done: Callable[[], None]) -> None:
        if rank in self._entered:
            raise ValueError(f"rank {rank} entered the barrier twice")
        self._entered[rank] = done
        if len(self._entered) == len(self._local):
            pairs, self._pending = self._pending, {}
            self._send({"op": "fence", "kvs": self.kvsname, "ranks": sorted(self._entered),
                        "pairs": pairs})

    def fence_done(self, pairs: Dict[str, str]) -> None:
        for key, value in pairs.items():
            LocalJobState.kvs_put(self, -1, key, value)
        waiting, self._entered = self._entered, {}
        for release in waiting.values():
            release()

    def waiting_for(self) -> List[int]:
        if not self._entered:
            return []
        return sorted(self._local - set(self._entered))

    def publish(self, service: str, port: str, reply: Callable[[bool], None]) -> None:
        self.ask({"op": "publish", "service": service, "port": port}, reply)

    def lookup(self, service: str, reply: Callable[[Optional[str]], None]) -> None:
        self.ask({"op": "lookup", "service": service}, reply)

    def unpublish(self, service: str, reply: Callable[[bool], None]) -> None:
        self.ask({"op": "unpublish", "service": service}, reply)

    def ask(self, message: Dict[str, object], reply: Callable[..., None]) -> None:
        self._next_ask += 1
        self._asks[self._next_ask] = reply
        message["ask"] = self._next_ask
        message["kvs"] = self.kvsname
        self._send(message)

    def answer(self, ask: int, value: object) -> None:
        """The launcher's reply to :meth:`ask` number ``ask``."""
        reply = self._asks.pop(ask, None)
        if reply is not None:
            reply(value)
