"""Ranks on this machine: start them, watch them, relay their pipes, stop their leftovers.

:class:`LocalRanks` is the execution half of supervision, with no policy of
its own, so that the launcher and a remote host's agent run local ranks the
same way.  It reports to a listener:

* ``rank_started(rank, pid)`` once a rank runs,
* ``rank_exited(rank, code, signal, at)`` when its process ends (``at``: when,
  on ``time.time()``'s clock, :meth:`~mslaunch.machine.loop.Loop.events_at`,
  its life pipe ended, or else its exit was seen; see
  :func:`~mslaunch.machine.spawn.life_pipe`),

and feeds each rank's output into the sinks its owner made (the
launcher's :class:`~mslaunch.machine.output.RankOutput`, or the agent's link).
It signals rank process groups on request.  When a rank ends and leaves
processes behind in its group, they get SIGCONT and SIGTERM, and SIGKILL
after the grace period.  When every rank has ended but a pipe is still held
open by a process outside the ranks' groups (a daemon that called
``setsid``), the job's other leftovers are found through the guard and
stopped the same way; a pipe still open after that is drained and closed,
so the job never hangs on it.
"""

from __future__ import annotations

import os
import time
from ..core import signal

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Dict, List, Optional, Sequence, Tuple

    from ..core.spec import RankSpec
    from .guard import Watchdog
    from .output import RankSink
    from .loop import Loop, Timer
    from .stdin import StdinFanout

    #: A rank's PMI variables, by its rank in its job and its own environment.
    PMIEnv = Callable[[int, Dict[str, str]], Dict[str, str]]

from ..core.errors import LaunchError
from .output import RankPipe
from .spawn import POLL_EXIT, LocalProcess, life_pipe, os_error_reason

#: Seconds to wait after the last rank ended before a pipe still held open
#: by something outside the ranks' groups counts as a leftover's.
_LEFTOVER_DELAY = 0.2


#: Seconds before a rank's exit was seen within which its life pipe's end dates
#: its death (see :func:`~mslaunch.machine.spawn.life_pipe`); an end before
#: that was the rank's own doing (it closed the descriptor) and dates nothing.
LIFE_WINDOW = 1.0


class _Local:
    __slots__ = ("spec", "proc", "pipes", "ended", "code", "signal", "pmi", "pmi_env",
                 "life", "life_end")

    def __init__(self, spec: RankSpec, pmi, pmi_env) -> None:
        self.spec = spec
        self.proc: Optional[LocalProcess] = None
        self.pipes: List[RankPipe] = []
        self.ended = False
        self.code: Optional[int] = None
        self.signal: Optional[int] = None
        self.pmi = pmi             # the PMI server of the rank's job (inherited socket)
        self.pmi_env = pmi_env     # the PMI variables of a rank: rank -> dict
        self.life = -1             # the read end of the rank's life pipe (-1: none)
        self.life_end: Optional[float] = None    # when it ended


