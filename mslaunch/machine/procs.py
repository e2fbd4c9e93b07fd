"""Processes of this machine: finding them in /proc and stopping them.

What the orphan guard (:mod:`.guard`) stands on: processes are found by
the guard's marker in their initial environment, as children or
descendants of others, or by process group, and told apart from a later
process with the same pid by their start time; :func:`terminate` stops
all of a job's processes and what they started.  Also the files a process
keeps in this user's private directory (:func:`private_dir`: a job's
control socket, its ranks' stack dumps), removed when it ends, by its guard
if it dies, or by the next launch if both died.
"""

from __future__ import annotations

import os
from ..core import signal
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Dict, Iterable, List, Optional, Protocol, Set, Tuple, TypeVar

    T = TypeVar("T")

    class Cgroup(Protocol):
        """What :func:`terminate` needs of the job's cgroup (the guard's ``JobCgroup``)."""

        def pids(self) -> Set[int]: ...

        def kill(self) -> None: ...

        def remove(self, wait: float = 0.0) -> None: ...

#: The environment variable that ties a rank to the guard that watches it.
MARKER_VARIABLE = "MSLAUNCH_GUARD"


# ---------------------------------------------------------------------------
# finding processes

def marked_pids(marker: str) -> Set[int]:
    """Pids of this user's processes whose initial environment holds
    ``MSLAUNCH_GUARD=marker`` (the marker is no secret: another user's process
    that carries it is not the job's)."""
    needle = f"{MARKER_VARIABLE}={marker}\0".encode()
    found = set()
    me, uid = os.getpid(), os.geteuid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            if os.stat(f"/proc/{entry}").st_uid != uid:
                continue
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        if env.startswith(needle) or b"\0" + needle in env:
            found.add(int(entry))
    return found


