"""A torchrun line for several nodes: the same command on each node forms one
job, through the node service msrun's dialect uses (:mod:`mslaunch.msrun.service`).

The node whose addresses include the master (``--master-addr`` for the static
rendezvous; ``--rdzv-endpoint``'s host for c10d) hosts the service: on
``--master-port`` + 1 for static (the workers' store keeps ``--master-port``,
as under torchrun), on the endpoint's port for c10d.  Where several nodes
share that host (a job of several nodes tried on one machine), the first to
take the port hosts it and the others join it, as torchrun's nodes there
join the first one's store; a c10d service refuses a node of another
``--rdzv-id``.  Every node, that one
included, proves the job's secret (``MSLAUNCH_SECRET``, else
``~/.mslaunch/secret``: the same on every node) and registers its workers;
their ranks are ``--node-rank`` x ``--nproc-per-node`` + i for static; for
c10d, once every node has come, in the order of the nodes' addresses
(``--local-addr``, else the host's FQDN) and then their pids, as torchrun's
c10d rendezvous ranks them; then the first node's rank 0 serves the job's
store, on its ``--local-addr`` (else the address it reaches the service from)
and a free port of its own.  From then on the first failure on any node
ends every node within a moment, each exiting with that rank's status and
naming it; a node that vanishes ends the job the same way, named (torchrun
notices a lost node only when the collectives time out).

With ``--max-restarts`` or ``--nnodes MIN:MAX`` the nodes start again
together, in rounds the service keeps (:mod:`mslaunch.msrun.rounds`): each
node runs a round's workers, then waits for the service's word (the next
round, the job over, or its end) and comes back for the next round with
the ranks it is given.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Mapping, Optional, Sequence, Tuple

    from ..core.spec import JobResult, JobSpec, Plan

from ..core.errors import UsageError, one_line
from ..core.spec import MsrunSpec, NodeRounds, replace
from ..core.states import LINK_ENDED, LINK_JOINED, REMOTE


def _service(values: Mapping[str, Optional[str]], count: int,
             environ: Mapping[str, str]) -> MsrunSpec:
    """The node service's settings, in the record msrun's nodes use; torchrun's
    ``LOGLEVEL`` of ``INFO`` or ``DEBUG`` has the rendezvous said as it goes."""
    from .torchjob import _seconds, _whole, endpoint, nnodes, rdzv_conf
    backend = (values["rdzv_backend"] or "static").strip()
    conf = rdzv_conf(values["rdzv_conf"])
    join = float(conf.get("join_timeout", "600"))
    low, high = nnodes(values["nnodes"])
    restarts = _whole("max_restarts", values["max_restarts"], 0, 10**6)
    if values["standalone"] == "1":
        raise UsageError("--standalone runs one node; for several, give --rdzv-endpoint "
                         "HOST:PORT (c10d) or --master-addr and --master-port (static)")
    if backend == "c10d":
        given = (values["rdzv_endpoint"] or "").strip()
        if not given:
            raise UsageError("--rdzv-backend=c10d for several nodes needs --rdzv-endpoint "
                             "HOST:PORT, the same on every node")
        host, port = endpoint(given, 29400)
        rank = -1
        service_port = port
        job_name = (values["rdzv_id"] or "none").strip() or "none"
        import socket
        local = (values["local_addr"] or "").strip()
        order = local or socket.getfqdn()
    else:
        if low != high:
            raise UsageError(f"--nnodes={low}:{high}: elastic membership needs "
                             f"--rdzv-backend=c10d (the static rendezvous has a fixed "
                             f"number of nodes, as under torchrun)")
        given = (values["rdzv_endpoint"] or "").strip()
        if given:
            host, port = endpoint(given, 29500)
        else:
            host = (values["master_addr"] or "127.0.0.1").strip()
            port = _whole("master_port", values["master_port"] or "29500", 1, 65534)
        rank = _whole("node_rank", values["node_rank"], 0, high - 1)
        service_port = port + 1
        order = local = job_name = ""
    rounds = None
    if restarts or low < high:
        last = conf.get("last_call_timeout")
        rounds = NodeRounds(min_nodes=low, max_nodes=high, max_restarts=restarts,
                            last_call=30.0 if last is None else
                            _seconds("rdzv_conf last_call_timeout", last))
    return MsrunSpec(argv=("torchrun",), worker_num=count * high, local_worker_num=count,
                     master_addr=host, master_port=port, node_rank=rank, join=True,
                     cluster_time_out=int(join), service_port=service_port, order=order,
                     local_addr=local, rounds=rounds,
                     master_flag="--rdzv-endpoint" if given else "--master-addr",
                     node_rank_flag="--node-rank", every_node_first=rounds is None,
                     job_name=job_name, join_if_taken=True,
                     verbose=int(environ.get("LOGLEVEL", "").upper() in ("INFO", "DEBUG")))


def run_nodes(values: Mapping[str, Optional[str]], script: List[str],
              environ: Dict[str, str], nodes: int) -> int:
    """Run this node's part of a job of up to ``nodes`` nodes; the job's exit status."""
    from .torchjob import nproc, torch_job
    count = nproc(values["nproc_per_node"])
    service = _service(values, count, environ)
    from ..machine.loop import Loop
    from ..machine.rendezvous import free_port
    from ..msrun.node import master_address, rendezvous
    loop = Loop()
    master, addresses = master_address(service)
    ranks, link, node_service, stopped = rendezvous(service, loop, master, addresses,
                                                    free_port())
    try:
        if stopped is not None:
            code, text = stopped
            _error(text)
            if node_service is not None and code < 128:
                # This node, the service's host, was refused (another node came
                # first with its node rank): the service stays until the nodes
                # it took have their end, as when this node's workers are done.
                from ..msrun.node import wait_for_the_others
                wait_for_the_others(node_service, loop, service, _say)
            return code
        assert ranks is not None and link is not None
        job, temporary = torch_job(values, script, environ, master=_master(service, link))
        try:
            if service.rounds is not None:
                return _rounds(job, environ, loop, link, count, service)
            code, _ = _run(job, environ, loop, link, node_service, ranks, nodes, count,
                           service)
        finally:
            if temporary is not None:
                from ..machine.trees import remove_tree
                remove_tree(temporary)
        return code
    finally:
        if link is not None:
            link.close()
        if node_service is not None:
            node_service.close()
        loop.close()


def _error(text: str) -> None:
    _say(f"mslaunch: error: {text}")


def _say(line: str) -> None:
    import sys
    sys.stderr.write(line + "\n")


def _master(service: MsrunSpec, link) -> Tuple[str, int]:
    """The workers' MASTER_ADDR and MASTER_PORT: the line's for static, else
    those the service named (rank 0's node's)."""
    if service.node_rank >= 0:
        return service.master_addr, service.master_port
    return link.master_addr, link.master_port


def node_plan(plan: Plan, ranks: Sequence[int], nodes: int, count: int,
              group: Optional[int] = None, total: Optional[int] = None) -> Plan:
    """This node's workers with their ranks in the whole job (``plan`` placed them
    here as ranks 0..count-1); the node's ``group`` rank and the job's ``total``
    workers, unless every node has ``count``."""
    total = nodes * count if total is None else total
    group = ranks[0] // count if group is None else group
    procs = []
    for i, spec in enumerate(plan.ranks):
        rank = ranks[i]
        env = dict(spec.env)
        for name in ("RANK", "ROLE_RANK", "RANK_ID", "OMPI_COMM_WORLD_RANK"):
            env[name] = str(rank)
        for name in ("WORLD_SIZE", "ROLE_WORLD_SIZE", "RANK_SIZE", "OMPI_COMM_WORLD_SIZE",
                     "OMPI_UNIVERSE_SIZE"):
            env[name] = str(total)
        env["GROUP_RANK"], env["GROUP_WORLD_SIZE"] = str(group), str(nodes)
        procs.append(replace(spec, rank=rank, index=i, env=env))
    return replace(plan, ranks=tuple(procs), universe_size=total)


def _run(job: JobSpec, environ: Mapping[str, str], loop, link, node_service,
         ranks: Sequence[int], nodes: int, count: int, service: MsrunSpec
         ) -> Tuple[int, JobResult]:
    from ..backends.nodes import NodePart
    from ..backends.session import Session
    from ..machine.terminal import Console
    from ..mpi.pmi.files import job_guard, public_id
    from ..msrun.node import wait_for_the_others
    from ..run.attempt import build_plan, run_attempt
    plan = node_plan(build_plan(job, environ), ranks, nodes, count)
    part = NodePart(link, None)
    guard = job_guard(public_id(plan.kvsname), job.grace, background=False)
    session = Session(guard, Console(), loop=loop, nodes=part)
    try:
        result = run_attempt(job, environ, session, part.planning(plan)).result
        code = result.exit_code
        _error_file(result, environ)
        if node_service is not None and code == 0:
            code = wait_for_the_others(node_service, loop, service, session.console.message)
    finally:
        guard.close()
        session.console.close()
    return code, result


def _error_file(result: JobResult, environ: Mapping[str, str]) -> None:
    """The launcher's ``TORCHELASTIC_ERROR_FILE``, where this node's worker failed first."""
    if result.root_cause is not None:
        from ..run.errorfiles import copy_for_launcher
        copy_for_launcher(result, environ)


def _rounds(job: JobSpec, environ: Mapping[str, str], loop, link, count: int,
            service: MsrunSpec) -> int:
    """This node's part of a job whose nodes start again together
    (:mod:`mslaunch.msrun.rounds`): a round, then the service's word; the job's status."""
    from ..machine.rendezvous import free_port
    from ..machine.terminal import Console
    from ..mpi.pmi.files import job_guard, new_kvsname, public_id
    from ..msrun.node import run_until_stopped as _wait
    guard = job_guard(public_id(new_kvsname()), job.grace, background=False)
    console = Console()
    try:
        while True:
            result = _round(job, environ, loop, link, count, service, guard, console)
            link.on_stop = lambda code, text: None
            signum = _wait(loop, lambda: link.state == LINK_ENDED or link.restart is not None)
            if signum is not None:
                from ..machine.spawn import signal_name
                link.stop(128 + signum, f"stopped by {signal_name(signum)} on "
                                        f"{os.uname().nodename}")
                return 128 + signum
            if link.restart is not None:
                if result.ending != REMOTE and not job.quiet:
                    console.message(f"mslaunch: {one_line(link.restart.get('message', ''))}")
                link.rejoin(free_port() if service.order else 0)
                signum = _wait(loop, lambda: link.state in (LINK_JOINED, LINK_ENDED))
                if signum is None and link.state == LINK_JOINED:
                    continue
                if link.ended_by is not None:
                    _error(link.ended_by[1])
                    return link.ended_by[0]
                return 128 + (signum or 0)
            if link.over:
                return 0
            if link.ended_by is not None and result.ending != REMOTE:
                _error(link.ended_by[1])
            _error_file(result, environ)        # (the last round's, as torchrun's agent)
            return result.exit_code or (link.ended_by or (1, ""))[0]
    finally:
        guard.close()
        console.close()


def _round(job: JobSpec, environ: Mapping[str, str], loop, link, count: int,
           service: MsrunSpec, guard, console) -> JobResult:
    """One round's workers on this node, as the service gave their ranks."""
    from ..backends.nodes import NodePart
    from ..backends.session import Session
    from ..run.attempt import build_plan, run_attempt
    info = link.round
    restarts = info.get("restarts", 0)
    addr, port = _master(service, link)
    job_r = replace(job, attempt=restarts if type(restarts) is int else 0,
                    global_env=tuple((k, addr if k == "MASTER_ADDR" else
                                      str(port) if k == "MASTER_PORT" else v)
                                     for k, v in job.global_env))
    plan = node_plan(build_plan(job_r, environ), info["ranks"], int(info.get("nodes", 1)),
                     count, int(info.get("group", 0)), int(info.get("world", 0)) or None)
    if info.get("round") and not job.quiet:
        console.message(f"mslaunch: round {info['round']}: this node's workers are ranks "
                        f"{plan.ranks[0].rank}-{plan.ranks[-1].rank} of "
                        f"{plan.universe_size} on {info.get('nodes')} node(s)")
    part = NodePart(link, None)
    session = Session(guard, console, loop=loop, nodes=part)
    try:
        return run_attempt(job_r, environ, session, part.planning(plan)).result
    finally:
        guard.sweep(job.grace)
