"""The link's JSON frames as records, decoded once where they are read.

Each direction has its table of kinds: :func:`from_agent` and
:func:`from_launcher` turn a frame's kind and body into the record of that
kind, every field checked (:class:`~.link.LinkError` naming the frame and the
field, for an agent or a launcher that breaks the protocol), so that the code
that acts on a frame sees only its record; :func:`encode` is the way back.
``OUTPUT``, ``LINES`` and ``STDIN`` keep their binary bodies (:mod:`.link`),
``JOB`` is :mod:`.jobframe`'s, ``HELLO`` the bootstrap's; a ``PMI`` frame's
body is the MPI services' own grammar, read by them (:class:`Pmi` carries it).
Times an agent reports (``at``, ``stop_at``, ``clock``) are kept as sent and
read with the link's clock offset, which ignores what is not a time.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, Optional, Tuple, Union

from ..core.spec import dataclass
from . import link
from .link import LinkError


@dataclass(frozen=True)
class Ready:
    """The agent has the job and checked its programs (``READY``)."""
    KIND = link.READY
    warnings: Tuple[str, ...] = ()      # said on the launcher's terminal
    notes: Tuple[str, ...] = ()         # said with -v
    clock: Any = None                   # (when the job came, when this was sent)
    direct: bool = False                # output comes on a connection of its own


@dataclass(frozen=True)
class Started:
    """Ranks started, with their pids (``STARTED``)."""
    KIND = link.STARTED
    pids: Tuple[Tuple[int, int], ...] = ()


@dataclass(frozen=True)
class Exited:
    """A rank ended (``EXITED``): its exit code or signal."""
    KIND = link.EXITED
    rank: int
    code: Optional[int] = None
    signal: Optional[int] = None
    at: Any = None                      # when, on the agent's clock
    stop_at: Any = None                 # when the job's stop reached the agent, if it had


@dataclass(frozen=True)
class StdinTaken:
    """Bytes of a rank's stdin written to it (``CREDIT``, agent to launcher)."""
    KIND = link.CREDIT
    rank: int
    stdin: int


@dataclass(frozen=True)
class Log:
    """A line for the launcher's terminal (``LOG``)."""
    KIND = link.LOG
    message: str


@dataclass(frozen=True)
class Error:
    """A problem that ends the host's part of the job (``ERROR``)."""
    KIND = link.ERROR
    message: str
    code: Optional[int] = None


@dataclass(frozen=True)
class Looked:
    """The answer to a look (``STACKS`` or ``TOP``): rows by rank, or None."""
    KIND = link.STACKS
    kind: int
    id: int
    ranks: Optional[Dict[str, Any]] = None


@dataclass(frozen=True)
class Gone:
    """The agent gives up on a launcher silent for ``silent`` seconds (``GONE``)."""
    KIND = link.GONE
    silent: float


@dataclass(frozen=True)
class Pmi:
    """The job's MPI, either way (``PMI``): the services' own message."""
    KIND = link.PMI
    message: Dict[str, Any]


@dataclass(frozen=True)
class Signal:
    """Send ``sig`` to the ranks (all when ``ranks`` is None) (``SIGNAL``)."""
    KIND = link.SIGNAL
    sig: int
    ranks: Optional[Tuple[int, ...]] = None


@dataclass(frozen=True)
class Unwanted:
    """Nobody takes ``stream`` (1, 2) of ``rank`` any more (``UNWANTED``)."""
    KIND = link.UNWANTED
    rank: int
    stream: int


@dataclass(frozen=True)
class Credit:
    """Room for ``bytes`` more of output (``CREDIT``, launcher to agent)."""
    KIND = link.CREDIT
    bytes: int


@dataclass(frozen=True)
class Next:
    """Forget the job and wait ``idle`` seconds for the next (``NEXT``), beating
    as ``heartbeat`` (interval, misses) says, else as the job did."""
    KIND = link.NEXT
    idle: float
    heartbeat: Optional[Tuple[float, int]] = None