class LocalRanks:
    """Starts and watches the ranks of a plan that run on this machine.

    Ranks are known by their :attr:`~mslaunch.core.spec.RankSpec.key`, unique
    among all of the launcher's processes; ranks of jobs spawned later
    join with :meth:`add`.
    """

    def __init__(self, loop: Loop, specs: Sequence[RankSpec], listener, *,
                 sinks: Callable[[RankSpec], Tuple[RankSink, Optional[RankSink]]],
                 guard: Watchdog, grace: float, merge_stderr: bool,
                 pmi=None, pmi_env: Optional[PMIEnv] = None,
                 stdin_fd: Optional[int] = 0, pty: bool = True,
                 dumps: Optional[str] = None) -> None:
        self.loop = loop
        # Where Python ranks dump their stacks (see .pydump); None: no hook.
        self.dumps = dumps
        self.listener = listener
        self.ranks: Dict[int, _Local] = {s.key: _Local(s, pmi, pmi_env) for s in specs}
        self.sinks = sinks
        self.guard = guard
        self.grace = grace
        self.merge_stderr = merge_stderr
        self.pty = pty
        self.stdin_fanout: Optional[StdinFanout] = None
        # None: the owner feeds the ranks' stdin pipes (``stdin_pipes``) itself.
        self.stdin_fd = stdin_fd
        self.stdin_pipes: Dict[int, int] = {}
        self._stdin_is_tty = stdin_fd is not None and os.isatty(stdin_fd)
        self._kill_timers: Dict[int, Timer] = {}
        self._sweep: Optional[Timer] = None
        self._flush_timer: Optional[Timer] = None
        self._session_root: Optional[str] = None

    # -- starting -----------------------------------------------------------
    def start(self) -> None:
        """Start every rank, in rank order; raises LaunchError if one cannot start."""
        stdin_pipes: Dict[int, int] = {}
        self._start_some(list(self.ranks.values()), stdin_pipes)
        if stdin_pipes and self.stdin_fd is not None:
            from .stdin import StdinFanout
            self.stdin_fanout = StdinFanout(self.loop, self.stdin_fd, stdin_pipes)
        else:
            self.stdin_pipes = stdin_pipes

    def add(self, specs: Sequence[RankSpec], pmi=None,
            pmi_env: Optional[PMIEnv] = None) -> None:
        """Start more ranks now (a spawned job's); their stdin is /dev/null."""
        added = []
        for spec in specs:
            if spec.key in self.ranks:
                raise ValueError(f"process {spec.key} is already known")
            added.append(self.ranks.setdefault(spec.key, _Local(spec, pmi, pmi_env)))
        if self._sweep is not None:       # every earlier rank had ended: not any more
            self._sweep.cancel()
            self._sweep = None
        self._start_some(added, {})

    def restart(self, key: int) -> None:
        """Start an ended rank again, as it was (msrun's recovery); LaunchError if it
        cannot be.  What is left of its old process group is killed first."""
        local = self.ranks[key]
        if local.proc is not None and local.proc.group_alive():
            local.proc.signal(signal.SIGKILL)
        timer = self._kill_timers.pop(key, None)
        if timer is not None:
            timer.cancel()
        local.proc, local.pipes, local.ended = None, [], False
        local.code = local.signal = None
        self._start_some([local], {})

    def _start_some(self, locals_: List[_Local], stdin_pipes: Dict[int, int]) -> None:
        self.guard.ready()          # ranks start inside the job's cgroup
        try:
            for local in locals_:
                try:
                    self._start(local, stdin_pipes)
                except OSError as err:
                    raise LaunchError(f"cannot start rank {local.spec.rank}: "
                                      f"{os_error_reason(err)}") from None
        finally:
            for pmi in {id(x.pmi): x.pmi for x in locals_ if x.pmi is not None}.values():
                pmi.release_child_fds()
            self.guard.flush()

    def _session_dir(self, rank: int) -> str:
        """``--set-cwd-to-session-dir``: a fresh directory per rank, removed at the end,
        in this user's ``mslaunch.<host>.<uid>`` (removed too by the last job that
        used it) -- unless another user made that name first (it is no secret),
        when the job's own goes beside it."""
        import tempfile

        from .trees import private_dir
        mine = os.path.join(tempfile.gettempdir(),
                            f"mslaunch.{os.uname().nodename}.{os.getuid()}")
        for _ in range(5):
            if self._session_root is not None:
                break
            top, prefix = mine, f"{self.guard.marker}."
            try:
                private_dir(top)
            except OSError:
                top, prefix = os.path.dirname(top), f"{os.path.basename(top)}.{prefix}"
            try:
                self._session_root = tempfile.mkdtemp(prefix=prefix, dir=top)
            except FileNotFoundError:
                continue        # the last job that used it removed it meanwhile
        if self._session_root is None:
            raise FileNotFoundError(f"no session directory could be made in {mine}")
        path = os.path.join(self._session_root, str(rank))
        os.makedirs(path, exist_ok=True)
        return path

    def _start(self, local: _Local, stdin_pipes: Dict[int, int]) -> None:
        if local.spec.session_dir:
            from ..core.spec import replace
            local.spec = replace(local.spec, cwd=self._session_dir(local.spec.key))
        spec = local.spec
        env = dict(spec.env)
        from .procs import MARKER_VARIABLE
        env[MARKER_VARIABLE] = self.guard.marker
        # As under Open MPI: PWD is the rank's physical working directory.
        env["PWD"] = os.path.realpath(spec.cwd)
        if local.pmi_env is not None:
            for key, value in local.pmi_env(spec.rank, env).items():
                # A process manager's settings of MPICH's own (MPIR_CVAR_*) are
                # defaults: the rank's environment wins.
                if not (key.startswith("MPIR_CVAR_") and key in env):
                    env[key] = value
        if self.dumps is not None and python_program(spec):
            from .pydump import rank_env
            env.update(rank_env(self.dumps, env, os.getpid()))
        out_sink, err_sink = self.sinks(spec)
        out_r, out_w = open_pty() if self.pty else os.pipe()
        err_r, err_w = (None, out_w) if self.merge_stderr else os.pipe()
        stdin_w = None
        how = spec.stdin
        if how == "inherit" and (self._stdin_is_tty or self.stdin_fd is None):
            how = "pipe"     # a background group reading the terminal would be stopped
        if how == "inherit":
            assert self.stdin_fd is not None
            stdin = self.stdin_fd
        elif how == "pipe":
            stdin, stdin_w = os.pipe()
        else:
            stdin = devnull_fd()
        life = life_pipe()
        try:
            local.proc = LocalProcess(spec, env, stdin=stdin, stdout=out_w, stderr=err_w,
                                      life=None if life is None else life[1])
        except LaunchError:
            for fd in (out_r, err_r, stdin_w, None if life is None else life[0]):
                if fd is not None:
                    os.close(fd)
            out_sink.finish()
            if err_sink is not None:
                err_sink.finish()
            raise
        finally:
            # The child has its copies; keep only our ends.  Its PMI socket end
            # must go now: every inheritable descriptor reaches the next rank.
            if local.pmi is not None:
                local.pmi.release_child_fds(spec.rank)
            os.close(out_w)
            if err_r is not None:
                os.close(err_w)
            if life is not None:
                os.close(life[1])
            if how == "pipe":
                os.close(stdin)
        if stdin_w is not None:
            stdin_pipes[spec.key] = stdin_w
        self.guard.add(local.proc.pgid)
        proc = local.proc
        local.pipes.append(RankPipe(self.loop, out_r, out_sink,
                                    on_abandon=lambda: proc.signal(signal.SIGPIPE)))
        if err_r is not None:
            local.pipes.append(RankPipe(self.loop, err_r, err_sink))  # type: ignore[arg-type]
        if life is not None:
            local.life = life[0]
            self.loop.add_reader(local.life, lambda: self._life_read(local))
        if local.proc.pidfd >= 0:
            self.loop.add_reader(local.proc.pidfd,
                                 lambda: self._on_exit(local, self.loop.events_at()))
        else:
            self._poll_exit(local)
        self.listener.rank_started(spec.key, local.proc.pid)

    def _poll_exit(self, local: _Local) -> None:
        """Without a pidfd (see :func:`~.spawn.open_pidfd`), look for the rank's exit
        every :data:`~.spawn.POLL_EXIT` seconds."""
        if local.ended:
            return
        if local.proc.exited():  # type: ignore[union-attr]
            self._on_exit(local, self.loop.events_at())
        else:
            self.loop.call_later(POLL_EXIT, lambda: self._poll_exit(local))

    def catch_up(self) -> None:
        """Read now the ends of ranks that have exited but whose end the loop has not
        read yet (it was busy, or not scheduled): a stop about to be sent must find
        them ended before it, or their ends would be taken for the stop's doing."""
        for local in list(self.ranks.values()):
            if local.proc is not None and not local.ended and local.proc.exited():
                # woken by this end too: dated as the loop dates its events
                woken = local.proc.pidfd >= 0 and self.loop.woke_for(local.proc.pidfd)
                self._on_exit(local, self.loop.events_at() if woken else time.time())

    # -- events -------------------------------------------------------------
    def _life_read(self, local: _Local) -> None:
        try:
            if os.read(local.life, 4096):
                return                  # the rank wrote there: nothing to date
        except OSError:
            pass
        local.life_end = self.loop.events_at()
        self._life_close(local)

    def _life_close(self, local: _Local) -> None:
        if local.life >= 0:
            self.loop.forget(local.life)
            os.close(local.life)
            local.life = -1

    def _on_exit(self, local: _Local, at: float) -> None:
        proc = local.proc
        assert proc is not None
        if proc.pidfd >= 0:
            self.loop.forget(proc.pidfd)
        if local.life >= 0 and self.loop.woke_for(local.life):
            self._life_read(local)      # its end came in the same wake-up, not read yet
        self._life_close(local)
        if local.life_end is not None and 0 <= at - local.life_end < LIFE_WINDOW:
            at = local.life_end
        local.code, local.signal = proc.reap()
        local.ended = True
        if self.guard.subreaper:
            self.guard.reap_adopted(self.pids())
        if self.stdin_fanout is not None:
            self.stdin_fanout.drop(local.spec.key)
        self.listener.rank_exited(local.spec.key, local.code, local.signal, at)
        if proc.group_alive():
            # Leftover children of an ended rank would become orphans.
            proc.signal(signal.SIGCONT)
            proc.signal(signal.SIGTERM)
            self._kill_later(local)
        else:
            self._group_gone(local)
        self._check_leftovers()

    def _kill_later(self, local: _Local) -> None:
        rank = local.spec.key
        if rank in self._kill_timers:
            return

        def kill() -> None:
            self._kill_timers.pop(rank, None)
            local.proc.signal(signal.SIGKILL)  # type: ignore[union-attr]
        self._kill_timers[rank] = self.loop.call_later(self.grace, kill)
        self.loop.call_later(0.05, lambda: self._check_group(local))

    def _check_group(self, local: _Local) -> None:
        if local.proc is None:
            return
        if local.proc.group_alive():
            self.loop.call_later(0.05, lambda: self._check_group(local))
            return
        timer = self._kill_timers.pop(local.spec.key, None)
        if timer is not None:
            timer.cancel()
        self._group_gone(local)

    def _group_gone(self, local: _Local) -> None:
        self.guard.remove(local.proc.pgid)  # type: ignore[union-attr]
        if self._flush_timer is None:
            self._flush_timer = self.loop.call_later(1.0, self._flush_guard)

    def _flush_guard(self) -> None:
        self._flush_timer = None
        self.guard.flush()

    def _check_leftovers(self) -> None:
        """Once every rank ended, a pipe still open is held by a leftover: stop it."""
        if self._sweep is not None or not all(r.ended for r in self.ranks.values()):
            return
        if all(p.closed for r in self.ranks.values() for p in r.pipes):
            return
        self._sweep = self.loop.call_later(_LEFTOVER_DELAY, self._stop_leftovers)

    def _stop_leftovers(self) -> None:
        if all(p.closed for r in self.ranks.values() for p in r.pipes) or \
                not all(r.ended for r in self.ranks.values()):
            return
        pids = self.guard.leftovers(self.pids())
        for pid in pids:
            _signal(pid, signal.SIGCONT)
            _signal(pid, signal.SIGTERM)

        def kill() -> None:
            if not all(r.ended for r in self.ranks.values()):
                return                    # a spawned job started meanwhile
            for pid in self.guard.leftovers(self.pids()):
                _signal(pid, signal.SIGKILL)
            # Whatever still holds a pipe now is out of reach: take what it
            # wrote so far and close, so that the job can end.
            self.loop.call_later(0.2, self.close_pipes)
        self.loop.call_later(self.grace if pids else 0.0, kill)

    def close_pipes(self) -> None:
        for local in self.ranks.values():
            for pipe in local.pipes:
                if not pipe.closed and not pipe.drain():
                    pipe.close()

    # -- commands -----------------------------------------------------------
    def abandon(self, rank: int, stream: int) -> None:
        """Nobody takes ``stream`` (1, 2) of ``rank`` any more: stop reading it."""
        local = self.ranks.get(rank)
        if local is not None and stream <= len(local.pipes):
            local.pipes[stream - 1].abandon()

    def signal(self, sig: int, ranks: Optional[Sequence[int]] = None) -> None:
        """Send ``sig`` to the process groups of ``ranks`` (default: all started)."""
        for rank in (ranks if ranks is not None else self.ranks):
            local = self.ranks.get(rank)
            if local is not None and local.proc is not None:
                local.proc.signal(sig)

    def pids(self) -> List[int]:
        return [pid for _, pid in self.started_pids()]

    def started_pids(self) -> List[Tuple[RankSpec, int]]:
        """Each started rank, with its pid."""
        return [(r.spec, r.proc.pid) for r in self.ranks.values() if r.proc is not None]

    @property
    def busy(self) -> bool:
        """Whether a rank runs, a rank group has leftovers, or a pipe is open."""
        return bool(self._kill_timers) or any(
            (local.proc is not None and not local.ended) or any(not p.closed for p in local.pipes)
            for local in self.ranks.values())

    def pipes(self) -> List[RankPipe]:
        return [p for local in self.ranks.values() for p in local.pipes]

    def release(self) -> None:
        """The job is over (see :meth:`close`); nothing to tell anyone here."""

    def close(self, deadline: float) -> None:
        """Final cleanup (outside the loop): nothing of these ranks may survive;
        what ignores SIGTERM is killed at ``deadline``."""
        leftovers = [r for r in self.ranks.values() if r.proc is not None and r.proc.group_alive()]
        if leftovers:
            for r in leftovers:
                r.proc.signal(signal.SIGCONT)  # type: ignore[union-attr]
                r.proc.signal(signal.SIGTERM)  # type: ignore[union-attr]
            while time.monotonic() < deadline and any(
                    r.proc.group_alive() for r in leftovers):  # type: ignore[union-attr]
                time.sleep(0.02)
            for r in leftovers:
                r.proc.signal(signal.SIGKILL)  # type: ignore[union-attr]
        for r in self.ranks.values():
            if r.proc is not None and not r.ended:
                r.proc.signal(signal.SIGKILL)
                r.code, r.signal = r.proc.reap()
                r.ended = True
            self._life_close(r)
            for pipe in r.pipes:
                if not pipe.closed and not pipe.drain():
                    pipe.close()
        if self.stdin_fanout is not None:
            self.stdin_fanout.close()
        if self._session_root is not None:
            from .trees import remove_tree
            remove_tree(self._session_root)
            top = os.path.dirname(self._session_root)
            if os.path.basename(top) == f"mslaunch.{os.uname().nodename}.{os.getuid()}":
                try:
                    os.rmdir(top)       # (another job's directory in it keeps it)
                except OSError:
                    pass


