"""The options of the mpirun dialect, one record each: every one of Open MPI 4.1.4's, and Hydra's.

An :class:`Option` names its spellings (any of them with one or two
dashes), the number of values it takes, how it changes the job being built
(see :mod:`.draft`), its ``--help`` text (see :mod:`.help`), and its
disposition: implemented, accepted (it has no meaning here; noted with
``-v``), or refused (one error line saying what to use instead) -- never
"unknown option" for a real mpirun flag.  Adding an option is adding a
record to :data:`SECTIONS`.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

    from .draft import Apply

from . import draft as D
from . import rshagent as R

if TYPE_CHECKING:
    class Option(NamedTuple):
        """One option of the mpirun dialect (a frozen record)."""

        names: Tuple[str, ...]         # the canonical name first, then other spellings
        nargs: int = 0                 # how many values follow it
        apply: Optional[Apply] = None  # how it changes the draft (implemented options)
        help: str = ""                 # "LEFT\tRIGHT" or a whole line; see help.py
        kind: str = "implemented"      # or "accepted", "refused"
        note: str = ""                 # where it differs from Open MPI 4.1.4 / why / instead

        @property
        def name(self) -> str: ...
else:
    # (operator's own C module: the Python module around it costs every launch
    # half a millisecond, for this one name)
    from _operator import itemgetter

    class Option(tuple):
        """One option of the mpirun dialect (a frozen record)."""

        __slots__ = ()

        def __new__(cls, names, nargs=0, apply=None, help="", kind="implemented", note=""):
            return tuple.__new__(cls, (names, nargs, apply, help, kind, note))

        names, nargs, apply, help, kind, note = (property(itemgetter(i)) for i in range(6))
        name = property(lambda self: self[0][0], doc="The canonical name.")

        def __repr__(self) -> str:
            return f"Option{tuple.__repr__(self)}"


def _set_mca(d: D.Draft, flag: str, values: Sequence[str]) -> None:
    from .mca import set_mca  # Open MPI's own parameters: only when one is given
    set_mca(d, flag, values)


def _completion(d: D.Draft, flag: str, values: Sequence[str]) -> None:
    if values[0] not in ("bash", "zsh"):
        from ..core.errors import UsageError, one_line
        raise UsageError(f"{flag} {one_line(values[0], 20)!r}: expected bash or zsh")
    from .common import Exit
    from .completion import completion
    raise Exit(completion(values[0], typed_spellings()), 0)


def _accepted(names: Tuple[str, ...], nargs: int, why: str) -> Option:
    return Option(names, nargs, None, "", "accepted", why)


def _refused(names: Tuple[str, ...], nargs: int, instead: str) -> Option:
    return Option(names, nargs, None, "", "refused", instead)


#: ``(title of the --help section, its options)``; an untitled section is not shown.
SECTIONS: Tuple[Tuple[str, Tuple[Option, ...]], ...] = (
    ("Size and hosts", (
        Option(("np", "n", "c"), 1, D.set_np, "-n, -np, -c N\tnumber of ranks (0 or none: "
               "one per slot)", note="no `-n` or `-n 0`: one rank per slot; with no host list "
               "this machine runs what `-n` asks (oversubscribing; `--nooversubscribe` refuses)"),
        Option(("host", "H", "hosts"), 1, D.add_hosts,
               "-H, --host, -hosts LIST\thosts as h1:4,h2 (a bare host is one slot); remote\n"
               "ranks get -x's variables, as Open MPI's (-hosts, Hydra's:\n"
               "this whole environment, as -genvall)"),
        Option(("hostfile", "machinefile", "f"), 1, D.add_hostfile,
               "--hostfile, --machinefile, -f FILE\t'host slots=N [max_slots=M]' or "
               "'host[:N]' lines\n(-f, Hydra's: remote ranks get this whole environment)"),
        Option(("default-hostfile",), 1, D.file_name("default_hostfile"),
               "--default-hostfile FILE\tthe hostfile used when no other host list is given"),
        Option(("rankfile", "rf"), 1, D.file_name("rankfile"),
               "-rf, --rankfile FILE\t'rank N=HOST slot=SPEC' lines: host and cpus of each rank"),
        Option(("app",), 1, D.file_name("app"),
               "--app FILE\tone MPMD context per line ('-n 2 prog args')"),
        Option(("nolocal",), 0, D.turn_on("nolocal"), "-nolocal\tno ranks on this machine"),
    )),
    ("Placement and binding", (
        Option(("map-by",), 1, D.place("map-by"), "--map-by POLICY[:PE=n][:OVERSUBSCRIBE]   "
               "slot (default), node, core, hwthread,\nsocket, numa, l1cache, l2cache, l3cache, "
               "board, ppr:N:OBJ"),
        Option(("rank-by",), 1, D.place("rank-by"), "--rank-by POLICY\tslot, node, core, "
               "hwthread, socket, numa, ... (default: as mapped)"),
        Option(("bind-to",), 1, D.place("bind-to"), "--bind-to POLICY[:overload-allowed|"
               ":ordered]   none (default), hwthread, core,\nl1cache, l2cache, l3cache, socket, "
               "numa, board, cpu-list",
               note="default none (Open MPI 4: core up to 2 ranks, then socket)"),
        Option(("npernode", "N"), 1, D.place("npernode"), "-npernode, -N, -ppn N\t"
               "N ranks per host     -npersocket N   N ranks per socket"),
        # Hydra's spelling: its own rule (ranks wrap around the hosts, never refused)
        Option(("ppn", "perhost"), 1, D.place("ppn")),
        Option(("npersocket",), 1, D.place("npersocket")),
        Option(("pernode",), 0, D.place("pernode")),
        Option(("ppr",), 1, D.place("ppr"),
               "--ppr N:OBJ\tN ranks per object   --cpus-per-proc N   N cpus per rank"),
        Option(("cpus-per-proc", "cpus-per-rank"), 1, D.place("cpus-per-proc")),
        Option(("use-hwthread-cpus", "hwthread-cpus"), 0, D.turn_on("use_hwthread_cpus"),
               "--use-hwthread-cpus\tcount hardware threads, not cores, as slots and cpus"),
        Option(("cpu-set",), 1, D.place("cpu-set"),
               "--cpu-set LIST\tuse only these cpus   --cpu-list LIST   bind to these cpus"),
        Option(("cpu-list",), 1, D.place("cpu-list")),
        Option(("oversubscribe",), 0, D.store("oversubscribe", True),
               "--oversubscribe, --nooversubscribe   allow / forbid more ranks than slots",
               note="ignores `max_slots`, as Open MPI 4 does"),
        Option(("nooversubscribe",), 0, D.store("oversubscribe", False)),
        Option(("bynode",), 0, D.place("bynode"), "-bynode, -byslot, -bycore, --bind-to-core, "
               "--bind-to-socket   old spellings"),
        Option(("byslot",), 0, D.place("byslot")),
        Option(("bycore",), 0, D.place("bycore")),
        Option(("bind-to-core",), 0, D.place("bind-to-core")),
        Option(("bind-to-socket",), 0, D.place("bind-to-socket")),
        Option(("report-bindings",), 0, D.turn_on("report_bindings"),
               "--report-bindings\tprint each rank's binding as Open MPI does",
               note="without `--bind-to` (mslaunch binds none by default, where Open MPI "
                    "binds to cores or sockets) a line per rank says it is not bound; with "
                    "`--bind-to none` no line, as in Open MPI"),
        Option(("display-map",), 0, D.turn_on("display_map"), "--display-map, "
               "--display-allocation, --display-diffable-map, --display-topo"),
        Option(("display-allocation",), 0, D.turn_on("display_allocation")),
        Option(("display-diffable-map",), 0, D.turn_on("display_diffable_map")),
        Option(("display-topo",), 0, D.turn_on("display_topo")),
        Option(("display",), 1, D.display),
        Option(("dry-run", "do-not-launch"), 0, D.turn_on("dry_run"), "--dry-run, "
               "--do-not-launch   print the plan (map, commands, logs), start nothing"),
    )),
    ("Environment and working directory", (
        Option(("x",), 1, D.export, "-x NAME[=VAL]\texport to the ranks of this context",
               note="variables of an outer launch are never inherited; `-x` can set them"),
        Option(("genv",), 2, D.set_genv,
               "-genv NAME VAL, -env NAME VAL, -genvlist A,B, -genvnone, -genvall"),
        Option(("env",), 2, D.set_env),
        Option(("genvlist",), 1, D.genv_list),
        Option(("envlist",), 1, D.env_list),
        Option(("genvnone",), 0, D.store("inherit_env", False)),
        Option(("envnone",), 0, D.store("inherit_env", False)),
        Option(("genvall",), 0, D.store("forward_env", True)),
        Option(("envall",), 0, D.store("forward_env", True)),
        Option(("mca", "gmca"), 2, _set_mca,
               "-mca, --mca KEY VAL\texport OMPI_MCA_KEY=VAL; mpirun's own (orte_*, rmaps_*, "
               "hwloc_*,\nplm_*, ras_*) take effect, also from OMPI_MCA_* and parameter files;\n"
               "'orte_abort_on_non_zero_status 0' (or --prtemca\nstate_base_error_non_zero_exit 0, "
               "or --runtime-options\nerror-nonzero-status=false) keeps going"),
        Option(("prtemca",), 2, D.prefixed_env("PRTE_MCA_", "state_base_error_non_zero_exit")),
        Option(("pmixmca",), 2, D.prefixed_env("PMIX_MCA_")),
        Option(("runtime-options",), 1, D.runtime_options),
        Option(("tune",), 1, D.read_options("tune"), "-tune FILE, -am FILE\tMCA settings ('key = value', "
               "'--mca key value') and -x from files"),
        Option(("am",), 1, D.read_options("am")),
        Option(("wdir", "wd"), 1, D.set_wdir, "-wdir, --wdir, -wd DIR\tworking directory of "
               "the ranks"),
        Option(("set-cwd-to-session-dir",), 0, D.turn_on("session_cwd"),
               "--set-cwd-to-session-dir\teach rank in a fresh directory of its own"),
        Option(("path",), 1, D.set_path,
               "-path DIR[:DIR]\tlook for the program in these directories first"),
        Option(("prefix",), 1, D.set_prefix,
               "--prefix DIR\tput DIR/bin and DIR/lib first in PATH and LD_LIBRARY_PATH"),
        Option(("index-argv-by-rank",), 0, D.turn_on("index_argv"),
               "--index-argv-by-rank\targv[0] of each rank becomes NAME-RANK"),
    )),
    ("Output", (
        Option(("output-filename",), 1, D.keep("output_filename"),
               "--output-filename DIR[:nocopy][:nojobid]\tDIR/1/rank.N/stdout and stderr, also "
               "copied to the terminal",
               note="also Open MPI 5's `DIR:nocopy`, `DIR:nojobid`"),
        Option(("output",), 1, D.output),
        Option(("merge-stderr-to-stdout",), 0, D.turn_on("merge_stderr"),
               "--merge-stderr-to-stdout\tone stream per rank, merged at the source",
               note="merged at the source, so the terminal copy is merged too (Open MPI 4 "
                    "merges only in the files)"),
        Option(("tag-output",), 0, D.turn_on("tag_output"),
               "--tag-output\tprefix lines with [1,RANK]<stdout>: (also in the files)"),
        Option(("timestamp-output",), 0, D.turn_on("timestamp_output"),
               "--timestamp-output\tprefix lines with the time (also in the files)"),
        Option(("xml",), 0, D.turn_on("xml"),
               "--xml, --xml-file FILE\tOpen MPI's XML form of the output"),
        Option(("xml-file",), 1, D.file_name("xml_file")),
        Option(("prepend-rank", "l"), 0, D.turn_on("prepend_rank"),
               "-l, -prepend-rank\tprefix lines with [RANK] (Hydra)"),
        Option(("prepend-pattern",), 1, D.pattern("prefix_pattern"),
               "-prepend-pattern PAT\tprefix lines with PAT: %r rank, %h host,\n"
               "%p host index, %g job (0) (Hydra)",
               note="as Hydra's: the prefix goes into the files too"),
        Option(("outfile-pattern",), 1, D.pattern("stdout_pattern"),
               "-outfile-pattern PAT, -errfile-pattern PAT\tstdout, stderr to the files "
               "PAT names,\nnot the terminal (Hydra)"),
        Option(("errfile-pattern",), 1, D.pattern("stderr_pattern")),
        Option(("no-pty",), 0, D.turn_on("no_pty"),
               "--no-pty\trank stdout on a pipe, not a pseudo-terminal (as Hydra)"),
        Option(("stdin",), 1, D.keep("stdin"), "--stdin all|none|RANK\twho reads mslaunch's "
               "stdin (default rank 0)", note="also `all`: every rank reads a copy"),
    )),
    ("Lifecycle", (
        Option(("timeout",), 1, D.set_timeout, "--timeout SECONDS\tstop the job after "
               "SECONDS (also MPIEXEC_TIMEOUT); exit 110", note="exit status 110, as Open MPI "
               "4; ranks get SIGTERM, then SIGKILL after `--grace` seconds (Open MPI: 1 s); "
               "0 or below (Hydra's -1): no limit"),
        Option(("report-state-on-timeout",), 0, D.turn_on("report_state"),
               "--report-state-on-timeout   on timeout, print the state of every rank"),
        Option(("get-stack-traces",), 0, D.turn_on("stack_traces"),
               "--get-stack-traces\ton timeout, print every rank's stacks first, merged\n"
               "(without --timeout: --stall-report 60)",
               note="one merged report labelled with ranks and hosts, read without stopping "
               "a rank (Python frames from the rank itself, native frames with eu-stack or "
               "gdb); without `--timeout` it means `--stall-report 60` (Open MPI: no effect)"),
        Option(("stall-report",), 1, D.seconds("stall_report", allow_zero=True),
               "--stall-report SECONDS\tprint every rank's stacks, merged, once no rank has\n"
               "written and no stack changed for SECONDS (default 300; 0: off)"),
        Option(("stall-exit",), 0, D.turn_on("stall_exit"),
               "--stall-exit\tend the job once the stall report is printed; exit 111"),
        Option(("grace",), 1, D.seconds("grace", allow_zero=True), "--grace SECONDS\t"
               "SIGTERM-to-SIGKILL delay when stopping ranks (default 5)"),
        Option(("disable-auto-cleanup",), 0, D.keep_going, "-disable-auto-cleanup\tkeep going "
               "when a rank fails (same as the mca setting above)"),
        Option(("enable-recovery",), 0, D.keep_going, note="a failed rank no longer stops the "
               "others and the exit status stays its own (Open MPI 4.1.4 exits 0); nothing is "
               "restarted, as there"),
        Option(("max-restarts", "max_restarts"), 1, D.max_restarts,
               "--max-restarts N\tafter a failure, start the whole job again,\nat most N "
               "times (docs/guides/long-jobs.md)",
               note="the whole job starts again after a failure, at most N times, as torchrun's "
               "(Open MPI 4.1.4 restarts nothing)"),
        Option(("health-check",), 1, D.some_value("health_check"), "--health-check CMD\t"
               "run CMD on every host before the job, and\nbefore each restart; hosts where "
               "it fails are left out"),
        Option(("report-pid",), 1, D.keep("report_pid"),
               "--report-pid -|+|FILE\tprint mslaunch's pid to stdout, stderr or FILE"),
        Option(("disable-hostname-propagation",), 0, D.turn_on("no_hostname"),
               note="no `PMI_HOSTNAME` in the ranks' environment: MPICH finds its host's name "
               "itself, as under Hydra"),
        Option(("print-all-exitcodes",), 0, D.turn_on("print_exit_codes"),
               "-print-all-exitcodes\tat the end, every rank's wait status by host (Hydra)",
               note="Hydra's line, after `mslaunch: `: `Exit codes: [h1] 0,256` (each a wait "
               "status: the exit code times 256, or the signal), one line per host, on stderr "
               "with mslaunch's other lines (Hydra writes it to stdout)"),
        Option(("report-json",), 1, D.file_name("report_json"), "--report-json FILE\twrite the "
               "job's report to FILE at its end: every\nrank's host, pid, start, end, exit "
               "code or signal\n(JSON; docs/reference/job-report.md)"),
        Option(("mpi",), 1, D.keep("mpi"), "--mpi pmi|openmpi|none\tMPI support: serve PMI to "
               "MPICH-ABI ranks (default),\ndelegate to Open MPI's mpirun, or no MPI support"),
        Option(("pmi-port",), 0, D.turn_on("pmi_port"),
               "-pmi-port\tserve PMI over TCP (PMI_PORT/PMI_ID) instead of PMI_FD"),
        Option(("usize",), 1, D.usize, "-usize SYSTEM|INFINITE|N\tMPI_UNIVERSE_SIZE over PMI: "
               "the job's slots, unknown\n(the default, as Hydra's), or N"),
        Option(("allow-run-as-root",), 0, None,
               "--allow-run-as-root\taccepted (mslaunch runs as root without it)"),
        Option(("personality",), 1, D.personality, note="only `ompi`"),
        Option(("ompi-server",), 1, D.ompi_server,
               note="names are published through mslaunch's PMI server"),
    )),
    ("Remote hosts (over SSH; hosts that are this machine run without it)", (
        Option(("ssh-config",), 1, D.file_name("ssh_config", expand_user=True),
               "--ssh-config FILE\tread FILE instead of ~/.ssh/config"),
        Option(("ssh-user",), 1, D.some_value("ssh_user"), "--ssh-user USER, --ssh-port N, "
               "--ssh-identity FILE\toverride what ~/.ssh/config says for every host"),
        Option(("ssh-port",), 1, D.ssh_port),
        Option(("ssh-identity",), 1, D.file_name("ssh_identity", expand_user=True)),
        Option(("ssh-accept-new",), 0, D.turn_on("ssh_accept_new"), "--ssh-accept-new\tadd "
               "unknown host keys (as StrictHostKeyChecking=accept-new)\nto the first file the "
               "SSH config's UserKnownHostsFile names\nfor the host, else to ~/.ssh/known_hosts; "
               "a changed key is refused"),
        Option(("ssh-timeout",), 1, D.seconds("ssh_timeout"),
               "--ssh-timeout SECONDS\tconnect timeout per host (default 10)"),
        Option(("remote-python",), 1, D.some_value("remote_python"), "--remote-python PATH, "
               "--launch-agent PATH\tthe Python that runs the agent on the remote hosts\n"
               "(default: this Python's path if it exists there, else python3)"),
        Option(("launch-agent",), 1, D.launch_agent,
               note="the Python that runs the agent on remote hosts; `WRAPPER... orted` runs "
                    "the agent through WRAPPER (a container's runner, say)"),
        Option(("preload-binary", "s"), 0, D.turn_on("preload_binary"), "-s, --preload-binary"
               "\tcopy the program to the remote hosts' working directories"),
        Option(("preload-files",), 1, D.preload_files,
               "--preload-files A,B\tcopy these files there too"),
        Option(("launcher", "bootstrap"), 1, D.launcher, "-launcher ssh|rsh|slurm|local, "
               "-launcher-exec CMD\tstart the agents with\n'CMD [ARGS] HOST command' "
               "(also -bootstrap-exec, --mca plm_rsh_agent 'ssh : rsh');\n"
               "-bootstrap-exec-args ARGS (--mca plm_rsh_args) adds ARGS;\n"
               "-launcher srun: srun starts the ranks themselves, no agent"),
        Option(("launcher-exec", "bootstrap-exec"), 1, R.set_exec),
        Option(("bootstrap-exec-args",), 1, R.set_exec_args),
        Option(("novm",), 0, D.turn_on("novm"), note="agents start only on hosts that run "
               "ranks; by default, as Open MPI's daemons, on every host of the list, so that "
               "spawned jobs can use them"),
    )),
    ("Other", (
        Option(("quiet", "q"), 0, D.turn_on("quiet"),
               "-q, --quiet\tfewer messages    -v, --verbose   more messages",
               note="nothing said of a failed job (no summary, no timeout line), as Open MPI's"),
        Option(("verbose", "v"), 0, D.count_verbose),
        Option(("version", "V"), 0, D.turn_on("version"),
               "-V, --version\tprint the version  -h, --help     this help"),
        Option(("help", "h"), 0, D.turn_on("help")),
        Option(("completion",), 1, _completion,
               "--completion bash|zsh\tprint the shell's completion script (options, SSH\n"
               "hosts after -H, --map-by's values): mslaunch --completion bash >\n"
               "~/.local/share/bash-completion/completions/mslaunch"),
    )),
    ("", (  # accepted: no meaning here
        _accepted(("continuous",), 0, "jobs run until their ranks end or are stopped"),
        _accepted(("leave-session-attached",), 0, "there are no daemons to keep attached"),
        _accepted(("output-proctable",), 0,
                  "there is no debugger interface; -v names each rank's pid"),
        _accepted(("report-child-jobs-separately",), 0, "the exit status is always the job's"),
        _accepted(("cartofile", "cf"), 1, "cartography files are ignored (as by Open MPI 4)"),
        _accepted(("debug-devel", "d"), 0, "use -v -v"),
        _accepted(("debug-daemons",), 0, "use -v; agents report problems on their own"),
        _accepted(("debug-daemons-file",), 0, "use -v"),
        _accepted(("display-devel-allocation",), 0, "shown as --display-allocation"),
        _accepted(("display-devel-map",), 0, "shown as --display-map"),
        _accepted(("do-not-resolve",), 0,
                  "host names are never resolved by mslaunch except to connect"),
        _accepted(("enable-instant-on-support",), 0, "there is no PMIx instant-on here"),
        _accepted(("fwd-mpirun-port",), 0, "there are no daemons to share a port"),
        _accepted(("noprefix",), 0, "mslaunch never adds a prefix of its own"),
        _accepted(("show-progress",), 0, "starting is reported with -v"),
        _accepted(("use-regexp",), 0, "host lists are always sent whole"),
        _accepted(("max-vm-size",), 1, "there is no persistent virtual machine"),
        _accepted(("disable-recovery",), 0, "failed ranks are never restarted in this mode"),
        _accepted(("dvm",), 0, "there is no persistent virtual machine: the job runs as usual"),
        _accepted(("allow-run-as-root-confirm",), 0, "mslaunch does not refuse root"),
        _accepted(("nameserver",), 1, "published names are kept by mslaunch's own PMI "
                  "service, for the job and those it spawns"),
        _accepted(("rmk",), 1,
                  "mslaunch finds Slurm, PBS, Grid Engine and LSF allocations by itself"),
    )),
    ("", (  # refused, with what to use instead
        _refused(("iface",), 1, "set the MPI library's own interface setting instead "
                 "(MPICH over UCX: -x UCX_NET_DEVICES=IFACE, over libfabric: -x "
                 "FI_TCP_IFACE=IFACE; Open MPI: --mca btl_tcp_if_include IFACE)"),
        _refused(("info",), 0, "mslaunch --version says mslaunch's; the MPI library's "
                 "own tool says its build (mpichversion, ompi_info)"),
        _refused(("debug", "tv"), 0, "there is no parallel debugger interface; "
                 "`mslaunch-stacks` shows every rank's stacks of a running job, or attach "
                 "gdb -p to a rank (-v shows pids)"),
        _refused(("debugger",), 1,
                 "there is no parallel debugger interface; attach gdb -p to a rank"),
        _refused(("report-events",), 1, "there is no tool event interface; use -v for each "
                 "rank's start and end, --report-pid FILE for mslaunch's pid"),
        _refused(("report-uri",), 1, "mslaunch has no contact URI: ranks reach it through PMI; "
                 "use --report-pid FILE to find mslaunch"),
        _refused(("xterm",), 1,
                 "no ranks are shown in xterms; use --output-filename DIR or --tag-output"),
        _refused(("hnp",), 1, "there is no persistent virtual machine to submit to; run "
                 "mslaunch with the job's hosts (-H, --hostfile) instead"),
    )),
)

#: every spelling (without dashes) -> its option
SPELLINGS: Dict[str, Option] = {name: option for _, options in SECTIONS
                                for option in options for name in option.names}


def words_of(token: str) -> Tuple[Optional[str], Optional[str]]:
    """``(option word without dashes, inline value)`` of a command-line word.

    ``(None, None)`` for a word that is not an option (the program).
    """
    if not token.startswith("-") or token in ("-", "--"):
        return None, None
    body = token[2:] if token.startswith("--") else token[1:]
    if "=" in body:
        body, value = body.split("=", 1)
        return body, value
    return body, None


def lookup(body: str) -> Tuple[str, str]:
    """``(canonical name, disposition)`` of an option word without its dashes.

    Disposition is ``implemented``, ``accepted``, ``refused`` or ``""`` (unknown).
    """
    option = SPELLINGS.get(body)
    return (option.name, option.kind) if option is not None else (body, "")


def nargs(name: str) -> int:
    return SPELLINGS[name].nargs


#: Every option line of Open MPI 4.1.4's ``mpirun --help all`` (spellings joined by ``|``).
OPEN_MPI_4: Tuple[str, ...] = (
    "-allow-run-as-root|--allow-run-as-root", "-am", "--app", "--bind-to",
    "-bind-to-core|--bind-to-core", "-bind-to-socket|--bind-to-socket", "-bycore|--bycore",
    "-bynode|--bynode", "-byslot|--byslot", "-c|-np|--np", "-cf|--cartofile",
    "-continuous|--continuous", "-cpu-list|--cpu-list", "-cpu-set|--cpu-set",
    "-cpus-per-proc|--cpus-per-proc", "-cpus-per-rank|--cpus-per-rank",
    "-d|-debug-devel|--debug-devel", "-debug|--debug", "-debug-daemons|--debug-daemons",
    "-debug-daemons-file|--debug-daemons-file", "-debugger|--debugger",
    "-default-hostfile|--default-hostfile", "-disable-recovery|--disable-recovery",
    "-display-allocation|--display-allocation",
    "-display-devel-allocation|--display-devel-allocation",
    "-display-devel-map|--display-devel-map", "-display-diffable-map|--display-diffable-map",
    "-display-map|--display-map", "-display-topo|--display-topo",
    "-do-not-launch|--do-not-launch", "-do-not-resolve|--do-not-resolve", "-dvm|--dvm",
    "-enable-instant-on-support|--enable-instant-on-support",
    "-enable-recovery|--enable-recovery", "-fwd-mpirun-port|--fwd-mpirun-port",
    "-get-stack-traces|--get-stack-traces", "-gmca|--gmca", "-h|--help", "-H|-host|--host",
    "-hnp|--hnp", "-hostfile|--hostfile", "-index-argv-by-rank|--index-argv-by-rank",
    "-launch-agent|--launch-agent", "-leave-session-attached|--leave-session-attached",
    "-machinefile|--machinefile", "--map-by", "-max-restarts|--max-restarts",
    "-max-vm-size|--max-vm-size", "-mca|--mca",
    "-merge-stderr-to-stdout|--merge-stderr-to-stdout", "-N", "-n|--n", "-nolocal|--nolocal",
    "-nooversubscribe|--nooversubscribe", "--noprefix", "-novm|--novm", "-npernode|--npernode",
    "-npersocket|--npersocket", "-ompi-server|--ompi-server",
    "-output-filename|--output-filename", "-output-proctable|--output-proctable",
    "-oversubscribe|--oversubscribe", "-path|--path", "-pernode|--pernode",
    "-personality|--personality", "--ppr", "--prefix", "--preload-files", "-q|--quiet",
    "--rank-by", "-report-bindings|--report-bindings",
    "-report-child-jobs-separately|--report-child-jobs-separately",
    "-report-events|--report-events", "-report-pid|--report-pid",
    "-report-state-on-timeout|--report-state-on-timeout", "-report-uri|--report-uri",
    "-rf|--rankfile", "-s|--preload-binary",
    "-set-cwd-to-session-dir|--set-cwd-to-session-dir", "-show-progress|--show-progress",
    "-stdin|--stdin", "-tag-output|--tag-output", "-timeout|--timeout",
    "-timestamp-output|--timestamp-output", "-tune", "-tv|--tv",
    "-use-hwthread-cpus|--use-hwthread-cpus", "-use-regexp|--use-regexp", "-v|--verbose",
    "-V|--version", "-wd|--wd", "-wdir|--wdir", "-x", "-xml|--xml", "-xml-file|--xml-file",
    "-xterm|--xterm",
)


def typed_spellings() -> List[str]:
    """Every spelling of the options, as typed (``--np``, ``-np``, ``-H``)."""
    words = set()
    for name in SPELLINGS:
        words.add(("-" if len(name) == 1 else "--") + name)
        if len(name) > 1:
            words.add("-" + name)
    return sorted(words)


def markdown_table() -> str:
    """The options reference's table (docs/reference/options.md) of Open MPI 4.1.4's options
    and what mslaunch does with each."""
    rows = ["| Open MPI 4.1.4 option | in mslaunch |", "|---|---|"]
    for line in OPEN_MPI_4:
        option = SPELLINGS[line.split("|")[-1].lstrip("-")]
        spelled = ", ".join(f"`{s}`" for s in line.split("|"))
        if option.kind == "implemented":
            what = "implemented" + (f": {option.note}" if option.note else "")
        elif option.kind == "accepted":
            what = f"accepted, no effect: {option.note}"
        else:
            what = f"refused: {option.note}"
        rows.append(f"| {spelled} | {what} |")
    return "\n".join(rows) + "\n"
