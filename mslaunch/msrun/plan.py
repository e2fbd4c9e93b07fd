"""One node's processes in msrun mode (pure): scheduler, workers, environment, logs.

The environment is msrun 2.10's, measured (``MS_ROLE``, ``MS_SCHED_HOST``,
``MS_SCHED_PORT``, ``MS_WORKER_NUM``, ``MS_TOPO_TIMEOUT``, ``RANK_SIZE``; for
the scheduler ``RANK_ID=0``; for worker i ``DEVICE_ID=i`` and, when its rank
is known, ``MS_NODE_ID`` and ``RANK_ID``), built per process: nothing leaks
from one process to the next as it does in msrun, where every worker
inherits the scheduler's ``RANK_ID=0``.  A worker whose rank is unknown gets
no ``RANK_ID`` at all.  Workers also get the variables other launchers give
(``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
``MASTER_ADDR``, ``MASTER_PORT`` -- a free port, not the scheduler's) where
they are known.  What importing MindSpore puts in msrun's own environment
reaches every process too (:func:`mindspore_defaults`), so that OpenMP and
OpenBLAS start with MindSpore's thread count rather than every core.

Logs are ``scheduler.log`` and ``worker_<id>.log`` (``--worker_log_name``
with ``{ip}`` and ``{hostname}`` replaced) in the log directory; the id is
the worker's rank when known, else its index on the node, as in msrun.
``--bind_core`` pins each process to CPUs: True splits this node's CPUs
into equal contiguous blocks per local worker, the last taking the
remainder (the scheduler is not pinned), and the JSON map form gives
``deviceN`` (the N-th local worker) and ``scheduler`` their CPUs.
``--bind_numa`` does the same with NUMA nodes (True spreads the workers
over the nodes; the map gives node numbers); its ``.json`` file form
(:mod:`.bindfile`) binds each process's CPUs and, through ``numactl
--membind`` as msrun does, its memory.  As in msrun, the True forms tell each
worker its CPUs in ``MSRUN_CPU_LIST``, a Python list (``[0, 1]``: MindSpore
reads it with ``ast.literal_eval``); the map forms leave it unset.
``--sim_level`` with ``--sim_rank_id`` dry-runs that one rank as the node's
only worker (``worker_0.log``, no ``MS_NODE_ID``), as msrun does.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from ..core.errors import PlanError
from ..core.spec import Host, MsrunSpec, RankSpec
from .bindfile import BindFile


def worker_ids(spec: MsrunSpec, assigned: Optional[Sequence[int]]) -> List[Optional[int]]:
    """The rank of each local worker: as assigned by the node service, or as msrun
    computes it (one node: i; ``--node_rank``: node_rank * local + i), else None."""
    local = spec.local_worker_num
    if assigned is not None:
        return list(assigned)
    if spec.local_worker_num == spec.worker_num:
        return list(range(local))
    if spec.node_rank >= 0:
        return [spec.node_rank * local + i for i in range(local)]
    return [None] * local


def _blocks(cpus: Sequence[int], n: int) -> List[Tuple[int, ...]]:
    """``cpus`` in ``n`` equal contiguous blocks, the last taking the remainder."""
    size = max(len(cpus) // n, 1)
    out = []
    for i in range(n):
        block = cpus[i * size:(i + 1) * size] if i < n - 1 else cpus[i * size:]
        out.append(tuple(block) or (cpus[i % len(cpus)],))
    return out


def _cpulist(cpus: Sequence[int]) -> str:
    """``0-3,5`` for (0, 1, 2, 3, 5)."""
    parts: List[str] = []
    run: List[int] = []
    for c in sorted(cpus):
        if run and c == run[-1] + 1:
            run.append(c)
            continue
        if run:
            parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [c]
    if run:
        parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(parts)


def bindings(spec: MsrunSpec, cpus: Sequence[int], scheduler: bool,
             numa: Sequence[Sequence[int]] = ()
             ) -> Tuple[Optional[Tuple[int, ...]], List[Optional[Tuple[int, ...]]]]:
    """CPUs of the scheduler and of each local worker (None: not pinned).

    ``--bind_core`` names CPUs; ``--bind_numa`` names NUMA nodes (``numa``:
    the CPUs of each node, by number) and pins to all their CPUs -- memory
    then comes from those nodes by the kernel's local-first policy.  When
    both are given, ``--bind_core`` decides.
    """
    local = spec.local_worker_num
    usable = set(cpus)
    nodes = [tuple(c for c in node if c in usable) for node in numa] or [tuple(sorted(cpus))]
    numa_given = spec.bind_numa
    if isinstance(numa_given, BindFile):
        if numa_given.legacy is None:        # (the file decides, as in msrun)
            return _file_cpus(numa_given, usable, nodes, scheduler, local)
        numa_given = numa_given.legacy
    flag, mode = "bind_core", spec.bind_core
    if mode is None and numa_given is not None:
        flag, mode = "bind_numa", numa_given
    if mode is None:
        return None, [None] * local
    if mode == "auto":
        if flag == "bind_core":
            return None, list(_blocks(sorted(cpus), local))
        # Workers spread over the nodes in equal contiguous groups, as the CPUs are.
        return None, [nodes[i * len(nodes) // local] or None for i in range(local)]
    from ..core.cputopo import parse_cpulist
    given: Dict[str, Tuple[int, ...]] = {}
    assert isinstance(mode, tuple)    # the map form: (key, CPU list) pairs
    for key, text in mode:
        chosen = parse_cpulist(text)
        given[key] = _node_cpus(f"--{flag}", key, nodes, chosen) if flag == "bind_numa" \
            else _cpus_here(f"--{flag}", key, usable, chosen)
    devices = sorted((int(k[6:]), v) for k, v in given.items() if k != "scheduler")
    workers: List[Optional[Tuple[int, ...]]] = [None] * local
    for i, (_, value) in enumerate(devices[:local]):
        workers[i] = value
    return (given.get("scheduler") if scheduler else None), workers


def _node_cpus(said: str, key: str, nodes: Sequence[Tuple[int, ...]],
               numbers: Sequence[int]) -> Tuple[int, ...]:
    """The CPUs of the NUMA nodes ``numbers`` (by number); PlanError, ``said``
    first, for a node this node does not have."""
    missing = [n for n in numbers if n >= len(nodes) or not nodes[n]]
    if missing:
        raise PlanError(f"{said}: {key} names NUMA node {missing[0]}, which this node does "
                        f"not have (it has {len(nodes)})")
    return tuple(sorted({c for n in numbers for c in nodes[n]}))


def _cpus_here(said: str, key: str, usable, numbers: Sequence[int]) -> Tuple[int, ...]:
    """``numbers``, CPUs this node has; PlanError, ``said`` first, for one it lacks."""
    missing = [c for c in numbers if c not in usable]
    if missing:
        raise PlanError(f"{said}: {key} names CPU {missing[0]}, which this node does not "
                        f"have (usable: {_cpulist(sorted(usable))})")
    return tuple(numbers)


def _file_cpus(bound: BindFile, usable, nodes: Sequence[Tuple[int, ...]], scheduler: bool,
               local: int) -> Tuple[Optional[Tuple[int, ...]], List[Optional[Tuple[int, ...]]]]:
    """CPUs of the scheduler and each worker from ``--bind_numa``'s file: its
    ``main`` CPUs, or its NUMA nodes' (``deviceN`` is the N-th local worker)."""
    said = f"--bind_numa: {bound.path}"

    def cpus_of(key: str) -> Optional[Tuple[int, ...]]:
        numbers = bound.entry(bound.cpu, key)
        if not numbers:
            return None
        if bound.cpu_mode == "numa":
            return _node_cpus(said, key, nodes, numbers)
        return _cpus_here(said, key, usable, numbers)
    return (cpus_of("scheduler") if scheduler else None), \
        [cpus_of(f"device{i}") for i in range(local)]


