"""Pieces shared by the command-line dialects."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Optional, Tuple


class Exit(Exception):
    """Raised by --help and --version: text to print and a status."""

    def __init__(self, text: str, status: int) -> None:
        super().__init__(text)
        self.text = text
        self.status = status


def launch_dir() -> str:
    """The directory mslaunch runs in; one clear error if it was deleted."""
    import os
    try:
        return os.getcwd()
    except FileNotFoundError:
        from ..core.errors import LaunchError
        raise LaunchError("the current directory no longer exists (it was deleted after "
                          "the shell entered it); cd to an existing directory") from None


#: msrun's options (MindSpore's launcher), and mslaunch's additions to that dialect.
MSRUN_OPTIONS = (
    "worker_num", "local_worker_num", "master_addr", "master_port", "node_rank", "log_dir",
    "join", "cluster_time_out", "bind_core", "bind_numa", "sim_level", "sim_rank_id",
    "rank_table_file", "worker_log_name", "tail_worker_log",
)
MSRUN_EXTRAS = ("node_service_port", "secret_file", "tls_config", "max_restarts", "grace",
                "wait_job", "stop_job", "verbose", "quiet", "report_json")

#: torchrun's options (see :mod:`.torchrun`): (name with "_", kind, default); "flag"
#: options take no value.
TORCHRUN_OPTIONS = (
    ("nnodes", "str", "1:1"), ("nproc_per_node", "str", "1"),
    ("rdzv_backend", "str", "static"), ("rdzv_endpoint", "str", ""), ("rdzv_id", "str", "none"),
    ("rdzv_conf", "str", ""), ("standalone", "flag", None), ("max_restarts", "str", "0"),
    ("monitor_interval", "str", "0.1"), ("start_method", "str", "spawn"),
    ("event_log_handler", "str", "null"), ("role", "str", "default"), ("module", "flag", None),
    ("no_python", "flag", None), ("run_path", "flag", None), ("log_dir", "str", None),
    ("redirects", "str", "0"), ("tee", "str", "0"), ("local_ranks_filter", "str", ""),
    ("node_rank", "str", "0"), ("master_addr", "str", "127.0.0.1"), ("master_port", "str", None),
    ("local_addr", "str", None), ("logs_specs", "str", None), ("numa_binding", "str", None),
    ("signals_to_handle", "str", "SIGTERM,SIGINT,SIGHUP,SIGQUIT"),
    ("shutdown_timeout", "str", None), ("virtual_local_rank", "flag", None),
    ("duplicate_stdout_filters", "str", ""), ("duplicate_stderr_filters", "str", ""),
    # torch.distributed.launch's (the same parser, and this flag)
    ("use_env", "flag", None),
    # mslaunch's own, in this dialect too
    ("report_json", "str", None), ("stall_report", "str", None), ("stall_exit", "flag", None),
)


#: The other dialects' long spellings that begin a torchrun option's name: given
#: whole, they are theirs, never a prefix of torchrun's (a test derives them).
NOT_PREFIXES = ("np", "n", "l", "s", "v", "d")


def torchrun_name(word: str) -> Optional[str]:
    """The torchrun option a ``--word`` names, whole or by a unique prefix of its
    name (as torchrun's argparse takes it; '-' and '_' alike), or None."""
    if not word.startswith("--"):
        return None
    body = word[2:].split("=", 1)[0].replace("-", "_")
    names = [name for name, _, _ in TORCHRUN_OPTIONS]
    if body in names:
        return body
    if not body or body in NOT_PREFIXES:
        return None
    found = [name for name in names if name.startswith(body)]
    return found[0] if len(found) == 1 else None


def is_torchrun_like(argv) -> bool:
    """Whether a line may be torchrun's (:func:`.torchrun.is_torchrun` decides): an
    option of torchrun's among its first words, or none and a ``PET_`` variable set."""
    import os
    if argv and not argv[0].startswith("-"):
        return any(k.startswith("PET_") for k in os.environ)
    for word in argv:
        if not word.startswith("-"):
            return False
        if torchrun_short(word) or torchrun_name(word) is not None:
            return True
    return False


def torchrun_short(word: str) -> bool:
    """``-m``, ``-r N``, ``-rN``, ``-t N``, ``-tN`` (not ``-mca`` nor ``-rf``)."""
    return word in ("-m", "-r", "-t") or (word[:2] in ("-r", "-t") and word[2:3].isdigit())


#: DeepSpeed 0.19's launcher options: name -> takes a value.
DEEPSPEED_OPTIONS = {
    "hostfile": True, "include": True, "exclude": True, "num_nodes": True, "num_gpus": True,
    "num_accelerators": True, "master_port": True, "master_addr": True, "node_rank": True,
    "launcher": True, "launcher_args": True, "module": False, "no_python": False,
    "no_local_rank": False, "no_ssh": False, "no_ssh_check": False, "force_multi": False,
    "save_pid": False, "enable_each_rank_log": True, "autotuning": True,
    "bind_cores_to_rank": False, "bind_core_list": True, "ssh_port": True,
    "venv_script": True, "log_level": True, "quiet": False,
}

#: DeepSpeed's launcher's options that no other dialect has: one before the
#: script makes a line DeepSpeed's (see :mod:`.deepspeed`).
DEEPSPEED_ONLY = ("include", "exclude", "num_nodes", "num_gpus", "num_accelerators",
                  "no_local_rank", "no_ssh", "no_ssh_check", "force_multi", "launcher_args",
                  "save_pid", "enable_each_rank_log", "autotuning", "bind_cores_to_rank",
                  "bind_core_list", "ssh_port", "venv_script", "log_level")
#: ``--launcher`` values: DeepSpeed's ways to start nodes, which mslaunch replaces
#: (``slurm`` is Hydra's too, and so mpirun's dialect's: it marks no line).
DEEPSPEED_LAUNCHERS = ("pdsh", "openmpi", "mvapich", "mpich", "impi", "slurm")


#: DeepSpeed's launcher's options that take a value (the next word, without '=').
DEEPSPEED_VALUED = tuple(name for name, takes in DEEPSPEED_OPTIONS.items() if takes) + \
    ("-H", "-i", "-e")


def deepspeed_name(body: str) -> str:
    """The DeepSpeed option a ``--body`` names: itself, or the one it is a unique
    start of (as DeepSpeed's argparse takes it), unless it is a start of an
    option of msrun's or torchrun's too (``--log``, ``--master_p``); else ``body``."""
    if body in DEEPSPEED_OPTIONS or len(body) < 2:
        return body
    found = [name for name in DEEPSPEED_OPTIONS if name.startswith(body)]
    if len(found) != 1 or any(name.startswith(body) for name in MSRUN_OPTIONS + MSRUN_EXTRAS) \
            or any(name.startswith(body) for name, _, _ in TORCHRUN_OPTIONS):
        return body
    return found[0]


def is_deepspeed(argv) -> bool:
    """Whether a line's options, before its script, name one only DeepSpeed's
    launcher has, whole or by a unique start (``--launcher`` with one of its
    values counts)."""
    at = 0
    while at < len(argv) and argv[at].startswith("-"):
        word = argv[at]
        name, eq, value = (word[2:] if word.startswith("--") else word).partition("=")
        if word.startswith("--"):
            name = deepspeed_name(name)
        takes = not eq and name in DEEPSPEED_VALUED
        if takes:
            value = argv[at + 1] if at + 1 < len(argv) else ""
        if name in DEEPSPEED_ONLY + ("-i", "-e") or (name == "launcher" and value.lower() in
                                                      DEEPSPEED_LAUNCHERS[:-1]):
            return True
        at += 2 if takes else 1
    return False


def msrun_names(body: str) -> Tuple[str, ...]:
    """The msrun options (or mslaunch's in that dialect) a ``--body`` may name, as
    msrun's argparse reads it: the name itself, else every name it begins
    (one: that option; more: ambiguous).  Written with '_' only, as msrun
    spells them; a single letter (``--n``, mpirun's) begins none."""
    every = MSRUN_OPTIONS + MSRUN_EXTRAS + ("help",)
    if body in every:
        return (body,)
    if len(body) < 2 or "-" in body:
        return ()
    return tuple(name for name in every if name.startswith(body))


def is_msrun(argv) -> bool:
    """Whether a command line is in msrun's dialect (its options come first)."""
    for word in argv:
        if not word.startswith("--"):
            return False
        found = msrun_names(word[2:].split("=", 1)[0])
        if len(found) == 1 and (found[0] in MSRUN_OPTIONS or found[0] in ("wait_job",
                                                                          "stop_job")):
            return True
    return False
