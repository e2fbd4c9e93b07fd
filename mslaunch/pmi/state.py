"""The job-wide PMI state behind the protocol handlers.

:class:`JobState` is the interface: KVS, barriers, node attributes and
published names, each answering through a callback so that an agent can
relay it.  :class:`LocalJobState` keeps all of it in this process.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Dict, List, Optional, Sequence, Tuple

from .mapping import parse_process_mapping
from .wire import VALLEN_MAX

#: Bytes of keys and values one job may store: MPICH puts one business card
#: (a few kilobytes) per node, so this is room for thousands of nodes, and a
#: flood of puts from a misbehaving rank cannot exhaust the launcher.
KVS_MAX_BYTES = 64 << 20


class PMIListener:
    """What the PMI server reports to the supervisor (a protocol: any object
    with these three methods will do)."""

    def pmi_abort(self, rank: int, code: int, message: str) -> None: ...

    def pmi_lost(self, rank: int) -> None: ...

    def pmi_log(self, message: str) -> None: ...

    def pmi_started(self, rank: int) -> None:
        """Optional: ``rank`` initialized PMI for the first time."""


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
    """All of a job's PMI state in this process (the launcher's view)."""

    def __init__(self, *, kvsname: str, size: int, process_mapping: str,
                 universe_size: int, appnums: Sequence[int]) -> None:
        self.kvsname = kvsname
        self.size = size
        self.universe_size = universe_size
        self._appnums = list(appnums)
        self._attrs: Dict[str, str] = {"universeSize": str(universe_size)}
        # A mapping the client cannot hold is served as a miss (see module doc).
        if process_mapping and len(process_mapping) < VALLEN_MAX:
            self._attrs["PMI_process_mapping"] = process_mapping
        try:
            self._node_of = parse_process_mapping(process_mapping, size)
        except ValueError:
            self._node_of = [0] * size
        self._kvs: Dict[str, str] = {}
        self._kvs_bytes = 0
        self._in_barrier: Dict[int, Callable[[], None]] = {}
        self._node_attrs: Dict[Tuple[int, str], str] = {}
        self._node_waiters: Dict[Tuple[int, str], List[Callable[[Optional[str]], None]]] = {}
        self._names: Dict[str, str] = {}

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
        return True

    def kvs_get(self, rank: int, key: str, reply: Callable[[Optional[str]], None]) -> None:
        reply(self._kvs.get(key))

    def barrier(self, rank: int, done: Callable[[], None]) -> None:
        if rank in self._in_barrier:
            raise ValueError(f"rank {rank} entered the barrier twice")
        self._in_barrier[rank] = done
        if len(self._in_barrier) == self.size:
            waiting, self._in_barrier = self._in_barrier, {}
            for release in waiting.values():
                release()

    def node_attr_put(self, rank: int, key: str, value: str) -> None:
        slot = (self._node_of[rank], key)
        self._node_attrs[slot] = value
        for reply in self._node_waiters.pop(slot, []):
            reply(value)

    def node_attr_get(self, rank: int, key: str, wait: bool, reply: Callable[[Optional[str]], None]) -> None:
        slot = (self._node_of[rank], key)
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


