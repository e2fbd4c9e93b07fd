"""The package's compiled modules in one file of the user's cache, loaded
without the import system's search: the ``mslaunch`` command's start, and an
agent's started from its host's own copy of the package.

A launch imports some sixty of the package's modules before its first rank
starts. Through the import system (itself Python) each costs its search
along the path and its file's checks and reads: about two thirds of the
bytecode a launch runs before that rank, some 40 microseconds a module. With
this cache, ``import`` statements that name a module of the package take its
code from one file (the compiled modules this installation's launches
imported, each read on first use and checked against its source's size and
time) and run it: nothing is searched for, one file is open.

- The file is ``mslaunch/code-<digest of the package's folder>-<interpreter
  tag>.bin`` in the user's cache (``XDG_CACHE_HOME``, else ``~/.cache``).
  A file, or a folder, of another user's or that others may write is not
  read.
- It holds what the package's own bytecode holds (``__pycache__``, or the
  bytecode cache of :mod:`mslaunch.__main__`): a module without fresh
  bytecode is not in it, and is imported as usual; the file is written
  again once its bytecode is there (a module edited while bytecode was not
  written, say, and compiled since).
- A module whose source changed since the file was written (its size or
  time) is imported as usual. The file is written again as the process
  (the command, or an agent) ends, where it was missing, unreadable or
  stale, or lacked a module imported here: a few milliseconds, once after
  an install, an upgrade or an edit, and once for each kind of job. Files
  of installations gone are removed then.
- It serves a start only: once the process first waits (a launch's ranks
  or agents on their way, an agent serving its link), ``import`` is the
  interpreter's own again. Under ``python -X importtime`` it stays out of
  the way, so that every import is timed.
"""

from __future__ import annotations

import _imp
import builtins
import marshal
import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import CodeType, ModuleType
    from typing import Dict, List, Mapping, Optional, Sequence, Set, Tuple, Type

    #: name -> (offset, length, source's st_mtime_ns, source's size, is a package);
    #: offset -1: the module had no fresh bytecode (looked for again where it is
    #: imported), -2: its bytecode is of a kind not served (not looked for again)
    Index = Dict[str, Tuple[int, int, int, int, bool]]
    #: a module's bytecode (empty: none fresh) with its source's time and size,
    #: whether a package, and whether its bytecode is of a kind not served
    Compiled = Tuple[bytes, int, int, bool, bool]

_MAGIC = b"mslaunch code 3\n"
_HEAD = len(_MAGIC) + 8
# The import system's own modules, loaded with the interpreter (no import of importlib's).
_bootstrap = sys.modules["_frozen_importlib"]
_external = sys.modules["_frozen_importlib_external"]
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_NAME = __name__.partition(".")[0]
_PREFIX = _NAME + "."
_CODE: Type[CodeType] = type((lambda: None).__code__)
# What the import system calls on code it loads: its file name made the source's.
_fix_co_filename = _imp._fix_co_filename     # type: ignore[attr-defined]
#: A file untouched this long, of an installation not seen here, is removed.
_PRUNE_AFTER = 7 * 86400

#: While serving: the open file, its index, where its modules start, and the
#: import this replaced.
_fd = -1
_index: Index = {}
_base = 0
_plain = builtins.__import__
_serving = False
#: start() looked for the file; it should be written again when the process ends.
_tried = False
_stale = False
#: The modules the file holds (or knows to have no bytecode), those it knew
#: without fresh bytecode, and those run from it in this process, in order.
_known: Set[str] = set()
_unfresh: Set[str] = set()
served: List[str] = []


def _ours(st: os.stat_result) -> bool:
    """Owned by this user and writable by no one else."""
    return st.st_uid == os.geteuid() and not st.st_mode & 0o022


def _timed() -> bool:
    """Imports are being timed (``-X importtime``, ``PYTHONPROFILEIMPORTTIME``)."""
    return "importtime" in sys._xoptions or (
        not sys.flags.ignore_environment and bool(os.environ.get("PYTHONPROFILEIMPORTTIME")))


