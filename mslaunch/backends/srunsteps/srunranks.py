"""``--launcher srun``: srun starts the ranks themselves, with no agent of mslaunch's.

As Hydra's ``mpiexec -launcher slurm`` would if its proxy did nothing but
exec, one ``srun`` step runs every rank, each task on the node the plan
gives it (:func:`~mslaunch.backends.srunsteps.srun.srun_argv`).  A small bash program
(:func:`~mslaunch.backends.srunsteps.srun.task_program`) connects the task's stdout and
stderr to the launcher, token-checked, reads its rank's own variables from
the first connection once both are made, and becomes the rank's program:
output reaches the job's files and the terminal as from local ranks.  PMI
is mslaunch's own, over TCP (``PMI_PORT`` at the address srun ran from, a
secret ``PMI_ID`` per rank, and only from the addresses the job's tasks
connected from), so MPICH-ABI ranks get the default mode's PMI and failure
reports.

srun runs in a session of its own, behind the rank-handle seam
(:class:`SrunRanks`, the one handle of :class:`SrunStepsBackend`): each task's end,
with its exact wait status, is read from what ``srun -v`` says of it
(:class:`~mslaunch.backends.srunsteps.srun.SrunLog`).  Signals go to the step with
``scancel --signal``; SIGKILL is srun's own termination of the step, which
Slurm also does should srun die (mslaunch's orphan guard kills srun if
mslaunch dies).  Looks inside the ranks take a step of their own
(:mod:`.srunlook`).  Not served in this mode: PMIx (Open MPI's ranks),
spawn, binding, restarts (:func:`check_srun_job`).
"""

from __future__ import annotations

import os
from ...core import signal
import time

from ...core.errors import LaunchError, UsageError
from ...machine.child import ProcessHandle
from ...machine.output import RankPipe
from ...machine.spawn import exec_path
from .srun import (
    SHELL_STARTUP,
    TASK_VARIABLE,
    SrunLog,
    rank_script,
    split_env,
    srun_argv,
    task_program,
    variable_problem,
)
from ...core.spec import scrub_env
from ..backend import Backend

#: Seconds a rank's connection may stay idle after srun's end (see SrunRanks._on_exit).
OUTPUT_AFTER_END = 2.0
#: Seconds a task that made one of its two connections waits for the other.
HALF_SECONDS = 10.0

TYPE_CHECKING = False
if TYPE_CHECKING:
    import subprocess
    from typing import (Any, Callable, Container, Dict, List, Mapping, Optional, Sequence,
                        Set, Tuple)

    from ...wire.dialback import Listener
    from ...core.spec import JobSpec, Plan, RankSpec
    from ...core.states import BackendName
    from ..backend import Planning
    from ...mpi.pmi.job import PMIJob
    from ...machine.local import PMIEnv
    from ...seams import RankEvents, RankHandle
    from ..backend import LaunchView
    from ..session import Session
    from .srunlook import Look


class _Log:
    """srun's stderr as a :class:`RankPipe`'s sink: whole lines to the handle."""

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


def srun_environment(specs: Sequence[RankSpec], pmi: Sequence[Mapping[str, str]],
                     environ: Mapping[str, str]) -> Tuple[Dict[str, str], List[Dict[str, str]]]:
    """srun's environment (the launcher's, scrubbed of an outer launch's
    variables, and what every rank has alike) and each rank's own variables."""
    envs = [dict(s.env, **p) for s, p in zip(specs, pmi)]
    common, own = split_env(envs)
    env = scrub_env(environ)
    env.update(common)
    for name in SHELL_STARTUP:      # not for the task's own bash
        value = env.pop(name, None)
        if value is not None and name == "BASH_ENV":
            for mine in own:
                mine.setdefault(name, value)
    return env, own


