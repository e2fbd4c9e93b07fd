"""The agent's package as the launcher sends it: built once, cached, digested.

The bundle is a marshalled dict with every module's source and, for the
launcher's Python version, its compiled code, each compressed on its own:
the agent inflates only the modules it imports (about half of them), and a
remote Python of the same version compiles nothing, which saves a tenth of a
second of CPU per host; any other version compiles the sources.

The launcher keeps the bundle in its cache directory, keyed by the
package's files (path, size, modification time) and the interpreter's
bytecode version, so it is built once per installation, not per job.

The digest (:func:`package_digest`) is what an agent compares its host's
own copy with (see :mod:`.bootstrap`).
"""

from __future__ import annotations

import _thread
import os
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Optional, Sequence, Tuple

#: The marshal format of the bundle: version 4 is read by every Python from 3.4.
_MARSHAL_VERSION = 4

_bundle_cache: Optional[Tuple[memoryview, str]] = None
_framed: Optional[bytes] = None      # the bundle as sent: its length, a newline, itself
#: The digest alone, read from the cache's first line: hosts that have the
#: package need no more, so the bundle itself (1.5 MB) is read only when a
#: host asks for it.
_digest_cache: Optional[str] = None
#: The cache file that digest was read from, held open (with the offset of the
#: bundle in it): a host that asks later is sent that very bundle, whatever
#: has become of the package's files or the cache since.
_digest_file: Optional[Tuple[int, int, Tuple[int, int]]] = None   # fd, offset, (dev, inode)
_bundle_lock = _thread.allocate_lock()


def _package_files() -> List[Tuple[str, str]]:
    """(path, name inside the bundle) of every module of the installed package."""
    import mslaunch
    root = os.path.dirname(os.path.abspath(mslaunch.__file__))
    cut = len(os.path.join(os.path.dirname(root), ""))
    # As os.walk (a linked folder is not entered), by hand: half the time,
    # on the way of every remote job.  The bootstrap walks the host's alike.
    found, todo = [], [root]
    while todo:
        with os.scandir(todo.pop()) as entries:
            for e in entries:
                if e.is_dir():
                    if e.name != "__pycache__" and not e.is_symlink():
                        todo.append(e.path)
                elif e.name.endswith(".py"):
                    found.append((e.path, e.path[cut:].replace(os.sep, "/")))
    return sorted(found, key=lambda f: f[1])


def _compiled(path: str, origin: str) -> bytes:
    """The marshalled code of one module: from its cached .pyc when fresh, else compiled."""
    import importlib.util
    import marshal
    try:
        cached = importlib.util.cache_from_source(path)
        with open(cached, "rb") as f:
            head = f.read(16)
            source = os.stat(path)
            flags = int.from_bytes(head[4:8], "little")
            if head[:4] == importlib.util.MAGIC_NUMBER and flags == 0 \
                    and int.from_bytes(head[8:12], "little") == int(source.st_mtime) & 0xFFFFFFFF \
                    and int.from_bytes(head[12:16], "little") == source.st_size & 0xFFFFFFFF:
                # A .pyc names its source file in its code; the agent's names matter
                # only in tracebacks, so the cached one is fine.
                return f.read()
    except (OSError, NotImplementedError, ValueError):
        pass
    with open(path, "rb") as f:
        return marshal.dumps(compile(f.read(), origin, "exec"))


def build_bundle(files: Sequence[Tuple[str, str]], magic: bytes) -> bytes:
    """The bundle of ``files`` ((path, name) pairs), with code for bytecode ``magic``."""
    import marshal
    import zlib
    sources: Dict[str, bytes] = {}
    code: Dict[str, bytes] = {}
    for path, name in files:
        with open(path, "rb") as f:
            sources[name] = zlib.compress(f.read(), 6)
        code[name] = zlib.compress(_compiled(path, "<mslaunch agent>/" + name), 6)
    return marshal.dumps({"magic": magic, "sources": sources, "code": code},
                         _MARSHAL_VERSION)


def package_digest(files: Sequence[Tuple[str, str]]) -> str:
    """The SHA-256 of ``files`` ((path, name) pairs): names and sources, in name
    order, as the bootstrap hashes the host's own copy of the package."""
    digest = _sha256()
    for path, name in sorted(files, key=lambda f: f[1]):
        with open(path, "rb") as f:
            data = f.read()
        digest.update(b"%s\0%d\0" % (name.encode("utf-8", "surrogateescape"), len(data)))
        digest.update(data)
    return digest.hexdigest()


def package_bundle() -> Tuple[memoryview, str]:
    """The installed ``mslaunch`` package as a bundle (a view of :func:`framed_bundle`),
    and its digest, from the cache while it matches."""
    if _bundle_cache is None:
        with _bundle_lock:
            if _bundle_cache is None:
                _read_or_build(whole=True)
    return _bundle_cache  # type: ignore[return-value]


def bundle_digest() -> str:
    """The digest of :func:`package_bundle`, what agents compare their host's
    copy with; from the cache without reading the bundle itself."""
    known = _known_digest()
    if known is None:
        with _bundle_lock:
            if _known_digest() is None:
                _read_or_build(whole=False)
        known = _known_digest()
    assert known is not None
    return known


def _known_digest() -> Optional[str]:
    return _bundle_cache[1] if _bundle_cache is not None else _digest_cache


