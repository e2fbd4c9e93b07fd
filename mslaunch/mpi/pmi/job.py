"""One MPI job's PMI in this process: its state, the server of its ranks here,
and the numbering between the two.

A launcher runs one job, and one more for every ``MPI_Comm_spawn``; each
has its kvsname, its :class:`~mslaunch.mpi.pmi.state.JobState` and, when some
of its ranks run on this host, a :class:`~mslaunch.mpi.pmi.server.PMIServer`.
Ranks are numbered within their job on the PMI wire, and by their
:attr:`~mslaunch.core.spec.RankSpec.key` everywhere else; a :class:`PMIJob` is
the server's listener and hands its events on to its owner (the
supervisor, or a remote host's agent) with the key of the rank concerned.
"""

from __future__ import annotations

import os

from ...core import socket
from ..early import first_word

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Dict, List, Mapping, Optional, Protocol, Set, Tuple, Union

    from ...machine.loop import Loop
    from ..early import SingletonProbe
    from ...core.spec import SpawnRequest
    from .server import PMIServer
    from .state import JobState


    class Namespace(Protocol):
        """What a job needs of its PMIx namespace (mslaunch.mpi.pmix.server's, a service
        beside this one, set by whoever serves PMIx)."""

        def env(self, rank: int, own: Mapping[str, str]) -> Dict[str, str]: ...

        def drain(self) -> None: ...

        def deregister(self) -> None: ...


