"""What a torchrun command line's settings mean (see :mod:`.torchrun`): checked
one by one, each bad value one error line naming the option, then the job.

One node runs here: torchrun's single-node default (no ``--master-port`` and
no endpoint: a rendezvous of its own), ``--standalone`` and a static
rendezvous with ``--master-port`` give the workers the ``MASTER_ADDR``,
``MASTER_PORT`` and ``TORCHELASTIC_RUN_ID`` torchrun would.  A line for
several nodes (``--nnodes 2``, ``1:4``) is run by :mod:`.torchnodes`.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Mapping, Optional, Sequence, Set, Tuple

from ..core.errors import UsageError, one_line
from ..core.spec import AppContext, HostEntry, JobSpec, OutputSpec, TorchSpec

#: torchrun's warning when it sets OMP_NUM_THREADS (its words).
OMP_WARNING = ("Setting OMP_NUM_THREADS environment variable for each process to be 1 in "
               "default, to avoid your system being overloaded, please further tune the "
               "variable for optimal performance in your application as needed.")
#: ``--rdzv-backend`` names torchrun registers that mslaunch does not serve.
NOT_SERVED = ("etcd", "etcd-v2")


def _say(flag: str, text: Optional[str]) -> str:
    option, space, key = flag.partition(" ")      # ("rdzv_conf KEY": the key as typed)
    return f"--{option.replace('_', '-')}{space}{key}={one_line(text or '', 40)}"


def _whole(flag: str, text: Optional[str], low: int = 0, high: int = 10**9) -> int:
    body = (text or "").strip()
    if not body.isascii() or not body.isdigit() or not low <= int(body) <= high:
        bound = f"a whole number from {low}" + (f" to {high}" if high < 10**9 else "")
        raise UsageError(f"{_say(flag, text)}: expected {bound}")
    return int(body)


def _seconds(flag: str, text: Optional[str]) -> float:
    body = (text or "").strip()
    try:
        # float() also reads other scripts' digits ("٣"): a flag takes ASCII alone
        value = float(body) if body.isascii() else -1.0
    except ValueError:
        value = -1.0
    if not 0 < value <= 1e9:
        raise UsageError(f"{_say(flag, text)}: expected seconds above 0 (1e9 at most)")
    return value


def nnodes(text: Optional[str]) -> Tuple[int, int]:
    """``N`` or ``MIN:MAX``, ``0 < MIN <= MAX``."""
    parts = (text or "").split(":")
    if len(parts) > 2:
        raise UsageError(f"{_say('nnodes', text)}: expected N or MIN:MAX")
    low = _whole("nnodes", parts[0], 1)
    high = _whole("nnodes", parts[-1], 1)
    if low > high:
        raise UsageError(f"{_say('nnodes', text)}: MIN ({low}) is above MAX ({high})")
    return low, high


def _gpus() -> int:
    """The GPUs a worker would see (``torch.cuda.device_count()``, torchrun's count)."""
    try:
        found = sum(1 for n in os.listdir("/dev") if n.startswith("nvidia") and n[6:].isdigit())
    except OSError:
        found = 0
    return visible_gpus(found, os.environ.get("CUDA_VISIBLE_DEVICES"))


def visible_gpus(present: int, visible: Optional[str]) -> int:
    """How many of ``present`` GPUs ``CUDA_VISIBLE_DEVICES`` leaves, read as CUDA
    reads it: entries up to the first that names no device (an index out of
    range, ``-1``, anything else; a ``GPU-``/``MIG-`` id counts), so that an
    empty value leaves none; a device named twice leaves none at all (torch
    2.x on an H100: ``0,0`` gives ``device_count() == 0``)."""
    if visible is None:
        return present
    seen: Set[str] = set()
    for entry in visible.split(","):
        entry = entry.strip()
        if entry.isascii() and entry.isdigit():
            if int(entry) >= present:
                break
            entry = str(int(entry))
        elif not entry.startswith(("GPU-", "MIG-")):
            break
        if entry in seen:
            return 0
        seen.add(entry)
    return min(len(seen), present)


def nproc(text: Optional[str]) -> int:
    """``--nproc-per-node``: a number, ``cpu``, ``gpu``, ``xpu`` or ``auto``."""
    word = (text or "").strip()
    if word == "cpu" or (word == "auto" and not _gpus()):
        return len(os.sched_getaffinity(0))
    if word in ("gpu", "auto"):
        found = _gpus()
        if not found:
            hidden = os.environ.get("CUDA_VISIBLE_DEVICES")
            where = "on this machine" if hidden is None else \
                f"visible (CUDA_VISIBLE_DEVICES={one_line(hidden, 40)!r})"
            raise UsageError(f"{_say('nproc_per_node', text)}: no GPU {where} (torchrun "
                             f"fails there too: 'Cuda is not available'); give cpu, auto or a "
                             f"number")
        return found
    if word == "xpu":
        raise UsageError(f"{_say('nproc_per_node', text)}: no XPU on this machine; give cpu, "
                         f"auto or a number")
    if not (word.isascii() and word.isdigit()):
        raise UsageError(f"{_say('nproc_per_node', text)}: expected a number, cpu, gpu, xpu "
                         f"or auto")
    return _whole("nproc_per_node", word, 1, 4096)


def streams(flag: str, text: Optional[str]) -> Tuple[Tuple[int, int], ...]:
    """``-r``/``-t``: ``0``-``3`` for every local rank, or ``RANK:N,RANK:N``
    (torchrun takes one-digit ranks only; any number here)."""
    word = (text or "").strip()
    if len(word) == 1 and word in "0123":
        return ((-1, int(word)),)
    pairs = []
    for item in word.split(","):
        rank, colon, bits = item.strip().partition(":")
        if not (colon and rank.isascii() and rank.isdigit() and len(bits) == 1
                and bits in "0123"):
            raise UsageError(f"{_say(flag, text)}: expected 0, 1, 2 or 3, or LOCAL_RANK:N,... "
                             f"(1 stdout, 2 stderr, 3 both)")
        pairs.append((int(rank), int(bits)))
    return tuple(pairs)


def rdzv_conf(text: Optional[str]) -> Dict[str, str]:
    """``k=v,k=v``; every key has a value, the known ones are checked."""
    conf: Dict[str, str] = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        key, eq, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not key:
            raise UsageError(f"--rdzv-conf: {one_line(item.strip(), 40)} has no key "
                             f"(KEY=VALUE,...)")
        if not eq or not value:
            raise UsageError(f"--rdzv-conf: {one_line(key, 40)} has no value (KEY=VALUE,...)")
        if key in ("join_timeout", "last_call_timeout", "close_timeout", "heartbeat_timeout",
                   "keep_alive_interval", "read_timeout", "timeout"):
            _seconds(f"rdzv_conf {key}", value)
        conf[key] = value
    return conf


def endpoint(text: str, default_port: int) -> Tuple[str, int]:
    """``HOST[:PORT]`` (``[v6]:PORT`` too)."""
    word = text.strip()
    host, port = word, str(default_port)
    if word.startswith("["):
        host, _, rest = word[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else port
    elif word.count(":") == 1:
        host, port = word.split(":")
    if not host or not port.isascii() or not port.isdigit() or int(port) > 65535:
        raise UsageError(f"--rdzv-endpoint={one_line(text, 60)}: expected HOST[:PORT]")
    return host, int(port)


def worker_command(values: Mapping[str, Optional[str]], script: Sequence[str],
                   environ: Mapping[str, str]) -> Tuple[str, ...]:
    """What each worker runs, as torchrun runs it."""
    module, no_python = values["module"] == "1", values["no_python"] == "1"
    if module and no_python:
        raise UsageError("--module and --no-python cannot both be given (torchrun refuses "
                         "them together too)")
    python = environ.get("PYTHON_EXEC") or sys.executable
    legacy = legacy_argument(values, script)
    extra = list(script[:1]) + ([legacy + "=${local_rank}"] if legacy else []) + list(script[1:])
    if values["run_path"] == "1":
        return (python, "-u", *extra)
    if no_python:
        return tuple(extra)
    return (python, "-u", "-m", *extra) if module else (python, "-u", *extra)


#: How a script declares torch.distributed.launch's argument: the spellings
#: argparse is given, quoted either way; the first found is passed.
_DECLARED = tuple((spelling, (f'"{spelling}"'.encode(), f"'{spelling}'".encode()))
                  for spelling in ("--local-rank", "--local_rank"))


def legacy_argument(values: Mapping[str, Optional[str]], script: Sequence[str]
                    ) -> Optional[str]:
    """torch.distributed.launch's ``--local-rank``, for a line without
    ``--use-env`` whose Python script (or ``-m`` module) declares it: one line
    is torchrun's or the legacy launcher's alike, and only a script written for
    the legacy one names the option.  ``--local-rank`` if the script names it
    (torch 2.x's spelling), else ``--local_rank`` (torch 1.x's: torch 2.x's
    launcher fails such a script with 'unrecognized arguments')."""
    if values.get("use_env") == "1" or values["no_python"] == "1" or not script:
        return None
    path = _module_file(script[0]) if values["module"] == "1" else script[0]
    import stat
    try:
        if not stat.S_ISREG(os.stat(path or "").st_mode):
            return None       # (a pipe, /dev/fd/N: the script's, not to be read here)
        with open(path or "", "rb") as f:
            text = f.read(1 << 22)
    except OSError:
        return None
    for spelling, quoted in _DECLARED:
        if any(q in text for q in quoted):
            return spelling
    return None


def _module_file(name: str) -> Optional[str]:
    """The file ``python -m NAME`` runs from the launch directory, found without
    importing anything (the worker's path: the directory, ``PYTHONPATH``, this
    interpreter's)."""
    parts = name.split(".")
    if not all(part.isidentifier() for part in parts):
        return None
    roots = ["", *os.environ.get("PYTHONPATH", "").split(os.pathsep), *sys.path[1:]]
    for root in roots:
        base = os.path.join(os.path.abspath(root or "."), *parts)
        for path in (base + ".py", os.path.join(base, "__main__.py")):
            if os.path.isfile(path):
                return path
    if sys.flags.no_site and "site" not in sys.modules:
        # Started without site (the installed command), this path lacks the site
        # directories the worker's Python has: asking the import system where the
        # package is runs the site set-up where nothing else finds it.
        from importlib.util import find_spec
        try:
            find_spec(parts[0])
        except (ImportError, ValueError):
            return None
        if "site" in sys.modules:
            return _module_file(name)
    return None


def nodes_of(values: Mapping[str, Optional[str]], script: Sequence[str]) -> int:
    """How many nodes the job has at most (``--nnodes N`` or ``MIN:MAX``); one for
    ``--standalone`` where MIN is 1, as torchrun runs it (its rendezvous is on
    this host alone, and one node is enough)."""
    low, high = nnodes(values["nnodes"])
    return 1 if values["standalone"] == "1" and low <= 1 else high


def run_torchrun(values: Mapping[str, Optional[str]], script: List[str],
                 environ: Dict[str, str]) -> int:
    """Check the settings of one node's job, run it, and return its exit status."""
    job, base = torch_job(values, script, environ)
    from ..run.launch import run_job
    try:
        return run_job(job)
    finally:
        if base is not None:
            from ..machine.trees import remove_tree
            remove_tree(base)


def _rendezvous(values: Mapping[str, Optional[str]]) -> Tuple[str, Optional[int], str]:
    """(MASTER_ADDR, MASTER_PORT or None for a free one, TORCHELASTIC_RUN_ID) of one node."""
    backend = (values["rdzv_backend"] or "").strip()
    if backend in NOT_SERVED:
        raise UsageError(f"--rdzv-backend={backend}: not served by mslaunch (no etcd is "
                         f"needed: --rdzv-backend c10d --rdzv-endpoint HOST:PORT serves the "
                         f"same jobs)")
    if backend not in ("static", "c10d"):
        raise UsageError(f"--rdzv-backend={one_line(backend, 40)}: expected static or c10d")
    rdzv_conf(values["rdzv_conf"])
    _whole("node_rank", values["node_rank"], 0, 0)      # (one node: node 0)
    run_id = (values["rdzv_id"] or "none").strip() or "none"
    given = (values["rdzv_endpoint"] or "").strip()
    port_text = values["master_port"]
    fresh = values["standalone"] == "1" or (
        backend == "static" and not given and port_text is None)
    if fresh or backend == "c10d":
        import socket
        import uuid
        addr = (values["local_addr"] or "").strip() or socket.getfqdn()
        return addr, None, str(uuid.uuid4()) if fresh else run_id
    if given:
        host, port = endpoint(given, 29500)
        return host, port, run_id
    port = _whole("master_port", port_text, 0, 65535)
    # 0: torchrun gives its workers port 0, where rank 0's store listens on a port of
    # its own that the others never learn (they wait forever); here a free one is chosen
    return (values["master_addr"] or "127.0.0.1").strip(), port or None, run_id


def _log_base(values: Mapping[str, Optional[str]], run_id: str
              ) -> Tuple[Optional[str], Optional[str]]:
    """(the run directory, a temporary base to remove at the end) -- torchrun's
    ``<log dir>/<run id>_XXXXXXXX``; without ``--log-dir`` under a directory of
    the job's own, removed when it ends (torchrun leaves its temporary one)."""
    import tempfile
    given = values["log_dir"]
    if given is not None and given.strip() == "/dev/null":
        return None, None
    temporary = base = None
    try:
        if given is None:
            base = temporary = tempfile.mkdtemp(prefix="torchelastic_")
        else:
            from ..machine.osfiles import check_dirs
            base = os.path.abspath(given)
            os.makedirs(base, exist_ok=True)
            check_dirs(base)      # (another user could swap the run's directory in it)
        return tempfile.mkdtemp(prefix=f"{run_id}_", dir=base), temporary
    except OSError as err:
        where = f" ({err.filename})" if err.filename and err.filename != base else ""
        raise UsageError(f"--log-dir={one_line(given or '', 60)}: {err.strerror}{where}") \
            from None


def _console_ranks(text: Optional[str]) -> Optional[Tuple[int, ...]]:
    word = (text or "").strip()
    if not word:
        return None
    ranks = [r.strip() for r in word.split(",")]
    if not all(r.isascii() and r.isdigit() for r in ranks):
        raise UsageError(f"--local-ranks-filter={one_line(word, 40)}: expected local ranks, "
                         f"0,1,2")
    return tuple(int(r) for r in ranks)


def _refuse_unserved(values: Mapping[str, Optional[str]]) -> None:
    for name in ("logs_specs", "duplicate_stdout_filters", "duplicate_stderr_filters"):
        if values[name] and not (name == "logs_specs" and values[name] == "default"):
            raise UsageError(f"{_say(name, values[name])}: not served by mslaunch (the logs "
                             f"are in torchrun's default layout under --log-dir)")
    method = (values["start_method"] or "").strip()
    if method not in ("spawn", "fork", "forkserver"):
        raise UsageError(f"{_say('start_method', method)}: expected spawn, fork or forkserver")
    handler = (values["event_log_handler"] or "").strip()
    if handler not in ("null", "console", "dynamic_rendezvous"):
        raise UsageError(f"{_say('event_log_handler', handler)}: expected null, console or "
                         f"dynamic_rendezvous")
    binding = values["numa_binding"]
    if binding is not None and binding not in ("node", "socket", "exclusive", "core-complex"):
        raise UsageError(f"{_say('numa_binding', binding)}: expected node, socket, exclusive "
                         f"or core-complex")


def torch_job(values: Mapping[str, Optional[str]], script: Sequence[str],
              environ: Dict[str, str], master: Optional[Tuple[str, int]] = None
              ) -> Tuple[JobSpec, Optional[str]]:
    """The job of one node, and a temporary directory to remove when it ends;
    ``master``: the workers' MASTER_ADDR and MASTER_PORT, the nodes' rendezvous
    made (see :mod:`.torchnodes`)."""
    _refuse_unserved(values)
    count = nproc(values["nproc_per_node"])
    restarts = _whole("max_restarts", values["max_restarts"], 0, 10**6)
    _seconds("monitor_interval", values["monitor_interval"])
    grace = 5.0 if values["shutdown_timeout"] is None else \
        float(_whole("shutdown_timeout", values["shutdown_timeout"]))
    shown = _console_ranks(values["local_ranks_filter"])
    redirects, tee = streams("redirects", values["redirects"]), streams("tee", values["tee"])
    argv = worker_command(values, script, environ)
    if master is None:
        addr, port, run_id = _rendezvous(values)
    else:
        (addr, port), run_id = master, (values["rdzv_id"] or "none").strip() or "none"
    devices = None
    if values["virtual_local_rank"] == "1" and environ.get("CUDA_VISIBLE_DEVICES"):
        devices = tuple(environ["CUDA_VISIBLE_DEVICES"].split(","))
        if len(devices) < count:
            raise UsageError(f"--virtual-local-rank: CUDA_VISIBLE_DEVICES names "
                             f"{len(devices)} device(s) for {count} workers")
    from .common import launch_dir
    cwd = launch_dir()
    run_dir, temporary = _log_base(values, run_id)
    env: List[Tuple[str, Optional[str]]] = [
        ("MASTER_ADDR", addr), ("TORCHELASTIC_USE_AGENT_STORE", "False"),
        ("TORCH_NCCL_ASYNC_ERROR_HANDLING", environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")),
        ("TORCHELASTIC_SIGNALS_TO_HANDLE", values["signals_to_handle"] or "")]
    # An inherited MASTER_PORT (a PyTorchJob's pod has one) is torchrun's to replace.
    environ.pop("MASTER_PORT", None)
    if port is not None:
        env.append(("MASTER_PORT", str(port)))
    if count > 1 and "OMP_NUM_THREADS" not in environ:
        env.append(("OMP_NUM_THREADS", "1"))
        _warn(OMP_WARNING)
    template = environ.get("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE") or \
        "[${role_name}${local_rank}]:"
    torch = TorchSpec(run_id=run_id, role=(values["role"] or "default"), run_dir=run_dir,
                      redirects=redirects, tee=tee, shown=shown, prefix=template,
                      virtual_local_rank=values["virtual_local_rank"] == "1",
                      cuda_devices=devices)
    from ..core.switches import pty_wanted
    from ..hosts import IMPLICIT_HOST
    # A torchrun line's workers are this machine's, inside an allocation too
    # (a batch script starts one launcher per node with srun).
    job = JobSpec(apps=(AppContext(argv=argv, np=count),), oversubscribe=True, mpi="none",
                  hosts=(HostEntry(name="localhost", origin=IMPLICIT_HOST),),
                  output=OutputSpec(pty=pty_wanted(environ, False, sys.stdout.isatty())),
                  global_env=tuple(env), grace=grace, max_job_restarts=restarts,
                  launch_dir=cwd, torch=torch, report_json=_report(values, cwd),
                  stall_report=_stall(values["stall_report"]),
                  stall_exit=values["stall_exit"] == "1")
    return job, temporary


def _warn(message: str) -> None:
    try:
        sys.stderr.write(f"mslaunch: {message}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def _stall(text: Optional[str]) -> Optional[float]:
    """``--stall-report SECONDS`` (mslaunch's own; 0: off), else mslaunch's default."""
    if text is None:
        from ..core.spec import STALL_SECONDS
        return STALL_SECONDS
    from .draft import check_seconds
    return check_seconds("--stall-report", text, allow_zero=True) or None


def _report(values: Mapping[str, Optional[str]], cwd: str) -> Optional[str]:
    path = values.get("report_json")
    if path is None:
        return None
    from ..run.jobreport import check_writable
    full = os.path.join(cwd, path)
    check_writable(full)
    return full
