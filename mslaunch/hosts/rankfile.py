"""Open MPI rankfiles (``-rf``/``--rankfile``): which host and CPUs each rank gets.

One rank per line::

    rank 0=node01 slot=0:0-1     # socket 0, its cores 0 and 1
    rank 1 = +n1 slot = 2        # the second host of the host list, logical cpu 2

``#`` starts a comment anywhere; blank lines are ignored; spaces are allowed
around ``=``; the keywords ``rank`` and ``slot`` (or ``slots``) may be in any
case.  HOST is a host name, a bracketed IPv6 address, or ``+nN``: the N-th host
(from 0) of the host list or allocation.  ``user@host`` and ``username=`` are
rejected (set a per-host user in ``~/.ssh/config``).

SPEC (``slot=``) is one or more parts separated by ``;`` (the CPUs of all parts):

* ``1``, ``0,1``, ``0-3,6``: logical CPUs.  As in Open MPI 4 (its mpirun(1):
  ``slot=1-2`` is "bound to logical cores 1 and 2") these count *cores*, each
  binding all its hardware threads, unless the caller asks for hardware threads
  (``--use-hwthread-cpus``); see :func:`slot_cpus`.
* ``S:C``: cores C of socket S, where C is a list (``0-1``, ``0,2``) or ``*``
  (the whole socket) and counts within the socket; S may also be a list or
  ``*`` (every socket).  ``s0:c1``, ``S0:C1`` and ``p0:1`` are the same with
  explicit letters.
* ``s0``, ``p0``, ``s0-1``: whole sockets (``p`` for package).

All numbers are logical (hwloc) indexes, as in Open MPI since 1.7.

Differences from Open MPI 4.1.4 (on purpose): lines may come in any order
(4.1.4 reports "rank 0 is already assigned" for a file that lists rank 1
first); ``slot=`` is required (4.1.4 fails with a broken help message); a line
that is not ``rank N=HOST slot=SPEC`` is an error (4.1.4 takes its first word
for a host name and tries to ssh to it); a spec that names CPUs, sockets or
cores a host does not have is an error that says which (4.1.4 fails with no
message); a list or range before ``:`` means every socket in it (4.1.4 reads
only the first number, e.g. ``0,1:0`` as ``0:0``).  ``p`` is taken for
"package", as the letter forms were understood when measured on a 1-socket
host (the binding that measurement produced was not recorded); 4.1.4's parser
may instead read ``pN`` as a cpu number that fails to parse, i.e. cpu 0.  Whether a rank
missing from the file is an error depends on the job size, so the caller
checks that with :func:`missing_ranks`.

Errors are one line: ``FILE:LINE: problem``, or ``rankfile FILE: problem``
for a file that cannot be read or holds no ranks.
"""

from __future__ import annotations

from ..core.errors import HostfileError
from ..core.spec import dataclass
from .hostfile import MAX_FILE_BYTES, MAX_HOSTS, _name_problem, _show_path, _x, read_host_file

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, Iterable, List, Optional, Sequence, Tuple

    from ..core.cputopo import Topology

__all__ = [
    "MAX_FILE_BYTES", "MAX_INDEX", "MAX_RANKS", "RankEntry", "SlotPart", "SlotSpec",
    "missing_ranks", "parse_rankfile", "parse_rankfile_text", "parse_slot", "slot_cpus",
]

#: Ranks are below this (the largest job mslaunch runs).
MAX_RANKS = 100_000
#: CPU, core and socket numbers in a slot spec are below this.
MAX_INDEX = 1 << 16

@dataclass(frozen=True)
class SlotPart:
    """One ``;``-separated part of a slot spec.

    ``kind`` is ``"cpu"`` (``ids``: logical CPU numbers) or ``"socket"``
    (``ids``: sockets, None for ``*``; ``cores``: cores within each of those
    sockets, None for all of them).  Numbers are kept as merged ranges.
    """

    kind: str
    ids: Optional[Tuple[Tuple[int, int], ...]]
    cores: Optional[Tuple[Tuple[int, int], ...]] = None

    def __str__(self) -> str:
        if self.kind == "cpu":
            return _show_ranges(self.ids)
        return f"{_show_ranges(self.ids)}:{_show_ranges(self.cores)}"


@dataclass(frozen=True)
class SlotSpec:
    """A parsed ``slot=`` value; ``str()`` gives its canonical text."""

    parts: Tuple[SlotPart, ...]

    def __str__(self) -> str:
        return ";".join(str(p) for p in self.parts)


@dataclass(frozen=True)
class RankEntry:
    """One rankfile line: ``rank`` on ``host`` (``+nN`` sets ``relative`` = N)."""

    rank: int
    host: str
    relative: Optional[int]
    slot: SlotSpec
    origin: str = ""


