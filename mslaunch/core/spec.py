"""Frozen value types passed along the pipeline.

``cli`` turns argv into a :class:`JobSpec`; ``hostfile`` yields
:class:`HostEntry` items; ``plan`` turns both into a :class:`Plan` of
:class:`RankSpec`; the supervisor returns a :class:`JobResult`.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    # Type checkers see the standard decorator; at run time the small
    # equivalent below stands in for it.
    from dataclasses import dataclass, replace
    from typing import Dict, Mapping, Optional, Tuple

    from .states import Ending, LauncherName
else:
    _MISSING = object()


    class FrozenInstanceError(AttributeError):
        """Raised on an attempt to change a field of a frozen record."""


    def dataclass(frozen: bool = True):
        """A frozen dataclass without the ``dataclasses`` module.

        ``dataclasses`` imports ``inspect``; together they cost about 9 ms, more
        than a whole ``-n 1 true`` launch may spend, so the value types here use
        this small equivalent: fields and defaults from the class annotations,
        keyword or positional construction, equality, hashing, ``repr`` and
        :func:`replace`, and no assignment after construction.
        """
        assert frozen

        def wrap(cls):
            names = tuple(n for klass in reversed(cls.__mro__)
                          for n in klass.__dict__.get("__annotations__", {}))
            names = tuple(dict.fromkeys(names))
            defaults = {n: getattr(cls, n) for n in names if hasattr(cls, n)}
            for n in defaults:
                if n in cls.__dict__:
                    delattr(cls, n)

            def __init__(self, *args, **kwargs):
                if len(args) > len(names):
                    raise TypeError(f"{cls.__name__}: too many arguments")
                values = dict(zip(names, args))
                for key, value in kwargs.items():
                    if key not in names or key in values:
                        raise TypeError(f"{cls.__name__}: unexpected or repeated field {key!r}")
                    values[key] = value
                for n in names:
                    value = values.get(n, defaults.get(n, _MISSING))
                    if value is _MISSING:
                        raise TypeError(f"{cls.__name__}: missing field {n!r}")
                    object.__setattr__(self, n, value)

            def _fields(self):
                return tuple(getattr(self, n) for n in names)

            def __setattr__(self, name, value):
                raise FrozenInstanceError(f"cannot assign to field {name!r}")

            def __delattr__(self, name):
                raise FrozenInstanceError(f"cannot delete field {name!r}")

            def __eq__(self, other):
                if other.__class__ is not self.__class__:
                    return NotImplemented
                return _fields(self) == _fields(other)

            def __hash__(self):
                return hash(_fields(self))

            def __repr__(self):
                inner = ", ".join(f"{n}={getattr(self, n)!r}" for n in names)
                return f"{cls.__name__}({inner})"

            for fn in (__init__, __setattr__, __delattr__, __eq__, __hash__, __repr__):
                fn.__qualname__ = f"{cls.__qualname__}.{fn.__name__}"
                setattr(cls, fn.__name__, fn)
            cls.__dataclass_fields__ = names
            return cls
        return wrap


    def replace(record, **changes):
        """A copy of a frozen record with some fields changed."""
        values = {n: getattr(record, n) for n in record.__dataclass_fields__}
        values.update(changes)
        return record.__class__(**values)


@dataclass(frozen=True)
class HostEntry:
    """One host as written by the user (hostfile, ``-H``, allocation).

    ``slots`` is None when the source gave no count; the planner then uses
    the number of cores for this machine and 1 for any other host.
    """

    name: str
    slots: Optional[int] = None
    max_slots: Optional[int] = None
    origin: str = ""


@dataclass(frozen=True)
class AppContext:
    """One MPMD context: ``-n 2 -x A=1 prog args``."""

    argv: Tuple[str, ...]
    np: Optional[int] = None
    env: Tuple[Tuple[str, Optional[str]], ...] = ()
    wdir: Optional[str] = None
    #: (index in argv, prefix): each rank gets PREFIX<its local rank> there
    #: (DeepSpeed's ``--local_rank=N``)
    local_rank_arg: Optional[Tuple[int, str]] = None


@dataclass(frozen=True)
class OutputSpec:
    """How rank output reaches the terminal and files."""

    directory: Optional[str] = None      # --output-filename DIR (absolute)
    copy_to_terminal: bool = True        # False with DIR:nocopy
    jobid_dir: bool = True               # False with DIR:nojobid
    merge_stderr: bool = False
    pty: bool = True                     # rank stdout on a pseudo-terminal (--no-pty: a pipe)
    tag: bool = False                    # --tag-output
    timestamp: bool = False              # --timestamp-output
    rank_prefix: bool = False            # Hydra -l / -prepend-rank
    prefix_pattern: str = ""             # Hydra -prepend-pattern (see plan.patterns)
    stdout_pattern: str = ""             # Hydra -outfile-pattern: stdout to that file alone
    stderr_pattern: str = ""             # Hydra -errfile-pattern
    xml: bool = False                    # --xml: Open MPI's XML on the terminal
    xml_file: Optional[str] = None       # --xml-file FILE: ... into FILE
    label_prefix: bool = False           # lines on the terminal start "[label] " (msrun)


@dataclass(frozen=True)
class SSHSpec:
    """How remote hosts are reached (command-line settings; ~/.ssh/config otherwise)."""

    config: Optional[str] = None          # --ssh-config FILE
    user: Optional[str] = None            # --ssh-user
    port: Optional[int] = None            # --ssh-port
    identity: Optional[str] = None        # --ssh-identity FILE
    accept_new: bool = False              # --ssh-accept-new
    connect_timeout: float = 10.0         # --ssh-timeout
    remote_python: Optional[str] = None   # --remote-python PATH
    agent_wrapper: Tuple[str, ...] = ()   # --launch-agent 'WRAPPER... orted': runs the agent
    launcher: LauncherName = "auto"       # --launcher (see cli.draft.launcher_words)
    rsh_agent: str = ""                   # plm_rsh_agent ("ssh : rsh"); "": paramiko
    rsh_args: str = ""                    # plm_rsh_args: extra arguments of rsh_agent
    rsh_concurrent: int = 128             # plm_rsh_num_concurrent: starts under way at once


@dataclass(frozen=True)
class JobSpec:
    """Everything the command line asked for, validated but not yet planned."""

    apps: Tuple[AppContext, ...]
    hosts: Tuple[HostEntry, ...] = ()
    host_filter: Tuple[HostEntry, ...] = ()
    # --map-by: slot node core hwthread board socket numa l1cache l2cache l3cache
    map_by: str = "slot"
    per_node: Optional[int] = None        # ppr:N:node, -npernode, -ppn
    per_node_wrap: bool = False           # Hydra's -ppn: more ranks wrap around the hosts
    ppr: Optional[Tuple[int, str]] = None  # ppr:N:OBJ for other objects (-npersocket)
    pe: Optional[int] = None              # :PE=n, --cpus-per-proc
    rank_by: Optional[str] = None         # --rank-by (None: as mapped)
    oversubscribe: Optional[bool] = None  # None: only on the implicit local host
    # --bind-to: none hwthread core l1cache l2cache l3cache numa socket board cpu-list
    bind_to: str = "none"
    bind_overload: bool = False           # :overload-allowed
    bind_ordered: bool = False            # cpu-list:ordered
    cpu_set: Optional[Tuple[int, ...]] = None   # --cpu-set
    cpu_list: Optional[Tuple[int, ...]] = None  # --cpu-list
    use_hwthreads: bool = False           # --use-hwthread-cpus
    nolocal: bool = False                 # -nolocal
    rankfile: Optional[str] = None        # -rf FILE (absolute)
    report_bindings: bool = False
    #: --report-bindings without --bind-to: an unbound rank gets its line too
    #: (Open MPI binds by default; mslaunch does not)
    report_unbound: bool = False
    display_map: bool = False
    display_allocation: bool = False
    display_diffable: bool = False        # --display-diffable-map
    display_topo: bool = False
    dry_run: bool = False
    output: OutputSpec = OutputSpec()
    global_env: Tuple[Tuple[str, Optional[str]], ...] = ()
    inherit_env: bool = True              # False with Hydra -genvnone
    forward_env: bool = False             # Hydra -genvall: the whole env to remote ranks too
    mca: Tuple[Tuple[str, str], ...] = ()
    keep_going: bool = False              # abort-on-non-zero disabled
    stdin: str = "0"                      # "all", "none" or a rank number
    timeout: Optional[float] = None
    timeout_source: str = "--timeout"     # what set it, for the line that says it ended the job
    grace: float = 5.0
    quiet: bool = False
    verbose: int = 0
    mpi: str = "pmi"                      # pmi | openmpi | none
    pmi_port: bool = False                # serve PMI over TCP, not PMI_FD
    # MPICH_PORT_RANGE / MPIEXEC_PORT_RANGE: the ports mslaunch listens on (None: any)
    port_range: Optional[Tuple[int, int]] = None
    prefix: Optional[str] = None
    launch_dir: str = "."
    ssh: SSHSpec = SSHSpec()
    index_argv: bool = False              # --index-argv-by-rank
    report_state: bool = False            # --report-state-on-timeout
    stack_traces: bool = False            # --get-stack-traces
    # --stall-report S: the merged stacks once the job looks stalled for S s (None: off)
    stall_report: Optional[float] = None
    stall_exit: bool = False              # --stall-exit: and end the job there
    report_pid: Optional[str] = None      # --report-pid -|+|FILE
    print_exit_codes: bool = False        # Hydra's -print-all-exitcodes
    # the line's own -q, where the job a supervisor sees is quiet whatever it said
    # (Open MPI's mpirun reports the ranks: run.attempt.as_supervised)
    line_quiet: Optional[bool] = None
    propagate_hostname: bool = True       # PMI_HOSTNAME (Hydra's -disable-hostname-propagation)
    report_json: Optional[str] = None     # --report-json FILE (see job.jobreport)
    exec_path: Tuple[str, ...] = ()       # -path DIR[:DIR]
    preload_binary: bool = False          # -s, --preload-binary
    preload_files: Tuple[str, ...] = ()   # --preload-files A,B (absolute)
    session_cwd: bool = False             # --set-cwd-to-session-dir
    # Hydra's -usize: MPI_UNIVERSE_SIZE over PMI (None: unknown, as Hydra's
    # default; 0: SYSTEM, the job's slots; N: N)
    usize: Optional[int] = None
    novm: bool = False                    # --novm: agents only on hosts with ranks
    # --max-restarts N: the whole job started again after a failure, at most N times
    # (see job.attempts); ``attempt`` is the attempt's number (0: the first)
    max_job_restarts: int = 0
    attempt: int = 0
    health_check: Optional[str] = None    # --health-check CMD: run on every host before each attempt
    # the seconds left of --timeout for this attempt (None: all of it); the job's
    # --timeout counts across its attempts
    timeout_left: Optional[float] = None
    # the job is a --health-check's commands, not the user's ranks: they get the
    # job's environment and directory but no rank's identity, and their time
    # limit is the check's own
    is_check: bool = False
    # the job is a torchrun command line's (see TorchSpec); None: mpirun's
    torch: Optional[TorchSpec] = None


@dataclass(frozen=True)
class TorchSpec:
    """What a job read from torchrun's command line gives each worker beyond
    every ecosystem's rank variables: torchrun's own, its files, its console."""

    run_id: str = "none"
    role: str = "default"
    # where attempt_N/<local rank>/ is made (torchrun's <log dir>/<run id>_XXXXXXXX);
    # None: no files at all (--log-dir /dev/null)
    run_dir: Optional[str] = None
    # per local rank (absent: 0): 1 stdout, 2 stderr, 3 both to the files (-r);
    # shown on the terminal as well, after a prefix (-t)
    redirects: Tuple[Tuple[int, int], ...] = ()
    tee: Tuple[Tuple[int, int], ...] = ()
    shown: Optional[Tuple[int, ...]] = None     # --local-ranks-filter: None: every one
    prefix: str = "[${role_name}${local_rank}]:"  # TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE
    virtual_local_rank: bool = False
    cuda_devices: Optional[Tuple[str, ...]] = None  # CUDA_VISIBLE_DEVICES, split


#: ``--stall-report``'s seconds when none are given (docs/guides/stacks.md says why).
STALL_SECONDS = 300.0


@dataclass(frozen=True)
class NodeRounds:
    """How the nodes of a torchrun line start again together (see
    :mod:`mslaunch.msrun.rounds`): ``--nnodes MIN:MAX``, ``--max-restarts``, and
    the seconds a round with at least MIN nodes waits for more (torchrun's
    ``last_call_timeout``)."""

    min_nodes: int
    max_nodes: int
    max_restarts: int
    last_call: float = 30.0


@dataclass(frozen=True)
class MsrunSpec:
    """An msrun command line (MindSpore's launcher), validated but not yet run."""

    argv: Tuple[str, ...]                 # python script args..., as msrun runs it
    worker_num: int = 8
    local_worker_num: int = 8
    master_addr: str = "127.0.0.1"
    master_port: int = 8118
    node_rank: int = -1
    log_dir: str = "."                    # absolute
    join: bool = False
    cluster_time_out: int = 600           # seconds; negative: wait for ever
    # --bind_core / --bind_numa: None (off), "auto" (split the CPUs), or a map
    # of ("deviceN" | "scheduler", cpu list text) pairs
    bind_core: Optional[object] = None
    bind_numa: Optional[object] = None
    sim_level: int = -1
    sim_rank_id: int = -1
    rank_table_file: str = ""
    worker_log_name: str = ""
    tail_worker_log: str = "-1"           # node ids (local indices) whose logs --join shows
    launch_dir: str = "."
    # mslaunch's own additions
    service_port: Optional[int] = None    # the node service (default master_port + 1)
    order: str = ""                       # without node_rank: rank nodes by this key, not arrival
    local_addr: str = ""                  # (with order) this node's address for the store
    rounds: Optional[NodeRounds] = None   # the nodes start again together (torchrun's line)
    master_flag: str = "--master_addr"    # the option that named the master, for errors
    node_rank_flag: str = "--node_rank"   # and the one that gives a node's rank
    every_node_first: bool = False        # torchrun's static rendezvous: no worker before all
    job_name: str = ""                    # torchrun's --rdzv-id: a node of another is refused
    join_if_taken: bool = False           # c10d: the service's port taken here, join it
    secret_file: Optional[str] = None
    tls_config: Optional[str] = None      # msrun's config.json (cert paths, ciphers)
    max_restarts: int = 3                 # per process, with MS_ENABLE_RECOVERY=1
    grace: float = 5.0
    verbose: int = 0
    quiet: bool = False
    log_dir_given: str = ""               # --log_dir as typed, for msrun's console lines
    pty: bool = False                     # processes' stdout a pty (msrun: its log files)
    report_json: Optional[str] = None     # --report_json FILE (see job.jobreport)
    warnings: Tuple[str, ...] = ()        # msrun's own, said with its console lines


@dataclass(frozen=True)
class Host:
    """A host the planner places ranks on."""

    name: str
    slots: int
    max_slots: Optional[int]
    local: bool
    node_id: int


@dataclass(frozen=True)
class RankSpec:
    """Everything needed to start one rank; built by the pure planner."""

    rank: int
    app: int
    host: Host
    local_rank: int
    local_size: int
    argv: Tuple[str, ...]
    env: Mapping[str, str]
    cwd: str
    stdout_path: Optional[str]
    stderr_path: Optional[str]
    cpus: Optional[Tuple[int, ...]] = None
    stdin: str = "null"                    # inherit | pipe | null
    # How ``env`` is meant: "launcher" -- the whole environment, built here;
    # "remote" -- what to set on top of the remote host's login environment
    # (``path_prefix`` then goes first in its PATH and LD_LIBRARY_PATH);
    # "none" -- the whole environment (Hydra's -genvnone).
    inherit: str = "launcher"
    path_prefix: Optional[str] = None
    program: Optional[str] = None          # what to execute when not argv[0]
    search: Tuple[str, ...] = ()           # -path: directories tried before PATH
    session_dir: bool = False              # --set-cwd-to-session-dir
    # Open MPI's job number: 1 for the job mslaunch was asked to run, 2, 3 ...
    # for jobs its ranks spawned (MPI_Comm_spawn); ``rank`` is within the job.
    job: int = 1
    # The process's number among all of the launcher's processes (the first
    # job's ranks, then spawned ones), when it is not ``rank``.
    index: Optional[int] = None
    # What messages call the process when not "rank N" (msrun: "worker 3",
    # "scheduler"), and whether its output reaches the terminal (None: as
    # the job's output settings say).
    label: Optional[str] = None
    console: Optional[bool] = None
    # A session of its own rather than only a process group (msrun's workers).
    session: bool = False
    # Per stream (stdout, stderr): not on the terminal (None), or on it after
    # this prefix; None: as ``console`` and the job's output settings say.
    streams: Optional[Tuple[Optional[bytes], Optional[bytes]]] = None
    # Where the rank writes its error when it fails (torchrun's
    # TORCHELASTIC_ERROR_FILE), read for the failure's report.
    error_file: Optional[str] = None

    @property
    def key(self) -> int:
        """The process's number among all of the launcher's (see ``index``)."""
        return self.rank if self.index is None else self.index


@dataclass(frozen=True)
class SpawnCommand:
    """One command of an ``MPI_Comm_spawn(_multiple)``, as the PMI client sent it."""

    program: str
    args: Tuple[str, ...]
    nprocs: int
    info: Tuple[Tuple[str, str], ...] = ()     # MPI_Info keys: host, wdir, path, ...


@dataclass(frozen=True)
class SpawnRequest:
    """A spawn: its commands and the pairs put into the new job's key-value space."""

    commands: Tuple[SpawnCommand, ...]
    preput: Tuple[Tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Plan:
    """The whole job, placed: ranks in world-rank order and the hosts used."""

    ranks: Tuple[RankSpec, ...]
    hosts: Tuple[Host, ...]
    kvsname: str
    process_mapping: str
    universe_size: int
    master_addr: str
    master_port: int
    ompi_jobid: int = 0                    # Open MPI's job id in OMPI_MCA_orte_hnp_uri
    topologies: Tuple[object, ...] = ()    # a Topology per host, as hosts
    oversubscribe: bool = False            # whether ranks may outnumber slots
    # Hosts of the host list the job's ranks do not use: room for spawned jobs
    # (node ids follow those of ``hosts``).
    spare_hosts: Tuple[Host, ...] = ()


@dataclass(frozen=True)
class RankResult:
    """How one rank ended."""

    rank: int
    host: str
    pid: int
    returncode: Optional[int]             # exit status, or None if killed
    signal: Optional[int] = None
    reason: str = ""                      # e.g. "called MPI_Abort", "timed out"
    stderr_tail: bytes = b""
    name: str = ""                        # "rank N", or the process's label (msrun mode)
    job: int = 1                          # the spawned job it belongs to (1: the first)
    start: Optional[float] = None         # wall-clock seconds: when it started (None: never)
    end: Optional[float] = None           # and when its end was seen
    restarts: int = 0                     # times started again (msrun's recovery)
    # what the rank's error file (torchrun's TORCHELASTIC_ERROR_FILE) said of its
    # failure: the message and the traceback, and where it was; "" when it said nothing
    error: str = ""
    error_traceback: str = ""
    error_file: str = ""

    @property
    def exit_code(self) -> int:
        """The code a shell would see: the status, or 128+signal."""
        if self.signal is not None:
            return 128 + self.signal
        return self.returncode or 0

    @property
    def failed(self) -> bool:
        return self.signal is not None or bool(self.returncode) or bool(self.reason)


@dataclass(frozen=True)
class Attempt:
    """One attempt of a job run with ``--max-restarts``."""

    number: int                           # 0: the first
    start: float                          # seconds since the epoch
    end: float
    exit_code: int
    cause: str = ""                       # the failure that ended it ("" if none)
    hosts: Tuple[str, ...] = ()           # the hosts it ran on
    lost: Tuple[str, ...] = ()            # hosts lost during it, left out of the next
    left_out: Tuple[str, ...] = ()        # hosts it was run without (lost, failed checks)
    # seconds from the previous attempt's failure to this one's ranks all started
    restart_seconds: Optional[float] = None
    stall_report: str = ""


@dataclass(frozen=True)
class JobResult:
    """The job's outcome: every rank's result and the launcher's exit code."""

    exit_code: int
    ranks: Tuple[RankResult, ...] = ()
    root_cause: Optional[RankResult] = None
    message: str = ""
    # how the job ended: None (it ran to its end), or one of core.states' endings
    ending: Optional[Ending] = None
    # the failure that is the cause and those that followed, each with when it happened
    # (seconds since the epoch, the launcher's clock), in that order
    failures: Tuple[Tuple[float, RankResult], ...] = ()
    # the merged stacks of a job ended by --stall-exit, as printed
    stall_report: str = ""
    # with --max-restarts: every attempt, the last one included
    attempts: Tuple[Attempt, ...] = ()
    # the signal that asked mslaunch to stop (SIGINT, SIGTERM, SIGHUP), if one came,
    # also after a failure had ended the job
    stop_signal: Optional[int] = None


@dataclass(frozen=True)
class AttemptOutcome:
    """What one attempt of a job ended with (see ``job.attempts``)."""

    result: JobResult
    hosts: Tuple[str, ...] = ()           # the hosts it ran on
    lost: Tuple[str, ...] = ()            # hosts lost during it (left out of the next)


#: Variables that carry the identity of an outer launch (a rank of another
#: mpirun, srun or mslaunch starting this one); ranks must not inherit them.
#: User configuration that Open MPI and Hydra pass through (``OMPI_MCA_*``,
#: ``PMIX_MCA_*``, ``PRTE_MCA_*``, ``PMI_DEBUG`` ...) is kept.
STALE_PREFIXES = ("OMPI_COMM_WORLD_", "OMPI_MCA_orte_", "OMPI_MCA_ess_", "PMIX_SERVER_",
                  "PMIX_DSTORE_", "HYDI_", "MSLAUNCH_GUARD")
STALE_NAMES = frozenset((
    "OMPI_UNIVERSE_SIZE", "OMPI_NUM_APP_CTX", "OMPI_APP_CTX_NUM_PROCS", "OMPI_FIRST_RANKS",
    "OMPI_ARGV", "OMPI_COMMAND", "OMPI_FILE_LOCATION", "OMPI_WORLD_SIZE",
    "OMPI_WORLD_LOCAL_SIZE", "OMPI_MCA_ess", "OMPI_MCA_pmix", "OMPI_MCA_initial_wdir",
    "PMIX_RANK", "PMIX_NAMESPACE", "PMIX_ID", "PMIX_HOSTNAME", "PMIX_VERSION",
    "PMIX_SYSTEM_TMPDIR", "PMIX_GDS_MODULE", "PMIX_SECURITY_MODE", "PMIX_BFROP_BUFFER_TYPE",
    "PRTE_LAUNCHED", "PMI_FD", "PMI_RANK", "PMI_SIZE", "PMI_PORT", "PMI_ID", "PMI_SPAWNED",
    "PMI_HOSTNAME", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", "MPI_APPNUM", "MPI_UNIVERSE_SIZE",
    "MSLAUNCH_RESTART_COUNT", "MSLAUNCH_MAX_RESTARTS"))


def scrub_env(environ: Mapping[str, str]) -> Dict[str, str]:
    """Copy ``environ`` without the identity variables of an outer MPI launch.

    ``FLUX_JOB_ID`` beside a PMIx namespace is an outer launch's hint to Open
    MPI 4 that it was launched directly (mslaunch's own, or Flux's): kept, it
    would make a rank without a PMIx server here fail instead of starting alone."""
    outer_pmix = "PMIX_NAMESPACE" in environ
    return {k: v for k, v in environ.items()
            if not k.startswith(STALE_PREFIXES) and k not in STALE_NAMES
            and not (outer_pmix and k == "FLUX_JOB_ID")}