class SrunRanks(ProcessHandle):
    """Every rank of the job, as one srun step (see the module docstring), srun a
    :class:`~mslaunch.machine.child.ProcessHandle`."""

    def __init__(self, events: RankEvents, job: JobSpec, specs: Sequence[RankSpec],
                 pmi: Optional[PMIJob] = None, process_mapping: str = "") -> None:
        super().__init__(events.loop)
        self.events = events
        self.job = job
        self.specs = list(specs)
        self.ranks: Container[int] = frozenset(s.key for s in specs)
        self.pmi, self.process_mapping = pmi, process_mapping   # the job's PMI, if any
        self.pids: Dict[int, int] = {}    # of the ranks started, by key
        self.ended: Set[int] = set()      # the keys of the ranks whose end was reported
        self.rank_of: Dict[Any, int] = {}   # the rank whose output a sink takes
        self.log = SrunLog(show_all=job.verbose >= 2)
        self.listener: Optional[Listener] = None
        self.scripts: List[bytes] = []
        # connections of a task, by stream ("o", "e"), until it has all it makes
        self.half: Dict[int, Dict[str, Tuple[Any, bytes, str]]] = {}
        self.hosts: Set[str] = set()      # addresses the tasks connected from
        self._scancels: List[subprocess.Popen] = []
        self._looks: List[Look] = []
        self._ending: Optional[Look] = None      # the step ending refused singletons
        self._seen: Dict[RankPipe, int] = {}     # bytes read, at the last look after srun

    # -- start --------------------------------------------------------------
    def start(self) -> None:
        specs = self.specs
        merged = self.job.output.merge_stderr
        self.listener = listener = self._listen()
        port = listener.socks[0].getsockname()[1]
        secret = os.urandom(12).hex()
        pmi, pmi_port = self._serve_pmi()
        env, own = srun_environment(specs, pmi, os.environ)
        same_argv = all(s.argv == specs[0].argv for s in specs)
        for task, spec in enumerate(specs):
            # (the directory also when srun's --chdir is the same: a missing one
            # would be slurmstepd's /tmp instead)
            self.scripts.append(rank_script(own[task], None if same_argv else spec.argv,
                                            spec.cwd, pmi_port, spec.label or
                                            f"rank {spec.rank}"))
            for stream in ("o",) if merged else ("o", "e"):
                listener.expect(f"{secret}{task}{stream}", self._dialled(task, stream),
                                plain=True)
        env[TASK_VARIABLE] = task_program(secret, port, merged)
        stdin = self._stdin()
        argv = srun_argv([s.host.name for s in specs], len(specs), stdin,
                         specs[0].cwd, specs[0].argv if same_argv else ())
        path = exec_path(argv[0], env)
        r, w = os.pipe()
        null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC) if stdin == "none" else None
        try:
            if path is None:
                raise FileNotFoundError(2, "srun is not on PATH")
            pid = self._spawn(path, argv, env, stdin=null, out=(w, w))
        except OSError as err:
            os.close(r)
            raise LaunchError(f"--launcher srun: cannot start srun: "
                              f"{err.strerror or err}") from None
        finally:
            for end in (w, null):
                if end is not None:
                    os.close(end)
        self._watch(pid, self.events.watchdog)
        self.pipes.append(RankPipe(self.loop, r, _Log(self)))

    def _serve_pmi(self) -> Tuple[List[Dict[str, str]], Optional[int]]:
        """Each rank's PMI variables (but ``PMI_PORT``, which its script sets to
        srun's address) and the port; none for a job without PMI."""
        specs, first, job = self.specs, self.pmi, self.job
        if first is None:
            return [{} for _ in specs], None
        first.serve(self.loop, [s.app for s in specs], self.process_mapping, tcp=True,
                    trace=job.verbose >= 2, port_range=job.port_range,
                    tcp_host="0.0.0.0", admit=self.hosts.__contains__)
        envs = [first.env(spec.rank, spec.env) for spec in specs]
        ports = {int(e.pop("PMI_PORT").rpartition(":")[2]) for e in envs}
        return envs, ports.pop() if ports else None

    def _listen(self) -> Listener:
        from ...wire.dialback import Listener
        listener = Listener(self.loop, ["::"], tls=False, log=self.events.log,
                            port_range=self.job.port_range)
        if not listener.socks:        # no IPv6 here
            listener = Listener(self.loop, ["0.0.0.0"], tls=False, log=self.events.log,
                                port_range=self.job.port_range)
        if not listener.socks:
            raise LaunchError("--launcher srun: cannot listen for the ranks' output")
        return listener

    def _stdin(self) -> str:
        """The tasks srun gives its stdin (mpirun's default: rank 0; ``all``), or
        ``none`` (a terminal: srun, in a session of its own, could not read it)."""
        which = self.job.stdin
        if which != "all" and (not which.isdigit() or int(which) >= len(self.specs)):
            return "none"
        try:
            return "none" if os.isatty(0) else which
        except OSError:
            return "none"

    def _dialled(self, task: int, stream: str):
        def connected(sock, rest: bytes, about: str) -> None:
            if self.status is not None:       # srun has ended: the task with it
                sock.close()
                return
            got = self.half.setdefault(task, {})
            got[stream] = (sock, rest, about)
            if len(got) == (1 if self.job.output.merge_stderr else 2):
                del self.half[task]
                self._attach(task, got)
            elif len(got) == 1:
                self.loop.call_later(HALF_SECONDS, lambda: self._give_up_half(task, got))
        return connected

    def _give_up_half(self, task: int, got: Dict[str, Tuple[Any, bytes, str]]) -> None:
        """A task's other connection never came (the listener closed it unproven,
        on a crowded start): closing this one ends the task (exit 126), which srun
        reports, instead of leaving it waiting for its script."""
        if self.half.get(task) is got:
            del self.half[task]
            for sock, _, _ in got.values():
                sock.close()

    def _attach(self, task: int, got: Dict[str, Tuple[Any, bytes, str]]) -> None:
        """Both connections of a task are made: send its script; its program
        runs, and its output is read, from now on."""
        sock, _, about = got["o"]
        script, self.scripts[task] = self.scripts[task], b""
        try:
            peer = sock.getpeername()[0]
            # A fresh connection's buffer takes the few KB at once.
            sock.setblocking(True)
            sock.sendall(script)
            sock.setblocking(False)
        except OSError:          # the task is gone already: srun says how
            for s, _, _ in got.values():
                s.close()
            return
        self.hosts.add(peer[7:] if peer.startswith("::ffff:") else peer)
        spec = self.specs[task]
        out, err = self.events.make_sinks(spec)
        pid = self.pids[spec.key] = int(about) if about.isdigit() else 0
        self.events.rank_started(spec.key, pid)
        for stream, sink in (("o", out), ("e", err)):
            if sink is not None:
                self.rank_of[sink] = spec.rank
            if stream in got and sink is not None:
                s, rest, _ = got[stream]
                if rest:
                    sink.feed(rest)
                self.pipes.append(RankPipe(self.loop, s.detach(), sink))

    def add(self, specs: Sequence[RankSpec], pmi=None, pmi_env=None) -> None:
        """Processes spawned here: never (srun started this job's ranks)."""
        raise LaunchError("--launcher srun starts no process after the job's own ranks "
                          "(MPI_Comm_spawn needs mslaunch's agents: --launcher slurm)")

    # -- srun's reports -----------------------------------------------------
    def srun_said(self, line: str) -> None:
        shown = self.log.line(line)
        if shown is not None:
            self.events.say(shown)
        for task, code, sig in self.log.take():
            if 0 <= task < len(self.specs):
                key = self.specs[task].key
                if key not in self.ended:
                    self.ended.add(key)
                    self.events.rank_exited(key, code, sig)

    def _on_exit(self) -> None:
        self._forget_pidfd()
        self._reap(block=True)
        for pipe in self.pipes[:1]:       # srun's own lines first
            if not pipe.closed:
                pipe.drain()
        self._drop_halves()
        # A connection that stays open, idle, after srun's end is held by a
        # process a rank left behind (which Slurm's proctrack/linuxproc does not
        # end): it would keep the job for ever.  One that still brings bytes (a
        # rank's last output, slowed by a slow reader of mslaunch's) is read on.
        self.loop.call_later(OUTPUT_AFTER_END, self._cut_output)
        left = [s.key for s in self.specs if s.key not in self.ended]
        if left and self.status is not None:
            how = (f"killed by signal {os.WTERMSIG(self.status)}" if os.WIFSIGNALED(self.status)
                   else f"exit code {os.WEXITSTATUS(self.status)}")
            self.ended.update(left)
            self.events.ranks_lost(left, f"srun ended ({how}) without reporting their end")

    def _cut_output(self, idle_only: bool = True) -> None:
        """Stop reading the ranks' connections still open after srun's end that
        have brought nothing for :data:`OUTPUT_AFTER_END` seconds and are not
        waiting for room (``idle_only``; else all of them); look again later
        while some stay (see :meth:`_on_exit`)."""
        held, busy = set(), False
        for pipe in self.pipes[1:]:
            if pipe.closed:
                continue
            written = pipe.sink.written           # type: ignore[attr-defined]
            if idle_only and (pipe.paused or self._seen.get(pipe) != written):
                self._seen[pipe] = written         # still coming, or held back by us
                busy = True
            elif not pipe.drain():
                pipe.close()
                held.add(pipe.sink)
        if held:
            ranks = sorted({self.rank_of[sink] for sink in held if sink in self.rank_of})
            more = f" and {len(ranks) - 8} more" if len(ranks) > 8 else ""
            self.events.log(f"the output of rank(s) {', '.join(map(str, ranks[:8]))}{more} "
                            f"stayed open after srun's end, held by processes they left "
                            f"behind: no longer read")
        if busy:
            self.loop.call_later(OUTPUT_AFTER_END, self._cut_output)

    def _drop_halves(self) -> None:
        """Tasks that made one connection of two: gone, with nothing run."""
        for got in self.half.values():
            for sock, _, _ in got.values():
                sock.close()
        self.half.clear()

    # -- looking inside ---------------------------------------------------------
    def look(self, kind: int, body: Dict[str, Any], done: Callable[[Optional[Dict]], None]
             ) -> bool:
        """Ask a step of its own (:mod:`.srunlook`) for the running ranks' stacks
        (``link.STACKS``) or usage (``link.TOP``); ``done(ranks)`` once every
        node answered or the look's time is over."""
        from ...wire import link
        return self._step("top" if kind == link.TOP else "stacks",
                          float(body.get("timeout", 10.0)), done) is not None

    def end_singletons(self) -> None:
        """The job is refused for Open MPI singletons: a step of its own stops the
        running ranks as an agent would, noting what their Open MPI processes
        make (segments in /dev/shm, session directories), and removes it once
        they are gone.  The job's own SIGTERM is left to it (see :meth:`signal`)."""
        self._ending = self._step("singletons", self.job.grace, lambda rows: None)

    def _step(self, op: str, timeout: float, done: Callable[[Optional[Dict]], None]
              ) -> Optional[Look]:
        from .srunlook import start_look
        listener = self.listener
        if not self.watched or listener is None:
            return None
        by_node: Dict[str, Dict[int, int]] = {}
        for spec in self.specs:
            pid = self.pids.get(spec.key)
            if pid and spec.key not in self.ended:
                by_node.setdefault(spec.host.name, {})[spec.key] = pid
        if not by_node:
            return None
        for old in [x for x in self._looks if x.over and x is not self._ending]:
            old.close()
            self._looks.remove(old)
        look = start_look(self.loop, listener, op, by_node, timeout, done)
        if look is not None:
            self._looks.append(look)
        return look

    # -- the rest of the seam -------------------------------------------------
    def signal(self, sig: int, ranks: Optional[Sequence[int]] = None) -> None:
        """``sig`` to every task of the step (Slurm signals a step, not a task);
        SIGKILL: srun ends the step, as on SIGTERM."""
        self._scancels = [p for p in self._scancels if p.poll() is None]
        if sig == signal.SIGKILL and self.status is not None:
            self._cut_output(idle_only=False)     # the stop's last step: read no more
        if not self.pid or self.status is not None or sig == signal.SIGCONT:
            return            # (nothing of mslaunch's stops a task: nothing to continue)
        if sig == signal.SIGTERM and self._ending is not None:
            return            # the singletons' step sends it, once it has noted their files
        if sig == signal.SIGKILL or self.log.step is None:
            self._kill(signal.SIGTERM if sig in (signal.SIGKILL, signal.SIGTERM) else sig)
            return
        import subprocess
        try:
            self._scancels.append(subprocess.Popen(
                ["scancel", "--quiet", f"--signal={sig}", self.log.step],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        except OSError:
            self._kill(signal.SIGTERM)

    def release(self) -> None:
        """Nothing to tell anyone (see :meth:`close`)."""

    def close(self, deadline: float) -> None:
        self._end(deadline)
        self._drop_halves()
        self._finish_pipes()
        for p in self._scancels:
            while p.poll() is None and time.monotonic() < deadline:
                time.sleep(0.02)
            if p.poll() is None:
                p.kill()
                p.wait()
        ending = self._ending.proc if self._ending is not None else None
        while ending is not None and ending.poll() is None and time.monotonic() < deadline + 3:
            time.sleep(0.02)          # it removes what the singletons left, then ends
        for look in self._looks:
            look.close()
        if self.listener is not None:
            self.listener.close()


def check_srun_job(job: JobSpec, plan: Plan, attempts: bool,
                   environ: Mapping[str, str]) -> None:
    """UsageError for what ``--launcher srun`` does not do (see the module docstring),
    LaunchError for a host outside the allocation."""
    from ...hosts.allocations.slurm import check_nodes
    ranks = plan.ranks
    check_nodes([r.host.name for r in ranks], environ, "srun")
    what = None
    if attempts:
        what = "--max-restarts and --health-check"
    elif any(r.cpus for r in ranks):
        what = "binding (--bind-to)"
    elif any(r.inherit == "none" for r in ranks):
        what = "-genvnone"
    elif any(r.path_prefix for r in ranks):
        what = "--prefix"
    elif any(r.search for r in ranks):
        what = "-path"
    elif any(r.session_dir for r in ranks):
        what = "--set-cwd-to-session-dir"
    elif any(r.program for r in ranks):
        what = "a program whose argv[0] is not its name (--index-argv-by-rank)"
    if what is not None:
        raise UsageError(f"--launcher srun: {what} needs mslaunch's agents; "
                         f"use --launcher slurm")
    _, own = split_env([r.env for r in ranks])
    for mine in own:
        for name, value in mine.items():
            problem = variable_problem(name, value)
            if problem:
                raise UsageError(f"--launcher srun: a rank's own variable: {problem}; "
                                 f"use --launcher slurm")


class SrunStepsBackend(Backend):
    """``--launcher srun`` (see the module docstring): one handle, srun's step, for
    every rank of the plan, remote ones included; none is this machine's process."""

    name: BackendName = "srun-steps"
    this_machine = False

    def __init__(self, job: JobSpec, environ: Mapping[str, str], session: Session,
                 planning: Planning) -> None:
        super().__init__(job, environ, session, planning)
        check_srun_job(job, planning.plan(), session.attempts, environ)
        self.handle: Optional[SrunRanks] = None

    def here(self, plan: Plan) -> List[RankSpec]:
        return []

    def check(self, plan: Plan) -> None:
        """(srun says itself which program or directory is missing, on its node.)"""

    def handles(self, view: LaunchView, here: Sequence[RankSpec], pmi: object,
                pmi_env: Optional[PMIEnv]) -> List[RankHandle]:
        first = view.mpi_jobs.first if view.mpi_jobs is not None else None
        self.handle = SrunRanks(view.events, view.job, view.plan.ranks, first,
                                view.plan.process_mapping)
        return [self.handle]

    def lookers(self) -> Dict[str, Any]:
        return {"srun": self.handle} if self.handle is not None else {}
