"""The error line for an option mslaunch does not know: torchrun's spelling of it,
or the option meant ("did you mean --hostfile?").

torchrun's options are written with ``_`` or ``-`` (``--nproc_per_node``,
``--nproc-per-node``); each gets the mslaunch spelling in the dialect the
command line is in: the mpirun dialect starts every host's ranks from one
command (``-n``, ``-N``, ``-H``), the msrun dialect has torchrun's nodes
(``--local_worker_num``, ``--node_rank``, ``--master_addr``).  Imported only
for an unknown option.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, Iterable, Optional

from ..core.errors import one_line

_NODES = "-H h1,h2 or --hostfile FILE (one mslaunch command starts every host's ranks)"
_ONE_COMMAND = "nothing: one mslaunch command starts the ranks of every host"
_RENDEZVOUS = ("nothing: there is no rendezvous, mslaunch starts every rank itself and sets "
               "MASTER_ADDR and MASTER_PORT for them (export MASTER_PORT=N to choose the port)")

#: torchrun's options (``_`` spelling) -> the mpirun dialect's way; ``N`` is the value.
TORCHRUN: Dict[str, str] = {
    "nproc_per_node": "-n {n} (ranks of the whole job) or -N {n} (ranks per host, with -H or "
                      "--hostfile)",
    "nnodes": _NODES,
    "node_rank": _ONE_COMMAND + " (RANK, LOCAL_RANK and GROUP_RANK, the host's number, "
                                "are set for each rank)",
    "master_addr": "nothing: MASTER_ADDR is set for the ranks (the first host); export "
                   "MASTER_ADDR=HOST to choose it",
    "master_port": "nothing: MASTER_PORT is set for the ranks (a free port); export "
                   "MASTER_PORT=N to choose it",
    "rdzv_backend": _RENDEZVOUS, "rdzv_endpoint": _RENDEZVOUS, "rdzv_id": _RENDEZVOUS,
    "rdzv_conf": _RENDEZVOUS,
    "standalone": "nothing: without -H or --hostfile the job runs on this machine",
    "no_python": "nothing: the program runs as given (mslaunch -n 2 ./prog); a .py file "
                 "that is not executable runs with python",
    "module": "mslaunch -n 2 python -m MODULE", "m": "mslaunch -n 2 python -m MODULE",
    "run_path": "nothing: the program runs as given",
    "log_dir": "--output-filename {dir} (each rank's stdout and stderr in {dir}/1/rank.R/)",
    "redirects": "--output-filename DIR (files), --merge-stderr-to-stdout",
    "tee": "--output-filename DIR (files and the terminal)",
    "local_ranks_filter": "--output-filename DIR:nocopy (files only) or --stdin RANK",
    "monitor_interval": "nothing: a rank's end is seen at once",
    "start_method": "nothing: every rank is a process of its own",
    "role": "nothing: every rank runs the program given (MPMD: -n 1 a : -n 3 b)",
    "local_addr": "nothing: the hosts are named with -H or --hostfile",
}

#: The same in the msrun dialect, which has torchrun's nodes.
TORCHRUN_MSRUN: Dict[str, str] = {
    "nproc_per_node": "--local_worker_num={n} (and --worker_num: the workers of all nodes)",
    "nnodes": "--worker_num=(nodes x --local_worker_num), one mslaunch command per node",
    "node_rank": "--node_rank={n}",
    "rdzv_endpoint": "--master_addr=HOST --master_port=PORT",
    "rdzv_backend": "nothing: the master node (--master_addr) is the rendezvous",
    "rdzv_id": "nothing: the master node (--master_addr) is the rendezvous",
    "rdzv_conf": "--cluster_time_out=SECONDS for the join timeout",
    "standalone": "--master_addr=127.0.0.1 (the default)",
    "max_restarts": "--max_restarts={n} with MS_ENABLE_RECOVERY=1",
    "log_dir": "--log_dir={dir}",
    "redirects": "nothing: workers write worker_<rank>.log in --log_dir",
    "tee": "--join=True (the workers' logs are shown: --tail_worker_log)",
}


def _torchrun(body: str, value: Optional[str], table: Dict[str, str]) -> Optional[str]:
    name = body.lstrip("-").replace("-", "_")
    if name.startswith("rdzv_") and name not in table:
        name = "rdzv_backend"
    what = table.get(name)
    if what is None:
        return None
    given = one_line(value, 60) if value else None
    number = given if given is not None and given.isascii() and given.isdigit() else "N"
    what = what.replace("{n}", number).replace("{dir}", given or "DIR")
    return f"that is torchrun's; in mslaunch: {what}"


def closest(body: str, names: Iterable[str]) -> Optional[str]:
    """The known option nearest to a misspelled one (three letters or more, or a
    one-letter option's letter typed twice: ``-nn``), if any."""
    if len(body) == 2 and body[0] == body[1]:
        return body[0] if body[0] in names else None
    if len(body) < 3:
        return None
    import difflib
    candidates = [n for n in names if len(n) >= 3]
    found = difflib.get_close_matches(body.lower(), candidates, n=1, cutoff=0.75)
    return found[0] if found else None


def unknown_option(token: str, body: str, value: Optional[str], names: Iterable[str],
                   msrun: bool = False) -> str:
    """The error line for ``token``, an option nobody knows (``body``: without dashes)."""
    shown = repr(one_line(token, 60))
    hint = _torchrun(body, value, TORCHRUN_MSRUN if msrun else TORCHRUN)
    if hint is None and msrun:
        hint = _torchrun(body, value, TORCHRUN)
    if hint is not None:
        return f"unknown option {shown}: {hint}"
    names = list(names)
    near = closest(body, names)
    if near is not None:
        dashes = "--" if msrun or len(near) > 1 else "-"
        return f"unknown option {shown} (did you mean {dashes}{near}? see mslaunch --help)"
    if not msrun:
        # msrun's options, written with '-' or misspelled, leave its dialect unseen
        from .common import MSRUN_EXTRAS, MSRUN_OPTIONS
        near = closest(body.replace("-", "_"), MSRUN_OPTIONS + MSRUN_EXTRAS)
        if near is not None:
            return (f"unknown option {shown} (did you mean msrun's --{near}? "
                    f"see mslaunch --help msrun)")
    return f"unknown option {shown} (see mslaunch --help)"
