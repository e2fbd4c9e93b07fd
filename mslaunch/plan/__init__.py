"""The plan: placement of ranks on hosts and each rank's environment (pure).

Placement rules are in :mod:`.place`; this module builds each rank's
argv, environment, working directory and log paths.

:func:`make_plan` takes the parsed :class:`JobSpec`, the host entries, the
launcher's environment and a few facts about this machine, and returns a
:class:`Plan`.  It starts nothing and touches no global state, so every
rule here is tested with tables and property tests.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Mapping, Optional, Sequence, Tuple

    from ..core.spec import OutputSpec

from ..core.errors import PlanError, UsageError
from ..hosts import IMPLICIT_HOST
from ..core.spec import AppContext, Host, HostEntry, JobSpec, Plan, RankSpec
from ..core.spec import scrub_env  # the plan's rule; the agent's too
from ..core.states import PMI
from .place import (binding, check_overload, check_pe, locations, place, rank_order,
                    resolve_hosts)
from ..core.cputopo import Topology, count, make_topology

def _oversubscribe(job: JobSpec, entries: Sequence[HostEntry]) -> bool:
    """Whether ranks may outnumber slots.

    Explicit host lists keep Open MPI's slot check; with no host list at all
    (this machine, implicitly) ``-n`` is run as asked, as Hydra, torchrun and
    msrun do, unless ``--nooversubscribe`` says otherwise.
    """
    if job.oversubscribe is not None:
        return job.oversubscribe
    return len(entries) == 1 and entries[0].origin == IMPLICIT_HOST


def log_paths(directory: Optional[str], jobid_dir: bool, merge: bool, rank: int,
              size: int, jobid: int = 1) -> Tuple[Optional[str], Optional[str]]:
    """Open MPI 4's ``DIR/JOBID/rank.N/{stdout,stderr}``.

    N is zero-padded to the number of digits of the job's size, as Open MPI
    4.1.4 does: ``rank.00`` .. ``rank.09`` for 10 ranks, ``rank.000`` .. for 100.
    """
    if directory is None:
        return None, None
    width = len(str(max(size, 1)))
    parts = [directory, str(jobid), f"rank.{rank:0{width}d}"] if jobid_dir else \
        [directory, f"rank.{rank:0{width}d}"]
    base = "/".join(parts)
    return base + "/stdout", (None if merge else base + "/stderr")


def _user_env(base: Dict[str, str], pairs, environ: Mapping[str, str]) -> None:
    for name, value in pairs:
        if value is None:
            if name in environ:
                base[name] = environ[name]
        else:
            base[name] = value


def make_plan(job: JobSpec, entries: Sequence[HostEntry], environ: Mapping[str, str], *,
              topology: Topology, hostname: str, kvsname: str, master_port: int,
              remote_topologies: Optional[Mapping[str, Topology]] = None,
              is_local=None, ompi_jobid: int = 0) -> Plan:
    """Place every rank and build its argv, environment, cwd and log paths.

    ``topology`` is this machine's; ``remote_topologies`` those the remote
    hosts' agents reported (a host not heard from yet counts as one socket
    of as many cores as it has slots).
    """
    remote_topologies = remote_topologies or {}
    topology = _restricted(topology, job.cpu_set)
    rankfile = None
    if job.rankfile:
        from ..hosts.rankfile import parse_rankfile
        rankfile = parse_rankfile(job.rankfile)
        if not job.hosts and len(entries) == 1 and entries[0].origin == IMPLICIT_HOST:
            entries = _rankfile_hosts(rankfile, job.rankfile)
    hosts, topos = _hosts(job, entries, topology, remote_topologies, hostname, is_local)
    oversubscribe = _oversubscribe(job, entries)
    sizes = [a.np for a in job.apps]
    np_total = None if sizes[0] is None else sum(s or 0 for s in sizes)
    if rankfile is not None:
        where, locs = _from_rankfile(rankfile, hosts, topos, np_total, job)
    else:
        where, locs = _mapped(hosts, topos, np_total, job, oversubscribe)
    # Node ids dense in order of first appearance; local ranks in rank order.
    node_of_host: Dict[int, int] = {}
    for h in where:
        node_of_host.setdefault(h, len(node_of_host))
    used = [Host(name=hosts[h].name, slots=hosts[h].slots, max_slots=hosts[h].max_slots,
                 local=hosts[h].local, node_id=i) for i, h in enumerate(node_of_host)]
    spare = tuple(Host(name=h.name, slots=h.slots, max_slots=h.max_slots, local=h.local,
                       node_id=len(used) + i)
                  for i, h in enumerate(h for j, h in enumerate(hosts) if j not in node_of_host))
    if job.cpu_list and any(h.local for h in used):
        _check_cpu_list(topology, job.cpu_list)
    universe = sum(h.slots for h in used)
    master_addr = "127.0.0.1" if all(h.local for h in used) else used[0].name
    mapping = ""
    if job.mpi == PMI:
        from ..core.procmap import process_mapping
        mapping = process_mapping([node_of_host[h] for h in where])
    app_envs = [context_environment(job, app.env, environ, master_addr, master_port, ompi_jobid)
                for app in job.apps]
    ranks, bindings = _ranks(job, where, [used[node_of_host[h]] for h in where], locs,
                             topos, rankfile is not None, app_envs, universe, kvsname)
    if job.stdin not in ("all", "none") and int(job.stdin) >= len(where):
        raise UsageError(f"--stdin {job.stdin}: the job has only {len(where)} ranks")
    if rankfile is None:
        for h, bound in bindings.items():
            check_overload(hosts[h].name, bound, job)
    return Plan(ranks=tuple(ranks), hosts=tuple(used), kvsname=kvsname,
                process_mapping=mapping, universe_size=universe,
                master_addr=master_addr, master_port=master_port, ompi_jobid=ompi_jobid,
                topologies=tuple(topos[h] for h in node_of_host),
                oversubscribe=oversubscribe, spare_hosts=spare)


def _rankfile_hosts(rankfile, path: str) -> List[HostEntry]:
    """The hosts a rankfile names, when no host list was given (relative
    ``+nN`` entries need one)."""
    counts: Dict[str, int] = {}
    for e in rankfile:
        if e.relative is not None:
            raise PlanError(f"{e.origin}: a relative host (+n{e.relative}) needs a "
                            f"host list (-H, --hostfile or an allocation)")
        counts[e.host] = counts.get(e.host, 0) + 1
    return [HostEntry(name, n, None, path) for name, n in counts.items()]


def _hosts(job: JobSpec, entries: Sequence[HostEntry], topology: Topology,
           remote_topologies: Mapping[str, Topology], hostname: str,
           is_local) -> Tuple[List[Host], List[Topology]]:
    """The job's hosts with their slot counts, and the topology of each."""
    unit = "hwthread" if job.use_hwthreads else "core"
    hosts = resolve_hosts(entries, ncores=count(topology, unit), hostname=hostname,
                          is_local=is_local,
                          remote_cores={name: count(t, unit)
                                        for name, t in remote_topologies.items()})
    if job.nolocal:
        hosts = [h for h in hosts if not h.local]
        if not hosts:
            raise PlanError("-nolocal: every host of the job is this machine; there is "
                            "nowhere else to run")
    topos = [topology if h.local else remote_topologies.get(h.name) or _guess(h.slots)
             for h in hosts]
    return hosts, topos


