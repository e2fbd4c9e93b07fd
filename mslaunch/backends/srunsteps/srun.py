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

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Mapping, Optional, Sequence, Tuple

#: The variable holding the tasks' program.
TASK_VARIABLE = "MSLAUNCH_SRUN_TASK"


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
    address srun ran from for its stdout, presenting ``secret``, its rank and
    ``o`` (``mslaunch-dial TOKEN PID``), then, unless ``merged`` (stdout and
    stderr on one connection), dials again for its stderr (``e``); runs what
    the launcher answers on the first (:func:`rank_script`, up to a NUL byte)
    and becomes the rank's program.  Every command is a ``builtin``, and a
    function ``exec`` is removed first: functions exported into the
    environment (``BASH_FUNC_*``) cannot stand in for them.  (``builtin exec``
    would not keep its redirections.)"""
    dial = f"exec {{fd}}<>/dev/tcp/$SLURM_LAUNCH_NODE_IPADDR/{port} || builtin exit 126"
    hello = (f"builtin printf 'mslaunch-dial %s%s{{s}} %s\\n' {secret} \"$SLURM_PROCID\" $$ "
             f">&{{fd}}")
    lines = ["builtin unset -f exec", dial.format(fd=3), hello.format(s="o", fd=3)]
    if merged:
        redirect = "1>&3 2>&3 3>&-"
    else:
        lines += [dial.format(fd=4), hello.format(s="e", fd=4)]
        redirect = "1>&3 2>&4 3>&- 4>&-"
    lines += ["IFS= builtin read -r -d '' __mslaunch_s <&3 || builtin exit 126",
              f"builtin unset {TASK_VARIABLE}",
              'builtin eval "$__mslaunch_s"',
              f'exec "$@" {redirect}']
    return "\n".join(lines) + "\n"


def rank_script(env: Mapping[str, str], argv: Optional[Sequence[str]] = None,
                cwd: Optional[str] = None, pmi_port: Optional[int] = None,
                who: str = "the rank") -> bytes:
    """What the launcher answers one task (see :func:`task_program`): the rank's
    own variables, ``PMI_PORT`` at srun's address if ``pmi_port``, its argv when
    not srun's, its directory (one that is missing is said, as a program that
    is not found, in one line naming ``who`` and the node, and exit status
    127); ended by a NUL byte.  ValueError for a name that is no variable's or
    a value with a NUL byte."""
    steps = ["builtin unset __mslaunch_s"]
    for k, v in sorted(env.items()):
        problem = variable_problem(k, v)
        if problem:
            raise ValueError(problem)
        steps.append(f"builtin export {k}={quote(v)}")
    if pmi_port is not None:
        steps.append(f"builtin export PMI_PORT=$SLURM_LAUNCH_NODE_IPADDR:{pmi_port}")
    if argv is not None:
        if any("\0" in w for w in argv):
            raise ValueError("an argument holds a NUL byte")
        steps.append("builtin set -- " + " ".join(quote(w) for w in argv))
    said = "builtin printf 'mslaunch: %s: %s on %s\\n' " + quote(who)
    if cwd is not None:
        if "\0" in cwd:
            raise ValueError("the directory's name holds a NUL byte")
        steps.append(f"builtin cd -- {quote(cwd)} 2>/dev/null || {{ {said} "
                     f"{quote('working directory ' + cwd + ' does not exist')} "
                     f"\"$SLURMD_NODENAME\" >&2; builtin exit 127; }}")
    # (no fork: hash fails for a file that is not executable, type -P for a
    # builtin or a function, which exec could not run)
    steps.append('case $1 in */*) builtin test -f "$1" && builtin test -x "$1";; '
                 '*) builtin hash -- "$1" 2>/dev/null && builtin type -P -- "$1" >/dev/null;; '
                 f'esac || {{ {said} "$1: no such program (or not executable)" '
                 f'"$SLURMD_NODENAME" >&2; builtin exit 127; }}')
    try:
        return ("\n".join(steps) + "\n\0").encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        raise ValueError("an argument or the directory is not text of this system") from None


#: Names bash keeps for itself (read-only, or read as it starts): a rank's own
#: value of one could not be set by the task's bash.
_BASH_OWN = frozenset(("UID", "EUID", "PPID", "SHELLOPTS", "BASHOPTS", "BASHPID", "GROUPS",
                       "BASH_VERSINFO", "BASH_ARGV0", "BASH_SUBSHELL", "BASH_COMMAND",
                       "__mslaunch_s", TASK_VARIABLE))


def variable_problem(name: str, value: str) -> Optional[str]:
    """Why the tasks' bash cannot give a rank ``name=value`` of its own, or None."""
    if not (name.isascii() and name.isidentifier()):
        return f"{name!r} is not a name the tasks' bash can export"
    if name in _BASH_OWN:
        return f"{name} is bash's own variable"
    if "\0" in value:
        return f"the value of {name} holds a NUL byte"
    try:
        value.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return f"the value of {name} is not text of this system"
    return None


