"""Open MPI programs under mslaunch's PMI: noticing singletons, and what they leave.

**No silent singletons: noticing an Open MPI program under mslaunch's PMI.**
mslaunch serves the PMI wire of MPICH-ABI libraries.  An Open MPI program
finds no PMIx server there, starts as a *singleton* -- rank 0 of 1 -- and,
with N ranks, the job becomes N one-rank jobs that all "succeed".  To
notice, every rank of a PMI job gets two of Open MPI's own parameters:
``mpi_show_mca_params=enviro`` and ``mpi_show_mca_params_file=DIR/KEY``
(the probe, :class:`~mslaunch.mpi.early.SingletonProbe`).
Open MPI (4 and 5) then writes that file in ``MPI_Init``, from
``MPI_COMM_WORLD`` rank 0 only, with the world size in its header; MPICH
ignores both.  A file that says "out of a total of 1" from a rank whose
job has more ranks is a singleton, and the job ends with one line saying
to use ``--mpi openmpi``.  (An Open MPI ``mpirun`` started by a rank
writes the file too, with its own job's size: Open MPI 4's says
``ess=pmi`` there and ``ess=singleton`` in a singleton -- whose own
``orted`` is no launcher of a nested job; for Open MPI 5, whose files do
not differ, a rank that runs an Open MPI launcher in its process tree is
not taken for a singleton.)

**What refused singletons leave in /dev/shm.**  Open MPI 5 creates its
shared-memory segment (``sm_segment.<host>.<uid>.<jobid>.<n>``) in
``MPI_Init``, and a singleton has no server to remove it after it: stopped
(or even ending normally) it stays.  When a job is refused, its ranks are
frozen (SIGSTOP) before they are stopped (by the launcher, and by each agent
as the stop reaches it), and the files under /dev/shm that their Open MPI
processes (those mapping ``libopen-pal``) have open or mapped are noted -- only
regular files of this user, created since the process that has them
started -- and noted again while they still run (one that handles SIGTERM,
or was still in ``MPI_Init``, may make its segment after the stop); once the
job is over they are removed if nobody has them open or mapped any more
(:class:`SingletonFiles`).  No name is ever guessed.

**What refused Open MPI 4 singletons leave in /tmp**, their job families'
empty session directories (and their orteds' when those are killed too), is
noted with their /dev/shm files and removed with them (:mod:`.sessiondirs`).
"""

from __future__ import annotations

import os
import time

from ...machine.trees import SHM_DIR

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Dict, Iterable, List, Optional, Sequence, Set, Tuple

    from ...machine.loop import Loop


# -- Open MPI singletons ------------------------------------------------------------


_LAUNCHERS = frozenset(("mpirun", "mpiexec", "orterun", "prterun", "prted", "orted",
                        "ompirun_wrapper", "mpirun.openmpi", "mpiexec.openmpi"))


def runs_a_launcher(pid: int) -> bool:
    """Whether an Open MPI launcher runs in ``pid``'s process tree (a rank that
    starts a job of its own writes the same probe file, from that job's rank 0)."""
    todo: List[int] = [pid]
    seen: Set[int] = set()
    while todo and len(seen) < 10000:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        try:
            with open(f"/proc/{p}/comm", "rb") as f:
                if f.read().strip().decode("ascii", "replace") in _LAUNCHERS:
                    return True
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children", "rb") as f:
                    todo.extend(int(c) for c in f.read().split())
        except (OSError, ValueError):
            continue
    return False



def singleton_message(library: str = "Open MPI", why: str = "", fix: str = "") -> str:
    """The refusal's words; ``why`` mslaunch could not serve the rank PMIx, and ``fix``."""
    if why:
        return (f"started {library} as a singleton (rank 0 of 1): mslaunch could not serve "
                f"it PMIx ({why}), so every rank would run alone; {fix}, or run the job "
                f"with --mpi openmpi")
    return (f"started {library} as a singleton (rank 0 of 1): it found no process manager "
            f"it speaks, so every rank would run alone; run the job with --mpi openmpi")


# -- what refused singletons leave in /dev/shm ----------------------------------------

#: How often the files of stopped singletons that still run are noted again.
RENOTE = 0.1
_STATX_BTIME = 0x800


def _birth(path: str, st: os.stat_result) -> float:
    """When ``path`` was created (statx's birth time), else its change time."""
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        buf = ctypes.create_string_buffer(256)
        # statx(AT_FDCWD, path, AT_SYMLINK_NOFOLLOW, STATX_BTIME, buf)
        if libc.statx(-100, os.fsencode(path), 0x100, _STATX_BTIME, buf) == 0 \
                and int.from_bytes(buf.raw[0:4], "little") & _STATX_BTIME:
            return (int.from_bytes(buf.raw[80:88], "little", signed=True)
                    + int.from_bytes(buf.raw[88:92], "little") / 1e9)
    except (OSError, AttributeError):
        pass
    return st.st_ctime