def _sha256(data: bytes = b""):
    """A SHA-256 object from the interpreter's own module when it has one:
    ``hashlib`` loads OpenSSL, milliseconds of a launch, for a few hashes."""
    try:
        from _sha256 import sha256
    except ImportError:
        try:
            from _sha2 import sha256
        except ImportError:
            from hashlib import sha256
    return sha256(data)


def interpreter_magic() -> bytes:
    """The interpreter's bytecode version (``importlib.util``'s, without its imports)."""
    import sys
    return sys.modules["_frozen_importlib_external"].MAGIC_NUMBER


def _read_or_build(whole: bool) -> None:
    """Fill :data:`_bundle_cache` (or, not ``whole``, at least :data:`_digest_cache`)."""
    global _digest_cache, _digest_file
    from ...machine.topology import cache_path
    if whole and _digest_file is not None and _digest_cache is not None:
        held, _digest_file = _digest_file, None
        bundle = _read_held(held)
        if bundle is not None:
            _keep(bundle, _digest_cache)
            return
    files = _package_files()
    magic = interpreter_magic()
    key = _sha256(b"2\0" + magic)
    for path, name in files:
        st = os.stat(path)
        key.update(f"{name}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    cached = cache_path(f"agent-{key.hexdigest()[:24]}.bundle")
    opened = _open_cache(cached)
    if opened is not None:
        digest, held = opened
        if not whole:
            _digest_cache, _digest_file = digest, held
            return
        bundle = _read_held(held)
        if bundle is not None:
            _keep(bundle, digest)
            return
    bundle = build_bundle(files, magic)
    digest = package_digest(files)
    _save(cached, digest.encode("ascii") + b"\n" + bundle)
    _keep(bundle, digest)


def _open_cache(path: str) -> Optional[Tuple[str, Tuple[int, int, Tuple[int, int]]]]:
    """The digest on the first line of the cache file ``path``, and the file held
    open (see :data:`_digest_file`); None for a file missing or malformed."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    head = _pread(fd, 65, 0)
    digest = head[:64].decode("ascii", "replace")
    try:
        if head[64:] == b"\n" and digest.isalnum():
            st = os.fstat(fd)
            return digest, (fd, 65, (st.st_dev, st.st_ino))
    except OSError:
        pass
    os.close(fd)
    return None


def _read_held(held: Tuple[int, int, Tuple[int, int]]) -> Optional[bytes]:
    """The bundle in a held cache file (closed then); None if it is not that file
    any more (a helper process sheds the descriptors it inherits, and the
    number may have been reused) or cannot be read."""
    fd, offset, identity = held
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    if (st.st_dev, st.st_ino) != identity:
        return None                   # not ours to close
    try:
        return _read_from(fd, offset)
    finally:
        os.close(fd)


def _pread(fd: int, size: int, offset: int) -> bytes:
    """Up to ``size`` bytes at ``offset`` (fewer only at the end of the file)."""
    parts: List[bytes] = []
    while size > 0:
        try:
            chunk = os.pread(fd, size, offset)
        except InterruptedError:
            continue
        except OSError:
            break
        if not chunk:
            break
        parts.append(chunk)
        size -= len(chunk)
        offset += len(chunk)
    return b"".join(parts)


def _read_from(fd: int, offset: int) -> Optional[bytes]:
    """The rest of the cache file ``fd`` from ``offset``; None if unreadable."""
    try:
        size = os.fstat(fd).st_size - offset
    except OSError:
        return None
    data = _pread(fd, size, offset)
    return data if len(data) == size and size > 0 else None


def cached_code(kind: str, source: str) -> bytes:
    """``source`` (a program of this package's, e.g. the bootstrap) compiled by
    this interpreter and marshalled, kept in the cache beside the bundle (by the
    package's digest and the bytecode version): compiled once per installation,
    not by every launcher."""
    import marshal
    from ...machine.topology import cache_path
    path = cache_path(f"agent-{bundle_digest()[:24]}-{interpreter_magic().hex()}.{kind}")
    try:
        with open(path, "rb") as f:
            data = f.read()
        if isinstance(marshal.loads(data), type(cached_code.__code__)):   # not damaged
            return data
    except (OSError, ValueError, EOFError, TypeError):
        pass
    data = marshal.dumps(compile(source, f"<mslaunch {kind}>", "exec"))
    _save(path, data)
    return data


def _keep(bundle: bytes, digest: str) -> None:
    """Hold the bundle once, as it is sent (:func:`framed_bundle`)."""
    global _bundle_cache, _framed
    head = b"%d\n" % len(bundle)
    _framed = head + bundle
    _bundle_cache = memoryview(_framed)[len(head):], digest


def framed_bundle() -> bytes:
    """The bundle as the bootstrap reads it (its length on a line, then itself),
    made once: every host is sent this one object, never a copy of its own."""
    package_bundle()
    return _framed  # type: ignore[return-value]


def _save(path: str, data: bytes) -> None:
    """Write the cache file whole (a new name, then renamed), or not at all."""
    folder = os.path.dirname(path)
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        # Bundles and compiled bootstraps of other versions or edits of the
        # package go after a day (two installations in use rebuild theirs at
        # most once a day).
        stale = time.time() - 86400
        for old in os.listdir(folder):
            old_path = os.path.join(folder, old)
            if old.startswith("agent-") and os.stat(old_path).st_mtime < stale:
                os.unlink(old_path)
    except OSError:
        pass
    from ...machine.topology import save_whole
    save_whole(path, data)
