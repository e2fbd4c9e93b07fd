"""The ``JOB`` frame: what the launcher tells an agent about its host's ranks.

:func:`job_frame` builds it on the launcher's side; :func:`read_job` is the
agent's side: it checks every field -- types, ranges, finite numbers, no NUL
in argv or environment, a kvsname that is safe in file names and in the
guard's line protocol -- and fills the defaults, so nothing later in the
agent meets a value of the wrong kind.  A bad frame is a
:class:`~mslaunch.wire.link.LinkError` (the agent reports a protocol
error and stops), never a crash.
"""

from __future__ import annotations

import math
import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Sequence, Tuple

    from ..core.spec import JobSpec, Plan

from ..mpi.pmi.files import is_kvsname
from ..mpi.pmix import turned_off
from ..core.spec import Host, RankSpec, replace
from .link import LinkError
from ..machine.samepython import found_here, read_here

#: Bytes of output an agent may send before the launcher grants more.
CREDIT = 8 << 20

#: The bound of a job frame's counts and numbers (ranks, sizes, apps, nodes).
_MAX_RANK = 1 << 24


def job_frame(job: JobSpec, plan: Plan, host: str, specs: Sequence[RankSpec], heartbeat,
              pmi: Optional[str], universe: int = -1) -> Dict[str, Any]:
    """The ``JOB`` frame of one host: its ranks (maybe none yet), and what they share
    said once."""
    common: Optional[Dict[str, str]] = None
    for spec in specs:
        if common is None:
            common = dict(spec.env)
        else:
            for key in [k for k, v in common.items() if spec.env.get(k) != v]:
                del common[key]
    common = common or {}
    contexts: List[int] = []
    for r in plan.ranks:
        if r.app == len(contexts):
            contexts.append(0)
        contexts[r.app] += 1
    from ..plan.display import job_id
    files, programs = _preloads(job, specs)
    ranks = rank_entries([replace(s, program=programs[s.key]) if s.key in programs else s
                          for s in specs], common)
    return {"kvsname": plan.kvsname, "jobid": job_id(), "grace": job.grace, "files": files,
            "heartbeat": list(heartbeat),
            "credit": CREDIT, "merge_stderr": job.output.merge_stderr, "pmi": pmi,
            "pty": job.output.pty,
            "size": len(plan.ranks), "universe_size": universe,
            "appnums": [r.app for r in plan.ranks] if len(contexts) > 1 else None,
            "process_mapping": plan.process_mapping, "bind_to": job.bind_to,
            "launch_dir": job.launch_dir, "host": host,
            "common_env": common, "ranks": ranks, "trace": job.verbose >= 2,
            "port_range": list(job.port_range) if job.port_range else None,
            # for the agent's PMIx server (mslaunch.mpi.pmix): the hosts by node id
            "pmix_nodes": [h.name for h in plan.hosts] if pmi and not turned_off(os.environ)
            else None,
            "pmix_universe": plan.universe_size,
            # where this host's programs named without a '/' are here (remote.samepython)
            "here": found_here(specs, os.environ)}


#: The :class:`~mslaunch.core.spec.RankSpec` fields a frame carries under their own
#: names, besides ``host`` (its ``node_id`` alone) and ``env`` (what differs
#: from the frame's common environment).  The rest -- output paths, label,
#: console -- are the launcher's own business.
RANK_FIELDS = ("rank", "index", "job", "app", "local_rank", "local_size", "argv", "cwd",
               "stdin", "cpus", "search", "session_dir", "inherit", "path_prefix", "program")


def rank_entries(specs: Sequence[RankSpec], common: Dict[str, str]) -> List[Dict[str, Any]]:
    """The ranks of a ``JOB`` frame (or of a spawned job): their own fields, and
    of their environment what differs from ``common``; :func:`read_job` and
    :func:`read_spawned` rebuild them."""
    entries = []
    for spec in specs:
        entry: Dict[str, Any] = {name: getattr(spec, name) for name in RANK_FIELDS}
        entry.update(argv=list(spec.argv), search=list(spec.search),
                     cpus=list(spec.cpus) if spec.cpus else None, node_id=spec.host.node_id,
                     env={k: v for k, v in spec.env.items() if common.get(k) != v})
        entries.append(entry)
    return entries


