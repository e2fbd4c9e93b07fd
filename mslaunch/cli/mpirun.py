"""Command line of mslaunch in the mpirun dialect (Open MPI and MPICH Hydra).

Options take one or two dashes (``-np`` and ``--np``), and Hydra's spellings
where they differ (``-hosts``, ``-f``, ``-ppn``, ``-genv``, ``-l``).  The first
token that is not an option is the program; everything after it belongs to
the program, up to a lone ``:`` that starts the next MPMD context.  What each
option is and does is in its record in :mod:`.options`.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Optional, Sequence, Tuple

    from .options import Option

from .. import __version__
from ..core.errors import UsageError
from ..core.spec import STALL_SECONDS, AppContext, HostEntry, JobSpec, OutputSpec, SSHSpec, replace
from ..core.switches import pty_wanted
from ..core.states import OPENMPI, PMI
from .common import Exit, launch_dir
from .draft import RUNTIME_FRAMEWORKS, Context, Draft, check_int, job_timeout
from .options import SPELLINGS, words_of
from .rshagent import rsh_settings


def command(argv: Sequence[str]) -> JobSpec:
    """The job an mpirun-dialect command line asks for (see :func:`parse_args`)."""
    return parse_args(argv)


def parse_args(argv: Sequence[str], environ: Optional[Dict[str, str]] = None,
               cwd: Optional[str] = None, defaults: bool = True) -> JobSpec:
    """Parse an mpirun-dialect command line into a :class:`JobSpec`.

    With ``defaults``, what Open MPI's parameter files and variables and
    Hydra's variables say comes first, and the command line overrides it.
    """
    d = Draft(dict(os.environ) if environ is None else environ,
              launch_dir() if cwd is None else cwd, _option_file)
    d.argv = argv
    if defaults:
        _environment_defaults(d, argv)
    args = list(argv)
    if defaults:
        args[:0] = _tune_parameter(d, argv)
    i = 0
    while i < len(args):
        token = args[i]
        body, inline = words_of(token)
        if body is None or d.ctx.argv:
            i = _program_word(d, args, i)
            continue
        option = SPELLINGS.get(body)
        if option is None:
            from .hints import unknown_option
            after = inline if inline is not None else (args[i + 1] if i + 1 < len(args)
                                                       else None)
            raise UsageError(unknown_option(token, body, after, SPELLINGS))
        values, i = _values(option, token, inline, args, i)
        more = _apply(d, option, token.split("=", 1)[0], values)
        if more:
            args[i:i] = more           # read as if written here
    if d.help:
        # --help TOPIC: the word after it (which the loop took for the program)
        from .help import help_text
        words = d.contexts[0].argv
        raise Exit(help_text(words[0] if words else None), 0)
    if d.version:
        raise Exit(f"mslaunch {__version__}\n", 0)
    if d.app:
        from .optfiles import appfile
        d.contexts = appfile(d.app, parse_args)
    job = _build(d)
    if (d.notes and d.verbose) or d.warnings:
        import sys
        for warning in d.warnings:
            sys.stderr.write(f"mslaunch: warning: {warning}\n")
        for note in d.notes if d.verbose else ():
            sys.stderr.write(f"mslaunch: note: {note}\n")
    return job


#: Open MPI's installation-wide parameter file (Debian's place) and the user's.
_MCA_FILES = ("/etc/openmpi/openmpi-mca-params.conf", ".openmpi/mca-params.conf")
#: How the names of the parameters that mpirun itself reads begin (see mca.py).
_MPIRUN_PARAMS = ("orte_", "rmaps", "hwloc", "plm", "ras", "mca_base_param_files",
                  *RUNTIME_FRAMEWORKS)


def _names_mpirun_params(path: str) -> bool:
    """Whether a parameter file sets one of mpirun's own parameters or exports a
    variable (a quick look: most files hold only the ranks' parameters, and
    then mca.py is not even imported)."""
    try:
        with open(path, "rb") as f:
            text = f.read(1 << 24).decode("utf-8", "replace")
    except OSError:
        return False
    for line in text.split("\n"):
        words = line.replace("=", " ").split()
        if words and not words[0].startswith("#"):
            name = words[1] if words[0].startswith("-") and len(words) > 1 else words[0]
            if name.startswith(_MPIRUN_PARAMS) or words[0] in ("-x", "--x"):
                return True
    return False


def _environment_defaults(d: Draft, argv: Sequence[str]) -> None:
    """Open MPI's MCA parameters set below the command line, and Hydra's and
    Intel MPI's variables (see :mod:`.mca`, :mod:`.hydraenv`)."""
    env = d.environ
    home = env.get("HOME")
    if (any(k.startswith("OMPI_MCA_") and k[9:].startswith(_MPIRUN_PARAMS) for k in env)
            or "mca_base_param_files" in argv or _names_mpirun_params(_MCA_FILES[0])
            or (home and _names_mpirun_params(os.path.join(home, _MCA_FILES[1])))):
        from .mca import apply_defaults
        apply_defaults(d, argv)
    if any(k.startswith(("HYDRA_", "I_MPI_", "MPIEXEC_P", "MPICH_PORT")) for k in env):
        from .hydraenv import apply_hydra_environment
        apply_hydra_environment(d)


