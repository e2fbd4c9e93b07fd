"""Open MPI-backed mode (``--mpi openmpi``): the job runs under Open MPI's mpirun.

The user's own Open MPI ``mpirun``, 4.x or 5.x (:mod:`.ompifind` says which
and why), is given mslaunch's options in its own spellings (:mod:`.ompiargs`),
and each rank runs under :mod:`mslaunch.rankenv`, which exports ``RANK_ID``,
``RANK_SIZE`` and the other rank variables before the program starts.  The
program keeps its own MPI library; when that is not the mpirun's major version
(seen in the file Open MPI writes in ``MPI_Init``, :class:`WorldProbe`), one
line says so, and an Open MPI 4 program under Open MPI 5's mpirun, whose ranks
would each run alone, is stopped.

mpirun runs under the common supervisor (:mod:`mslaunch.run.supervise`), as the job's one
process behind the rank-handle seam (:class:`MpirunHandle`, the one handle of
:class:`MpirunBackend`), so that the watchdog, signal forwarding, ``--timeout``
(exit 110) and the grace period are the default mode's.  mslaunch also keeps
Open MPI 4's output layout: with ``--output-filename``, ``--tag-output`` or
``--timestamp-output`` it asks mpirun to tag every line and writes
``DIR/1/rank.N/{stdout,stderr}`` and the terminal copy itself.
"""

from __future__ import annotations

import os
import re
import signal
import sys

from ...core.errors import LaunchError
from ...plan import log_paths
from ...machine.child import ProcessHandle
from ...machine.output import RankPipe, line_prefix
from ...machine.spawn import exec_path
from ...machine.osfiles import check_dirs, open_own
from ...machine.trees import remove_tree
from ...mpi.pmi.files import probe_path
from ...core.spec import Host, JobResult, JobSpec, Plan, RankSpec
from ...core.states import SIGNAL
from .ompiargs import build_command, rendezvous_env
from .ompifind import OpenMPI, find_mpirun
from .ompiworld import WorldProbe, world_probe
from ..backend import Backend

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Container, Dict, List, Mapping, Optional, Sequence, Tuple

    from ...machine.terminal import Console
    from ...core.cputopo import Topology
    from ...core.spec import HostEntry
    from ...core.states import BackendName, Ending
    from ..backend import Planning
    from ...machine.local import PMIEnv
    from ...seams import RankEvents, RankHandle
    from ..backend import LaunchView
    from ..session import Session


_TAG = re.compile(rb"\[\d+,(\d+)\]<(stdout|stderr)>: ?")


class _Demux:
    """Splits mpirun's tagged lines (``[1,N]<stdout>: text``) by rank and stream."""

    def __init__(self, job: JobSpec, console: Console) -> None:
        self.job = job
        self.console = console
        self.files: Dict[Tuple[int, int], int] = {}
        self.prefixes: Dict[Tuple[int, int], object] = {}
        size = sum(a.np or 0 for a in job.apps)
        if all(a.np for a in job.apps):
            for rank in range(size):   # Open MPI 4 creates them even when empty
                for stream in (1, 2):
                    self._file(rank, stream)

    def _file(self, rank: int, stream: int) -> Optional[int]:
        out = self.job.output
        if out.directory is None:
            return None
        key = (rank, 1 if out.merge_stderr else stream)
        if key not in self.files:
            # Open MPI 4 pads rank numbers to the width of np-1; the size is
            # only known to mpirun, so the width comes from the -n given.
            size = sum(a.np or 0 for a in self.job.apps) or rank + 1
            paths = log_paths(out.directory, out.jobid_dir, out.merge_stderr, rank, size)
            path = paths[0] if key[1] == 1 else paths[1]
            assert path is not None           # a directory was given: both are paths
            os.makedirs(os.path.dirname(path), exist_ok=True)
            check_dirs(os.path.dirname(path))
            self.files[key] = open_own(path)
        return self.files[key]

    def line(self, stream: int, raw: bytes) -> None:
        """One line of mpirun's output: ``[1,N]<stdout>: text`` pieces, or its own."""
        ends = raw.endswith(b"\n")
        text = raw[:-1] if ends else raw
        tags = list(_TAG.finditer(text))
        if not tags:
            self.console.write(stream, self, raw)      # mpirun's own messages
            return
        if tags[0].start():
            self.console.write(stream, self, text[:tags[0].start()])
        # Open MPI puts a rank's unfinished last line and the next rank's
        # tagged line on one line: every piece but the last had no newline.
        for i, tag in enumerate(tags):
            last = i + 1 == len(tags)
            body = text[tag.end():len(text) if last else tags[i + 1].start()]
            self._emit(int(tag.group(1)), 1 if tag.group(2) == b"stdout" else 2,
                       body + (b"\n" if last and ends else b""))

    def _emit(self, rank: int, tagged_stream: int, data: bytes) -> None:
        fd = self._file(rank, tagged_stream)
        if fd is not None:
            os.write(fd, data)
        out = self.job.output
        if not out.copy_to_terminal:
            return
        key = (rank, tagged_stream)
        if key not in self.prefixes:
            self.prefixes[key] = line_prefix(rank, "stdout" if tagged_stream == 1 else "stderr",
                                             tag=out.tag, timestamp=out.timestamp,
                                             rank_prefix=out.rank_prefix)
        prefix = self.prefixes[key]
        target = 1 if out.merge_stderr else tagged_stream
        self.console.write(target, key, (prefix() if prefix else b"") + data)  # type: ignore[operator]

    def close(self) -> None:
        for fd in self.files.values():
            os.close(fd)


