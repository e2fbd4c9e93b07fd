"""``--launcher srun``: srun starts the ranks themselves, with no agent of mslaunch's.

As Hydra's ``mpiexec -launcher slurm`` would if its proxy did nothing but
exec, one ``srun`` step runs every rank, each task on the node the plan
gives it (:func:`~mslaunch.plan.srun.srun_argv`).  A small bash program
(:func:`~mslaunch.plan.srun.task_program`) sets the rank's own variables
and connects its stdout and stderr to the launcher, token-checked, before
the program replaces it: output reaches the job's files and the terminal as
from local ranks.  PMI is mslaunch's own, over TCP (``PMI_PORT`` at the
address srun ran from, a secret ``PMI_ID`` per rank), so MPICH-ABI ranks
get the default mode's PMI, spawn and failure reports included.

srun runs in a session of its own, behind the rank-handle seam
(:class:`SrunRanks`, brought in by :class:`SrunHooks`): each task's end,
with its exact wait status, is read from what ``srun -v`` says of it
(:class:`~mslaunch.plan.srun.SrunLog`).  Signals go to the step with
``scancel --signal``; SIGKILL is srun's own termination of the step, which
Slurm also does should srun die (mslaunch's orphan guard kills srun if
mslaunch dies).  Not served in this mode: PMIx (Open MPI's ranks), the
stacks of running ranks and ``mslaunch-top``, and binding.
"""

from __future__ import annotations

import os
# The C module: the same calls as signal's, without importing enum (milliseconds).
import _signal as signal
import sys
import time

