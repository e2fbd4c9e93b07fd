"""Slurm's allocation: ``SLURM_JOB_NODELIST`` (or ``SLURM_NODELIST``), its
compressed host lists (``node[01-03,07]``) and task counts (``2(x3),1``,
from ``SLURM_TASKS_PER_NODE``, else ``SLURM_JOB_CPUS_PER_NODE``, else 1 per
node) expanded here; and whether mslaunch runs inside one, which srun needs.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import List, Mapping, Optional, Sequence, Tuple

from ...core.errors import HostfileError, LaunchError, one_line
from ...core.spec import HostEntry
from ..hostfile import MAX_HOSTS, _MAX_DIGITS, _count, _is_digits, _name_problem, _x
from . import in_slurm, merge_counts


def range_parts(item: str) -> Optional[Tuple[str, Optional[str]]]:
    """``([0-9]+)(?:-([0-9]+))?``: the bounds of ``N`` or ``N-M``, or None."""
    low, dash, high = item.partition("-")
    if not _is_digits(low) or (dash and not _is_digits(high)):
        return None
    return low, high if dash else None


def task_parts(item: str) -> Optional[Tuple[str, Optional[str]]]:
    """``([0-9]+)(?:\\(x([0-9]+)\\))?``: the count and repeat of ``N`` or ``N(xM)``."""
    count, paren, rest = item.partition("(")
    if not _is_digits(count):
        return None
    if not paren:
        return count, None
    if not (rest[:1] == "x" and rest[-1:] == ")" and _is_digits(rest[1:-1])):
        return None
    return count, rest[1:-1]


def bracket_split(part: str) -> List[str]:
    """``re.split(r"\\[([^\\]]*)\\]", part)``: literal text and bracket groups in
    turn, for a name whose brackets are balanced and not nested."""
    pieces: List[str] = []
    at = 0
    while True:
        opening = part.find("[", at)
        closing = part.find("]", opening + 1) if opening >= 0 else -1
        if closing < 0:
            pieces.append(part[at:])
            return pieces
        pieces += [part[at:opening], part[opening + 1:closing]]
        at = closing + 1


def _expand_group(body: str, expr: str, var: str) -> List[str]:
    """``01-03,7`` → ``['01', '02', '03', '7']`` (width from the lower bound)."""
    out: List[str] = []
    for item in body.split(","):
        m = range_parts(item)
        if not m or len(m[0]) > _MAX_DIGITS or len(m[1] or "") > _MAX_DIGITS:
            raise HostfileError(
                f"{var}: bad range {_x(item)} in {_x(expr)} (expected N or N-M, digits only)"
            )
        lo_text, hi_text = m
        if hi_text is None:
            out.append(lo_text)
            continue
        lo, hi = int(lo_text), int(hi_text)
        if hi < lo:
            raise HostfileError(f"{var}: reversed range {_x(item)} in {_x(expr)}")
        if hi - lo >= MAX_HOSTS or len(out) + hi - lo >= MAX_HOSTS:
            raise HostfileError(f"{var}: {_x(expr)} expands to more than {MAX_HOSTS} hosts")
        width = len(lo_text)
        out.extend(str(i).zfill(width) for i in range(lo, hi + 1))
    return out


def _split_top(expr: str, var: str) -> List[str]:
    """Split at commas outside brackets, checking bracket balance."""
    parts: List[str] = []
    depth = 0
    start = 0
    for i, ch in enumerate(expr):
        if ch == "[":
            if depth:
                raise HostfileError(f"{var}: nested '[' in {_x(expr)}")
            depth = 1
        elif ch == "]":
            if not depth:
                raise HostfileError(f"{var}: unbalanced ']' in {_x(expr)}")
            depth = 0
        elif ch == "," and not depth:
            parts.append(expr[start:i])
            start = i + 1
    if depth:
        raise HostfileError(f"{var}: unbalanced '[' in {_x(expr)}")
    parts.append(expr[start:])
    return parts


def expand_nodelist(expr: str, var: str = "SLURM_JOB_NODELIST") -> List[str]:
    """Expand a Slurm hostlist: ``node[01-03,07],gpu[1-2]n[1-2]`` → names in order.

    Zero padding follows the width of each range's lower bound.  Several
    bracket groups in one name give their cartesian product, leftmost slowest.
    Errors are :class:`HostfileError` messages naming ``var``.
    """
    expr = expr.strip()
    if not expr:
        raise HostfileError(f"{var}: empty node list")
    names: List[str] = []
    for part in _split_top(expr, var):
        if not part:
            raise HostfileError(f"{var}: empty host name in {_x(expr)}")
        # Alternate literal text and bracket groups: lit [grp] lit [grp] lit
        pieces = bracket_split(part)
        choices: List[List[str]] = []
        size = 1
        for index, piece in enumerate(pieces):
            if index % 2 == 0:
                choices.append([piece])
                continue
            if not piece:
                raise HostfileError(f"{var}: empty brackets in {_x(expr)}")
            group = _expand_group(piece, expr, var)
            size *= len(group)
            if len(names) + size > MAX_HOSTS:
                raise HostfileError(f"{var}: {_x(expr)} expands to more than {MAX_HOSTS} hosts")
            choices.append(group)
        expanded = [""]
        for options in choices:
            expanded = [head + tail for head in expanded for tail in options]
        for name in expanded:
            problem = _name_problem(name)
            if problem:
                raise HostfileError(f"{var}: {problem} in {_x(expr)}")
        names.extend(expanded)
    return names


def expand_tasks_per_node(expr: str, var: str = "SLURM_TASKS_PER_NODE") -> List[int]:
    """Expand Slurm's compressed count list: ``2(x3),1`` → ``[2, 2, 2, 1]``."""
    out: List[int] = []
    if not expr.strip():
        raise HostfileError(f"{var}: empty count list")
    for item in expr.split(","):
        m = task_parts(item.strip())
        value = _count(m[0]) if m else None
        times = _count(m[1]) if m and m[1] is not None else 1
        if value is None or times is None:
            raise HostfileError(
                f"{var}: bad item {_x(item)} in {_x(expr)} (expected N or N(xM), N and M >= 1)"
            )
        if len(out) + times > MAX_HOSTS:
            raise HostfileError(f"{var}: {_x(expr)} expands to more than {MAX_HOSTS} counts")
        out.extend([value] * times)
    return out


