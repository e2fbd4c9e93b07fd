"""A torchrun line for several nodes: the same command on each node forms one
job, through the node service msrun's dialect uses (:mod:`mslaunch.msrun.service`).

The node whose addresses include the master (``--master-addr`` for the static
rendezvous; ``--rdzv-endpoint``'s host for c10d) hosts the service: on
``--master-port`` + 1 for static (the workers' store keeps ``--master-port``,
as under torchrun), on the endpoint's port for c10d.  Every node, that one
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

Not yet served across nodes: ``--max-restarts`` and elastic membership
(``--nnodes MIN:MAX`` with MIN below MAX); each is one error line.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Mapping, Optional, Sequence, Tuple

    from ..core.spec import JobResult, JobSpec, Plan

from ..core.errors import UsageError
from ..core.spec import MsrunSpec, replace


def _service(values: Mapping[str, Optional[str]], count: int, nodes: int) -> MsrunSpec:
    """The node service's settings, in the record msrun's nodes use."""
    from .torchjob import _whole, endpoint, rdzv_conf
    backend = (values["rdzv_backend"] or "static").strip()
    conf = rdzv_conf(values["rdzv_conf"])
    join = float(conf.get("join_timeout", "600"))
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
        import socket
        local = (values["local_addr"] or "").strip()
        order = local or socket.getfqdn()
    else:
        given = (values["rdzv_endpoint"] or "").strip()
        if given:
            host, port = endpoint(given, 29500)
        else:
            host = (values["master_addr"] or "127.0.0.1").strip()
            port = _whole("master_port", values["master_port"] or "29500", 1, 65534)
        rank = _whole("node_rank", values["node_rank"], 0, nodes - 1)
        service_port = port + 1
        order = local = ""
    return MsrunSpec(argv=("torchrun",), worker_num=count * nodes, local_worker_num=count,
                     master_addr=host, master_port=port, node_rank=rank, join=True,
                     cluster_time_out=int(join), service_port=service_port, order=order,
                     local_addr=local)


def run_nodes(values: Mapping[str, Optional[str]], script: List[str],
              environ: Dict[str, str], nodes: int) -> int:
    """Run this node's part of a job of ``nodes`` nodes; the job's exit status."""
    from .torchjob import _whole, nproc, torch_job
    if _whole("max_restarts", values["max_restarts"], 0, 10**6):
        raise UsageError("--max-restarts across several nodes is not served yet: one "
                         "command for every node's workers restarts them: "
                         "mslaunch --max-restarts N -H NODE1:N,NODE2:N ...")
    count = nproc(values["nproc_per_node"])
    service = _service(values, count, nodes)
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
            import sys
            sys.stderr.write(f"mslaunch: error: {text}\n")
            return code
        assert ranks is not None and link is not None
        static = service.node_rank >= 0
        port = service.master_port if static else link.master_port
        addr = service.master_addr if static else link.master_addr
        job, temporary = torch_job(values, script, environ, master=(addr, port))
        try:
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


def node_plan(plan: Plan, ranks: Sequence[int], nodes: int, count: int) -> Plan:
    """This node's workers with their ranks in the whole job (``plan`` placed them
    here as ranks 0..count-1)."""
    total = nodes * count
    group = ranks[0] // count
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
        if node_service is not None and code == 0:
            code = wait_for_the_others(node_service, loop, service, session.console.message)
    finally:
        guard.close()
        session.console.close()
    return code, result