class _Lines:
    """One stream of mpirun's (1: stdout, 2: stderr) as a :class:`RankPipe`'s sink:
    whole lines to the demultiplexer, read no faster than the terminal takes them."""

    tail = b""
    wanted = True            # mpirun is read to its end, whoever still reads mslaunch

    def __init__(self, demux: _Demux, stream: int) -> None:
        self.demux = demux
        self.stream = stream
        self.pending = b""

    @property
    def congested(self) -> bool:
        return any(t.congested for t in self.demux.console.terminals())

    def wait_for_room(self, source) -> None:
        for t in self.demux.console.terminals():
            if t.congested:
                t.wait_for_room(source)
                return
        source.resume()

    def feed(self, data) -> None:
        *lines, self.pending = (self.pending + bytes(data)).split(b"\n")
        for line in lines:
            self.demux.line(self.stream, line + b"\n")

    def finish(self) -> None:
        if self.pending:
            pending, self.pending = self.pending, b""
            self.demux.line(self.stream, pending)


class MpirunHandle(ProcessHandle):
    """Open MPI's mpirun behind the rank-handle seam (:class:`~mslaunch.seams.RankHandle`):
    the job's one process as the supervisor sees it (key 0), in a session of its
    own (:class:`~mslaunch.machine.child.ProcessHandle`).  Signals go to mpirun,
    which passes them on to the ranks; SIGKILL goes to its process group."""

    ranks: Container[int] = (0,)
    #: Seconds between looks at what the ranks' MPI_Init wrote (:class:`WorldProbe`).
    PROBE_EVERY = 0.25

    def __init__(self, events: RankEvents, spec: RankSpec, demux: Optional[_Demux],
                 probe: Optional[WorldProbe] = None, stdin: bool = False,
                 by_name: bool = False) -> None:
        super().__init__(events.loop)
        self.events = events
        self.spec = spec
        self.demux = demux
        self.probe = probe
        self.stdin = stdin          # mpirun reads mslaunch's stdin
        self.by_name = by_name      # argv[0] is mpirun's name, not its path
        self.stopping = False       # the job is being stopped: no more looks

    def start(self) -> None:
        reads: List[Tuple[int, int]] = []
        out: Tuple[Optional[int], Optional[int]] = (None, None)
        if self.demux is not None:         # else mslaunch's own stdout and stderr
            r1, w1 = os.pipe()
            r2, w2 = os.pipe()
            reads, out = [(r1, 1), (r2, 2)], (w1, w2)
        null = None if self.stdin else os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        spec = self.spec
        try:
            argv = list(spec.argv)
            if self.by_name:
                argv[0] = os.path.basename(argv[0])
            path = exec_path(spec.argv[0], spec.env)
            if path is None:
                raise FileNotFoundError(2, "No such file or directory")
            pid = self._spawn(path, argv, spec.env, cwd=spec.cwd, stdin=null, out=out)
        except OSError as err:
            for fd, _ in reads:
                os.close(fd)
            raise LaunchError(f"cannot start Open MPI's mpirun: {err.strerror or err}") from None
        finally:
            for end in (*out, null):
                if end is not None:
                    os.close(end)
        self._watch(pid, self.events.watchdog)
        self.pipes = [RankPipe(self.loop, fd, _Lines(self.demux, stream))  # type: ignore[arg-type]
                      for fd, stream in reads]
        self.events.rank_started(0, pid)
        if self.probe is not None:
            self.loop.call_later(self.PROBE_EVERY, self._watch_world)

    def _watch_world(self) -> None:
        probe = self.probe
        if self.watched and not self.stopping and probe is not None and not probe.done:
            self._check_world()
            self.loop.call_later(self.PROBE_EVERY, self._watch_world)

    def _check_world(self) -> None:
        """Say so when the program's Open MPI is not the mpirun's (:class:`WorldProbe`);
        stop the job when its ranks run alone."""
        probe = self.probe
        verdict = probe.check() if probe is not None else None
        if probe is None or verdict is None:
            return
        message, stop = verdict
        if stop or not probe.quiet:
            self.events.say(f"mslaunch: {message}")
        if stop:
            self.events.rank_refused(0, message)

    def _on_exit(self) -> None:
        self._forget_pidfd()
        self._reap(block=True)
        self._check_world()        # ranks that ended before a look
        self.events.rank_exited(0, *self.ended_as)

    def signal(self, sig: int, ranks: Optional[Sequence[int]] = None) -> None:
        """``sig`` to mpirun, SIGKILL to its process group; nothing once it is reaped.
        Once it is being stopped, the ranks' Open MPI is looked at no more."""
        if sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGKILL):
            self.stopping = True
        self._kill(sig, group=sig == signal.SIGKILL)

    def release(self) -> None:
        """The job is over; nothing to tell anyone (see :meth:`close`)."""

    def close(self, deadline: float) -> None:
        """Outside the loop: mpirun gets until ``deadline`` to end after a SIGTERM.
        The watchdog's sweep, when it is closed, stops whatever mpirun left behind."""
        self._end(deadline)
        self._finish_pipes()
        if self.demux is not None:
            self.demux.close()


