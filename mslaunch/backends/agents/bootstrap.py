"""Starting an agent on a host that has only Python: the command and what it reads.

The remote command is the same on every host and needs nothing installed:
``/bin/sh`` finds an interpreter (the launcher's own path if it exists there,
then ``python3``; or only ``--remote-python``) and runs a one-line program
that reads a length-prefixed bootstrap from stdin and executes it.  The
bootstrap checks the Python version and looks for the ``mslaunch`` the
host's Python would import: its path, its site-packages (a virtual
environment's too, which ``-S`` leaves unread) and the directories named
in their ``.pth`` files (whose ``import`` lines are not run).  When that
copy has the launcher's version and the same digest (a
SHA-256 of every module's name and source, hashed here from the host's
files, as :func:`.bundle.package_digest` hashes the launcher's) and imports, the
agent runs from it, and the launcher sends nothing more.  Otherwise the
bootstrap asks for, and reads, a bundle of the launcher's own package (so
the agent always matches the launcher) and imports it from memory --
nothing is written to the remote disk.  Either way it says which on stdout
before the link starts (:data:`MARK`), and runs
:func:`mslaunch.agent.agentmain.begin` on the rest of the stream.
:class:`Handshake` is the launcher's side of this, shared by every starter.

The bundle itself (built, cached, digested) is :mod:`.bundle`'s.  The
bootstrap uses only what the interpreter has loaded at start-up (and
:mod:`marshal`, :mod:`zlib`): ``importlib.abc`` and :mod:`zipfile` would
cost the agent more than the rest of its start.  The interpreter runs with
``-S``: the agent needs nothing from ``site-packages``, and ``site`` with
its ``.pth`` files is a few milliseconds per host.

Written in single quotes for the login shell and double quotes inside,
the command survives sh, bash, zsh, csh and fish alike.
"""

from __future__ import annotations

from .bundle import bundle_digest, cached_code, framed_bundle, interpreter_magic

TYPE_CHECKING = False
if TYPE_CHECKING:
    import threading
    from typing import Callable, Dict, List, Optional, Sequence, Tuple

#: The one-line program the remote interpreter runs: it reads the bootstrap.
#: Its reader has a one-byte buffer: it must not read ahead past the
#: bootstrap, or the first frames behind it would be lost to the agent,
#: which reads file descriptor 0 itself.
_TINY = ("import io;b=io.BufferedReader(io.FileIO(0,closefd=False),1);"
         "exec(b.read(int(b.readline())))")