#: Variables bash reads as it starts: kept from the task's own bash and given
#: to the rank by its script instead (``BASH_ENV`` would be sourced first;
#: ``SHELLOPTS`` and ``BASHOPTS`` would change how the task's program runs).
SHELL_STARTUP = ("BASH_ENV", "SHELLOPTS", "BASHOPTS")


def srun_argv(nodes: Sequence[str], ntasks: int, stdin: str, cwd: str,
              argv: Sequence[str]) -> List[str]:
    """The srun command starting the ranks: task ``r`` on ``nodes[r]`` (Slurm's
    ``arbitrary`` distribution), with no MPI plugin of Slurm's (mslaunch serves
    PMI), no binding of Slurm's, and ``-v`` so that srun says which tasks ended
    how (:class:`SrunLog`).  ``stdin``: ``none`` or the task given it; ``cwd``:
    the tasks' directory."""
    distinct = list(dict.fromkeys(nodes))
    return ["srun", "-v", f"--nodelist={','.join(nodes)}", f"--nodes={len(distinct)}",
            f"--ntasks={ntasks}", "--distribution=arbitrary", "--overcommit", "--overlap",
            "--kill-on-bad-exit=0", "--mpi=none", "--cpu-bind=none", f"--input={stdin}",
            f"--chdir={cwd}",
            "bash", "-c", f'eval "${TASK_VARIABLE}"', "bash", *argv]


_STEP = "srun: launching StepId="
_STATUS = "_task_finish: Received task exit notification for "
_STATUS_WORD = " (status=0x"


def _is_chatter(text: str) -> bool:
    """srun's lines that say nothing a user of mslaunch needs (without ``-v -v``):
    its verbose lines, and the end of a step mslaunch ended (the ranks' signals
    say it)."""
    if text.startswith("srun: "):
        return not text.startswith(("srun: error: ", "srun: warning: "))
    return text.startswith("slurmstepd-") and ": error: *** STEP " in text \
        and " CANCELLED AT " in text


def _status(text: str) -> Optional[int]:
    """The wait status of ``..._task_finish: Received task exit notification for N
    task(s) of StepId=S (status=0xHHHH).``, else None."""
    if not text.startswith("srun: ") or _STATUS not in text:
        return None
    _, _, rest = text.partition(_STATUS_WORD)
    word = rest.partition(")")[0]
    if not 0 < len(word) <= 8 or any(c not in "0123456789abcdefABCDEF" for c in word):
        return None
    return int(word, 16)


def _tasks_named(text: str) -> Optional[str]:
    """The task list of ``srun: error: NODE: task(s) LIST: ...`` or ``srun: ...
    _task_finish: NODE: task(s) LIST: ...``, else None."""
    if text.startswith("srun: error: "):
        rest = text[len("srun: error: "):]
    elif text.startswith("srun: ") and "_task_finish: " in text:
        rest = text.partition("_task_finish: ")[2]
    else:
        return None
    parts = rest.split(": ", 2)
    if len(parts) < 3 or " " in parts[0]:
        return None
    word, _, ids = parts[1].partition(" ")
    return ids if word in ("task", "tasks") and ids[:1].isdigit() else None


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
        if self.step is None and text.startswith(_STEP):
            self.step = text[len(_STEP):].partition(" ")[0] or None
        status = _status(text)
        if status is not None:
            self._status = status
            return text if self.show_all else None
        named = _tasks_named(text) if self._status is not None else None
        if named is not None and self._status is not None:
            try:
                ids = task_ids(named)
            except ValueError:
                ids = []
            st, self._status = self._status, None
            sig = st & 0x7F
            for task in ids:
                self.ends.append((task, None, sig) if sig else (task, (st >> 8) & 0xFF, None))
            if ids:
                return text if self.show_all else None
        if self.show_all or not _is_chatter(text):
            return text
        return None

    def take(self) -> List[Tuple[int, Optional[int], Optional[int]]]:
        """The task ends read since the last call."""
        ends, self.ends = self.ends, []
        return ends