def _ranks(job: JobSpec, where: Sequence[int], host_of: Sequence[Host], locs, topos,
           from_rankfile: bool, app_envs, universe: int, kvsname: str):
    """Every rank's :class:`RankSpec`, and the cpus bound on each host (by host index)."""
    size = len(where)
    sizes = [a.np for a in job.apps]
    app_of: List[int] = []
    for index, app in enumerate(job.apps):
        app_of.extend([index] * (app.np if app.np is not None else size))
    local_size: Dict[int, int] = {}
    for h in where:
        local_size[h] = local_size.get(h, 0) + 1
    remote_inherit = "none" if not job.inherit_env else ("launcher" if job.forward_env
                                                           else "remote")
    ranks: List[RankSpec] = []
    seen: Dict[int, int] = {}
    bindings: Dict[int, List[Optional[Tuple[int, ...]]]] = {}
    for rank, h in enumerate(where):
        host = host_of[rank]
        local_rank = seen.get(h, 0)
        seen[h] = local_rank + 1
        app_index = app_of[rank]
        context: AppContext = job.apps[app_index]
        env = dict(app_envs[app_index][0 if host.local else 1])   # whole, or remote overlay
        if not job.is_check:          # (a health check's commands are no ranks)
            env.update(rank_variables(rank=rank, size=size, local_rank=local_rank,
                                      local_size=local_size[h], group=host.node_id,
                                      host=host.name, universe=universe, sizes=sizes,
                                      kvsname=kvsname, pmi=job.mpi == PMI,
                                      hostname=job.propagate_hostname))
        if job.max_job_restarts:
            env.update(restart_variables(job.attempt, job.max_job_restarts))
        stdout_path, stderr_path = log_paths(job.output.directory, job.output.jobid_dir,
                                             job.output.merge_stderr, rank, size)
        if job.output.stdout_pattern or job.output.stderr_pattern:
            stdout_path, stderr_path = pattern_paths(job.output, stdout_path, stderr_path,
                                                     rank, host)
        torch = _torch_worker(job, env, rank, size, local_rank, len(local_size)) \
            if job.torch is not None else None
        if torch is not None:
            stdout_path, stderr_path = torch[0], torch[1]
        bound = locs[rank] if from_rankfile else binding(topos[h], locs[rank], local_rank, job)
        bindings.setdefault(h, []).append(bound)
        argv, program = context.argv, None
        if job.torch is not None:
            from .torchrun import worker_argv
            argv = worker_argv(argv, local_rank)
        if context.local_rank_arg is not None:
            at, prefix = context.local_rank_arg
            argv = (*argv[:at], f"{prefix}{local_rank}", *argv[at:])
        if job.index_argv:
            # --index-argv-by-rank: argv[0] becomes NAME-RANK; the program is the same.
            argv, program = (f"{argv[0]}-{rank}",) + tuple(argv[1:]), argv[0]
        cwd = context.wdir or job.launch_dir
        # As Open MPI 4's mpirun: 1 on a host with more ranks than slots, where
        # Open MPI's ranks then yield the processor while they wait.
        if not job.is_check:
            env.setdefault("OMPI_MCA_mpi_oversubscribe",
                           "1" if local_size[h] > host.slots else "0")
            env.update(program_variables(argv, cwd))
        ranks.append(RankSpec(rank=rank, app=app_index, host=host, local_rank=local_rank,
                              local_size=local_size[h], argv=argv, env=env,
                              cwd=cwd, stdout_path=stdout_path,
                              stderr_path=stderr_path, cpus=bound, stdin=_stdin_of(job, rank),
                              inherit="launcher" if host.local else remote_inherit,
                              path_prefix=None if host.local or remote_inherit != "remote"
                              else job.prefix, program=program, search=job.exec_path,
                              session_dir=job.session_cwd,
                              streams=torch[3] if torch is not None else None,
                              error_file=torch[2] if torch is not None else None))
    return ranks, bindings