def _path() -> Optional[str]:
    """Where this installation's file is (None without a home)."""
    base = os.environ.get("XDG_CACHE_HOME") or ""
    if not os.path.isabs(base):
        home = os.path.expanduser("~")
        if not os.path.isabs(home):
            return None
        base = os.path.join(home, ".cache")
    optimized = f"-o{sys.flags.optimize}" if sys.flags.optimize else ""
    return os.path.join(base, "mslaunch", f"code-{_digest(_PACKAGE.encode())}-"
                                          f"{sys.implementation.cache_tag}{optimized}.bin")


def _digest(data: bytes) -> str:
    """A short digest (FNV-1a, 64 bits: hashlib's import costs a millisecond or more)."""
    h = 0xcbf29ce484222325
    for byte in data:
        h = ((h ^ byte) * 0x100000001b3) & 0xffffffffffffffff
    return f"{h:016x}"


def _meta() -> Tuple[bytes, str, int]:
    return _external.MAGIC_NUMBER, _PACKAGE, sys.flags.optimize


def start() -> None:
    """Serve the package's modules from the file, if it can be read (and mark it
    to be written at the end if it cannot)."""
    global _fd, _index, _base, _plain, _stale, _serving, _tried
    if _serving or _timed():
        return
    _tried = True
    path = _path()
    if path is None:
        return
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        _stale = True
        return
    # Started with stdin, stdout or stderr closed, the file would take its number
    # (the command gives the ranks /dev/null there, and they would read the file).
    low = []
    while fd < 3:
        low.append(fd)
        fd = os.dup(fd)
    for number in low:
        os.close(number)
    try:
        index = _read_index(fd, path)
    except Exception:           # (whatever a damaged file makes of the reading)
        index = None
    if index is None:
        os.close(fd)
        _stale = True
        return
    _fd, _base = fd, index[1]
    _known.update(index[0])
    _unfresh.update(n for n, e in index[0].items() if e[0] == -1)
    _index = {n: e for n, e in index[0].items() if e[0] >= 0}
    _plain = builtins.__import__
    builtins.__import__ = _import
    _serving = True
    os.register_at_fork(after_in_child=_forked)


def _read_index(fd: int, path: str) -> Optional[Tuple[Index, int]]:
    """The file's index (modules without bytecode included) and where its modules
    start; None if it is not this installation's, not well formed, or another
    user's to write."""
    st = os.fstat(fd)
    head = os.pread(fd, _HEAD, 0)
    size = int.from_bytes(head[len(_MAGIC):], "little")
    if head[:len(_MAGIC)] != _MAGIC or not 0 < size <= st.st_size - _HEAD or not _ours(st) \
            or not _ours(os.stat(os.path.dirname(path))):
        return None
    meta, index = marshal.loads(os.pread(fd, size, _HEAD))
    end = _HEAD + size
    if meta != _meta() or type(index) is not dict:
        return None
    for entry in index.values():
        if type(entry) is not tuple or len(entry) != 5 or \
                entry[0] >= 0 and end + entry[0] + entry[1] > st.st_size:
            return None
    return index, end


def stop() -> None:
    """``import`` as it was again (the launch is under way)."""
    global _fd, _serving
    if not _serving:
        return
    _serving = False
    if builtins.__import__ is _import:
        builtins.__import__ = _plain
    os.close(_fd)
    _fd = -1


def _forked() -> None:
    """A child forked while serving imports as the interpreter does: the file is
    its parent's business (the parent closes it, and writes it again)."""
    global _tried
    stop()
    _tried = False


def _import(name: str, globals: Optional[Mapping[str, object]] = None,
            locals: Optional[Mapping[str, object]] = None,
            fromlist: Optional[Sequence[str]] = (), level: int = 0) -> ModuleType:
    """``__import__``, with the package's modules from the file."""
    if level:
        package = globals.get("__package__") if globals else None
        if not isinstance(package, str) or not (package == _NAME
                                                or package.startswith(_PREFIX)):
            return _plain(name, globals, locals, fromlist, level)
        bits = package.rsplit(".", level - 1)
        if len(bits) < level:           # (beyond the top: the import system says so)
            return _plain(name, globals, locals, fromlist, level)
        full = f"{bits[0]}.{name}" if name else bits[0]
    elif name == _NAME or name.startswith(_PREFIX):
        full = name
    else:
        return _plain(name, globals, locals, fromlist, level)
    module = _load(full)
    if module is None:
        return _plain(name, globals, locals, fromlist, level)
    if fromlist:
        for item in fromlist:
            if not hasattr(module, item) and (
                    item == "*" or _load(f"{full}.{item}") is None):
                # (a submodule the file has no code of, or a star: as the import system does)
                return _plain(name, globals, locals, fromlist, level)
        return module
    return module if level else sys.modules[full.partition(".")[0]]


