"""``mslaunch --help``: both dialects, grouped by topic.

The mpirun dialect's part is made from the option records of :mod:`.options`:
each record's ``help`` is ``"LEFT\\tRIGHT"`` (the spellings, then what they do,
from column 28) or a whole line; a newline in it continues at column 28.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, Tuple

_HEAD = """\
usage: mslaunch [options] program [args...] [: [options] program2 [args...]]
       mslaunch --worker_num=N --local_worker_num=M [msrun options] script [args...]

A drop-in for mpirun (Open MPI 4/5 and MPICH Hydra spellings; one or two dashes)
and for MindSpore's msrun (its --flag=value options; see "msrun dialect" below).
Every option of Open MPI 4.1.4's `mpirun --help all` is implemented, accepted
with a note (-v shows it), or refused with a hint.

"""

#: lines of a section that belong to no option: (before its options, after them)
_PROSE: Dict[str, Tuple[str, str]] = {
    "Size and hosts": ("", "(no hosts: a Slurm or PBS allocation, else this machine, "
                           "which runs what -n asks)"),
    "Other": ("--\tend of options: the next word is the program", ""),
}

_MSRUN = """\
msrun dialect (MindSpore's msrun command lines; --name=value or --name value):
  --worker_num N           workers of the whole job (default 8)
  --local_worker_num N     workers on this node (default 8)
  --master_addr ADDR       the master node (default 127.0.0.1); it runs the scheduler
  --master_port N          the scheduler's port (default 8118)
  --node_rank N            this node's rank: its workers are N*local+i (default -1:
                           ranks in the order nodes join)
  --log_dir DIR            scheduler.log and worker_<rank>.log go here (default .)
  --join True|False        wait for the job (default False: return at once and
                           leave a supervisor, see --wait_job / --stop_job)
  --cluster_time_out S     seconds for every worker to join (default 600; <0: for ever)
  --bind_core True|False|MAP   pin workers to CPUs: equal blocks, or
                           '{"device0":["0-3"],"scheduler":["4"]}'
  --bind_numa True|False|MAP|FILE.json   pin workers to NUMA nodes' CPUs
  --sim_level N, --sim_rank_id N, --rank_table_file FILE
  --worker_log_name NAME   log name pattern ({ip}, {hostname} replaced)
  --tail_worker_log IDS    which workers' output --join=True shows (default all)
 mslaunch's own, in this dialect:
  --node_service_port N    the node service of a multi-node job (default master_port+1)
  --secret_file FILE       the job's secret (default: $MSLAUNCH_SECRET, else
                           ~/.mslaunch/secret, made on first use)
  --tls_config FILE        TLS for the node service (msrun's config.json fields)
  --max_restarts N         restarts per worker with MS_ENABLE_RECOVERY=1 (default 3)
  --grace SECONDS          SIGTERM-to-SIGKILL delay (default 5)
  --wait_job=DIR, --stop_job=DIR   wait for / stop the --join=False job of DIR
  --verbose, --quiet       more / fewer messages
  --report_json FILE       the job's report (JSON) at its end, as --report-json
  --no-pty                 no pseudo-terminal for the processes (the default here,
                           as under msrun; MSLAUNCH_PTY=1 gives them one)
"""

_INDENT = " " * 27


def _entry(text: str) -> str:
    """One option's help lines."""
    left, tab, right = text.partition("\t")
    first, *more = (right if tab else text).split("\n")
    if not tab:
        head = f"  {first}\n"
    elif len(left) < len(_INDENT) - 2:
        head = f"  {left:<24} {first}\n"
    else:
        head = f"  {left}\n{_INDENT}{first}\n"
    return head + "".join(f"{_INDENT}{line}\n" for line in more)


def mpirun_sections() -> str:
    """The ``--help`` of the mpirun dialect: a section per titled group of options."""
    from .options import SECTIONS
    sections = []
    for title, options in SECTIONS:
        if title:
            before, after = _PROSE.get(title, ("", ""))
            entries = [before, *(option.help for option in options), after]
            sections.append(f"{title}:\n" + "".join(_entry(e) for e in entries if e))
    return "\n".join(sections)


TEXT = _HEAD + mpirun_sections() + "\n" + _MSRUN
