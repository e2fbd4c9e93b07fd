"""One process of the launcher's own that stands for a job's ranks (Open MPI's
``mpirun``, an ``srun`` step): the plumbing its rank handle needs.

:class:`ProcessHandle` starts the process in a session of its own (a Ctrl-C
at the terminal reaches only the launcher, which forwards it), hands its pid
to the orphan guard before anything else can happen, watches its end through
a pidfd in the loop (or, without one, looks for it every
:data:`~.spawn.POLL_EXIT` seconds), reaps it once (its wait status kept), signals it or its
process group while it is not reaped, ends it (SIGTERM, then SIGKILL to its
group at a deadline) and finishes the pipes it feeds: each is read to its end
if it can be, else closed, so that every output sink is finished and the job
can end.  It starts with ``posix_spawn``, as the ranks do (the launcher
imports no :mod:`subprocess` for it), in another working directory through
:mod:`.spawndir`.
"""

from __future__ import annotations

import os
import time

from ..core import signal
from .loop import wait_fd
from .spawn import POLL_EXIT, RESET_SIGNALS, exit_of, is_launch_dir, open_pidfd

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import List, Optional, Sequence, Tuple

    from .guard import Watchdog
    from .loop import Loop
    from .output import RankPipe


class ProcessHandle:
    """See the module docstring.  A subclass starts its process with :meth:`_spawn`
    and :meth:`_watch`, and says in :meth:`_on_exit` what its end means."""

    def __init__(self, loop: Loop) -> None:
        self.loop = loop
        self.pid = 0
        self.status: Optional[int] = None      # its wait status, once reaped
        self.pidfd = -1
        #: Its end is watched: from :meth:`_watch` until it is seen (:meth:`_forget_pidfd`).
        self.watched = False
        self.pipes: List[RankPipe] = []

    @property
    def busy(self) -> bool:
        """The process runs, or output of its is still to come."""
        return self.watched or any(not p.closed for p in self.pipes)

    # -- start --------------------------------------------------------------
    @staticmethod
    def _spawn(path: str, argv: Sequence[str], env, *, cwd: Optional[str] = None,
               stdin: Optional[int] = None, out: Tuple[Optional[int], Optional[int]] = (None, None)
               ) -> int:
        """Start ``path`` with ``argv`` and exactly ``env``, in a session of its own;
        its stdin, stdout and stderr are the descriptors given (None: the
        launcher's), its directory ``cwd`` (None: the launcher's).  Its pid."""
        dup2s = [(fd, target) for fd, target in ((stdin, 0), (out[0], 1), (out[1], 2))
                 if fd is not None]
        if cwd is not None and not is_launch_dir(cwd):
            from .spawndir import spawn_in
            return spawn_in(cwd, path, list(argv), env, dup2s=tuple(dup2s), session=True,
                            sigdef=RESET_SIGNALS)
        return os.posix_spawn(path, list(argv), env, setsid=True, setsigdef=RESET_SIGNALS,
                              file_actions=[(os.POSIX_SPAWN_DUP2, fd, target)
                                            for fd, target in dup2s])

    def _watch(self, pid: int, guard: Optional[Watchdog]) -> None:
        """``pid`` started: the guard told of it at once, its end watched in the loop."""
        self.pid = pid
        if guard is not None:
            guard.add(pid)
            guard.flush()
        self.watched = True
        self.pidfd = open_pidfd(pid)
        if self.pidfd >= 0:
            self.loop.add_reader(self.pidfd, self._on_exit)
        else:
            self.loop.call_later(POLL_EXIT, self._poll_exit)

    def _poll_exit(self) -> None:
        """Without a pidfd: its end looked for now, and again later."""
        if not self.watched:
            return
        if self._reap(block=False):
            self._on_exit()
        else:
            self.loop.call_later(POLL_EXIT, self._poll_exit)

    def _on_exit(self) -> None:
        """The process ended (its pidfd is readable): the subclass's to say what it means."""
        raise NotImplementedError

    # -- its end --------------------------------------------------------------
    def _forget_pidfd(self) -> None:
        self.watched = False
        if self.pidfd >= 0:
            self.loop.forget(self.pidfd)
            os.close(self.pidfd)
            self.pidfd = -1

    def _reap(self, block: bool) -> bool:
        """Whether the process has ended (and is reaped), waiting for it with ``block``."""
        if self.status is None and self.pid:
            try:
                pid, status = os.waitpid(self.pid, 0 if block else os.WNOHANG)
            except ChildProcessError:
                pid, status = self.pid, 0       # reaped by someone else: its status gone
            if pid:
                self.status = status
        return self.status is not None

    @property
    def ended_as(self) -> Tuple[Optional[int], Optional[int]]:
        """(exit code, None) or (None, signal number), once reaped."""
        assert self.status is not None, "reaped first"
        return exit_of(self.status)

    def _kill(self, sig: int, group: bool = False) -> None:
        """``sig`` to the process (or its process group); nothing once it is reaped,
        when its pid may be another's."""
        if not self.pid or self.status is not None:
            return
        try:
            if group:
                os.killpg(self.pid, sig)
            else:
                os.kill(self.pid, sig)
        except OSError:
            pass

    def _end(self, deadline: float) -> None:
        """Outside the loop: SIGTERM, the process given until ``deadline`` to end,
        then SIGKILL to its process group; reaped, its pidfd closed."""
        if self.pid and not self._reap(block=False):
            self._kill(signal.SIGTERM)
            while not self._reap(block=False):
                left = deadline - time.monotonic()
                if left <= 0:
                    self._kill(signal.SIGKILL, group=True)
                    self._reap(block=True)
                    break
                if self.pidfd >= 0:
                    wait_fd(self.pidfd, timeout=min(left, 0.5))
                else:
                    time.sleep(min(left, 0.05))
        self._forget_pidfd()

    def _finish_pipes(self) -> None:
        """Each pipe read to its end if that can be done now, else closed: either way
        its sink is finished."""
        for pipe in self.pipes:
            if not pipe.closed and not pipe.drain():
                pipe.close()
