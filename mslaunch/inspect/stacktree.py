"""Every rank's stacks merged into one labelled tree (pure: no I/O).

A rank's stacks arrive as a :class:`RankStacks` record: its threads, each a
tuple of frame labels, outermost first and innermost last (``func
(file.py:12)`` for Python frames, ``func (libname.so)`` for native ones).
:func:`merge` puts identical call paths together, as LLNL's STAT does: one
prefix tree whose every node carries the set of ranks that pass through it,
and whose leaves carry the ranks whose stack ends there.  Ranks with the same
stacks form a *class*; the ranks outside the biggest class are the
*outliers* (usually the ones the others wait for), and ranks that gave no
answer by the deadline are a class of their own.

:func:`render` writes the tree for people (``ranks 0-2 (3) on h1,h2``),
:func:`to_json` and :func:`from_json` for tools.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Sequence, Tuple

#: The label of a thread other than the first (the main thread) at the top of its path.
OTHER_THREAD = "(another thread)"


@dataclass(frozen=True)
class RankStacks:
    """What was read of one rank: its threads (main thread first), each a tuple
    of frame labels, outermost first; ``note`` says what is missing and why;
    ``answered`` is false when nothing came back by the deadline."""

    rank: int
    host: str
    pid: int
    threads: Tuple[Tuple[str, ...], ...] = ()
    note: str = ""
    answered: bool = True
    state: str = ""
    cpu: float = -1.0          # CPU seconds used so far (-1: unknown)
    moved: int = -1            # grows when it moves data (machine.activity; -1: unknown)
    stdin: bool = False        # waits in a read of its standard input

    def key(self) -> Tuple[Any, ...]:
        """What two ranks must share to be in one class."""
        if not self.answered:
            return ("(no answer)",)
        if not self.threads:
            return ("(no stack)", self.note)
        return self.threads


@dataclass
class Node:
    """One frame of the tree: the ranks through it, the ranks whose stack ends here."""

    frame: str
    ranks: Dict[int, str] = field(default_factory=dict)     # rank -> host
    ends: Dict[int, str] = field(default_factory=dict)
    children: Dict[str, Node] = field(default_factory=dict)


@dataclass(frozen=True)
class Report:
    """The merged stacks of a job."""

    ranks: Tuple[RankStacks, ...]
    tree: Node
    classes: Tuple[Tuple[int, ...], ...]       # biggest first
    outliers: Tuple[int, ...]
    silent: Tuple[int, ...]                    # ranks with no answer
    title: str = ""

    @property
    def hosts(self) -> Dict[int, str]:
        return {r.rank: r.host for r in self.ranks}


def merge(stacks: Iterable[RankStacks], title: str = "") -> Report:
    """The tree and the classes of ``stacks`` (see the module docstring)."""
    ranks = tuple(sorted(stacks, key=lambda r: r.rank))
    root = Node("")
    groups: Dict[Tuple[Any, ...], List[int]] = {}
    for r in ranks:
        groups.setdefault(r.key(), []).append(r.rank)
        paths = _paths(r)
        for path in paths:
            node = root
            node.ranks[r.rank] = r.host
            for frame in path:
                node = node.children.setdefault(frame, Node(frame))
                node.ranks[r.rank] = r.host
            node.ends[r.rank] = r.host
    silent = tuple(r.rank for r in ranks if not r.answered)
    answered = [g for k, g in groups.items() if k != ("(no answer)",)]
    classes = sorted(answered, key=lambda g: (-len(g), g[0]))
    if silent:
        classes.append(list(silent))
    outliers: Tuple[int, ...] = ()
    # Outliers only beside a biggest group: two groups of one size name none.
    if len(answered) > 1 and len(classes[0]) > len(classes[1]):
        biggest = set(classes[0])
        outliers = tuple(r.rank for r in ranks if r.answered and r.rank not in biggest)
    return Report(ranks=ranks, tree=root, classes=tuple(tuple(c) for c in classes),
                  outliers=outliers, silent=silent, title=title)


def _paths(r: RankStacks) -> List[Tuple[str, ...]]:
    if not r.answered:
        return [("(no answer by the deadline)",)]
    if not r.threads:
        return [("(no stack: see below)" if r.note else "(no stack)",)]
    return [t if i == 0 else (OTHER_THREAD,) + t for i, t in enumerate(r.threads)]


# -- labels ------------------------------------------------------------------------

def rank_ranges(ranks: Iterable[int]) -> str:
    """``0-2,5`` for ranks 0, 1, 2 and 5."""
    out: List[str] = []
    run: List[int] = []
    for r in sorted(set(ranks)):
        if run and r == run[-1] + 1:
            run.append(r)
            continue
        if run:
            out.append(_run(run))
        run = [r]
    if run:
        out.append(_run(run))
    return ",".join(out)


def _run(run: List[int]) -> str:
    return str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}"


def label(ranks: Dict[int, str]) -> str:
    """``ranks 0-2 (3) on h1,h2`` or ``rank 3 on h2``."""
    hosts = ",".join(dict.fromkeys(ranks[r] for r in sorted(ranks)))
    if len(ranks) == 1:
        return f"rank {next(iter(ranks))} on {hosts}"
    return f"ranks {rank_ranges(ranks)} ({len(ranks)}) on {hosts}"


# -- for people ----------------------------------------------------------------

def render(report: Report) -> str:
    """The report as text: the tree, innermost frames last, then the classes."""
    lines: List[str] = []
    if report.title:
        lines.append(report.title)
    outliers = set(report.outliers)
    for child in report.tree.children.values():
        _branch(child, "", lines, outliers, report.tree.ranks)
    lines.append(summary(report))
    notes: Dict[str, Dict[int, str]] = {}
    for r in report.ranks:
        for note in r.note.split("; ") if r.note and r.answered else ():
            notes.setdefault(note, {})[r.rank] = r.host
    for note, ranks in notes.items():
        lines.append(f"  {label(ranks)}: {note}")
    return "\n".join(lines) + "\n"


def _branch(node: Node, indent: str, lines: List[str], outliers: set,
            parent: Dict[int, str]) -> None:
    head = label(node.ranks)
    if set(node.ranks) != set(parent) or not lines or indent == "":
        mark = "  [outlier]" if set(node.ranks) <= outliers and outliers else ""
        lines.append(f"{indent}+ {head}:{mark}")
    while True:
        lines.append(f"{indent}    {node.frame}")
        kids = list(node.children.values())
        if node.ends and kids:
            lines.append(f"{indent}    + {label(node.ends)}: (stack ends here)")
        if len(kids) == 1 and not node.ends and set(kids[0].ranks) == set(node.ranks):
            node = kids[0]
            continue
        for kid in kids:
            _branch(kid, indent + "    ", lines, outliers, {})
        return


def summary(report: Report) -> str:
    """One line: the groups, the outliers, the silent ranks."""
    hosts = report.hosts
    groups = len(report.classes)
    text = f"{len(report.ranks)} rank(s), {groups} group(s)"
    if report.outliers:
        biggest = report.classes[0]
        where = _innermost(report, report.outliers)
        text += (f"; outlier(s): {label({r: hosts[r] for r in report.outliers})}{where}, "
                 f"apart from the {len(biggest)} rank(s) of the biggest group "
                 f"({label({r: hosts[r] for r in biggest})})")
    if report.silent:
        text += f"; no answer: {label({r: hosts[r] for r in report.silent})}"
    return text


def _innermost(report: Report, ranks: Sequence[int]) -> str:
    """`` in FUNC`` when the outliers' main threads end in one Python function."""
    by_rank = {r.rank: r for r in report.ranks}
    names = set()
    for rank in ranks:
        r = by_rank[rank]
        py = [f for f in (r.threads[0] if r.threads else ()) if f.endswith(")") and ".py:" in f]
        names.add(py[-1].split(" (", 1)[0] if py else None)
    name = names.pop() if len(names) == 1 else None
    return f" (in {name})" if name else ""