def hosts(environ: Mapping[str, str]) -> Optional[Tuple[List[HostEntry], str]]:
    """The allocation's nodes, each with its task count as slots."""
    for nvar in ("SLURM_JOB_NODELIST", "SLURM_NODELIST"):
        if environ.get(nvar, "").strip():
            return _slurm_hosts(environ, nvar)
    return None


def _slurm_hosts(environ: Mapping[str, str], nvar: str) -> Tuple[List[HostEntry], str]:
    nval = environ[nvar]
    names = expand_nodelist(nval, nvar)
    for cvar in ("SLURM_TASKS_PER_NODE", "SLURM_JOB_CPUS_PER_NODE"):
        cval = environ.get(cvar, "")
        if cval.strip():
            counts = expand_tasks_per_node(cval, cvar)
            if len(counts) != len(names):
                raise HostfileError(
                    f"{cvar}={_x(cval)} gives {len(counts)} counts but "
                    f"{nvar}={_x(nval)} lists {len(names)} hosts"
                )
            source = f"Slurm allocation ({nvar}={nval}, {cvar}={cval})"
            break
    else:
        counts = [1] * len(names)
        source = f"Slurm allocation ({nvar}={nval}, 1 slot per node)"
    entries = merge_counts([(n, c, nvar) for n, c in zip(names, counts)])
    return entries, source


def check_nodes(names: Sequence[str], environ: Mapping[str, str], launcher: str) -> None:
    """LaunchError for a host of ``names`` outside the Slurm allocation."""
    text = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST") or ""
    nodes = set(expand_nodelist(text))
    stray = list(dict.fromkeys(n for n in names if n not in nodes))
    if stray:
        raise LaunchError(f"--launcher {launcher}: {', '.join(stray[:4])} "
                          f"{'is' if len(stray) == 1 else 'are'} not a node of Slurm job "
                          f"{environ.get('SLURM_JOB_ID')} (its nodes: "
                          f"{one_line(text, 80)}); use --launcher ssh for hosts outside "
                          f"the allocation")


#: Why Slurm ends a job's allocation (its JobState), in a user's words.
_ENDED_BECAUSE = {
    "NODE_FAIL": "a node failed, and the allocation was not made with --no-kill "
                 "(salloc -k, sbatch -k), which keeps the job when a node fails",
    "TIMEOUT": "it reached its time limit",
    "CANCELLED": "it was cancelled",
    "PREEMPTED": "it was preempted",
    "DEADLINE": "it reached its deadline",
    "OUT_OF_MEMORY": "it ran out of memory",
}

#: The JobState an allocation still COMPLETING ends in, by its Reason.
_COMPLETING = {"NodeDown": "NODE_FAIL", "TimeLimit": "TIMEOUT", "DeadLine": "DEADLINE"}


def job_query(environ: Mapping[str, str]) -> Optional[List[str]]:
    """The command that shows the allocation this runs in on one line
    (``scontrol show job -o ID``); None outside one."""
    job = environ.get("SLURM_JOB_ID", "")
    if not (in_slurm(environ) and _is_digits(job)):
        return None
    return ["scontrol", "show", "job", "-o", job]


def ended_because(job: str, shown: str) -> str:
    """Why Slurm ended allocation ``job``, as one sentence, from ``scontrol show
    job -o``'s line ``shown``; "" for an allocation Slurm has not ended."""
    # (the first of each field, of the first line that shows one: a later
    # field's value may hold spaces and "=", a heterogeneous job shows a line
    # per component, and a warning may come first)
    line = next((x for x in shown.splitlines() if "JobState=" in x), "")
    fields: dict = {}
    for item in line.split():
        key, equals, value = item.partition("=")
        if equals:
            fields.setdefault(key, value)
    state, reason = fields.get("JobState", ""), fields.get("Reason", "None")
    if state == "COMPLETING":
        # (while its steps are being ended: the state it ends in is shown after)
        state = _COMPLETING.get(reason, "")
    if state not in _ENDED_BECAUSE:
        return ""
    why = f"{state}, {reason}" if reason not in ("None", "") else state
    return f"Slurm ended the job's allocation (job {job}: {why}): {_ENDED_BECAUSE[state]}"
