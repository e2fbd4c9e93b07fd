"""Running one node of an msrun-mode job.

The node whose addresses include ``--master_addr`` starts MindSpore's
scheduler (the task script with ``MS_ROLE=MS_SCHED``); every node starts its
local workers.  A job of one node needs nothing else.  A job of several
nodes forms through the node service (:mod:`.service`): every node
registers, gets its workers' ranks, and from then on learns at once when
any node fails, is stopped or vanishes.  The processes run under the same
supervisor as mpirun-style jobs (orphan guard, failure policy, signals,
log files), with msrun's log names and console lines.

``--join=True`` waits for the job here.  ``--join=False`` (msrun's default)
returns once the processes run, leaving a detached supervisor (its own
session, deaf to the terminal's hang-up) that keeps every guarantee and
keeps a record of the job in the log directory (:mod:`.record`).

With ``MS_ENABLE_RECOVERY=1`` a process that fails is started again, with
the same identity and log file (appended to, after a marker line), up to
``--max_restarts`` times each; the others keep running.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

    from ..core.spec import JobResult

    Announce = Callable[[List[str], Dict[str, int]], None]
    OnResult = Callable[[Dict[str, Any]], None]

from ..core.errors import LaunchError
from ..core.spec import JobSpec, MsrunSpec, OutputSpec, Plan, RankSpec


def master_address(spec: MsrunSpec) -> Tuple[bool, List[str]]:
    """Whether this node is the master (msrun's rule: master_addr is one of its
    addresses), and the addresses to reach the master by: IP addresses, the
    first as msrun picks it (the first answer of ``getaddrinfo``), which is
    what MindSpore's scheduler is told (it accepts only an IP)."""
    from ..hosts.local import is_local_host
    import ipaddress
    import socket
    name = spec.master_addr
    try:
        return is_local_host(name), [str(ipaddress.ip_address(name))]
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(name, None, socket.AF_UNSPEC, socket.SOCK_STREAM)
    except OSError as err:
        raise LaunchError(f"{spec.master_flag}={name[:60]}: cannot resolve it "
                          f"({err.strerror or err})") from None
    addresses = list(dict.fromkeys(str(i[4][0]) for i in infos))
    return is_local_host(name) or any(is_local_host(a) for a in addresses), addresses


def mindspore_lib() -> Optional[str]:
    """MindSpore's ``lib`` directory with its CPU plugin, where this Python would
    import MindSpore from (found, not imported: that costs seconds); else None."""
    import importlib.util
    try:
        found = importlib.util.find_spec("mindspore")
    except (ImportError, ValueError):
        return None
    for top in (found.submodule_search_locations or ()) if found is not None else ():
        lib = os.path.join(top, "lib")
        if os.path.isdir(os.path.join(lib, "plugin", "cpu")):
            return lib
    return None


def shown_path(spec: MsrunSpec, path: Optional[str]) -> str:
    """A log's path as msrun prints it: under ``--log_dir`` as typed."""
    return os.path.join(spec.log_dir_given, os.path.basename(path or ""))


def _messages(spec: MsrunSpec, procs: Sequence[RankSpec]) -> List[str]:
    """msrun's own console lines for the processes started (users grep them)."""
    lines = []
    for p in procs:
        command = " ".join(p.argv)     # (with numactl where --bind_numa's file binds memory)
        if p.label == "scheduler":
            lines.append(f"Start scheduler process, log file:{shown_path(spec, p.stdout_path)}. "
                         f"Execute command: {command}")
            continue
        rank = p.env.get("RANK_ID")
        exported = f" Environment variable [RANK_ID={rank}] is exported." if rank else \
            " The rank id will be assigned by the scheduler."
        lines.append(f"Start worker process with rank id:{rank if rank else 'None'}, "
                     f"log file:{shown_path(spec, p.stdout_path)}.{exported} "
                     f"Execute command: {command}")
    return lines


#: With --join=True; msrun's logger writes it to stderr (with MindSpore's log
#: prefix, not copied: mslaunch is no MindSpore process).
SPAWNED = "Distributed job is spawned. Waiting all processes to exit..."


