"""Host names said briefly: ``h1-h8, login2`` for h1, h2, ... h8 and login2.

Names that differ only in a trailing number, with the same width when
zero-padded (``node007``), make runs; every name is still there to read.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, Iterable, List, Tuple


def _split(name: str) -> Tuple[str, str]:
    """(the name up to its trailing digits, the digits)."""
    end = len(name)
    while end and name[end - 1].isdigit():
        end -= 1
    return name[:end], name[end:]


def host_ranges(names: Iterable[str]) -> str:
    """``names`` (in any order, repeats dropped) as a comma-separated list in which
    runs of consecutive numbers are ``first-last``."""
    seen = list(dict.fromkeys(names))
    groups: Dict[Tuple[str, int], List[int]] = {}
    plain: List[str] = []
    for name in seen:
        stem, digits = _split(name)
        if not digits or not stem:
            plain.append(name)
            continue
        width = len(digits) if digits.startswith("0") and len(digits) > 1 else 0
        groups.setdefault((stem, width), []).append(int(digits))
    parts: List[Tuple[str, str]] = []    # (sort key, text)
    for (stem, width), numbers in groups.items():
        runs: List[List[int]] = []
        for n in sorted(set(numbers)):
            if runs and n == runs[-1][1] + 1:
                runs[-1][1] = n
            else:
                runs.append([n, n])
        for start, end in runs:
            first, last = f"{stem}{start:0{width}d}", f"{stem}{end:0{width}d}"
            text = first if start == end else f"{first}-{last}" if end - start > 1 \
                else f"{first}, {last}"
            parts.append((f"{stem}\0{start:012d}", text))
    parts += [(name, name) for name in plain]
    return ", ".join(text for _, text in sorted(parts))
