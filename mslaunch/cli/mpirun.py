"""Command line of mslaunch in the mpirun dialect (Open MPI and MPICH Hydra).

Options take one or two dashes (``-np`` and ``--np``), and Hydra's spellings
where they differ (``-hosts``, ``-f``, ``-ppn``, ``-genv``, ``-l``).  The first
token that is not an option is the program; everything after it belongs to
the program, up to a lone ``:`` that starts the next MPMD context.

"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Optional, Sequence, Tuple

from .. import __version__
from ..errors import UsageError
from .common import Exit, launch_dir
from ..spec import AppContext, HostEntry, JobSpec, OutputSpec, SSHSpec, replace

# canonical name -> number of values it takes
_OPTIONS: Dict[str, int] = {
    "np": 1, "x": 1, "env": 2, "envlist": 1,
    "wdir": 1,
    "host": 1, "hostfile": 1,
    "genv": 2, "genvlist": 1, "genvall": 0,
    "genvnone": 0, "envall": 0, "envnone": 0,
    "mca": 2, "prtemca": 2, "pmixmca": 2,
    "runtime-options": 1,
    "map-by": 1, "npernode": 1, "pernode": 0,
    "oversubscribe": 0, "nooversubscribe": 0,
    "bind-to": 1, "report-bindings": 0,
    "display-map": 0, "dry-run": 0,
    "output-filename": 1, "merge-stderr-to-stdout": 0,
    "tag-output": 0, "timestamp-output": 0, "no-pty": 0,
    "prepend-rank": 0, "stdin": 1,
    "allow-run-as-root": 0, "timeout": 1, "grace": 1,
    "quiet": 0, "verbose": 0, "version": 0,
    "help": 0, "mpi": 1, "pmi-port": 0,
    "prefix": 1, "disable-auto-cleanup": 0,
    "ssh-config": 1, "ssh-user": 1, "ssh-port": 1, "ssh-identity": 1,
    "ssh-accept-new": 0, "ssh-timeout": 1, "remote-python": 1,
}

_ALIASES: Dict[str, str] = {
    "n": "np", "c": "np",
    "H": "host", "hosts": "host",
    "machinefile": "hostfile", "f": "hostfile", "default-hostfile": "hostfile",
    "wd": "wdir",
    "gmca": "mca",
    "N": "npernode", "ppn": "npernode",
    "l": "prepend-rank",
    "do-not-launch": "dry-run",
    "q": "quiet", "v": "verbose", "V": "version", "h": "help",
}

_HELP = """\
usage: mslaunch [options] program [args...] [: [options] program2 [args...]]

A drop-in for mpirun (Open MPI and MPICH Hydra spellings; one or two dashes).

Size and hosts:
  -n, -np, -c N            number of ranks (default: one per slot)
  -H, --host, -hosts LIST  hosts as h1:4,h2 (a bare host is one slot)
  --hostfile, --machinefile, -f FILE
                           'host slots=N [max_slots=M]' or 'host[:N]' lines
  (no hosts: a Slurm or PBS allocation, else this machine with one slot per core)

Placement and binding:
  --map-by slot|node|ppr:N:node   fill hosts in order (default), round-robin, N per host
  -npernode, -N, -ppn N    N ranks per host
  --oversubscribe          allow more ranks than slots (never above max_slots)
  --bind-to none|core|hwthread|socket   CPU affinity (default none)
  --report-bindings        print each rank's CPU binding
  --display-map            print where ranks run, then run
  --dry-run                print the plan (map, commands, logs) and start nothing

Environment and working directory:
  -x NAME[=VAL]            export to the ranks of this context
  -genv NAME VAL, -env NAME VAL, -genvlist A,B, -genvnone
  -mca, --mca KEY VAL      export OMPI_MCA_KEY=VAL; 'orte_abort_on_non_zero_status 0'
                           (or --prtemca state_base_error_non_zero_exit 0, or
                           --runtime-options error-nonzero-status=false) keeps going
  -wdir, --wdir, -wd DIR   working directory of the ranks
  --prefix DIR             put DIR/bin and DIR/lib first in PATH and LD_LIBRARY_PATH