class PMIJob:
    """See the module docstring; ``keys`` maps this host's ranks of the job to keys."""

    def __init__(self, owner, *, number: int, kvsname: str, size: int,
                 state: Union[JobState, Callable[[], JobState]], keys: Mapping[int, int],
                 spawner: Optional[str] = None) -> None:
        self.owner = owner
        self.number = number
        self._state = state             # or what makes it, at its first use
        self.kvsname = kvsname
        self.size = size
        self.keys: Dict[int, int] = dict(keys)
        self.spawner = spawner          # the kvsname of the job that spawned this one
        self.started: Set[int] = set()  # ranks (of the job) that initialized PMI
        self.context_env: tuple = ()    # the -x exports its processes were given
        self.probe: Optional[SingletonProbe] = None   # where Open MPI ranks report
        self.server: Optional[PMIServer] = None
        self.tcp = False
        self._make: Optional[Callable[[], PMIServer]] = None   # the server, when needed
        self._ours: Dict[int, socket.socket] = {}     # by rank, until the server takes them
        self._theirs: Dict[int, socket.socket] = {}   # the ranks' ends, until spawned
        self._loop: Optional[Loop] = None
        self._env: Optional[Callable[[int], Dict[str, str]]] = None
        self.pmix: Optional[Namespace] = None   # its PMIx namespace here, if served
        self.pmix_in: Set[int] = set()          # ranks connected to it (remote: reported)
        self.pmix_done: Set[int] = set()        # ... and finalized

    @property
    def state(self) -> JobState:
        """The job's PMI state (made at its first use: most jobs never ask)."""
        if callable(self._state):
            self._state = self._state()
        return self._state

    def serve(self, loop: Loop, appnums, process_mapping: str, tcp: bool,
              trace: bool = False, port_range: Optional[Tuple[int, int]] = None,
              tcp_host: str = "127.0.0.1",
              admit: Optional[Callable[[str], bool]] = None) -> None:
        """Serve PMI to this job's ranks on this host (inherited sockets or TCP on
        ``tcp_host``, on a port of ``port_range`` if given, to the peers ``admit``
        lets in); ``trace``: every message to the owner's log (``-v -v``)."""
        def make() -> PMIServer:
            from .server import PMIServer
            state = self.state
            self.server = server = PMIServer(
                loop, kvsname=self.kvsname, size=self.size, process_mapping=process_mapping,
                universe_size=state.universe_size, appnums=appnums,
                listener=self, state=state,  # type: ignore[arg-type]
                spawner=self.spawner)
            server.trace = trace
            return server

        self.tcp = tcp
        if tcp:
            server = make()
            server.listen_tcp(tcp_host, port_range=port_range, admit=admit)
            self._env = server.tcp_env
        else:
            if not 0 < self.size == len(appnums):
                raise ValueError(f"{len(appnums)} appnums for {self.size} ranks")
            self._make, self._loop = make, loop
            self._env = lambda rank: {"PMI_FD": str(self._pair(rank))}

    def _pair(self, rank: int) -> int:
        """Rank ``rank``'s socket pair; returns the end it inherits (``PMI_FD``)."""
        if not 0 <= rank < self.size:
            raise ValueError(f"rank {rank} outside 0..{self.size - 1}")
        if rank in self._ours or rank in self._theirs or self.server is not None:
            raise ValueError(f"rank {rank} already has a PMI socket")
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        os.set_inheritable(theirs.fileno(), True)
        ours.setblocking(False)
        self._theirs[rank] = theirs
        self._watch(rank, ours)
        return theirs.fileno()

    def adopt(self, ours: Mapping[int, socket.socket],
              theirs: Mapping[int, socket.socket]) -> None:
        """Take over the socket pairs of ranks started before the job was served (see
        :mod:`mslaunch.mpi.early`): ``ours`` read from now on, ``theirs`` the ranks'
        ends still open."""
        self._theirs.update(theirs)
        for rank, sock in ours.items():
            self._watch(rank, sock)

    def _watch(self, rank: int, ours: socket.socket) -> None:
        self._ours[rank] = ours
        assert self._loop is not None
        self._loop.add_reader(ours.fileno(), lambda: self._knock(rank))

    def _knock(self, rank: int) -> None:
        """Rank ``rank``'s socket is readable: its first words (the server is made
        and takes every socket) or its end without any."""
        said = first_word(self._ours[rank])
        if said is None:
            return
        if not said:
            self._drop(rank)
            return
        assert self._make is not None and self._loop is not None
        server = self._make()
        for r, ours in self._ours.items():
            server.adopt(r, ours, self._theirs.pop(r, None))
        self._ours.clear()

    def _drop(self, rank: int) -> None:
        sock = self._ours.pop(rank)
        assert self._loop is not None
        self._loop.forget(sock.fileno())
        sock.close()

    @property
    def serving(self) -> bool:
        """Whether this job's ranks here are served PMI (from :meth:`serve` to :meth:`close`)."""
        return self._env is not None

    @property
    def inherited(self) -> Optional[PMIJob]:
        """Whose sockets ranks inherit, to be released once they are spawned (None over TCP)."""
        return None if self.tcp or self._make is None else self

    def release_child_fds(self, rank: Optional[int] = None) -> None:
        """Close the ranks' ends here (one rank's, or all) once spawned."""
        if self.server is not None:
            self.server.release_child_fds(rank)
        for r in ([rank] if rank is not None else list(self._theirs)):
            sock = self._theirs.pop(r, None)
            if sock is not None:
                sock.close()

    def env(self, rank: int, own: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
        """The PMI variables of one of this job's ranks started here; ``own`` is the
        rank's own environment, which some of them take into account."""
        assert self._env is not None, "serve() first"
        env = self._env(rank)
        if self.probe is not None:
            env.update(self.probe.env(self.keys[rank], own or {}))
        if self.pmix is not None:
            env.update(self.pmix.env(rank, own or {}))
        return env

    # -- the server's listener ------------------------------------------------
    def pmi_abort(self, rank: int, code: int, message: str,
                  at: Optional[float] = None) -> None:
        if rank in self.keys:
            self.owner.pmi_abort(self.keys[rank], code, message, at)

    def pmi_lost(self, rank: int, at: Optional[float] = None) -> None:
        if rank in self.keys:
            self.owner.pmi_lost(self.keys[rank], at)

    def pmi_log(self, message: str) -> None:
        self.owner.pmi_log(message if self.number == 1 else f"job {self.number}: {message}")

    def pmi_started(self, rank: int) -> None:
        self.started.add(rank)
        if rank in self.keys:
            self.owner.pmi_started(self, rank)

    def pmix_connected(self, rank: int) -> None:
        self.pmix_in.add(rank)
        self.pmi_started(rank)

    def pmix_finalized(self, rank: int, clean: bool, at: Optional[float] = None) -> None:
        """A rank's PMIx connection ended: finalized, or lost (at ``at``) as its
        process died."""
        if clean:
            self.pmix_done.add(rank)
        else:
            self.pmi_lost(rank, at)

    def joined_pmix(self, rank: int) -> bool:
        """Whether a rank here connected to this host's PMIx server.  A connection is
        posted before the rank hears it is accepted, so before its ``MPI_Init`` can
        go on: what is posted is read first."""
        if self.pmix is None:
            return False
        self.pmix.drain()
        return rank in self.pmix_in

    def left_pmix(self, rank: int) -> bool:
        """Whether a rank here that exited with status 0 had connected to PMIx and not
        finalized (a finalize, too, is posted before the rank can exit)."""
        return self.joined_pmix(rank) and rank not in self.pmix_done

    def pmix_publish(self, rank: int, pairs: Dict[str, str], first_read: bool,
                     done: Callable[[Optional[str]], None]) -> None:
        self.owner.pmix_names(self, {"what": "publish", "rank": rank, "pairs": pairs,
                                     "first_read": first_read}, done)

    def pmix_lookup(self, rank: int, keys: List[str], wait: bool,
                    done: Callable[[Dict[str, Tuple[str, str, int]]], None]) -> None:
        self.owner.pmix_names(self, {"what": "lookup", "rank": rank, "keys": keys,
                                     "wait": wait}, done)

    def pmix_unpublish(self, rank: int, keys: List[str], done: Callable[[], None]) -> None:
        self.owner.pmix_names(self, {"what": "unpublish", "rank": rank, "keys": keys},
                              lambda _: done())

    def pmix_spawn(self, rank: int, commands: List[object], env: List[Tuple[str, str]],
                   reply: Callable[..., None]) -> None:
        self.owner.pmix_spawn(self, rank, commands, env, reply)

    def pid_of(self, rank: int) -> Optional[int]:
        """The process of one of this host's ranks, if started."""
        return self.owner.pid_of(self.keys[rank]) if rank in self.keys else None

    def pmi_spawn(self, rank: int, request: SpawnRequest,
                  reply: Callable[..., None]) -> None:
        self.owner.pmi_spawn(self, rank, request, reply)

    def close(self) -> None:
        if self.pmix is not None:
            self.pmix.deregister()
            self.pmix = None
        self._env = None
        for rank in list(self._ours):
            self._drop(rank)
        self.release_child_fds()
        if self.server is not None:
            self.server.close()
            self.server = None
