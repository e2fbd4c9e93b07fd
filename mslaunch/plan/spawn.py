"""Placing the processes of an ``MPI_Comm_spawn`` (pure, as the rest of the plan).

A spawned job runs on the hosts of the launch: those of the first job,
and those of the host list it left free (Open MPI starts its daemons on
every host of the allocation for the same reason).  Its processes
take the slots no live process holds, host by host in the plan's order (as
Open MPI does); a command whose ``host``/``hosts``/``hostfile`` info names
hosts uses only those.  When the free slots run out, the job may
oversubscribe if the first job could (``--oversubscribe``, or no host list
at all): the rest go round-robin over the candidate hosts; otherwise the
spawn is refused with a line saying why.  ``wdir`` sets the working
directory (relative to the launch directory) and ``path`` a directory the
program is looked for in first, as under Hydra.  Other info keys are
ignored, as Hydra ignores them.

The new job is Open MPI's job number ``number`` (``[number,N]`` tags,
``DIR/number/rank.N`` files); its processes are numbered on from
``first_key`` among the launcher's processes.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from ..core.errors import PlanError
from ..core.spec import Host, JobSpec, Plan, RankSpec, SpawnCommand, SpawnRequest
from . import context_environment, log_paths, pattern_paths, rank_variables

#: At most this many processes in one spawn (the first job's own cap).
MAX_SPAWN = 100_000


def _named_hosts(command: SpawnCommand, hosts: Sequence[Host], launch_dir: str,
                 is_local: Callable[[str], bool]) -> Optional[List[int]]:
    """Indices into ``hosts`` named by the command's info, or None if it names none."""
    names: List[str] = []
    for key, value in command.info:
        if key in ("host", "hosts"):
            names += [n.strip() for n in value.split(",") if n.strip()]
        elif key == "hostfile":
            import stat

            from ..hosts.hostfile import parse_hostfile
            path = os.path.join(launch_dir, value)
            try:
                # A rank names it: never a FIFO or a device the launcher would block on.
                if not stat.S_ISREG(os.stat(path).st_mode):
                    raise PlanError(f"info hostfile={value[:40]!r}: not a regular file")
                names += [e.name for e in parse_hostfile(path)]
            except OSError as err:
                raise PlanError(f"info hostfile={value[:40]!r}: {err.strerror}") from None
    if not names:
        return None
    chosen: List[int] = []
    for name in names:
        name = name.split(":", 1)[0]
        found = [i for i, h in enumerate(hosts) if h.name == name
                 or (h.local and is_local(name))]
        if not found:
            shown = ", ".join(h.name for h in hosts[:8])
            raise PlanError(f"info host={name[:40]!r} is not a host of this job "
                            f"(its hosts: {shown})")
        chosen += [i for i in found if i not in chosen]
    return chosen


def _place(request: SpawnRequest, hosts: Sequence[Host], live: Mapping[str, int],
           oversubscribe: bool, launch_dir: str,
           is_local: Callable[[str], bool]) -> List[int]:
    """The host (an index into ``hosts``) of every new process, in rank order."""
    free = [max(0, h.slots - live.get(h.name, 0)) for h in hosts]
    where: List[int] = []
    for command in request.commands:
        candidates = _named_hosts(command, hosts, launch_dir, is_local) or \
            list(range(len(hosts)))
        need = command.nprocs
        for i in candidates:
            take = min(free[i], need)
            where += [i] * take
            free[i] -= take
            need -= take
        if need and not oversubscribe:
            slots = sum(hosts[i].slots for i in candidates)
            busy = sum(live.get(hosts[i].name, 0) for i in candidates)
            raise PlanError(f"not enough free slots to spawn {command.nprocs} process(es) "
                            f"of {command.program[:40]!r}: {busy} of {slots} slot(s) in use; "
                            f"run mslaunch with --oversubscribe to allow more processes "
                            f"than slots")
        turn = 0
        while need:
            where.append(candidates[turn % len(candidates)])
            turn += 1
            need -= 1
    return where


def plan_spawn(job: JobSpec, plan: Plan, request: SpawnRequest, *, number: int,
               kvsname: str, first_key: int, live: Mapping[str, int],
               environ: Mapping[str, str], oversubscribe: bool,
               is_local: Callable[[str], bool], hosts: Sequence[Host] = (),
               context_env=()) -> Tuple[Tuple[RankSpec, ...], str]:
    """The new job's processes and its ``PMI_process_mapping``.

    ``hosts`` are where it may run (default: the first job's); ``live`` counts
    the live processes per host name; ``context_env`` are the
    ``-x`` exports of the spawning rank's context, which its children get
    too.  Raises PlanError when the request cannot be placed (see the module
    docstring).
    """
    size = sum(c.nprocs for c in request.commands)
    if not request.commands or size < 1 or any(c.nprocs < 1 for c in request.commands):
        raise PlanError("a spawn of no processes")
    if size > MAX_SPAWN:
        raise PlanError(f"a spawn of {size} processes (at most {MAX_SPAWN})")
    hosts = hosts or plan.hosts
    where = _place(request, hosts, live, oversubscribe, job.launch_dir, is_local)
    node_of: Dict[int, int] = {}
    for h in where:
        node_of.setdefault(h, len(node_of))
    from ..core.procmap import process_mapping
    mapping = process_mapping([node_of[h] for h in where])
    local_size: Dict[int, int] = {}
    for h in where:
        local_size[h] = local_size.get(h, 0) + 1
    sizes = [c.nprocs for c in request.commands]
    universe = sum(h.slots for h in hosts)
    envs = context_environment(job, context_env, environ, plan.master_addr, plan.master_port,
                               plan.ompi_jobid)
    remote_inherit = "none" if not job.inherit_env else ("launcher" if job.forward_env
                                                           else "remote")
    specs: List[RankSpec] = []
    seen: Dict[int, int] = {}
    rank = 0
    for app, command in enumerate(request.commands):
        info = dict(command.info)
        wdir = info.get("wdir")
        cwd = os.path.normpath(os.path.join(job.launch_dir, wdir)) if wdir else job.launch_dir
        search = (info["path"],) + tuple(job.exec_path) if info.get("path") else job.exec_path
        for _ in range(command.nprocs):
            h = where[rank]
            host = hosts[h]
            local_rank = seen.get(h, 0)
            seen[h] = local_rank + 1
            env = dict(envs[0 if host.local else 1])
            env.update(rank_variables(rank=rank, size=size, local_rank=local_rank,
                                      local_size=local_size[h], group=node_of[h],
                                      host=host.name, universe=universe, sizes=sizes,
                                      kvsname=kvsname, pmi=True,
                                      hostname=job.propagate_hostname))
            env["PMI_SPAWNED"] = "1"
            # Without a job number of its own a spawned job's files would
            # overwrite the first job's (DIR:nojobid): they get one anyway.
            out, err = log_paths(job.output.directory, True, job.output.merge_stderr,
                                 rank, size, jobid=number)
            if job.output.stdout_pattern or job.output.stderr_pattern:
                out, err = pattern_paths(job.output, out, err, rank, host, job=number)
            specs.append(RankSpec(
                rank=rank, app=app, host=host, local_rank=local_rank,
                local_size=local_size[h], argv=(command.program,) + command.args, env=env,
                cwd=cwd, stdout_path=out, stderr_path=err, stdin="null",
                inherit="launcher" if host.local else remote_inherit,
                path_prefix=None if host.local or remote_inherit != "remote" else job.prefix,
                search=search, job=number, index=first_key + rank))
            rank += 1
    return tuple(specs), mapping