# -- for tools -------------------------------------------------------------------

def row(r: RankStacks) -> Dict[str, Any]:
    """One rank's stacks as plain data (:func:`ranks_from_json` reads a list of them)."""
    return {"rank": r.rank, "host": r.host, "pid": r.pid, "state": r.state,
            "answered": r.answered, "note": r.note, "cpu": r.cpu,
            "threads": [list(t) for t in r.threads]}


def to_json(report: Report) -> Dict[str, Any]:
    """The report as plain data (see :func:`from_json`)."""
    return {"title": report.title,
            "ranks": [row(r) for r in report.ranks],
            "classes": [list(c) for c in report.classes],
            "outliers": list(report.outliers), "no_answer": list(report.silent),
            "tree": _node_json(report.tree)["children"]}


def _node_json(node: Node) -> Dict[str, Any]:
    return {"frame": node.frame, "ranks": rank_ranges(node.ranks),
            "hosts": sorted(set(node.ranks.values())),
            "ends": rank_ranges(node.ends),
            "children": [_node_json(c) for c in node.children.values()]}


def ranks_from_json(items: Any) -> List[RankStacks]:
    """The :class:`RankStacks` of a ``ranks`` list (ValueError if malformed)."""
    if not isinstance(items, list):
        raise ValueError("ranks is not a list")
    out = []
    for item in items:
        if not isinstance(item, dict):
            raise ValueError("a rank entry is not a mapping")
        threads = item.get("threads") or []
        if not isinstance(threads, list) or not all(
                isinstance(t, list) and all(isinstance(f, str) for f in t) for t in threads):
            raise ValueError("threads is not a list of lists of strings")
        rank, pid = item.get("rank"), item.get("pid", 0)
        if type(rank) is not int or type(pid) is not int:
            raise ValueError("rank or pid is not a number")
        out.append(RankStacks(rank=rank, host=str(item.get("host", "")), pid=pid,
                              threads=tuple(tuple(t) for t in threads),
                              note=str(item.get("note") or ""),
                              answered=bool(item.get("answered", True)),
                              state=str(item.get("state") or ""),
                              cpu=_number(item.get("cpu"))))
    return out


def _number(value: Any) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    return float(value) if ok else -1.0


def in_call(r: RankStacks, prefixes: Tuple[str, ...]) -> bool:
    """Whether the main thread of ``r`` is inside a frame starting with one of ``prefixes``."""
    return bool(r.threads) and any(f.startswith(prefixes) for f in r.threads[0])


def from_json(data: Dict[str, Any]) -> Report:
    """The report :func:`to_json` gave (merged again from its ranks)."""
    return merge(ranks_from_json(data.get("ranks")), str(data.get("title") or ""))


def signature(report: Report) -> Tuple[Any, ...]:
    """What changes when the picture changes (the stall report's test)."""
    return tuple((r.rank, r.key()) for r in report.ranks)