def _torch_worker(job: JobSpec, env: Dict[str, str], rank: int, size: int, local_rank: int,
                  groups: int):
    """A torchrun worker's variables (into ``env``), and its (stdout file, stderr
    file, error file, streams on the terminal): see :mod:`.torchrun`."""
    from .torchrun import worker_console, worker_files, worker_variables
    torch = job.torch
    assert torch is not None
    env.update(worker_variables(torch, rank=rank, size=size, local_rank=local_rank,
                                groups=groups, attempt=job.attempt,
                                max_restarts=job.max_job_restarts))
    out, err, error_file = worker_files(torch, job.attempt, local_rank)
    return out, err, error_file, worker_console(torch, rank=rank, local_rank=local_rank)


def _stdin_of(job: JobSpec, rank: int) -> str:
    if job.stdin == "all":
        return "pipe"
    if job.stdin != "none" and int(job.stdin) == rank:
        return "inherit"
    return "null"


def context_environment(job: JobSpec, context_env, environ: Mapping[str, str],
                        master_addr: str, master_port: int,
                        ompi_jobid: int = 0) -> Tuple[Dict[str, str], Dict[str, str]]:
    """The environment of one context's ranks: (whole, for this machine; overlay,
    for a remote host's login environment unless the launcher's is forwarded).

    What the command line sets goes on top of the inherited environment (the
    launcher's here; the login environment of a remote host, as Open MPI
    does it, unless -genvall forwards the launcher's).
    """
    overlay: Dict[str, str] = {}
    _user_env(overlay, job.global_env, environ)
    for key, value in job.mca:
        overlay["OMPI_MCA_" + key] = value
    inherited = scrub_env(environ) if job.inherit_env else {}
    if job.prefix:
        for var, sub in (("PATH", "bin"), ("LD_LIBRARY_PATH", "lib")):
            old = inherited.get(var)
            inherited[var] = f"{job.prefix}/{sub}" + (f":{old}" if old else "")
    _user_env(overlay, context_env, environ)
    # Every rank must agree on the rendezvous, wherever it runs.
    overlay.setdefault("MASTER_ADDR", environ.get("MASTER_ADDR") or master_addr)
    overlay.setdefault("MASTER_PORT", str(master_port))
    # What frameworks that detect Open MPI 4's mpirun look for (see hnp_uri).
    overlay.setdefault("OMPI_MCA_orte_hnp_uri", hnp_uri(ompi_jobid, overlay["MASTER_ADDR"]))
    whole = dict(inherited)
    whole.update(overlay)
    whole.setdefault("PYTHONUNBUFFERED", "1")
    if job.inherit_env and job.forward_env:
        overlay = whole
    return whole, overlay