class _Problem(Exception):
    """Internal: a problem description that the caller prefixes."""


# ---------------------------------------------------------------------------
# slot specs


def _show_ranges(ranges: Optional[Tuple[Tuple[int, int], ...]]) -> str:
    if ranges is None:
        return "*"
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges)


def _merge(pairs: Iterable[Tuple[int, int]]) -> Tuple[Tuple[int, int], ...]:
    out: List[List[int]] = []
    for a, b in sorted(pairs):
        if out and a <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return tuple((a, b) for a, b in out)


def _number(text: str, what: str) -> int:
    if not (text.isascii() and text.isdigit()):
        raise ValueError(f"{what} {_x(text, 20)} is not a number")
    if len(text) > 6 or int(text) >= MAX_INDEX:
        raise ValueError(f"{what} {_x(text, 20)} is out of range (at most {MAX_INDEX - 1})")
    return int(text)


def _list(text: str, what: str, star: bool) -> Optional[Tuple[Tuple[int, int], ...]]:
    """``0-2,5`` as ranges (``*`` as None where allowed); ValueError otherwise."""
    if text == "*" and star:
        return None
    if not text:
        raise ValueError(f"missing {what} number")
    pairs = []
    for item in text.split(","):
        first, dash, last = item.partition("-")
        lo = _number(first, what)
        hi = _number(last, what) if dash else lo
        if hi < lo:
            raise ValueError(f"reversed {what} range {_x(item, 20)}")
        pairs.append((lo, hi))
    return _merge(pairs)


def _strip_letter(text: str, letters: str) -> str:
    return text[1:] if text[:1] in letters else text


def parse_slot(text: str) -> SlotSpec:
    """Parse a ``slot=`` value (module docstring); ValueError with a short reason."""
    if not text:
        raise ValueError("empty slot spec")
    parts = []
    for item in text.split(";"):
        if not item:
            raise ValueError("empty part in slot spec (between ';')")
        sockets, colon, cores = item.partition(":")
        if colon:
            if ":" in cores:
                raise ValueError(f"more than one ':' in {_x(item, 20)}")
            ids = _list(_strip_letter(sockets, "sSpP"), "socket", star=True)
            core_ranges = _list(_strip_letter(cores, "cC"), "core", star=True)
            parts.append(SlotPart("socket", ids, core_ranges))
        elif item[:1] in "sSpP":
            parts.append(SlotPart("socket", _list(item[1:], "socket", star=True), None))
        else:
            parts.append(SlotPart("cpu", _list(item, "cpu", star=False)))
    return SlotSpec(tuple(parts))


def slot_cpus(spec: SlotSpec, topo: Topology, hwthread_cpus: bool = False) -> Tuple[int, ...]:
    """The OS CPU numbers (sorted) that ``spec`` names on a host of topology ``topo``.

    CPU and core numbers count cores (all their hardware threads bound), or
    hardware threads when ``hwthread_cpus``; core numbers after ``S:`` count
    within the socket.  ValueError (one short line) when the spec names a CPU,
    socket or core the host does not have.
    """
    from ..core.cputopo import CORE, CPU, PACKAGE

    unit = "hwthread" if hwthread_cpus else "core"
    units: Dict[int, List[int]] = {}
    sockets: Dict[int, List[int]] = {}
    for row in topo.cpus:
        key = row[CPU] if hwthread_cpus else row[CORE]
        if key not in units:
            units[key] = []
            sockets.setdefault(row[PACKAGE], []).append(key)
        units[key].append(row[CPU])
    flat = list(units.values())
    by_socket = [[units[k] for k in keys] for keys in sockets.values()]
    chosen = set()
    for part in spec.parts:
        if part.kind == "cpu":
            for group in _pick(flat, part.ids, f"no cpu {{}} (slot numbers count {unit}s; "
                                                f"the host has {_span(len(flat))})"):
                chosen.update(group)
            continue
        for s, socket in _pick_numbered(by_socket, part.ids,
                                        f"no socket {{}} (the host has "
                                        f"{_count(len(by_socket), 'socket')})"):
            for group in _pick(socket, part.cores, f"socket {s} has no {unit} {{}} (it has "
                                                   f"{_span(len(socket))})"):
                chosen.update(group)
    return tuple(sorted(chosen))