def open_pty() -> Tuple[int, int]:
    """A pseudo-terminal for a rank's stdout, set up as Open MPI sets it up.

    The rank's stdio sees a terminal, so C programs' stdout is line-buffered
    (lines printed before a crash are not lost) and ``isatty(1)`` is true;
    but nothing is translated (no ``\n`` to ``\r\n``) and nothing echoed.
    It is not the rank's controlling terminal.  Falls back to a pipe when
    no pseudo-terminal can be had (the system's limit is a few thousand).
    """
    try:
        master, slave = os.openpty()
    except OSError:
        return os.pipe()
    import termios
    try:
        attrs = termios.tcgetattr(slave)
        attrs[0] &= ~(termios.ICRNL | termios.INLCR | termios.IGNCR | termios.IXON
                      | termios.BRKINT | termios.ISTRIP)
        # Output processing off altogether: the bytes are the same as with
        # only ONLCR/OCRNL cleared (Open MPI's setting), but n_tty then copies
        # whole blocks instead of examining every character, which doubles
        # what a pseudo-terminal can carry.
        attrs[1] &= ~(termios.OPOST | termios.ONLCR | termios.OCRNL | termios.ONLRET)
        attrs[3] &= ~(termios.ECHO | termios.ECHOE | termios.ECHOK | termios.ECHONL
                      | getattr(termios, "ECHOCTL", 0) | getattr(termios, "ECHOKE", 0))
        termios.tcsetattr(slave, termios.TCSANOW, attrs)
    except termios.error:
        pass
    return master, slave


def python_program(spec: RankSpec) -> bool:
    """Whether a rank runs a Python interpreter (by its program's name): it gets
    the hook that lets it dump its own stacks (see :mod:`.pydump`)."""
    return os.path.basename(spec.program or spec.argv[0]).startswith(("python", "pypy"))


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except OSError:
        pass


_devnull_fd: Optional[int] = None


def devnull_fd() -> int:
    """One shared /dev/null descriptor for ranks that get no stdin."""
    global _devnull_fd
    if _devnull_fd is None:
        _devnull_fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    return _devnull_fd