def children_of(pid: int) -> List[int]:
    """The children of ``pid`` (all its threads'), from /proc."""
    found: List[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                found.extend(int(p) for p in f.read().split())
        except (OSError, ValueError):
            pass
    return found


def start_time(pid: int) -> Optional[int]:
    """The start time of ``pid`` in clock ticks (tells a pid from a reused one)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _process_table() -> Dict[int, Tuple[int, int, bytes]]:
    """pid -> (parent pid, process group, state) of every process, from /proc."""
    table: Dict[int, Tuple[int, int, bytes]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            table[int(entry)] = (int(fields[1]), int(fields[2]), fields[0])
        except (OSError, IndexError, ValueError):
            continue
    return table


def descendants(roots: Iterable[int], table=None) -> Set[int]:
    """Every process below ``roots`` (one snapshot of /proc)."""
    table = _process_table() if table is None else table
    kids: Dict[int, List[int]] = {}
    for pid, (ppid, _, _) in table.items():
        kids.setdefault(ppid, []).append(pid)
    found: Set[int] = set()
    todo = list(roots)
    while todo:
        for child in kids.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


#: The Linux task flag of a process that is exiting (``/proc/PID/stat`` field 9).
_PF_EXITING = 0x4


def exiting(pid: Optional[int]) -> bool:
    """Whether process ``pid`` is exiting or gone (its connection closed as it died)."""
    if not pid:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return True
    return fields[0] in (b"Z", b"X") or bool(int(fields[6]) & _PF_EXITING)


def exists(pid: int) -> bool:
    """True while ``pid`` names a process (a zombie too)."""
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except OSError:
        return True


def proc_state(pid: int) -> str:
    """The kernel's one-letter state of ``pid`` (R, S, D, T, Z), or "" if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0].decode()
    except (OSError, IndexError):
        return ""


def alive(pid: int) -> bool:
    """True for a live process that is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False


# ---------------------------------------------------------------------------
# stopping processes

def send_signal(pid: int, sig: int) -> bool:
    """Send ``sig`` to ``pid``; False if it could not be (gone, or not ours)."""
    try:
        os.kill(pid, sig)
        return True
    except OSError:
        return False


def _signal_all(groups: Iterable[int], pids: Iterable[int], sig: int) -> bool:
    """Send ``sig`` to groups and pids; return True if any still existed."""
    alive = False
    for pgid in groups:
        try:
            os.killpg(pgid, sig)
            alive = True
        except OSError:
            pass
    for pid in pids:
        alive = send_signal(pid, sig) or alive
    return alive


def wait_gone(pid: int, limit: float) -> None:
    """Wait (at most ``limit`` seconds) until process ``pid`` has exited."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        fd = -1
    if fd >= 0:
        import select
        poller = select.poll()          # (select cannot watch a descriptor above 1023)
        poller.register(fd, select.POLLIN)
        poller.poll(max(0, int(limit * 1000)))
        os.close(fd)
        return
    deadline = time.monotonic() + limit
    while exists(pid) and os.getppid() == pid and time.monotonic() < deadline:
        time.sleep(0.005)


def terminate(groups: Iterable[int], marker: str, grace: float,
              cgroup: Optional[Cgroup] = None, pids: Iterable[int] = (),
              spare: Iterable[int] = (),
              stopped: Optional[Callable[[Set[int]], None]] = None) -> None:
    """SIGCONT+SIGTERM everything of the job, SIGKILL after ``grace``.

    Everything: the cgroup's processes, the members of the given groups,
    the given pids, processes carrying the job marker, and all their
    descendants -- but ``spare``.  Zombies do not count as alive.
    ``stopped`` is called with them while they are all stopped (SIGSTOP),
    before the first SIGTERM.
    """
    groups = set(groups)
    known = set(pids)
    spared = set(spare)

    def everyone() -> Set[int]:
        table = _process_table()
        found = known | marked_pids(marker)
        if cgroup is not None:
            found |= cgroup.pids()
        found |= {pid for pid, (_, pgid, _) in table.items() if pgid in groups}
        found |= descendants(found, table)
        me = os.getpid()
        return {p for p in found if p != me and p not in spared and p in table
                and table[p][2] != b"Z"}

    # Stop first (no new forks while the list is taken), then terminate.
    targets = everyone()
    if targets:
        _signal_all((), targets, signal.SIGSTOP)
        targets |= everyone()
        if stopped is not None:
            stopped(targets)
        _signal_all((), targets, signal.SIGTERM)
        _signal_all((), targets, signal.SIGCONT)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            time.sleep(0.05)
            if not everyone():
                break
        else:
            _signal_all((), everyone(), signal.SIGKILL)
    if cgroup is not None:
        inside = cgroup.pids()
        if inside & spared:
            _signal_all((), inside - spared, signal.SIGKILL)   # never the spared
        elif inside:
            cgroup.kill()
        cgroup.remove(wait=2.0)


# ---------------------------------------------------------------------------
# this user's private directory: job control sockets and dump directories

def private_dir() -> Optional[str]:
    """This user's directory for job control sockets: ``$XDG_RUNTIME_DIR/mslaunch``,
    else ``$TMPDIR/mslaunch-UID``, else ``~/.cache/mslaunch/HOST`` (where another
    user cannot have made it first); made 0700, and used only if it is this
    user's, not a link, and open to nobody else (None if none is)."""
    found = private_dirs(make=True)
    return found[0] if found else None


#: Candidates of :func:`private_dir` refused because someone else made them, or
#: made them open to others (said once by the job, see :func:`refused_private`),
#: and those already said.
_REFUSED: List[str] = []
_SAID: Set[str] = set()


def refused_private() -> List[str]:
    """The candidate directories refused since the last call and not told of
    before (a job's restarts look again), each with why (a warning's words)."""
    refused = [why for why in _REFUSED if why not in _SAID]
    _SAID.update(_REFUSED)
    _REFUSED.clear()
    return refused


def private_dirs(make: bool = False) -> List[str]:
    """The candidates of :func:`private_dir` that exist (made first with ``make``)
    and are this user's alone: where the companion commands look for jobs."""
    import stat as _stat
    uid = os.getuid()
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    tmp = os.path.join(os.path.abspath(os.environ.get("TMPDIR", "") or "/tmp"), f"mslaunch-{uid}")
    home = _home_dir()
    found = []
    for base in ([os.path.join(runtime, "mslaunch")] if runtime.startswith("/") else []) \
            + [tmp, home]:
        if not base:
            continue
        above = unsafe_above(base, missing=True)    # (nothing made where it is not safe)
        if above is not None:
            if make:
                _refuse(f"{base} lies in {above}, which another user may rename or replace")
            continue
        try:
            if make:
                if base == home:
                    os.makedirs(os.path.dirname(base), 0o700, exist_ok=True)
                os.mkdir(base, 0o700)
        except FileExistsError:
            pass
        except OSError:
            continue
        try:
            st = os.lstat(base)
        except OSError:
            continue
        above = unsafe_above(base)
        if _stat.S_ISDIR(st.st_mode) and st.st_uid == uid and not st.st_mode & 0o077 \
                and above is None:
            found.append(base)
            if make:
                break
        elif make:
            _refuse(f"{base} is not this user's alone (owner uid {st.st_uid}, mode "
                    f"{_stat.S_IMODE(st.st_mode):04o}{', a link' if _stat.S_ISLNK(st.st_mode) else ''})"
                    if above is None else
                    f"{base} lies in {above}, which another user may rename or replace")
    return found


def _refuse(why: str) -> None:
    if why not in _REFUSED:
        _REFUSED.append(why)


def unsafe_above(path: str, missing: bool = False) -> Optional[str]:
    """The first directory above ``path`` (as written, then as resolved) that a user
    other than this one or root could rename, empty or replace: one of another user's,
    or one others may write into without the sticky bit (a link on the way: one of
    another user's); None if there is none, as under ``/tmp`` or a home directory.
    ``missing``: directories not there yet pass (this user makes them)."""
    import stat as _stat
    uid = os.getuid()
    for written in (path, os.path.realpath(path)):
        above = os.path.dirname(written)
        while True:
            try:
                st = os.lstat(above)
            except FileNotFoundError:
                if not missing:
                    return above
                above = os.path.dirname(above)
                continue
            except OSError:
                return above
            if st.st_uid not in (uid, 0) or not (
                    _stat.S_ISLNK(st.st_mode) or _stat.S_ISDIR(st.st_mode)) or (
                    _stat.S_ISDIR(st.st_mode) and st.st_mode & 0o022
                    and not st.st_mode & _stat.S_ISVTX):
                return above
            if os.path.dirname(above) == above:
                break
            above = os.path.dirname(above)
    return None


def _home_dir() -> str:
    """``~/.cache/mslaunch/HOST``: a home directory may be shared by many hosts, whose
    launchers' pids would meet in one directory; "" when its socket paths would be
    too long for a Unix socket (108 bytes)."""
    home = os.environ.get("HOME", "")
    if not home.startswith("/"):
        return ""
    path = os.path.join(home, ".cache", "mslaunch", os.uname().nodename)
    return path if len(path.encode()) + len("/4194304.sock") < 108 else ""


def in_private(make: Callable[[str], Optional[T]], made_at: Callable[[T], str],
               drop: Callable[[T], None]) -> Optional[T]:
    """``make(directory)`` in this user's private directory, made first; None if it
    cannot be made.  Once ``make`` has made its entry there (at ``made_at(made)``),
    the directory is checked again: removed by another job of this user, empty,
    between the check and the entry, and made at once by another user, it would
    hold the entry for them to rename or replace.  The entry is then dropped
    (``drop(made)``), and the next candidate taken (the other user's directory is
    refused, and said); so too when ``make`` failed there.  Checked once the entry
    is in it, the directory stays this user's: no job removes it while not empty.
    Only then are the leftovers of dead processes swept from it."""
    for _ in range(3):
        base = private_dir()
        if base is None:
            return None
        made = make(base)
        if made is not None and _holds_own(base, made_at(made)):
            sweep_private(base)
            return made
        if made is not None:
            drop(made)
        elif _holds_own(base, None):
            return None           # this user's directory, and make failed in it
    return None


def _holds_own(base: str, entry: Optional[str]) -> bool:
    """Whether ``base`` is a directory of this user's alone, holding ``entry`` (a
    path in it) of this user's; both looked at through one descriptor of it."""
    uid = os.getuid()
    try:
        fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        if not (st.st_uid == uid and not st.st_mode & 0o077):
            return False
        if entry is None:
            return True
        if os.path.dirname(entry) != base:
            return False
        return os.stat(os.path.basename(entry), dir_fd=fd, follow_symlinks=False).st_uid == uid
    except OSError:
        return False
    finally:
        os.close(fd)


def sweep_private(directory: str) -> None:
    """Remove what processes of this host that are gone left in ``directory``:
    ``PID.sock`` and ``HOST.PID.py`` whose guard could not (it was killed too)."""
    host = os.uname().nodename
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        if name.endswith(".sock"):
            pid = name[:-5]
        elif name.startswith(host + ".") and name.endswith(".py"):
            pid = name[len(host) + 1:-3]
        else:
            continue
        path = os.path.join(directory, name)
        if 0 < len(pid) <= 7 and pid.isascii() and pid.isdigit() and not exists(int(pid)) \
                and not _listening(path):
            remove_private(path)


def _listening(path: str) -> bool:
    """Whether someone accepts on the Unix socket ``path`` (a launcher of another
    PID namespace sharing this directory, say)."""
    if not path.endswith(".sock"):
        return False
    import errno
    from ..core import socket
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setblocking(False)          # a full queue answers at once (EAGAIN), never blocks
    try:
        return sock.connect_ex(path) in (0, errno.EAGAIN, errno.EINPROGRESS)
    except OSError:
        return False
    finally:
        sock.close()


def remove_private(path: str) -> None:
    """Remove a control socket, or a directory of dumps with what it holds, quietly:
    only from a directory of this user's alone, opened without following a link, and
    named in it (see :func:`~.trees.remove_entry`); then this user's private
    directory itself when that left it empty (no job of this user leaves it
    behind)."""
    from .trees import OPEN_DIR, remove_entry
    parent, name = os.path.split(path)
    try:
        fd = os.open(parent, OPEN_DIR)
    except OSError:
        return
    try:
        st = os.fstat(fd)
        if st.st_uid == os.getuid() and not st.st_mode & 0o077:
            remove_entry(fd, name)
    except OSError:
        pass
    finally:
        os.close(fd)
    if os.path.basename(parent).startswith("mslaunch"):
        try:
            os.rmdir(parent)           # fails, as it should, while not empty
        except OSError:
            pass
