"""DeepSpeed's dialect: the ``deepspeed`` launcher replaced by ``mslaunch``.

A line is DeepSpeed's (:func:`is_deepspeed`) when an option before its script
is one only DeepSpeed's launcher has, whole or by a unique start of its name
(``--num_gpus``, ``--include``, ``--no_local_rank``, ``--launcher pdsh``...).  Its hosts are DeepSpeed's: the
``--hostfile`` (``HOST slots=N`` lines; ``/job/hostfile`` when there, as
DeepSpeed reads it), narrowed by ``--include``/``--exclude``
(``h1:0,1@h2``) or ``--num_nodes``/``--num_gpus``; without a hostfile this
machine, with its GPUs (those ``CUDA_VISIBLE_DEVICES`` leaves) or, with none,
its NUMA nodes (DeepSpeed's CPU accelerator's count).

Each worker gets what DeepSpeed's per-node ``launch.py`` gives it: ``RANK``,
``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_SIZE``, ``CROSS_RANK`` (its node),
``CROSS_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` (29500 by default),
``CUDA_VISIBLE_DEVICES`` (its node's slots), and runs ``python -u SCRIPT
--local_rank=N ARGS`` (``-m``, ``--no_python``, ``--no_local_rank`` as
DeepSpeed's).  Across nodes the workers also get what DeepSpeed's runners
export: the launcher's ``PYTHON*``, ``MLFLOW*``, ``MV2*``, ``UCX*`` and
``NCCL*`` variables, the lines of ``.deepspeed_env`` (in ``~`` and here;
``DS_ENV_FILE`` names another file) and ``PYTHONPATH`` with the launch
directory first.  ``--launcher`` (pdsh, openmpi, mvapich, mpich, impi, slurm)
names how DeepSpeed would start the nodes: mslaunch starts them itself (the
MPI ones and slurm, across nodes, without ``--local_rank``, as DeepSpeed's).
Without a hostfile ``MASTER_ADDR`` is 127.0.0.1 whatever ``--master_addr``
says, as DeepSpeed's runner has it; the workers' stdout is a terminal where
DeepSpeed's would be (one node, mslaunch's own stdout one).

The line becomes an mpirun-dialect job: one context per node, its hosts as
``-H`` with a slot per worker (see :func:`mpirun_words`), each worker's
``--local_rank`` put in by the planner (``AppContext.local_rank_arg``).
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Mapping, Sequence, Tuple

    from ..core.spec import JobSpec

from ..core.errors import UsageError, one_line
from ..hosts.local import is_local_host
from .common import DEEPSPEED_LAUNCHERS as LAUNCHERS, DEEPSPEED_OPTIONS as OPTIONS

_SHORT = {"-H": "hostfile", "-i": "include", "-e": "exclude", "-q": "quiet"}
#: What DeepSpeed's runners export to every node, by prefix.
EXPORTS = ("MLFLOW", "PYTHON", "MV2", "UCX", "NCCL")
DEFAULT_HOSTFILE = "/job/hostfile"
DEFAULT_PORT = 29500


def read_line(argv: Sequence[str]) -> Tuple[Dict[str, str], List[str]]:
    """The options given (name -> value, "1" for a flag) and the script with its
    arguments; a unique prefix of a name is that option, as argparse takes it."""
    given: Dict[str, str] = {}
    i = 0
    while i < len(argv) and argv[i].startswith("-") and argv[i] != "-":
        word = argv[i]
        if word == "--":
            i += 1
            break
        body, eq, inline = word.partition("=")
        name = _SHORT.get(body) or _resolve(body)
        if not OPTIONS[name]:
            if eq:
                raise UsageError(f"{body} takes no value")
            given[name], i = "1", i + 1
        elif eq:
            given[name], i = inline, i + 1
        elif i + 1 < len(argv):
            given[name], i = argv[i + 1], i + 2
        else:
            raise UsageError(f"{body}: expected a value")
    script = list(argv[i:])
    if not script:
        raise UsageError("no training script given: mslaunch [DeepSpeed's options] SCRIPT "
                         "[ARGS...]")
    return given, script


def _resolve(body: str) -> str:
    name = body[2:] if body.startswith("--") else ""
    if name in OPTIONS:
        return name
    found = [n for n in OPTIONS if name and n.startswith(name)]
    if len(found) == 1:
        return found[0]
    shown = one_line(body, 60)
    if found:
        raise UsageError(f"ambiguous option {shown!r}: it could be "
                         f"{', '.join('--' + n for n in found)}")
    raise UsageError(f"unknown option {shown!r} of DeepSpeed's launcher (a line with "
                     f"--num_gpus, --include... is DeepSpeed's)")


def _whole(flag: str, text: str, low: int) -> int:
    body = text.strip()
    number = body[1:] if body.startswith("-") else body
    if not (number.isascii() and number.isdigit()) or int(body) < low:
        raise UsageError(f"--{flag}={one_line(text, 20)}: expected a whole number"
                         + (f" from {low}" if low >= 0 else ""))
    return int(body)


def read_hostfile(path: str) -> List[Tuple[str, int]]:
    """DeepSpeed's hostfile: ``HOST slots=N`` lines, ``#`` comments, blank lines."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError as err:
        raise UsageError(f"--hostfile {one_line(path, 80)}: {err.strerror}") from None
    return hostfile_lines(lines, path)


