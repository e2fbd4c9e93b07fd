"""Open MPI programs under mslaunch's PMI: noticing singletons, and what they leave.

**No silent singletons: noticing an Open MPI program under mslaunch's PMI.**
mslaunch serves the PMI wire of MPICH-ABI libraries.  An Open MPI program
finds no PMIx server there, starts as a *singleton* -- rank 0 of 1 -- and,
with N ranks, the job becomes N one-rank jobs that all "succeed".  To
notice, every rank of a PMI job gets two of Open MPI's own parameters:
``mpi_show_mca_params=enviro`` and ``mpi_show_mca_params_file=DIR/KEY``.
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

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

    from ...machine.loop import Loop
    from ...core.spec import RankSpec


# -- Open MPI singletons ------------------------------------------------------------

_TOTAL = b"out of a total of "


def _world_size(head: bytes) -> Optional[int]:
    at = head.find(_TOTAL)
    if at < 0:
        return None
    digits = head[at + len(_TOTAL):].split(b")", 1)[0]
    return int(digits) if digits.isdigit() else None


def _read_regular(path: str) -> Optional[bytes]:
    """The start of a regular file, without ever blocking (a rank could put a FIFO
    or a device where Open MPI writes)."""
    import stat
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)


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


def marked_name(kind: str, marker: str) -> str:
    """A new name for a directory of the launcher or agent whose guard has
    ``marker``: ``mslaunch-KIND-MARKER-TOKEN``.  The marker says whose it is
    (:func:`~mslaunch.mpi.pmi.files.sweep_leftovers` reads its pid) and is no
    secret: it names the job's cgroup, which every user may list, before any
    of these is made.  The token (48 random bits, never shown) keeps another
    user from making the directory first, which would end the job or have
    it use theirs."""
    return f"mslaunch-{kind}-{marker[:120]}-{os.urandom(6).hex()}"


def probe_path(marker: str) -> str:
    """A new probe directory's path, for the launcher or agent whose guard has ``marker``."""
    # Not tempfile: its import costs more than a small job's whole launch.
    return os.path.join(os.environ.get("TMPDIR") or "/tmp", marked_name("ompi", marker))


def backing_path(marker: str) -> str:
    """A new /dev/shm directory's path for the ranks' Open MPI segments, of the
    launcher or agent whose guard has ``marker``."""
    return os.path.join(SHM_DIR, marked_name("ompi", marker))


#: Where Open MPI 5 (btl/sm) and 4 (btl/vader) put their shared-memory segments.
BACKING_VARIABLES = ("OMPI_MCA_btl_sm_backing_directory", "OMPI_MCA_btl_vader_backing_directory")


#: Where UCX's posix transport makes its segments (default /dev/shm).
UCX_DIR_VARIABLE = "UCX_POSIX_DIR"


def backing_chosen(env: Mapping[str, str]) -> bool:
    """Whether a rank's Open MPI would find a backing directory chosen for it:
    in its environment, or in a parameter file it reads (see :mod:`.mcaparams`)."""
    if any(name in env for name in BACKING_VARIABLES):
        return True
    from .mcaparams import names_set
    wanted = {name[len("OMPI_MCA_"):] for name in BACKING_VARIABLES}
    return any(name in wanted for name in names_set(env, mentioning="backing_directory"))


class SingletonProbe:
    """The directory Open MPI ranks write to, and what was found there."""

    def __init__(self, marker: str, specs: Iterable[RankSpec] = ()) -> None:
        from ...machine.trees import hold
        self.path = probe_path(marker)
        os.mkdir(self.path, 0o700)      # OSError if it exists: never someone else's
        hold(self.path)
        self.seen: Dict[int, int] = {}
        self.certain: Set[int] = set()   # keys that are singletons whatever runs below them
        # Open MPI's segments in a directory of the job's own (unless the user
        # chose one): whatever a singleton leaves there goes with the directory,
        # also from one that ended before it could be noted.
        self.backing: Optional[str] = None
        specs = list(specs)
        if specs and not any(backing_chosen(spec.env) for spec in specs):
            backing = backing_path(marker)
            try:
                os.mkdir(backing, 0o700)
                self.backing = backing
                hold(backing)
            except OSError:
                pass

    def env(self, key: int, own: Mapping[str, str]) -> Dict[str, str]:
        """The variables of rank ``key``, whose own environment is ``own``."""
        env = {"OMPI_MCA_mpi_show_mca_params": "enviro",
               "OMPI_MCA_mpi_show_mca_params_file": os.path.join(self.path, str(key))}
        if "OMPI_MCA_orte_tmpdir_base" not in own:
            # Open MPI 4 singletons of one job share $TMPDIR/ompi.<host>.<uid>: one
            # removes it, empty, while another makes its own directory in it, which
            # then fails MPI_Init ("A call to mkdir was unable to create the desired
            # directory ... File exists").  Each gets a base of its own in the job's
            # directory, gone with it; a rank served PMIx gets the server's instead.
            env["OMPI_MCA_orte_tmpdir_base"] = os.path.join(self.path, f"s{key}")
        if self.backing is not None:
            env.update((name, self.backing) for name in BACKING_VARIABLES)
            # UCX (under Open MPI, and in MPICH's wheel) makes its segments with
            # shm_open and unlinks them once mapped: a rank killed in between
            # would leave one in /dev/shm.
            if UCX_DIR_VARIABLE not in own:
                env[UCX_DIR_VARIABLE] = self.backing
        return env

    def check(self) -> List[Tuple[int, int]]:
        """``(key, world size)`` of every rank that started Open MPI since the last check."""
        found = []
        try:
            names = os.listdir(self.path)
        except OSError:
            return []
        for name in names:
            if not (name.isascii() and name.isdigit()) or len(name) > 9 \
                    or int(name) in self.seen:
                continue
            head = _read_regular(os.path.join(self.path, name))
            if head is None:
                continue
            size = _world_size(head)
            if size is None:
                continue          # still being written: the next check reads it
            if b"ess=pmi " in head:
                size = 0          # Open MPI 4 under its own mpirun (a rank's nested job)
            elif b"ess=singleton " in head:
                self.certain.add(int(name))   # Open MPI 4: its orted is no nested launcher
            self.seen[int(name)] = size
            found.append((int(name), size))
        return found

    def close(self) -> None:
        from ...machine.trees import remove_tree
        remove_tree(self.path)
        if self.backing is not None:
            remove_tree(self.backing)


def singleton_message(library: str = "Open MPI", why: str = "", fix: str = "") -> str:
    """The refusal's words; ``why`` mslaunch could not serve the rank PMIx, and ``fix``."""
    if why:
        return (f"started {library} as a singleton (rank 0 of 1): mslaunch could not serve "
                f"it PMIx ({why}), so every rank would run alone; {fix}, or run the job "
                f"with --mpi openmpi")
    return (f"started {library} as a singleton (rank 0 of 1): it found no process manager "
            f"it speaks, so every rank would run alone; run the job with --mpi openmpi")


# -- what refused singletons leave in /dev/shm ----------------------------------------

SHM_DIR = "/dev/shm"
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