def _started_at(pid: int) -> Optional[float]:
    """When ``pid`` started, in wall-clock seconds (to a clock tick)."""
    from ...machine.procs import start_time
    ticks = start_time(pid)
    if ticks is None:
        return None
    since_boot = ticks / os.sysconf("SC_CLK_TCK")
    return time.time() - (time.clock_gettime(time.CLOCK_BOOTTIME) - since_boot)


def _holdings(pid: int) -> Tuple[bool, Dict[str, Tuple[int, int]]]:
    """Whether ``pid`` is an Open MPI process, and the /dev/shm files it has mapped
    or open: path -> (device, inode)."""
    held: Dict[str, Tuple[int, int]] = {}
    ompi = False
    try:
        with open(f"/proc/{pid}/maps", "rb") as f:
            for line in f:
                fields = line.split(None, 5)
                if len(fields) < 6:
                    continue
                name = fields[5].rstrip(b"\n").decode("utf-8", "surrogateescape")
                if name.startswith(SHM_DIR + "/"):
                    major, minor = fields[3].split(b":")
                    held[name] = (os.makedev(int(major, 16), int(minor, 16)), int(fields[4]))
                elif "/libopen-pal.so" in name:
                    ompi = True
        for fd in os.listdir(f"/proc/{pid}/fd"):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith(SHM_DIR + "/"):
                st = os.stat(f"/proc/{pid}/fd/{fd}")
                held[target] = (st.st_dev, st.st_ino)
    except (OSError, ValueError):
        pass
    return ompi, held


def runs_open_mpi(pids: Sequence[int]) -> bool:
    """Whether a process among ``pids`` or below them has Open MPI loaded."""
    from ...machine.procs import descendants
    return any(_holdings(pid)[0] for pid in set(pids) | descendants(pids))


def _in_use() -> Set[Tuple[int, int]]:
    """(device, inode) of every /dev/shm file a process visible here has open or mapped."""
    used: Set[Tuple[int, int]] = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            used.update(_holdings(int(entry))[1].values())
    return used


def _signal_groups(groups: Iterable[int], sig: int) -> None:
    for pgid in groups:
        try:
            os.killpg(pgid, sig)
        except OSError:
            pass