def _before_program(argv: Sequence[str]) -> Dict[str, List[str]]:
    """The options written before the program, by name, with their values
    (the program's own words are not options; a bad line is left to the parser)."""
    found: Dict[str, List[str]] = {}
    words = list(argv)
    i = 0
    while i < len(words):
        body, inline = words_of(words[i])
        option = SPELLINGS.get(body) if body is not None else None
        if option is None:
            break
        try:
            values, i = _values(option, words[i], inline, words, i)
        except UsageError:
            break
        found.setdefault(option.name, []).extend(values)
    return found


def _tune_parameter(d: Draft, argv: Sequence[str]) -> List[str]:
    """``mca_base_envar_file_prefix``, ``-tune``'s own parameter, given with
    ``--mca`` or in the environment: its files are read as ``-tune``'s (a ``-tune``
    flag replaces it)."""
    given = _before_program(argv)
    if "tune" in given:
        return []
    mca = given.get("mca", [])
    from_flag = [mca[k + 1] for k in range(0, len(mca) - 1, 2)
                 if mca[k] == "mca_base_envar_file_prefix"]
    value = from_flag[-1] if from_flag else d.environ.get("OMPI_MCA_mca_base_envar_file_prefix")
    if not value:
        return []
    said = ("--mca mca_base_envar_file_prefix" if from_flag
            else "OMPI_MCA_mca_base_envar_file_prefix (environment)")
    try:
        from .draft import find_param_file
        return d.option_file(d, "tune", said,
                             [find_param_file(d, f) for f in value.split(",") if f])
    except UsageError as err:      # a file that cannot be read names its file only
        raise UsageError(str(err) if said in str(err) else f"{said}: {err}") from None


def _option_file(d: Draft, name: str, flag: str, paths: List[str]) -> List[str]:
    from .optfiles import option_file
    return option_file(d, name, flag, paths)


def _program_word(d: Draft, args: List[str], i: int) -> int:
    """A word of the program's command line (or ``:``, ``--``); the index of the next."""
    token, ctx = args[i], d.ctx
    if ctx.argv:
        if token == ":":
            d.contexts.append(Context())
        else:
            ctx.argv.append(token)
        return i + 1
    if token == ":":
        raise UsageError("':' must follow a program (empty MPMD context)")
    if token == "--":
        # End of options: the next word is the program, whatever it looks like.
        if i + 1 >= len(args):
            raise UsageError("no program given after '--'")
        ctx.argv.append(args[i + 1])
        return i + 2
    ctx.argv.append(token)
    return i + 1