def hostfile_lines(lines: Sequence[str], path: str) -> List[Tuple[str, int]]:
    pool: List[Tuple[str, int]] = []
    for number, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        words = line.split()
        count = words[1][6:] if len(words) > 1 and words[1].startswith("slots=") else ""
        if not (count.isascii() and count.isdigit()):
            raise UsageError(f"{path}:{number}: expected 'HOST slots=N' (DeepSpeed's hostfile), "
                             f"not {one_line(line, 60)!r}")
        if any(host == words[0] for host, _ in pool):
            raise UsageError(f"{path}:{number}: {one_line(words[0], 40)} is named twice")
        pool.append((words[0], int(count)))
    if not pool:
        raise UsageError(f"{path}: no 'HOST slots=N' line")
    return pool


def node_specs(text: str, flag: str) -> List[Tuple[str, List[int]]]:
    """``NAME[:SLOT[,SLOT...]][@NAME...]``: (host, slots; [] for all) in order,
    a host named twice merged."""
    found: Dict[str, List[int]] = {}
    for spec in text.split("@"):
        host, colon, slots = spec.strip().partition(":")
        if not host:
            raise UsageError(f"--{flag}={one_line(text, 60)}: a node spec has no host "
                             f"(NAME[:SLOT,...]@NAME...)")
        numbers = []
        for slot in (slots.split(",") if colon else []):
            if not (slot.strip().isascii() and slot.strip().isdigit()):
                raise UsageError(f"--{flag}={one_line(text, 60)}: {one_line(slot, 20)!r} is "
                                 f"not a slot number")
            numbers.append(int(slot))
        found.setdefault(host, []).extend(numbers)
    return [(host, sorted(set(slots))) for host, slots in found.items()]


def resources(pool: Sequence[Tuple[str, int]], include: str, exclude: str
              ) -> List[Tuple[str, List[int]]]:
    """Each host's slots as DeepSpeed's ``--include``/``--exclude`` leave them,
    in the pool's order, hosts with none left out."""
    if include and exclude:
        raise UsageError("--include and --exclude cannot both be given (DeepSpeed refuses "
                         "them together too)")
    active = {host: list(range(count)) for host, count in pool}
    if not include and not exclude:
        return [(h, s) for h, s in active.items() if s]
    flag = "include" if include else "exclude"
    chosen: Dict[str, List[int]] = {} if include else {h: list(s) for h, s in active.items()}
    for host, slots in node_specs(include or exclude, flag):
        if host not in active:
            raise UsageError(f"--{flag}: host {one_line(host, 40)!r} is not in the hostfile")
        for slot in slots:
            if slot not in active[host]:
                raise UsageError(f"--{flag}: {one_line(host, 40)} has no slot {slot}")
        if include:
            chosen[host] = slots or active[host]
        else:
            chosen[host] = [s for s in chosen[host] if s not in slots] if slots else []
    return [(h, chosen[h]) for h in active if chosen.get(h)]


