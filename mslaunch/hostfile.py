"""Host lists: hostfiles, ``-H``/``-hosts`` lists and resource-manager allocations.

Every source yields :class:`~mslaunch.spec.HostEntry` items in order of first
appearance, one per distinct host name.  ``slots`` is None only when a hostfile
gave no count (the planner then uses the core count for the local host and 1
for any other host).

Hostfile grammar (:func:`parse_hostfile`), one host per line, either form on any
line of the same file:

* Open MPI: ``host [slots=N] [max_slots=M]``.  ``count=`` and ``cpu=`` are
  synonyms of ``slots=``, ``max-slots=`` of ``max_slots=``; keys are matched
  case-insensitively and spaces around ``=`` are allowed (``node01 slots = 4``).
* Hydra/MPICH: ``host[:N]``.  Hydra's optional ``user=U`` and ``binding=...``
  tokens are *rejected* with an error that says what to use instead
  (``~/.ssh/config`` for the user, ``--bind-to`` for binding): mslaunch has no
  per-host user or binding, and silently dropping them would hide that.

``#`` starts a comment anywhere on a line; blank lines are ignored.  Lines for
the same host merge into one entry at the position of its first line (unlike
Hydra, which merges only adjacent lines).  Counts on repeated lines add up; a
host repeated k times without counts gets k slots (None when k == 1); mixing the
two styles for one host is an error, as in Open MPI.  Counts are integers from
1 to :data:`MAX_COUNT`.  IPv6 addresses must be bracketed (``[::1]:2``); the
entry's name is the bare address (``::1``).  A file with no hosts is an error.

All errors are one line.  Hostfile errors read ``FILE:LINE: problem``; a file
that cannot be read or holds no hosts gives ``hostfile FILE: problem``.
"""

from __future__ import annotations

import os
import re
from functools import lru_cache
from typing import Dict, List, Mapping, Optional, Tuple

from .errors import HostfileError, UsageError
from .spec import HostEntry

__all__ = [
    "MAX_COUNT",
    "MAX_HOSTS",
    "parse_hostfile",
    "parse_hostfile_text",
    "parse_host_list",
    "expand_nodelist",
    "expand_tasks_per_node",
    "allocation_hosts",
    "is_local_host",
]

#: Largest slot count (per line and per host after merging) that is accepted.
MAX_COUNT = 2**31 - 1
#: Largest number of names a Slurm nodelist / tasks list may expand to.
MAX_HOSTS = 1_000_000

# Patterns are kept as strings and compiled on first use (through the cache of
# the ``re`` module) so that importing this module compiles nothing.
_HOSTNAME_PAT = r"[A-Za-z0-9_][A-Za-z0-9_.\-]*"
_IPV6_PAT = r"[0-9A-Fa-f:.]+(?:%[A-Za-z0-9_.\-]+)?"
_GROUP_PAT = r"\[([^\]]*)\]"
_RANGE_PAT = r"([0-9]+)(?:-([0-9]+))?"
_TASKS_PAT = r"([0-9]+)(?:\(x([0-9]+)\))?"
_MAX_NAME = 253
_MAX_DIGITS = 18

_SLOTS_KEYS = ("slots", "count", "cpu")
_MAX_KEYS = ("max_slots", "max-slots")
_HYDRA_HINTS = {
    "user": "set a per-host user in ~/.ssh/config",
    "username": "set a per-host user in ~/.ssh/config",
    "binding": "use --bind-to",
}


class _Problem(Exception):
    """Internal: a problem description that the caller prefixes."""


# ---------------------------------------------------------------------------
# shared helpers


def _show_path(path: str) -> str:
    """The file name as shown in messages (quoted if it could break the line)."""
    return path if path.isprintable() else repr(path)


def _is_digits(text: str) -> bool:
    """True for a non-empty string of ASCII digits only."""
    return text.isascii() and text.isdigit()


def _count(text: str) -> Optional[int]:
    """``text`` as a slot count in 1..MAX_COUNT, or None if it is not one."""
    if len(text) > 10 or not _is_digits(text):
        return None
    value = int(text)
    return value if 1 <= value <= MAX_COUNT else None