#: jax's Open MPI detector takes its coordinator's port from the job id in
#: ``OMPI_MCA_orte_hnp_uri``: ``jobid // 4096 % 4096 + COORDINATOR_PORT_BASE``.
COORDINATOR_PORT_BASE = 61440


def coordinator_port(jobid: int) -> int:
    """The port jax derives from an Open MPI job id."""
    return jobid // 4096 % 4096 + COORDINATOR_PORT_BASE


def hnp_uri(jobid: int, addr: str) -> str:
    """Open MPI 4's ``OMPI_MCA_orte_hnp_uri`` (``JOBID.0;tcp://ADDR:PORT``) naming
    ``addr``, rank 0's host, as the contact: jax's ``distributed.initialize()``
    takes its coordinator's address from it, and the port from ``jobid``.

    Open MPI's ranks decide whether mpirun launched them from
    ``orte_local_daemon_uri``, never set here, so an Open MPI program never
    contacts the address: it finds mslaunch's PMIx server (Open MPI 5 does
    not read the variable at all)."""
    port = coordinator_port(jobid)
    if ":" in addr:
        return f"{jobid}.0;tcp6://[{addr.strip('[]')}]:{port}"
    return f"{jobid}.0;tcp://{addr}:{port}"


def restart_variables(attempt: int, limit: int) -> Dict[str, str]:
    """What tells a rank of a job run with ``--max-restarts`` which attempt it is
    in (0: the first), mslaunch's name and torchrun's, so that it resumes from
    its checkpoint."""
    return {"MSLAUNCH_RESTART_COUNT": str(attempt), "MSLAUNCH_MAX_RESTARTS": str(limit),
            "TORCHELASTIC_RESTART_COUNT": str(attempt), "TORCHELASTIC_MAX_RESTARTS": str(limit)}