def _values(option: Option, token: str, inline: Optional[str], args: List[str],
            i: int) -> Tuple[List[str], int]:
    """The values of the option at ``args[i]``, and the index of the next word."""
    if inline is not None:
        if option.nargs != 1:
            raise UsageError(f"{token}: option takes {option.nargs} values, not '=VALUE'")
        return [inline], i + 1
    values = args[i + 1:i + 1 + option.nargs]
    if len(values) < option.nargs:
        raise UsageError(f"{token}: missing value")
    return values, i + 1 + option.nargs


#: Spellings only Hydra's mpiexec has: a command line with one is Hydra's, whose
#: remote ranks get the launcher's whole environment unless it says otherwise
#: (``-genvall`` is Hydra's default; ``-genvnone``, ``-genvlist``, ``-envlist``
#: and ``-envnone`` choose otherwise).
HYDRA_WORDS = frozenset((
    "hosts", "f", "ppn", "perhost", "genv", "env", "genvlist", "envlist", "genvnone",
    "envnone", "genvall", "envall", "prepend-rank", "l", "launcher", "bootstrap",
    "bootstrap-exec", "launcher-exec", "bootstrap-exec-args", "usize", "pmi-port", "rmk",
    "disable-auto-cleanup"))
_HYDRA_NOT_ALL = frozenset(("genvlist", "envlist", "genvnone", "envnone"))


def _forward_env(d: Draft) -> bool:
    """Whether remote ranks get the launcher's whole environment (see HYDRA_WORDS)."""
    if d.forward_env:
        return True
    if d.hydra_words and not _HYDRA_NOT_ALL.intersection(d.hydra_words):
        d.notes.append(f"-{d.hydra_words[0]} is Hydra's spelling: remote ranks get this "
                       f"environment, as under Hydra's mpiexec (-genvall is its default)")
        return True
    return False


def _apply(d: Draft, option: Option, flag: str, values: List[str]) -> Optional[List[str]]:
    """What ``option`` does to the draft; words to read next, if it names a file of them."""
    if option.kind == "refused":
        raise UsageError(f"{flag}: not supported by mslaunch: {option.note}")
    if option.kind == "accepted":
        d.notes.append(f"{flag} has no effect here: {option.note}")
        return None
    word = flag.lstrip("-")
    # (``--launcher`` is mslaunch's own spelling too; Hydra's is ``-launcher``)
    if word in HYDRA_WORDS and not (word == "launcher" and flag.startswith("--")):
        d.hydra_words.append(word)
    return option.apply(d, flag, values) if option.apply is not None else None


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


