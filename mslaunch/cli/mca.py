"""The MCA parameters that Open MPI 4.1.4's mpirun itself reads (``orte_*``, ``rmaps_*``, ...

Each parameter that Open MPI's ``mpirun`` reads has a record here: what it does
to the job being built (most are an option of :mod:`.options` under another
name), or why it has no effect (``-v`` prints the note), or why it is refused.
The ranks' own parameters (``btl_*``, ``pml_*``, ...) are not mpirun's: they
reach the ranks as ``OMPI_MCA_*`` variables, as under Open MPI.

Sources, weakest first (as Open MPI 4.1.4 ranks them): the installation-wide
``openmpi-mca-params.conf`` and ``$HOME/.openmpi/mca-params.conf`` (or the
files ``mca_base_param_files`` names instead), ``-tune``/``-am`` files,
``OMPI_MCA_*`` variables, then ``--mca``, where the options that mean the same
thing are read in order with them.  The parameters of Open MPI's other runtime
frameworks (:data:`RUNTIME`: ``oob_*``, ``odls_*``, ...) are noted as having no
effect.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Dict, List, Optional, Sequence, Tuple

    from .draft import Draft

    Handler = Callable[[Draft, str, str], None]

from ..core.errors import UsageError, one_line
from ..mpi.mcafile import (
    ENV_PREFIX,
    boolean,
    command_line_params,
    environment_params,
    param_file_list,
    parse_param_file,
)
from . import draft as D

#: The installation-wide file of Debian's Open MPI (``$sysconfdir/openmpi-mca-params.conf``).
SYSTEM_FILE = "/etc/openmpi/openmpi-mca-params.conf"
USER_FILE = ".openmpi/mca-params.conf"


def _flag(said: str, value: str) -> bool:
    b = boolean(value)
    if b is None:
        raise UsageError(f"{said}: expected a boolean (1, 0, true, false, yes, no), "
                         f"got {one_line(value, 40)!r}")
    return b


def on(attr: str) -> Handler:
    """A boolean parameter that is an on/off attribute of the draft."""
    def apply(d: Draft, said: str, value: str) -> None:
        setattr(d, attr, _flag(said, value))
    return apply


def on_place(name: str) -> Handler:
    """A boolean parameter that, when true, is a placement option without value."""
    def apply(d: Draft, said: str, value: str) -> None:
        if _flag(said, value):
            d.mapping.append((name, ""))
    return apply


def valued(apply_option: D.Apply, none: Tuple[str, ...] = ("",)) -> Handler:
    """A parameter that is an option with one value; values in ``none`` mean "not set"."""
    def apply(d: Draft, said: str, value: str) -> None:
        if value.strip() not in none:
            apply_option(d, said, [value.strip()])
    return apply


def placed(name: str) -> Handler:
    """A placement option with one value, checked here so that an error names the source."""
    def apply(d: Draft, said: str, value: str) -> None:
        if not value.strip():
            return
        from .mapping import mapping_fields
        try:
            mapping_fields([(name, value.strip())])
        except UsageError as err:
            raise UsageError(f"{said}: {err}") from None
        d.mapping.append((name, value.strip()))
    return apply


def _keep_going_unless(d: Draft, said: str, value: str) -> None:
    if not _flag(said, value):
        d.keep_going = True


def _recovery(d: Draft, said: str, value: str) -> None:
    if _flag(said, value):
        d.keep_going = True


def _max_restarts(d: Draft, said: str, value: str) -> None:
    if D.check_int(said, value.strip(), minimum=-1) > 0:
        D.max_restarts(d, said, [value.strip()])


def _oversubscribe(allow: bool) -> Handler:
    def apply(d: Draft, said: str, value: str) -> None:
        if _flag(said, value):
            d.oversubscribe = allow
    return apply


def _per(name: str) -> Handler:
    def apply(d: Draft, said: str, value: str) -> None:
        if D.check_int(said, value.strip(), minimum=-1) > 0:
            d.mapping.append((name, value.strip()))
    return apply


def _cpus_per_proc(d: Draft, said: str, value: str) -> None:
    if D.check_int(said, value.strip(), minimum=-1) > 1:
        d.mapping.append(("cpus-per-proc", value.strip()))


def _default_hostfile(d: Draft, said: str, value: str) -> None:
    if value.strip() not in ("", "none"):
        D.file_name("default_hostfile")(d, said, [value.strip()])
        d.hostfile_source = (d.default_hostfile or "", said)


def _default_slots(d: Draft, said: str, value: str) -> None:
    word = value.strip().lower()
    if word in ("", "none", "core", "cores"):
        d.default_slots = None          # mslaunch's default: the host's cores
    elif word in ("hwthread", "hwthreads"):
        d.use_hwthread_cpus = True
    else:
        d.default_slots = D.check_int(said, word, minimum=1)


def _launcher(d: Draft, said: str, value: str) -> None:
    if value.strip():
        D.set_launcher(d, said, value.strip(), component_list=True)


def _rsh_agent(d: Draft, said: str, value: str) -> None:
    d.rsh_agent = value.strip()


def _rsh_args(d: Draft, said: str, value: str) -> None:
    d.rsh_args = value.strip()


def _rsh_concurrent(d: Draft, said: str, value: str) -> None:
    d.rsh_concurrent = D.check_int(said, value.strip(), minimum=1)


def _launch_agent(d: Draft, said: str, value: str) -> None:
    if value.strip():
        D.set_launch_agent(d, said, value)


def _default_dash_host(d: Draft, said: str, value: str) -> None:
    if value.strip():
        from ..hosts.hostfile import parse_host_list
        d.default_hosts = parse_host_list(value.strip(), said)


def _refuse_if_set(instead: str, harmless: Tuple[str, ...] = ("", "0", "false")) -> Handler:
    """Refused unless the value is one that asks for nothing (the default)."""
    def apply(d: Draft, said: str, value: str) -> None:
        if value.strip().lower() not in harmless:
            raise UsageError(f"{said}: not supported by mslaunch: {instead}")
    return apply


#: name -> (disposition, handler or None, note)
PARAMS: Dict[str, Tuple[str, Optional[Handler], str]] = {}


def _add(kind: str, handler: Optional[Handler], note: str, *names: str) -> None:
    for name in names:
        PARAMS[name] = (kind, handler, note)


def _impl(handler: Handler, *names: str, note: str = "") -> None:
    _add("implemented", handler, note, *names)


def _acc(note: str, *names: str) -> None:
    _add("accepted", None, note, *names)


# -- implemented: as the option of the same meaning ---------------------------
_impl(_default_hostfile, "orte_default_hostfile",
      note="as `--default-hostfile`; `-H`, `--hostfile` win over it")
_impl(_default_dash_host, "orte_default_dash_host", note="hosts used when no other list is given")
_impl(_default_slots, "orte_set_default_slots",
      note="slots of a hostfile host without `slots=`: a number, `cores` (default) or `hwthreads`")
#: Parameters that are an option of the same meaning: (handler, option, names...)
_AS_OPTION: Tuple[Tuple[object, ...], ...] = (
    (on("tag_output"), "--tag-output", "orte_tag_output"),
    (on("timestamp_output"), "--timestamp-output", "orte_timestamp_output"),
    (on("xml"), "--xml", "orte_xml_output"),
    (valued(D.file_name("xml_file")), "--xml-file", "orte_xml_file"),
    (on("quiet"), "--quiet", "orte_execute_quiet"),
    (on("dry_run"), "--do-not-launch", "orte_do_not_launch"),
    (on("novm"), "--novm", "orte_no_vm"),
    (on("display_allocation"), "--display-allocation",
     "orte_display_alloc", "orte_display_devel_alloc", "ras_base_display_alloc",
     "ras_base_display_devel_alloc"),
    (_recovery, "--enable-recovery", "orte_enable_recovery"),
    (_max_restarts, "--max-restarts", "orte_max_restarts"),
    (valued(D.file_name("rankfile")), "--rankfile", "orte_rankfile", "rmaps_rank_file_path"),
    (_oversubscribe(False), "--nooversubscribe", "rmaps_base_no_oversubscribe"),
    (placed("map-by"), "--map-by",
     "rmaps_base_mapping_policy", "rmaps_base_schedule_policy"),
    (placed("rank-by"), "--rank-by", "rmaps_base_ranking_policy"),
    (on_place("pernode"), "--pernode", "rmaps_base_pernode", "rmaps_ppr_pernode"),
    (_per("npernode"), "-npernode", "rmaps_base_n_pernode", "rmaps_ppr_n_pernode"),
    (_per("npersocket"), "-npersocket", "rmaps_base_n_persocket", "rmaps_ppr_n_persocket"),
    (placed("ppr"), "--ppr", "rmaps_base_pattern", "rmaps_ppr_pattern"),
    (on_place("bycore"), "-bycore", "rmaps_base_bycore"),
    (on_place("byslot"), "-byslot", "rmaps_base_byslot"),
    (on_place("bynode"), "-bynode", "rmaps_base_bynode"),
    (_cpus_per_proc, "--cpus-per-proc", "rmaps_base_cpus_per_proc", "rmaps_base_cpus_per_rank"),
    (on("nolocal"), "-nolocal", "rmaps_base_no_schedule_local"),
    (on("display_map"), "--display-map", "rmaps_base_display_map", "rmaps_base_display_devel_map"),
    (on("display_topo"), "--display-topo", "rmaps_base_display_topo_with_map"),
    (on("display_diffable_map"), "--display-diffable-map", "rmaps_base_display_diffable_map"),
    (placed("bind-to"), "--bind-to", "hwloc_base_binding_policy"),
    (on_place("bind-to-core"), "--bind-to-core", "hwloc_base_bind_to_core"),
    (on_place("bind-to-socket"), "--bind-to-socket", "hwloc_base_bind_to_socket"),
    (on("report_bindings"), "--report-bindings", "hwloc_base_report_bindings"),
    (placed("cpu-list"), "--cpu-list", "hwloc_base_cpu_list", "hwloc_base_slot_list"),
    (placed("cpu-set"), "--cpu-set", "hwloc_base_cpu_set"),
    (on("use_hwthread_cpus"), "--use-hwthread-cpus", "hwloc_base_use_hwthreads_as_cpus"),
    (on("merge_stderr"), "--merge-stderr-to-stdout", "iof_base_redirect_app_stderr_to_stdout"),
)
for _handler, _option, *_names in _AS_OPTION:
    _impl(_handler, *_names, note=f"as `{_option}`")  # type: ignore[arg-type]
_impl(_keep_going_unless, "orte_abort_on_non_zero_status",
      note="false: keep going, as `-disable-auto-cleanup`")
_impl(_launch_agent, "orte_launch_agent", note="as `--launch-agent`; `orted` (the default) "
      "changes nothing, `WRAPPER... orted` runs the agent through WRAPPER")
_impl(_rsh_agent, "plm_rsh_agent", "orte_rsh_agent",
      note="the command that starts the agents (`ssh : rsh`: the first found)")
_impl(_rsh_args, "plm_rsh_args", note="arguments of that command")
_impl(_rsh_concurrent, "plm_rsh_num_concurrent",
      note="how many hosts that command starts at once, until their agents answer (128)")
_impl(_launcher, "plm", note="as `--launcher`: `rsh`/`ssh` is SSH, `slurm` srun, `isolated` "
      "this machine; a list or `^` and those left out")
_impl(_oversubscribe(True), "rmaps_base_oversubscribe",
      note="as `--oversubscribe` (it ignores `max_slots`)")
_impl(valued(D.seconds("grace", allow_zero=True)), "odls_base_sigkill_timeout",
      note="as `--grace`: seconds from SIGTERM to SIGKILL")

# -- refused when set: no such mechanism here ------------------------------------
for _name, _instead in (
        ("orte_fork_agent", "put the command before the program instead"),
        ("orte_xterm", "use --output-filename DIR or --tag-output"),
        ("orte_report_events", "use -v for each rank's start and end"),
        ("ras_base_multiplier", "give the slots in the hostfile or -H"),
        ("hwloc_base_topo_file", "topologies are read from each host"),
        ("rmaps_base_topology", "topologies are read from each host"),
        ("orte_server", "names are published through mslaunch's PMI server; do not set it")):
    PARAMS[_name] = ("refused", _refuse_if_set(
        _instead, ("", "1") if _name == "ras_base_multiplier" else ("", "0", "false")), _instead)

# -- accepted, no effect ----------------------------------------------------------
_acc("mslaunch keeps host names as given (it never shortens them)",
     "orte_keep_fqdn_hostnames", "orte_retain_aliases", "orte_hostname_cutoff",
     "orte_hostname_alias_index", "orte_show_resolved_nodenames", "orte_node_regex")
_acc("agents are started by the launcher itself (no tree): over SSH 64 hosts at a time, "
     "with an rsh agent `plm_rsh_num_concurrent`", "plm_rsh_no_tree_spawn", "plm_rsh_delay")
_acc("there are no session directories but --set-cwd-to-session-dir's",
     "orte_tmpdir_base", "orte_local_tmpdir_base", "orte_remote_tmpdir_base",
     "orte_top_session_dir", "orte_jobfam_session_dir", "orte_no_session_dirs",
     "orte_create_session_dirs")
_acc("use -v", "orte_debug", "orte_debug_verbose", "orte_debug_daemons",
     "orte_debug_daemons_file", "orte_progress_thread_debug", "orte_report_silent_errors",
     "orte_report_launch_progress", "orte_base_help_aggregate")
_acc("there is no debugger interface", "orte_output_debugger_proctable", "orte_base_user_debugger",
     "orte_debugger_test_daemon", "orte_debugger_test_attach", "orte_debugger_check_rate")
_acc("there are no daemons", "orte_daemon_spin", "orte_daemon_fail", "orte_daemon_fail_delay",
     "orte_leave_session_attached", "orte_fwd_mpirun_port", "orte_daemon_cores",
     "orte_startup_timeout", "orte_enable_instant_on_support", "orte_coll_transports",
     "orte_mgmt_transports", "orte_stat_history_size")
_acc("the remote command runs through the login shell the host gives",
     "orte_assume_same_shell", "plm_rsh_assume_same_shell", "plm_rsh_force_rsh",
     "plm_rsh_pass_environ_mca_params", "plm_rsh_pass_libpath", "plm_rsh_chdir")
_acc("inside Grid Engine the agents start with `qrsh -inherit` (`plm_rsh_agent` or "
     "`--launcher ssh` chooses another way); LoadLeveler's starter is not used",
     "plm_rsh_disable_qrsh", "plm_rsh_daemonize_qrsh", "plm_rsh_disable_llspawn",
     "plm_rsh_daemonize_llspawn", "ras_gridengine_show_jobid")
_acc("srun is started with mslaunch's own arguments", "plm_slurm_args", "plm_slurm_warning",
     "ras_slurm_dyn_allocate_timeout", "ras_slurm_enable_dyn_alloc", "ras_slurm_config_file",
     "ras_slurm_enable_rolling_alloc", "ras_slurm_use_entire_allocation")
_acc("there is no simulated allocation", "ras_simulator_slots", "ras_simulator_max_slots",
     "ras_simulator_num_nodes", "ras_simulator_topo_files", "ras_simulator_topologies",
     "ras_simulator_have_cpubind", "ras_simulator_have_membind")
_acc("stdout and stderr keep their own streams", "orte_map_stddiag_to_stderr",
     "orte_map_stddiag_to_stdout")
_acc("the exit status is always the job's", "orte_report_child_jobs_separately")
_acc("a rank that ends without MPI_Finalize is judged as described under Failures",
     "orte_allowed_exit_without_sync")
_acc("there is no persistent virtual machine", "orte_max_vm_size", "orte_soft_locations")
_acc("--timeout with --get-stack-traces waits for the stacks", "orte_timeout_for_stack_trace")
_acc("without hosts mslaunch uses this machine", "orte_allocation_required",
     "ras_base_launch_orted_on_hn")
_acc("memory binding is left to the ranks", "hwloc_base_mem_alloc_policy",
     "hwloc_base_mem_bind_failure_action")
_acc("mslaunch has one mapper; placement follows the options above", "rmaps", "ras", "hwloc",
     "rmaps_base_inherit", "rmaps_dist_device", "rmaps_rank_file_physical",
     "rmaps_resilient_fault_grp_file")

#: Name endings that are accepted in every family: component verbosity and priority.
SUFFIXES = (("_verbose", "use -v"), ("_priority", "mslaunch has one component for this"))
FAMILIES = ("orte_", "rmaps_", "hwloc_", "plm_", "ras_")
#: Open MPI 4.1.4's other runtime (ORTE) frameworks, which its mpirun and daemons
#: read: their parameters have no effect here (mslaunch's own runtime does their work).
RUNTIME = D.RUNTIME_FRAMEWORKS
RUNTIME_NOTE = ("a parameter of Open MPI's own runtime, whose work mslaunch's does its own "
                "way")


def lookup(name: str) -> Optional[Tuple[str, Optional[Handler], str]]:
    """The record of one of mpirun's parameters; None for the ranks' parameters.

    A name of mpirun's families that Open MPI 4.1.4 does not have is accepted
    with a note (it goes to the ranks, as there).
    """
    record = PARAMS.get(name)
    if record is not None:
        return record
    if name.startswith(RUNTIME):
        return ("accepted", None, RUNTIME_NOTE)
    if not name.startswith(FAMILIES):
        return None
    for suffix, note in SUFFIXES:
        if name.endswith(suffix):
            return ("accepted", None, note)
    return ("unknown", None, "not a parameter of Open MPI 4.1.4's mpirun")


def apply_param(d: Draft, name: str, value: str, said: str) -> None:
    """Apply one setting of one of mpirun's parameters; ``said`` names it and its source."""
    record = lookup(name)
    if record is None:
        return
    kind, handler, note = record
    if handler is not None:
        handler(d, said, value)
    elif kind == "accepted":
        d.notes.append(f"{said} has no effect here: {note}")
    else:
        d.notes.append(f"{said}: {note}; it is only passed to the ranks")


