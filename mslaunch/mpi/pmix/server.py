"""One process's PMIx server: the library's, with mslaunch's upcalls and a namespace per job.

The library runs its own progress thread and calls the upcalls there.  They
copy what they were given, answer at once what needs nothing of the job
(a fence among this host's ranks only), and post the rest to the event loop
through a pipe (:class:`Inbox`); every callback the library gave is then
called from the loop, which the library allows (it moves the work back to
its own thread).  No exception leaves an upcall.
"""

from __future__ import annotations

import _thread
import ctypes as C
import itertools
import os
import time

from ...machine.procs import exiting
from . import lib as L
from . import rank_extras
from .layout import Layout

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple

    from ...machine.loop import Loop

    #: ``relay(signature, sequence, blob, done)``: a fence that spans hosts.
    Relay = Callable[[str, int, bytes, Callable[[bytes], None]], None]

class Inbox:
    """Calls posted from another thread, run in the loop."""

    def __init__(self, loop: Loop) -> None:
        self.loop = loop
        self.read_fd, self.write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.lock = _thread.allocate_lock()
        self.calls: List[Callable[[], None]] = []
        self.closed = False
        loop.add_reader(self.read_fd, self.run)

    def post(self, call: Callable[[], None]) -> None:
        with self.lock:
            if self.closed:
                return    # the descriptor's number may be another file's by now
            self.calls.append(call)
            try:
                os.write(self.write_fd, b"!")
            except OSError:
                pass      # full: the loop is awake already

    def run(self) -> None:
        try:
            os.read(self.read_fd, 4096)
        except OSError:
            pass
        while True:
            with self.lock:
                calls, self.calls = self.calls, []
            if not calls:
                return
            for call in calls:
                call()

    def move_to(self, loop: Loop) -> None:
        """Run the calls in ``loop`` from now on (the last one may be closed)."""
        self._leave()
        self.loop = loop
        loop.add_reader(self.read_fd, self.run)
        self.post(lambda: None)       # what was posted meanwhile

    def _leave(self) -> None:
        try:
            self.loop.forget(self.read_fd)
        except (OSError, ValueError):
            pass        # a closed loop (an earlier attempt's, see PMIxServer.move_to)

    def close(self) -> None:
        with self.lock:
            if self.closed:
                return
            self.closed = True
        self._leave()
        os.close(self.read_fd)
        os.close(self.write_fd)


class Namespace:
    """One job's namespace in a :class:`PMIxServer`.  ``listener`` hears of its ranks
    (by their rank in the job): ``pmix_connected``, ``pmi_abort``, ``pmix_finalized``;
    ``relay`` carries its fences across hosts; ``pid_of`` names a local rank's process."""

    def __init__(self, server: PMIxServer, layout: Layout, listener: Any, relay: Relay,
                 pid_of: Callable[[int], Optional[int]]) -> None:
        self.server = server
        self.layout = layout
        self.name = layout.nspace
        self.listener = listener
        self.relay = relay
        self.pid_of = pid_of
        self.local: Set[int] = set(layout.ranks_on(layout.here))
        self.sequences: Dict[str, int] = {}
        self.registered = False
        # The job data given to the library: PMIx before 4 reads it on its own
        # thread after register_nspace returns, so it lives as long as the namespace.
        self.info: Optional[L.InfoList] = None

    def register(self) -> None:
        self.layout.tmpdir = self.server.tmpdir
        self.layout.topology = self.server.topology_xml()
        try:
            os.mkdir(os.path.join(self.server.tmpdir, self.name), 0o700)
        except FileExistsError:
            pass
        self.info = info = L.InfoList(self.layout.job_info())
        rc = self.server.lib.lib.PMIx_server_register_nspace(
            self.name.encode(), len(self.local), C.cast(info.array, C.c_void_p), info.size,
            None, None)
        if rc not in (L.SUCCESS, L.OPERATION_SUCCEEDED):
            raise OSError(f"PMIx_server_register_nspace failed ({rc})")
        self.registered = True

    def env(self, rank: int, own: Mapping[str, str]) -> Dict[str, str]:
        """The variables of one of this host's ranks (``own``: its environment): the
        library's and :func:`rank_extras`."""
        env = self.client(rank)
        if self.server.front is not None:
            from .template import retarget
            env = retarget(env, self.server.front)
        env.update(rank_extras(self.name, self.server.tmpdir, own))
        return env

    def client(self, rank: int) -> Dict[str, str]:
        """Register one of this host's ranks with the library; its variables."""
        lib = self.server.lib
        env = dict(lib.setup_fork(self.name, rank))
        proc = L.Proc(self.name.encode(), rank)
        rc = lib.lib.PMIx_server_register_client(C.byref(proc), os.getuid(), os.getgid(),
                                                 None, self.server.client_registered, None)
        if rc not in (L.SUCCESS, L.OPERATION_SUCCEEDED):
            raise OSError(f"PMIx_server_register_client failed ({rc})")
        return env

    def covers(self, members: Sequence[Tuple[str, int]]) -> Optional[str]:
        """A fence's signature when it spans other hosts, None when all its ranks are here."""
        names: List[str] = []
        spans = False
        for ns, rank in members:
            if rank == L.RANK_WILDCARD:
                names.append(f"{ns}:*")
                spans = spans or ns != self.name or len(self.local) < len(self.layout.node_of)
            else:
                names.append(f"{ns}:{rank}")
                spans = spans or ns != self.name or rank not in self.local
        return ",".join(sorted(names)) if spans else None

    def next_sequence(self, signature: str) -> int:
        n = self.sequences.get(signature, 0)
        self.sequences[signature] = n + 1
        return n

    def drain(self) -> None:
        """Run here what the library's thread has posted so far."""
        self.server.inbox.run()

    def deregister(self) -> None:
        if self.registered:
            self.registered = False
            # With a callback: it returns at once, never waiting for the library's
            # thread (see PMIxServer.close).
            self.server.lib.lib.PMIx_server_deregister_nspace(
                self.name.encode(), self.server.client_registered, None)


