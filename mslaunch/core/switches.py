"""mslaunch's own on/off environment variables: which there are, what they accept.

:func:`check_switches` runs first on every command line, so that a value
that is neither on nor off is one clear error rather than a guess; the
stages that read a switch later (:func:`switch`) then know its value is good.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Mapping, Optional, Tuple

#: Each switch and its value when unset (or set to the empty string).
SWITCHES = {
    "MSLAUNCH_PTY": True,             # ranks' stdout a pseudo-terminal
    "MSLAUNCH_CGROUP": True,          # the job's processes in a cgroup of their own
    "MSLAUNCH_DIRECT_OUTPUT": True,   # agents send output on a connection of its own
    "MSLAUNCH_OUTPUT_TLS": False,     # ... in TLS
    "MSLAUNCH_HOST_PACKAGE": True,    # agents start from the host's identical mslaunch
    "MSLAUNCH_EXCEPTION_EXIT": True,  # a Python rank ends at an uncaught exception (MPI up)
}
_OFF = ("0", "false", "no", "off", "f", "n")
_ON = ("1", "true", "yes", "on", "t", "y")


def _parse(value: str) -> Optional[bool]:
    word = value.strip().lower()
    return False if word in _OFF else True if word in _ON else None


def switch(name: str, environ: Optional[Mapping[str, str]] = None) -> bool:
    """The value of the switch ``name``: its default when unset, empty or not
    understood (which :func:`check_switches` has refused on the command line)."""
    value = (os.environ if environ is None else environ).get(name, "")
    parsed = _parse(value) if value.strip() else None
    return SWITCHES[name] if parsed is None else parsed


def pty_wanted(environ: Mapping[str, str], no_pty: bool, default: bool) -> bool:
    """Whether ranks' stdout is a pseudo-terminal, the one rule of both dialects:
    ``--no-pty`` says no; else ``MSLAUNCH_PTY`` when set; else the dialect's
    default (mpirun's dialect: yes, as Open MPI; msrun's: no, as msrun, whose
    processes write to their log files)."""
    if no_pty:
        return False
    value = environ.get("MSLAUNCH_PTY", "")
    parsed = _parse(value) if value.strip() else None
    return default if parsed is None else parsed


def parse_number(text: str) -> float:
    """A plain decimal number (``12``, ``0.5``, ``.5``, ``1e3``) in ASCII; ValueError
    for anything else float() would take (spaces, ``nan``, ``inf``, ``_``, other
    scripts' digits)."""
    body = text[1:] if text[:1] in "+-" and text else text
    mantissa, _, exponent = body.lower().partition("e")
    whole, _, fraction = mantissa.partition(".")
    exp = exponent[1:] if exponent[:1] in ("+", "-") else exponent
    if not text.isascii() or not (whole + fraction) or not (whole + fraction).isdigit() \
            or ("e" in body.lower() and not exp.isdigit()):
        raise ValueError(text)
    return float(text)


#: The shortest silence (heartbeat interval times misses) that loses a peer: a
#: busy machine's own scheduling delays are a good part of a second.
MIN_SILENCE = 0.5

#: Seconds a launcher that stops (a Ctrl-Z) waits at most for its agents to say
#: they heard it: what carries the message (the SSH link's thread) stops with
#: it, and an agent that did not hear would take the silence for a loss.  They
#: answer within milliseconds; one lost meanwhile never does.
PAUSE_PATIENCE = 10.0


def heartbeat(text: Optional[str]) -> Optional[Tuple[float, Optional[int]]]:
    """``MSLAUNCH_HEARTBEAT``'s ``INTERVAL[,MISSES]`` (seconds from 0.01 to 3600,
    misses from 1 to 1000; unset or empty: None, the job's default); UsageError
    for anything else."""
    if not text:
        return None
    interval, comma, misses = text.partition(",")
    try:
        value = parse_number(interval)
        if not 0.01 <= value <= 3600:
            raise ValueError(text)
        count = int(misses) if comma and misses.isascii() and misses.isdigit() else None
        if comma and not (count is not None and 1 <= count <= 1000):
            raise ValueError(text)
        if value * (count or 5) < MIN_SILENCE:      # (5: the fewest misses of a default)
            raise ValueError(text)
    except ValueError:
        from .errors import UsageError
        raise UsageError(f"MSLAUNCH_HEARTBEAT={text[:40]!r}: expected INTERVAL[,MISSES], "
                         f"seconds from 0.01 to 3600 between heartbeats and how many may be "
                         f"missed (1 to 1000), together {MIN_SILENCE:g} s of silence at "
                         f"least, such as 1,5") from None
    return value, count


def check_switches(environ: Mapping[str, str]) -> None:
    """UsageError naming the first switch set to something neither on nor off (or a
    bad ``MSLAUNCH_HEARTBEAT``)."""
    heartbeat(environ.get("MSLAUNCH_HEARTBEAT"))
    for name in SWITCHES:
        value = environ.get(name, "")
        if value.strip() and _parse(value) is None:
            from .errors import UsageError
            raise UsageError(f"{name}={value!r}: not a switch value (on: 1, yes, true, on; "
                             f"off: 0, no, false, off)")
