"""What the first job's ranks here are given before its MPI services run, and the
services started when a rank first asks for them.

mslaunch serves PMI and PMIx to every job, with no flag, so every rank is given
what lets it reach them: a socket pair for PMI (``PMI_FD``), the PMIx door's
address with the variables the library would give (:mod:`.pmix.template`,
:mod:`.pmix.door`), and the directory where Open MPI says it started alone
(:class:`SingletonProbe`).  Most jobs' ranks never use any of it (a program
without MPI, a torch job), and the services themselves (the job's PMI, the
PMIx host, the door's relay, the singletons' watch) were a tenth of the CPU of
such a launch.  So for a job whose ranks all run here, :class:`EarlyMPI` makes
only the sockets and the directory before its ranks start; the services (the
caller's, made by ``wake``) are made when a rank first uses one of them: a
byte on its PMI socket, a connection at the door, a file in the probe
directory.  They take the sockets over as they are, and the loop reads every
socket level-triggered, so what woke them is read by them: nothing a rank sent
is lost.  Until then the job's services are those of a job whose ranks have
not used MPI: none started it, none left it, none waits, nothing to report,
nothing to remove but the sockets and the directory.
"""

from __future__ import annotations

import os

# the socket module's own import costs a millisecond a job (see mslaunch.core.socket)
from ..core import socket

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Dict, Iterable, List, Mapping, Optional, Protocol, Set, Tuple

    from ..core.spec import RankSpec
    from ..seams import ServedJob

    class FirstJob(Protocol):
        """The first job's PMI (:class:`~mslaunch.mpi.pmi.job.PMIJob`), as its ranks here see it."""

        def env(self, rank: int, own: Mapping[str, str]) -> Dict[str, str]: ...

        def release_child_fds(self, rank: Optional[int] = None) -> None: ...

    class Services(Protocol):
        """What the supervisor and the reports ask of a job's MPI services
        (:class:`~mslaunch.serve.mpijobs.MPIJobs`, or :class:`EarlyMPI` before them)."""

        def check_singletons(self) -> None: ...

        def process_ended(self, spec: RankSpec) -> None: ...

        def left(self, r) -> None: ...

        def watch_singletons(self) -> None: ...

        def singleton(self, key: int, size: int) -> None: ...

        def hang_report(self) -> List[str]: ...

        def reported(self) -> int: ...

        def stats(self, ranks: int) -> str: ...

        def close(self) -> None: ...

    class Woken(Services, Protocol):
        """The services once made, with their first job."""

        @property
        def first(self) -> Optional[FirstJob]: ...

#: Seconds between looks for Open MPI singletons among the ranks.
SINGLETON_POLL = 0.5