def rank_variables(*, rank: int, size: int, local_rank: int, local_size: int, group: int,
                   host: str, universe: int, sizes: Sequence[Optional[int]], kvsname: str,
                   pmi: bool, hostname: bool = True) -> Dict[str, str]:
    """Every ecosystem's identity variables of one rank (Open MPI, PMI, MindSpore,
    PyTorch); ``sizes`` are the MPMD contexts' sizes (None: the whole job)."""
    first_rank = [0]
    for n in sizes[:-1]:
        first_rank.append(first_rank[-1] + (n or 0))
    env = {
        "OMPI_COMM_WORLD_RANK": str(rank), "OMPI_COMM_WORLD_SIZE": str(size),
        "OMPI_COMM_WORLD_LOCAL_RANK": str(local_rank),
        "OMPI_COMM_WORLD_LOCAL_SIZE": str(local_size),
        "OMPI_COMM_WORLD_NODE_RANK": str(local_rank),
        "OMPI_UNIVERSE_SIZE": str(universe),
        "OMPI_NUM_APP_CTX": str(len(sizes)),
        # Open MPI's format: space-separated, one number per context.
        "OMPI_APP_CTX_NUM_PROCS": " ".join(str(n if n is not None else size) for n in sizes),
        "OMPI_FIRST_RANKS": " ".join(str(r) for r in first_rank),
        "MPI_LOCALRANKID": str(local_rank), "MPI_LOCALNRANKS": str(local_size),
        "RANK_ID": str(rank), "RANK_SIZE": str(size),
        "RANK": str(rank), "WORLD_SIZE": str(size),
        "LOCAL_RANK": str(local_rank), "LOCAL_WORLD_SIZE": str(local_size),
        "GROUP_RANK": str(group),
        "MSLAUNCH_JOB": kvsname,
    }
    if pmi:
        env.update({"PMI_RANK": str(rank), "PMI_SIZE": str(size)})
        if hostname:
            env["PMI_HOSTNAME"] = host
    return env


def program_variables(argv: Sequence[str], cwd: str) -> Dict[str, str]:
    """What Open MPI 4's ``MPI_INFO_ENV`` reads of a rank's start ("argv", "wdir"),
    as its mpirun sets it: the program's arguments joined by spaces (left out
    when there are none), its working directory.  Not ``OMPI_COMMAND`` (the
    program's name, "command"): with ``PMIX_RANK`` it tells frameworks that
    Open MPI's own mpirun started them (MindSpore then takes its MPI path)."""
    env = {"OMPI_MCA_initial_wdir": cwd}
    if len(argv) > 1:
        env["OMPI_ARGV"] = " ".join(argv[1:])
    return env


def _restricted(topology: Topology, cpu_set: Optional[Sequence[int]]) -> Topology:
    """``topology`` with only the ``--cpu-set`` cpus."""
    if not cpu_set:
        return topology
    keep = set(cpu_set)
    rows = [row for row in topology.cpus if row[0] in keep]
    if not rows:
        raise PlanError(f"--cpu-set {','.join(map(str, cpu_set))}: none of these cpus is "
                        f"usable here (usable: {','.join(map(str, topology.cpu_ids()))})")
    return make_topology(rows)


def pattern_paths(out: OutputSpec, stdout: Optional[str], stderr: Optional[str], rank: int,
                  host: Host, job: int = 1) -> Tuple[Optional[str], Optional[str]]:
    """A rank's files where Hydra's ``-outfile-pattern``/``-errfile-pattern`` name them
    (``job``: its job's number, 1 for the first)."""
    from .patterns import expand

    def path(pattern: str, otherwise: Optional[str]) -> Optional[str]:
        return expand(pattern, rank=rank, host=host.name, node=host.node_id, job=job) \
            if pattern else otherwise
    return path(out.stdout_pattern, stdout), path(out.stderr_pattern, stderr)


def _check_cpu_list(topology: Topology, cpu_list: Optional[Sequence[int]]) -> None:
    """Refuse ``--cpu-list`` cpus this machine does not have (or ``--cpu-set`` leaves
    out), as Open MPI does, where it runs ranks, before one is bound to such a cpu
    and fails to start."""
    known = set(topology.cpu_ids())
    missing = [c for c in cpu_list or () if c not in known]
    if missing:
        raise PlanError(f"--cpu-list {','.join(map(str, cpu_list or ()))}: cpu(s) "
                        f"{','.join(map(str, missing))} not usable here (usable: "
                        f"{','.join(map(str, topology.cpu_ids()))})")


def _guess(slots: int) -> Topology:
    """A host not heard from yet: one socket of ``slots`` single-thread cores."""
    return make_topology((i, i, 0, 0, 0) for i in range(max(slots, 1)))


