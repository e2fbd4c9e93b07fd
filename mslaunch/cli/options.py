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
    "remote-python": 1, "personality": 1, "ompi-server": 1, "enable-recovery": 0,
    "max-restarts": 1, "usize": 1, "novm": 0, "launcher": 1,
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
    "disable-recovery": (0, "failed ranks are never restarted in this mode"),
    "dvm": (0, "there is no persistent virtual machine: the job runs as usual"),
    "allow-run-as-root-confirm": (0, "mslaunch does not refuse root"),
}

#: refused: canonical name -> (number of values, what to use instead)
REFUSED: Dict[str, Tuple[int, str]] = {
    "debug": (0, "there is no parallel debugger interface; attach gdb -p to a rank "
                 "(--report-pid, -v show pids) or use --get-stack-traces with --timeout"),
    "debugger": (1, "there is no parallel debugger interface; attach gdb -p to a rank"),
    "report-events": (1, "there is no tool event interface; use -v for each rank's start "
                         "and end, --report-pid FILE for mslaunch's pid"),
    "report-uri": (1, "mslaunch has no contact URI: ranks reach it through PMI; use "
                      "--report-pid FILE to find mslaunch"),
    "xterm": (1, "no ranks are shown in xterms; use --output-filename DIR or --tag-output"),
    "hnp": (1, "there is no persistent virtual machine to submit to; run mslaunch "
               "with the job's hosts (-H, --hostfile) instead"),
}

#: other spellings -> canonical name
ALIASES: Dict[str, str] = {
    "bootstrap": "launcher", "n": "np", "c": "np", "H": "host", "hosts": "host", "machinefile": "hostfile",
    "f": "hostfile", "wd": "wdir", "gmca": "mca", "N": "npernode", "ppn": "npernode",
    "l": "prepend-rank", "do-not-launch": "dry-run", "q": "quiet", "v": "verbose",
    "V": "version", "h": "help", "rf": "rankfile", "cpus-per-rank": "cpus-per-proc",
    "cf": "cartofile", "tv": "debug", "d": "debug-devel", "s": "preload-binary",
    "hwthread-cpus": "use-hwthread-cpus",
}


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

#: Where an implemented option behaves other than in Open MPI 4.1.4.
DIFFERS: Dict[str, str] = {
    "np": "no `-n` or `-n 0`: one rank per slot; with no host list this machine runs "
          "what `-n` asks (oversubscribing; `--nooversubscribe` refuses)",
    "bind-to": "default none (Open MPI 4: core up to 2 ranks, then socket)",
    "oversubscribe": "ignores `max_slots`, as Open MPI 4 does",
    "merge-stderr-to-stdout": "merged at the source, so the terminal copy is merged too "
                              "(Open MPI 4 merges only in the files)",
    "timeout": "exit status 110, as Open MPI 4; ranks get SIGTERM, then SIGKILL after "
               "`--grace` seconds (Open MPI: 1 s)",
    "get-stack-traces": "Python ranks: the Python stacks of all threads; others: gdb or "
                        "eu-stack",
    "enable-recovery": "a failed rank no longer stops the others and the exit status stays "
                       "its own (Open MPI 4.1.4 exits 0); nothing is restarted, as there",
    "max-restarts": "as `--enable-recovery`, with a warning: nothing is restarted, as in "
                    "Open MPI 4.1.4",
    "launch-agent": "the Python that runs the agent on remote hosts",
    "novm": "agents start only on hosts that run ranks; by default, as Open MPI's daemons, "
            "on every host of the list, so that spawned jobs can use them",
    "personality": "only `ompi`",
    "ompi-server": "names are published through mslaunch's PMI server",
    "stdin": "also `all`: every rank reads a copy",
    "output-filename": "also Open MPI 5's `DIR:nocopy`, `DIR:nojobid`",
    "x": "variables of an outer launch are never inherited; `-x` can set them",
    "report-bindings": "no line for a rank that is not bound (bindings default to none)",
}


def markdown_table() -> str:
    """The README's table of Open MPI 4.1.4's options and what mslaunch does with each."""
    rows = ["| Open MPI 4.1.4 option | in mslaunch |", "|---|---|"]
    for line in OPEN_MPI_4:
        name, how = lookup(line.split("|")[-1].lstrip("-"))
        spelled = ", ".join(f"`{s}`" for s in line.split("|"))
        if how == "implemented":
            what = "implemented" + (f": {DIFFERS[name]}" if name in DIFFERS else "")
        elif how == "accepted":
            what = f"accepted, no effect: {ACCEPTED[name][1]}"
        else:
            what = f"refused: {REFUSED[name][1]}"
        rows.append(f"| {spelled} | {what} |")
    return "\n".join(rows) + "\n"


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