Output:
  --output-filename DIR[:nocopy][:nojobid]
                           DIR/1/rank.N/stdout and stderr, also copied to the terminal
  --merge-stderr-to-stdout one stream per rank, merged at the source
  --no-pty                 rank stdout on a pipe, not a pseudo-terminal (as Hydra)
  --tag-output             prefix lines with [1,RANK]<stdout>:
  --timestamp-output       prefix lines with the time
  -l, -prepend-rank        prefix lines with [RANK]
  --stdin all|none|RANK    who reads mslaunch's stdin (default rank 0)

Lifecycle:
  --timeout SECONDS        kill the job after SECONDS (also MPIEXEC_TIMEOUT); exit 110
  --grace SECONDS          SIGTERM-to-SIGKILL delay when stopping ranks (default 5)
  -disable-auto-cleanup    keep going when a rank fails (same as the mca setting above)
  --mpi pmi|openmpi|none   MPI support: serve PMI to MPICH-ABI ranks (default),
                           delegate to Open MPI's mpirun, or no MPI support
  -pmi-port                serve PMI over TCP (PMI_PORT/PMI_ID) instead of PMI_FD
  --allow-run-as-root      accepted (mslaunch runs as root without it)

Remote hosts (over SSH; hosts that are this machine run without it):
  --ssh-config FILE        read FILE instead of ~/.ssh/config
  --ssh-user USER, --ssh-port N, --ssh-identity FILE
                           override what ~/.ssh/config says for every host
  --ssh-accept-new         add unknown host keys to ~/.ssh/known_hosts (as
                           StrictHostKeyChecking=accept-new); a changed key is refused
  --ssh-timeout SECONDS    connect timeout per host (default 10)
  --remote-python PATH     the Python that runs the agent on the remote hosts
                           (default: this Python's path if it exists there, else python3)

Other:
  --                       end of options: the next word is the program
  -q, --quiet              fewer messages    -v, --verbose   more messages
  -V, --version            print the version  -h, --help     this help
"""


def _canonical(token: str) -> Tuple[Optional[str], Optional[str]]:
    """Return (option name, inline value) for an option token, or (None, None)."""
    if not token.startswith("-") or token in ("-", "--"):
        return None, None
    body = token[2:] if token.startswith("--") else token[1:]
    value = None
    if "=" in body:
        body, value = body.split("=", 1)
    name = _ALIASES.get(body, body)
    if name not in _OPTIONS:
        return "", None
    return name, value


MAX_RANKS = 100_000          # beyond this a typo, not a job: refuse it
MAX_SECONDS = 100_000_000.0  # about three years


def _int(flag: str, text: str, minimum: int = 1, maximum: int = MAX_RANKS) -> int:
    try:
        value = int(text)
    except ValueError:
        raise UsageError(f"{flag}: expected a whole number, got {text!r}") from None
    if value < minimum:
        raise UsageError(f"{flag}: must be at least {minimum}, got {value}")
    if value > maximum:
        raise UsageError(f"{flag}: at most {maximum}, got {value}")
    return value


def _seconds(flag: str, text: str, allow_zero: bool = False) -> float:
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"{flag}: expected a number of seconds, got {text!r}") from None
    if not (0 < value <= MAX_SECONDS or (value == 0 and allow_zero)):
        raise UsageError(f"{flag}: expected a number of seconds from 0 to {MAX_SECONDS:.0f}, "
                         f"got {text!r}")
    return value


def _env_name(flag: str, name: str) -> str:
    if not name or "=" in name or "\0" in name or name[0].isdigit():
        raise UsageError(f"{flag}: bad environment variable name {name!r}")
    return name


def _falsy(value: str) -> bool:
    return value.strip().lower() in ("0", "false", "no", "off", "f", "n")


class _Context:
    def __init__(self) -> None:
        self.np: Optional[int] = None
        self.env: List[Tuple[str, Optional[str]]] = []
        self.wdir: Optional[str] = None
        self.argv: List[str] = []


def parse_args(argv: Sequence[str], environ: Optional[Dict[str, str]] = None,
               cwd: Optional[str] = None) -> JobSpec:
    """Parse an mpirun-dialect command line into a :class:`JobSpec`."""
    environ = dict(os.environ) if environ is None else environ
    cwd = launch_dir() if cwd is None else cwd
    contexts: List[_Context] = [_Context()]
    g: Dict[str, object] = {}
    host_lists: List[HostEntry] = []
    hostfiles: List[str] = []
    genv: List[Tuple[str, Optional[str]]] = []
    mca: List[Tuple[str, str]] = []
    verbose = 0
    keep_going = False
    i = 0
    args = list(argv)
    while i < len(args):
        token = args[i]
        ctx = contexts[-1]
        if ctx.argv:
            if token == ":":
                contexts.append(_Context())
            else:
                ctx.argv.append(token)
            i += 1
            continue
        if token == ":":
            raise UsageError("':' must follow a program (empty MPMD context)")
        if token == "--":
            # End of options: the next word is the program, whatever it looks like.
            if i + 1 >= len(args):
                raise UsageError("no program given after '--'")
            ctx.argv.append(args[i + 1])
            i += 2
            continue
        name, inline = _canonical(token)
        if name is None:
            ctx.argv.append(token)
            i += 1
            continue
        if name == "":
            raise UsageError(f"unknown option {token!r} (see mslaunch --help)")
        nargs = _OPTIONS[name]
        if inline is not None:
            if nargs != 1:
                raise UsageError(f"{token}: option takes {nargs} values, not '=VALUE'")
            values = [inline]
            i += 1
        else:
            values = args[i + 1:i + 1 + nargs]
            if len(values) < nargs:
                raise UsageError(f"{token}: missing value")
            i += 1 + nargs
        flag = token.split("=", 1)[0]
        v = values[0] if values else ""
        if name == "np":
            # -n 0 means one rank per slot, as in Open MPI 4.
            ctx.np = _int(flag, v, minimum=0) or None
        elif name == "x":
            if "=" in v:
                k, val = v.split("=", 1)
                ctx.env.append((_env_name(flag, k), val))
            else:
                ctx.env.append((_env_name(flag, v), None))
        elif name == "env":
            ctx.env.append((_env_name(flag, v), values[1]))
        elif name == "envlist":
            ctx.env.extend((_env_name(flag, k), None) for k in v.split(",") if k)
        elif name == "wdir":
            if not v:
                raise UsageError(f"{flag}: empty directory name")
            ctx.wdir = v
        elif name == "genv":
            genv.append((_env_name(flag, v), values[1]))
        elif name == "genvlist":
            genv.extend((_env_name(flag, k), None) for k in v.split(",") if k)
        elif name in ("genvnone", "envnone"):
            g["inherit_env"] = False
        elif name in ("genvall", "envall"):
            g["forward_env"] = True
        elif name == "allow-run-as-root":
            pass
        elif name == "host":
            from ..hosts.hostfile import parse_host_list
            host_lists.extend(parse_host_list(v, flag))
        elif name == "hostfile":
            hostfiles.append(v)
        elif name == "mca":
            mca.append((v, values[1]))
            if v == "orte_abort_on_non_zero_status" and _falsy(values[1]):
                keep_going = True
        elif name == "prtemca":
            if v == "state_base_error_non_zero_exit" and _falsy(values[1]):
                keep_going = True
            genv.append(("PRTE_MCA_" + v, values[1]))
        elif name == "pmixmca":
            genv.append(("PMIX_MCA_" + v, values[1]))
        elif name == "runtime-options":
            for item in v.split(","):
                key, _, val = item.partition("=")
                if key.strip() == "error-nonzero-status" and _falsy(val or "true"):
                    keep_going = True
        elif name == "disable-auto-cleanup":
            keep_going = True
        elif name == "map-by":
            g["map_by"] = v
        elif name == "npernode":
            g["per_node"] = _int(flag, v)
        elif name == "pernode":
            g["per_node"] = 1
        elif name == "oversubscribe":
            g["oversubscribe"] = True
        elif name == "nooversubscribe":
            g["oversubscribe"] = False
        elif name == "bind-to":
            g["bind_to"] = v
        elif name == "output-filename":
            g["output-filename"] = v
        elif name == "stdin":
            g["stdin"] = v
        elif name == "timeout":
            g["timeout"] = _seconds(flag, v)
        elif name == "grace":
            g["grace"] = _seconds(flag, v, allow_zero=True)
        elif name == "verbose":
            verbose += 1
        elif name == "mpi":
            g["mpi"] = v
        elif name == "prefix":
            g["prefix"] = os.path.join(cwd, v)
        elif name in ("ssh-config", "ssh-identity"):
            if not v:
                raise UsageError(f"{flag}: empty file name")
            g[name] = os.path.join(cwd, os.path.expanduser(v))
        elif name == "ssh-port":
            g[name] = _int(flag, v, maximum=65535)
        elif name == "ssh-timeout":
            g[name] = _seconds(flag, v)
        elif name in ("ssh-user", "remote-python"):
            if not v or "\0" in v:
                raise UsageError(f"{flag}: empty value")
            g[name] = v
        else:  # remaining boolean flags
            g[name] = True
    if g.get("help"):
        raise Exit(_HELP, 0)
    if g.get("version"):
        raise Exit(f"mslaunch {__version__}\n", 0)
    return _build(contexts, g, host_lists, hostfiles, genv, mca, verbose,
                  keep_going, environ, cwd)


def _parse_map_by(value: str, per_node: Optional[int]) -> Tuple[str, Optional[int], bool]:
    """Return (policy, per-node count, oversubscribe) for --map-by VALUE."""
    policy, _, mods = value.partition(":")
    policy_l = policy.lower()
    oversub = False
    if policy_l.startswith("ppr"):
        parts = value.split(":")
        if len(parts) < 3 or parts[2].lower() != "node":
            raise UsageError(f"--map-by {value}: only ppr:N:node is supported")
        count = _int("--map-by ppr", parts[1])
        mods_list = parts[3:]
        return "slot", count, any(m.upper() == "OVERSUBSCRIBE" for m in mods_list)
    for mod in filter(None, mods.split(":")):
        if mod.upper() == "OVERSUBSCRIBE":
            oversub = True
        elif mod.upper() not in ("NOOVERSUBSCRIBE", "SPAN", "FILL"):
            raise UsageError(f"--map-by {value}: unsupported modifier {mod!r}")
    if policy_l in ("slot", "core", "hwthread", "") :
        return "slot", per_node, oversub
    if policy_l == "node":
        return "node", per_node, oversub
    raise UsageError(f"--map-by {value}: expected slot, node or ppr:N:node")


def _parse_output(value: str, cwd: str) -> OutputSpec:
    directory, copy, jobid = value, True, True
    if ":" in value:
        head, tail = value.split(":", 1)
        words = [w for w in tail.replace(":", ",").split(",") if w]
        if words and all(w in ("nocopy", "nojobid") for w in words):
            directory = head
            copy = "nocopy" not in words
            jobid = "nojobid" not in words
    if not directory:
        raise UsageError("--output-filename: empty directory name")
    return OutputSpec(directory=os.path.normpath(os.path.join(cwd, directory)),
                      copy_to_terminal=copy, jobid_dir=jobid)


def _build(contexts: List[_Context], g: Dict[str, object], host_lists: List[HostEntry],
           hostfiles: List[str], genv: List[Tuple[str, Optional[str]]],
           mca: List[Tuple[str, str]], verbose: int, keep_going: bool,
           environ: Dict[str, str], cwd: str) -> JobSpec:
    if not contexts[-1].argv:
        if len(contexts) == 1 and not contexts[0].env and contexts[0].np is None:
            raise UsageError("no program given (usage: mslaunch [options] program [args...])")
        raise UsageError("no program given after the options"
                         + (" of the last ':' context" if len(contexts) > 1 else ""))
    if len(contexts) > 1 and any(c.np is None for c in contexts):
        raise UsageError("every MPMD context needs -n when ':' separates programs")
    apps = tuple(AppContext(argv=tuple(c.argv), np=c.np, env=tuple(c.env),
                            wdir=os.path.join(cwd, c.wdir) if c.wdir else None)
                 for c in contexts)

    hosts: List[HostEntry] = []
    if hostfiles:
        from ..hosts.hostfile import parse_hostfile
        for path in hostfiles:
            hosts.extend(parse_hostfile(os.path.join(cwd, path)))
    host_filter: Tuple[HostEntry, ...] = ()
    if hosts and host_lists:
        host_filter = tuple(host_lists)
    elif host_lists:
        hosts = host_lists

    per_node = g.get("per_node")
    map_by, per_node, oversub = _parse_map_by(str(g.get("map_by", "slot")), per_node)  # type: ignore[arg-type]
    if g.get("per_node") is not None and per_node != g.get("per_node"):
        raise UsageError("-npernode/-ppn conflicts with --map-by ppr:N:node")
    # None: the default, which lets the implicit local host run what -n asks.
    oversubscribe: Optional[bool] = True if oversub else g.get("oversubscribe")  # type: ignore[assignment]

    bind_to = str(g.get("bind_to", "none")).lower().split(":")[0]
    if bind_to == "package":
        bind_to = "socket"
    if bind_to not in ("none", "core", "hwthread", "socket"):
        raise UsageError(f"--bind-to {g.get('bind_to')}: expected none, core, hwthread or socket")

    output = OutputSpec()
    if "output-filename" in g:
        output = _parse_output(str(g["output-filename"]), cwd)
    pty = not g.get("no-pty") and environ.get("MSLAUNCH_PTY", "1") not in ("0", "no", "off")
    output = replace(output, merge_stderr=bool(g.get("merge-stderr-to-stdout")), pty=pty,
                     tag=bool(g.get("tag-output")), timestamp=bool(g.get("timestamp-output")),
                     rank_prefix=bool(g.get("prepend-rank")))

    stdin = str(g.get("stdin", "0")).lower()
    if stdin not in ("all", "none"):
        stdin = str(_int("--stdin", stdin, minimum=0))
        sizes = [c.np for c in contexts]
        if None not in sizes and int(stdin) >= sum(sizes):  # type: ignore[arg-type]
            raise UsageError(f"--stdin {stdin}: the job has only {sum(sizes)} ranks")  # type: ignore[arg-type]

    timeout = g.get("timeout")
    if timeout is None and environ.get("MPIEXEC_TIMEOUT"):
        timeout = _seconds("MPIEXEC_TIMEOUT", environ["MPIEXEC_TIMEOUT"])
    if not keep_going and _falsy(environ.get("OMPI_MCA_orte_abort_on_non_zero_status", "1")):
        keep_going = True

    mpi = str(g.get("mpi", "pmi")).lower()
    if mpi in ("mpich", "hydra", "pmi1", "pmi2"):
        mpi = "pmi"
    if mpi not in ("pmi", "openmpi", "none"):
        raise UsageError(f"--mpi {g.get('mpi')}: expected pmi, openmpi or none")
    if g.get("pmi-port") and mpi != "pmi":
        raise UsageError("-pmi-port needs --mpi pmi")

    return JobSpec(
        apps=apps, hosts=tuple(hosts), host_filter=host_filter,
        map_by=map_by, per_node=per_node, oversubscribe=oversubscribe,
        bind_to=bind_to, report_bindings=bool(g.get("report-bindings")),
        display_map=bool(g.get("display-map")), dry_run=bool(g.get("dry-run")),
        output=output, global_env=tuple(genv), inherit_env=bool(g.get("inherit_env", True)),
        forward_env=bool(g.get("forward_env")),
        mca=tuple(mca), keep_going=keep_going, stdin=stdin,
        timeout=timeout,  # type: ignore[arg-type]
        grace=float(g.get("grace", 5.0)),  # type: ignore[arg-type]
        quiet=bool(g.get("quiet")), verbose=verbose, mpi=mpi,
        pmi_port=bool(g.get("pmi-port")), prefix=g.get("prefix"),  # type: ignore[arg-type]
        launch_dir=cwd,
        ssh=SSHSpec(config=g.get("ssh-config"), user=g.get("ssh-user"),  # type: ignore[arg-type]
                    port=g.get("ssh-port"), identity=g.get("ssh-identity"),  # type: ignore[arg-type]
                    accept_new=bool(g.get("ssh-accept-new")),
                    connect_timeout=float(g.get("ssh-timeout", 10.0)),  # type: ignore[arg-type]
                    remote_python=g.get("remote-python")))  # type: ignore[arg-type]