def server_environ(xml: Optional[str]) -> Dict[str, Optional[str]]:
    """Set what the library reads from the environment while the server starts (what
    it replaces, to be given to :func:`restore_environ` once it has started).
    hwloc is pointed at this host's topology file: discovering the topology is
    most of the start of a library that has none given (tens of milliseconds;
    5 to 15 from the file).  The job data store is the ``hash`` one, unless the
    user chose: ranks told of a server before it starts (:mod:`.door`) cannot
    use the shared-memory stores, which the server makes as it starts, and with
    a server of those stores, such a rank fails in a spawn (Debian's libpmix
    4.2.2: PROC-ENTRY-NOT-FOUND, Open MPI 4's ``ompi_dpm_dyn_init`` "No
    permission").

    Only the C library's environment is changed (``os.putenv``), which the
    library reads with ``getenv``; ``os.environ``, which ranks' environments
    are made from, stays as it is while the server starts on a thread of its
    own.  Both calls are made in the loop's thread: ``setenv`` is not safe
    beside another thread's ``getenv``."""
    wanted = {} if "PMIX_MCA_gds" in os.environ else {"PMIX_MCA_gds": "hash"}
    if xml is not None and "HWLOC_XMLFILE" not in os.environ:
        wanted.update({"HWLOC_XMLFILE": xml, "HWLOC_THISSYSTEM": "1"})
    saved = {name: os.environ.get(name) for name in wanted}
    for name, value in wanted.items():
        os.putenv(name, value)
    return saved


def restore_environ(saved: Mapping[str, Optional[str]]) -> None:
    """Undo :func:`server_environ`."""
    for name, value in saved.items():
        if value is None:
            os.unsetenv(name)
        else:
            os.putenv(name, value)