def local_devices() -> int:
    """What DeepSpeed counts on this machine without a hostfile: its GPUs (all of
    them: ``CUDA_VISIBLE_DEVICES`` is read as ``--include``), else the NUMA nodes
    with CPUs."""
    try:
        gpus = sum(1 for n in os.listdir("/dev") if n.startswith("nvidia") and n[6:].isdigit())
    except OSError:
        gpus = 0
    if gpus:
        return gpus
    nodes = 0
    try:
        for name in os.listdir("/sys/devices/system/node"):
            if name.startswith("node") and name[4:].isdigit():
                with open(f"/sys/devices/system/node/{name}/cpulist") as f:
                    nodes += bool(f.read().strip())
    except OSError:
        pass
    return max(nodes, 1)


def deepspeed_env(environ: Mapping[str, str], cwd: str) -> List[Tuple[str, str]]:
    """The ``.deepspeed_env`` files' ``KEY=VALUE`` lines, ``~``'s then the launch
    directory's (``DS_ENV_FILE`` names the file)."""
    name = environ.get("DS_ENV_FILE", ".deepspeed_env")
    found: List[Tuple[str, str]] = []
    for where in (os.path.expanduser("~"), cwd):
        path = os.path.join(where, name)
        if not os.path.isfile(path):
            continue
        try:
            f = open(path, encoding="utf-8", errors="replace")
        except OSError as err:
            raise UsageError(f"{path}: {err.strerror}") from None
        with f:
            # judged by what was opened, not by the name (a link swapped meanwhile)
            trusted(path, os.fstat(f.fileno()))
            for number, line in enumerate(f.read().splitlines(), 1):
                if not line.strip():
                    continue
                key, eq, value = line.partition("=")
                if not eq or not key.strip().isidentifier():
                    raise UsageError(f"{path}:{number}: expected KEY=VALUE, not "
                                     f"{one_line(line, 60)!r}")
                found.append((key.strip(), value.strip()))
    return found


def trusted(path: str, info: os.stat_result) -> None:
    """Refuse a file (``path``, whose status is ``info``) that another user wrote
    or may write: its lines would reach every worker's environment (DeepSpeed
    takes it whoever wrote it)."""
    import stat
    if not stat.S_ISREG(info.st_mode) or info.st_uid not in (os.getuid(), 0) \
            or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UsageError(f"{path}: not read: another user owns it or may write it (its lines "
                         f"would reach every worker); chmod go-w it or remove it")


def _refuse(given: Mapping[str, str]) -> None:
    for name, instead in (
            ("no_ssh", "run the line on one node without --no_ssh: mslaunch starts the "
                       "others itself"),
            ("autotuning", "run DeepSpeed's own launcher for its autotuner"),
            ("venv_script", "the workers run this Python by its full path on every node"),
            ("bind_cores_to_rank", "mslaunch's binding is in its mpirun dialect: -n N "
                                   "--bind-to core"),
            ("bind_core_list", "mslaunch's binding is in its mpirun dialect: --cpu-set LIST"),
            ("enable_each_rank_log", "mslaunch's dialect writes each rank's output to a "
                                     "file with --output-filename DIR")):
        if name in given:
            raise UsageError(f"--{name}: not served by mslaunch ({instead})")
    launcher = given.get("launcher", "pdsh").lower()
    if launcher not in LAUNCHERS:
        raise UsageError(f"--launcher={one_line(launcher, 20)}: expected one of "
                         f"{', '.join(LAUNCHERS)} (mslaunch starts the nodes itself)")