def memory_nodes(spec: MsrunSpec, scheduler: bool, numa: Sequence[Sequence[int]]
                 ) -> Tuple[Optional[str], List[Optional[str]]]:
    """The NUMA nodes (``numactl``'s list) the scheduler's and each worker's memory
    is bound to by ``--bind_numa``'s file (None: not bound)."""
    bound, local = spec.bind_numa, spec.local_worker_num
    if not isinstance(bound, BindFile) or bound.memory_mode != "numa":
        return None, [None] * local
    nodes = [tuple(node) for node in numa]

    def nodes_of(key: str) -> Optional[str]:
        numbers = bound.entry(bound.memory, key)
        if not numbers:
            return None
        _node_cpus(f"--bind_numa: {bound.path}", key, nodes, numbers)   # (they must be here)
        return ",".join(map(str, numbers))
    return (nodes_of("scheduler") if scheduler else None), \
        [nodes_of(f"device{i}") for i in range(local)]


def mindspore_defaults(online_cpus: int) -> Dict[str, str]:
    """What importing MindSpore puts in msrun's own environment, which its
    processes inherit: ``OMP_NUM_THREADS`` as MindSpore's ``SetOMPThreadNum``
    computes it (online CPUs / 2 / 4, within 1..16), ``HCCL_CONNECT_TIMEOUT``
    and ``PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION``; each only where unset."""
    threads = min(max(online_cpus // 2 // 4, 1), 16)
    return {"OMP_NUM_THREADS": str(threads), "HCCL_CONNECT_TIMEOUT": "600",
            "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION": "python"}


def first_on_path(value: Optional[str], entry: str) -> str:
    """``entry`` put first in a ``:``-separated list (moved there if it is in it),
    as MindSpore puts its CPU plugin's directory in ``LD_LIBRARY_PATH``."""
    paths = value.split(":") if value else []
    if not paths:
        return entry
    if paths[0] == entry:
        return value or entry
    return ":".join([entry] + [p for p in paths if p != entry])


def log_name(spec: MsrunSpec, worker_id: int, hostname: str, ip: str) -> str:
    base = spec.worker_log_name or "worker"
    base = base.replace("{ip}", ip).replace("{hostname}", hostname)
    return os.path.join(spec.log_dir, f"{base}_{worker_id}.log")


def _common_env(spec: MsrunSpec, sched_host: str) -> Dict[str, str]:
    """msrun's variables that every process of the node gets."""
    common: Dict[str, str] = {"RANK_SIZE": str(spec.worker_num),
                              "MS_WORKER_NUM": str(spec.worker_num)}
    if spec.sim_level >= 0:
        common["MS_SIMULATION_LEVEL"] = str(spec.sim_level)
    else:
        common.update({"MS_SCHED_HOST": sched_host, "MS_SCHED_PORT": str(spec.master_port),
                       "MS_TOPO_TIMEOUT": str(spec.cluster_time_out)})
    if spec.rank_table_file:
        common["RANK_TABLE_FILE"] = spec.rank_table_file
    if isinstance(spec.bind_numa, BindFile):
        common["MSRUN_BIND_FILE"] = spec.bind_numa.path
        common["MSRUN_BIND_FILE_HASH"] = spec.bind_numa.digest
    return common


def node_processes(spec: MsrunSpec, *, scheduler: bool, ranks: Optional[Sequence[int]],
                   environ: Mapping[str, str], hostname: str, ip: str,
                   cpus: Sequence[int], numa: Sequence[Sequence[int]] = (),
                   first_key: int = 0, sched_host: Optional[str] = None,
                   master_port: Optional[int] = None,
                   online_cpus: int = 1, ms_lib: Optional[str] = None) -> Tuple[RankSpec, ...]:
    """This node's processes: the scheduler (if it runs here), then its workers.

    ``sched_host`` is the master's IP (MindSpore takes no name), ``master_port``
    the workers' ``MASTER_PORT`` (a free port, not the scheduler's), ``ms_lib``
    MindSpore's ``lib`` directory, whose ``plugin/cpu`` importing MindSpore puts
    first in msrun's ``LD_LIBRARY_PATH``."""
    from ..core.spec import scrub_env
    host = Host(name=hostname, slots=spec.local_worker_num + (1 if scheduler else 0),
                max_slots=None, local=True, node_id=0)
    base = scrub_env(environ)
    base.setdefault("PYTHONUNBUFFERED", "1")
    for name, value in mindspore_defaults(online_cpus).items():
        base.setdefault(name, value)
    if ms_lib is not None:
        base["LD_LIBRARY_PATH"] = first_on_path(base.get("LD_LIBRARY_PATH"),
                                                os.path.join(ms_lib, "plugin/cpu"))
    sim = spec.sim_level >= 0
    sched_host = sched_host or spec.master_addr
    common = _common_env(spec, sched_host)
    sched_cpus, worker_cpus = bindings(spec, cpus, scheduler, numa)
    sched_mem, worker_mem = memory_nodes(spec, scheduler and not sim, numa)
    single = sim and spec.sim_rank_id >= 0
    if single:    # msrun dry-runs that one rank as the only local worker
        from ..core.spec import replace
        ids = worker_ids(replace(spec, local_worker_num=1), ranks)
    else:
        ids = worker_ids(spec, ranks)
    auto = spec.bind_core == "auto" or (spec.bind_core is None and spec.bind_numa == "auto")
    procs: List[RankSpec] = []
    key = first_key

    def add(label: str, env: Dict[str, str], log: str, bound, local_rank: int,
            rank: int, console: bool, membind: Optional[str] = None) -> None:
        nonlocal key
        # (memory bound as msrun binds it: its program run by numactl)
        argv = ("numactl", "--membind", membind, *spec.argv) if membind else spec.argv
        if bound and auto and local_rank >= 0:
            # msrun's format, which MindSpore reads back with ast.literal_eval
            env["MSRUN_CPU_LIST"] = str(list(bound))
        # Workers get sessions of their own, as msrun gives them: in the launcher's
        # session (one scheduling autogroup) a worker bound to one CPU kept losing
        # MindSpore 2.10's connect race to the scheduler for tens of seconds.
        procs.append(RankSpec(
            rank=rank, app=0, host=host, local_rank=local_rank,
            local_size=spec.local_worker_num, argv=argv, env=env, cwd=spec.launch_dir,
            stdout_path=log, stderr_path=None, cpus=bound, stdin="null", index=key,
            label=label, console=console, session=local_rank >= 0))
        key += 1

    if scheduler and not sim:
        env = dict(base, **common, MS_ROLE="MS_SCHED", RANK_ID="0")
        add("scheduler", env, os.path.join(spec.log_dir, "scheduler.log"), sched_cpus, -1, -1,
            False, sched_mem)
    tailed = None if spec.tail_worker_log == "-1" else \
        {int(x) for x in spec.tail_worker_log.split(",")}
    for i in range(1 if single else spec.local_worker_num):
        node_id = ids[i]
        rank = spec.sim_rank_id if single else node_id
        env = dict(base, **common, DEVICE_ID=str(i))
        if not sim:
            env["MS_ROLE"] = "MS_WORKER"
        if node_id is not None:
            env["MS_NODE_ID"] = str(node_id)
        if rank is not None:
            env.update({"RANK_ID": str(rank), "RANK": str(rank)})
        env.update({"WORLD_SIZE": str(spec.worker_num), "LOCAL_RANK": str(i),
                    "LOCAL_WORLD_SIZE": str(spec.local_worker_num),
                    "MASTER_ADDR": sched_host,
                    "MASTER_PORT": str(master_port or spec.master_port)})
        wid = node_id if node_id is not None else i
        console = spec.join and (tailed is None or wid in tailed)
        add(f"worker {wid}", env, log_name(spec, wid, hostname, ip), worker_cpus[i], i,
            rank if rank is not None else i, console, worker_mem[i])
    return tuple(procs)