#: Runs with ``b``, the one-line program's reader, ``_W``: the launcher's
#: (version, package digest), or None not to look at the host's package, and
#: ``_J``: the job's public id (its name without the secret), which the agent's
#: guard takes at once ("" if none).
#: Says on stdout, after :data:`MARK`, which way the agent starts: ``host
#: PATH`` (the host's own copy, identical to the launcher's, is imported), or
#: ``need WHY``, and then reads the bundle.
BOOTSTRAP = r'''
import sys, os
_J = globals().get("_J", "")
if sys.version_info < (3, 8):
    sys.stderr.write("mslaunch: the agent needs Python 3.8 or newer; %s is %s\n"
                     % (sys.executable, sys.version.split()[0]))
    sys.exit(126)
_X = os.path.dirname(os.path.abspath(sys.executable))
for _V in (_X, os.path.dirname(_X)):
    # -S leaves a virtual environment's pyvenv.cfg unread: its prefix is taken
    # as site takes it (the MPI wheels' libraries are looked for under it).
    if os.path.isfile(os.path.join(_V, "pyvenv.cfg")):
        sys.prefix = sys.exec_prefix = os.path.dirname(_X)
        break
else:
    _V = None


def _digest(top, root):
    try:
        from _sha256 import sha256
    except ImportError:
        try:
            from _sha2 import sha256
        except ImportError:
            from hashlib import sha256
    # The walk of os.walk (a linked folder is not entered), by hand: half the time.
    cut = len(os.path.join(top, ""))
    named, todo = [], [root]
    while todo:
        with os.scandir(todo.pop()) as entries:
            for e in entries:
                if e.is_dir():
                    if e.name != "__pycache__" and not e.is_symlink():
                        todo.append(e.path)
                elif e.name.endswith(".py"):
                    named.append((e.path[cut:].replace(os.sep, "/"), e.path, e.stat()))
    named.sort()
    # Hashing the sources is most of the agent's start; the digest is kept, in
    # the user's cache, with the files' names, sizes and times, which Python's
    # own bytecode cache trusts as well.
    stamp = sha256()
    for name, path, st in named:
        stamp.update(b"%s\0%d\0%d\0%d\0" % (name.encode("utf-8", "surrogateescape"),
                                           st.st_size, st.st_mtime_ns, st.st_ino))
    stamp = stamp.hexdigest()
    cache = os.path.join(os.environ.get("XDG_CACHE_HOME")
                         or os.path.join(os.path.expanduser("~"), ".cache"), "mslaunch",
                         "host-digest-" + sha256(os.fsencode(root)).hexdigest()[:24])
    try:
        with open(cache, "rb") as f:
            saved = f.read(200).split()
        if len(saved) == 2 and saved[0] == stamp.encode():
            return saved[1].decode()
    except (OSError, UnicodeDecodeError):
        pass
    h = sha256()
    for name, path, _ in named:
        with open(path, "rb") as f:
            data = f.read()
        h.update(b"%s\0%d\0" % (name.encode("utf-8", "surrogateescape"), len(data)))
        h.update(data)
    digest = h.hexdigest()
    # (This runs on the host before any module of the package: no helper of its.)
    tmp = "%s.%s.%d" % (cache, os.uname().nodename[:64], os.getpid())
    try:
        folder = os.path.dirname(cache)
        os.makedirs(folder, mode=0o700, exist_ok=True)
        # Digests of copies not hashed for a day go (a temporary environment's).
        import time
        for old in os.listdir(folder):
            if old.startswith("host-digest-") and "." not in old and \
                    os.stat(os.path.join(folder, old)).st_mtime < time.time() - 86400:
                os.unlink(os.path.join(folder, old))
        with open(tmp, "wb") as f:
            f.write(("%s %s\n" % (stamp, digest)).encode())
        os.replace(tmp, cache)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
    return digest


def _editable_dirs(finder):
    """The folder holding ``mslaunch`` in a setuptools editable finder's
    ``MAPPING = {'name': 'path', ...}`` line (a path with a backslash in its
    repr is not looked for: such a host is sent the package)."""
    try:
        with open(finder, "rb") as f:
            lines = f.read(65536).decode("utf-8", "replace").splitlines()
    except OSError:
        return
    for line in lines:
        if line.startswith("MAPPING") and "=" in line:
            for q in "'\"":
                key = "'mslaunch': " + q      # the value's quote is repr's choice
                if key in line:
                    value = line.split(key, 1)[1]
                    end = value.find(q)
                    if end > 0 and "\\" not in value[:end]:
                        yield os.path.dirname(value[:end])
            return


_G = []      # the host's guard, begun by an agent that then did not import


def _host_package():
    if _W is None:
        return None, "not looked for (MSLAUNCH_HOST_PACKAGE=0)"
    dirs = [p for p in sys.path if p]
    try:
        import site
        prefixes = [sys.prefix]
        if _V is not None:
            with open(os.path.join(_V, "pyvenv.cfg"), "rb") as f:
                if b"include-system-site-packages = true" in f.read().lower():
                    prefixes.append(sys.base_prefix)
        if prefixes[0] == sys.base_prefix and os.getuid() == os.geteuid():
            dirs.append(site.getusersitepackages())
        sites = site.getsitepackages(prefixes)
        dirs += sites
    except Exception:
        sites = []

    def _pth_dirs():
        # plain directory lines of .pth files (an editable install), and the
        # MAPPING of setuptools' editable finders (`pip install -e` since
        # setuptools 64), read as text: no code of theirs is run
        for d in sites:
            for name in sorted(os.listdir(d)) if os.path.isdir(d) else ():
                if name.endswith(".pth"):
                    with open(os.path.join(d, name), "rb") as f:
                        for line in f.read().splitlines():
                            if line.startswith(b"import __editable__") and b"_finder" in line:
                                module = line.split()[1].split(b";")[0].decode("ascii", "replace")
                                yield from _editable_dirs(os.path.join(d, module + ".py"))
                            elif line.strip() and not line.startswith((b"#", b"import")):
                                yield os.path.join(d, line.strip().decode("utf-8", "replace"))

    def _found(candidates):
        for top in candidates:
            root = os.path.join(top, "mslaunch")
            if os.path.isfile(os.path.join(root, "__init__.py")):
                return top, root
        return None

    try:
        hit = _found(dirs) or _found(_pth_dirs())
    except OSError:
        hit = None
    if hit is None:
        return None, "no mslaunch on the host's Python path"
    top, root = hit
    try:
        with open(os.path.join(root, "__init__.py"), "rb") as f:
            text = f.read().decode("utf-8", "replace")
        version = text.split("__version__ = ", 1)[1].split()[0].strip("'\"") \
            if "__version__ = " in text else "?"
        if version != _W[0]:
            return None, "the host's mslaunch %s at %s is not the launcher's %s" % (
                version, root, _W[0])
        if _digest(top, root) != _W[1]:
            return None, "the host's mslaunch %s at %s differs from the launcher's" % (
                version, root)
    except (OSError, ValueError) as err:
        return None, "the host's mslaunch at %s cannot be read (%s)" % (root, err)
    finder = sys.modules["_frozen_importlib_external"].PathFinder

    class _FromHost:
        @staticmethod
        def find_spec(name, path=None, target=None):
            return finder.find_spec(name, [top]) if name == "mslaunch" else None

    sys.meta_path.insert(0, _FromHost)
    try:
        from mslaunch.agent.agentmain import begin
        return begin(_J, _G), root
    except Exception as err:
        sys.meta_path.remove(_FromHost)
        for name in [m for m in sys.modules if m.split(".")[0] == "mslaunch"]:
            del sys.modules[name]
        return None, "the host's mslaunch at %s does not import (%s: %s)" % (
            root, type(err).__name__, str(err)[:100])


_main, _why = _host_package()
os.write(1, ("%s%s %s\n" % ("\0mslaunch-package ", "host" if _main else "need",
                            _why.replace("\n", " "))).encode("utf-8", "replace"))
if _main is not None:
    sys.exit(_main(_J))
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
    def get_data(path):
        try:
            return zlib.decompress(_sources[path.split("/", 1)[1]])
        except (KeyError, IndexError):
            raise OSError("not in the bundle: %s" % path)

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
from mslaunch.agent.agentmain import begin
sys.exit(begin(_J, _G)(_J))
'''