def mpirun_words(given: Mapping[str, str], environ: Mapping[str, str], cwd: str) -> List[str]:
    """The mpirun-dialect words of the job: its hosts, then a context per node
    with that node's variables (its program is put in by :func:`command`)."""
    return _words(given, environ, cwd)[0]


def _words(given: Mapping[str, str], environ: Mapping[str, str], cwd: str
           ) -> Tuple[List[str], bool]:
    """:func:`mpirun_words`, and whether DeepSpeed would start the job through a
    runner of several nodes (its ``--launcher``), not its one node's ``launch.py``."""
    _refuse(given)
    hostfile = given.get("hostfile", DEFAULT_HOSTFILE)
    if "hostfile" not in given and os.path.isfile(hostfile):
        trusted(hostfile, os.stat(hostfile))
    pool = read_hostfile(hostfile) if "hostfile" in given or os.path.isfile(hostfile) \
        else None
    include, exclude = given.get("include", ""), given.get("exclude", "")
    nodes = _whole("num_nodes", given.get("num_nodes", "-1"), -1)
    gpus = _whole("num_gpus", given.get("num_gpus", given.get("num_accelerators", "-1")), -1)
    if (nodes >= 0 or gpus >= 0) and (include or exclude):
        raise UsageError("--num_nodes and --num_gpus cannot be given with --include or "
                         "--exclude (DeepSpeed refuses them together too)")
    local = pool is None
    if local:
        pool = [("localhost", local_devices())]
        visible = environ.get("CUDA_VISIBLE_DEVICES", "").strip()
        if visible and not (include or exclude or nodes > 1 or gpus > 0):
            include = f"localhost:{visible}"      # (DeepSpeed reads it so, then drops it)
        if nodes > 1:
            raise UsageError(f"--num_nodes={nodes}: no hostfile names other nodes "
                             f"(--hostfile FILE, DeepSpeed's 'HOST slots=N' lines)")
    active = resources(pool, include, exclude)  # type: ignore[arg-type]
    if nodes > 0:
        active = active[:nodes]
    if gpus > 0:
        active = [(host, list(range(gpus))) for host, _ in active]
    if not active:
        raise UsageError("no worker is left on any node (--include, --exclude, --num_gpus)")
    here = [host for host, _ in active if is_local_host(host)]
    if len(here) > 1:
        # (one machine is one node here: its workers' LOCAL_RANK, CROSS_RANK and
        # devices would not add up as two nodes')
        raise UsageError(f"{', '.join(one_line(h, 30) for h in here)} are all this machine: "
                         f"name it once in the hostfile, with all its slots")
    many = (len(active) > 1 or "force_multi" in given or len(here) < len(active)) \
        and not local
    port = _whole("master_port", given.get("master_port", str(DEFAULT_PORT)), 0)
    words = ["-H", ",".join(f"{host}:{len(slots)}" for host, slots in active)]
    if "ssh_port" in given:
        words += ["--ssh-port", str(_whole("ssh_port", given["ssh_port"], 1))]
    # (without a hostfile DeepSpeed's runner puts 127.0.0.1 in place of --master_addr)
    addr = "127.0.0.1" if local else given.get("master_addr", "").strip() or \
        first_address([h for h, _ in active])
    shared = [("MASTER_PORT", str(port))] + ([("MASTER_ADDR", addr)] if addr else [])
    # (deepspeed's import sets it, unless set, in each node's launcher: its workers have it)
    shared.append(("PYTORCH_NVML_BASED_CUDA_CHECK",
                   environ.get("PYTORCH_NVML_BASED_CUDA_CHECK", "1")))
    if many:
        shared += [(k, v) for k, v in environ.items() if k.startswith(EXPORTS)]
        old = environ.get("PYTHONPATH")
        shared += [("PYTHONPATH", cwd + (":" + old if old else ""))]
        shared += deepspeed_env(environ, cwd)
    contexts: List[str] = []
    for node, (_host, slots) in enumerate(active):
        if contexts:
            contexts.append(":")
        contexts += ["-n", str(len(slots))]
        for key, value in [*shared, ("CUDA_VISIBLE_DEVICES", ",".join(map(str, slots))),
                           ("CROSS_RANK", str(node)), ("CROSS_SIZE", str(len(active))),
                           ("LOCAL_SIZE", str(len(slots)))]:
            contexts += ["-x", f"{key}={value}"]
        contexts.append(sys.executable)        # (the worker's command: see command())
    return words + contexts, many


