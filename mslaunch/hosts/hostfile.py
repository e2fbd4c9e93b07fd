"""Host lists written by the user: hostfiles and ``-H``/``-hosts`` lists.

Every source yields :class:`~mslaunch.core.spec.HostEntry` items in order of first
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

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Optional, Tuple

from ..core.errors import HostfileError, UsageError
from ..core.spec import HostEntry

__all__ = [
    "MAX_COUNT",
    "MAX_HOSTS",
    "parse_hostfile",
    "parse_hostfile_text",
    "parse_host_list",
]

#: Largest slot count (per line and per host after merging) that is accepted.
MAX_COUNT = 2**31 - 1
#: Largest number of hosts a hostfile, a Slurm nodelist or a tasks list may
#: give (as many as the largest job has ranks).
MAX_HOSTS = 100_000
#: Largest hostfile (or PBS_NODEFILE) that is read, in bytes.
MAX_FILE_BYTES = 16 << 20

# The grammar of names and counts is checked by hand: ``re`` (with ``enum``)
# costs a launch inside an allocation 10 ms or more before its first host
# starts.  A property test holds each check to the regular expression it
# stands for, noted beside it.
_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_NAME_FIRST = frozenset(_LETTERS + "0123456789_")
_NAME_CHARS = _NAME_FIRST | frozenset(".-")
_V6_CHARS = frozenset("0123456789ABCDEFabcdef:.")


def _is_hostname(name: str) -> bool:
    """``[A-Za-z0-9_][A-Za-z0-9_.\\-]*``."""
    return bool(name) and name[0] in _NAME_FIRST and _NAME_CHARS.issuperset(name)


def _is_ipv6_text(name: str) -> bool:
    """``[0-9A-Fa-f:.]+(?:%[A-Za-z0-9_.\\-]+)?``."""
    address, percent, scope = name.partition("%")
    return bool(address) and _V6_CHARS.issuperset(address) and \
        (not percent or (bool(scope) and _NAME_CHARS.issuperset(scope)))


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


def _x(text: str, limit: int = 40) -> str:
    """A short, printable, quoted excerpt of input for a message.

    The input may come from a file the user did not mean to show (a
    mistyped ``--hostfile /etc/shadow``), so messages never echo more than
    a few characters of it.
    """
    if len(text) > limit:
        return repr(text[:limit]) + "..."
    return repr(text)


def _show_path(path: str) -> str:
    """The file name as shown in messages (quoted if it could break the line)."""
    return path if path.isprintable() else repr(path)


def _is_digits(text: str) -> bool:
    """True for a non-empty string of ASCII digits only (``[0-9]+``)."""
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
        return f"host name is longer than {_MAX_NAME} characters: {_x(name)}"
    if bracketed:
        if name.count(":") < 2 or not _is_ipv6_text(name):
            return f"invalid IPv6 address {_x('[' + name + ']')}"
        return None
    if not _is_hostname(name):
        user, at, host = name.rpartition("@")
        if at and user and _is_hostname(host):
            return (f"{_x(name)}: a user in a host's name is not served; "
                    f"{_HYDRA_HINTS['user']} (Host {_x(host)[1:-1]} / User ...)")
        return (
            f"invalid host name {_x(name)} "
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
            raise _Problem(f"missing ']' in {_x(token)}")
        name, rest = token[1:end], token[end + 1:]
        if rest and not rest.startswith(":"):
            raise _Problem(f"unexpected text after ']' in {_x(token)}")
        problem = _name_problem(name, bracketed=True)
        if problem:
            raise _Problem(problem)
        return name, (rest[1:] if rest else None)
    if token.count(":") > 1:
        raise _Problem(f"IPv6 addresses must be written in brackets, e.g. '[::1]:2'; got {_x(token)}")
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
        raise _Problem(f"expected a host name before {_x(first)}")
    name, raw = _split_host(first)
    slots: Optional[int] = None
    slots_key = ""
    if raw is not None:
        slots = _count(raw)
        if slots is None:
            raise _Problem(f"slot count after ':' must be a positive integer, got {_x(raw)}")
        slots_key = first
    max_slots: Optional[int] = None
    for tok in tokens[1:]:
        key, eq, value = tok.partition("=")
        lkey = key.lower()
        if lkey in _HYDRA_HINTS:
            raise _Problem(f"token {_x(tok)} is not supported ({_HYDRA_HINTS[lkey]})")
        if lkey not in _SLOTS_KEYS and lkey not in _MAX_KEYS:
            raise _Problem(f"unknown token {_x(tok)} (expected slots=N or max_slots=M)")
        if not eq:
            raise _Problem(f"missing value for {_x(key)} (expected {key}=N)")
        number = _count(value)
        if number is None:
            limit = f" no larger than {MAX_COUNT}" if _is_digits(value) and value.strip("0") else ""
            raise _Problem(f"{key} must be a positive integer{limit}, got {_x(value)}")
        if lkey in _SLOTS_KEYS:
            if slots is not None:
                raise _Problem(f"slot count given twice ({_x(slots_key)} and {_x(tok)})")
            slots, slots_key = number, tok
        else:
            if max_slots is not None:
                raise _Problem(f"max_slots given twice (second: {_x(tok)})")
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
            f"host {_x(name)} {what} (list a host once per slot or give its slots=N, not both)"
        )
    entry.lines += 1
    entry.total += slots or 0
    if max_slots is not None:
        if entry.max_slots is not None and entry.max_slots != max_slots:
            raise _Problem(
                f"conflicting max_slots for host {_x(name)}: {max_slots} here, "
                f"{entry.max_slots} at {entry.max_origin}"
            )
        if entry.max_slots is None:
            entry.max_slots, entry.max_origin = max_slots, where
    total = entry.slots
    if total is not None and total > MAX_COUNT:
        raise _Problem(f"host {_x(name)} has more than {MAX_COUNT} slots in total")
    if entry.lines > 1 and total is not None and entry.max_slots is not None \
            and total > entry.max_slots:
        raise _Problem(
            f"host {_x(name)} has {total} slots in total, more than "
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
                if len(acc) > MAX_HOSTS:
                    raise _Problem(f"more than {MAX_HOSTS} hosts")
        except _Problem as exc:
            raise HostfileError(f"{where}: {exc}") from None
    if not acc:
        raise HostfileError(f"hostfile {shown}: contains no hosts")
    return [HostEntry(name, e.slots, e.max_slots, e.origin) for name, e in acc.items()]


def parse_hostfile(path: str) -> List[HostEntry]:
    """Read and parse the hostfile at ``path`` (see the module docstring)."""
    return parse_hostfile_text(read_host_file(path, "hostfile"), path)


def read_host_file(path: str, what: str, sep: str = " ") -> str:
    """The text of a host list file, at most :data:`MAX_FILE_BYTES` of it."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise HostfileError(f"{what}{sep}{_show_path(path)}: cannot read: {reason}") from None
    except ValueError as exc:  # e.g. an embedded NUL byte in the path
        raise HostfileError(f"{what}{sep}{_show_path(path)}: cannot read: {exc}") from None
    if len(data) > MAX_FILE_BYTES:
        raise HostfileError(f"{what}{sep}{_show_path(path)}: larger than {MAX_FILE_BYTES >> 20} MiB; "
                            f"not a host list")
    return data.decode("utf-8", "replace")


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
            raise UsageError(f"{flag}: empty item in host list {_x(text)}")
        try:
            name, raw = _split_host(item)
        except _Problem as exc:
            raise UsageError(f"{flag}: {exc}") from None
        slots = 1
        if raw is not None:
            slots = _count(raw) or 0
            if not slots:
                raise UsageError(f"{flag}: bad slot count {_x(raw)} for host {_x(name)}")
        total = order.get(name, 0) + slots
        if total > MAX_COUNT:
            raise UsageError(f"{flag}: host {_x(name)} has more than {MAX_COUNT} slots in total")
        order[name] = total
    return [HostEntry(name, slots, None, flag) for name, slots in order.items()]