def _name_problem(name: str, bracketed: bool = False) -> Optional[str]:
    """Why ``name`` is not an acceptable host name, or None if it is fine."""
    if not name:
        return "empty host name"
    if len(name) > _MAX_NAME:
        return f"host name is longer than {_MAX_NAME} characters: {name!r}"
    if bracketed:
        if name.count(":") < 2 or not re.fullmatch(_IPV6_PAT, name):
            return f"invalid IPv6 address {'[' + name + ']'!r}"
        return None
    if not re.fullmatch(_HOSTNAME_PAT, name):
        return (
            f"invalid host name {name!r} "
            "(use letters, digits, '-', '_', '.', or [IPv6] in brackets)"
        )
    return None


def _split_host(token: str) -> Tuple[str, Optional[str]]:
    """Split ``host[:N]`` / ``[v6addr][:N]`` into a checked name and the raw count.

    Raises :class:`_Problem` for a bad name; the count is not checked here.
    """
    if token.startswith("["):
        end = token.find("]")
        if end < 0:
            raise _Problem(f"missing ']' in {token!r}")
        name, rest = token[1:end], token[end + 1:]
        if rest and not rest.startswith(":"):
            raise _Problem(f"unexpected text after ']' in {token!r}")
        problem = _name_problem(name, bracketed=True)
        if problem:
            raise _Problem(problem)
        return name, (rest[1:] if rest else None)
    if token.count(":") > 1:
        raise _Problem(f"IPv6 addresses must be written in brackets, e.g. '[::1]:2'; got {token!r}")
    name, sep, count = token.partition(":")
    problem = _name_problem(name)
    if problem:
        raise _Problem(problem)
    return name, (count if sep else None)


# ---------------------------------------------------------------------------
# hostfiles


class _Acc:
    """Merge state of one host while a hostfile is read."""

    __slots__ = ("origin", "explicit", "total", "lines", "max_slots", "max_origin")

    def __init__(self, origin: str, explicit: bool) -> None:
        self.origin = origin
        self.explicit = explicit
        self.total = 0          # sum of explicit counts
        self.lines = 0          # number of lines naming the host
        self.max_slots: Optional[int] = None
        self.max_origin = ""

    @property
    def slots(self) -> Optional[int]:
        if self.explicit:
            return self.total
        return self.lines if self.lines > 1 else None


def _parse_line(line: str) -> Optional[Tuple[str, Optional[int], Optional[int]]]:
    """One hostfile line → ``(name, slots, max_slots)``, or None if it is empty."""
    line = line.split("#", 1)[0]
    if not line.strip():
        return None
    tokens: List[str] = []
    for tok in line.split():          # glue "slots = 4" into "slots=4"
        if tokens and (tok.startswith("=") or tokens[-1].endswith("=")):
            tokens[-1] += tok
        else:
            tokens.append(tok)
    first = tokens[0]
    if "=" in first:
        raise _Problem(f"expected a host name before {first!r}")
    name, raw = _split_host(first)
    slots: Optional[int] = None
    slots_key = ""
    if raw is not None:
        slots = _count(raw)
        if slots is None:
            raise _Problem(f"slot count after ':' must be a positive integer, got {raw!r}")
        slots_key = first
    max_slots: Optional[int] = None
    for tok in tokens[1:]:
        key, eq, value = tok.partition("=")
        lkey = key.lower()
        if lkey in _HYDRA_HINTS:
            raise _Problem(f"token {tok!r} is not supported ({_HYDRA_HINTS[lkey]})")
        if lkey not in _SLOTS_KEYS and lkey not in _MAX_KEYS:
            raise _Problem(f"unknown token {tok!r} (expected slots=N or max_slots=M)")
        if not eq:
            raise _Problem(f"missing value for {key!r} (expected {key}=N)")
        number = _count(value)
        if number is None:
            limit = f" no larger than {MAX_COUNT}" if _is_digits(value) and value.strip("0") else ""
            raise _Problem(f"{key} must be a positive integer{limit}, got {value!r}")
        if lkey in _SLOTS_KEYS:
            if slots is not None:
                raise _Problem(f"slot count given twice ({slots_key!r} and {tok!r})")
            slots, slots_key = number, tok
        else:
            if max_slots is not None:
                raise _Problem(f"max_slots given twice (second: {tok!r})")
            max_slots = number
    if slots is not None and max_slots is not None and max_slots < slots:
        raise _Problem(f"max_slots must be >= slots, got slots={slots} max_slots={max_slots}")
    return name, slots, max_slots


