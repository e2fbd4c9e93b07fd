"""The server's upcalls for Open MPI's dynamic processes within a job: publish,
lookup, unpublish (:mod:`.names`), connect and disconnect.

They run on the library's thread as the others of :mod:`.server` do: read
what they were given, post the work to the event loop, and answer the
library from there.  Connect and disconnect are barriers of the processes
named: among this host's ranks the library completes them itself, across
hosts they travel as fences without data (signature prefix ``c/``).  Only
processes of namespaces this server knows are served.
"""

from __future__ import annotations

import ctypes as C
import itertools
import os

from . import lib as L
from .exchange import CONNECT_PREFIX, decode_blob, encode_blob

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Optional, Tuple

    from .names import Found
    from .server import Namespace, PMIxServer

def _keys(keys: Any) -> List[str]:
    found: List[str] = []
    i = 0
    while keys and keys[i] is not None and i < 1024:
        found.append(keys[i].decode("utf-8", "replace"))
        i += 1
    return found


def _pairs(info: Any, ninfo: int) -> Dict[str, str]:
    """The published pairs of an info array (directives left out), each value as
    text: ``s:`` and a string, or ``b:`` and the base64 of a byte object."""
    pairs: Dict[str, str] = {}
    for i in range(ninfo):
        key = info[i].key.decode("utf-8", "replace")
        value = info[i].value
        if key.startswith("pmix."):
            continue
        if value.type == L.STRING:
            pairs[key] = "s:" + (value.data.string or b"").decode("utf-8", "surrogateescape")
        elif value.type == L.BYTE_OBJECT:
            raw = C.string_at(value.data.bo.bytes, value.data.bo.size) \
                if value.data.bo.bytes and value.data.bo.size else b""
            pairs[key] = "b:" + encode_blob(raw)
    return pairs


#: A spawned application's PMIx attributes, as the MPI_Info keys of a spawn.
_SPAWN_INFO = {"pmix.host": "host", "pmix.wdir": "wdir", "pmix.prefix": "path",
               "pmix.hostfile": "hostfile"}


def _wants_wait(info: Any, ninfo: int) -> bool:
    return any(info[i].key == b"pmix.wait" for i in range(ninfo))


#: ``PMIX_PERSIST_FIRST_READ``: the name goes with the first lookup that finds it.
_FIRST_READ = 1


def _first_read(info: Any, ninfo: int) -> bool:
    return any(info[i].key == b"pmix.persist" and info[i].value.data.u8 == _FIRST_READ
               for i in range(ninfo))