def _job(spec: MsrunSpec, kvsname: str, procs: Sequence[RankSpec]) -> Tuple[JobSpec, Plan]:
    from ..core.spec import AppContext, Host
    job = JobSpec(
        apps=(AppContext(argv=spec.argv),), mpi="none", grace=spec.grace, quiet=spec.quiet,
        verbose=spec.verbose, stdin="none", launch_dir=spec.launch_dir, keep_going=False,
        output=OutputSpec(directory=spec.log_dir, copy_to_terminal=spec.join,
                          merge_stderr=True, label_prefix=True, pty=spec.pty))
    host = Host(name=os.uname().nodename, slots=len(procs), max_slots=None, local=True,
                node_id=0)
    plan = Plan(ranks=tuple(procs), hosts=(host,), kvsname=kvsname, process_mapping="",
                universe_size=spec.worker_num, master_addr=spec.master_addr,
                master_port=spec.master_port)
    return job, plan


def log_dir(path: str) -> None:
    """``--log_dir``, made if missing, where no other user may put anything of
    theirs (:func:`~mslaunch.machine.osfiles.check_dirs`): the job's logs and its
    record go there, and ``--stop_job`` signals the pid its record names."""
    from ..machine.osfiles import check_dirs
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        check_dirs(path)
    except OSError as err:
        where = f" ({err.filename})" if err.filename and err.filename != path else ""
        raise LaunchError(f"--log_dir {path}: {err.strerror}{where}") from None


def run_node(spec: MsrunSpec, announce: Optional[Announce] = None,
             on_result: Optional[OnResult] = None) -> int:
    """Run this node's part of the job to its end; the exit status.

    ``announce(lines)`` (the detached case) receives msrun's console lines and
    the pids once every process runs, instead of the terminal; ``on_result``
    the job's report (:mod:`mslaunch.run.jobreport`) at its end.  With
    ``--report_json`` the report is written to that file too.
    """
    import time
    if spec.report_json:
        from ..run.jobreport import check_writable
        check_writable(spec.report_json, "--report_json")
    started = time.time()
    try:
        result = _run_node(spec, announce)
    except LaunchError as err:
        if spec.report_json or on_result is not None:
            try:
                _report(spec, on_result, None, started, str(err), err.exit_code)
            except LaunchError as failed:   # the job's own error stays the news
                _say(f"mslaunch: error: {failed}", sys.stderr)
        raise
    code, job_result = result
    if spec.report_json or on_result is not None:
        try:
            _report(spec, on_result, job_result, started, "", code)
        except LaunchError as err:      # the job's own status stays the news
            _say(f"mslaunch: error: {err}", sys.stderr)
            return code or err.exit_code
    return code


def _report(spec: MsrunSpec, on_result: Optional[OnResult], result: Optional[JobResult],
            started: float, error: str, code: int) -> None:
    from ..run import jobreport
    report = jobreport.build(result, started, error=error, exit_code=code)
    report["exit_code"] = code           # this node's, after waiting for the others
    if spec.report_json:
        jobreport.write(spec.report_json, report, "--report_json")
    if on_result is not None:
        on_result(report)