# -- the sources below the command line -------------------------------------------

def _read(path: str) -> Optional[str]:
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as f:
            return f.read(1 << 24)
    except FileNotFoundError:
        return None
    except OSError as err:
        raise UsageError(f"MCA parameter file {path}: {err.strerror}") from None


def _file_settings(path: str) -> List[Tuple[str, str, Optional[str], str]]:
    text = _read(path)
    if text is None:
        return []
    return [(s.kind, s.name, s.value, f"{path}:{s.line}: {s.name}")
            for s in parse_param_file(text, path)]


def settings_below_command_line(environ: Dict[str, str], argv: Sequence[str],
                                sysconf: str = SYSTEM_FILE
                                ) -> Tuple[List[Tuple[str, str, str]],
                                           List[Tuple[str, Optional[str]]]]:
    """The parameters of mpirun's families set in files and variables and not on
    the command line, as ``(name, value, source)``, weakest source first; and
    the variables the files export (``-x NAME[=VALUE]`` lines)."""
    given = command_line_params(argv)
    files_value = given.get("mca_base_param_files",
                            environ.get(ENV_PREFIX + "mca_base_param_files"))
    if files_value is not None:
        paths = list(param_file_list(files_value))
    else:
        home = environ.get("HOME")
        paths = [sysconf] + ([os.path.join(home, USER_FILE)] if home else [])
    found: Dict[str, Tuple[str, str]] = {}
    exports: List[Tuple[str, Optional[str]]] = []
    for path in paths:
        for kind, name, value, said in _file_settings(path):
            if kind == "x":
                exports.append((name, value))
            else:
                found[name] = (value or "", said)
    for name, value in environment_params(environ):
        if value.strip():
            found[name] = (value, f"{ENV_PREFIX}{name} (environment)")
        else:                      # empty: the default, over what the files say (Open MPI)
            found.pop(name, None)
    params = [(name, value, said) for name, (value, said) in found.items()
              if name not in given and lookup(name) is not None]
    return params, exports


