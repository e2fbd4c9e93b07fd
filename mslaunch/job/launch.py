"""Running a parsed job: hosts → plan → supervise → report.

This module holds the impure glue around the pure planner: it reads the
host sources, asks the machine for its core count, a free port and a unique
job name, then hands the plan to the supervisor (or to Open MPI's mpirun in
``--mpi openmpi`` mode) and prints the outcome.
"""

from __future__ import annotations

import os
import sys
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, List, Mapping, Optional, Tuple

from ..errors import LaunchError
from ..pmi.files import (
    GUARD_TASKS,
    after_launcher_death,
    new_kvsname,
    public_id,
    sessions_at_death,
)
from ..plan import agent_hosts
from ..spec import JobSpec, Plan, replace


def free_port(port_range: Optional[Tuple[int, int]] = None) -> int:
    """A TCP port that is free on this machine now (for MASTER_PORT), of
    ``port_range`` if given (LaunchError when none of it is free)."""
    if port_range is not None:
        from ..machine.ports import free_port_in
        return free_port_in(port_range)
    import _socket  # the full socket module costs milliseconds at start-up
    # Below the kernel's range for the local ends of connections: rank 0 binds it on
    # its own host, where any connection (an agent's, a PMIx door's) could hold a
    # port of that range (a job's restart once failed so, EADDRINUSE on a remote host).
    low = _ephemeral_low()
    for _ in range(32 if low > 11000 else 0):
        port = 10000 + int.from_bytes(os.urandom(2), "big") % (low - 10000)
        s = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
        try:
            s.bind(("", port))
            return port
        except OSError:
            continue
        finally:
            s.close()
    s = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
    try:
        s.bind(("", 0))
        return s.getsockname()[1]
    finally:
        s.close()


