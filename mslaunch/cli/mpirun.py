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
from ..errors import UsageError, one_line
from ..spec import AppContext, HostEntry, JobSpec, OutputSpec, SSHSpec, replace
from ..switches import switch
from .common import Exit, launch_dir
from .options import lookup, nargs as option_nargs

def _canonical(token: str) -> Tuple[Optional[str], Optional[str], str]:
    """``(option name, inline value, disposition)`` of an option token.

    ``(None, None, "")`` for a word that is not an option (the program).
    """
    if not token.startswith("-") or token in ("-", "--"):
        return None, None, ""
    body = token[2:] if token.startswith("--") else token[1:]
    value = None
    if "=" in body:
        body, value = body.split("=", 1)
    name, how = lookup(body)
    return name, value, how


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


#: Open MPI's plm components and Hydra's launcher names, as mslaunch's launchers.
_LAUNCHER_NAMES = {"auto": "auto", "ssh": "ssh", "rsh": "ssh", "slurm": "slurm",
                   "local": "local", "fork": "local", "isolated": "local"}


def _launcher(word: str, flag: str, component_list: bool) -> str:
    """``--launcher``, or an MCA ``plm`` value: one name, or (Open MPI) a list to
    choose from, or ``^`` and a list of those to leave out."""
    names = [w.strip() for w in word.lstrip("^").split(",")] if component_list else [word]
    unknown = [w for w in names if w not in _LAUNCHER_NAMES]
    if unknown or not all(names):
        raise UsageError(f"{flag} {one_line(word, 30)}: expected ssh, slurm, local or "
                         f"auto (srun inside a Slurm allocation, else ssh)"
                         + (", or Open MPI's rsh or ^ and a list" if component_list else ""))
    chosen = {_LAUNCHER_NAMES[w] for w in names}
    if component_list and word.startswith("^"):
        chosen = {"ssh", "slurm"} - chosen    # the remote launchers not left out
    if "auto" in chosen or chosen >= {"ssh", "slurm"}:
        return "auto"
    if len(chosen) == 1:
        return chosen.pop()
    return "local" if not chosen else sorted(chosen - {"local"})[0]