def _load(name: str) -> Optional[ModuleType]:
    """The module ``name`` (run from the file's code, its parents first, under
    its module lock as the import system runs a module); None where the file
    has no fresh code of it (the import system's business)."""
    module = sys.modules.get(name)
    if module is not None:
        if getattr(getattr(module, "__spec__", None), "_initializing", False):
            _bootstrap._lock_unlock_module(name)   # (another thread's, still running)
        return module
    if name not in _index:
        return None
    parent, _, leaf = name.rpartition(".")
    if parent and parent not in sys.modules:
        if _load(parent) is None:
            _plain(parent)
        if name in sys.modules:         # (the parent's own import ran it)
            return _load(name)
    with _bootstrap._ModuleLockManager(name):
        module = sys.modules.get(name)
        if module is not None:
            return module
        code, origin, package = _code(name)
        if code is None:
            return None
        sys.audit("import", name, None, sys.path, sys.meta_path, sys.path_hooks)
        module = _new_module(name, origin, package)
        # (seen initializing, another thread's import waits for the module lock held here)
        spec = module.__spec__
        spec._initializing = True       # type: ignore[union-attr]
        sys.modules[name] = module
        try:
            exec(code, module.__dict__)
        except BaseException:
            sys.modules.pop(name, None)
            raise
        finally:
            spec._initializing = False      # type: ignore[union-attr]
        module = sys.modules[name]
    if parent:
        setattr(sys.modules[parent], leaf, module)
    served.append(name)
    return module


def _code(name: str) -> Tuple[Optional[CodeType], str, bool]:
    """The file's code of ``name`` if its source is as it was (taken out of the
    index: it runs once), its source's path, and whether it is a package."""
    global _stale
    entry = _index.pop(name, None)
    if entry is None or not _serving:
        return None, "", False
    offset, length, mtime, size, package = entry
    origin = _origin(name, package)
    try:
        st = os.stat(origin)
        code = marshal.loads(os.pread(_fd, length, _base + offset)) \
            if st.st_mtime_ns == mtime and st.st_size == size else None
    except Exception:           # (a damaged file)
        code = None
    if not isinstance(code, _CODE):
        _stale = True
        return None, origin, package
    _fix_co_filename(code, origin)      # (compiled elsewhere: its tracebacks name this file)
    return code, origin, package


def _origin(name: str, package: bool) -> str:
    rel = name.split(".")[1:]
    if package:
        rel.append("__init__")
    return os.path.join(_PACKAGE, *rel) + ".py"


def _new_module(name: str, origin: str, package: bool) -> ModuleType:
    """A module as the import system makes it: its spec, loader, file and path
    (no ``__cached__``: the bytecode came from here)."""
    loader = _external.SourceFileLoader(name, origin)
    spec = _bootstrap.ModuleSpec(name, loader, origin=origin, is_package=package)
    spec.has_location = True
    module = type(sys)(name)
    module.__spec__, module.__loader__, module.__file__ = spec, loader, origin
    if package:
        module.__path__ = spec.submodule_search_locations = [os.path.dirname(origin)]
        module.__package__ = name
    else:
        module.__package__ = name.rpartition(".")[0]
    return module