def _mapped(hosts: Sequence[Host], topos: Sequence[Topology], np: Optional[int],
            job: JobSpec, oversubscribe: bool) -> Tuple[List[int], List[Tuple[int, ...]]]:
    """Host and location of every rank, in world-rank order (see :mod:`.place`)."""
    per_host = None
    if job.ppr is not None:
        n, kind = job.ppr
        per_host = [n * count(t, kind) for t in topos]
    where = place(hosts, np, map_by=job.map_by, per_node=job.per_node,
                  oversubscribe=oversubscribe, per_host=per_host, wrap=job.per_node_wrap)
    counts: Dict[int, int] = {}
    for h in where:
        counts[h] = counts.get(h, 0) + 1
    if job.pe:
        for h, n in counts.items():
            if hosts[h].local:      # (another host's topology may be a guess yet)
                check_pe(hosts[h].name, topos[h], n, job, oversubscribe)
    at = {h: iter(locations(topos[h], n, job)) for h, n in counts.items()}
    locs = [next(at[h]) for h in where]
    order = rank_order(where, locs, topos, job)
    return [where[i] for i in order], [locs[i] for i in order]


def _from_rankfile(entries, hosts: Sequence[Host], topos: Sequence[Topology],
                   np: Optional[int], job: JobSpec) -> Tuple[List[int], List[Tuple[int, ...]]]:
    """Host and cpus of every rank as a rankfile (``-rf``) says."""
    from ..hosts.rankfile import missing_ranks, slot_cpus
    size = np if np is not None else len(entries)
    missing = missing_ranks(entries, size)
    if missing:
        shown = ", ".join(map(str, missing[:8])) + (" ..." if len(missing) > 8 else "")
        raise PlanError(f"rankfile {job.rankfile}: no line for rank(s) {shown} of the "
                        f"{size}; every rank needs a 'rank N=HOST slot=...' line")
    index = {h.name: i for i, h in enumerate(hosts)}
    local_index = next((i for i, h in enumerate(hosts) if h.local), None)
    from ..hosts import is_local
    where, locs = [], []
    for e in entries:
        if e.rank >= size:
            continue          # -n asked for fewer ranks than the file lists
        if e.relative is not None:
            if e.relative >= len(hosts):
                raise PlanError(f"{e.origin}: +n{e.relative}, but the job has only "
                                f"{len(hosts)} host(s)")
            h = e.relative
        elif e.host in index:
            h = index[e.host]
        elif local_index is not None and is_local(e.host):
            h = local_index
        else:
            raise PlanError(f"{e.origin}: host {e.host!r} is not one of the job's hosts")
        try:
            cpus = slot_cpus(e.slot, topos[h], job.use_hwthreads)
        except ValueError as err:
            raise PlanError(f"{e.origin}: on {hosts[h].name}: {err}") from None
        where.append(h)
        locs.append(cpus)
    return where, locs


def describe_map(plan: Plan) -> str:
    """The ``--display-map`` text, as Open MPI 4 writes it."""
    from .display import job_map
    return job_map(plan)


def agent_hosts(plan: Plan, job: JobSpec) -> List[str]:
    """The remote hosts that get an agent: those with ranks, and -- as Open MPI
    starts a daemon on every host of the allocation -- the hosts the first job
    leaves free, kept ready for the jobs its ranks may spawn, or, in a job that
    may start again, for its ranks should another host be lost (watched
    meanwhile, as every host is)."""
    hosts = [h for h in plan.hosts if not h.local]
    if (job.mpi == PMI and not job.novm) or job.max_job_restarts:
        hosts += [h for h in plan.spare_hosts if not h.local]
    return list(dict.fromkeys(h.name for h in hosts))


def describe_plan(plan: Plan) -> str:
    """``--dry-run``'s text: the map, then each rank's host, directory, command
    line and files."""
    import shlex

    lines = [describe_map(plan)]
    for r in plan.ranks:
        logs = ""
        if r.stdout_path:
            logs = f"  > {r.stdout_path}" + (f"  2> {r.stderr_path}" if r.stderr_path else "")
        lines.append(f"rank {r.rank} on {r.host.name} in {r.cwd}: "
                     f"{' '.join(shlex.quote(a) for a in r.argv)}{logs}")
    return "\n".join(lines) + "\n"