def parse_args(argv: Sequence[str], environ: Optional[Dict[str, str]] = None,
               cwd: Optional[str] = None) -> JobSpec:
    """Parse an mpirun-dialect command line into a :class:`JobSpec`."""
    environ = dict(os.environ) if environ is None else environ
    cwd = launch_dir() if cwd is None else cwd
    contexts: List[_Context] = [_Context()]
    g: Dict[str, object] = {}
    mapping: List[Tuple[str, str]] = []
    notes: List[str] = []
    warnings: List[str] = []
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
        name, inline, how = _canonical(token)
        if name is None:
            ctx.argv.append(token)
            i += 1
            continue
        if not how:
            raise UsageError(f"unknown option {token!r} (see mslaunch --help)")
        nargs = option_nargs(name)
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
        if how == "refused":
            from .options import REFUSED
            raise UsageError(f"{flag}: not supported by mslaunch: {REFUSED[name][1]}")
        if how == "accepted":
            from .options import ACCEPTED
            notes.append(f"{flag} has no effect here: {ACCEPTED[name][1]}")
            continue
        if name in _MAPPING:
            mapping.append((name, v))
        elif name == "np":
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
        elif name == "launcher" or (name == "mca" and v == "plm"):
            word = values[1] if name == "mca" else v
            said = f"{flag} plm" if name == "mca" else flag
            g["launcher"] = _launcher(word, said, name == "mca")
            if g["launcher"] == "slurm":
                from ..remote.slurm import choose
                try:
                    choose("slurm", environ)
                except UsageError as err:
                    raise UsageError(f"{said} {one_line(word, 30)}: "
                                     f"{str(err).split(': ', 1)[-1]}") from None
            if name == "mca":
                mca.append((v, values[1]))
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
        elif name in ("enable-recovery", "max-restarts"):
            # Open MPI 4.1.4 restarts nothing either: with recovery on, a failed
            # rank no longer stops the others (and it then exits 0: here the
            # failed rank's status is kept).
            keep_going = True
            if name == "max-restarts":
                _int(flag, v, minimum=0)
                warnings.append(f"{flag}: failed ranks are not restarted (nor by Open MPI "
                                f"4); a failed rank no longer stops the others; msrun mode "
                                f"restarts MindSpore workers")
        elif name == "oversubscribe":
            g["oversubscribe"] = True
        elif name == "nooversubscribe":
            g["oversubscribe"] = False
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
        elif name in ("ssh-user", "remote-python", "launch-agent"):
            if not v or "\0" in v:
                raise UsageError(f"{flag}: empty value")
            g["remote-python" if name == "launch-agent" else name] = v
        elif name in ("default-hostfile", "rankfile", "xml-file", "app"):
            if not v:
                raise UsageError(f"{flag}: empty file name")
            g[name] = os.path.join(cwd, v)
        elif name in ("tune", "am"):
            tokens = _option_file(name, flag, [os.path.join(cwd, f) for f in v.split(",") if f])
            args[i:i] = tokens           # read as if written here
        elif name == "path":
            g["path"] = tuple(os.path.join(cwd, d) for d in v.split(":") if d)
            genv.append(("OMPI_exec_path", v))
        elif name == "preload-files":
            g[name] = tuple(os.path.join(cwd, f) for f in v.split(",") if f)
        elif name == "report-pid":
            g[name] = v
        elif name == "personality":
            if any(p.strip().lower() not in ("ompi", "mpich", "") for p in v.split(",")):
                raise UsageError(f"{flag} {v}: only the ompi personality exists here")
        elif name == "usize":
            word = v.upper()
            g[name] = 0 if word == "SYSTEM" else (None if word == "INFINITE" else
                                                   _int(flag, v, minimum=1))
        elif name == "ompi-server":
            notes.append(f"{flag}: names are published through mslaunch itself")
        elif name == "display":
            for word in v.lower().split(","):
                key = {"map": "display-map", "map-devel": "display-map",
                       "alloc": "display-allocation", "allocation": "display-allocation",
                       "bind": "report-bindings", "bindings": "report-bindings",
                       "topo": "display-topo"}.get(word.strip())
                if key is None:
                    raise UsageError(f"{flag} {v}: unknown item {word[:20]!r} (expected "
                                     f"map, alloc, bind or topo)")
                g[key] = True
        elif name == "output":
            _output_option(flag, v, g, cwd)
        else:  # remaining boolean flags
            g[name] = True
    if g.get("help"):
        from .help import TEXT
        raise Exit(TEXT, 0)
    if g.get("version"):
        raise Exit(f"mslaunch {__version__}\n", 0)
    if g.get("app"):
        contexts = _appfile(str(g["app"]))
    job = _build(contexts, g, host_lists, hostfiles, genv, mca, verbose,
                 keep_going, environ, cwd, mapping)
    if (notes and verbose) or warnings:
        import sys
        for warning in warnings:
            sys.stderr.write(f"mslaunch: warning: {warning}\n")
        for note in notes if verbose else ():
            sys.stderr.write(f"mslaunch: note: {note}\n")
    return job


#: Options whose meaning is placement (see :mod:`.mapping`).
_MAPPING = frozenset(("map-by", "rank-by", "bind-to", "npernode", "pernode", "npersocket",
                      "ppr", "cpus-per-proc", "bynode", "byslot", "bycore", "bind-to-core",
                      "bind-to-socket", "cpu-set", "cpu-list"))


def _tokens(path: str, what: str) -> List[List[str]]:
    """The lines of an appfile or tune file as lists of words.

    As Open MPI 4.1.4 reads them: split at white space, no quoting, ``#``
    starts a comment anywhere, blank lines skipped.
    """
    from ..hosts.hostfile import read_host_file
    text = read_host_file(path, what)
    return [words for words in (line.split("#", 1)[0].split() for line in text.split("\n"))
            if words]


def _appfile(path: str) -> List[_Context]:
    """``--app FILE``: one MPMD context per line, each parsed like a command line
    (without the environment, which is the whole job's)."""
    contexts = []
    for number, words in enumerate(_tokens(path, "appfile"), 1):
        if any(w.lstrip("-") in ("launcher", "bootstrap") for w in words) or any(
                w.lstrip("-") == "mca" and words[i + 1:i + 2] == ["plm"]
                for i, w in enumerate(words)):
            # (parsed alone, it would be checked against no environment)
            raise UsageError(f"appfile {path}:{number}: how agents start is the whole "
                             f"job's choice: give --launcher (or --mca plm) on the command line")
        try:
            job = parse_args(words, environ={}, cwd=".")
        except UsageError as err:
            raise UsageError(f"appfile {path}:{number}: {err}") from None
        if len(job.apps) != 1:
            raise UsageError(f"appfile {path}:{number}: one program per line, without ':'")
        app = job.apps[0]
        ctx = _Context()
        ctx.np, ctx.env, ctx.wdir, ctx.argv = app.np, list(app.env), app.wdir, list(app.argv)
        contexts.append(ctx)
    if not contexts:
        raise UsageError(f"appfile {path}: no program in it")
    return contexts


