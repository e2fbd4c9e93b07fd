"""The package's compiled modules in one file of the user's cache, loaded
without the import system's search: the ``mslaunch`` command's start, and an
agent's started from its host's own copy of the package.

A launch imports some sixty of the package's modules before its first rank
starts. Through the import system each costs its search along the path, its
file's checks and reads, its spec and its locks: about two thirds of the
Python a launch runs before that rank, some 60 microseconds a module. With
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
  bytecode is not in it, and is imported as usual.
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
    from types import ModuleType
    from typing import Dict, List, Mapping, Optional, Sequence, Set, Tuple

    #: name -> (offset, length, source's st_mtime_ns, source's size, is a package)
    Index = Dict[str, Tuple[int, int, int, int, bool]]

_MAGIC = b"mslaunch code 1\n"
# The import system's own modules, loaded with the interpreter (no import of importlib's).
_bootstrap = sys.modules["_frozen_importlib"]
_external = sys.modules["_frozen_importlib_external"]
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_NAME = __name__.partition(".")[0]
_CODE = type((lambda: None).__code__)

#: While serving: the open file, its index, where its modules start, and the
#: import this replaced.
_fd = -1
_index: Index = {}
_base = 0
_plain = builtins.__import__
#: The file should be written again when the command exits.
_stale = False
_serving = False
_tried = False
#: The modules the file holds, and those run from it in this process (in order).
_known: Set[str] = set()
served: List[str] = []


def _path() -> Optional[str]:
    """Where this installation's file is (None without a home)."""
    base = os.environ.get("XDG_CACHE_HOME") or ""
    if not os.path.isabs(base):
        home = os.path.expanduser("~")
        if not os.path.isabs(home):
            return None
        base = os.path.join(home, ".cache")
    key = _digest(_PACKAGE.encode())
    return os.path.join(base, "mslaunch", f"code-{key}-{sys.implementation.cache_tag}.bin")


def _digest(data: bytes) -> str:
    """A short digest (FNV-1a, 64 bits: hashlib's import would cost more than this file saves)."""
    h = 0xcbf29ce484222325
    for byte in data:
        h = ((h ^ byte) * 0x100000001b3) & 0xffffffffffffffff
    return f"{h:016x}"


def _ours(st: os.stat_result) -> bool:
    """Owned by this user and writable by no one else."""
    return st.st_uid == os.geteuid() and not st.st_mode & 0o022


def start() -> None:
    """Serve the package's modules from the file, if it can be read (and mark it
    to be written at the end if it cannot)."""
    global _fd, _index, _base, _plain, _stale, _serving, _tried
    if "importtime" in sys._xoptions or _serving:
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
        head = os.pread(fd, len(_MAGIC) + 8, 0)
        size = int.from_bytes(head[len(_MAGIC):], "little")
        if head[:len(_MAGIC)] != _MAGIC or not _ours(os.fstat(fd)) \
                or not _ours(os.stat(os.path.dirname(path))):
            raise ValueError
        st = os.fstat(fd)
        meta, index = marshal.loads(os.pread(fd, size, len(_MAGIC) + 8))
        end = max((entry[0] + entry[1] for entry in index.values()), default=0)
        if meta != (_external.MAGIC_NUMBER, _PACKAGE) or len(_MAGIC) + 8 + size + end \
                != st.st_size:
            raise ValueError
    except (OSError, ValueError, EOFError, TypeError):
        os.close(fd)
        _stale = True
        return
    _fd, _index, _base = fd, index, len(_MAGIC) + 8 + size
    _known.update(index)
    _plain = builtins.__import__
    builtins.__import__ = _import
    _serving = True


def stop() -> None:
    """``import`` as the interpreter's own again (the launch is under way)."""
    global _fd, _serving
    if not _serving:
        return
    _imp.acquire_lock()
    try:
        builtins.__import__ = _plain
        _serving = False
        os.close(_fd)
        _fd = -1
        _index.clear()
    finally:
        _imp.release_lock()


def _import(name: str, globals: Optional[Mapping[str, object]] = None,
            locals: Optional[Mapping[str, object]] = None,
            fromlist: Optional[Sequence[str]] = (), level: int = 0) -> ModuleType:
    """``__import__``, with the package's modules from the file."""
    if level:
        package = globals.get("__package__") if globals else None
        if not isinstance(package, str) or not package.startswith(_NAME):
            return _plain(name, globals, locals, fromlist, level)
        if level > 1:
            package = package.rsplit(".", level - 1)[0]
        full = f"{package}.{name}" if name else package
    elif name.startswith(_NAME):
        full = name
    else:
        return _plain(name, globals, locals, fromlist, level)
    modules = sys.modules
    module = modules.get(full)
    if module is None:
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
    return module if level else modules[full.partition(".")[0]]