class DPMCalls:
    """The upcalls of one :class:`~.server.PMIxServer`, in their slots."""

    def __init__(self, server: PMIxServer) -> None:
        self.server = server
        self.calls = {L.SLOT_PUBLISH: L.PUBLISH(self._publish),
                      L.SLOT_LOOKUP: L.LOOKUP(self._lookup),
                      L.SLOT_UNPUBLISH: L.UNPUBLISH(self._unpublish),
                      L.SLOT_SPAWN: L.SPAWN(self._spawn),
                      L.SLOT_CONNECT: L.CONNECT(self._connect),
                      L.SLOT_DISCONNECT: L.CONNECT(self._connect),
                      L.SLOT_DIRECT_MODEX: L.DMODEX(self._dmodex)}
        self._response = L.DMODEX_RESPONSE(self._responded)
        self._waiting: Dict[int, Callable[[Optional[bytes]], None]] = {}
        self._asks = itertools.count(1)

    def _answer_op(self, cbfunc: Any, cbdata: Any, status: int) -> None:
        if cbfunc and self.server.up:
            cbfunc(status, cbdata)

    def _publish(self, proc: Any, info: Any, ninfo: int, cbfunc: Any, cbdata: Any) -> int:
        try:
            ns, rank = self.server.which(proc)
            if ns is None:
                return L.ERR_NOT_SUPPORTED
            pairs, once = _pairs(info, ninfo), _first_read(info, ninfo)
            self.server.inbox.post(lambda: ns.listener.pmix_publish(
                rank, pairs, once, lambda problem: self._answer_op(
                    cbfunc, cbdata, L.ERR_DUPLICATE_KEY if problem else L.SUCCESS)))
            return L.SUCCESS
        except Exception:  # noqa: BLE001 -- nothing may unwind into the library
            return L.ERROR

    def _unpublish(self, proc: Any, keys: Any, info: Any, ninfo: int, cbfunc: Any,
                   cbdata: Any) -> int:
        try:
            ns, rank = self.server.which(proc)
            if ns is None:
                return L.ERR_NOT_SUPPORTED
            names = _keys(keys)
            self.server.inbox.post(lambda: ns.listener.pmix_unpublish(
                rank, names, lambda: self._answer_op(cbfunc, cbdata, L.SUCCESS)))
            return L.SUCCESS
        except Exception:  # noqa: BLE001
            return L.ERROR

    def _lookup(self, proc: Any, keys: Any, info: Any, ninfo: int, cbfunc: Any,
                cbdata: Any) -> int:
        try:
            ns, rank = self.server.which(proc)
            if ns is None:
                return L.ERR_NOT_SUPPORTED
            names, wait = _keys(keys), _wants_wait(info, ninfo)
            self.server.inbox.post(lambda: ns.listener.pmix_lookup(
                rank, names, wait, lambda found: self._found(cbfunc, cbdata, names, found)))
            return L.SUCCESS
        except Exception:  # noqa: BLE001
            return L.ERROR

    def _found(self, cbfunc: Any, cbdata: Any, names: List[str], found: Found) -> None:
        if not self.server.up:
            return
        hits = [(k, found[k]) for k in names if k in found]
        array = (L.PData * max(len(hits), 1))()
        keep = []
        for i, (key, (value, nspace, rank)) in enumerate(hits):
            array[i].proc = L.Proc(nspace.encode(), rank)
            array[i].key = key.encode()
            if value.startswith("b:"):
                data = decode_blob(value[2:])
                raw = C.create_string_buffer(data, max(len(data), 1))
                array[i].value.type = L.BYTE_OBJECT
                array[i].value.data.bo.bytes = C.addressof(raw)
                array[i].value.data.bo.size = len(data)
            else:
                raw = C.create_string_buffer(value[2:].encode("utf-8", "surrogateescape"))
                array[i].value.type = L.STRING
                array[i].value.data.ptr = C.addressof(raw)
            keep.append(raw)
        status = L.SUCCESS if len(hits) == len(names) else (
            L.ERR_NOT_FOUND if not hits else L.ERR_PARTIAL_SUCCESS)
        cbfunc(status, C.addressof(array), len(hits), cbdata)   # copied before it returns

    def _spawn(self, proc: Any, job_info: Any, ninfo: int, apps: Any, napps: int,
               cbfunc: Any, cbdata: Any) -> int:
        try:
            ns, rank = self.server.which(proc)
            if ns is None or napps < 1:
                return L.ERR_NOT_SUPPORTED
            commands: List[Tuple[str, List[str], int, Dict[str, str]]] = []
            env: List[Tuple[str, str]] = []
            for i in range(napps):
                app = apps[i]
                cmd = (app.cmd or b"").decode("utf-8", "surrogateescape")
                argv = _keys(app.argv)
                if argv and os.path.basename(argv[0]) == os.path.basename(cmd):
                    argv = argv[1:]
                info: Dict[str, str] = {}
                for j in range(app.ninfo):
                    key = app.info[j].key.decode("utf-8", "replace")
                    if key in _SPAWN_INFO and app.info[j].value.type == L.STRING:
                        info[_SPAWN_INFO[key]] = (app.info[j].value.data.string or b"").decode(
                            "utf-8", "surrogateescape")
                if app.cwd:
                    info.setdefault("wdir", app.cwd.decode("utf-8", "surrogateescape"))
                commands.append((cmd, argv, max(app.maxprocs, 1), info))
                # the application's own variables (Open MPI's OMPI_PARENT_PORT, say)
                env.extend((k, v) for k, _, v in (e.partition("=") for e in _keys(app.env))
                           if k)

            def reply(problem: Optional[str], nspace: Optional[str] = None) -> None:
                if cbfunc and self.server.up:
                    cbfunc(L.ERROR if problem else L.SUCCESS,
                           (nspace or "").encode(), cbdata)
            self.server.inbox.post(lambda: ns.listener.pmix_spawn(rank, commands, env, reply))
            return L.SUCCESS
        except Exception:  # noqa: BLE001
            return L.ERROR

    def _connect(self, procs: Any, nprocs: int, info: Any, ninfo: int, cbfunc: Any,
                 cbdata: Any) -> int:
        try:
            members: List[Tuple[str, int]] = [
                (procs[i].nspace.decode("utf-8", "replace"), procs[i].rank)
                for i in range(nprocs)]
            ns: Optional[Namespace] = self.server.serving(members)
            if ns is None:
                return L.ERR_NOT_SUPPORTED
            signature = ns.covers(members)
            if signature is None:
                return L.OPERATION_SUCCEEDED
            signature = CONNECT_PREFIX + signature

            def relay() -> None:
                ns.relay(signature, ns.next_sequence(signature), b"",
                         lambda whole: self._answer_op(cbfunc, cbdata, L.SUCCESS))
            self.server.inbox.post(relay)
            return L.SUCCESS
        except Exception:  # noqa: BLE001
            return L.ERROR

    # -- direct modex: one process's data, from the host that has it --------------
    def _dmodex(self, proc: Any, info: Any, ninfo: int, cbfunc: Any, cbdata: Any) -> int:
        try:
            nspace, rank = proc[0].nspace.decode("utf-8", "replace"), proc[0].rank

            def answer(blob: Optional[bytes]) -> None:
                if not self.server.up:
                    return
                if blob is None:
                    cbfunc(L.ERR_NOT_FOUND, None, 0, cbdata, L.RELEASE(), None)
                else:
                    self.server.answer_modex(cbfunc, cbdata, blob)
            self.server.inbox.post(lambda: self.server.fetch(nspace, rank, answer))
            return L.SUCCESS
        except Exception:  # noqa: BLE001
            return L.ERROR

    def local_modex(self, nspace: str, rank: int,
                    done: Callable[[Optional[bytes]], None]) -> None:
        """The data one of this host's processes put (``PMIx_server_dmodex_request``,
        which waits for the process to commit it), or None."""
        if not self.server.up or nspace not in self.server.namespaces:
            done(None)
            return
        ask = next(self._asks)
        self._waiting[ask] = done
        proc = L.Proc(nspace.encode(), rank)
        rc = self.server.lib.lib.PMIx_server_dmodex_request(C.byref(proc), self._response, ask)
        if rc not in (L.SUCCESS, L.OPERATION_SUCCEEDED):
            self._waiting.pop(ask, None)
            done(None)

    def _responded(self, status: int, data: Optional[int], size: int, ask: Optional[int]) -> None:
        try:
            blob = (C.string_at(data, size) if data and size else b"") \
                if status == L.SUCCESS else None
            done = self._waiting.pop(ask or 0, None)
            if done is not None:
                self.server.inbox.post(lambda: done(blob))
        except Exception:  # noqa: BLE001 -- nothing may unwind into the library
            pass

