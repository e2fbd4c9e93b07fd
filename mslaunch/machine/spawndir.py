"""Starting a process in a working directory other than the launcher's.

The launcher's working directory is shared by all of its threads (an SSH
connection's, a reaper's, a host's start-up), so it is never changed, not
even for the instant of a spawn: the child changes directory itself, before
its program runs.

``os.posix_spawn`` has no action for that; the C library's ``posix_spawn``
has one (``posix_spawn_file_actions_addchdir_np``: glibc 2.29 and later,
musl 1.1.24 and later), which this module calls through ctypes.  ctypes
costs some milliseconds to import, so this module is imported only when a
rank's directory is not the launcher's.  Everything else is done as
``os.posix_spawn`` does it for :mod:`.spawn`: the descriptors duplicated
onto the child's, a session or a process group of its own, the signals set
back to their default actions, exactly the given environment.

Where the C library lacks the action (an older glibc, as on RHEL 8), the
child is forked: it sets itself up as above, changes directory and execs,
and tells the launcher through a close-on-exec pipe which step failed.
"""

from __future__ import annotations

import os
import sys

from ..core import signal

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

# posix_spawnattr_setflags' flags: the same numbers in glibc and musl.
_SETPGROUP, _SETSIGDEF, _SETSID = 0x02, 0x04, 0x80
# Room for a posix_spawnattr_t, a posix_spawn_file_actions_t or a sigset_t
# (336, 80 and 128 bytes in glibc and musl on 64 bits), 8-byte aligned.
_WORDS = 128

_STEP_CHDIR, _STEP_OTHER = b"d", b"x"     # what a forked child reports as failing


def spawn_in(cwd: str, path: str, argv: Sequence[str], env: Mapping[str, str], *,
             dup2s: Sequence[Tuple[int, int]], session: bool,
             sigdef: Sequence[int]) -> int:
    """``os.posix_spawn(path, argv, env)`` with the child in ``cwd``: its pid.

    ``dup2s`` are ``(fd, target)`` pairs duplicated in order; the child leads
    a new session (``session``) or a new process group; the signals
    ``sigdef`` get their default actions.  An OSError names ``cwd`` when the
    child could not enter it (the forked way; the C library's way cannot tell
    that from a failed exec, and names ``path``)."""
    if "\0" in cwd:
        raise ValueError("embedded null byte")
    words = _checked(path, argv, env)
    libc = _libc()
    if libc is not None:
        # Said as os.posix_spawn says it: the audit hooks see every start (.cgroups).
        sys.audit("os.posix_spawn", path, argv, env)
        return libc.spawn(cwd, words, len(argv), path, dup2s, session, sigdef)
    return _fork_exec(cwd, path, argv, env, dup2s, session, sigdef)


def _checked(path: str, argv: Sequence[str], env: Mapping[str, str]) -> str:
    """The path, argv and ``NAME=value`` environment joined by NULs, refused as
    ``os.posix_spawn`` refuses them (ValueError) before anything starts."""
    if not argv:
        raise ValueError("argv must contain at least one element")
    # A name is empty or has "=" after its first character (a check of all
    # names at once, which is a rank's start cost: C loops, not Python's).
    names = "\0" + "\0".join(env) + "\0"
    if env and ("\0\0" in names or "=" in names.replace("\0=", "\0")):
        raise ValueError("illegal environment variable name")
    words = [path, *argv, *map("=".join, env.items())]
    joined = "\0".join(words)
    if joined.count("\0") != len(words) - 1:
        raise ValueError("embedded null byte")
    return joined