@dataclass(frozen=True)
class Look:
    """Ask for the ranks' stacks or usage (``STACKS`` or ``TOP``); ``main``: of the
    main threads only (the stall watch's samples, see :mod:`mslaunch.machine.pydump`)."""
    KIND = link.STACKS
    kind: int
    id: int
    timeout: float = 10.0
    main: bool = False


@dataclass(frozen=True)
class Bare:
    """A frame of no fields: ``START``, ``BYE``, ``DONE``, ``PAUSED``, ``BEAT``."""
    kind: int


if TYPE_CHECKING:
    Frame = Union[Ready, Started, Exited, StdinTaken, Log, Error, Looked, Gone, Pmi, Signal,
                  Unwanted, Credit, Next, Look, Bare]

#: The longest a launcher may ask an agent to spend on one look.
MAX_LOOK = 120.0


def encode(frame: Frame) -> bytes:
    """The frame of a record."""
    if isinstance(frame, Bare):
        return link.encode(frame.kind)
    if isinstance(frame, Pmi):
        return link.encode(link.PMI, frame.message)
    if isinstance(frame, (Looked, Look)):
        body = {n: getattr(frame, n) for n in frame.__dataclass_fields__ if n != "kind"}
        return link.encode(frame.kind, body)
    body = {}
    for name in frame.__dataclass_fields__:
        value = getattr(frame, name)
        if name == "pids":
            value = {str(rank): pid for rank, pid in value}
        elif isinstance(value, tuple):
            value = list(value)
        body[name] = value
    return link.encode(frame.KIND, body)


# -- checks of one field -------------------------------------------------------

def _int(body: Dict[str, Any], name: str, what: str, low: int = 0) -> int:
    value: Any = body.get(name)
    if type(value) is not int or value < low:
        raise LinkError(f"{what}: field {name!r} missing or not a number from {low}")
    return value


def _maybe_int(body: Dict[str, Any], name: str, what: str) -> Optional[int]:
    return None if body.get(name) is None else _int(body, name, what, -(1 << 31))


def _seconds(body: Dict[str, Any], name: str, what: str, high: float) -> float:
    value: Any = body.get(name)
    if type(value) not in (int, float) or not 0 < value <= high:
        raise LinkError(f"{what}: field {name!r} missing or not seconds up to {high:g}")
    return float(value)


def _texts(body: Dict[str, Any], name: str, what: str) -> Tuple[str, ...]:
    value = body.get(name) or []
    if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
        raise LinkError(f"{what}: {name} are not a list of strings")
    return tuple(t[:500] for t in value[:20])


def _ranks(value: Any, what: str) -> Tuple[int, ...]:
    if not isinstance(value, list) or not all(type(r) is int and r >= 0 for r in value):
        raise LinkError(f"{what}: ranks are not numbers")
    return tuple(value)


# -- what an agent sends -----------------------------------------------------------

def _ready(kind: int, body: Dict[str, Any]) -> Ready:
    return Ready(warnings=_texts(body, "warnings", "READY"),
                 notes=_texts(body, "notes", "READY"), clock=body.get("clock"),
                 direct=body.get("direct") is True)


def _started(kind: int, body: Dict[str, Any]) -> Started:
    pids = body.get("pids")
    if not isinstance(pids, dict):
        raise LinkError("STARTED: field 'pids' missing or not dict")
    pairs = []
    for rank, pid in pids.items():
        if not (rank.isascii() and rank.isdigit() and len(rank) < 11) or type(pid) is not int \
                or pid <= 0:
            raise LinkError("STARTED: bad rank or pid")
        pairs.append((int(rank), pid))
    return Started(pids=tuple(pairs))


def _exited(kind: int, body: Dict[str, Any]) -> Exited:
    return Exited(rank=_int(body, "rank", "EXITED"), code=_maybe_int(body, "code", "EXITED"),
                  signal=_maybe_int(body, "signal", "EXITED"), at=body.get("at"),
                  stop_at=body.get("stop_at"))


def _stdin_taken(kind: int, body: Dict[str, Any]) -> StdinTaken:
    return StdinTaken(rank=_int(body, "rank", "CREDIT"), stdin=_int(body, "stdin", "CREDIT"))


