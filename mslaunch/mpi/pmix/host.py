"""This process's PMIx: the server, started for the first job that needs it, and its directory.

The launcher and every agent have one :class:`PMIxHost`.  Every job that
starts ranks here is served, whatever its size.  Once the library's
variables are known (:mod:`.template`, from an earlier job of this user on
this host), its ranks are given them with the address of a :class:`~.door.Door`
and the library is loaded, its server started and the jobs registered only
when a rank first connects: a job whose ranks never speak PMIx (MPICH's,
any program without MPI) pays neither.  Otherwise (the first time, or a
server up already) the server is started before the ranks, and its
variables kept for the next job.  Where the server cannot be started (no
library, say), the reason is kept, the ranks get no PMIx, and an Open MPI
program among them is noticed as a singleton
(:mod:`mslaunch.mpi.pmi.singletons`), with :data:`~.lib.FIX` in the message.
Everything the server and the ranks' Open MPI keep on disk is in one
directory of this process's guard (:func:`mslaunch.mpi.pmi.files.pmix_dir`),
removed at the end -- and by the watchdog, should this process be killed.
"""

from __future__ import annotations

import os
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Dict, List, Mapping, Optional, Set, Tuple

    from ...core import socket
    from ...machine.loop import Loop
    from ...machine.peers import Admission
    from ..pmi.job import PMIJob
    from .door import Door
    from .layout import Layout
    from .server import PMIxServer, Relay


#: Seconds between two calls of a host's ``keepalive`` while its loop waits for
#: the server's start, and how long it waits at most.
KEEPALIVE = 0.25
PATIENCE = 60.0


def _nothing() -> None:
    pass


class Pending:
    """A job's namespace while the server is not started: its ranks' variables come
    from the template, and :meth:`PMIxHost._register` registers it and them."""

    def __init__(self, host: PMIxHost, pj: PMIJob, layout: Layout, relay: Relay) -> None:
        self.host, self.pj, self.layout, self.relay = host, pj, layout, relay
        self.name = layout.nspace
        self.ranks: Set[int] = set()

    def env(self, rank: int, own: Mapping[str, str]) -> Dict[str, str]:
        from . import rank_extras
        from .template import fill
        host = self.host
        assert host.door is not None
        self.ranks.add(rank)
        assert host.template is not None
        env = fill(host.template, host.directory, port=host.door.port, pid=os.getpid(),
                   nspace=self.name, rank=rank)
        env.update(rank_extras(self.name, host.directory, own))
        return env

    def drain(self) -> None:
        """Nothing was posted: no rank has connected."""

    def deregister(self) -> None:
        self.host.pending.pop(self.name, None)


class _Aside:
    """A server being started on a thread of its own (:meth:`PMIxHost._begin`): the
    environment to restore, a lock held until the start ends and its problem
    (None: up); what waits for it: calls and guest jobs."""

    def __init__(self, server: PMIxServer, saved: Dict[str, Optional[str]],
                 then: Callable[[], None]) -> None:
        import _thread
        self.server, self.saved = server, saved
        self.finished = _thread.allocate_lock()
        self.finished.acquire()
        self.problem: Optional[str] = None
        self.then: List[Callable[[], None]] = [then]
        self.guests: List[Layout] = []