def _merge(acc: Dict[str, _Acc], name: str, slots: Optional[int],
           max_slots: Optional[int], where: str) -> None:
    """Fold one line into the per-host state; raises :class:`_Problem`."""
    entry = acc.get(name)
    if entry is None:
        entry = acc[name] = _Acc(where, slots is not None)
    elif entry.explicit != (slots is not None):
        if slots is not None:
            what = f"has a slot count here but no count at {entry.origin}"
        else:
            what = f"has no slot count here but a count at {entry.origin}"
        raise _Problem(
            f"host {name!r} {what} (list a host once per slot or give its slots=N, not both)"
        )
    entry.lines += 1
    entry.total += slots or 0
    if max_slots is not None:
        if entry.max_slots is not None and entry.max_slots != max_slots:
            raise _Problem(
                f"conflicting max_slots for host {name!r}: {max_slots} here, "
                f"{entry.max_slots} at {entry.max_origin}"
            )
        if entry.max_slots is None:
            entry.max_slots, entry.max_origin = max_slots, where
    total = entry.slots
    if total is not None and total > MAX_COUNT:
        raise _Problem(f"host {name!r} has more than {MAX_COUNT} slots in total")
    if entry.lines > 1 and total is not None and entry.max_slots is not None \
            and total > entry.max_slots:
        raise _Problem(
            f"host {name!r} has {total} slots in total, more than "
            f"max_slots={entry.max_slots} (set at {entry.max_origin})"
        )


def parse_hostfile_text(text: str, filename: str = "<hostfile>") -> List[HostEntry]:
    """Parse hostfile contents; ``filename`` is used in messages and origins."""
    shown = _show_path(filename)
    acc: Dict[str, _Acc] = {}
    for number, line in enumerate(text.split("\n"), 1):
        where = f"{shown}:{number}"
        try:
            parsed = _parse_line(line.rstrip("\r"))
            if parsed is not None:
                _merge(acc, *parsed, where)
        except _Problem as exc:
            raise HostfileError(f"{where}: {exc}") from None
    if not acc:
        raise HostfileError(f"hostfile {shown}: contains no hosts")
    return [HostEntry(name, e.slots, e.max_slots, e.origin) for name, e in acc.items()]