def _wait_stopped(groups: Sequence[int], wait: float = 0.5) -> None:
    """Until the leaders of ``groups`` are stopped or gone (SIGSTOP is asynchronous)."""
    pending = list(groups)
    deadline = time.monotonic() + wait
    while pending and time.monotonic() < deadline:
        try:
            with open(f"/proc/{pending[-1]}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            state = b"X"
        if state in (b"T", b"t", b"Z", b"X"):
            pending.pop()
        else:
            time.sleep(0.001)


def kept_item(path: str, ident: Tuple[int, int]) -> str:
    """A noted file as the watchdog keeps it: one line, starting with ``/`` (a
    kvsname never does)."""
    return f"{path}\t{ident[0]}\t{ident[1]}"


def read_kept_item(item: str) -> Optional[Tuple[str, Tuple[int, int]]]:
    """``(path, (device, inode))`` of a :func:`kept_item`, or None if it is not one."""
    path, _, ident = item.partition("\t")
    dev, _, ino = ident.partition("\t")
    if os.path.dirname(path) != SHM_DIR or not (dev.isascii() and dev.isdigit()
                                                and ino.isascii() and ino.isdigit()):
        return None
    return path, (int(dev), int(ino))


#: How a noted session directory is kept by the watchdog (a file's item has digits there).
_SESSION_ITEM = "\tsession"


def session_items(pids: Iterable[int]) -> List[str]:
    """The Open MPI session directories of processes ``pids`` (see
    :mod:`.sessiondirs`), in the form :meth:`SingletonFiles.restore` takes back."""
    from .sessiondirs import sessions_of
    found = {session for pid in pids for session in sessions_of(pid)}
    return [session + _SESSION_ITEM for session in sorted(found)]


class SingletonFiles:
    """The /dev/shm files of refused Open MPI singletons; see the module docstring.

    ``keep`` (the guard's :meth:`~mslaunch.machine.guard.Watchdog.keep`) is
    told every file, so that the watchdog removes them should the launcher die.
    """

    def __init__(self, keep: Optional[Callable[[str], None]] = None,
                 flush: Optional[Callable[[], None]] = None) -> None:
        self.keep = keep
        self.flush = flush
        self.files: Dict[str, Tuple[int, int]] = {}   # path -> (device, inode)
        self.watched: Set[int] = set()                # stopped groups' leaders still alive
        self.sessions: Set[str] = set()               # Open MPI 4's (see .sessiondirs)
        self.tops: Set[str] = set()                   # the ranks' ompi.<host>.<uid>
        self.since: Optional[float] = None            # when the first stopped rank started

    def stop(self, groups: Sequence[int], loop: Optional[Loop] = None) -> None:
        """Stop the rank process groups ``groups`` with SIGTERM (as the job's stop
        that follows would), noting first, while they are frozen (SIGSTOP, so that
        no rank still in ``MPI_Init`` makes a file unseen), what their Open MPI
        processes created in /dev/shm.  With ``loop``, what they make later is
        noted too, every :data:`RENOTE` seconds until they are gone: a rank that
        handles SIGTERM goes on, and one that was in ``MPI_Init`` makes its
        segment only after the stop (its handler, if in Python, waits for
        ``MPI_Init`` to return)."""
        from ...core import signal
        from .sessiondirs import top_session_of
        _signal_groups(groups, signal.SIGSTOP)
        _wait_stopped(groups)
        try:
            self.tops.update(filter(None, map(top_session_of, groups)))
            starts = [t for t in map(_started_at, groups) if t is not None]
            if starts:
                self.since = min(starts + ([self.since] if self.since is not None else []))
            self._note(groups)
        finally:
            # SIGTERM waits while they are stopped, and is their first act after SIGCONT.
            _signal_groups(groups, signal.SIGTERM)
            _signal_groups(groups, signal.SIGCONT)
            if self.flush is not None:
                self.flush()
        if loop is not None:
            if not self.watched:
                loop.call_later(RENOTE, lambda: self._renote(loop))
            self.watched.update(groups)

    def follow(self, groups: Sequence[int], deadline: float) -> None:
        """As :meth:`stop` with a loop, without one: note again every
        :data:`RENOTE` seconds until the leaders of ``groups`` are gone or it is
        ``deadline`` (a node's step of ``--launcher srun``, which has no loop)."""
        from ...machine.procs import alive
        left = [pid for pid in groups if alive(pid)]
        while left and time.monotonic() < deadline:
            time.sleep(RENOTE)
            left = [pid for pid in left if alive(pid)]
            self._note(left)

    def _renote(self, loop: Loop) -> None:
        from ...machine.procs import alive
        self.watched = {pid for pid in self.watched if alive(pid)}
        if self.watched:
            before = len(self.files), len(self.sessions)
            self._note(sorted(self.watched))
            if (len(self.files), len(self.sessions)) != before and self.flush is not None:
                self.flush()
            loop.call_later(RENOTE, lambda: self._renote(loop))

    def _note(self, pids: Sequence[int]) -> None:
        import stat
        from ...machine.procs import descendants
        from .sessiondirs import sessions_of
        me = os.geteuid()
        for pid in sorted(set(pids) | descendants(pids)):
            ompi, held = _holdings(pid)
            for session in sessions_of(pid) if ompi else ():
                if session not in self.sessions:
                    self.sessions.add(session)
                    if self.keep is not None:
                        self.keep(session + _SESSION_ITEM)
            started = _started_at(pid) if ompi and held else None
            if started is None:
                continue
            for path, ident in held.items():
                try:
                    st = os.lstat(path)
                except OSError:
                    continue
                if os.path.dirname(path) != SHM_DIR or not stat.S_ISREG(st.st_mode) \
                        or (st.st_dev, st.st_ino) != ident or st.st_uid != me \
                        or not path.isprintable() or path in self.files \
                        or _birth(path, st) < started - 0.02:
                    continue
                self.files[path] = (st.st_dev, st.st_ino)
                if self.keep is not None:
                    self.keep(kept_item(path, (st.st_dev, st.st_ino)))

    def restore(self, item: str) -> None:
        """Take back a file from its ``keep`` form (:func:`kept_item`)."""
        if item.endswith(_SESSION_ITEM):
            self.sessions.add(item[:-len(_SESSION_ITEM)])
            return
        found = read_kept_item(item)
        if found is not None:
            self.files[found[0]] = found[1]

    def remove(self) -> int:
        """Unlink the noted files that are still the same and nobody has open or mapped;
        remove the noted session directories that are empty."""
        from .sessiondirs import remove_session
        deadline = time.monotonic() + 1.0        # for the orteds to end, all together
        for path in sorted(self.sessions):       # jf.* before pid.*: the parent goes last
            remove_session(path, deadline)
        self.sessions.clear()
        # A rank stopped before its session directory's name could be read (made,
        # but no segment that names it mapped yet): what is empty in the ranks'
        # ompi.<host>.<uid> and changed since they started, then that top, as their
        # own MPI_Finalize would have removed them.  (An Open MPI job of this user
        # started meanwhile in the same TMPDIR may lose an empty session directory
        # it has not used yet.)
        from .sessiondirs import remove_empty_since
        for path in sorted(self.tops):
            remove_empty_since(path, self.since)
        self.tops.clear()
        if not self.files:
            return 0
        used = _in_use()
        removed = 0
        for path, ident in self.files.items():
            try:
                st = os.lstat(path)
                if (st.st_dev, st.st_ino) == ident and ident not in used:
                    os.unlink(path)
                    removed += 1
            except OSError:
                pass
        self.files.clear()
        return removed