class PMIxServer:
    """The library's server in this process (see the module docstring); ``tmpdir``
    (made and removed by the caller) holds everything it and the ranks' Open MPI
    keep on disk; ``topology``, an hwloc XML file of this host, spares it looking;
    ``more_calls`` makes upcalls beyond the four here (:class:`~.dpm.DPMCalls`), an
    object whose ``calls`` maps module slots to them, kept for the server's life.
    The library's server is started by :meth:`start`."""

    def __init__(self, loop: Loop, library: L.Library, tmpdir: str,
                 topology: Optional[str] = None,
                 more_calls: Optional[Callable[[PMIxServer], Any]] = None) -> None:
        self.loop = loop
        self.lib = library
        self.tmpdir = tmpdir
        self.topology = topology
        self._xml: Optional[str] = None
        self.namespaces: Dict[str, Namespace] = {}
        self.up = False           # between the library's init and its finalize
        #: The port of the door before it (:mod:`.door`), which its ranks are given.
        self.front: Optional[int] = None
        self.inbox = Inbox(loop)
        self._held: Dict[int, object] = {}      # answers the library reads until released
        self._tokens = itertools.count(1)
        # Kept referenced for as long as the library may call them.
        self._release = L.RELEASE(self._released)
        # A client's registration, done on the library's thread: the rank may be
        # started at once, as the library handles its events in order.  The same
        # callback ends a namespace's deregistration.
        self.client_registered = L.OP_CB(lambda status, cbdata: None)
        self._calls = [L.CONNECTED(self._connected), L.FINALIZED(self._finalized),
                       L.ABORT(self._abort), L.FENCE(self._fence)]
        self._module = (C.c_void_p * L.MODULE_SLOTS)()
        for slot, call in zip((L.SLOT_CONNECTED, L.SLOT_FINALIZED, L.SLOT_ABORT, L.SLOT_FENCE),
                              self._calls):
            self._module[slot] = C.cast(call, C.c_void_p)
        #: ``fetch(nspace, rank, done)``: another host's data of a process, from
        #: this server's host; ``done(None)`` where nobody has it.
        self.fetch: Callable[[str, int, Callable[[Optional[bytes]], None]], None] = \
            lambda nspace, rank, done: done(None)
        self.more = more_calls(self) if more_calls is not None else None
        for slot, call in (self.more.calls.items() if self.more is not None else ()):
            self._module[slot] = C.cast(call, C.c_void_p)
        self._info = L.InfoList([("pmix.srvr.tmpdir", L.STRING, tmpdir),
                                 ("pmix.sys.tmpdir", L.STRING, tmpdir)])

    def start(self) -> None:
        """Start the library's server (its environment set: :func:`server_environ`);
        OSError if it would not.  Blocking, it may be called from a thread other
        than the loop's: it touches neither the loop nor the environment."""
        info = self._info
        rc = self.lib.lib.PMIx_server_init(C.cast(self._module, C.c_void_p),
                                           C.cast(info.array, C.c_void_p), info.size)
        if rc != L.SUCCESS:
            raise OSError(f"PMIx_server_init failed ({rc})")
        self.up = True

    def topology_xml(self) -> str:
        """This host's topology as hwloc XML (read once), or "" without a file."""
        if self._xml is None:
            self._xml = ""
            if self.topology:
                try:
                    with open(self.topology, encoding="utf-8") as f:
                        text = f.read(1 << 24)
                    self._xml = text if text.startswith("<?xml") else ""
                except (OSError, UnicodeDecodeError):
                    pass
        return self._xml

    def namespace(self, layout: Layout, listener: Any, relay: Relay,
                  pid_of: Callable[[int], Optional[int]]) -> Namespace:
        ns = Namespace(self, layout, listener, relay, pid_of)
        ns.register()
        self.namespaces[ns.name] = ns
        return ns

    def move_to(self, loop: Loop) -> None:
        """Post to ``loop`` from now on: the server of one attempt of a job run with
        ``--max-restarts`` serves the next (:meth:`retire`), as the library's server
        is started once per process (Debian's libpmix 4.2.2 aborts the process when
        it is started again after ``PMIx_server_finalize``)."""
        self.loop = loop
        self.inbox.move_to(loop)

    def retire(self) -> None:
        """Deregister every namespace (never waiting for the library's thread), the
        server staying up for the next attempt (see :meth:`move_to`)."""
        for ns in list(self.namespaces.values()):
            ns.deregister()
        self.namespaces.clear()
        self.inbox.run()          # what the last upcalls posted

    def close(self, patience: float = 5.0) -> bool:
        """Deregister every namespace and stop the library's server (and its thread);
        False if that did not end within ``patience`` seconds.

        Both wait for the library's thread, which can be stuck for good: Debian's
        libpmix 4.2.2 was seen blocked on a lock of its own after a PMIx_Connect of
        a spawn that never completed (mpi4py's test_spawn, about one run in
        twenty).  The launcher must not wait for it forever: the stop is left to
        a thread of its own, which ends with this process."""
        if not self.up:
            self.inbox.close()
            return True
        self.up = False
        import threading
        stop = threading.Thread(target=self._stop, name="pmix-stop", daemon=True)
        stop.start()
        stop.join(patience)
        if stop.is_alive():
            return False          # the library may still post: the inbox stays open
        self.inbox.run()          # what the last upcalls posted
        self.inbox.close()
        return True

    def _stop(self) -> None:
        for ns in list(self.namespaces.values()):
            ns.deregister()
        self.lib.lib.PMIx_server_finalize()

    # -- upcalls, on the library's thread (those of dynamic processes: .dpm) -------
    def serving(self, members: Sequence[Tuple[str, int]]) -> Optional[Namespace]:
        """The job through which this host takes part in a fence or connect of
        ``members``: one with processes here (a job of a spawn's parent may be a
        guest here, with none)."""
        return next((self.namespaces[m[0]] for m in members
                     if m[0] in self.namespaces and self.namespaces[m[0]].local), None)

    def which(self, proc: Any) -> Tuple[Optional[Namespace], int]:
        p = proc[0]
        return self.namespaces.get(p.nspace.decode("utf-8", "replace")), p.rank

    def _connected(self, proc: Any, server_object: Any, cbfunc: Any, cbdata: Any) -> int:
        try:
            ns, rank = self.which(proc)
            if ns is not None:
                self.inbox.post(lambda: ns.listener.pmix_connected(rank))
        except Exception:  # noqa: BLE001 -- nothing may unwind into the library
            pass
        return L.OPERATION_SUCCEEDED

    def _finalized(self, proc: Any, server_object: Any, cbfunc: Any, cbdata: Any) -> int:
        # Called for MPI_Finalize, and for a connection lost: then the process is
        # exiting already (its descriptors close after it is marked so).  A loss is
        # dated here: the loop may run after the job's stop reached this host.
        try:
            at = time.time()
            ns, rank = self.which(proc)
            if ns is not None:
                clean = not exiting(ns.pid_of(rank))
                self.inbox.post(lambda: ns.listener.pmix_finalized(rank, clean, at))
        except Exception:  # noqa: BLE001
            pass
        return L.OPERATION_SUCCEEDED

    def _abort(self, proc: Any, server_object: Any, status: int, message: Optional[bytes],
               procs: Any, nprocs: int, cbfunc: Any, cbdata: Any) -> int:
        try:
            # When it happened: the rank may be gone before the loop runs this
            # (its peers then abort too, and are not to be taken for the cause).
            at = time.time()
            ns, rank = self.which(proc)
            text = (message or b"").decode("utf-8", "replace")

            def run() -> None:
                if ns is not None:
                    ns.listener.pmi_abort(rank, int(status), text, at)
                if cbfunc and self.up:
                    cbfunc(L.SUCCESS, cbdata)
            self.inbox.post(run)
            return L.SUCCESS
        except Exception:  # noqa: BLE001
            return L.ERROR

    def _fence(self, procs: Any, nprocs: int, info: Any, ninfo: int, data: Optional[int],
               ndata: int, cbfunc: Any, cbdata: Any) -> int:
        try:
            blob = C.string_at(data, ndata) if ndata and data else b""
            members = [(procs[i].nspace.decode("utf-8", "replace"), procs[i].rank)
                       for i in range(nprocs)]
            ns = self.serving(members)
            if ns is None:
                return L.ERR_NOT_SUPPORTED
            signature = ns.covers(members)
            if signature is None:
                self.answer_modex(cbfunc, cbdata, blob)
                return L.SUCCESS

            def relay() -> None:
                ns.relay(signature, ns.next_sequence(signature), blob,
                         lambda whole: self.answer_modex(cbfunc, cbdata, whole))
            self.inbox.post(relay)
            return L.SUCCESS
        except Exception:  # noqa: BLE001
            return L.ERROR

    def answer_modex(self, cbfunc: Any, cbdata: Any, blob: bytes) -> None:
        """A fence's result to the library, held until it releases it (a result that
        comes after the server stopped has nobody to go to)."""
        if not self.up:
            return
        buf = C.create_string_buffer(blob, max(len(blob), 1))
        token = next(self._tokens)
        self._held[token] = buf
        cbfunc(L.SUCCESS, C.addressof(buf), len(blob), cbdata, self._release, token)

    def _released(self, token: Optional[int]) -> None:
        self._held.pop(token or 0, None)

