"""Hydra's output patterns: ``-prepend-pattern``, ``-outfile-pattern`` and
``-errfile-pattern`` name a rank's prefix and files with ``%r`` (its rank),
``%h`` (its host's name), ``%p`` (its host's index in the job, Hydra's proxy)
and ``%g`` (its job, 0 for the first: Hydra's process group); ``%%`` is
``%``.  Any other ``%`` is refused when the line is read, where Hydra fails
the job once the rank writes.
"""

from __future__ import annotations

from ..core.errors import UsageError, one_line

_KEYS = "rhpg%"


def check_pattern(flag: str, text: str) -> str:
    """``text``, if it is a pattern of Hydra's."""
    at = 0
    while True:
        at = text.find("%", at)
        if at < 0:
            return text
        key = text[at + 1:at + 2]
        if not key:
            raise UsageError(f"{flag} {one_line(text, 80)!r}: a '%' ends it (a '%' of its "
                             f"own is '%%')")
        if key not in _KEYS:
            raise UsageError(f"{flag} {one_line(text, 80)!r}: unknown pattern "
                             f"'%{key}' (known: %r rank, %h host, %p host index, "
                             f"%g job, %% a '%')")
        at += 2


def expand(pattern: str, *, rank: int, host: str, node: int, job: int) -> str:
    """``pattern`` (checked) for one rank of job ``job`` (1 for the first)."""
    import re
    values = {"r": str(rank), "h": host, "p": str(node), "g": str(job - 1), "%": "%"}
    return re.sub("%(.)", lambda m: values[m.group(1)], pattern, flags=re.DOTALL)
