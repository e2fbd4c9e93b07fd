"""Starting an agent on a host that has only Python: the command and what it reads.

The remote command is the same on every host and needs nothing installed:
``/bin/sh`` finds an interpreter (the launcher's own path if it exists there,
then ``python3``; or only ``--remote-python``) and runs a one-line program
that reads a length-prefixed bootstrap from stdin and executes it.  The
bootstrap checks the Python version, reads a bundle of the launcher's own
``mslaunch`` package (so the agent always matches the launcher), imports it
from memory -- nothing is written to the remote disk -- and runs
:func:`mslaunch.remote.agent.main` on the rest of the stream.

The bundle is a marshalled dict with every module's source and, for the
launcher's Python version, its compiled code, each compressed on its own:
the agent inflates only the modules it imports (about half of them), and a
remote Python of the same version compiles nothing, which saves a tenth of a
second of CPU per host; any other version compiles the sources.  The
bootstrap uses only what the interpreter has loaded at start-up (and
:mod:`marshal`, :mod:`zlib`): ``importlib.abc`` and :mod:`zipfile` would
cost the agent more than the rest of its start.  The interpreter runs with
``-S``: the agent needs nothing from ``site-packages``, and ``site`` with
its ``.pth`` files is a few milliseconds per host.

The launcher keeps the bundle in its cache directory, keyed by the
package's files (path, size, modification time) and the interpreter's
bytecode version, so it is built once per installation, not per job.

Written in single quotes for the login shell and double quotes inside,
the command survives sh, bash, zsh, csh and fish alike.
"""

from __future__ import annotations

import os
import threading
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Dict, List, Optional, Sequence, Tuple

#: The one-line program the remote interpreter runs: it reads the bootstrap.
#: Its reader has a one-byte buffer: it must not read ahead past the
#: bootstrap, or the first frames behind it would be lost to the agent,
#: which reads file descriptor 0 itself.
_TINY = ("import io;b=io.BufferedReader(io.FileIO(0,closefd=False),1);"
         "exec(b.read(int(b.readline())))")

#: Runs with ``b``, the one-line program's reader; reads the package bundle.
BOOTSTRAP = r'''
import sys
if sys.version_info < (3, 8):
    sys.stderr.write("mslaunch: the agent needs Python 3.8 or newer; %s is %s\n"
                     % (sys.executable, sys.version.split()[0]))
    sys.exit(126)
import marshal, zlib
_bundle = marshal.loads(b.read(int(b.readline())))
_sources = _bundle["sources"]
_code = _bundle["code"] if _bundle["magic"] == sys.modules[
    "_frozen_importlib_external"].MAGIC_NUMBER else {}
_Spec = sys.modules["_frozen_importlib"].ModuleSpec


class _FromMemory:
    """Imports the mslaunch package from the bundle held in memory."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        if name != "mslaunch" and not name.startswith("mslaunch."):
            return None
        base = name.replace(".", "/")
        for path, package in ((base + "/__init__.py", True), (base + ".py", False)):
            if path in _sources:
                return _Spec(name, _FromMemory, origin="<mslaunch agent>/" + path,
                             is_package=package)
        return None

    @staticmethod
    def create_module(spec):
        return None

    @staticmethod
    def exec_module(module):
        path = module.__spec__.origin.split("/", 1)[1]
        module.__file__ = module.__spec__.origin
        compiled = _code.get(path)
        if compiled is not None:
            code = marshal.loads(zlib.decompress(compiled))
        else:
            code = compile(zlib.decompress(_sources[path]), module.__spec__.origin, "exec")
        exec(code, module.__dict__)


sys.meta_path.insert(0, _FromMemory)
from mslaunch.remote.agent import main
sys.exit(main())
'''

#: The marshal format of the bundle: version 4 is read by every Python from 3.4.
_MARSHAL_VERSION = 4

_bundle_cache: Optional[bytes] = None
_bundle_lock = threading.Lock()
_payload_cache: List[bytes] = []