def _build(d: Draft) -> JobSpec:
    """The job that the finished draft describes."""
    apps = _apps(d)
    hosts, host_filter = _hosts(d)
    placement: Dict[str, object] = {}
    if d.mapping:
        from .mapping import mapping_fields
        placement = mapping_fields(d.mapping)
    display_map = bool(placement.pop("display-map", False)) or d.display_map
    display_allocation = bool(placement.pop("display-allocation", False)) or d.display_allocation
    # None: the default, which lets the implicit local host run what -n asks.
    oversubscribe = placement.pop("oversubscribe", d.oversubscribe)
    if d.use_hwthread_cpus:
        placement["use_hwthreads"] = True
    if d.nolocal:
        placement["nolocal"] = True
    if d.rankfile:
        placement["rankfile"] = d.rankfile
    output = _output(d)
    stdin = _stdin(d)
    if d.perhost is not None and not any(
            name in ("npernode", "pernode", "ppn", "ppr", "npersocket") for name, _ in d.mapping):
        placement.update(per_node=d.perhost, per_node_wrap=True)
    timeout, source = d.timeout, "--timeout"
    if not d.timeout_said:
        # (Intel MPI's name first: its mpiexec takes MPIEXEC_TIMEOUT as its older spelling)
        for var in ("I_MPI_JOB_TIMEOUT", "MPIEXEC_TIMEOUT"):
            if d.environ.get(var):
                timeout, source = job_timeout(var, d.environ[var]), var
                break
    if d.report_state and timeout is None:      # Open MPI 4 ignores it without a word
        d.warnings.append("--report-state-on-timeout acts on a timeout only, and none is set: "
                          "add --timeout SECONDS (or set MPIEXEC_TIMEOUT)")
    keep_going = d.keep_going
    stall = d.stall_report
    if stall is None:
        # --get-stack-traces without --timeout: the stacks when the job stalls, sooner
        stall = 60.0 if d.stack_traces and timeout is None else STALL_SECONDS
    mpi = _mpi(d)
    if mpi == OPENMPI and (d.max_job_restarts or d.health_check):
        raise UsageError("--max-restarts and --health-check are not for --mpi openmpi, where "
                         "Open MPI's mpirun runs the job; leave out --mpi openmpi (mslaunch "
                         "serves Open MPI programs PMIx itself)")
    launcher, rsh_agent, rsh_args = rsh_settings(d)
    return JobSpec(
        apps=apps, hosts=tuple(hosts), host_filter=host_filter,
        oversubscribe=oversubscribe,  # type: ignore[arg-type]
        report_bindings=d.report_bindings, display_map=display_map, dry_run=d.dry_run,
        report_unbound=d.report_bindings and "bind_to" not in placement and not d.rankfile,
        display_allocation=display_allocation, display_diffable=d.display_diffable_map,
        display_topo=d.display_topo, index_argv=d.index_argv, report_state=d.report_state,
        stack_traces=d.stack_traces, report_pid=d.report_pid, exec_path=d.path,
        print_exit_codes=d.print_exit_codes, propagate_hostname=not d.no_hostname,
        report_json=d.report_json,
        stall_report=stall or None, stall_exit=d.stall_exit,
        max_job_restarts=d.max_job_restarts, health_check=d.health_check,
        preload_binary=d.preload_binary, preload_files=d.preload_files,
        session_cwd=d.session_cwd, usize=d.usize, novm=d.novm, port_range=d.port_range,
        **placement,  # type: ignore[arg-type]
        output=output, global_env=tuple(d.genv), inherit_env=d.inherit_env,
        forward_env=_forward_env(d), mca=tuple(d.mca), keep_going=keep_going, stdin=stdin,
        timeout=timeout, timeout_source=source, grace=float(d.grace), quiet=d.quiet,
        verbose=d.verbose, mpi=mpi,
        pmi_port=d.pmi_port, prefix=d.prefix, launch_dir=d.cwd,
        ssh=SSHSpec(config=d.ssh_config, user=d.ssh_user, port=d.ssh_port,
                    identity=d.ssh_identity, accept_new=d.ssh_accept_new,
                    connect_timeout=float(d.ssh_timeout),
                    remote_python=d.remote_python or d.agent_python,
                    agent_wrapper=d.agent_wrapper,
                    launcher=launcher, rsh_agent=rsh_agent, rsh_args=rsh_args,
                    rsh_concurrent=d.rsh_concurrent))


def _apps(d: Draft) -> Tuple[AppContext, ...]:
    """The MPMD contexts; an error if a program is missing."""
    contexts = d.contexts
    if not contexts[-1].argv:
        if len(contexts) == 1 and not contexts[0].env and contexts[0].np is None:
            raise UsageError("no program given (usage: mslaunch [options] program [args...])")
        raise UsageError("no program given after the options"
                         + (" of the last ':' context" if len(contexts) > 1 else ""))
    if len(contexts) > 1 and any(c.np is None for c in contexts):
        raise UsageError("every MPMD context needs -n when ':' separates programs")
    from ..machine.spawn import find_program
    apps = []
    for c in contexts:
        wdir = os.path.join(d.cwd, c.wdir) if c.wdir else None
        argv = c.argv
        if "\0" not in argv[0] and find_program(argv[0], d.environ, wdir or d.cwd,
                                                  d.path) is None:
            # a script without its execute bit runs with its interpreter
            from .scripts import interpreted
            typed = list(d.argv)
            before = typed[:len(typed) - len(argv)] if len(contexts) == 1 and \
                typed[len(typed) - len(argv):] == list(argv) else None
            argv, note = interpreted(argv, wdir or d.cwd, d.environ, d.path, before)
            if note:
                d.notes.append(note)
        apps.append(AppContext(argv=tuple(argv), np=c.np, env=tuple(c.env), wdir=wdir))
    return tuple(apps)