def _load(name: str) -> Optional[ModuleType]:
    """The module ``name`` run from the file's code (its parents first); None
    where the file has no fresh code of it (the import system's business)."""
    global _stale
    _imp.acquire_lock()
    try:
        module = sys.modules.get(name)
        if module is not None:
            return module
        entry = _index.get(name) if _serving else None
        if entry is None:
            return None
        offset, length, mtime, size, package = entry
        origin = _origin(name, package)
        try:
            st = os.stat(origin)
            fresh = st.st_mtime_ns == mtime and st.st_size == size
        except OSError:
            fresh = False
        parent, _, leaf = name.rpartition(".")
        if not fresh or (parent and sys.modules.get(parent) is None
                         and _load(parent) is None and _plain(parent) is None):
            _stale = True
            del _index[name]
            return None
        try:
            code = marshal.loads(os.pread(_fd, length, _base + offset))
        except (OSError, EOFError, ValueError, TypeError):
            code = None
        if type(code) is not _CODE:
            _stale = True
            del _index[name]
            return None
        sys.audit("import", name, None, sys.path, sys.meta_path, sys.path_hooks)
        module = _new_module(name, origin, package)
        sys.modules[name] = module
        try:
            exec(code, module.__dict__)
        except BaseException:
            sys.modules.pop(name, None)
            raise
        module = sys.modules[name]
        if parent:
            setattr(sys.modules[parent], leaf, module)
        served.append(name)
        return module
    finally:
        _imp.release_lock()


def _origin(name: str, package: bool) -> str:
    rel = name.split(".")[1:]
    if package:
        rel.append("__init__")
    return os.path.join(_PACKAGE, *rel) + ".py"


def _new_module(name: str, origin: str, package: bool) -> ModuleType:
    """A module as the import system makes it: its spec, loader, file and path."""
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
    this process imported a module of the package it lacks: the modules it held
    and those imported here, each whose bytecode is fresh (a few milliseconds,
    once for each kind of job)."""
    global _stale
    if not _tried:
        return
    here = [n for n in list(sys.modules) if n == _NAME or n.startswith(_NAME + ".")]
    if not _stale and not any(n not in _known and _compiled(n)[1] is not None for n in here):
        return
    _stale = False
    path = _path()
    if path is None:
        return
    try:
        code = {n: c for n, c in map(_compiled, _known.union(here)) if c is not None}
        _write(path, code)
    except (OSError, ValueError):
        pass        # (a cache: the next launch imports as usual, and tries again)


def _compiled(name: str) -> Tuple[str, Optional[Tuple[bytes, int, int, bool]]]:
    """A module's fresh bytecode (a timestamp-based pyc's, PEP 552: magic, flags
    0, its source's time and size) with its source's time and size, and whether it
    is a package; None where it has none."""
    for package in (False, True):
        source = _origin(name, package)
        try:
            st = os.stat(source)
        except OSError:
            continue
        try:
            with open(_external.cache_from_source(source), "rb") as f:
                data = f.read()
        except OSError:
            return name, None
        if data[:4] != _external.MAGIC_NUMBER or data[4:8] != bytes(4) \
                or int.from_bytes(data[8:12], "little") != int(st.st_mtime) & 0xffffffff \
                or int.from_bytes(data[12:16], "little") != st.st_size & 0xffffffff:
            return name, None
        return name, (data[16:], st.st_mtime_ns, st.st_size, package)
    return name, None


def _write(path: str, code: Dict[str, Tuple[bytes, int, int, bool]]) -> None:
    index: Index = {}
    offset = 0
    for name, (blob, mtime, size, package) in code.items():
        index[name] = (offset, len(blob), mtime, size, package)
        offset += len(blob)
    head = marshal.dumps(((_external.MAGIC_NUMBER, _PACKAGE), index))
    folder = os.path.dirname(path)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    if not _ours(os.stat(folder)):
        return
    _prune(folder)
    tmp = f"{path}.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(_MAGIC + len(head).to_bytes(8, "little") + head)
            f.writelines(c[0] for c in code.values())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _prune(folder: str) -> None:
    """Remove the files of installations gone (a virtual environment removed,
    a test's copy): each file names its package's folder."""
    for entry in os.listdir(folder):
        if not (entry.startswith("code-") and entry.endswith(".bin")):
            continue
        path = os.path.join(folder, entry)
        try:
            with open(path, "rb") as f:
                head = f.read(len(_MAGIC) + 8)
                size = int.from_bytes(head[len(_MAGIC):], "little")
                if head[:len(_MAGIC)] != _MAGIC or size > 1 << 20:
                    continue
                (_magic, package), _ = marshal.loads(f.read(size))
            if isinstance(package, str) and not os.path.isdir(package):
                os.unlink(path)
        except (OSError, ValueError, EOFError, TypeError):
            pass