def save() -> None:
    """Write the file again where it was missing, unreadable or stale, or where
    this process imported a module of the package it does not know: the modules
    it held and those imported here, each with its bytecode where that is fresh
    (a few milliseconds, once after an install, an upgrade or an edit, and once
    for each kind of job)."""
    global _stale
    if not _tried:
        return
    here = [n for n in list(sys.modules) if n == _NAME or n.startswith(_PREFIX)]
    # (a module once without fresh bytecode, an edited one under
    # PYTHONDONTWRITEBYTECODE say, is looked at again once imported: its bytecode
    # may have been written since)
    if not _stale and all(n in _known for n in here) and \
            not any(n in _unfresh and _has_bytecode(n) for n in here):
        return
    _stale = False
    path = _path()
    if path is None:
        return
    try:
        _write(path, sorted(_known.union(here)))
    except (OSError, ValueError):
        pass        # (a cache: the next launch imports as usual, and tries again)


def _has_bytecode(name: str) -> bool:
    found = _compiled(name)
    return found is not None and bool(found[0])


def _write(path: str, names: Sequence[str]) -> None:
    """Write the file of ``names`` through its folder's descriptor: a folder that
    another user could rename or replace (or one above it) is not written in, a
    link is not followed, and nothing there is overwritten but the file itself."""
    from .topology import cache_folder
    folder, file = os.path.split(path)
    if folder != cache_folder():        # (one another user could rename or replace)
        return
    os.makedirs(folder, mode=0o700, exist_ok=True)
    dfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if not _ours(os.fstat(dfd)):
            return
        tmp = f".{file}.{os.getpid()}.{os.urandom(6).hex()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600, dir_fd=dfd)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(_file_bytes(names))
            os.replace(tmp, file, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            os.unlink(tmp, dir_fd=dfd)
            raise
        _prune(dfd, file)
    finally:
        os.close(dfd)


def _file_bytes(names: Sequence[str]) -> bytes:
    index: Index = {}
    chunks = []
    offset = 0
    for name in names:
        found = _compiled(name)
        if found is None:
            continue
        blob, mtime, size, package, foreign = found
        if blob:
            index[name] = (offset, len(blob), mtime, size, package)
            chunks.append(blob)
            offset += len(blob)
        else:
            index[name] = (-2 if foreign else -1, 0, mtime, size, package)
    head = marshal.dumps((_meta(), index))
    return b"".join([_MAGIC, len(head).to_bytes(8, "little"), head, *chunks])


def _compiled(name: str) -> Optional[Compiled]:
    """A module's bytecode (empty where it has none usable: a timestamp-based pyc
    (PEP 552) whose flags are 0 and whose time and size are its source's) with its
    source's time and size, whether it is a package, and whether its bytecode is
    of another kind (hash-based); None without a source."""
    for package in (False, True):
        source = _origin(name, package)
        try:
            st = os.stat(source)
        except OSError:
            continue
        data = b""
        foreign = False
        try:
            with open(_external.cache_from_source(source), "rb") as f:
                head = f.read(16)
                ours = head[:4] == _external.MAGIC_NUMBER
                foreign = ours and head[4:8] != bytes(4)
                if ours and not foreign \
                        and head[8:12] == (int(st.st_mtime) & 0xffffffff).to_bytes(4, "little") \
                        and head[12:16] == (st.st_size & 0xffffffff).to_bytes(4, "little"):
                    data = f.read()
        except OSError:
            pass
        return data, st.st_mtime_ns, st.st_size, package, foreign
    return None


def _prune(dfd: int, keep: str) -> None:
    """Remove the files of installations gone (a virtual environment removed, a
    test's copy) untouched for a week: each file names its package's folder
    (which a home shared by hosts may hold for another host only)."""
    import time
    for entry in os.listdir(dfd):
        if entry == keep or not (entry.startswith("code-") and entry.endswith(".bin")):
            continue
        try:
            fd = os.open(entry, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
            try:
                st = os.fstat(fd)
                head = os.pread(fd, _HEAD, 0)
                size = int.from_bytes(head[len(_MAGIC):], "little")
                if head[:len(_MAGIC)] != _MAGIC or not 0 < size <= st.st_size - _HEAD \
                        or st.st_mtime > time.time() - _PRUNE_AFTER:
                    continue
                (_, package, _), _ = marshal.loads(os.pread(fd, size, _HEAD))
            finally:
                os.close(fd)
            if isinstance(package, str) and not os.path.isdir(package):
                os.unlink(entry, dir_fd=dfd)
        except Exception:       # (another's file, or a damaged one: left)
            pass