def spawn_frame(number: int, kvsname: str, spawner: str, specs: Sequence[RankSpec],
                size: int, mapping: str, appnums: Sequence[int], universe: int,
                tcp: bool) -> Dict[str, Any]:
    """The ``PMI`` message that starts a spawned job's processes on a host."""
    return {"op": "job", "kvs": kvsname, "number": number, "spawner": spawner, "size": size,
            "process_mapping": mapping, "appnums": list(appnums), "universe_size": universe,
            "pmi": "port" if tcp else "fd", "ranks": rank_entries(specs, {})}


def _preloads(job: JobSpec, specs: Sequence[RankSpec]):
    """``--preload-binary`` and ``--preload-files``: what goes to the host's directories.

    Returns the files (name, mode, base64 data) and, for a preloaded binary,
    the program each rank runs instead (``./NAME`` in its directory).
    """
    import base64

    from ..core.errors import LaunchError
    from ..machine.spawn import find_program
    wanted: Dict[str, str] = {}            # name in the rank's directory -> local path
    programs: Dict[int, str] = {}
    if job.preload_binary:
        for spec in specs:
            program = spec.program or spec.argv[0]
            path = find_program(program, os.environ, job.launch_dir, spec.search)
            if path is None:
                raise LaunchError(f"--preload-binary: program {program!r} not found here")
            name = os.path.basename(path)
            wanted[name] = path
            programs[spec.key] = "./" + name
    for path in job.preload_files:
        wanted[os.path.basename(path)] = path
    files = []
    total = 0
    for name, path in wanted.items():
        try:
            with open(path, "rb") as f:
                data = f.read()
            mode = os.stat(path).st_mode & 0o777
        except OSError as err:
            raise LaunchError(f"--preload: cannot read {path}: {err.strerror}") from None
        total += len(data)
        if total > 32 << 20:
            raise LaunchError("--preload-binary/--preload-files: more than 32 MiB to copy; "
                              "put large files on a shared file system")
        files.append({"name": name, "mode": mode, "data": base64.b64encode(data).decode()})
    return files, programs


# -- the agent's side -----------------------------------------------------------

def _bad(name: str, what: str) -> LinkError:
    return LinkError(f"JOB: {name} {what}")


def _int(value: Any, name: str, low: int = 0, high: int = 1 << 62) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise _bad(name, f"is not a whole number in [{low}, {high}]")
    return value