def listener(host: str) -> socket.socket:
    """A TCP socket listening on ``host``, at a port the kernel chooses, not blocking."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((host, 0))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


def first_word(sock: socket.socket) -> Optional[bool]:
    """Whether a readable PMI socket holds a rank's first word (left unread), or
    ended without any (False); None if nothing is there after all."""
    try:
        return bool(sock.recv(1, socket.MSG_PEEK))
    except BlockingIOError:
        return None
    except OSError:
        return False


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


#: The variables that choose where Open MPI 5 (btl/sm) and 4 (btl/vader) put their
#: shared-memory segments.
BACKING_VARIABLES = ("OMPI_MCA_btl_sm_backing_directory", "OMPI_MCA_btl_vader_backing_directory")


#: Where UCX's posix transport makes its segments (default /dev/shm).
UCX_DIR_VARIABLE = "UCX_POSIX_DIR"


def backing_chosen(env: Mapping[str, str]) -> bool:
    """Whether a rank's Open MPI would find a backing directory chosen for it:
    in its environment, or in a parameter file it reads (see :mod:`.pmi.mcaparams`)."""
    if any(name in env for name in BACKING_VARIABLES):
        return True
    from .pmi.mcaparams import names_set
    wanted = {name[len("OMPI_MCA_"):] for name in BACKING_VARIABLES}
    return any(name in wanted for name in names_set(env, mentioning="backing_directory"))


class SingletonProbe:
    """The directory Open MPI ranks write to, and what was found there."""

    def __init__(self, marker: str, specs: Iterable[RankSpec] = ()) -> None:
        from ..machine.trees import hold
        from .pmi.files import backing_path, probe_path
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
        from ..machine.trees import remove_tree
        remove_tree(self.path)
        if self.backing is not None:
            remove_tree(self.backing)


# -- the services, when a rank first asks -------------------------------------------

def early_mpi(served: ServedJob, wake: Callable[[EarlyMPI], Woken],
              environ: Mapping[str, str] = os.environ) -> Optional[EarlyMPI]:
    """The first job's :class:`EarlyMPI`, its ranks all here; None where the PMIx
    library's variables are not known yet (an earlier job of this user on this
    host keeps them): the services then start before the ranks, as the library
    must be asked."""
    from .pmix import turned_off
    door: Optional[socket.socket] = None
    kept: Optional[Tuple[Dict[str, str], str, str]] = None
    if not turned_off(environ):
        from ..machine.topology import cache_path
        from .pmix.template import door_host, file_name, key, load
        line = key(environ)
        if line is None:
            return None
        cache = cache_path(file_name())
        found = load(cache, line)
        if found is None or any(k.startswith("PMIX_DSTORE_") for k in found[0]):
            return None     # unknown, or a shared-memory store, made only as the server starts
        try:
            door = listener(door_host(found[0]) or "127.0.0.1")
        except OSError:
            return None
        kept = found[0], line, cache
    from .pmi.files import pmix_dir, xml_for_ranks
    plan, watchdog = served.plan, served.watchdog
    try:
        probe: Optional[SingletonProbe] = SingletonProbe(watchdog.marker, plan.ranks)
    except OSError:
        probe = None                         # no temporary directory: no check
    return EarlyMPI(served, wake, probe, xml_for_ranks(watchdog), pmix_dir(watchdog.marker),
                    door, kept)


class EarlyMPI:
    """See the module docstring: ``probe`` and ``hwloc_xml`` as the services would
    have them (see :mod:`.pmi.files`), ``directory`` the PMIx server's-to-be,
    ``door`` its listener and ``kept`` the library's variables (the template,
    its key and its file), or None where PMIx is turned off."""

    def __init__(self, served: ServedJob, wake: Callable[[EarlyMPI], Woken],
                 probe: Optional[SingletonProbe], hwloc_xml: Optional[str], directory: str,
                 door: Optional[socket.socket],
                 kept: Optional[Tuple[Dict[str, str], str, str]]) -> None:
        self.served, self.loop, self.wake = served, served.loop, wake
        plan = served.plan
        self.kvsname, self.size = plan.kvsname, len(plan.ranks)
        self.keys: Dict[int, int] = {r.rank: r.key for r in plan.ranks}
        self.probe, self.hwloc_xml, self.directory = probe, hwloc_xml, directory
        self.door, self.kept = door, kept
        self.ours: Dict[int, socket.socket] = {}     # PMI sockets, by rank
        self.theirs: Dict[int, socket.socket] = {}   # the ranks' ends, until spawned
        self.pmix_ranks: Set[int] = set()            # ranks given the door's address
        self.services: Optional[Woken] = None        # once a rank asked
        self.port = 0
        if door is not None:
            self.port = door.getsockname()[1]
            self.loop.add_reader(door.fileno(), self._knocked)

    def _knocked(self) -> None:
        """A connection at the door: the services take it (their door reads it)."""
        self._wake()

    def _wake(self) -> Woken:
        if self.services is None:
            for sock in list(self.ours.values()) + ([self.door] if self.door else []):
                self.loop.forget(sock.fileno())     # (the services read them from now on)
            self.services = self.wake(self)
            self.ours, self.theirs, self.door = {}, {}, None     # theirs now
        return self.services

    # -- what the ranks are given ---------------------------------------------------
    def env(self, rank: int, own: Mapping[str, str]) -> Dict[str, str]:
        """Rank ``rank``'s variables, as the services give them (its own environment ``own``)."""
        if self.services is not None and self.services.first is not None:
            return self.services.first.env(rank, own)
        env = {"PMI_FD": str(self._pair(rank))}
        if self.probe is not None:
            env.update(self.probe.env(self.keys[rank], own))
        if self.kept is not None and self.door is not None:
            from .pmix import rank_extras
            from .pmix.template import fill
            self.pmix_ranks.add(rank)
            env.update(fill(self.kept[0], self.directory, port=self.port, pid=os.getpid(),
                            nspace=self.kvsname, rank=rank))
            env.update(rank_extras(self.kvsname, self.directory, own))
        return env

    def _pair(self, rank: int) -> int:
        if not 0 <= rank < self.size:
            raise ValueError(f"rank {rank} outside 0..{self.size - 1}")
        if rank in self.ours or rank in self.theirs:
            raise ValueError(f"rank {rank} already has a PMI socket")
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        os.set_inheritable(theirs.fileno(), True)
        ours.setblocking(False)
        self.ours[rank], self.theirs[rank] = ours, theirs
        self.loop.add_reader(ours.fileno(), lambda: self._knock(rank))
        return theirs.fileno()

    def _knock(self, rank: int) -> None:
        """Rank ``rank``'s PMI socket is readable: its first words, or its end without any."""
        sock = self.ours[rank]
        said = first_word(sock)
        if said:
            self._wake()
        if said is not False:
            return
        del self.ours[rank]
        self.loop.forget(sock.fileno())
        sock.close()

    def release_child_fds(self, rank: Optional[int] = None) -> None:
        """Close the ranks' ends here (one rank's, or all) once spawned."""
        if self.services is not None:
            if self.services.first is not None:
                self.services.first.release_child_fds(rank)
            return
        for r in ([rank] if rank is not None else list(self.theirs)):
            sock = self.theirs.pop(r, None)
            if sock is not None:
                sock.close()

    # -- the services' part, until they run -------------------------------------------
    def watch_singletons(self) -> None:
        """Look for Open MPI singletons now and then, until the job ends."""
        self.check_singletons()
        if self.served.ending is None:
            self.loop.call_later(SINGLETON_POLL, self.watch_singletons)

    def check_singletons(self) -> None:
        if self.services is not None:
            self.services.check_singletons()
        elif self.probe is not None:
            found = self.probe.check()
            if found:
                services = self._wake()
                for key, size in found:
                    services.singleton(key, size)

    def process_ended(self, spec: RankSpec) -> None:
        if self.services is not None:
            self.services.process_ended(spec)

    def left(self, r) -> None:
        if self.services is not None:
            self.services.left(r)

    def singleton(self, key: int, size: int) -> None:
        self._wake().singleton(key, size)

    def hang_report(self) -> List[str]:
        return self.services.hang_report() if self.services is not None else []

    def reported(self) -> int:
        return self.services.reported() if self.services is not None else 0

    def stats(self, ranks: int) -> str:
        if self.services is not None:
            return self.services.stats(ranks)
        return f"0 messages from {ranks} ranks in 0.0000 s"

    def close(self) -> None:
        if self.services is not None:
            self.services.close()
            return
        for sock in list(self.ours.values()) + ([self.door] if self.door else []):
            self.loop.forget(sock.fileno())
            sock.close()
        self.ours, self.door = {}, None
        self.release_child_fds()
        if self.probe is not None:
            self.probe.close()
        if self.pmix_ranks:
            # Given as the ranks' PMIx and Open MPI session base, it may have been
            # made by one of them (a nested mpirun) though no server ever was.
            from ..machine.trees import remove_tree
            remove_tree(self.directory)