class PMIxHost:
    """See the module docstring; ``directory`` is where the server keeps its files,
    ``log`` takes one line for ``-v``."""

    def __init__(self, loop: Loop, directory: str, log: Callable[[str], None],
                 fetch: Callable[[str, int, Callable[[Optional[bytes]], None]], None],
                 keepalive: Callable[[], None] = _nothing) -> None:
        self.loop = loop
        self.directory = directory
        self.log = log
        #: ``fetch(nspace, rank, done)``: a process's data from the host that has it,
        #: for the library's direct modex.
        self.fetch = fetch
        #: Called every :data:`KEEPALIVE` s while the loop waits for the server's
        #: start (see :meth:`_start`): this process's heartbeats, sent meanwhile.
        self.keepalive = keepalive
        self.server: Optional[PMIxServer] = None
        self.problem: Optional[str] = None      # why no server runs here
        self.door: Optional[Door] = None        # where ranks knock before it runs
        self.template: Optional[Dict[str, str]] = None
        self.pending: Dict[str, Pending] = {}
        self._cache: Optional[str] = None       # the template's file
        self._key: Optional[str] = None         # ... and its key there
        self._starting: Optional[_Aside] = None  # a server being started aside
        #: The server's own listener, filtered to take the door's connections alone,
        #: and its address.
        self.admission: Optional[Admission] = None
        self.own: Optional[Tuple[str, int]] = None

    def _start(self) -> Optional[PMIxServer]:
        """The server, started now if it is not, and waited for; None if it cannot
        be.  The start runs aside all the same (:meth:`_begin`), and the wait calls
        :attr:`keepalive` now and then: a start that took seconds (seen under load,
        in ``PMIx_server_init``) held this process's heartbeats as long otherwise,
        and its peers took the host for lost."""
        if self._starting is None and self.server is None and self.problem is None:
            self._begin(_nothing)
        deadline = time.monotonic() + PATIENCE
        while not self._settle(patience=KEEPALIVE):
            if time.monotonic() > deadline:
                # (the thread, stuck in the library, ends with this process)
                self._starting = None
                self.problem = f"the PMIx library's server did not start within {PATIENCE:g} s"
                self.log(f"PMIx: {self.problem}")
                break
            self.keepalive()
        return self.server

    def _make(self) -> Optional[PMIxServer]:
        """The library loaded, the directory made and the server made, not started."""
        from . import lib
        from .dpm import DPMCalls
        from .server import PMIxServer
        try:
            library = lib.load()
        except lib.Unavailable as err:
            self.problem = str(err)
            return None
        from ...machine.trees import hold, private_dir
        try:
            private_dir(self.directory)
            hold(self.directory)
        except OSError as err:
            self.problem = f"cannot make {self.directory}: {err.strerror or err}"
            return None
        from ..pmi.files import xml_path
        topology = xml_path()
        try:
            server = PMIxServer(self.loop, library, self.directory,
                                topology if topology and os.path.isfile(topology) else None,
                                more_calls=DPMCalls)
        except OSError as err:
            self.problem = f"{library.path}: {err}"
            return None
        server.fetch = self.fetch
        return server

    def _started(self, server: PMIxServer, problem: Optional[str]) -> None:
        if problem is not None:
            server.close()
            self.problem = f"{server.lib.path}: {problem}"
            return
        self.server = server
        self.log(f"PMIx server of {server.lib.version.split(' (')[0]} ({server.lib.path})")
        try:
            self.own = _address(server.lib.setup_fork("mslaunch-door", 0))
        except OSError as err:
            self.log(f"PMIx: the server's address is unknown: {err}")
        if self.own is not None:
            from ...machine.peers import Admission
            self.admission = Admission([self.own[1]], self.own[0])

    def _front(self, server: PMIxServer) -> None:
        """Put a door before the running server: its ranks are given the door's
        address, and the server's listener takes the door's connections alone.
        Without a door (no port), the listener takes any, as the library's own."""
        if self.own is None:
            return
        if self.door is None:
            from .door import Door
            try:
                self.door = Door(self.loop, self.own[0], self._wake)
            except OSError as err:
                self.log(f"PMIx: no door before the server ({err}): its ranks reach it "
                         f"directly")
                if self.admission is not None:
                    self.admission.close()
                    self.admission = None
                return
        self.door.open_at(self.own)
        self.door.admission = self.admission
        server.front = self.door.port

    def _begin(self, then: Callable[[], None]) -> None:
        """Start the server on a thread of its own, then call ``then()`` in the loop,
        the server up or failed (see :meth:`_start`)."""
        import _thread

        from .server import restore_environ, server_environ
        server = self._make()
        if server is None:
            then()
            return
        start = _Aside(server, server_environ(server.topology), then)

        def run() -> None:
            problem: Optional[str] = "its start ended without a word"
            try:
                problem = _start_now(server)
            finally:
                start.problem = problem
                start.finished.release()
                server.inbox.post(settle)

        def settle() -> None:
            self._settle()
        try:
            _thread.start_new_thread(run, ())
        except RuntimeError as err:            # no thread to be had
            restore_environ(start.saved)
            self._started(server, str(err))
            then()
            return
        self._starting = start

    def _settle(self, patience: Optional[float] = None) -> bool:
        """Take the outcome of the start begun aside, waiting for it (at most
        ``patience`` seconds), and do what waited for it; False if it has not ended."""
        start = self._starting
        if start is None:
            return True
        if not start.finished.acquire(timeout=-1 if patience is None else patience):
            return False
        self._starting = None
        from .server import restore_environ
        restore_environ(start.saved)
        self._started(start.server, start.problem)
        for layout in start.guests:
            self.guest(layout)
        for then in start.then:
            self.loop.call_later(0, then)
        return True

    def serve(self, pj: PMIJob, layout: Layout, relay: Relay) -> bool:
        """Serve PMIx to ``pj``'s ranks here (their variables then come with
        ``pj.env``); False if there is no server here."""
        if self.server is None and self.problem is None and self._await(pj, layout, relay):
            return True
        server = self._start()
        if server is None:
            return False
        self._front(server)
        try:
            pj.pmix = ns = server.namespace(layout, pj, relay, pj.pid_of)
        except OSError as err:
            self.problem = str(err)
            return False
        if self._cache is not None and layout.ranks_on(layout.here):
            self._keep(server, ns.name, layout.ranks_on(layout.here)[0])
        return True

    def open_door(self, sock: socket.socket, template: Dict[str, str], key: str,
                  cache: str) -> None:
        """The door's listener made before this host (see :mod:`mslaunch.mpi.early`),
        with the template its ranks were given, its key and its file."""
        from .door import Door
        self.door = Door(self.loop, "", self._wake, sock=sock)
        self.template, self._key, self._cache = template, key, cache

    def _await(self, pj: PMIJob, layout: Layout, relay: Relay) -> bool:
        """Serve ``pj`` through the door, if the library's variables are known."""
        if self.door is None:
            from ...machine.topology import cache_path
            from . import turned_off
            from .template import door_host, file_name, key, load
            self._key = key(os.environ)
            if turned_off(os.environ) or self._key is None:
                return False
            self._cache = cache_path(file_name())
            found = load(self._cache, self._key)
            if found is None or any(k.startswith("PMIX_DSTORE_") for k in found[0]):
                # unknown, or a shared-memory store, made only as the server starts
                return False
            from .door import Door
            try:
                self.door = Door(self.loop, door_host(found[0]) or "127.0.0.1", self._wake)
            except OSError:
                return False
            self.template = found[0]
        pj.pmix = self.pending[layout.nspace] = Pending(self, pj, layout, relay)
        return True

    def _keep(self, server: PMIxServer, nspace: str, rank: int) -> None:
        """Keep the library's variables as the template for later jobs."""
        from ...machine.topology import save_whole
        from .template import make, save
        assert self._cache is not None and self._key is not None
        try:
            env = server.lib.setup_fork(nspace, rank)
        except OSError:
            return
        template = make(env, self.directory, os.getpid(), nspace, rank)
        if template is not None and template != self.template:
            save(self._cache, self._key, template, server.lib.path, save_whole)
        self._cache = None

    def _wake(self, answer: Callable[[Optional[Tuple[str, int]]], None]) -> None:
        """A rank knocked at the door: start the server (aside), then register the
        waiting jobs and their ranks, and ``answer`` the server's address, or None."""
        door = self.door

        def then() -> None:
            if self.door is door:         # not closed meanwhile (the attempt ended)
                answer(self._register())
        if self._starting is not None:
            self._starting.then.append(then)
        elif self.server is None and self.problem is None:
            self._begin(then)
        else:
            then()

    def _register(self) -> Optional[Tuple[str, int]]:
        from .template import fill
        server = self._start()
        if server is None:
            self.log(f"PMIx: no server for the ranks that asked: {self.problem}")
            return None
        target: Optional[Tuple[str, int]] = None
        for waiting in list(self.pending.values()):
            pj = waiting.pj
            try:
                ns = server.namespace(waiting.layout, pj, waiting.relay, pj.pid_of)
                for rank in sorted(waiting.ranks):
                    env = ns.client(rank)
                    if target is None:
                        target = _address(env)
                    if self.template is not None and self.door is not None and env != fill(
                            self.template, self.directory, port=target[1] if target else 0,
                            pid=os.getpid(), nspace=ns.name, rank=rank):
                        self.log("PMIx: the library's variables have changed since they "
                                 "were kept; kept anew for the next job")
                        self.template = None
            except OSError as err:
                self.problem = str(err)
                continue
            pj.pmix = ns
            if self._cache is not None and self.template is None and waiting.ranks:
                self._keep(server, ns.name, min(waiting.ranks))
        self.pending.clear()
        if target is None:        # a knock before any rank was given the door's address
            target = self.own
        self._front(server)
        return target

    def guest(self, layout: Layout) -> None:
        """Make a job with no process here known to the server (``layout.here`` -1):
        the library then asks for its processes' data (direct modex) instead of
        waiting for it, when a process here connects to them (a spawn's parent
        and children on other hosts)."""
        if self._starting is None and self.server is None and self.problem is None:
            self._begin(_nothing)
        if self._starting is not None:
            self._starting.guests.append(layout)
            return
        server = self.server
        if server is None or layout.nspace in server.namespaces:
            return
        try:
            server.namespace(layout, None, _no_relay, lambda rank: None)
        except OSError as err:
            self.log(f"PMIx: job {layout.nspace[:40]} not made known here: {err}")

    def local_modex(self, nspace: str, rank: int,
                    done: Callable[[Optional[bytes]], None]) -> None:
        """What one of this host's processes put, or None (see :mod:`.dpm`)."""
        more = self.server.more if self.server is not None else None
        if more is None:
            done(None)
        else:
            more.local_modex(nspace, rank, done)

    def adopt(self, loop: Loop, log: Callable[[str], None],
              fetch: Callable[[str, int, Callable[[Optional[bytes]], None]], None],
              keepalive: Callable[[], None] = _nothing) -> None:
        """Serve the next attempt of a job run with ``--max-restarts``, in ``loop``
        (see :meth:`~.server.PMIxServer.move_to`)."""
        self.loop, self.log, self.fetch, self.keepalive = loop, log, fetch, keepalive
        for server in (self.server, self._starting.server if self._starting else None):
            if server is not None:
                server.move_to(loop)
                server.fetch = fetch

    def retire(self) -> None:
        """The attempt's ranks are gone: forget its jobs, keep the server and its
        directory (see :meth:`adopt`)."""
        self._shut()
        if self.server is not None:
            self.server.retire()

    def close(self) -> None:
        """Stop the server and remove its directory (once the ranks are gone)."""
        self._shut()
        if not self._settle(patience=5.0):
            self._starting = None
            self.log("the PMIx library's server did not start within 5 s (left to end "
                     "with this process)")
        if self.server is not None:
            if not self.server.close():
                self.log("the PMIx library did not stop: its thread is stuck (left to end "
                         "with this process)")
            self.server = None
        if self.admission is not None:
            self.admission.close()
            self.admission = None
        from ...machine.trees import remove_tree
        remove_tree(self.directory)

    def _shut(self) -> None:
        self.pending.clear()
        if self._starting is not None:
            self._starting.guests.clear()
        if self.door is not None:
            self.door.close()
            self.door = None
        if self.server is not None:
            self.server.front = None


def _start_now(server: PMIxServer) -> Optional[str]:
    """Start ``server``: None, or why it would not start."""
    try:
        server.start()
    except OSError as err:
        return str(err)
    return None


def _address(env: Mapping[str, str]) -> Optional[Tuple[str, int]]:
    """The server's address in a rank's variables."""
    from .template import door_host, server_port
    port = server_port(env)
    host = door_host(env)
    return (host, port) if host and port else None


def _no_relay(signature: str, sequence: int, blob: bytes, done: Callable[[bytes], None]) -> None:
    """A guest job's fences: it has no process here to take part in one."""