from ..errors import LaunchError, UsageError
from ..machine.loop import wait_fd
from ..machine.output import RankPipe
from ..machine.spawn import RESET_SIGNALS, exec_path
from ..plan.srun import (
    TASK_VARIABLE,
    SrunLog,
    rank_script,
    split_env,
    srun_argv,
    task_program,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    import subprocess
    from typing import Any, Callable, Container, Dict, List, Optional, Sequence, Set, Tuple

    from ..remote.dialback import Listener
    from ..spec import JobSpec, Plan, RankSpec
    from .seams import JobView, RankHandle


class _Log:
    """srun's stderr as a :class:`RankPipe`'s sink: whole lines to :class:`SrunLog`;
    the task ends it reads go to the handle, the lines meant for users to the
    console."""

    tail = b""
    wanted = True
    congested = False
    pending = b""

    def __init__(self, handle: SrunRanks) -> None:
        self.handle = handle

    def wait_for_room(self, source) -> None:
        source.resume()

    def feed(self, data) -> None:
        *lines, self.pending = (self.pending + bytes(data)).split(b"\n")
        for line in lines:
            self.handle.srun_said(line.decode("utf-8", "replace"))

    def finish(self) -> None:
        if self.pending:
            pending, self.pending = self.pending, b""
            self.handle.srun_said(pending.decode("utf-8", "replace"))


class SrunRanks:
    """Every rank of the job, as one srun step (see the module docstring)."""

    def __init__(self, sup: JobView, specs: Sequence[RankSpec]) -> None:
        self.sup = sup
        self.specs = list(specs)
        self.ranks: Container[int] = frozenset(s.key for s in specs)
        self.log = SrunLog(show_all=sup.job.verbose >= 2)
        self.pid = 0                              # srun's
        self.status: Optional[int] = None        # its wait status, once reaped
        self.pidfd = -1
        self.pipes: List[RankPipe] = []
        self.attached: Set[Tuple[int, str]] = set()   # (task, "o" or "e") read from
        self.listener: Optional[Listener] = None
        self._scancels: List[subprocess.Popen] = []
        self._looks: List[_Look] = []

    @property
    def busy(self) -> bool:
        return self.pidfd >= 0 or any(not p.closed for p in self.pipes)

    # -- start --------------------------------------------------------------
    def start(self) -> None:
        sup, specs = self.sup, self.specs
        merged = sup.job.output.merge_stderr
        self.listener = listener = self._listen()
        port = listener.socks[0].getsockname()[1]
        secret = os.urandom(12).hex()
        envs = [dict(s.env) for s in specs]
        pmi_port = None
        if sup.mpi_jobs is not None:
            first = sup.mpi_jobs.first
            first.serve(sup.loop, [s.app for s in specs], sup.plan.process_mapping, tcp=True,
                        trace=sup.job.verbose >= 2, port_range=sup.job.port_range,
                        tcp_host="0.0.0.0")
            for env, spec in zip(envs, specs):
                pmi = first.env(spec.rank, spec.env)
                pmi_port = int(pmi.pop("PMI_PORT").rpartition(":")[2])
                env.update(pmi)
        common, own = split_env(envs)
        same_argv = all(s.argv == specs[0].argv for s in specs)
        same_cwd = all(s.cwd == specs[0].cwd for s in specs)
        for task, spec in enumerate(specs):
            script = rank_script(own[task], None if same_argv else spec.argv,
                                 None if same_cwd else spec.cwd, pmi_port)
            listener.expect(f"{secret}{task}o", self._dialled(task, "o", script))
            if not merged:
                listener.expect(f"{secret}{task}e", self._dialled(task, "e", b""))
        env = dict(os.environ)
        env.update(common)
        env[TASK_VARIABLE] = task_program(secret, port, merged)
        stdin = self._stdin()
        argv = srun_argv([s.host.name for s in specs], len(specs), stdin,
                         specs[0].cwd, specs[0].argv if same_argv else ())
        r, w = os.pipe()
        try:
            self.pid = _spawn(argv, env, None if stdin != "none" else os.devnull, w)
        except OSError as err:
            os.close(r)
            raise LaunchError(f"--launcher srun: cannot start srun: "
                              f"{err.strerror or err}") from None
        finally:
            os.close(w)
        guard = sup.watchdog
        if guard is not None:
            guard.add(self.pid)
            guard.flush()
        self.pidfd = os.pidfd_open(self.pid)
        sup.loop.add_reader(self.pidfd, self._on_exit)
        self.pipes.append(RankPipe(sup.loop, r, _Log(self)))

    def _listen(self) -> Listener:
        from ..remote.dialback import Listener
        listener = Listener(self.sup.loop, ["::"], tls=False, log=self.sup.log,
                            port_range=self.sup.job.port_range)
        if not listener.socks:        # no IPv6 here
            listener = Listener(self.sup.loop, ["0.0.0.0"], tls=False, log=self.sup.log,
                                port_range=self.sup.job.port_range)
        if not listener.socks:
            raise LaunchError("--launcher srun: cannot listen for the ranks' output")
        return listener

    def _stdin(self) -> str:
        """The task srun gives its stdin (mpirun's default: rank 0), or ``none``
        (a terminal: srun, in a session of its own, could not read it)."""
        which = self.sup.job.stdin
        if which in ("none", "all") or not which.isdigit() or int(which) >= len(self.specs):
            return "none"
        try:
            return "none" if os.isatty(0) else which
        except OSError:
            return "none"

    def _dialled(self, task: int, stream: str, script: bytes):
        def connected(sock, rest: bytes, about: str) -> None:
            spec = self.specs[task]
            rank = self.sup.ranks[spec.key]
            if not rank.outputs:          # the first of its connections
                self.sup.make_sinks(spec)
                self.sup.rank_started(spec.key, int(about) if about.isdigit() else 0)
            outputs = rank.outputs
            sink = outputs[0] if stream == "o" or len(outputs) < 2 else outputs[1]
            if script:
                # A fresh connection's buffer takes the few KB at once.
                try:
                    sock.setblocking(True)
                    sock.sendall(script)
                except OSError:      # the task is gone already: srun says how
                    sock.close()
                    return
            if rest:
                sink.feed(rest)
            self.attached.add((task, stream))
            self.pipes.append(RankPipe(self.sup.loop, sock.detach(), sink))
        return connected

    def _finish_unattached(self) -> None:
        """srun has ended, and its tasks with it: a stream that never connected
        (a task that died first, or never dialled) has nothing more to come."""
        for task, spec in enumerate(self.specs):
            for stream, out in zip("oe", self.sup.ranks[spec.key].outputs):
                if (task, stream) not in self.attached and not out.finished:
                    out.finish()

    # -- srun's reports -----------------------------------------------------
    def srun_said(self, line: str) -> None:
        shown = self.log.line(line)
        if shown is not None:
            self.sup.console.message(shown)
        for task, code, sig in self.log.take():
            if 0 <= task < len(self.specs):
                key = self.specs[task].key
                if not self.sup.ranks[key].ended:
                    self.sup.rank_exited(key, code, sig)

    def _on_exit(self) -> None:
        self._forget_pidfd()
        self._reap(block=True)
        for pipe in self.pipes[:1]:       # srun's own lines first
            if not pipe.closed:
                pipe.drain()
        # Connections made before the tasks ended may still wait to be accepted.
        self.sup.loop.call_later(1.0, self._finish_unattached)
        left = [s.key for s in self.specs if not self.sup.ranks[s.key].ended]
        if left and self.status is not None:
            how = (f"killed by signal {os.WTERMSIG(self.status)}" if os.WIFSIGNALED(self.status)
                   else f"exit code {os.WEXITSTATUS(self.status)}")
            self.sup.ranks_lost(left, f"srun ended ({how}) without reporting their end")

    def _reap(self, block: bool) -> bool:
        """Whether srun has ended (and is reaped), waiting for it with ``block``."""
        if self.status is None and self.pid:
            try:
                pid, status = os.waitpid(self.pid, 0 if block else os.WNOHANG)
            except ChildProcessError:
                pid, status = self.pid, 0
            if pid:
                self.status = status
        return self.status is not None

    def _kill(self, sig: int, group: bool = False) -> None:
        try:
            if group:
                os.killpg(self.pid, sig)
            else:
                os.kill(self.pid, sig)
        except OSError:
            pass

    def _forget_pidfd(self) -> None:
        if self.pidfd >= 0:
            self.sup.loop.forget(self.pidfd)
            os.close(self.pidfd)
            self.pidfd = -1

    # -- looking inside ---------------------------------------------------------
    def look(self, kind: int, body: Dict[str, Any], done: Callable[[Optional[Dict]], None]
             ) -> bool:
        """Ask a step of its own (:mod:`~mslaunch.remote.steplook`) for the running
        ranks' stacks (``link.STACKS``) or usage (``link.TOP``); ``done(ranks)``
        once every node answered or the look's time is over."""
        from ..remote import link, steplook
        sup, listener = self.sup, self.listener
        if self.pidfd < 0 or listener is None:
            return False
        import subprocess
        by_node: Dict[str, Dict[int, int]] = {}
        for spec in self.specs:
            r = sup.ranks[spec.key]
            if r.pid and not r.ended:
                by_node.setdefault(spec.host.name, {})[spec.key] = r.pid
        if not by_node:
            return False
        for old in [x for x in self._looks if x.over]:
            old.close()
            self._looks.remove(old)
        timeout = float(body.get("timeout", 10.0))
        look = _Look(sup, by_node, done, timeout + 5.0)
        token = os.urandom(12).hex()
        for node in by_node:
            listener.expect(f"{token}-{node}", look.connected(node))
        env = dict(os.environ)
        env[steplook.LOOK_VARIABLE] = steplook.request(
            "top" if kind == link.TOP else "stacks", by_node, token,
            listener.socks[0].getsockname()[1], timeout)
        nodes = list(by_node)
        try:
            look.proc = subprocess.Popen(
                ["srun", "--quiet", f"--nodelist={','.join(nodes)}", f"--nodes={len(nodes)}",
                 f"--ntasks={len(nodes)}", "--ntasks-per-node=1", "--overlap", "--mpi=none",
                 "--cpu-bind=none", "--input=none", "--kill-on-bad-exit=0",
                 sys.executable, "-S", "-c", steplook.program(_package_dir())],
                env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, start_new_session=True)
        except OSError:
            return False
        self._looks.append(look)
        return True

    # -- the rest of the seam -------------------------------------------------
    def signal(self, sig: int, ranks: Optional[Sequence[int]] = None) -> None:
        """``sig`` to every task of the step (Slurm signals a step, not a task);
        SIGKILL: srun ends the step, as on SIGTERM."""
        if not self.pid or self.status is not None or sig == signal.SIGCONT:
            return            # (nothing of mslaunch's stops a task: nothing to continue)
        if sig == signal.SIGKILL or self.log.step is None:
            try:
                os.kill(self.pid, signal.SIGTERM if sig in (signal.SIGKILL, signal.SIGTERM)
                        else sig)
            except OSError:
                pass
            return
        import subprocess
        try:
            self._scancels.append(subprocess.Popen(
                ["scancel", "--quiet", f"--signal={sig}", self.log.step],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        except OSError:
            os.kill(self.pid, signal.SIGTERM)

    def release(self) -> None:
        """Nothing to tell anyone (see :meth:`close`)."""

    def close(self, deadline: float) -> None:
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
        for pipe in self.pipes:
            if not pipe.closed and not pipe.drain():
                pipe.close()
        for p in self._scancels:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for look in self._looks:
            look.close()
        if self.listener is not None:
            self.listener.close()


def check_srun_job(job: JobSpec, plan: Plan, attempts: bool) -> None:
    """UsageError for what ``--launcher srun`` does not do (see the module docstring)."""
    what = None
    if attempts:
        what = "--max-restarts and --health-check"
    elif any(r.cpus for r in plan.ranks):
        what = "binding (--bind-to)"
    elif any(r.inherit == "none" for r in plan.ranks):
        what = "-genvnone"
    if what is not None:
        raise UsageError(f"--launcher srun: {what} needs mslaunch's agents; "
                         f"use --launcher slurm")


def _package_dir() -> str:
    """Where this mslaunch is imported from (the directory holding ``mslaunch``)."""
    import mslaunch
    return os.path.dirname(os.path.dirname(os.path.abspath(mslaunch.__file__)))


class _Answer:
    """One node's answer to a look, as a :class:`RankPipe`'s sink: JSON, read whole."""

    tail = b""
    wanted = True
    congested = False
    pending = b""
    LIMIT = 64 << 20

    def __init__(self, finished: Callable[[bytes], None]) -> None:
        self.parts: List[bytes] = []
        self.size = 0
        self.finished = finished

    def wait_for_room(self, source) -> None:
        source.resume()

    def feed(self, data) -> None:
        if self.size < self.LIMIT:
            self.parts.append(bytes(data))
            self.size += len(data)

    def finish(self) -> None:
        self.finished(b"".join(self.parts))


class _Look:
    """One look at the ranks of a job (see :meth:`SrunRanks.look`)."""

    def __init__(self, sup: JobView, by_node: Dict[str, Dict[int, int]],
                 done: Callable[[Optional[Dict]], None], timeout: float) -> None:
        self.sup = sup
        self.by_node = by_node
        self.done: Optional[Callable[[Optional[Dict]], None]] = done
        self.got: Dict[str, Any] = {}
        self.waiting = set(by_node)
        self.proc: Optional[subprocess.Popen] = None
        self.pipes: List[RankPipe] = []
        self.timer = sup.loop.call_later(timeout, self.finish)

    def connected(self, node: str):
        def answer(sock, rest: bytes, about: str) -> None:
            sink = _Answer(lambda data: self.answered(node, data))
            if rest:
                sink.feed(rest)
            self.pipes.append(RankPipe(self.sup.loop, sock.detach(), sink))
        return answer

    def answered(self, node: str, data: bytes) -> None:
        import json
        try:
            rows = json.loads(data)
        except ValueError:
            rows = {}
        mine = self.by_node[node]        # a node speaks for its own ranks only
        if isinstance(rows, dict):
            self.got.update({k: v for k, v in rows.items()
                             if k.isdigit() and int(k) in mine and isinstance(v, dict)})
        self.waiting.discard(node)
        if not self.waiting:
            self.finish()

    def finish(self) -> None:
        done, self.done = self.done, None
        if done is None:
            return
        self.timer.cancel()
        done(self.got)

    @property
    def over(self) -> bool:
        return self.done is None and (self.proc is None or self.proc.poll() is not None)

    def close(self) -> None:
        self.finish()
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                pass
            self.proc.wait()
        for pipe in self.pipes:
            if not pipe.closed:
                pipe.close()


def _spawn(argv: Sequence[str], env: Dict[str, str], stdin: Optional[str], out: int) -> int:
    """Start srun in a session of its own (a Ctrl-C at the terminal reaches only
    mslaunch), its stdout and stderr into ``out``, its stdin mslaunch's or the
    file ``stdin``; its pid.  ``posix_spawn`` spares the import of subprocess."""
    path = exec_path(argv[0], env)
    if path is None:
        raise FileNotFoundError(2, "srun is not on PATH")
    actions: List[tuple] = [(os.POSIX_SPAWN_DUP2, out, 1), (os.POSIX_SPAWN_DUP2, out, 2)]
    if stdin is not None:
        actions.insert(0, (os.POSIX_SPAWN_OPEN, 0, stdin, os.O_RDONLY, 0))
    return os.posix_spawn(path, list(argv), env, setsid=True, setsigdef=RESET_SIGNALS,
                          file_actions=actions)


class SrunHooks:
    """The srun mode's hooks into the supervisor (:class:`~.seams.ModeHooks`):
    one handle for every rank of the plan, remote ones included."""

    restarts = 0
    takes_all = True

    def local_handle(self, sup: JobView, specs: Sequence[RankSpec]) -> Optional[RankHandle]:
        return SrunRanks(sup, specs)

    def started(self, pids: Dict[str, int]) -> None:
        pass

    def failed(self, code: int, message: str) -> None:
        pass

    def finished(self, code: int) -> None:
        pass