def parse_hostfile(path: str) -> List[HostEntry]:
    """Read and parse the hostfile at ``path`` (see the module docstring)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            text = fh.read()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise HostfileError(f"hostfile {_show_path(path)}: cannot read: {reason}") from None
    except ValueError as exc:  # e.g. an embedded NUL byte in the path
        raise HostfileError(f"hostfile {_show_path(path)}: cannot read: {exc}") from None
    return parse_hostfile_text(text, path)


# ---------------------------------------------------------------------------
# -H / -hosts


def parse_host_list(text: str, flag: str = "-H") -> List[HostEntry]:
    """Parse ``h1:4,h2`` as given to ``-H`` (or Hydra's ``-hosts``).

    A bare host has 1 slot; repeated hosts add up at the first position.
    Errors are :class:`UsageError` messages naming ``flag``.
    """
    if not text.strip():
        raise UsageError(f"{flag}: empty host list")
    order: Dict[str, int] = {}
    for item in text.split(","):
        item = item.strip()
        if not item:
            raise UsageError(f"{flag}: empty item in host list {text!r}")
        try:
            name, raw = _split_host(item)
        except _Problem as exc:
            raise UsageError(f"{flag}: {exc}") from None
        slots = 1
        if raw is not None:
            slots = _count(raw) or 0
            if not slots:
                raise UsageError(f"{flag}: bad slot count {raw!r} for host {name!r}")
        total = order.get(name, 0) + slots
        if total > MAX_COUNT:
            raise UsageError(f"{flag}: host {name!r} has more than {MAX_COUNT} slots in total")
        order[name] = total
    return [HostEntry(name, slots, None, flag) for name, slots in order.items()]


# ---------------------------------------------------------------------------
# Slurm


def _expand_group(body: str, expr: str, var: str) -> List[str]:
    """``01-03,7`` → ``['01', '02', '03', '7']`` (width from the lower bound)."""
    out: List[str] = []
    for item in body.split(","):
        m = re.fullmatch(_RANGE_PAT, item)
        if not m or len(m.group(1)) > _MAX_DIGITS or len(m.group(2) or "") > _MAX_DIGITS:
            raise HostfileError(
                f"{var}: bad range {item!r} in {expr!r} (expected N or N-M, digits only)"
            )
        lo_text, hi_text = m.group(1), m.group(2)
        if hi_text is None:
            out.append(lo_text)
            continue
        lo, hi = int(lo_text), int(hi_text)
        if hi < lo:
            raise HostfileError(f"{var}: reversed range {item!r} in {expr!r}")
        if hi - lo >= MAX_HOSTS or len(out) + hi - lo >= MAX_HOSTS:
            raise HostfileError(f"{var}: {expr!r} expands to more than {MAX_HOSTS} hosts")
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
                raise HostfileError(f"{var}: nested '[' in {expr!r}")
            depth = 1
        elif ch == "]":
            if not depth:
                raise HostfileError(f"{var}: unbalanced ']' in {expr!r}")
            depth = 0
        elif ch == "," and not depth:
            parts.append(expr[start:i])
            start = i + 1
    if depth:
        raise HostfileError(f"{var}: unbalanced '[' in {expr!r}")
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
            raise HostfileError(f"{var}: empty host name in {expr!r}")
        # Alternate literal text and bracket groups: lit [grp] lit [grp] lit
        pieces = re.split(_GROUP_PAT, part)
        choices: List[List[str]] = []
        size = 1
        for index, piece in enumerate(pieces):
            if index % 2 == 0:
                choices.append([piece])
                continue
            if not piece:
                raise HostfileError(f"{var}: empty brackets in {expr!r}")
            group = _expand_group(piece, expr, var)
            size *= len(group)
            if len(names) + size > MAX_HOSTS:
                raise HostfileError(f"{var}: {expr!r} expands to more than {MAX_HOSTS} hosts")
            choices.append(group)
        expanded = [""]
        for options in choices:
            expanded = [head + tail for head in expanded for tail in options]
        for name in expanded:
            problem = _name_problem(name)
            if problem:
                raise HostfileError(f"{var}: {problem} in {expr!r}")
        names.extend(expanded)
    return names


def expand_tasks_per_node(expr: str, var: str = "SLURM_TASKS_PER_NODE") -> List[int]:
    """Expand Slurm's compressed count list: ``2(x3),1`` → ``[2, 2, 2, 1]``."""
    out: List[int] = []
    if not expr.strip():
        raise HostfileError(f"{var}: empty count list")
    for item in expr.split(","):
        m = re.fullmatch(_TASKS_PAT, item.strip())
        value = _count(m.group(1)) if m else None
        times = _count(m.group(2)) if m and m.group(2) is not None else 1
        if value is None or times is None:
            raise HostfileError(
                f"{var}: bad item {item!r} in {expr!r} (expected N or N(xM), N and M >= 1)"
            )
        if len(out) + times > MAX_HOSTS:
            raise HostfileError(f"{var}: {expr!r} expands to more than {MAX_HOSTS} counts")
        out.extend([value] * times)
    return out


# ---------------------------------------------------------------------------
# allocations


def _merge_counts(pairs: List[Tuple[str, int, str]]) -> List[HostEntry]:
    """``(name, slots, origin)`` triples merged by name, first position kept."""
    merged: Dict[str, List] = {}
    for name, slots, origin in pairs:
        if name in merged:
            merged[name][0] += slots
        else:
            merged[name] = [slots, origin]
    return [HostEntry(name, slots, None, origin) for name, (slots, origin) in merged.items()]


def _slurm_hosts(environ: Mapping[str, str], nvar: str) -> Tuple[List[HostEntry], str]:
    nval = environ[nvar]
    names = expand_nodelist(nval, nvar)
    for cvar in ("SLURM_TASKS_PER_NODE", "SLURM_JOB_CPUS_PER_NODE"):
        cval = environ.get(cvar, "")
        if cval.strip():
            counts = expand_tasks_per_node(cval, cvar)
            if len(counts) != len(names):
                raise HostfileError(
                    f"{cvar}={cval!r} gives {len(counts)} counts but "
                    f"{nvar}={nval!r} lists {len(names)} hosts"
                )
            source = f"Slurm allocation ({nvar}={nval}, {cvar}={cval})"
            break
    else:
        counts = [1] * len(names)
        source = f"Slurm allocation ({nvar}={nval}, 1 slot per node)"
    entries = _merge_counts([(n, c, nvar) for n, c in zip(names, counts)])
    return entries, source


def _pbs_hosts(path: str) -> Tuple[List[HostEntry], str]:
    shown = _show_path(path)
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            text = fh.read()
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        raise HostfileError(f"PBS_NODEFILE={shown}: cannot read: {reason}") from None
    pairs: List[Tuple[str, int, str]] = []
    for number, line in enumerate(text.split("\n"), 1):
        name = line.split("#", 1)[0].strip()
        if not name:
            continue
        problem = _name_problem(name)
        if problem:
            raise HostfileError(f"{shown}:{number}: {problem} (from PBS_NODEFILE)")
        pairs.append((name, 1, f"{shown}:{number}"))
    if not pairs:
        raise HostfileError(f"PBS_NODEFILE={shown}: lists no hosts")
    return _merge_counts(pairs), f"PBS allocation (PBS_NODEFILE={shown})"


def allocation_hosts(environ: Mapping[str, str]) -> Optional[Tuple[List[HostEntry], str]]:
    """The hosts of a Slurm or PBS/Torque allocation, with a description.

    Slurm (``SLURM_JOB_NODELIST`` or ``SLURM_NODELIST``) wins over PBS
    (``PBS_NODEFILE``).  Slot counts come from ``SLURM_TASKS_PER_NODE``, else
    ``SLURM_JOB_CPUS_PER_NODE``, else 1 per node; for PBS, a host's count is
    the number of lines naming it.  Returns None when no allocation is present.
    """
    for nvar in ("SLURM_JOB_NODELIST", "SLURM_NODELIST"):
        if environ.get(nvar, "").strip():
            return _slurm_hosts(environ, nvar)
    path = environ.get("PBS_NODEFILE", "")
    if path:
        return _pbs_hosts(path)
    return None


# ---------------------------------------------------------------------------
# local host detection

_ETC_HOSTS = "/etc/hosts"
_LOOPBACK_NAMES = frozenset({
    "localhost", "localhost.localdomain", "localhost6", "localhost6.localdomain6",
    "ip6-localhost", "ip6-loopback",
})


@lru_cache(maxsize=1)
def _local_names() -> frozenset:
    """This machine's names, lower-cased: hostname, short form, full form.

    The full name is taken from ``/etc/hosts`` lines that also list the
    hostname; no resolver call is made (they can hang on a broken DNS).
    """
    import socket

    raw = {socket.gethostname()}
    uname = getattr(os, "uname", None)
    if uname is not None:
        raw.add(uname().nodename)
    names = {n.lower().rstrip(".") for n in raw if n}
    shorts = {n.split(".", 1)[0] for n in names}
    names |= shorts
    try:
        with open(_ETC_HOSTS, encoding="utf-8", errors="replace") as fh:
            lines = fh.read().split("\n")
    except OSError:
        lines = []
    found = set()
    for line in lines:
        aliases = [a.lower().rstrip(".") for a in line.split("#", 1)[0].split()[1:]]
        if names.intersection(aliases):
            found.update(a for a in aliases if a.split(".", 1)[0] in shorts)
    names |= found
    names.discard("")
    return frozenset(names)


def _is_loopback_v4(name: str) -> bool:
    parts = name.split(".")
    if len(parts) != 4:
        return False
    for part in parts:
        if not (1 <= len(part) <= 3 and _is_digits(part)) or int(part) > 255:
            return False
    return parts[0] == "127"


def is_local_host(name: str) -> bool:
    """True if ``name`` denotes this machine, judged without any DNS lookup.

    Loopback names and addresses (127.0.0.0/8, ``::1``, also bracketed), this
    machine's hostname in short or full form (compared case-insensitively),
    and the IPv4 addresses of its interfaces.
    """
    n = name.strip().lower()
    if n.startswith("[") and n.endswith("]"):
        n = n[1:-1]
    if n.endswith(".") and not n.endswith(".."):
        n = n[:-1]
    if not n:
        return False
    if n in _LOOPBACK_NAMES or _is_loopback_v4(n):
        return True
    if ":" in n:
        import ipaddress

        try:
            addr = ipaddress.IPv6Address(n.split("%", 1)[0])
        except ValueError:
            return False
        mapped = addr.ipv4_mapped
        return addr.is_loopback or (mapped is not None and mapped.is_loopback)
    if n in _local_names():
        return True
    return n[:1].isdigit() and n in _local_ipv4_addresses()


@lru_cache(maxsize=1)
def _local_ipv4_addresses() -> frozenset:
    """This machine's IPv4 addresses, from the kernel's routing trie (no DNS)."""
    found = set()
    try:
        with open("/proc/net/fib_trie") as f:
            previous = ""
            for line in f:
                if line.strip() == "/32 host LOCAL":
                    found.add(previous.strip().lstrip("|-+` ").strip())
                previous = line
    except OSError:
        pass
    return frozenset(found)