def _option_file(name: str, flag: str, paths: List[str]) -> List[str]:
    """The options that ``-tune`` files (command-line words) or ``-am`` files
    (``key = value`` MCA settings) hold, as command-line words."""
    words: List[str] = []
    for path in paths:
        for line in _tokens(path, "tune file" if name == "tune" else "MCA parameter file"):
            if name == "am":
                text = " ".join(line)
                key, eq, value = text.partition("=")
                if not eq or not key.strip():
                    raise UsageError(f"{flag} {path}: expected 'key = value' lines, "
                                     f"got {text[:40]!r}")
                words += ["--mca", key.strip(), value.strip()]
            else:
                words += line
    for w in words:
        if w.startswith("-") and _canonical(w)[0] not in ("x", "mca", "env", "genv"):
            raise UsageError(f"{flag}: only -x and -mca belong in a tune file, not {w[:30]!r}")
    return words


def _output_option(flag: str, value: str, g: Dict[str, object], cwd: str) -> None:
    """Open MPI 5's ``--output tag,timestamp,merge-stderr-to-stdout,dir=D,file=D``."""
    for item in value.split(","):
        word, _, arg = item.partition("=")
        word = word.strip().lower()
        if word in ("tag", "tag-detailed", "tag-fullname"):
            g["tag-output"] = True
        elif word == "timestamp":
            g["timestamp-output"] = True
        elif word in ("merge-stderr-to-stdout", "merge"):
            g["merge-stderr-to-stdout"] = True
        elif word in ("dir", "file") and arg:
            g["output-filename"] = arg
        elif word == "xml":
            g["xml"] = True
        elif word not in ("raw", ""):
            raise UsageError(f"{flag} {value}: unknown item {word[:20]!r} (expected tag, "
                             f"timestamp, merge-stderr-to-stdout, dir=DIR or xml)")


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
           environ: Dict[str, str], cwd: str,
           mapping: List[Tuple[str, str]] = ()) -> JobSpec:  # type: ignore[assignment]
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

    if not hosts and not host_lists and g.get("default-hostfile"):
        from ..hosts.hostfile import parse_hostfile
        hosts = parse_hostfile(str(g["default-hostfile"]))
    from .mapping import mapping_fields
    placement = mapping_fields(list(mapping))
    for key in ("display-map", "display-allocation"):
        if placement.pop(key, False):
            g[key] = True
    # None: the default, which lets the implicit local host run what -n asks.
    oversubscribe = placement.pop("oversubscribe", g.get("oversubscribe"))
    if g.get("use-hwthread-cpus"):
        placement["use_hwthreads"] = True
    if g.get("nolocal"):
        placement["nolocal"] = True
    if g.get("rankfile"):
        placement["rankfile"] = g["rankfile"]

    output = OutputSpec()
    if "output-filename" in g:
        output = _parse_output(str(g["output-filename"]), cwd)
    pty = not g.get("no-pty") and switch("MSLAUNCH_PTY", environ)
    output = replace(output, merge_stderr=bool(g.get("merge-stderr-to-stdout")), pty=pty,
                     tag=bool(g.get("tag-output")), timestamp=bool(g.get("timestamp-output")),
                     rank_prefix=bool(g.get("prepend-rank")),
                     xml=bool(g.get("xml") or g.get("xml-file")),
                     xml_file=g.get("xml-file"))  # type: ignore[arg-type]

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
        oversubscribe=oversubscribe,  # type: ignore[arg-type]
        report_bindings=bool(g.get("report-bindings")),
        display_map=bool(g.get("display-map")), dry_run=bool(g.get("dry-run")),
        display_allocation=bool(g.get("display-allocation")),
        display_diffable=bool(g.get("display-diffable-map")),
        display_topo=bool(g.get("display-topo")),
        index_argv=bool(g.get("index-argv-by-rank")),
        report_state=bool(g.get("report-state-on-timeout")),
        stack_traces=bool(g.get("get-stack-traces")),
        report_pid=g.get("report-pid"),  # type: ignore[arg-type]
        exec_path=g.get("path", ()),  # type: ignore[arg-type]
        preload_binary=bool(g.get("preload-binary")),
        preload_files=g.get("preload-files", ()),  # type: ignore[arg-type]
        session_cwd=bool(g.get("set-cwd-to-session-dir")),
        usize=g.get("usize"),  # type: ignore[arg-type]
        novm=bool(g.get("novm")),
        **placement,  # type: ignore[arg-type]
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
                    remote_python=g.get("remote-python"),  # type: ignore[arg-type]
                    launcher=str(g.get("launcher", "auto"))))