def _run_node(spec: MsrunSpec, announce: Optional[Announce]) -> Tuple[int, JobResult]:
    from ..mpi.pmi.files import new_kvsname
    from ..machine.loop import Loop
    from .plan import node_processes
    loop = Loop()
    master, addresses = master_address(spec)
    multi = spec.worker_num > spec.local_worker_num
    log_dir(spec.log_dir)
    link = service = None
    ranks: Optional[List[int]] = None
    from ..machine.rendezvous import free_port
    port = free_port()
    if multi and spec.sim_level < 0:
        ranks, link, service, stopped = rendezvous(spec, loop, master, addresses, port)
        port = (link.master_port or port) if link is not None else port
        if stopped is not None:
            code, text = stopped
            _say(f"mslaunch: error: {text}")
            if link is not None:
                link.close()
            if service is not None:
                if code < 128:
                    # This node, the service's host, was refused (another node
                    # came first with its rank): the service stays until the
                    # nodes it took have their end, as when the host is done.
                    wait_for_the_others(service, loop, spec, _say)
                service.close()
            loop.close()
            from ..core.spec import JobResult
            from ..core.states import REMOTE
            return code, JobResult(exit_code=code, message=text, ending=REMOTE)
    from ..core.cputopo import objects
    from ..machine.topology import cached_topology
    topo = cached_topology()
    procs = node_processes(spec, scheduler=master, ranks=ranks, environ=os.environ,
                           sched_host=addresses[0], master_port=port,
                           online_cpus=os.sysconf("SC_NPROCESSORS_ONLN"),
                           ms_lib=mindspore_lib(),
                           hostname=os.uname().nodename, ip=addresses[0] if master else
                           _own_address(addresses), cpus=topo.cpu_ids(),
                           numa=objects(topo, "numa") if spec.bind_numa else ())
    _check_numactl(spec, procs)
    job, plan = _job(spec, new_kvsname(), procs)
    lines = _messages(spec, procs)
    if announce is None and not spec.quiet:
        for line in spec.warnings:
            _say(f"mslaunch: warning: {line}", sys.stderr)
        for line in lines:
            _say(line)
        if spec.join:
            _say(SPAWNED, sys.stderr)
    recovery = os.environ.get("MS_ENABLE_RECOVERY") == "1"
    from ..run.attempt import run_attempt
    from ..backends.nodes import NodePart
    from ..backends.session import Session
    from ..machine.terminal import Console
    from ..mpi.pmi.files import job_guard, public_id
    part = NodePart(link, service, (lambda pids: announce(lines, pids)) if announce else None)
    guard = job_guard(public_id(plan.kvsname), job.grace, background=False)
    session = Session(guard, Console(), loop=loop, wants_control=False, nodes=part,
                      rank_restarts=spec.max_restarts if recovery else 0)
    try:
        result = run_attempt(job, os.environ, session, part.planning(plan)).result
        code = result.exit_code
        if service is not None and code == 0:
            code = wait_for_the_others(service, loop, spec, session.console.message)
    finally:
        part.close()
        guard.close()
        loop.close()
        session.console.close()
    return code, result


def wait_for_the_others(service, loop, spec: MsrunSpec, say) -> int:
    """The master's processes are done: the service stays until every node is,
    and the job's status is the first failure anywhere (0 if none)."""
    import signal as _signal
    stops: List[int] = []
    old = {sig: _signal.signal(sig, lambda signum, frame: stops.append(signum))
           for sig in (_signal.SIGINT, _signal.SIGTERM, _signal.SIGHUP)}

    def tick() -> None:
        if stops and service.stopped is None:
            from ..machine.spawn import signal_name
            service.stop(128 + stops[0], f"stopped by {signal_name(stops[0])} on "
                                         f"{os.uname().nodename}")
        if not service.settled():
            loop.call_later(0.1, tick)

    if not service.settled() and not spec.quiet and spec.verbose:
        say("mslaunch: this node is done; waiting for the other nodes of the job")
    tick()
    try:
        loop.run_until(service.settled)
    finally:
        for sig, handler in old.items():
            _signal.signal(sig, handler)
    if service.stopped is not None:
        if not spec.quiet:
            say(f"mslaunch: {service.stopped['message']}")
        return int(service.stopped["code"])
    return 0


def _own_address(addresses: Sequence[str]) -> str:
    """This node's address towards the master (for ``{ip}`` in log names)."""
    from ..hosts.local import route_address
    for addr in addresses:
        mine = route_address(addr)
        if mine:
            return mine
    return "127.0.0.1"


def _check_numactl(spec: MsrunSpec, procs: Sequence[RankSpec]) -> None:
    """``--bind_numa``'s file binds memory through ``numactl``, as msrun does: one
    error line before anything starts where there is none to run."""
    from ..machine.spawn import exec_path
    bound = [p for p in procs if p.argv[:2] == ("numactl", "--membind")]
    if bound and exec_path("numactl", bound[0].env) is None:
        from ..core.errors import PlanError
        raise PlanError(f"--bind_numa: {getattr(spec.bind_numa, 'path', '')} binds memory "
                        f"(bind_memory_mode \"numa\"), through numactl, which is not on "
                        f"PATH (Debian and Ubuntu: apt install numactl)")


def _say(line: str, stream=None) -> None:
    stream = stream or sys.stdout
    try:
        stream.write(line + "\n")
        stream.flush()
    except (OSError, ValueError):
        pass