#: What the bootstrap writes before its one-line answer.
MARK = b"\0mslaunch-package "

#: The name of the job the agents are greeted for (its kvsname), given by the
#: starter's ``prepare``: an agent's guard takes it before the job arrives.
_job_name = ""


def name_job(job: str) -> None:
    """Name the job ``job`` in every greeting from now on (see :data:`_job_name`)."""
    global _job_name
    _job_name = job


def prepare_in_background(after: Optional[Callable[[], None]] = None, *,
                          credentials: bool = True, job: str = "",
                          compiled: bool = False) -> None:
    """Read or build the bundle, then (with ``credentials``) make the launcher's
    TLS credentials for the agents' output connections, in a thread, while
    hosts connect; with ``compiled``, compile the bootstrap for agents that
    dial back (see :func:`bootstrap_code`).

    The credentials wait for ``after`` (paramiko's import): made at the same
    time, their own imports would hold up paramiko's, which every host
    waits for, while they are needed only once the agents run.  ``job`` names
    the job in every greeting from now on (see :data:`_job_name`)."""
    name_job(job)

    def prepare() -> None:
        bundle_digest()
        if compiled:
            bootstrap_code()
        from ...wire import dialback
        if credentials and dialback.direct_output() and dialback.output_tls():
            if after is not None:
                after()
            try:
                dialback.tls_credentials()
            except Exception:       # said by the Listener that asks for them
                pass

    import threading
    thread = threading.Thread(target=prepare, name="agent-bundle", daemon=True)
    _preparing[:] = [thread]
    finish_before_exit(thread)


_preparing: List[threading.Thread] = []


def prepared() -> None:
    """Wait for what :func:`prepare_in_background` began; the bundle's digest, ready
    (the bundle itself is read when a host asks for it)."""
    for thread in _preparing:
        thread.join()
    bundle_digest()


_code: List[bytes] = []


def bootstrap_code() -> bytes:
    """:data:`BOOTSTRAP` compiled by this interpreter, marshalled (from the cache,
    where the first launcher of an installation keeps it).

    An agent that dials back says its interpreter's bytecode version; one of
    the launcher's is sent this rather than the source, whose compiling was
    a seventh of the agent's start (3 ms of a host's CPU)."""
    if not _code:
        _code.append(cached_code("bootstrap", BOOTSTRAP))
    return _code[0]


#: What a dialled-back agent of the launcher's bytecode version is sent first,
#: after the bootstrap's variables: it reads and runs the compiled bootstrap.
_RUN_CODE = "import marshal\nexec(marshal.loads(b.read(int(b.readline()))))\n"


def finish_before_exit(thread: threading.Thread) -> None:
    """Start ``thread``, and wait for it (a few seconds at most) when the
    interpreter exits: a daemon thread stopped inside ``cryptography``'s Rust
    code (its import, a key being made) aborts the process, which would turn
    an early error's exit status into 134."""
    import atexit
    thread.start()
    atexit.register(thread.join, 5.0)