def _count(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


def _span(n: int) -> str:
    return "only 0" if n == 1 else f"0-{n - 1}"


def _pick_numbered(items: Sequence, ranges, message: str):
    if ranges is None:
        return list(enumerate(items))
    for lo, hi in ranges:
        if hi >= len(items):
            raise ValueError(message.format(max(lo, len(items))))
    return [(i, items[i]) for lo, hi in ranges for i in range(lo, hi + 1)]


def _pick(items: Sequence, ranges, message: str) -> List:
    return [item for _, item in _pick_numbered(items, ranges, message)]


# ---------------------------------------------------------------------------
# rankfiles

_SHAPE = "expected 'rank N=HOST slot=SPEC'"


def _tokens(line: str) -> List[str]:
    """Whitespace-separated words with ``a = b`` glued into ``a=b``."""
    tokens: List[str] = []
    for tok in line.split():
        if tokens and (tok.startswith("=") or tokens[-1].endswith("=")):
            tokens[-1] += tok
        else:
            tokens.append(tok)
    return tokens


def _host(text: str) -> Tuple[str, Optional[int]]:
    if text.startswith("+"):
        digits = text[2:]
        if text[1:2] != "n" or not (digits.isascii() and digits.isdigit()) \
                or len(digits) > 6 or int(digits) >= MAX_HOSTS:
            raise _Problem(f"relative host must be +nN with N from 0 to {MAX_HOSTS - 1}, "
                           f"got {_x(text)}")
        return text, int(digits)
    if "@" in text:
        raise _Problem(f"user@host is not supported ({_x(text)}): "
                       "set a per-host user in ~/.ssh/config")
    bracketed = text.startswith("[") and text.endswith("]")
    name = text[1:-1] if bracketed else text
    problem = _name_problem(name, bracketed=bracketed)
    if problem:
        raise _Problem(problem)
    return name, None


def _parse_line(line: str) -> Optional[Tuple[int, str, Optional[int], SlotSpec]]:
    """One rankfile line → ``(rank, host, relative, slot)``, or None if empty."""
    line = line.split("#", 1)[0]
    tokens = _tokens(line)
    if not tokens:
        return None
    if tokens[0].lower() != "rank" or len(tokens) < 2:
        raise _Problem(f"{_SHAPE}, got {_x(line.strip())}")
    number, eq, host = tokens[1].partition("=")
    if not (number.isascii() and number.isdigit()):
        raise _Problem(f"rank must be a number, got {_x(number)}" if number
                       else f"{_SHAPE}, got {_x(line.strip())}")
    if len(number) > 6 or int(number) >= MAX_RANKS:
        raise _Problem(f"rank {_x(number)} is too large (at most {MAX_RANKS - 1})")
    rank = int(number)
    if not eq or not host or "=" in host:
        raise _Problem(f"missing host after 'rank {rank}' ({_SHAPE})")
    name, relative = _host(host)
    slot: Optional[SlotSpec] = None
    for tok in tokens[2:]:
        key, eq, value = tok.partition("=")
        if key.lower() in ("user", "username", "user-name", "user_name"):
            raise _Problem(f"token {_x(tok)} is not supported "
                           "(set a per-host user in ~/.ssh/config)")
        if key.lower() not in ("slot", "slots") or not eq:
            raise _Problem(f"unexpected {_x(tok)} ({_SHAPE})")
        if slot is not None:
            raise _Problem(f"slot= given twice for rank {rank}")
        try:
            slot = parse_slot(value)
        except ValueError as exc:
            raise _Problem(f"bad slot spec {_x(value)}: {exc}") from None
    if slot is None:
        raise _Problem(f"rank {rank} has no slot=SPEC (mslaunch requires one on every line, "
                       "e.g. slot=0 or slot=0:1)")
    return rank, name, relative, slot


def parse_rankfile_text(text: str, filename: str = "<rankfile>") -> List[RankEntry]:
    """Parse rankfile contents into entries in rank order (see the module docstring)."""
    shown = _show_path(filename)
    found: Dict[int, RankEntry] = {}
    for number, line in enumerate(text.split("\n"), 1):
        where = f"{shown}:{number}"
        try:
            parsed = _parse_line(line.rstrip("\r"))
        except _Problem as exc:
            raise HostfileError(f"{where}: {exc}") from None
        if parsed is None:
            continue
        rank, host, relative, slot = parsed
        if rank in found:
            raise HostfileError(f"{where}: rank {rank} is already assigned at {found[rank].origin}")
        found[rank] = RankEntry(rank, host, relative, slot, where)
    if not found:
        raise HostfileError(f"rankfile {shown}: contains no ranks")
    return [found[r] for r in sorted(found)]


def parse_rankfile(path: str) -> List[RankEntry]:
    """Read and parse the rankfile at ``path`` (at most ``MAX_FILE_BYTES``)."""
    return parse_rankfile_text(read_host_file(path, "rankfile"), path)


def missing_ranks(entries: Iterable[RankEntry], size: int) -> List[int]:
    """The ranks below ``size`` that no entry assigns, in order.

    (Entries for ranks at or above ``size`` are the caller's to judge.)
    """
    have = {e.rank for e in entries}
    return [r for r in range(size) if r not in have]
