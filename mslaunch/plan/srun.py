"""``--launcher srun``: the text of a job whose ranks srun starts itself.

Pure functions of the plan: the ``srun`` command line, the shell program
each task runs before it becomes its rank (:func:`task_program`), and the
reading of what ``srun -v`` says of its tasks' ends (:class:`SrunLog`).

Each task is ``bash`` running the program held in ``MSLAUNCH_SRUN_TASK`` (in
the environment, never in argv: it holds the job's secret).  It opens a TCP
connection to the launcher for its stdout, presenting the secret and its
rank (``SLURM_PROCID``), and reads from it its rank's own variables (those
that differ between ranks; the rest come with srun's environment), opens
one more for its stderr, and then replaces itself with the rank's program,
whose output thus reaches the launcher byte for byte.  The program is the
same for every task, so its size does not grow with the job's.  bash is used
for its ``/dev/tcp`` redirections.
"""

from __future__ import annotations

import re

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Mapping, Optional, Sequence, Tuple

#: The variable holding the tasks' program.
TASK_VARIABLE = "MSLAUNCH_SRUN_TASK"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def quote(text: str) -> str:
    """``text`` as one word of bash (single quotes; none inside survives unescaped)."""
    return "'" + text.replace("'", "'\\''") + "'"


def split_env(envs: Sequence[Mapping[str, str]]) -> Tuple[Dict[str, str], List[Dict[str, str]]]:
    """The variables every rank has alike, and each rank's own (those that differ,
    or that some rank lacks)."""
    common: Dict[str, str] = {}
    if envs:
        first = envs[0]
        common = {k: v for k, v in first.items()
                  if all(e.get(k) == v for e in envs[1:])}
    return common, [{k: v for k, v in e.items() if k not in common} for e in envs]


def task_program(secret: str, port: int, merged: bool) -> str:
    """The bash program of every task (the same for all): it dials ``port`` of the
    address srun ran from, presents ``secret``, its rank and ``o`` (``mslaunch-dial
    TOKEN PID``), runs what the launcher answers (:func:`rank_script`, up to a
    NUL byte), then, unless ``merged`` (stdout and stderr on one connection),
    dials again for its stderr (``e``), and becomes the rank's program."""
    # (the shell's own names are unlikely ones: srun's environment is the ranks')
    lines = [f"exec 3<>/dev/tcp/$SLURM_LAUNCH_NODE_IPADDR/{port} || exit 126",
             f"printf 'mslaunch-dial %s%so %s\\n' {secret} \"$SLURM_PROCID\" $$ >&3",
             "IFS= read -r -d '' __mslaunch_s <&3 || exit 126"]
    if merged:
        redirect = "1>&3 2>&3 3>&-"
    else:
        lines.append(f"exec 4<>/dev/tcp/$SLURM_LAUNCH_NODE_IPADDR/{port} || exit 126")
        lines.append(f"printf 'mslaunch-dial %s%se %s\\n' {secret} \"$SLURM_PROCID\" $$ >&4")
        redirect = "1>&3 2>&4 3>&- 4>&-"
    lines.append(f"unset {TASK_VARIABLE}")
    lines.append('eval "$__mslaunch_s"')
    lines.append(f'exec "$@" {redirect}')
    return "\n".join(lines) + "\n"


def rank_script(env: Mapping[str, str], argv: Optional[Sequence[str]] = None,
                cwd: Optional[str] = None, pmi_port: Optional[int] = None) -> bytes:
    """What the launcher answers one task (see :func:`task_program`): the rank's
    own variables, ``PMI_PORT`` at srun's address if ``pmi_port``, its argv and
    directory when not srun's; ended by a NUL byte.  ValueError for a name that
    is no variable's or a value with a NUL byte."""
    steps = ["unset __mslaunch_s"]
    for k, v in sorted(env.items()):
        if not _NAME.match(k) or "\0" in v:
            raise ValueError(f"cannot export {k!r}")
        steps.append(f"export {k}={quote(v)}")
    if pmi_port is not None:
        steps.append(f"export PMI_PORT=$SLURM_LAUNCH_NODE_IPADDR:{pmi_port}")
    if argv is not None:
        if any("\0" in w for w in argv):
            raise ValueError("an argument holds a NUL byte")
        steps.append("set -- " + " ".join(quote(w) for w in argv))
    if cwd is not None:
        if "\0" in cwd:
            raise ValueError("the directory's name holds a NUL byte")
        steps.append(f"cd -- {quote(cwd)} || exit 126")
    return ("\n".join(steps) + "\n\0").encode("utf-8", "surrogateescape")