def _number(value: Any, name: str, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or not low <= value <= high:
        raise _bad(name, f"is not a number in [{low}, {high}]")
    return float(value)


def _text(value: Any, name: str, *, empty: bool = True) -> str:
    if not isinstance(value, str) or "\0" in value or (not empty and not value):
        raise _bad(name, "is not a string" + ("" if empty else " (non-empty)")
                   + " without NUL")
    return value


def _maybe_text(value: Any, name: str) -> Optional[str]:
    return None if value is None else _text(value, name)


def _texts(value: Any, name: str, *, empty: bool = True) -> List[str]:
    if not isinstance(value, list) or (not empty and not value):
        raise _bad(name, "is not a list" + ("" if empty else " (non-empty)"))
    return [_text(v, name) for v in value]


def _env(value: Any, name: str) -> Dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _bad(name, "is not a mapping")
    for key, item in value.items():
        _text(key, f"{name} name", empty=False)
        if "=" in key:
            raise _bad(name, f"has a name with '=': {key[:40]!r}")
        _text(item, f"{name}[{key[:40]!r}]")
    return value


def _choice(value: Any, name: str, choices: Sequence[Any]) -> Any:
    if value not in choices or isinstance(value, bool) != isinstance(choices[0], bool):
        raise _bad(name, f"is not one of {', '.join(map(repr, choices))}")
    return value


def _rank(r: Any, size: int, name: str, slots: int) -> RankSpec:
    """One rank entry checked and rebuilt; its ``env`` is the entry's alone (the
    agent composes the whole environment), its host is ``name`` on this machine."""
    if not isinstance(r, dict):
        raise _bad("rank entry", "is not a mapping")
    cpus = r.get("cpus")
    index = r.get("index")
    return RankSpec(
        rank=_int(r.get("rank"), "rank", 0, size - 1),
        index=None if index is None else _int(index, "index", 0, 1 << 40),
        job=_int(r.get("job", 1), "job", 1, 1 << 20),
        app=_int(r.get("app", 0), "app", 0, _MAX_RANK),
        host=Host(name=name, slots=slots, max_slots=None, local=True,
                  node_id=_int(r.get("node_id", 0), "node_id", 0, _MAX_RANK)),
        local_rank=_int(r.get("local_rank"), "local_rank", 0, _MAX_RANK),
        local_size=_int(r.get("local_size"), "local_size", 1, _MAX_RANK),
        argv=tuple(_texts(r.get("argv"), "argv", empty=False)),
        env=_env(r.get("env"), "env"),
        cwd=_text(r.get("cwd"), "cwd", empty=False),
        stdout_path=None, stderr_path=None,
        stdin=_text(r.get("stdin", "null"), "stdin"),
        cpus=None if not cpus else tuple(_int(c, "cpus", 0, 1 << 20) for c in
                                         (cpus if isinstance(cpus, list) else [None])),
        search=tuple(_texts(r.get("search") or [], "search")),
        session_dir=bool(r.get("session_dir")),
        inherit=_choice(r.get("inherit", "remote"), "inherit", ("remote", "launcher", "none")),
        path_prefix=_maybe_text(r.get("path_prefix"), "path_prefix"),
        program=_maybe_text(r.get("program") or None, "program"))


def _ranks(ranks: Any, size: int, name: str, slots: int) -> List[RankSpec]:
    if not isinstance(ranks, list) or not ranks or len(ranks) > _MAX_RANK:
        raise _bad("ranks", "is not a non-empty list")
    checked = [_rank(r, size, name, slots) for r in ranks]
    if len({r.rank for r in checked}) != len(checked) or \
            len({r.key for r in checked}) != len(checked):
        raise _bad("ranks", "name a rank twice")
    return checked


def _kvsname(value: Any) -> str:
    if not is_kvsname(value):
        raise _bad("kvsname", "is missing or not a name of letters, digits and _.:-")
    return value


def read_spawned(body: Dict[str, Any], name: str, slots: int) -> Dict[str, Any]:
    """A spawned job's message (:func:`spawn_frame`), checked; its ``ranks`` are
    :class:`~mslaunch.core.spec.RankSpec` records on host ``name`` (see :func:`_rank`)."""
    size = _int(body.get("size"), "size", 1, _MAX_RANK)
    appnums = body.get("appnums")
    if not isinstance(appnums, list) or len(appnums) != size:
        raise _bad("appnums", f"is not a list of {size} numbers")
    return {"kvs": _kvsname(body.get("kvs")), "spawner": _kvsname(body.get("spawner")),
            "number": _int(body.get("number"), "number", 2, 1 << 20), "size": size,
            "process_mapping": _text(body.get("process_mapping") or "", "process_mapping"),
            "appnums": [_int(a, "appnums", 0, _MAX_RANK) for a in appnums],
            "universe_size": _int(body.get("universe_size"), "universe_size", -1, 1 << 40),
            "pmi": _choice(body.get("pmi"), "pmi", ("fd", "port")),
            "ranks": _ranks(body.get("ranks"), size, name, slots), **_spawned_pmix(body, size)}


def _spawned_pmix(body: Dict[str, Any], size: int) -> Dict[str, Any]:
    """The PMIx layout of a job an Open MPI rank spawned (none for MPICH's):
    its hosts, each process's host among them, the universe and the parent."""
    if body.get("pmix_nodes") is None:
        return {}
    nodes, node_of = _pmix_nodes(body, size)
    parent = body.get("pmix_parent")
    if not isinstance(parent, list) or len(parent) != 2:
        raise _bad("pmix_parent", "is not [namespace, rank]")
    return {"pmix_nodes": nodes, "pmix_node_of": node_of,
            "pmix_universe": _int(body.get("pmix_universe"), "pmix_universe", 0, _MAX_RANK),
            "pmix_parent": [_text(parent[0], "pmix_parent", empty=False),
                            _int(parent[1], "pmix_parent", 0, _MAX_RANK)]}


def _pmix_nodes(body: Dict[str, Any], size: int) -> Tuple[List[str], List[int]]:
    """A job's hosts (``pmix_nodes``) and each of its ``size`` processes' host among
    them (``pmix_node_of``)."""
    nodes = _texts(body.get("pmix_nodes"), "pmix_nodes", empty=False)
    node_of = body.get("pmix_node_of")
    if not isinstance(node_of, list) or len(node_of) != size:
        raise _bad("pmix_node_of", "is not a list of numbers, one per process")
    return nodes, [_int(n, "pmix_node_of", 0, len(nodes) - 1) for n in node_of]


def spawn_request_body(request) -> Dict[str, Any]:
    """A :class:`~mslaunch.core.spec.SpawnRequest` as an agent relays it."""
    return {"commands": [{"program": c.program, "args": list(c.args), "nprocs": c.nprocs,
                          "info": [list(p) for p in c.info]} for c in request.commands],
            "preput": [list(p) for p in request.preput]}


def read_guest(body: Dict[str, Any]) -> Tuple[List[str], List[int], List[int], int]:
    """A ``pmix_guest`` message: a job's hosts, each process's host among them, its
    application numbers and universe (LinkError if malformed)."""
    appnums = body.get("appnums")
    if not isinstance(appnums, list) or not 0 < len(appnums) <= _MAX_RANK:
        raise _bad("appnums", "is not a list of numbers, one per process")
    nodes, node_of = _pmix_nodes(body, len(appnums))
    return (nodes, node_of, [_int(a, "appnums", 0, _MAX_RANK) for a in appnums],
            _int(body.get("pmix_universe"), "pmix_universe", 0, _MAX_RANK))


def read_spawn_env(body: Dict[str, Any]) -> Tuple[Tuple[str, str], ...]:
    """The variables an Open MPI rank's spawned application carries (``env``)."""
    from ..mpi.pmi.spawn import MAX_INFO
    env = _pairs(body.get("env", []), "spawn env", 4 * MAX_INFO)
    if not all(name and "=" not in name for name, _ in env):
        raise _bad("spawn env", "is not a list of [name, value] strings")
    return env


def _pairs(value: Any, name: str, most: int) -> Tuple[Tuple[str, str], ...]:
    """At most ``most`` ``[key, value]`` lists of strings, as pairs."""
    if not isinstance(value, list) or len(value) > most or not all(
            isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) for x in p)
            for p in value):
        raise _bad(name, "is not a list of [key, value] strings")
    return tuple((p[0], p[1]) for p in value)


