"""The options of the mpirun dialect: every one of Open MPI 4.1.4's, and Hydra's.

Each option has a canonical name, the number of values it takes, and a
disposition: implemented (handled by :mod:`.mpirun`), accepted (it has no
meaning here; noted with ``-v``), or refused (one error line saying what to
use instead) -- never "unknown option" for a real mpirun flag.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, Tuple

#: canonical name -> number of values, for the options mslaunch implements
IMPLEMENTED: Dict[str, int] = {
    "np": 1, "x": 1, "env": 2, "envlist": 1, "wdir": 1, "host": 1, "hostfile": 1,
    "default-hostfile": 1, "genv": 2, "genvlist": 1, "genvall": 0, "genvnone": 0,
    "envall": 0, "envnone": 0, "mca": 2, "prtemca": 2, "pmixmca": 2, "runtime-options": 1,
    "map-by": 1, "rank-by": 1, "bind-to": 1, "npernode": 1, "pernode": 0, "npersocket": 1,
    "ppr": 1, "cpus-per-proc": 1, "use-hwthread-cpus": 0, "cpu-set": 1, "cpu-list": 1,
    "nolocal": 0, "rankfile": 1, "bynode": 0, "byslot": 0, "bycore": 0, "bind-to-core": 0,
    "bind-to-socket": 0, "oversubscribe": 0, "nooversubscribe": 0, "report-bindings": 0,
    "display-map": 0, "display-allocation": 0, "display-diffable-map": 0, "display-topo": 0,
    "display": 1, "dry-run": 0, "output-filename": 1, "output": 1,
    "merge-stderr-to-stdout": 0, "tag-output": 0, "timestamp-output": 0, "xml": 0,
    "xml-file": 1, "no-pty": 0, "prepend-rank": 0, "stdin": 1, "index-argv-by-rank": 0,
    "allow-run-as-root": 0, "timeout": 1, "grace": 1, "report-state-on-timeout": 0,
    "get-stack-traces": 0, "report-pid": 1, "quiet": 0, "verbose": 0, "version": 0,
    "help": 0, "mpi": 1, "pmi-port": 0, "prefix": 1, "disable-auto-cleanup": 0, "path": 1,
    "app": 1, "tune": 1, "am": 1, "launch-agent": 1, "preload-binary": 0,
    "preload-files": 1, "set-cwd-to-session-dir": 0, "ssh-config": 1, "ssh-user": 1,
    "ssh-port": 1, "ssh-identity": 1, "ssh-accept-new": 0, "ssh-timeout": 1,
    "remote-python": 1, "personality": 1, "ompi-server": 1,
}

#: accepted, no effect here: canonical name -> (number of values, why)
ACCEPTED: Dict[str, Tuple[int, str]] = {
    "continuous": (0, "jobs run until their ranks end or are stopped"),
    "leave-session-attached": (0, "there are no daemons to keep attached"),
    "output-proctable": (0, "there is no debugger interface; -v names each rank's pid"),
    "report-child-jobs-separately": (0, "the exit status is always the job's"),
    "cartofile": (1, "cartography files are ignored (as by Open MPI 4)"),
    "debug-devel": (0, "use -v -v"),
    "debug-daemons": (0, "use -v; agents report problems on their own"),
    "debug-daemons-file": (0, "use -v"),
    "display-devel-allocation": (0, "shown as --display-allocation"),
    "display-devel-map": (0, "shown as --display-map"),
    "do-not-resolve": (0, "host names are never resolved by mslaunch except to connect"),
    "enable-instant-on-support": (0, "there is no PMIx instant-on here"),
    "fwd-mpirun-port": (0, "there are no daemons to share a port"),
    "noprefix": (0, "mslaunch never adds a prefix of its own"),
    "show-progress": (0, "starting is reported with -v"),
    "use-regexp": (0, "host lists are always sent whole"),
    "max-vm-size": (1, "there is no persistent virtual machine"),
    "novm": (0, "agents run only on the job's hosts"),
    "disable-recovery": (0, "failed ranks are never restarted in this mode"),
    "allow-run-as-root-confirm": (0, "mslaunch does not refuse root"),
}

#: refused: canonical name -> (number of values, what to use instead)
REFUSED: Dict[str, Tuple[int, str]] = {
    "debug": (0, "there is no parallel debugger interface; attach gdb -p to a rank "
                 "(--report-pid, -v show pids) or use --get-stack-traces with --timeout"),
    "debugger": (1, "there is no parallel debugger interface; attach gdb -p to a rank"),
    "report-events": (1, "there is no tool event interface"),
    "report-uri": (1, "mslaunch has no contact URI: ranks reach it through PMI"),
    "xterm": (1, "no ranks are shown in xterms; use --output-filename DIR or --tag-output"),
    "dvm": (0, "there is no persistent virtual machine: every mslaunch runs one job"),
    "hnp": (1, "there is no persistent virtual machine to submit to"),
    "enable-recovery": (0, "failed ranks are not restarted in the mpirun dialect; msrun "
                           "mode restarts MindSpore workers (MS_ENABLE_RECOVERY=1)"),
    "max-restarts": (1, "failed ranks are not restarted in the mpirun dialect"),
}

#: other spellings -> canonical name
ALIASES: Dict[str, str] = {
    "n": "np", "c": "np", "H": "host", "hosts": "host", "machinefile": "hostfile",
    "f": "hostfile", "wd": "wdir", "gmca": "mca", "N": "npernode", "ppn": "npernode",
    "l": "prepend-rank", "do-not-launch": "dry-run", "q": "quiet", "v": "verbose",
    "V": "version", "h": "help", "rf": "rankfile", "cpus-per-rank": "cpus-per-proc",
    "cf": "cartofile", "tv": "debug", "d": "debug-devel", "s": "preload-binary",
    "hwthread-cpus": "use-hwthread-cpus",
}


def lookup(body: str) -> Tuple[str, str]:
    """``(canonical name, disposition)`` of an option word without its dashes.

    Disposition is ``implemented``, ``accepted``, ``refused`` or ``""`` (unknown).
    """
    name = ALIASES.get(body, body)
    if name in IMPLEMENTED:
        return name, "implemented"
    if name in ACCEPTED:
        return name, "accepted"
    if name in REFUSED:
        return name, "refused"
    return name, ""


def nargs(name: str) -> int:
    if name in IMPLEMENTED:
        return IMPLEMENTED[name]
    return (ACCEPTED.get(name) or REFUSED[name])[0]