class MpirunBackend(Backend):
    """``--mpi openmpi`` (see the module docstring): the job's one process is Open
    MPI's mpirun (:class:`MpirunHandle`), which starts and reports the ranks."""

    name: BackendName = "mpirun"
    serves_pmi = False          # mpirun serves its ranks PMIx itself
    this_machine = False
    reports_itself = True

    def __init__(self, job: JobSpec, environ: Mapping[str, str], session: Session,
                 planning: Planning) -> None:
        super().__init__(job, environ, session, planning)
        self.base: Optional[str] = None
        self.plan: Optional[Plan] = None
        self.probe: Optional[WorldProbe] = None
        self.ompi: Optional[OpenMPI] = None
        self.stdin = False
        self._said = False
        self.planning = _MpirunPlanning(self)

    def begin(self) -> None:
        job = self.job
        # mpirun's session directory goes in one of mslaunch's own, removed when the
        # job ends, and by the guard should mslaunch die: mpirun killed (a second
        # Ctrl-C, the grace period's end) leaves its own behind.
        self.base = probe_path(self.session.guard.marker)
        try:
            os.mkdir(self.base, 0o700)
        except OSError:
            self.base = None
        ompi = self._say_found()
        self.probe = world_probe(job, self.environ, ompi, self.base)
        self.stdin = forwards_stdin(job, ompi)
        if job.stdin == "all" and not job.quiet:
            sys.stderr.write("mslaunch: --stdin all: Open MPI's mpirun hangs forwarding input "
                             "to every rank; the ranks get none (they read end-of-file)\n")

    def _say_found(self) -> OpenMPI:
        ompi = self._find()
        if self.job.verbose and not self._said:
            self._said = True
            sys.stderr.write(f"mslaunch: {ompi.describe()}\n")
        return ompi

    def _find(self) -> OpenMPI:
        if self.ompi is None:
            self.ompi = find_mpirun(self.environ)
        return self.ompi

    def _plan(self) -> Plan:
        if self.plan is None:
            from ...machine.rendezvous import free_port, master_port_of, ompi_jobid
            port = master_port_of(self.environ.get("MASTER_PORT")) or \
                free_port(self.job.port_range)
            self.plan = mpirun_plan(self.job, self.environ, port, ompi_jobid(port),
                                    self.session.guard.marker, self.base, self._say_found(),
                                    self.probe, self.stdin)
        return self.plan

    def here(self, plan: Plan) -> List[RankSpec]:
        return []

    def check(self, plan: Plan) -> None:
        """(mpirun was found; it says itself what it cannot start.)"""

    def handles(self, view: LaunchView, here: Sequence[RankSpec], pmi: object,
                pmi_env: Optional[PMIEnv]) -> List[RankHandle]:
        job, ompi = self.job, self._find()
        demux = _Demux(job, view.console) if _tagged(job) else None
        # Open MPI 4 started by its path takes that installation as a --prefix, and
        # given another one says so in a box of text: by name, as users type it.
        by_name = ompi.major < 5 and job.prefix is not None
        return [MpirunHandle(view.events, view.plan.ranks[0], demux, self.probe, self.stdin,
                             by_name)]

    def close(self) -> None:
        if self.base:
            remove_tree(self.base)

    def outcome(self, result: JobResult) -> JobResult:
        """mpirun's exit status is the job's (see :func:`exit_status`), and its
        report says no more: the ranks are mpirun's."""
        return JobResult(exit_code=exit_status(result, result.ending), ending=result.ending,
                         stop_signal=result.stop_signal)