class _Libc:
    """The C library's ``posix_spawn`` and what builds its arguments, bound once."""

    def __init__(self) -> None:
        import ctypes
        import struct
        from itertools import accumulate
        self.ctypes, self.struct, self.accumulate = ctypes, struct, accumulate
        # PyDLL: the calls keep the GIL, as os.posix_spawn does (they are short,
        # and another thread taking the GIL between them would only delay the spawn).
        c = ctypes.PyDLL(None)
        ptr, num = ctypes.c_void_p, ctypes.c_int
        # The action whose absence means "not this library" comes first.
        self.addchdir = _bind(c.posix_spawn_file_actions_addchdir_np, ptr, ctypes.c_char_p)
        self.actions_init = _bind(c.posix_spawn_file_actions_init, ptr)
        self.actions_destroy = _bind(c.posix_spawn_file_actions_destroy, ptr)
        self.adddup2 = _bind(c.posix_spawn_file_actions_adddup2, ptr, num, num)
        self.attr_init = _bind(c.posix_spawnattr_init, ptr)
        self.setflags = _bind(c.posix_spawnattr_setflags, ptr, ctypes.c_short)
        self.setpgroup = _bind(c.posix_spawnattr_setpgroup, ptr, num)
        self.setsigdefault = _bind(c.posix_spawnattr_setsigdefault, ptr, ptr)
        self.sigemptyset = _bind(c.sigemptyset, ptr)
        self.sigaddset = _bind(c.sigaddset, ptr, num)
        self.posix_spawn = _bind(c.posix_spawn, ptr, ptr, ptr, ptr, ptr, ptr)
        # The attributes of a spawn, by (session, sigdef): the same for every rank.
        self.attrs: Dict[Tuple[bool, Tuple[int, ...]], Any] = {}

    def attributes(self, session: bool, sigdef: Sequence[int]) -> Any:
        """A posix_spawnattr_t as os.posix_spawn makes it (kept: spawns only read it)."""
        key = (session, tuple(sigdef))
        attr = self.attrs.get(key)
        if attr is None:
            attr, sigs = (self.ctypes.c_uint64 * _WORDS)(), (self.ctypes.c_uint64 * _WORDS)()
            _check(self.attr_init(attr))
            self.sigemptyset(sigs)
            for sig in sigdef:
                if self.sigaddset(sigs, sig):
                    raise OSError(22, os.strerror(22))      # EINVAL: no such signal
            _check(self.setsigdefault(attr, sigs))
            if not session:
                _check(self.setpgroup(attr, 0))
            _check(self.setflags(attr, _SETSIGDEF | (_SETSID if session else _SETPGROUP)))
            self.attrs[key] = attr
        return attr

    def spawn(self, cwd: str, words: str, count: int, path: str,
              dup2s: Sequence[Tuple[int, int]], session: bool, sigdef: Sequence[int]) -> int:
        """posix_spawn with a chdir action before the dup2s: the pid, or OSError.
        ``words``: the program, its ``count`` arguments and the environment."""
        ct = self.ctypes
        attr = self.attributes(session, sigdef)
        # One buffer holds every string (NUL-terminated); the argv and envp
        # arrays point into it.
        blob = words.encode(sys.getfilesystemencoding(), sys.getfilesystemencodeerrors())
        blob += b"\0"
        base = ct.cast(blob, ct.c_void_p).value or 0
        starts = list(self.accumulate((len(w) + 1 for w in blob.split(b"\0")[:-2]),
                                      initial=base))
        argv = self.struct.pack(f"{count + 1}P", *starts[1:count + 1], 0)
        envp = self.struct.pack(f"{len(starts) - count}P", *starts[count + 1:], 0)
        actions, pid = (ct.c_uint64 * _WORDS)(), ct.c_int()
        _check(self.actions_init(actions))
        try:
            _check(self.addchdir(actions, os.fsencode(cwd)))
            for fd, target in dup2s:
                _check(self.adddup2(actions, fd, target))
            err = self.posix_spawn(ct.byref(pid), starts[0], actions, attr, argv, envp)
        finally:
            self.actions_destroy(actions)
        if err:
            raise OSError(err, os.strerror(err), path)
        return pid.value


def _bind(function: Any, *argtypes: Any) -> Any:
    function.argtypes = argtypes        # each returns an int (restype's default)
    return function


def _check(err: int) -> None:
    if err:
        raise OSError(err, os.strerror(err))


_loaded: List[Optional[_Libc]] = []     # [the bound library, or None: it lacks the action]


def _libc() -> Optional[_Libc]:
    """The C library's posix_spawn with its chdir action; None where there is none
    (another C library, another system: the flags above are Linux's)."""
    if not _loaded:
        libc: Optional[_Libc] = None
        if sys.platform.startswith("linux"):
            try:
                libc = _Libc()
            except (ImportError, OSError, AttributeError):
                pass
        _loaded.append(libc)
    return _loaded[0]


def _fork_exec(cwd: str, path: str, argv: Sequence[str], env: Mapping[str, str],
               dup2s: Sequence[Tuple[int, int]], session: bool, sigdef: Sequence[int]) -> int:
    """Fork a child that sets itself up as posix_spawn would, enters ``cwd`` and
    execs; its pid once it has exec'd, or the OSError of the step that failed."""
    import gc
    report_r, report_w = os.pipe()      # both close-on-exec
    # Signals wait until the child has its own actions: a handler of the
    # launcher's must not run in it (it would write to the launcher's wake-up pipe).
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
    try:
        pid = os.fork()
        if pid == 0:
            gc.disable()    # no collection runs a finalizer of the launcher's objects here
            _child(report_w, mask, cwd, (path, list(argv), env), dup2s, session, sigdef)
    except BaseException:
        os.close(report_r)
        raise
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        os.close(report_w)
    try:
        report = os.read(report_r, 64)    # nothing: the exec closed the pipe
    finally:
        os.close(report_r)
    if not report:
        return pid
    os.waitpid(pid, 0)
    err = int(report[1:])
    raise OSError(err, os.strerror(err), cwd if report[:1] == _STEP_CHDIR else path)


def _child(report: int, mask: Any, cwd: str, program: Tuple[str, List[str], Mapping[str, str]],
           dup2s: Sequence[Tuple[int, int]], session: bool, sigdef: Sequence[int]) -> None:
    """The forked child's part: it never returns."""
    step = _STEP_OTHER
    try:
        for sig in signal.valid_signals():
            if sig in sigdef or callable(signal.getsignal(sig)):
                signal.signal(sig, signal.SIG_DFL)
        if session:
            os.setsid()
        else:
            os.setpgid(0, 0)
        step = _STEP_CHDIR
        os.chdir(cwd)
        step = _STEP_OTHER
        for fd, target in dup2s:
            if fd == target:
                os.set_inheritable(fd, True)
            else:
                os.dup2(fd, target)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        os.execve(*program)
    except BaseException as err:
        code = getattr(err, "errno", None) or 22          # EINVAL: not an OSError
        try:
            os.write(report, step + str(code).encode())
        finally:
            os._exit(127)
    os._exit(127)