class Handshake:
    """The launcher's side of an agent's start, whatever carries the bytes.

    :meth:`take` gives what to send (the bootstrap first; the package bundle
    if the agent asks for it), :meth:`take_parts` the same in pieces (the
    bundle is then the one object all hosts share: at many hosts, a copy per
    host was most of the launcher's memory); :meth:`feed` reads what the agent says: the
    bootstrap's answer, then the link's ``HELLO``.  ``package`` says which
    way the agent started, in words; ``sent`` counts the bytes given out.
    """

    def __init__(self, reuse: Optional[bool] = None, name: str = "",
                 magic: bytes = b"") -> None:
        from ...core.switches import switch
        from ... import __version__
        from ...wire.link import Reader
        digest = bundle_digest()
        self.reuse = switch("MSLAUNCH_HOST_PACKAGE") if reuse is None else reuse
        want = (__version__, digest) if self.reuse else None
        head = f"_W = {want!r}\n_J = {_job_name!r}\n"
        if magic and magic == interpreter_magic():
            code = bootstrap_code()
            source = (head + _RUN_CODE).encode()
            self._out: List[bytes] = [b"%d\n%s" % (len(source), source),
                                      b"%d\n" % len(code), code]
        else:
            source = (head + BOOTSTRAP).encode()
            self._out = [b"%d\n%s" % (len(source), source)]
        if not self.reuse:           # asked for anyway: sent at once
            self._out.append(framed_bundle())
        self.sent = 0
        self.package = ""
        self.reader = Reader(expect_sync=True)
        self._answer = b""
        self.name = name

    def take(self) -> bytes:
        """What is to be sent to the agent now (b"" for nothing)."""
        return b"".join(self.take_parts())

    def take_parts(self) -> List[bytes]:
        """What is to be sent to the agent now, as pieces to send back to back."""
        out, self._out = self._out, []
        self.sent += sum(len(part) for part in out)
        return out

    def feed(self, data: bytes) -> Optional[Tuple[Dict[str, object], bytes]]:
        """Bytes from the agent; its ``HELLO`` (with ``package`` added) and the bytes
        after it once it came, else None.  LinkError for what breaks the protocol."""
        from ...wire import link
        from ...machine import timeline
        if not self.package:
            self._answer += data
            at = self._answer.find(MARK)
            end = self._answer.find(b"\n", at) if at >= 0 else -1
            if end < 0:
                if at < 0 and link.SYNC in self._answer:
                    raise link.LinkError("the agent started without answering the bootstrap")
                if len(self._answer) > link.MAX_PREAMBLE + 1024:
                    raise link.LinkError("no agent answered (the remote side printed "
                                         f"{len(self._answer)} bytes but no bootstrap answer)")
                return None
            words = self._answer[at + len(MARK):end].decode("utf-8", "replace")
            how, _, why = words.partition(" ")
            data, self._answer = self._answer[end + 1:], b""
            timeline.mark("agent answered: " + ("started from the host's package" if how ==
                                                "host" else "asked for the package"), self.name)
            if how == "host":
                self.package = (f"started from the host's mslaunch at {why} "
                                f"({self.sent} bytes sent)")
            else:
                if self.reuse:
                    self._out.append(framed_bundle())
                left = sum(len(part) for part in self._out)
                self.package = (f"package sent ({(self.sent + left) // 1024} KiB): "
                                f"{why or 'asked for'}")
        frames = self.reader.feed(data)
        if not frames:
            return None
        hello, rest = link.hello(frames, self.reader)
        hello["package"] = self.package
        timeline.mark("agent said hello", self.name)
        return hello, rest


def payload() -> bytes:
    """The bootstrap and the bundle at once, for an agent that does not look at its
    host's own package."""
    return Handshake(reuse=False).take()


def shell_quote(word: str) -> str:
    """``word`` in single quotes, for any POSIX shell (and csh, fish)."""
    return "'" + word.replace("'", "'\"'\"'") + "'"


def interpreter_script(program: str) -> str:
    """A ``/bin/sh`` script that runs ``program`` (a one-line Python program) with the
    first of its arguments that names an interpreter, or says that none does."""
    return ('for p in "$@"; do if command -v "$p" >/dev/null 2>&1; then exec "$p" -S -c "'
            + program + '"; fi; done; echo "mslaunch: no Python interpreter found on '
            '$(hostname) (tried: $*); use --remote-python PATH" >&2; exit 127')


def agent_argv(program: str, pythons: Sequence[str], wrapper: Sequence[str] = ()) -> List[str]:
    """The command that runs ``program`` with the first of ``pythons`` found on the
    host, inside ``wrapper`` (Open MPI's launch agent ``WRAPPER... orted``, a
    container's runner, say) if given."""
    return [*wrapper, "/bin/sh", "-c", interpreter_script(program), "mslaunch-agent", *pythons]


def remote_command(pythons: Sequence[str], wrapper: Sequence[str] = ()) -> str:
    """The command line run on every remote host (see the module docstring)."""
    return "exec " + " ".join(shell_quote(w) for w in agent_argv(_TINY, pythons, wrapper))