def _package_files() -> List[Tuple[str, str]]:
    """(path, name inside the bundle) of every module of the installed package."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    top = os.path.dirname(root)
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                found.append((path, os.path.relpath(path, top).replace(os.sep, "/")))
    return found


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


def package_bundle() -> bytes:
    """The installed ``mslaunch`` package as a bundle, from the cache while it matches."""
    if _bundle_cache is None:
        with _bundle_lock:
            if _bundle_cache is None:
                _read_or_build()
    return _bundle_cache  # type: ignore[return-value]


def _read_or_build() -> None:
    global _bundle_cache
    import hashlib
    import importlib.util
    from ..machine.topology import cache_path
    files = _package_files()
    key = hashlib.sha256(importlib.util.MAGIC_NUMBER)
    for path, name in files:
        st = os.stat(path)
        key.update(f"{name}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    cached = cache_path(f"agent-{key.hexdigest()[:24]}.bundle")
    try:
        with open(cached, "rb") as f:
            _bundle_cache = f.read()
        return
    except OSError:
        pass
    bundle = build_bundle(files, importlib.util.MAGIC_NUMBER)
    _save(cached, bundle)
    _bundle_cache = bundle


def _save(path: str, data: bytes) -> None:
    """Write the cache file whole (a new name, then renamed), or not at all."""
    folder = os.path.dirname(path)
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        # Bundles of other versions or edits of the package go after a day
        # (two installations in use rebuild theirs at most once a day).
        stale = time.time() - 86400
        for old in os.listdir(folder):
            old_path = os.path.join(folder, old)
            if old.startswith("agent-") and old.endswith(".bundle") \
                    and os.stat(old_path).st_mtime < stale:
                os.unlink(old_path)
        temp = f"{path}.{os.getpid()}"
        with open(temp, "wb") as f:
            f.write(data)
        os.replace(temp, path)
    except OSError:
        pass


def prepare_in_background(after: Optional[Callable[[], None]] = None, *,
                          credentials: bool = True) -> None:
    """Read or build the bundle, then (with ``credentials``) make the launcher's
    TLS credentials for the agents' output connections, in a thread, while
    hosts connect.

    The credentials wait for ``after`` (paramiko's import): made at the same
    time, their own imports would hold up paramiko's, which every host
    waits for, while they are needed only once the agents run."""
    def prepare() -> None:
        package_bundle()
        from . import dialback
        if credentials and dialback.direct_output() and dialback.output_tls():
            if after is not None:
                after()
            try:
                dialback.tls_credentials()
            except Exception:       # said by the Listener that asks for them
                pass

    finish_before_exit(threading.Thread(target=prepare, name="agent-bundle", daemon=True))


def finish_before_exit(thread: threading.Thread) -> None:
    """Start ``thread``, and wait for it (a few seconds at most) when the
    interpreter exits: a daemon thread stopped inside ``cryptography``'s Rust
    code (its import, a key being made) aborts the process, which would turn
    an early error's exit status into 134."""
    import atexit
    thread.start()
    atexit.register(thread.join, 5.0)


def payload() -> bytes:
    """What the launcher writes to the remote command's stdin before the link starts."""
    if not _payload_cache:
        source, bundle = BOOTSTRAP.encode(), package_bundle()
        _payload_cache.append(b"%d\n%s%d\n%s" % (len(source), source, len(bundle), bundle))
    return _payload_cache[0]


def shell_quote(word: str) -> str:
    """``word`` in single quotes, for any POSIX shell (and csh, fish)."""
    return "'" + word.replace("'", "'\"'\"'") + "'"


def interpreter_script(program: str) -> str:
    """A ``/bin/sh`` script that runs ``program`` (a one-line Python program) with the
    first of its arguments that names an interpreter, or says that none does."""
    return ('for p in "$@"; do if command -v "$p" >/dev/null 2>&1; then exec "$p" -S -c "'
            + program + '"; fi; done; echo "mslaunch: no Python interpreter found on '
            '$(hostname) (tried: $*); use --remote-python PATH" >&2; exit 127')


def remote_command(pythons: Sequence[str]) -> str:
    """The command line run on every remote host (see the module docstring)."""
    return ("exec /bin/sh -c " + shell_quote(interpreter_script(_TINY)) + " mslaunch-agent "
            + " ".join(shell_quote(p) for p in pythons))