def _marker() -> str:
    """The job's name for its guard and its ranks (``MSLAUNCH_JOB``)."""
    return f"ompi_{os.getpid()}_{os.urandom(4).hex()}"


class _MpirunPlanning:
    """The plan of a job that mpirun runs: mpirun itself, its one process; the hosts
    are mpirun's to read."""

    def __init__(self, backend: MpirunBackend) -> None:
        self.backend = backend

    @property
    def entries(self) -> Sequence[HostEntry]:
        return ()

    def plan(self, topologies: Optional[Dict[str, Topology]] = None) -> Plan:
        return self.backend._plan()


def forwards_stdin(job: JobSpec, ompi: OpenMPI) -> bool:
    """Whether mpirun gets mslaunch's stdin to forward to the ranks ``--stdin``
    names: Open MPI 4's, from a file or a pipe.  Open MPI 5.0's forwarding hangs
    as soon as a rank reads (see the README), and from a terminal mpirun, in a
    session of its own, would never read (it reads only in the foreground): the
    ranks then get none, and read end-of-file."""
    if ompi.major >= 5 or job.stdin in ("none", "all"):
        return False        # (4.1.4's forwarding to all ranks hangs too, measured)
    try:
        return not os.isatty(0)
    except OSError:
        return False


def _tagged(job: JobSpec) -> bool:
    """Whether mpirun tags its lines for mslaunch to split (:class:`_Demux`)."""
    out = job.output
    return bool(out.directory or out.tag or out.timestamp or out.rank_prefix)


def mpirun_plan(job: JobSpec, environ, master_port: int, jobid: int,
                marker: Optional[str] = None, session_base: Optional[str] = None,
                ompi: Optional[OpenMPI] = None, probe: Optional[WorldProbe] = None,
                stdin: bool = False) -> Plan:
    """The plan of ``job`` as mslaunch runs it: one process, Open MPI's mpirun
    (``ompi``; by default :func:`find_mpirun`'s; ``stdin``: see :func:`forwards_stdin`)."""
    marker = marker or _marker()
    ompi = ompi or find_mpirun(environ)
    rendezvous = rendezvous_env(job, environ, master_port, jobid, ompi.major)
    if probe is not None:
        rendezvous += probe.flags()
    cmd, extra_env = build_command(job, environ, ompi, marker, _tagged(job), rendezvous,
                                   session_base, stdin)
    env = dict(environ)
    env.update(extra_env)
    env["MSLAUNCH_JOB"] = env["MSLAUNCH_GUARD"] = marker
    here = Host(name=os.uname().nodename, slots=1, max_slots=None, local=True, node_id=0)
    mpirun = RankSpec(rank=0, app=0, host=here, local_rank=0, local_size=1, argv=tuple(cmd),
                      env=env, cwd=job.launch_dir, stdout_path=None, stderr_path=None,
                      label="Open MPI's mpirun")
    return Plan(ranks=(mpirun,), hosts=(here,), kvsname=marker, process_mapping="",
                universe_size=1, master_addr="", master_port=master_port, ompi_jobid=jobid)


def exit_status(result: JobResult, ending: Optional[Ending]) -> int:
    """mpirun's exit status is the job's -- but for ``--timeout``'s, and for a stop
    signal's 128+N when mpirun ends with a plain 0 or 1 (``ending``: the
    supervisor's)."""
    mpirun = result.ranks[0]
    if ending == SIGNAL and (mpirun.signal is not None
                               or mpirun.returncode not in (None, 0, 1)):
        return mpirun.exit_code
    return result.exit_code


__all__ = ["MpirunBackend", "build_command", "find_mpirun", "mpirun_plan", "exit_status"]