def _hosts(d: Draft) -> Tuple[List[HostEntry], Tuple[HostEntry, ...]]:
    """The hosts of the job, and the ``-H`` hosts that filter a hostfile's."""
    hosts: List[HostEntry] = []
    if d.hostfiles:
        from ..hosts.hostfile import parse_hostfile
        for path in d.hostfiles:
            hosts.extend(parse_hostfile(os.path.join(d.cwd, path)))
    host_filter: Tuple[HostEntry, ...] = ()
    if hosts and d.host_lists:
        host_filter = tuple(d.host_lists)
    elif d.host_lists:
        hosts = d.host_lists
    if not hosts and not d.host_lists:
        if d.default_hostfile:
            from ..core.errors import HostfileError
            from ..hosts.hostfile import parse_hostfile
            try:
                hosts = parse_hostfile(d.default_hostfile)
            except HostfileError as err:
                path, said = d.hostfile_source
                if path != d.default_hostfile:
                    raise
                raise HostfileError(f"{said}: {err}") from None
        elif d.default_hosts:
            hosts = list(d.default_hosts)
    if d.default_slots is not None:
        hosts = [h if h.slots is not None else replace(h, slots=d.default_slots) for h in hosts]
    return hosts, host_filter


def _output(d: Draft) -> OutputSpec:
    """Where and how the ranks' output goes."""
    output = OutputSpec()
    if d.output_filename is not None:
        output = _parse_output(d.output_filename, d.cwd)
    pty = pty_wanted(d.environ, no_pty=d.no_pty, default=True)
    return replace(output, merge_stderr=d.merge_stderr, pty=pty, tag=d.tag_output,
                   timestamp=d.timestamp_output, rank_prefix=d.prepend_rank,
                   xml=bool(d.xml or d.xml_file), xml_file=d.xml_file,
                   prefix_pattern=d.prefix_pattern,
                   stdout_pattern=_in(d.cwd, d.stdout_pattern),
                   stderr_pattern=_in(d.cwd, d.stderr_pattern))


def _in(cwd: str, pattern: str) -> str:
    """A file pattern relative to the launch directory, made absolute (as Hydra's)."""
    return os.path.join(cwd, pattern) if pattern else ""


def _stdin(d: Draft) -> str:
    """Who reads mslaunch's stdin: ``all``, ``none`` or a rank."""
    stdin = d.stdin.lower()
    if stdin not in ("all", "none"):
        stdin = str(check_int("--stdin", stdin, minimum=0))
        sizes = [c.np for c in d.contexts]
        if all(n is not None for n in sizes):
            ranks = sum(n for n in sizes if n is not None)
            if int(stdin) >= ranks:
                raise UsageError(f"--stdin {stdin}: the job has only {ranks} ranks")
    return stdin


def _mpi(d: Draft) -> str:
    """The MPI support asked for: ``pmi``, ``openmpi`` or ``none``."""
    mpi = ("pmi" if d.mpi is None else d.mpi).lower()
    if mpi in ("mpich", "hydra", "pmi1", "pmi2"):
        mpi = "pmi"
    if mpi not in ("pmi", "openmpi", "none"):
        raise UsageError(f"--mpi {d.mpi}: expected pmi, openmpi or none")
    if d.pmi_port and mpi != PMI:
        raise UsageError("-pmi-port needs --mpi pmi")
    return mpi