def run_until_stopped(loop, until) -> Optional[int]:
    """Run ``loop`` until ``until()`` or a stop signal (SIGINT, SIGTERM, SIGHUP),
    whose number is returned (None: ``until()`` came true)."""
    import signal as _signal
    stops: List[int] = []
    old = {sig: _signal.signal(sig, lambda signum, frame: stops.append(signum))
           for sig in (_signal.SIGINT, _signal.SIGTERM, _signal.SIGHUP)}

    def tick() -> None:                 # wake up now and then to see a stop signal
        if not stops:
            loop.call_later(0.1, tick)

    tick()
    try:
        loop.run_until(lambda: until() or bool(stops))
    finally:
        for sig, handler in old.items():
            _signal.signal(sig, handler)
    return stops[0] if stops else None


def _service(spec: MsrunSpec, loop, address: str, port: int, free: int, secret: bytes,
             config, warn: Callable[[str], None]):
    """The node service this master node hosts on ``address``:``port``."""
    from .service import NodeService
    from .tls import context
    return NodeService(loop, address=address, port=port, secret=secret,
                       worker_num=spec.worker_num, time_out=spec.cluster_time_out,
                       master_port=free, refused=warn,
                       recovery=os.environ.get("MS_ENABLE_RECOVERY") == "1",
                       rounds=spec.rounds, rank_flag=spec.node_rank_flag,
                       every_node_first=spec.every_node_first, job_name=spec.job_name,
                       tls=context(config, True, warn) if config else None,
                       log=warn if spec.verbose else (lambda _text: None))


def rendezvous(spec: MsrunSpec, loop, master: bool, addresses: List[str], port: int):
    """Join the job: host the service if master, register, wait for this node's ranks.

    The master's service hands every node the master's free ``port`` for
    ``MASTER_PORT`` (``link.master_port``).
    Returns ``(ranks, link, service, stopped)``; ``stopped`` is ``(code, text)``
    when the job ended before this node could start (refused, time out,
    another node's failure, a stop signal).
    """
    import time

    from ..wire.endpoint import HEARTBEAT, RESTART_HEARTBEAT, heartbeat_setting
    from .secret import load_secret
    from .nodelink import NodeLink
    from .service import ServiceTaken
    from .tls import context, read_config
    secret = load_secret(spec.secret_file)
    tls_path = spec.tls_config or os.environ.get("MSLAUNCH_TLS_CONFIG")
    config = read_config(tls_path) if tls_path else None

    def warn(text: str) -> None:
        if not spec.quiet:
            sys.stderr.write(f"mslaunch: {text}\n")

    free, port = port, spec.service_port or spec.master_port + 1
    service = None
    try:
        service = _service(spec, loop, addresses[0], port, free, secret, config, warn) \
            if master else None
    except ServiceTaken:
        if not spec.join_if_taken:
            raise
        # Another node of this host came first: it hosts the service (a node of
        # another job refuses this one, by its --rdzv-id), as under torchrun's c10d.
    state: Dict[str, Any] = {}
    deadline = None if spec.cluster_time_out < 0 else time.monotonic() + spec.cluster_time_out
    link = NodeLink(loop, addresses=addresses, port=port, secret=secret,
                    tls=context(config, False, warn) if config else None,
                    node_rank=spec.node_rank, workers=spec.local_worker_num,
                    deadline=deadline, order=spec.order,
                    store=(spec.local_addr, free) if spec.order else ("", 0),
                    rounds=spec.rounds is not None, job=spec.job_name,
                    log=warn if spec.verbose else (lambda _text: None),
                    heartbeat=heartbeat_setting(os.environ.get("MSLAUNCH_HEARTBEAT"),
                                                RESTART_HEARTBEAT if spec.rounds else HEARTBEAT),
                    on_ranks=lambda ranks: state.setdefault("ranks", ranks),
                    on_stop=lambda code, text: state.setdefault("stop", (code, text)))
    signum = run_until_stopped(loop, lambda: "ranks" in state or "stop" in state)
    if signum is not None:
        from ..machine.spawn import signal_name
        code = 128 + signum
        text = f"stopped by {signal_name(signum)} while the job was forming"
        link.stop(code, text)
        return None, link, service, (code, text)
    if "stop" in state:
        return None, link, service, state["stop"]
    return state["ranks"], link, service, None