def _ephemeral_low() -> int:
    """The first port of the kernel's range for the local ends of connections."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", "rb") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def ompi_jobid(avoid: int) -> int:
    """An Open MPI job id whose port for jax's coordinator (see
    :func:`..plan.coordinator_port`) is free on this machine now.

    Open MPI's own ids are ``family << 16``, so jax derives one of 256
    ports, 16 apart; mslaunch picks its id the same way, but only a family
    whose port is free (and is not ``avoid``, the job's MASTER_PORT)."""
    import _socket
    from ..plan import coordinator_port
    start = os.urandom(1)[0]
    for i in range(256):
        family = (start + i) % 256
        port = coordinator_port(family << 16)
        if port == avoid:
            continue
        s = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
        try:
            s.bind(("", port))
            return family << 16
        except OSError:
            continue
        finally:
            s.close()
    return start << 16       # none free: jax reports the port it cannot bind


def control_listener(directory: str, name: str):
    """A listening Unix socket ``directory/name`` (no TCP port: only processes that
    may enter this user's private directory can connect); None if it cannot be made."""
    import _socket
    path = os.path.join(directory, name)
    try:
        os.unlink(path)              # a dead launcher's of the same pid
    except OSError:
        pass
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    # Bound under another name and renamed once it listens: a client that finds the
    # path bound but not yet listening is refused, takes it for a dead launcher's
    # and removes it (mslaunch-stacks then found "no running job" for good).
    part = f"{path}.new"
    try:
        try:
            os.unlink(part)
        except OSError:
            pass
        sock.bind(part)
        sock.listen(16)
        os.rename(part, path)
    except OSError:
        sock.close()
        try:
            os.unlink(part)
        except OSError:
            pass
        return None
    sock.setblocking(False)
    return sock, path


def open_control(watchdog) -> Optional[Tuple[object, str]]:
    """The job's control socket ``PID.sock`` (mslaunch-stacks, mslaunch-top), which
    the guard removes should this process die; None if it cannot be made."""
    from ..machine.procs import in_private, sweep_private

    def listen(where: str) -> Optional[Tuple[object, str]]:
        sweep_private(where)
        return control_listener(where, f"{os.getpid()}.sock")

    made = in_private(listen)
    if made is not None:
        watchdog.private(made[1])
    return made


def _master_port(text: Optional[str]) -> Optional[int]:
    """``MASTER_PORT`` from the environment, checked; None when unset or empty."""
    if not text:
        return None
    if text.isascii() and text.isdigit() and 1 <= int(text) <= 65535:
        return int(text)
    from ..errors import UsageError
    raise UsageError(f"MASTER_PORT={text[:20]!r} in the environment is not a port number "
                     f"(1-65535)")


def build_plan(job: JobSpec, environ: Optional[Mapping[str, str]] = None, *,
               entries=None, kvsname: Optional[str] = None, master_port: Optional[int] = None,
               remote_topologies=None, jobid: Optional[int] = None) -> Plan:
    """The job's plan; planned again with the remote hosts' real topologies, it
    keeps the first plan's ``kvsname``, ``master_port`` and Open MPI job id."""
    from ..machine.topology import cached_topology
    from ..plan import make_plan
    environ = os.environ if environ is None else environ
    if entries is None:
        from ..hosts import host_entries
        entries = host_entries(job, environ)
    if master_port is None:
        master_port = _master_port(environ.get("MASTER_PORT")) or free_port(job.port_range)
    if jobid is None:
        jobid = ompi_jobid(master_port)
    return make_plan(job, entries, environ, topology=cached_topology(),
                     hostname=os.uname().nodename, kvsname=kvsname or new_kvsname(),
                     master_port=master_port, remote_topologies=remote_topologies,
                     ompi_jobid=jobid)


def _needs_topologies(job: JobSpec, entries) -> bool:
    """Whether a plan depends on what the remote hosts' agents report (their cpus)."""
    from ..hosts import is_local
    counts_missing = any(e.slots is None and e.max_slots is None and not is_local(e.name)
                         for e in entries)
    return counts_missing or job.map_by not in ("slot", "node") or bool(
        job.ppr or job.pe or job.bind_to != "none" or job.use_hwthreads or job.rankfile
        or job.report_bindings or job.rank_by not in (None, "slot", "node"))


def _warn_missing_exports(job: JobSpec, environ: Mapping[str, str]) -> None:
    pairs = list(job.global_env) + [p for app in job.apps for p in app.env]
    for name, value in pairs:
        if value is None and name not in environ and not job.quiet:
            sys.stderr.write(f"mslaunch: warning: -x {name}: not set in the environment; "
                             f"not exported\n")


def describe_plan(plan: Plan, job: JobSpec) -> str:
    import shlex

    from ..plan import describe_map
    lines = [describe_map(plan)]
    for r in plan.ranks:
        logs = ""
        if r.stdout_path:
            logs = f"  > {r.stdout_path}" + (f"  2> {r.stderr_path}" if r.stderr_path else "")
        lines.append(f"rank {r.rank} on {r.host.name} in {r.cwd}: "
                     f"{' '.join(shlex.quote(a) for a in r.argv)}{logs}")
    return "\n".join(lines) + "\n"


def run_job(job: JobSpec) -> int:
    """Run ``job`` and return mslaunch's exit status (and write its report, if asked)."""
    if job.report_json is None or job.dry_run:
        return _run_job(job)
    import time
    from . import jobreport
    jobreport.check_writable(job.report_json)
    started = time.time()
    try:
        code = _run_job(job, started)
    except LaunchError as err:
        try:
            jobreport.write(job.report_json, jobreport.build(None, started, error=str(err),
                                                             exit_code=err.exit_code))
        except LaunchError as failed:      # the job's own error stays the news
            sys.stderr.write(f"mslaunch: error: {failed}\n")
        raise
    if job.mpi == "openmpi":       # its ranks are mpirun's: the job's outcome only
        from ..spec import JobResult
        jobreport.write(job.report_json, jobreport.build(JobResult(exit_code=code), started))
    return code


def _run_job(job: JobSpec, started: float = 0.0) -> int:
    environ = os.environ
    if job.mpi == "openmpi":
        from .openmpi import run_openmpi
        port = _master_port(environ.get("MASTER_PORT")) or free_port(job.port_range)
        return run_openmpi(job, port, ompi_jobid(port))
    if job.dry_run:
        sys.stdout.write(describe_plan(build_plan(job, environ), job))
        return 0
    # The orphan guard first (a small fork, before more is imported), so that
    # it settles into the job's cgroup while the job is planned.
    from ..machine.guard import Watchdog
    kvsname = new_kvsname()
    watchdog = Watchdog(public_id(kvsname), job.grace, background=True, tasks=GUARD_TASKS,
                        on_death=after_launcher_death, on_stop=sessions_at_death)
    try:
        return _run(job, environ, watchdog, kvsname, started)
    finally:
        watchdog.close()      # after an error before the supervisor took it over


def _run(job: JobSpec, environ, watchdog, kvsname: str, started: float) -> int:
    from ..hosts import host_entries
    entries = host_entries(job, environ)
    _warn_missing_exports(job, environ)
    console = _xml_console(job)
    try:
        if not job.max_job_restarts and not job.health_check:
            result = _attempt(job, environ, entries, watchdog, kvsname, console)[0]
        else:
            result = _attempts(job, environ, entries, watchdog, kvsname, console)
        return _finish(job, result, console, started)
    finally:
        if console is not None:
            console.close()


def _attempts(job: JobSpec, environ, entries, watchdog, kvsname: str, console):
    """The job run with ``--max-restarts`` (see :mod:`.attempts`): each attempt
    with a job name and an orphan guard of its own."""
    from .attempts import AttemptOutcome, ends_for_restart, run_attempts
    from .keptagents import KeptAgents
    first = [kvsname]
    # One console for every attempt: a line one attempt left unfinished is ended
    # before the next one's first (each supervisor's own would not know of it).
    own_console = console is None
    if console is None:
        from ..machine.terminal import Console
        console = Console()
    shown: List = [console]
    # What the attempts share (see Supervisor): the PMIx server, the agents kept
    # between attempts, and whether the attempt running may be followed by another.
    follows = {"health": False, "restarts_left": False}
    kept = KeptAgents()
    from ..remote.endpoint import HEARTBEAT, RESTART_HEARTBEAT, heartbeat_setting
    kept.heartbeat = heartbeat_setting(environ.get("MSLAUNCH_HEARTBEAT"),
                                       RESTART_HEARTBEAT if job.max_job_restarts else HEARTBEAT)
    carry: Dict[str, Any] = {"agents": kept, "again": lambda sup: (
        (sup.stop_signal is None and follows["health"])
        or (follows["restarts_left"] and ends_for_restart(sup.ending, sup.stop_signal)))}

    def guarded(run):
        # One guard, and so one cgroup, for every attempt: a guard of its own for
        # each would move the launcher into the first attempt's cgroup and make the
        # next one's inside it, where the first guard's end would reach it.
        name = first.pop() if first else new_kvsname()
        try:
            return run(watchdog, name)
        finally:
            watchdog.sweep(job.grace)

    def left(left_out):
        from ..hosts import is_local
        # This machine is named by its node name in results, "localhost" or an
        # address of its own in the host list.
        here_out = any(is_local(name) for name in left_out)
        hosts = [e for e in entries if e.name not in left_out
                 and not (here_out and is_local(e.name))]
        if left_out and not hosts:
            raise LaunchError(f"no host is left for the job ({', '.join(left_out)} left out)")
        return hosts

    def run_one(job_k: JobSpec, left_out, note: str, launched):
        follows.update(health=False, restarts_left=job_k.attempt < job.max_job_restarts)
        if job_k.attempt and job.stdin != "none":
            # mslaunch's stdin is the first attempt's: what a failed attempt's rank
            # had read of it cannot be known to its program's checkpoint.
            if job_k.attempt == 1 and _reads_input():
                say("mslaunch: stdin goes to the first attempt only: the restarted job's "
                    "ranks read end-of-file (a job that resumes from a checkpoint reads "
                    "its input from a file)")
            job_k = replace(job_k, stdin="none")
        # Spare hosts whose waiting agents were lost are left out before the plan.
        left_out = tuple(dict.fromkeys(left_out + tuple(kept.check())))
        result, hosts, lost = guarded(lambda guard, name: _attempt(
            job_k, environ, left(left_out), guard, name, console, note, launched, shown,
            carry))
        lost += tuple(n for n in kept.lost if n not in left_out and n not in lost)
        return AttemptOutcome(result, hosts, lost)

    def check(left_out):
        from .health import failed_hosts, health_job
        follows.update(health=True)
        outcome = guarded(lambda guard, name: _attempt(
            health_job(job), environ, left(left_out), guard, name, console, shown=shown,
            carry=carry, tell=False))
        sig = outcome[0].stop_signal
        if sig is not None:       # a stop, not the hosts' failure
            from ..errors import Stopped
            from ..machine.spawn import signal_name
            raise Stopped(f"stopped by {signal_name(sig)} during the --health-check", sig)
        failed = failed_hosts(outcome[0])
        for host, how in failed:
            say(f"mslaunch: --health-check failed on {host} ({how}): the host is left out")
        return tuple(host for host, _ in failed)

    def say(line: str) -> None:
        shown[-1].message(line)

    # Stop signals between two attempts (none of them runs to take one) are noted
    # for the attempt loop; the supervisor of an attempt takes them over meanwhile.
    stops: List[int] = []
    import _signal as signal
    old = {sig: signal.signal(sig, lambda signum, frame: stops.append(signum))
           for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        return run_attempts(job, run_one, say, lambda: stops[0] if stops else None,
                            check=check if job.health_check else None)
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        carry["agents"].close()
        if carry.get("pmix") is not None:
            carry["pmix"].close()
        if own_console:
            shown[0].close()


def _reads_input() -> bool:
    """Whether mslaunch's stdin has something to read (not /dev/null, not closed)."""
    try:
        st, null = os.fstat(0), os.stat(os.devnull)
    except OSError:
        return False
    return (st.st_rdev, st.st_ino) != (null.st_rdev, null.st_ino)


def _attempt(job: JobSpec, environ, entries, watchdog, kvsname: str, console, note: str = "",
             launched=None, shown: Optional[List] = None, carry=None, tell: bool = True):
    """One run of the job, by one supervisor: its result, the hosts it ran on, and
    those it lost (see :class:`~.attempts.AttemptOutcome`)."""
    plan = build_plan(job, environ, entries=entries, kvsname=kvsname)
    remote = agent_hosts(plan, job)
    replan, starter, hooks = None, None, None
    if remote and job.ssh.launcher == "srun":
        from .srunranks import SrunHooks, check_srun_job
        check_srun_job(job, plan, carry is not None, environ)
        hooks, remote = SrunHooks(), []
    elif remote:
        from ..remote.starter import starter_for
        # the one choice of the job's starter
        make = lambda: starter_for(job.ssh, environ, port_range=job.port_range)  # noqa: E731
        kept = carry.get("agents") if carry is not None else None
        starter = kept.starter(make) if kept is not None else make()
        if _needs_topologies(job, entries):
            # Slots and placement depend on the remote hosts' cpus: connect to
            # every remote host first, as Open MPI starts its daemons first.
            from ..hosts import is_local
            remote = list(dict.fromkeys(e.name for e in entries if not is_local(e.name)))
            kvsname, port, jobid = plan.kvsname, plan.master_port, plan.ompi_jobid
            replan = lambda topologies: build_plan(  # noqa: E731
                job, environ, entries=entries, kvsname=kvsname, master_port=port,
                remote_topologies=topologies, jobid=jobid)
    supervisor = None
    try:
        if starter is not None:
            # In the background, while the supervisor is built (srun's step starts here).
            starter.prepare(remote, watchdog.marker)
        from .supervise import Supervisor      # after srun's step began (prepare)
        supervisor = Supervisor(job, plan, console, connect=remote, starter=starter,
                                replan=replan, watchdog=watchdog, hooks=hooks,
                                control=open_control(watchdog),
                                note=note,
                                on_launched=launched, carry=carry)
        if shown is not None:
            shown.append(supervisor.console)
        result = supervisor.run()
        if result.message and tell:
            supervisor.console.message(result.message)
        fleet = supervisor.fleet
        return (result, tuple(dict.fromkeys(r.spec.host.name for r in supervisor.ranks)),
                tuple(name for name, host in supervisor.hosts.items()
                      if host.state == "lost" and not host.blameless)
                + tuple(fleet.left_out if fleet is not None else ()))
    finally:
        if shown is not None and supervisor is not None:
            shown.pop()
        if supervisor is not None and console is None:
            supervisor.console.close()
        if starter is not None:
            starter.close()      # what prepare began, if the job failed before using it


def _xml_console(job: JobSpec):
    """--xml-file: all output, mslaunch's own lines too, into the file (else None)."""
    if not job.output.xml_file:
        return None
    try:
        fd = os.open(job.output.xml_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC,
                     0o644)
    except OSError as err:
        raise LaunchError(f"--xml-file {job.output.xml_file}: {err.strerror}") from None
    from ..machine.terminal import Console
    return Console(fd, fd, owned=True)


def _finish(job: JobSpec, result, console, started: float) -> int:
    """The job's exit status, once its report (if asked for) is written."""
    if job.report_json is not None:
        from . import jobreport
        try:
            jobreport.write(job.report_json, jobreport.build(result, started))
        except LaunchError as err:      # the job's own status stays the news
            if console is not None:
                console.message(f"mslaunch: error: {err}")
            else:
                sys.stderr.write(f"mslaunch: error: {err}\n")
            return result.exit_code or err.exit_code
    return result.exit_code
