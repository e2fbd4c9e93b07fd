"""Starting an agent on a host that has only Python: the command and what it reads.

The remote command is the same on every host and needs nothing installed:
``/bin/sh`` finds an interpreter (the launcher's own path if it exists there,
then ``python3``; or only ``--remote-python``) and runs a one-line program
that reads a length-prefixed bootstrap from stdin and executes it.  The
bootstrap checks the Python version, reads a zip of the launcher's own
``mslaunch`` package (so the agent always matches the launcher), imports it
from memory -- nothing is written to the remote disk -- and runs
:func:`mslaunch.remote.agent.main` on the rest of the stream.

The zip also carries the package compiled by the launcher's interpreter
(``__code__/<magic>/...``): a remote Python of the same version uses that
code and compiles nothing, which saves a tenth of a second of CPU per host;
any other version compiles the sources.

Written in single quotes for the login shell and double quotes inside,
the command survives sh, bash, zsh, csh and fish alike.
"""

from __future__ import annotations

import io
import os
import zipfile

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Optional, Sequence

#: The one-line program the remote interpreter runs: it reads the bootstrap.
#: Its reader has a one-byte buffer: it must not read ahead past the
#: bootstrap, or the first frames behind it would be lost to the agent,
#: which reads file descriptor 0 itself.
_TINY = ("import io;b=io.BufferedReader(io.FileIO(0,closefd=False),1);"
         "exec(b.read(int(b.readline())))")

#: Runs with ``b``, the one-line program's reader; reads the package zip.
BOOTSTRAP = r'''
import sys
if sys.version_info < (3, 8):
    sys.stderr.write("mslaunch: the agent needs Python 3.8 or newer; %s is %s\n"
                     % (sys.executable, sys.version.split()[0]))
    sys.exit(126)
import importlib.abc, importlib.util, io, marshal, zipfile
_zip = zipfile.ZipFile(io.BytesIO(b.read(int(b.readline()))))
_files = {name: _zip.read(name) for name in _zip.namelist()}
_code = "__code__/" + importlib.util.MAGIC_NUMBER.hex() + "/"


class _FromMemory(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports the mslaunch package from the zip held in memory."""

    def find_spec(self, name, path=None, target=None):
        if name != "mslaunch" and not name.startswith("mslaunch."):
            return None
        base = name.replace(".", "/")
        for path, package in ((base + "/__init__.py", True), (base + ".py", False)):
            if path in _files:
                return importlib.util.spec_from_loader(
                    name, self, origin="<mslaunch agent>/" + path, is_package=package)
        return None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        path = module.__spec__.origin.split("/", 1)[1]
        module.__file__ = module.__spec__.origin
        compiled = _files.get(_code + path)
        if compiled is not None:
            code = marshal.loads(compiled)
        else:
            code = compile(_files[path], module.__spec__.origin, "exec")
        exec(code, module.__dict__)


sys.meta_path.insert(0, _FromMemory())
from mslaunch.remote.agent import main
sys.exit(main())
'''

_zip_cache: Optional[bytes] = None


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


def package_zip() -> bytes:
    """The ``mslaunch`` package's sources and code as a zip (built once per process)."""
    global _zip_cache
    if _zip_cache is None:
        import importlib.util
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        top = os.path.dirname(root)
        code_dir = "__code__/" + importlib.util.MAGIC_NUMBER.hex() + "/"
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as z:
            for folder, dirs, files in os.walk(root):
                dirs[:] = sorted(d for d in dirs if d != "__pycache__")
                for name in sorted(files):
                    if name.endswith(".py"):
                        path = os.path.join(folder, name)
                        rel = os.path.relpath(path, top)
                        z.write(path, rel)
                        z.writestr(code_dir + rel,
                                   _compiled(path, "<mslaunch agent>/" + rel))
        _zip_cache = buf.getvalue()
    return _zip_cache


def prepare_in_background() -> None:
    """Build the zip in a thread, while paramiko is imported and hosts connect."""
    import threading
    threading.Thread(target=package_zip, name="agent-zip", daemon=True).start()


def payload() -> bytes:
    """What the launcher writes to the remote command's stdin before the link starts."""
    source = BOOTSTRAP.encode()
    archive = package_zip()
    return b"%d\n%s%d\n%s" % (len(source), source, len(archive), archive)


def shell_quote(word: str) -> str:
    """``word`` in single quotes, for any POSIX shell (and csh, fish)."""
    return "'" + word.replace("'", "'\"'\"'") + "'"


def remote_command(pythons: Sequence[str]) -> str:
    """The command line run on every remote host (see the module docstring)."""
    script = ('for p in "$@"; do if command -v "$p" >/dev/null 2>&1; then exec "$p" -c "'
              + _TINY + '"; fi; done; echo "mslaunch: no Python interpreter found on '
              '$(hostname) (tried: $*); use --remote-python PATH" >&2; exit 127')
    return ("exec /bin/sh -c " + shell_quote(script) + " mslaunch-agent "
            + " ".join(shell_quote(p) for p in pythons))