def apply_defaults(d: Draft, argv: Sequence[str]) -> None:
    """Apply the parameters set below the command line to a fresh draft; the
    files' ``-x`` variables go to every rank, as Open MPI exports them."""
    params, exports = settings_below_command_line(d.environ, argv)
    for name, value, said in params:
        apply_param(d, name, value, said)
    d.genv.extend(exports)


def markdown_table() -> str:
    """The MCA reference's table (docs/reference/mca.md) of Open MPI 4.1.4's mpirun parameters
    and what mslaunch does."""
    rows = ["| MCA parameter | in mslaunch |", "|---|---|"]
    groups: Dict[Tuple[str, str], List[str]] = {}
    for name, (kind, _, note) in PARAMS.items():
        groups.setdefault((kind, note), []).append(name)
    words = {"implemented": "implemented", "accepted": "accepted, no effect",
             "refused": "refused when set"}
    for (kind, note), names in sorted(groups.items(), key=lambda g: (
            list(words).index(g[0][0]), sorted(g[1])[0])):
        spelled = ", ".join(f"`{n}`" for n in sorted(names))
        rows.append(f"| {spelled} | {words[kind]}{': ' + note if note else ''} |")
    for suffix, note in SUFFIXES:
        rows.append(f"| any other `*{suffix}` of these families | accepted, no effect: {note} |")
    spelled = ", ".join(f"`{p}*`" for p in RUNTIME)
    rows.append(f"| any parameter of Open MPI's other runtime frameworks: {spelled} | "
                f"accepted, no effect: {RUNTIME_NOTE} |")
    return "\n".join(rows) + "\n"


def set_mca(d: Draft, flag: str, values: Sequence[str]) -> None:
    """``--mca NAME VALUE`` (also from ``-tune`` and ``-am`` files): mpirun's own
    parameters take effect; every one is also passed to the ranks, as by Open MPI."""
    name, value = values
    apply_param(d, name, value, f"{flag} {name}")
    d.mca.append((name, value))