def read_spawn(body: Dict[str, Any]):
    """The :class:`~mslaunch.core.spec.SpawnRequest` an agent relayed (LinkError if malformed)."""
    from ..mpi.pmi.spawn import MAX_ARGS, MAX_COMMANDS, MAX_INFO, MAX_PREPUT, MAX_PROCS
    from ..core.spec import SpawnCommand

    commands = body.get("commands")
    if not isinstance(commands, list) or not 0 < len(commands) <= MAX_COMMANDS:
        raise _bad("spawn commands", "are not a non-empty list")
    out = []
    for c in commands:
        if not isinstance(c, dict):
            raise _bad("spawn command", "is not a mapping")
        args = _texts(c.get("args"), "spawn args")
        if len(args) > MAX_ARGS:
            raise _bad("spawn args", "are too many")
        out.append(SpawnCommand(program=_text(c.get("program"), "spawn program", empty=False),
                                args=tuple(args),
                                nprocs=_int(c.get("nprocs"), "spawn nprocs", 1, MAX_PROCS),
                                info=_pairs(c.get("info"), "spawn info", MAX_INFO)))
    from ..mpi.pmi.spawn import _request
    try:
        return _request(out, _pairs(body.get("preput"), "spawn preput", MAX_PREPUT),
                        sum(c.nprocs for c in out))
    except ValueError as err:
        raise _bad("spawn", str(err)) from None