def _looked(kind: int, body: Dict[str, Any]) -> Looked:
    ranks = body.get("ranks")
    return Looked(kind=kind, id=_int(body, "id", link.NAMES[kind], -(1 << 62)),
                  ranks=ranks if isinstance(ranks, dict) else None)


_FROM_AGENT: Dict[int, Callable[[int, Dict[str, Any]], Frame]] = {
    link.READY: _ready,
    link.STARTED: _started,
    link.EXITED: _exited,
    link.CREDIT: _stdin_taken,
    link.LOG: lambda kind, body: Log(message=str(body.get("message", ""))[:500]),
    link.ERROR: lambda kind, body: Error(
        message=str(body.get("message", "unknown error"))[:500],
        code=body.get("code") if type(body.get("code")) is int else None),
    link.STACKS: _looked,
    link.TOP: _looked,
    link.GONE: lambda kind, body: Gone(silent=_seconds(body, "silent", "GONE", 1e9)),
    link.PMI: lambda kind, body: Pmi(message=body),
    link.DONE: lambda kind, body: Bare(kind),
    link.PAUSED: lambda kind, body: Bare(kind),
}


def _decode(table: Dict[int, Callable[[int, Dict[str, Any]], Frame]], kind: int,
            body: bytes) -> Frame:
    decode = table.get(kind)
    if decode is None:
        raise LinkError(f"unexpected {link.NAMES.get(kind, kind)} frame")
    return decode(kind, link.decode_json(kind, body))


def from_agent(kind: int, body: bytes) -> Frame:
    """The record of a JSON frame an agent sent (LinkError if it may not send it)."""
    return _decode(_FROM_AGENT, kind, body)


# -- what a launcher sends ---------------------------------------------------------

def _signal(kind: int, body: Dict[str, Any]) -> Signal:
    ranks = body.get("ranks")
    return Signal(sig=_int(body, "sig", "SIGNAL", 1),
                  ranks=None if ranks is None else _ranks(ranks, "SIGNAL"))


def _unwanted(kind: int, body: Dict[str, Any]) -> Unwanted:
    stream = _int(body, "stream", "UNWANTED", 1)
    if stream > 2:
        raise LinkError("UNWANTED: stream is not 1 or 2")
    return Unwanted(rank=_int(body, "rank", "UNWANTED"), stream=stream)


def _next(kind: int, body: Dict[str, Any]) -> Next:
    beat = body.get("heartbeat")
    if beat is not None and not (isinstance(beat, list) and len(beat) == 2
                                 and type(beat[0]) in (int, float) and type(beat[1]) is int
                                 and 0.01 <= beat[0] <= 3600 and 1 <= beat[1] <= 1000):
        raise LinkError("NEXT: heartbeat is not [interval, misses]")
    return Next(idle=_seconds(body, "idle", "NEXT", 1e9),
                heartbeat=None if beat is None else (float(beat[0]), beat[1]))


def _look(kind: int, body: Dict[str, Any]) -> Look:
    what = link.NAMES[kind]
    timeout = 10.0 if body.get("timeout") is None else _seconds(body, "timeout", what,
                                                                 MAX_LOOK)
    return Look(kind=kind, id=_int(body, "id", what, -(1 << 62)), timeout=timeout,
                main=body.get("main") is True)


_FROM_LAUNCHER: Dict[int, Callable[[int, Dict[str, Any]], Frame]] = {
    link.SIGNAL: _signal,
    link.CREDIT: lambda kind, body: Credit(bytes=_int(body, "bytes", "CREDIT")),
    link.UNWANTED: _unwanted,
    link.NEXT: _next,
    link.STACKS: _look,
    link.TOP: _look,
    link.PMI: lambda kind, body: Pmi(message=body),
    link.START: lambda kind, body: Bare(kind),
    link.BYE: lambda kind, body: Bare(kind),
}


def from_launcher(kind: int, body: bytes) -> Frame:
    """The record of a JSON frame a launcher sent (LinkError if it may not send it)."""
    return _decode(_FROM_LAUNCHER, kind, body)
