"""The phases of bringing up remote hosts, timed, for ``-v -v``.

The starters, the agents' greeting and the hosts mark what happens (an event,
for one host or for all); when the first rank has started on a remote host,
the marks so far are given, once, to the printer the job set (if any), one
line per event, measured from the moment this process started.  An event of
many hosts is one line: when the first host got there, and the last.
"""

from __future__ import annotations

import os
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Dict, List, Optional, Tuple

_marks: List[Tuple[float, str, str]] = []
_printer: List[Callable[[str], None]] = []

#: When a host still starting is late: after LATE_MIN seconds, and after
#: LATE_FACTOR times the median start of the hosts already up (a start costs
#: 0.2 to 2 s here, more on a busy machine: a fixed 2 s named hosts of most
#: busy 8-host starts that went well).
LATE_MIN = 3.0
LATE_FACTOR = 3.0
#: Seconds between two lines naming the late hosts: in a log, and on a
#: terminal, where each line replaces the last.
REPEAT = 5.0
REPEAT_IN_PLACE = 1.0
#: The events after which a host is up, and what a host is doing after each
#: other event (before any: the starter's first phase, given to :func:`watch`).
UP = ("agent said hello", "dialled back", "agent kept")
DOING = {"TCP connected": "SSH: key exchange and login",
         "paramiko imported": "SSH: key exchange and login",
         "SSH logged in": "starting the agent (its bootstrap and package)",
         "srun started": "srun starting the agent"}


class _Watch:
    """The hosts being watched (see :func:`watch`)."""

    def __init__(self, names: List[str], say: Callable[[str], None], first: str,
                 in_place: bool) -> None:
        self.names, self.say, self.first, self.in_place = names, say, first, in_place
        self.since = time.monotonic()
        self.first_mark = len(_marks)         # earlier ones are an earlier attempt's
        self.said: Optional[float] = None     # when the late hosts were last named


_watch: List[_Watch] = []


_forward: List[Callable[[float, str, str], None]] = []


def mark(event: str, host: str = "", at: Optional[float] = None) -> None:
    """``event`` happened now, or at ``at`` (to ``host``, or to the job when "")."""
    at = time.monotonic() if at is None else at
    if _forward:
        _forward[0](at, event, host)
    else:
        _marks.append((at, event, host))


def forward(to: Callable[[float, str, str], None]) -> None:
    """Hand every mark from now on to ``to`` (a helper process's, to the launcher)."""
    _forward[:] = [to]


def watch(names: List[str], say: Callable[[str], None], first: str,
          in_place: bool = False) -> None:
    """Name the hosts of ``names`` still starting once one is late (see
    :data:`LATE_MIN`), at each :func:`tick`, and again every :data:`REPEAT`
    seconds until they are up: one line each time, or, ``in_place`` (a
    terminal), one line that each replaces (``say("")`` clears it).  ``first``
    is what a host does before it marks anything."""
    _watch[:] = [_Watch(list(names), say, first, in_place)]


def tick() -> None:
    """Said by the starters while they wait: see :func:`watch`."""
    if not _watch:
        return
    w = _watch[0]
    now = time.monotonic()
    waited = now - w.since
    if waited < LATE_MIN:
        return
    doing, took = _doing(w)
    starting = [n for n in w.names if doing.get(n) != "up"]
    if not starting:
        return
    late = LATE_MIN if not took else max(LATE_MIN, LATE_FACTOR * sorted(took)[len(took) // 2])
    every = REPEAT_IN_PLACE if w.in_place else REPEAT
    if waited < late or (w.said is not None and now - w.said < every):
        return
    w.said = now
    phases: Dict[str, List[str]] = {}
    for name in starting:
        phases.setdefault(doing.get(name) or w.first, []).append(name)
    from ..hosts.ranges import host_ranges
    where = "; ".join(f"{host_ranges(hosts)} ({phase})" for phase, hosts in phases.items())
    w.say(f"mslaunch: still starting after {waited:.0f} s: {where}; "
          f"{len(w.names) - len(starting)} of {len(w.names)} hosts up")


def unwatch() -> None:
    """The start is over: the line in place is cleared; in a log, a start whose
    late hosts were named is said to be complete when every host is up."""
    if not _watch:
        return
    w = _watch.pop()
    if w.said is None:
        return
    if w.in_place:
        w.say("")
        return
    doing, _ = _doing(w)
    if all(doing.get(n) == "up" for n in w.names):
        w.say(f"mslaunch: every host up after {time.monotonic() - w.since:.1f} s")


def status() -> str:
    """The watched hosts now, in one line: how many are up, what the others do."""
    if not _watch:
        return "starting"
    w = _watch[0]
    doing, _ = _doing(w)
    up = [n for n in w.names if doing.get(n) == "up"]
    phases: Dict[str, List[str]] = {}
    for name in w.names:
        if doing.get(name) != "up":
            phases.setdefault(doing.get(name) or w.first, []).append(name)
    from ..hosts.ranges import host_ranges
    parts = [f"{len(up)} of {len(w.names)} hosts up"]
    parts += [f"{host_ranges(hosts)}: {phase}" for phase, hosts in phases.items()]
    return "; ".join(parts) + f" ({time.monotonic() - w.since:.1f} s since the hosts were asked)"


def _doing(w: _Watch) -> Tuple[Dict[str, str], List[float]]:
    """What each host of ``w`` does now ("up" once it is), and how long the hosts
    up took."""
    doing: Dict[str, str] = {}
    took: List[float] = []
    for when, event, host in _marks[w.first_mark:]:
        if host:
            if event in UP and doing.get(host) != "up":
                took.append(when - w.since)
            doing[host] = "up" if event in UP else DOING.get(event, doing.get(host, ""))
    return doing, took


def print_when_ranks_start(printer: Callable[[str], None]) -> None:
    """Give the timeline to ``printer`` when the first remote rank has started."""
    _printer[:] = [printer]


def ranks_started(host: str) -> None:
    """Ranks run on ``host``: the timeline is printed the first time."""
    mark("ranks started", host)
    if _printer:
        printer = _printer.pop()
        for line in report():
            printer(line)


def _process_start() -> Optional[float]:
    """When this process started, on the monotonic clock (None where /proc cannot tell)."""
    try:
        with open("/proc/self/stat", "rb") as f:
            ticks = int(f.read().rsplit(b")", 1)[1].split()[19])
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
        return time.monotonic() - age
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def report() -> List[str]:
    """The lines of the timeline so far."""
    start = _process_start()
    origin = start if start is not None else (_marks[0][0] if _marks else 0.0)
    events: Dict[str, List[Tuple[float, str]]] = {}
    for when, event, host in _marks:
        events.setdefault(event, []).append((when, host))
    lines = ["mslaunch: timeline (ms since mslaunch started):"]
    for event, seen in sorted(events.items(), key=lambda e: e[1][0][0]):
        first = (seen[0][0] - origin) * 1000
        if len(seen) == 1:
            host = f" ({seen[0][1]})" if seen[0][1] else ""
            lines.append(f"mslaunch:   {first:8.1f}  {event}{host}")
        else:
            last = (seen[-1][0] - origin) * 1000
            lines.append(f"mslaunch:   {first:8.1f}  {event} (first {seen[0][1]}; last "
                         f"{seen[-1][1]} at {last:.1f}; {len(seen)} hosts)")
    return lines
