"""``PMI_process_mapping``: which node each rank runs on, as MPICH reads it.

:func:`process_mapping` writes the compact ``(vector,...)`` form from the
placement; :func:`parse_process_mapping` reads one back with MPICH's rules.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Optional, Sequence, Tuple


def _item_text(item: Tuple[int, int, int]) -> str:
    start, nodes, per = item
    return str(start) if nodes == 1 and per == 1 else f"({start},{nodes},{per})"


def _prefix_function(seq: Sequence[object]) -> List[int]:
    pi = [0] * len(seq)
    k = 0
    for i in range(1, len(seq)):
        while k and seq[i] != seq[k]:
            k = pi[k - 1]
        if seq[i] == seq[k]:
            k += 1
        pi[i] = k
    return pi


def process_mapping(node_ids: Sequence[int]) -> str:
    """The ``PMI_process_mapping`` value for ranks on the given nodes (rank order).

    Node ids are renumbered densely in order of first appearance.  Runs become
    ``(start,nodes,ranks_per_node)`` items, and one repeating stretch of items
    (after at most a few leading items) is written as ``[items]xK``, so block
    and round-robin layouts stay a few dozen bytes at any size.
    """
    if not node_ids:
        raise ValueError("process_mapping needs at least one rank")
    dense: Dict[int, int] = {}
    items: List[Tuple[int, int, int]] = []
    run_node, run_len = -1, 0
    blocks: List[Tuple[int, int]] = []
    for raw in node_ids:
        node = dense.setdefault(raw, len(dense))
        if node == run_node:
            run_len += 1
        else:
            if run_len:
                blocks.append((run_node, run_len))
            run_node, run_len = node, 1
    blocks.append((run_node, run_len))
    for node, count in blocks:
        if items:
            start, nodes, per = items[-1]
            if per == count and node == start + nodes:
                items[-1] = (start, nodes + 1, per)
                continue
        items.append((node, 1, count))

    texts = [_item_text(it) for it in items]
    cost = [0]
    for t in texts:
        cost.append(cost[-1] + len(t) + 1)  # with its comma

    def span(a: int, b: int) -> int:
        return cost[b] - cost[a]

    best = (span(0, len(items)), 0, 0, 0)  # (length, head, period, repeats)
    for head in range(min(len(items), 8)):
        rest = items[head:]
        pi = _prefix_function(rest)
        for length in range(2, len(rest) + 1):
            period = length - pi[length - 1]
            if length % period or length == period:
                continue
            reps = length // period
            total = (span(0, head) + span(head, head + period) + 3 + len(str(reps))
                     + span(head + length, len(items)))
            if total < best[0]:
                best = (total, head, period, reps)
    _, head, period, reps = best
    if reps:
        tail = head + period * reps
        parts = texts[:head] + ["[" + ",".join(texts[head : head + period]) + f"]x{reps}"] + texts[tail:]
    else:
        parts = texts
    return "(vector," + ",".join(parts) + ")"


def _strtol(s: str, i: int) -> Tuple[int, int]:
    """C ``strtol(s+i, &end, 0)``: returns (value, end); end == i if no digits."""
    j = i
    n = len(s)
    while j < n and s[j] in " \t\n\v\f\r":
        j += 1
    sign = 1
    if j < n and s[j] in "+-":
        sign = -1 if s[j] == "-" else 1
        j += 1
    if s.startswith(("0x", "0X"), j) and j + 2 < n and s[j + 2] in "0123456789abcdefABCDEF":
        base, j = 16, j + 2
        digits = "0123456789abcdefABCDEF"
    elif j < n and s[j] == "0":
        base, digits = 8, "01234567"
    else:
        base, digits = 10, "0123456789"
    k = j
    while k < n and s[k] in digits:
        k += 1
    if k == j:
        return 0, i
    return sign * int(s[j:k], base), k


_SPACE = " \t\n\v\f\r"


class _MappingReader:
    """A cursor over one mapping string, with MPICH's ``[...]xK`` group state."""

    def __init__(self, value: str, size: int) -> None:
        self.s, self.n, self.size = value, len(value), size
        self.i = 0
        self.out: List[int] = []
        self.repeat_start: Optional[int] = None   # where wrapping resumes
        self.repeat_cont = 0                       # just after ``]xK``
        self.num_repeat = -1                       # passes left; -1: K not read yet
        self.expect_comma = True

    def fail(self, why: str) -> ValueError:
        return ValueError(f"bad process mapping {self.s[:60]!r}: {why}")

    def skip(self, i: int) -> int:
        while i < self.n and self.s[i] in _SPACE:
            i += 1
        return i

    def number(self, i: int) -> Tuple[int, int]:
        num, j = _strtol(self.s, i)
        if j == i:
            raise self.fail(f"expected a number at {i}")
        if num < 0 or num > 2**31 - 1:
            raise self.fail(f"number {num} out of range")
        return num, j

    def header(self) -> None:
        """``(vector``, with whitespace around the parenthesis."""
        s, n = self.s, self.n
        i = self.skip(0)
        if i >= n or s[i] != "(":
            raise self.fail("expected '('")
        i = self.skip(i + 1)
        after = s[i + 6] if i + 6 < n else ""
        if not s.startswith("vector", i) or (after and (after.isalnum() or after in "-_")):
            raise self.fail("expected 'vector'")
        self.i = self.skip(i + 6)

    def separator(self) -> bool:
        """After an item: ``,``, ``]xK`` or ``)``; False when the list ends."""
        s, i = self.s, self.i
        if s.startswith("]x", i):
            i += 2
            if i >= self.n or not s[i].isdigit() or self.repeat_start is None:
                raise self.fail("bad ']x'")
            if self.num_repeat == -1:
                self.num_repeat, i = self.number(i)
                self.repeat_cont = i
            self.num_repeat -= 1
            if self.num_repeat == 0:
                self.i = self.repeat_cont
            else:
                self.i = self.repeat_start
                self.expect_comma = False
        elif s[i] == ")":
            if self.repeat_start is None:
                return False
            self.i = self.repeat_start  # legacy: wrap around
            self.expect_comma = False
        elif s[i] == ",":
            self.i = i + 1
            self.expect_comma = False
        else:
            raise self.fail(f"expected ',' at {i}")
        return True

    def triplet(self) -> bool:
        """``(start,nodes,per)``; True if it assigns ranks."""
        save = i = self.i
        triple = []
        i += 1
        for k in range(3):
            num, i = self.number(self.skip(i))
            triple.append(num)
            i = self.skip(i)
            if i >= self.n or self.s[i] != (")" if k == 2 else ","):
                raise self.fail(f"bad triplet at {save}")
            i += 1
        self.i = i
        start, nodes, per = triple
        if self.repeat_start is None and start == 0:
            self.repeat_start = save
        out = self.out
        for a in range(nodes if per > 0 else 0):
            for _ in range(per):
                out.append(start + a)
                if len(out) == self.size:
                    return True
        self.expect_comma = True
        return nodes > 0 and per > 0

    def plain(self) -> None:
        """A single node id."""
        save = self.i
        node, self.i = self.number(self.i)
        if self.repeat_start is None and node == 0:
            self.repeat_start = save
        self.out.append(node)
        self.expect_comma = True

    def items(self) -> List[int]:
        """Read items, wrapping as MPICH does, until every rank has a node."""
        out, size = self.out, self.size
        stalled, stall_limit = 0, 4 * self.n + 16
        while len(out) < size:
            stalled += 1
            if stalled > stall_limit:
                raise self.fail("assigns no ranks")
            self.i = self.skip(self.i)
            if self.i >= self.n:
                break
            if self.expect_comma:
                if not self.separator():
                    break
            elif self.s[self.i] == "[":
                self.i += 1
                self.repeat_start = self.i
            elif self.s[self.i] == "(":
                if self.triplet():
                    stalled = 0
            else:
                self.plain()
                stalled = 0
        if len(out) < size:
            raise self.fail(f"covers {len(out)} of {size} ranks")
        return out


def parse_process_mapping(value: str, size: int) -> List[int]:
    """Node id of each of ``size`` ranks, parsed as MPICH's ``MPL_rankmap_str_to_array``.

    Same grammar and quirks (whitespace, ``strtol`` base-0 numbers, one
    ``[...]xK`` group, wrapping back to the group or to the first item that
    starts at node 0 when the items run out), but stricter where MPICH
    would leave ranks unassigned or loop forever: those raise ValueError, as
    do negative node ids.
    """
    if size <= 0:
        return []
    reader = _MappingReader(value, size)
    reader.header()
    return reader.items()
