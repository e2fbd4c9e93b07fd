"""The lines of a failed rank's stderr shown under the failure summary.

The last lines of a stream are what a C program's failure needs.  A Python
rank's are its traceback, whose last ten lines can all be frames of the
libraries it called (torch, jax, mpi4py) while the line of the user's own
code that called them is further up.  When the end of the stream is a
traceback longer than the lines shown, :func:`shown_tail` keeps, in order:
the ``Traceback (most recent call last):`` line, the last frame of the
user's own code (a file outside ``site-packages``, ``dist-packages`` and the
standard library), the innermost frame (where it raised), and the exception
to its end; a ``... N frames ...`` line stands for each run of frames left
out.  A traceback raised while handling another (``During handling of the
above exception...``) is preceded by the last line of that other exception,
often the first cause.  Anything else is the last lines, as before.

What is shown is mslaunch's own message, printable whatever the rank wrote:
terminal colours are left out, a line rewritten with carriage returns (a
progress bar) is what a terminal showed last, other control characters are
escaped (``\\x07``), and a line is cut at :data:`LINE_CHARS` characters.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import List, Optional, Tuple

#: Lines shown of a stream that is not a long traceback.
TAIL_LINES = 10
#: Lines shown of a traceback's exception (its message can be long).
EXCEPTION_LINES = 8
#: Characters shown of one line (a rank may write a blob with no newline).
LINE_CHARS = 500

_HEADER = "Traceback (most recent call last):"
_CHAINED = ("During handling of the above exception, another exception occurred:",
            "The above exception was the direct cause of the following exception:")
_LIBRARY = ("/site-packages/", "/dist-packages/", "/lib/python3", "/lib64/python3", "<frozen ",
            "<string>")


def _frames(lines: List[str], start: int) -> Tuple[List[Tuple[int, int]], int]:
    """The frames after a traceback's header at ``start``, as ``(first, end)`` line
    spans, and the index of the first line after them (the exception)."""
    frames: List[Tuple[int, int]] = []
    i = start + 1
    while i < len(lines):
        line = lines[i]
        if line.startswith('  File "'):
            frames.append((i, i + 1))
        elif frames and line.startswith("    "):           # its code, its ^^^^ marks
            frames[-1] = (frames[-1][0], i + 1)
        elif line.startswith("  [Previous line repeated"):
            frames.append((i, i + 1))
        else:
            break
        i += 1
    return frames, i


def _is_users(line: str) -> bool:
    if not line.startswith('  File "'):
        return False
    path = line[len('  File "'):].split('"', 1)[0]
    return not any(part in path for part in _LIBRARY)


def _weight(line: str) -> int:
    """How many frames a frame's line stands for ("[Previous line repeated 9 more times]")."""
    if line.startswith("  [Previous line repeated"):
        words = line.split()
        return int(words[3]) if len(words) > 3 and words[3].isdigit() else 1
    return 1


def _short_traceback(lines: List[str], start: int, limit: int) -> Optional[List[str]]:
    """The traceback at ``lines[start]`` shortened as the module says; None if
    it is short enough whole, or holds no frame of the user's."""
    frames, after = _frames(lines, start)
    if not frames or len(lines) - start <= limit:
        return None
    exception = lines[after:]
    if len(exception) > EXCEPTION_LINES:
        exception = ["    ..."] + exception[-EXCEPTION_LINES:]
    mine = [k for k, (first, _) in enumerate(frames) if _is_users(lines[first])]
    keep = sorted({mine[-1], len(frames) - 1} if mine else {len(frames) - 1})
    out = [lines[start]]
    shown = -1
    for k in keep:
        if k - shown > 1:
            left = sum(_weight(lines[frames[j][0]]) for j in range(shown + 1, k))
            out.append(f"  ... {left} frame{'s' if left > 1 else ''} not shown ...")
        first, end = frames[k]
        out.extend(lines[first:end])
        shown = k
    return out + exception


def _plain(text: str) -> List[str]:
    """The lines of a stream as the module says (a rank on a pseudo-terminal ends
    lines with CR LF; Python 3.13 colours tracebacks there)."""
    import re
    if "\x1b" in text:
        text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)
    lines = [line.rstrip("\r").rsplit("\r", 1)[-1]
             for line in text.rstrip("\r\n").split("\n")]
    if not all(line.isprintable() for line in lines):
        control = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
        lines = [control.sub(lambda m: f"\\x{ord(m.group()):02x}", line) for line in lines]
    return [line if len(line) <= LINE_CHARS else
            f"{line[:LINE_CHARS]}... ({len(line) - LINE_CHARS} more characters)"
            for line in lines]


def _cause(lines: List[str], start: int) -> List[str]:
    """For a traceback at ``start`` raised while handling another exception: the
    last line of that exception and the line that says so ([] if none)."""
    k = start - 1
    while k >= 0 and not lines[k].strip():
        k -= 1
    if k < 0 or lines[k] not in _CHAINED:
        return []
    said = k - 1
    while said >= 0 and not lines[said].strip():
        said -= 1
    before = [lines[said], *_blank(lines, said + 1, k)] \
        if said >= 0 and not lines[said].startswith(" ") else []
    return before + [lines[k], *_blank(lines, k + 1, start)]


def _blank(lines: List[str], first: int, end: int) -> List[str]:
    """The first blank line of ``lines[first:end]``, if any (as a list)."""
    return [line for line in lines[first:end] if not line.strip()][:1]


def shown_tail(text: str, limit: int = TAIL_LINES) -> List[str]:
    """The lines of a failed rank's stream to show (see the module's docstring)."""
    lines = _plain(text)
    start = max((k for k, line in enumerate(lines) if line.startswith(_HEADER)), default=-1)
    cause = _cause(lines, start) if start > 0 else []
    if cause:
        return cause + (_short_traceback(lines, start, limit) or lines[start:][-limit:])
    if start >= 0:
        short = _short_traceback(lines, start, limit)
    else:
        # The header was cut off (the stream's end is kept, not all of it):
        # a traceback's frames may still be there.
        first = next((k for k, line in enumerate(lines) if line.startswith('  File "')), -1)
        short = None if first < 0 else _short_traceback([_HEADER] + lines[first:], 0, limit)
    return short if short is not None else lines[-limit:]