def srun_argv(nodes: Sequence[str], ntasks: int, stdin: str, argv: Sequence[str]) -> List[str]:
    """The srun command starting the ranks: task ``r`` on ``nodes[r]`` (Slurm's
    ``arbitrary`` distribution), with no MPI plugin of Slurm's (mslaunch serves
    PMI), no binding of Slurm's, and ``-v`` so that srun says which tasks ended
    how (:class:`SrunLog`).  ``stdin``: ``none`` or the task given it."""
    distinct = list(dict.fromkeys(nodes))
    return ["srun", "-v", f"--nodelist={','.join(nodes)}", f"--nodes={len(distinct)}",
            f"--ntasks={ntasks}", "--distribution=arbitrary", "--overcommit", "--overlap",
            "--kill-on-bad-exit=0", "--mpi=none", "--cpu-bind=none", f"--input={stdin}",
            "bash", "-c", f'eval "${TASK_VARIABLE}"', "bash", *argv]


_STEP = re.compile(r"srun: launching StepId=(\d+\.\d+) ")
_STATUS = re.compile(r"srun: .*_task_finish: Received task exit notification for \d+ tasks? "
                     r"of StepId=\S+ \(status=0x([0-9a-fA-F]{1,8})\)")
_TASKS = re.compile(r"srun: (?:.*_task_finish: |error: )\S+: tasks? ([0-9][0-9,\-]*): ")
#: srun's lines that say nothing a user of mslaunch needs (without ``-v -v``):
#: its verbose lines, and the end of a step mslaunch ended (the ranks' signals say it).
_CHATTER = re.compile(r"srun: (?!error: |warning: )|slurmstepd-\S+: error: \*\*\* STEP \S+ "
                      r"ON \S+ CANCELLED AT ")


def task_ids(text: str) -> List[int]:
    """Slurm's list of task ids (``0-3,5``)."""
    out: List[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            raise ValueError(f"not a task list: {text!r}")
        first, last = int(low), int(high or low)
        if last < first or last - first > 1 << 20:
            raise ValueError(f"not a task list: {text!r}")
        out.extend(range(first, last + 1))
    return out


class SrunLog:
    """Reads ``srun -v``'s stderr, line by line: the step's id, and each task's
    end (its wait status, from the line before the one naming the tasks).
    :meth:`line` returns what to show the user of the line (None: nothing)."""

    def __init__(self, show_all: bool = False) -> None:
        self.show_all = show_all
        self.step: Optional[str] = None
        self.ends: List[Tuple[int, Optional[int], Optional[int]]] = []  # task, code, signal
        self._status: Optional[int] = None

    def line(self, text: str) -> Optional[str]:
        found = _STEP.match(text)
        if found and self.step is None:
            self.step = found.group(1)
        status = _STATUS.match(text)
        if status:
            self._status = int(status.group(1), 16)
            return text if self.show_all else None
        tasks = _TASKS.match(text)
        if tasks and self._status is not None:
            try:
                ids = task_ids(tasks.group(1))
            except ValueError:
                ids = []
            st, self._status = self._status, None
            sig = st & 0x7F
            for task in ids:
                self.ends.append((task, None, sig) if sig else (task, (st >> 8) & 0xFF, None))
            if ids:
                return text if self.show_all else None
        if self.show_all or not _CHATTER.match(text):
            return text
        return None

    def take(self) -> List[Tuple[int, Optional[int], Optional[int]]]:
        """The task ends read since the last call."""
        ends, self.ends = self.ends, []
        return ends