def first_address(hosts: Sequence[str]) -> str:
    """The first node's address for ``MASTER_ADDR``: DeepSpeed asks that node for
    ``hostname -I``'s first; here it is the address the launcher reaches it by
    (its ``HostName`` in ``~/.ssh/config``, resolved), or, for this machine,
    its address towards the next node."""
    import socket
    from ..hosts.local import route_address
    from ..backends.agents.starters.ssh.config import SSHConfig

    def address(host: str) -> str:
        name = host
        path = os.path.expanduser("~/.ssh/config")
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                name = str(SSHConfig(f.read(), path).lookup(host).get("hostname") or host)
        except OSError:
            pass
        try:
            return str(socket.getaddrinfo(name, None, socket.AF_INET)[0][4][0])
        except (OSError, IndexError):
            return name

    if is_local_host(hosts[0]) and len(hosts) > 1:
        return route_address(address(hosts[1])) or address(hosts[0])
    return address(hosts[0])


#: DeepSpeed's runners of several nodes that start the workers through an MPI
#: launcher or srun, without ``launch.py``: their workers get no ``--local_rank``.
MPI_RUNNERS = ("openmpi", "mvapich", "mpich", "impi", "slurm")


def worker_command(given: Mapping[str, str], script: Sequence[str], many: bool = False
                   ) -> Tuple[List[str], int]:
    """What each worker runs, as DeepSpeed's launch.py runs it (or, across nodes
    with an MPI ``--launcher``, that launcher), and where its ``--local_rank=N``
    goes (-1: none, ``--no_local_rank`` or such a launcher)."""
    module, no_python = "module" in given, "no_python" in given
    if module and no_python:
        raise UsageError("--module and --no_python cannot both be given (DeepSpeed refuses "
                         "them together too)")
    head = [] if no_python else [sys.executable, "-u"] + (["-m"] if module else [])
    runner = many and given.get("launcher", "pdsh").lower() in MPI_RUNNERS
    at = -1 if "no_local_rank" in given or runner else len(head) + 1
    return head + list(script), at


def command(argv: Sequence[str]) -> JobSpec:
    """The job of a DeepSpeed launcher line."""
    from ..core.spec import replace
    from .common import launch_dir
    from .mpirun import parse_args
    given, script = read_line(argv)
    cwd = launch_dir()
    words, many = _words(given, os.environ, cwd)
    job = parse_args(words, cwd=cwd, defaults=False)
    # The worker's command goes in whole: through the mpirun dialect a ':' among
    # the script's words would start another context.
    command, at = worker_command(given, script, many)
    apps = tuple(replace(app, argv=tuple(command),
                         local_rank_arg=None if at < 0 else (at, "--local_rank="))
                 for app in job.apps)
    # DeepSpeed's workers write to its own stdout on one node (a terminal only where
    # it is one), through pdsh's ssh across nodes (never one)
    from ..core.switches import pty_wanted
    pty = pty_wanted(os.environ, False, sys.stdout.isatty() and not many)
    return replace(job, apps=apps, output=replace(job.output, pty=pty))
