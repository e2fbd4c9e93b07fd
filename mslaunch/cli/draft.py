"""The job an mpirun-dialect command line is building, and how each option changes it.

:class:`Draft` holds what the options said so far, in command-line order;
the functions here are the ``apply`` of the option records in
:mod:`.options` (each takes the draft, the flag as spelled and its values).
:mod:`.mpirun` turns the finished draft into a :class:`~mslaunch.core.spec.JobSpec`.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Dict, List, Optional, Sequence, Tuple

    from ..core.spec import HostEntry
    from ..core.states import LauncherName

    Apply = Callable[["Draft", str, Sequence[str]], Optional[List[str]]]

from ..core.errors import UsageError, one_line
from ..core.states import AUTO, LOCAL_ONLY, SLURM, SRUN, SSH
from ..core.switches import parse_number

MAX_RANKS = 100_000          # beyond this a typo, not a job: refuse it
MAX_SECONDS = 100_000_000.0  # about three years
#: Open MPI 4.1.4's runtime (ORTE) frameworks other than the ones whose parameters
#: mpirun's options mirror (orte, rmaps, hwloc, plm, ras): see mca.py.
RUNTIME_FRAMEWORKS = ("errmgr_", "ess_", "filem_", "grpcomm_", "iof_", "odls_", "oob_",
                      "regx_", "rml_", "routed_", "rtc_", "schizo_", "state_", "snapc_",
                      "sstore_", "dfs_")


def check_int(flag: str, text: str, minimum: int = 1, maximum: int = MAX_RANKS) -> int:
    # ASCII digits only: int() would also take spaces, a "+", "_" between digits
    # and the digits of other scripts.
    digits = text[1:] if text[:1] == "-" else text
    if not (digits.isascii() and digits.isdigit()) or len(digits) > 18:
        raise UsageError(f"{flag}: expected a whole number, got {one_line(text, 40)!r}")
    value = int(text)
    if value < minimum:
        raise UsageError(f"{flag}: must be at least {minimum}, got {value}")
    if value > maximum:
        raise UsageError(f"{flag}: at most {maximum}, got {value}")
    return value


def check_seconds(flag: str, text: str, allow_zero: bool = False) -> float:
    try:
        value = parse_number(text)
    except ValueError:
        raise UsageError(f"{flag}: expected a number of seconds, got {text!r}") from None
    if not (0 < value <= MAX_SECONDS or (value == 0 and allow_zero)):
        span = (f"from 0 to {MAX_SECONDS:.0f}" if allow_zero else
                f"above 0, at most {MAX_SECONDS:.0f}")
        raise UsageError(f"{flag}: expected a number of seconds {span}, got {text!r}")
    return value


def job_timeout(flag: str, text: str) -> Optional[float]:
    """A job's time limit: None for 0 or a negative number, which mean none to Open MPI
    (``--timeout 0``) and to Hydra (``MPIEXEC_TIMEOUT=-1``)."""
    try:
        if parse_number(text) <= 0:
            return None
    except ValueError:
        pass
    return check_seconds(flag, text)


def set_timeout(d: Draft, flag: str, values: Sequence[str]) -> None:
    # 0 or below: as if not given, as Open MPI has it (MPIEXEC_TIMEOUT may then set one)
    d.timeout = job_timeout(flag, values[0])
    d.timeout_said = d.timeout is not None


def _env_name(flag: str, name: str) -> str:
    if not name or "=" in name or "\0" in name or name[0].isdigit():
        raise UsageError(f"{flag}: bad environment variable name {name!r}")
    return name


def falsy(value: str) -> bool:
    return value.strip().lower() in ("0", "false", "no", "off", "f", "n")


class Context:
    """One MPMD context as it is read: ``-n 2 -x A=1 prog args``."""

    def __init__(self) -> None:
        self.np: Optional[int] = None
        self.env: List[Tuple[str, Optional[str]]] = []
        self.wdir: Optional[str] = None
        self.argv: List[str] = []


class Draft:
    """What the options of one command line said so far (later ones win)."""

    def __init__(self, environ: Dict[str, str], cwd: str,
                 option_file: Callable[[Draft, str, str, List[str]], List[str]]) -> None:
        self.environ = environ
        self.argv: Sequence[str] = ()      # the whole command line (see optfiles)
        self.cwd = cwd
        self.option_file = option_file     # applies -tune and -am files; their -x words
        self.contexts: List[Context] = [Context()]
        self.mapping: List[Tuple[str, str]] = []      # placement options, in order
        self.notes: List[str] = []
        self.warnings: List[str] = []
        self.host_lists: List[HostEntry] = []
        self.hostfiles: List[str] = []
        self.genv: List[Tuple[str, Optional[str]]] = []
        self.mca: List[Tuple[str, str]] = []
        self.verbose = 0
        self.keep_going = False
        self.max_job_restarts = 0                   # --max-restarts (see job.attempts)
        self.health_check: Optional[str] = None     # --health-check CMD
        self.inherit_env = True
        self.forward_env = False
        self.hydra_words: List[str] = []     # Hydra-only spellings used (see mpirun.py)
        self.launcher: LauncherName = AUTO
        self.launcher_word: Optional[str] = None    # as given (-launcher rsh means rsh)
        self.rsh_exec = ""                          # -launcher-exec, -bootstrap-exec
        self.rsh_exec_args = ""                     # -bootstrap-exec-args
        self.oversubscribe: Optional[bool] = None
        self.output_filename: Optional[str] = None
        self.stdin = "0"
        self.timeout: Optional[float] = None
        self.prefix_pattern = self.stdout_pattern = self.stderr_pattern = ""
        self.print_exit_codes = self.no_hostname = False
        self.timeout_said = False                  # --timeout given, above 0
        self.stall_report: Optional[float] = None   # --stall-report (None: the default)
        self.grace = 5.0
        self.mpi: Optional[str] = None
        self.prefix: Optional[str] = None
        self.ssh_config: Optional[str] = None
        self.ssh_identity: Optional[str] = None
        self.ssh_user: Optional[str] = None
        self.ssh_port: Optional[int] = None
        self.ssh_timeout = 10.0
        self.remote_python: Optional[str] = None
        self.agent_wrapper: Tuple[str, ...] = ()
        self.agent_python: Optional[str] = None   # the launch agent's Python, if it names one
        self.default_hostfile: Optional[str] = None
        self.rankfile: Optional[str] = None
        self.xml_file: Optional[str] = None
        self.app: Optional[str] = None
        self.path: Tuple[str, ...] = ()
        self.preload_files: Tuple[str, ...] = ()
        self.report_pid: Optional[str] = None
        self.report_json: Optional[str] = None
        self.usize: Optional[int] = None
        self.port_range: Optional[Tuple[int, int]] = None   # see hydraenv
        # on/off options (see turn_on)
        self.help = self.version = self.quiet = self.dry_run = self.no_pty = False
        self.use_hwthread_cpus = self.nolocal = self.report_bindings = False
        self.display_map = self.display_allocation = self.display_diffable_map = False
        self.display_topo = self.merge_stderr = self.tag_output = False
        self.timestamp_output = self.xml = self.prepend_rank = self.index_argv = False
        self.report_state = self.stack_traces = self.pmi_port = self.preload_binary = False
        self.session_cwd = self.ssh_accept_new = self.novm = self.stall_exit = False
        # Open MPI's MCA parameters and Hydra's variables (see mca.py)
        self.rsh_agent = ""                        # plm_rsh_agent
        self.rsh_args = ""                         # plm_rsh_args
        self.rsh_concurrent = 128                  # plm_rsh_num_concurrent
        self.default_slots: Optional[int] = None   # orte_set_default_slots N
        self.default_hosts: List[HostEntry] = []   # orte_default_dash_host
        self.perhost: Optional[int] = None         # I_MPI_PERHOST N
        self.hostfile_source: Tuple[str, str] = ("", "")  # (default hostfile, who named it)

    @property
    def ctx(self) -> Context:
        """The MPMD context being read."""
        return self.contexts[-1]


# -- factories of apply functions ---------------------------------------------

def turn_on(attr: str) -> Apply:
    """An option without values that sets ``attr`` of the draft."""
    def apply(d: Draft, flag: str, values: Sequence[str]) -> None:
        setattr(d, attr, True)
    return apply


def store(attr: str, value: object) -> Apply:
    def apply(d: Draft, flag: str, values: Sequence[str]) -> None:
        setattr(d, attr, value)
    return apply


def place(name: str) -> Apply:
    """A placement option: kept in order for :func:`.mapping.mapping_fields`."""
    def apply(d: Draft, flag: str, values: Sequence[str]) -> None:
        d.mapping.append((name, values[0] if values else ""))
    return apply


def pattern(attr: str) -> Apply:
    """A Hydra pattern (``-prepend-pattern``, ``-outfile-pattern``), checked."""
    def apply(d: Draft, flag: str, values: Sequence[str]) -> None:
        from ..plan.patterns import check_pattern
        setattr(d, attr, check_pattern(flag, values[0]))
    return apply


def keep(attr: str) -> Apply:
    """The value as given."""
    def apply(d: Draft, flag: str, values: Sequence[str]) -> None:
        setattr(d, attr, values[0])
    return apply


def some_value(attr: str) -> Apply:
    """A value that must not be empty."""
    def apply(d: Draft, flag: str, values: Sequence[str]) -> None:
        if not values[0] or "\0" in values[0]:
            raise UsageError(f"{flag}: empty value")
        setattr(d, attr, values[0])
    return apply


def set_launch_agent(d: Draft, said: str, value: str) -> None:
    """Open MPI's launch agent, ``[WRAPPER...] PROGRAM [ARGS...]``, as Open MPI
    reads it: the last word naming its daemon (``orted``, ``prted``, by name or
    path) is the program, and the interpreters of ``--remote-python`` or the
    defaults run the agent; without one, the last word is the Python to use.
    The words before the program run the agent (a container's runner, say);
    the daemon's own arguments after it mean nothing to mslaunch's agent
    (``-v`` says so)."""
    import shlex
    try:
        words = shlex.split(value)
    except ValueError as err:
        raise UsageError(f"{said}: cannot read {one_line(value, 60)!r} as words "
                         f"({str(err).lower()})") from None
    if not words or any("\0" in w for w in words):
        raise UsageError(f"{said}: empty value")
    daemon = [i for i, w in enumerate(words) if os.path.basename(w) in ("orted", "prted")]
    at = daemon[-1] if daemon else len(words) - 1
    d.agent_wrapper = tuple(words[:at])
    d.agent_python = None if daemon else words[at]
    if words[at + 1:]:
        rest = one_line(" ".join(words[at + 1:]), 60)
        d.notes.append(f"{said}: the daemon's arguments {rest!r} have no effect on "
                       f"mslaunch's agent")


def launch_agent(d: Draft, flag: str, values: Sequence[str]) -> None:
    set_launch_agent(d, flag, values[0])


def file_name(attr: str, expand_user: bool = False) -> Apply:
    """A file name, made absolute from the launch directory."""
    def apply(d: Draft, flag: str, values: Sequence[str]) -> None:
        if not values[0]:
            raise UsageError(f"{flag}: empty file name")
        name = os.path.expanduser(values[0]) if expand_user else values[0]
        setattr(d, attr, os.path.join(d.cwd, name))
    return apply


def seconds(attr: str, allow_zero: bool = False) -> Apply:
    def apply(d: Draft, flag: str, values: Sequence[str]) -> None:
        setattr(d, attr, check_seconds(flag, values[0], allow_zero=allow_zero))
    return apply


def keep_going(d: Draft, flag: str, values: Sequence[str]) -> None:
    d.keep_going = True


# -- ranks and their environment ----------------------------------------------

def set_np(d: Draft, flag: str, values: Sequence[str]) -> None:
    # -n 0 means one rank per slot, as in Open MPI 4.
    d.ctx.np = check_int(flag, values[0], minimum=0) or None


def export(d: Draft, flag: str, values: Sequence[str]) -> None:
    """``-x NAME[=VALUE]``."""
    name, eq, value = values[0].partition("=")
    d.ctx.env.append((_env_name(flag, name), value if eq else None))


def set_env(d: Draft, flag: str, values: Sequence[str]) -> None:
    d.ctx.env.append((_env_name(flag, values[0]), values[1]))


def env_list(d: Draft, flag: str, values: Sequence[str]) -> None:
    d.ctx.env.extend((_env_name(flag, k), None) for k in values[0].split(",") if k)


def set_genv(d: Draft, flag: str, values: Sequence[str]) -> None:
    d.genv.append((_env_name(flag, values[0]), values[1]))


def genv_list(d: Draft, flag: str, values: Sequence[str]) -> None:
    d.genv.extend((_env_name(flag, k), None) for k in values[0].split(",") if k)


def set_wdir(d: Draft, flag: str, values: Sequence[str]) -> None:
    if not values[0]:
        raise UsageError(f"{flag}: empty directory name")
    d.ctx.wdir = values[0]


def prefixed_env(prefix: str, keep_going_key: str = "") -> Apply:
    """``--prtemca``, ``--pmixmca``: variables for the ranks, with a prefix."""
    def apply(d: Draft, flag: str, values: Sequence[str]) -> None:
        if keep_going_key and values[0] == keep_going_key and falsy(values[1]):
            d.keep_going = True
        d.genv.append((prefix + values[0], values[1]))
    return apply


def runtime_options(d: Draft, flag: str, values: Sequence[str]) -> None:
    for item in values[0].split(","):
        key, _, val = item.partition("=")
        if key.strip() == "error-nonzero-status" and falsy(val or "true"):
            d.keep_going = True


def max_restarts(d: Draft, flag: str, values: Sequence[str]) -> None:
    # Open MPI 4.1.4 takes the option and restarts nothing (a failed rank no
    # longer stops the others); here the whole job starts again, as torchrun's
    # --max-restarts does (see job.attempts).
    d.max_job_restarts = check_int(flag, values[0], minimum=0)


def set_path(d: Draft, flag: str, values: Sequence[str]) -> None:
    d.path = tuple(os.path.join(d.cwd, p) for p in values[0].split(":") if p)
    d.genv.append(("OMPI_exec_path", values[0]))


def set_prefix(d: Draft, flag: str, values: Sequence[str]) -> None:
    d.prefix = os.path.join(d.cwd, values[0])


def preload_files(d: Draft, flag: str, values: Sequence[str]) -> None:
    d.preload_files = tuple(os.path.join(d.cwd, f) for f in values[0].split(",") if f)
    for path in d.preload_files:       # (Open MPI refuses a file it cannot read, too)
        why = ("no such file" if not os.path.exists(path) else "not a file"
               if not os.path.isfile(path) else "" if os.access(path, os.R_OK) else
               "not readable")
        if why:
            raise UsageError(f"{flag} {one_line(path, 200)}: {why}")


def read_options(name: str) -> Apply:
    """``-tune FILE,...`` and ``-am FILE,...``: their words are read as if written here."""
    def apply(d: Draft, flag: str, values: Sequence[str]) -> List[str]:
        paths = [find_param_file(d, f) for f in values[0].split(",") if f]
        return d.option_file(d, name, flag, paths)
    return apply


def find_param_file(d: Draft, name: str) -> str:
    """A ``-tune`` or ``-am`` file as Open MPI finds it: a name with a ``/`` from
    the launch directory; a bare name in the first folder of
    ``mca_base_param_file_path`` that has it (``OMPI_MCA_mca_base_param_file_path``;
    Open MPI's default: its ``amca-param-sets`` folder, then the launch
    directory), else the launch directory's (which the error then names)."""
    if "/" in name:
        return os.path.join(d.cwd, name)
    given = d.environ.get("OMPI_MCA_mca_base_param_file_path")
    if given:
        folders = given.split(":")
    else:
        prefix = d.environ.get("OPAL_PREFIX") or "/usr"
        folders = [os.path.join(prefix, "share", "openmpi", "amca-param-sets"), d.cwd]
    for folder in folders:
        found = os.path.join(d.cwd, folder, name)
        if folder and os.path.isfile(found):
            return found
    return os.path.join(d.cwd, name)


# -- hosts ---------------------------------------------------------------------

def add_hosts(d: Draft, flag: str, values: Sequence[str]) -> None:
    from ..hosts.hostfile import parse_host_list
    d.host_lists.extend(parse_host_list(values[0], flag))


def add_hostfile(d: Draft, flag: str, values: Sequence[str]) -> None:
    d.hostfiles.append(values[0])


def launcher_words(starters_only: bool = False) -> Dict[str, LauncherName]:
    """Every ``--launcher`` word, with Hydra's and Open MPI's spellings, and the
    launcher it names: from the starters' table and (unless ``starters_only``:
    Open MPI's ``plm`` components) the backends'."""
    from ..backends.agents.starters.starter import STARTERS
    words: Dict[str, LauncherName] = {AUTO: AUTO}
    named = [row[1] for row in STARTERS]
    if not starters_only:
        from ..backends.backend import BACKENDS
        named += [row[1] for row in BACKENDS]
    for entry in named:
        if entry is not None:
            name, others = entry
            words.update((w, name) for w in (name, *others))
    return words


def _launcher(word: str, flag: str, component_list: bool) -> LauncherName:
    """``--launcher``, or an MCA ``plm`` value: one name, or (Open MPI) a list to
    choose from, or ``^`` and a list of those to leave out."""
    words = launcher_words(starters_only=component_list)
    names = [w.strip() for w in word.lstrip("^").split(",")] if component_list else [word]
    if not all(w in words for w in names):
        main = [w for w, name in words.items() if w == name and w != AUTO]
        others = sorted(w for w, name in words.items() if w != name)
        raise UsageError(f"{flag} {one_line(word, 30)}: expected {', '.join(main)} or auto "
                         f"(srun's agents inside a Slurm allocation, else ssh; also "
                         f"{', '.join(others)})"
                         + (", or ^ and a list of those to leave out" if component_list
                            else ""))
    chosen = {words[w] for w in names}
    if component_list and word.startswith("^"):
        chosen = {SSH, SLURM} - chosen       # the remote launchers not left out
    if AUTO in chosen or chosen >= {SSH, SLURM}:
        return AUTO
    if len(chosen) == 1:
        return chosen.pop()
    return LOCAL_ONLY if not chosen else sorted(chosen - {LOCAL_ONLY})[0]


def set_launcher(d: Draft, said: str, word: str, component_list: bool = False) -> None:
    d.launcher = _launcher(word, said, component_list)
    if d.launcher in (SLURM, SRUN):
        from ..hosts.allocations import choose_launcher
        try:
            choose_launcher(d.launcher, d.environ)
        except UsageError as err:
            raise UsageError(f"{said} {one_line(word, 30)}: "
                             f"{str(err).split(': ', 1)[-1]}") from None


def launcher(d: Draft, flag: str, values: Sequence[str]) -> None:
    set_launcher(d, flag, values[0])
    d.launcher_word = values[0]


# -- other values ------------------------------------------------------------

def count_verbose(d: Draft, flag: str, values: Sequence[str]) -> None:
    d.verbose += 1


def ssh_port(d: Draft, flag: str, values: Sequence[str]) -> None:
    d.ssh_port = check_int(flag, values[0], maximum=65535)


def personality(d: Draft, flag: str, values: Sequence[str]) -> None:
    if any(p.strip().lower() not in ("ompi", "mpich", "") for p in values[0].split(",")):
        raise UsageError(f"{flag} {values[0]}: only the ompi personality exists here")


def usize(d: Draft, flag: str, values: Sequence[str]) -> None:
    word = values[0].upper()
    d.usize = 0 if word == "SYSTEM" else (None if word == "INFINITE" else
                                          check_int(flag, values[0], minimum=1))


def ompi_server(d: Draft, flag: str, values: Sequence[str]) -> None:
    d.notes.append(f"{flag}: names are published through mslaunch itself")


_DISPLAY = {"map": "display_map", "map-devel": "display_map",
            "alloc": "display_allocation", "allocation": "display_allocation",
            "bind": "report_bindings", "bindings": "report_bindings", "topo": "display_topo"}


def display(d: Draft, flag: str, values: Sequence[str]) -> None:
    """Open MPI 5's ``--display map,alloc,bind,topo``."""
    for word in values[0].lower().split(","):
        attr = _DISPLAY.get(word.strip())
        if attr is None:
            raise UsageError(f"{flag} {values[0]}: unknown item {word[:20]!r} (expected "
                             f"map, alloc, bind or topo)")
        setattr(d, attr, True)


def output(d: Draft, flag: str, values: Sequence[str]) -> None:
    """Open MPI 5's ``--output tag,timestamp,merge-stderr-to-stdout,dir=D,file=D``."""
    for item in values[0].split(","):
        word, _, arg = item.partition("=")
        word = word.strip().lower()
        if word in ("tag", "tag-detailed", "tag-fullname"):
            d.tag_output = True
        elif word == "timestamp":
            d.timestamp_output = True
        elif len(word) >= 5 and "merge-stderr-to-stdout".startswith(word):
            d.merge_stderr = True       # (Open MPI 5 takes any start of it, "merge" on)
        elif word in ("dir", "directory", "file", "filename") and arg:
            d.output_filename = arg
        elif word == "xml":
            d.xml = True
        elif word not in ("raw", ""):
            raise UsageError(f"{flag} {values[0]}: unknown item {word[:20]!r} (expected tag, "
                             f"timestamp, merge-stderr-to-stdout, dir=DIR or xml)")