def _port_range(value: Any) -> Optional[Tuple[int, int]]:
    """The job's port range (``[low, high]``, 1 <= low <= high <= 65535) or None."""
    if value is None:
        return None
    if not isinstance(value, list) or len(value) != 2:
        raise _bad("port_range", "is not [low, high]")
    low = _int(value[0], "port_range", 1, 65535)
    return low, _int(value[1], "port_range", low, 65535)


def read_job(body: Dict[str, Any], here: str) -> Dict[str, Any]:
    """The ``JOB`` frame checked and completed with defaults (see the module
    docstring); its ``ranks`` are :class:`~mslaunch.core.spec.RankSpec` records on the
    host the frame names, or ``here`` (see :func:`_rank`)."""
    kvsname = _kvsname(body.get("kvsname"))
    ranks = body.get("ranks")
    if not isinstance(ranks, list) or len(ranks) > _MAX_RANK:
        raise _bad("ranks", "is not a list")
    heartbeat = body.get("heartbeat", [1.0, 5])
    if not isinstance(heartbeat, list) or len(heartbeat) != 2:
        raise _bad("heartbeat", "is not [interval, misses]")
    pmi = _choice(body.get("pmi"), "pmi", (None, "fd", "port"))
    size = _int(body.get("size", len(ranks)) if pmi is None else body.get("size"),
                "size", 1, _MAX_RANK)
    appnums = body.get("appnums")
    if appnums is not None:
        if not isinstance(appnums, list) or len(appnums) != size:
            raise _bad("appnums", f"is not a list of {size} numbers")
        appnums = [_int(a, "appnums", 0, _MAX_RANK) for a in appnums]
    files = body.get("files") or []
    if not isinstance(files, list) or not all(
            isinstance(f, dict) and isinstance(f.get("name"), str)
            and isinstance(f.get("data"), str) and not isinstance(f.get("mode"), bool)
            and isinstance(f.get("mode"), int) for f in files):
        raise _bad("files", "is not a list of {name, mode, data}")
    host = _maybe_text(body.get("host"), "host") or here
    checked = _ranks(ranks, size, host, len(ranks)) if ranks else []
    data = body.get("data")
    if data is not None and not isinstance(data, dict):
        raise _bad("data", "is not a mapping")
    return {
        "kvsname": kvsname,
        "jobid": _text(body.get("jobid", "[0,1]"), "jobid"),
        "grace": _number(body.get("grace", 5.0), "grace", 0.0, 86400.0),
        "heartbeat": (_number(heartbeat[0], "heartbeat interval", 0.01, 3600.0),
                      _int(heartbeat[1], "heartbeat misses", 1, 10000)),
        "credit": _int(body.get("credit", 1 << 22), "credit", 1, 1 << 40),
        "merge_stderr": bool(body.get("merge_stderr")),
        "pty": _choice(body.get("pty", True), "pty", (True, False)),
        "pmi": pmi,
        "size": size,
        "universe_size": _int(body.get("universe_size", size), "universe_size", -1, _MAX_RANK),
        "appnums": appnums or [0] * size,
        "process_mapping": _text(body.get("process_mapping") or "", "process_mapping"),
        "launch_dir": _maybe_text(body.get("launch_dir"), "launch_dir"),
        "host": host,
        "common_env": _env(body.get("common_env"), "common_env"),
        "files": files,
        "data": data,
        "trace": bool(body.get("trace")),
        "port_range": _port_range(body.get("port_range")),
        "pmix_nodes": (_texts(body["pmix_nodes"], "pmix_nodes", empty=False)
                       if body.get("pmix_nodes") is not None else None),
        "pmix_universe": _int(body.get("pmix_universe", size), "pmix_universe", 0, _MAX_RANK),
        "ranks": checked,
        "here": read_here(body.get("here")),
    }
