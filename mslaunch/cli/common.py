"""Pieces shared by the command-line dialects."""

from __future__ import annotations


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


def is_msrun(argv) -> bool:
    """Whether a command line is in msrun's dialect (its options come first)."""
    for word in argv:
        if not word.startswith("--"):
            return False
        name = word[2:].split("=", 1)[0]
        if name in MSRUN_OPTIONS or name in ("wait_job", "stop_job"):
            return True
    return False
