"""The PMI server: the process-manager side of MPICH's "simple PMI".

MPICH-ABI ranks (e.g. mpi4py on the PyPI ``mpich`` wheel) need a process
manager to tell them their rank, size, kvsname and node map, to exchange
business cards through a key-value space, and to run barriers.  This module
is that process manager; it runs inside the launcher's :class:`~mslaunch.loop.Loop`.

Layers (kept apart so that a later per-host agent can sit between the ranks
and the launcher):

(a) **Wire codecs** -- pure functions: :func:`parse_v1`/:func:`format_v1` for the
    PMI-1 text lines (``cmd=x key=value ...\\n``), :func:`parse_v2`/:func:`format_v2`
    for the PMI-2 frames (``%6u`` length + ``cmd=x;key=value;...;``) and
    :func:`take_line`/:func:`take_frame` to cut them out of a byte stream.
(b) **Per-connection protocol handlers** -- ``_V1Protocol`` and ``_V2Protocol``
    turn one parsed request into job-state calls and replies, enforcing the
    order init -> ... -> finalize; ``_Conn`` owns the socket, the input/output
    buffers and the framing.
(c) **Job state** -- :class:`JobState` is the only thing the handlers talk to:
    KVS, barrier/fence counting, node attributes, published names.  Every call
    that might need the launcher answers through a callback, so an agent can
    substitute a state that relays puts/gets to the launcher and aggregates its
    local ranks' barrier entries into one.  :class:`LocalJobState` is the
    in-process implementation used by the launcher.

Decisions:

* ``vallen_max`` is 32768 (Hydra and gforker say 1024).  MPICH splits a binary
  put into segments of ``(vallen_max-2)/2`` raw bytes, so with 1024 each node
  root sends ~10 puts for its UCX address and every other root gets all of
  them; with 32768 it is one put per root.  It also bounds the
  ``PMI_process_mapping`` value a rank can read (a longer mapping is served as
  a miss: MPICH then falls back to its hostname exchange, which is correct,
  just slower).  Messages are capped at 64 KiB + ``vallen_max``.
* PMI-2 ``kvs-fence``: the reply is held until every rank has fenced (the
  barrier is shared with PMI-1 ``barrier_in``); gets are then answered at once,
  a miss being ``found=FALSE``.  Holding the fence is simpler than holding gets
  and equally correct, because a PMI-2 client cannot issue a get while its
  fence is outstanding.
* TCP (``PMI_PORT``/``PMI_ID``): MPICH reads ``PMI_ID`` with ``atoi`` and sends
  it back as ``%d``, so each rank's secret is a distinct random integer in
  ``[1, 2**31-1]`` (31 bits).  A connection must present a valid, unused id
  (``initack pmiid=``, or ``fullinit pmirank=`` for PMI-2) within
  ``auth_timeout`` seconds; before that it may send at most 1 KiB, and the
  number of such pending connections is bounded.
* The real MPICH 5.0.2 wheel speaks PMI-1 only; the PMI-2 wire here is tested
  with a protocol-level client (see tests/test_pmi.py).

A peer that breaks the grammar, floods, or never reads its replies is cut off
and reported with one :meth:`PMIListener.pmi_log` line; a parseable but
misplaced request gets an ``rc=1`` reply.  No exception leaves a loop callback.
"""

from __future__ import annotations

import _socket
import errno
import os
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    import socket
    from typing import Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple

    from .loop import Loop, Timer

    Fields = Dict[str, str]

KVSNAME_MAX = 256
KEYLEN_MAX = 64
VALLEN_MAX = 32768
MAX_MESSAGE = 65536 + VALLEN_MAX
MAX_PREAUTH_MESSAGE = 1024
MAX_OUTPUT = 1 << 20
MAX_ERRORS = 16


# ---------------------------------------------------------------------------
# (a) wire codecs
# ---------------------------------------------------------------------------

class WireError(ValueError):
    """Bytes that do not follow the PMI wire grammar."""


_PATTERNS = {
    "CTRL": r"[\x00-\x1f\x7f]",
    "KEY": r"[A-Za-z0-9_/\-]+",
    # A v1 token: key=value where a backslash makes the next character literal
    # (so "\ " continues the value) and a lone trailing backslash is literal.
    "V1_TOKEN": r" *([A-Za-z0-9_/\-]+)=((?:\\.|\\$|[^ \\])+)",
    "V1_UNESCAPE": r"\\(.)",
    "V2_HEADER": rb" *[0-9]+ *",
    "KVSNAME": r"[A-Za-z0-9_\-.:]+",
    "PMI_ID": r"[1-9][0-9]{0,9}",
}


class _LazyPatterns:
    """Regular expressions compiled on first use.

    Importing ``re`` costs a few milliseconds; a job whose ranks never speak
    PMI (``mslaunch -n 4 true``) should not pay it.
    """

    def __getattr__(self, name: str):
        import re
        pattern = re.compile(_PATTERNS[name])
        setattr(self, name, pattern)
        return pattern


_rx = _LazyPatterns()


def _decode(data: bytes) -> str:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise WireError("binary data") from None
    if _rx.CTRL.search(text):
        raise WireError("control character in message")
    return text


def parse_v1(line: str) -> Tuple[str, Fields]:
    """Parse one PMI-1 line (without or with its ``\\n``) into (cmd, fields).

    Follows MPICH's parser: the line starts with ``cmd=``, tokens are
    space-separated ``key=value``, an empty value is an error, and the first
    occurrence of a repeated key wins.
    """
    if line.endswith("\n"):
        line = line[:-1]
    if _rx.CTRL.search(line):
        raise WireError("control character in message")
    if not line.startswith("cmd="):
        raise WireError("message does not start with cmd=")
    cmd: Optional[str] = None
    fields: Fields = {}
    pos, end = 0, len(line)
    while pos < end:
        m = _rx.V1_TOKEN.match(line, pos)
        if m is None:
            if line[pos:].strip(" "):
                raise WireError(f"bad token at column {pos}")
            break
        key, value = m.group(1), m.group(2)
        if "\\" in value:
            value = _rx.V1_UNESCAPE.sub(r"\1", value)
        if key == "cmd":
            if cmd is not None:
                raise WireError("two cmd= tokens")
            cmd = value
        else:
            fields.setdefault(key, value)
        pos = m.end()
        if pos < end and line[pos] != " ":
            raise WireError(f"bad token at column {pos}")
    assert cmd is not None
    return cmd, fields


def _v1_value(value: object) -> str:
    text = str(value)
    if not text:
        raise WireError("empty value")  # the client rejects `key=` outright
    if _rx.CTRL.search(text):
        raise WireError("control character in value")
    return text.replace("\\", "\\\\").replace(" ", "\\ ")


def _check_key(key: str) -> None:
    if not _rx.KEY.fullmatch(key):
        raise WireError(f"invalid key {key!r}")


def format_v1(cmd: str, fields: Mapping[str, object] = {}) -> bytes:
    """Format one PMI-1 line; values are escaped so they parse back unchanged."""
    parts = ["cmd=" + _v1_value(cmd)]
    for key, value in fields.items():
        _check_key(key)
        if key == "cmd":
            raise WireError("cmd is not a field")
        parts.append(f"{key}={_v1_value(value)}")
    return (" ".join(parts) + "\n").encode("utf-8")


def parse_v2(body: str) -> Tuple[str, Fields]:
    """Parse the body of one PMI-2 frame (``cmd=x;k=v;...;``) into (cmd, fields).

    PMI-2 has no escaping: a value runs to the next ``;`` and may hold spaces.
    """
    if _rx.CTRL.search(body):
        raise WireError("control character in message")
    if not body.startswith("cmd="):
        raise WireError("frame does not start with cmd=")
    tokens = body.split(";")
    if tokens[-1] == "":
        tokens.pop()
    cmd: Optional[str] = None
    fields: Fields = {}
    for token in tokens:
        key, sep, value = token.lstrip(" ").partition("=")
        if not sep or not _rx.KEY.fullmatch(key):
            raise WireError(f"bad token {token[:40]!r}")
        if not value:
            raise WireError(f"empty value for {key}")
        if key == "cmd":
            if cmd is not None:
                raise WireError("two cmd= tokens")
            cmd = value
        else:
            fields.setdefault(key, value)
    assert cmd is not None
    return cmd, fields


def format_v2(cmd: str, fields: Mapping[str, object] = {}) -> bytes:
    """Format one PMI-2 frame: 6-character space-padded length, then the body."""
    parts = [f"cmd={cmd}"]
    for key, value in fields.items():
        _check_key(key)
        parts.append(f"{key}={value}")
    for part in parts:
        value = part.partition("=")[2]
        if not value or ";" in value or _rx.CTRL.search(value):
            raise WireError(f"value not representable in PMI-2: {value[:40]!r}")
    body = (";".join(parts) + ";").encode("utf-8")
    if len(body) > 999999:
        raise WireError("frame too long")
    return b"%6d" % len(body) + body


def take_line(buf: bytearray, limit: int) -> Optional[bytes]:
    """Remove and return one ``\\n``-terminated line (without it) from ``buf``.

    Returns None when the line is still incomplete; raises WireError when no
    newline appears within ``limit`` bytes.
    """
    idx = buf.find(b"\n", 0, limit + 1)
    if idx < 0:
        if len(buf) > limit:
            raise WireError(f"line longer than {limit} bytes")
        return None
    line = bytes(buf[:idx])
    del buf[: idx + 1]
    return line


def take_frame(buf: bytearray, limit: int) -> Optional[bytes]:
    """Remove and return the body of one PMI-2 frame from ``buf``, or None."""
    header = bytes(buf[:6])
    if header.strip(b" 0123456789"):
        raise WireError("bad PMI-2 length header")
    if len(buf) < 6:
        return None
    if not _rx.V2_HEADER.fullmatch(header):
        raise WireError("bad PMI-2 length header")
    length = int(header)
    if length <= 0 or length > limit:
        raise WireError(f"PMI-2 frame of {length} bytes (limit {limit})")
    if len(buf) < 6 + length:
        return None
    body = bytes(buf[6 : 6 + length])
    del buf[: 6 + length]
    return body


# ---------------------------------------------------------------------------
# PMI_process_mapping
# ---------------------------------------------------------------------------

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
            total = span(0, head) + span(head, head + period) + 3 + len(str(reps)) + span(head + length, len(items))
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


def parse_process_mapping(value: str, size: int) -> List[int]:
    """Node id of each of ``size`` ranks, parsed as MPICH's ``MPL_rankmap_str_to_array``.

    Same grammar and quirks (whitespace, ``strtol`` base-0 numbers, one
    ``[...]xK`` group, wrapping back to the group or to the first item that
    starts at node 0 when the items run out), but stricter where MPICH
    would leave ranks unassigned or loop forever: those raise ValueError, as
    do negative node ids.
    """
    s, n = value, len(value)
    out: List[int] = []

    def fail(why: str) -> ValueError:
        return ValueError(f"bad process mapping {value[:60]!r}: {why}")

    def skip(i: int) -> int:
        while i < n and s[i] in " \t\n\v\f\r":
            i += 1
        return i

    def number(i: int) -> Tuple[int, int]:
        num, j = _strtol(s, i)
        if j == i:
            raise fail(f"expected a number at {i}")
        if num < 0 or num > 2**31 - 1:
            raise fail(f"number {num} out of range")
        return num, j

    if size <= 0:
        return out
    i = skip(0)
    if i >= n or s[i] != "(":
        raise fail("expected '('")
    i = skip(i + 1)
    if not s.startswith("vector", i) or (i + 6 < n and (s[i + 6].isalnum() or s[i + 6] in "-_")):
        raise fail("expected 'vector'")
    i = skip(i + 6)
    repeat_start: Optional[int] = None
    repeat_cont = 0
    num_repeat = -1
    expect_comma = True
    stalled, stall_limit = 0, 4 * n + 16
    while len(out) < size:
        stalled += 1
        if stalled > stall_limit:
            raise fail("assigns no ranks")
        i = skip(i)
        if i >= n:
            break
        if expect_comma:
            if s.startswith("]x", i):
                i += 2
                if i >= n or not s[i].isdigit() or repeat_start is None:
                    raise fail("bad ']x'")
                if num_repeat == -1:
                    num_repeat, i = number(i)
                    repeat_cont = i
                num_repeat -= 1
                if num_repeat == 0:
                    i = repeat_cont
                else:
                    i = repeat_start
                    expect_comma = False
            elif s[i] == ")":
                if repeat_start is None:
                    break
                i = repeat_start  # legacy: wrap around
                expect_comma = False
            elif s[i] == ",":
                i += 1
                expect_comma = False
            else:
                raise fail(f"expected ',' at {i}")
        elif s[i] == "[":
            i += 1
            repeat_start = i
        elif s[i] == "(":
            save = i
            triple = []
            i += 1
            for k in range(3):
                num, i = number(skip(i))
                triple.append(num)
                i = skip(i)
                if i >= n or s[i] != (")" if k == 2 else ","):
                    raise fail(f"bad triplet at {save}")
                i += 1
            start, nodes, per = triple
            if repeat_start is None and start == 0:
                repeat_start = save
            if nodes > 0 and per > 0:
                stalled = 0
            for a in range(nodes if per > 0 else 0):
                for _ in range(per):
                    out.append(start + a)
                    if len(out) == size:
                        return out
            expect_comma = True
        else:
            save = i
            node, i = number(i)
            if repeat_start is None and node == 0:
                repeat_start = save
            out.append(node)
            stalled = 0
            expect_comma = True
    if len(out) < size:
        raise fail(f"covers {len(out)} of {size} ranks")
    return out


# ---------------------------------------------------------------------------
# kvsname and shared-memory helpers
# ---------------------------------------------------------------------------

def new_kvsname() -> str:
    """A kvsname unique per concurrent job on a host: ``kvs_<pid>_<random hex>``."""
    return f"kvs_{os.getpid()}_{os.urandom(6).hex()}"


def _fnv1a32(data: bytes) -> int:
    h = 0x811C9DC5
    for byte in data:
        h = ((h ^ byte) * 0x01000193) & 0xFFFFFFFF
    return h


def shm_segments(kvsname: str, shm_dir: str = "/dev/shm") -> List[str]:
    """Paths of MPICH's POSIX shared-memory segments left for ``kvsname``."""
    prefix = f"mpich_shm_{_fnv1a32(kvsname.encode('utf-8')):x}_"
    try:
        names = os.listdir(shm_dir)
    except OSError:
        return []
    return sorted(os.path.join(shm_dir, n) for n in names if n.startswith(prefix))


def remove_shm_segments(kvsname: str, shm_dir: str = "/dev/shm") -> int:
    """Unlink the segments of :func:`shm_segments`; returns how many were removed."""
    removed = 0
    for path in shm_segments(kvsname, shm_dir):
        try:
            os.unlink(path)
            removed += 1
        except FileNotFoundError:
            pass
    return removed


# ---------------------------------------------------------------------------
# (c) job state
# ---------------------------------------------------------------------------

class PMIListener:
    """What the PMI server reports to the supervisor (a protocol: any object
    with these three methods will do)."""

    def pmi_abort(self, rank: int, code: int, message: str) -> None: ...

    def pmi_lost(self, rank: int) -> None: ...

    def pmi_log(self, message: str) -> None: ...


class JobState:
    """The job-wide state behind the protocol handlers.

    Anything that may need another host answers through a callback (called at
    most once, possibly later), so an agent can relay it.  ``barrier`` calls
    ``done`` when every rank of the job has entered; it raises ValueError if
    ``rank`` is already waiting.
    """

    kvsname: str
    size: int
    universe_size: int

    def appnum(self, rank: int) -> int:
        raise NotImplementedError

    def job_attr(self, key: str) -> Optional[str]:
        raise NotImplementedError

    def kvs_put(self, rank: int, key: str, value: str) -> None:
        raise NotImplementedError

    def kvs_get(self, rank: int, key: str, reply: Callable[[Optional[str]], None]) -> None:
        raise NotImplementedError

    def barrier(self, rank: int, done: Callable[[], None]) -> None:
        raise NotImplementedError

    def node_attr_put(self, rank: int, key: str, value: str) -> None:
        raise NotImplementedError

    def node_attr_get(self, rank: int, key: str, wait: bool, reply: Callable[[Optional[str]], None]) -> None:
        raise NotImplementedError

    def publish(self, service: str, port: str, reply: Callable[[bool], None]) -> None:
        raise NotImplementedError

    def lookup(self, service: str, reply: Callable[[Optional[str]], None]) -> None:
        raise NotImplementedError

    def unpublish(self, service: str, reply: Callable[[bool], None]) -> None:
        raise NotImplementedError


class LocalJobState(JobState):
    """All of a job's PMI state in this process (the launcher's view)."""

    def __init__(self, *, kvsname: str, size: int, process_mapping: str,
                 universe_size: int, appnums: Sequence[int]) -> None:
        self.kvsname = kvsname
        self.size = size
        self.universe_size = universe_size
        self._appnums = list(appnums)
        self._attrs: Dict[str, str] = {"universeSize": str(universe_size)}
        # A mapping the client cannot hold is served as a miss (see module doc).
        if process_mapping and len(process_mapping) < VALLEN_MAX:
            self._attrs["PMI_process_mapping"] = process_mapping
        try:
            self._node_of = parse_process_mapping(process_mapping, size)
        except ValueError:
            self._node_of = [0] * size
        self._kvs: Dict[str, str] = {}
        self._in_barrier: Dict[int, Callable[[], None]] = {}
        self._node_attrs: Dict[Tuple[int, str], str] = {}
        self._node_waiters: Dict[Tuple[int, str], List[Callable[[Optional[str]], None]]] = {}
        self._names: Dict[str, str] = {}

    def appnum(self, rank: int) -> int:
        return self._appnums[rank]

    def job_attr(self, key: str) -> Optional[str]:
        return self._attrs.get(key)

    def kvs_put(self, rank: int, key: str, value: str) -> None:
        self._kvs[key] = value

    def kvs_get(self, rank: int, key: str, reply: Callable[[Optional[str]], None]) -> None:
        reply(self._kvs.get(key))

    def barrier(self, rank: int, done: Callable[[], None]) -> None:
        if rank in self._in_barrier:
            raise ValueError(f"rank {rank} entered the barrier twice")
        self._in_barrier[rank] = done
        if len(self._in_barrier) == self.size:
            waiting, self._in_barrier = self._in_barrier, {}
            for release in waiting.values():
                release()

    def node_attr_put(self, rank: int, key: str, value: str) -> None:
        slot = (self._node_of[rank], key)
        self._node_attrs[slot] = value
        for reply in self._node_waiters.pop(slot, []):
            reply(value)

    def node_attr_get(self, rank: int, key: str, wait: bool, reply: Callable[[Optional[str]], None]) -> None:
        slot = (self._node_of[rank], key)
        value = self._node_attrs.get(slot)
        if value is None and wait:
            self._node_waiters.setdefault(slot, []).append(reply)
        else:
            reply(value)

    def publish(self, service: str, port: str, reply: Callable[[bool], None]) -> None:
        if service in self._names:
            reply(False)
        else:
            self._names[service] = port
            reply(True)

    def lookup(self, service: str, reply: Callable[[Optional[str]], None]) -> None:
        reply(self._names.get(service))

    def unpublish(self, service: str, reply: Callable[[bool], None]) -> None:
        reply(self._names.pop(service, None) is not None)


# ---------------------------------------------------------------------------
# (b) per-connection protocol handlers
# ---------------------------------------------------------------------------

NEW = "new"            # TCP, not yet authenticated; rank unknown
READY = "ready"        # rank known, no init yet
V2_PRE = "v2-pre"      # PMI-2 init done, waiting for fullinit
ACTIVE = "active"      # initialized
DONE = "done"          # finalized
ABORTED = "aborted"


def _int(text: Optional[str], default: int) -> int:
    try:
        return int(text) if text is not None else default
    except ValueError:
        return default


def _abort(conn: "_Conn", f: Fields) -> None:
    """``abort`` on either wire: report the rank and its code; no reply."""
    conn.phase = ABORTED
    # PMI-2 MPICH sends exitcode=-1 (the MPI_Abort code is lost on that wire)
    # and exits 255; Slurm's client sends isworld= and msg= and no exitcode.
    code = _int(f.get("exitcode"), 1)
    conn.server._emit_abort(conn.rank, code & 0xFF if code < 0 else code,
                            f.get("message") or f.get("msg", ""))


class _V1Protocol:
    """PMI-1 requests of one connection."""

    REPLIES = {
        "init": "response_to_init", "initack": "initack", "get_maxes": "maxes",
        "get_appnum": "appnum", "get_my_kvsname": "my_kvsname",
        "get_universe_size": "universe_size", "put": "put_result", "get": "get_result",
        "barrier_in": "barrier_out", "finalize": "finalize_ack",
        "publish_name": "publish_result", "lookup_name": "lookup_result",
        "unpublish_name": "unpublish_result", "spawn": "spawn_result", "abort": "",
    }

    def __init__(self, conn: "_Conn") -> None:
        self.conn = conn
        self.state = conn.server.state

    def send(self, cmd: str, **fields: object) -> None:
        self.conn.send(format_v1(cmd, fields))

    def handle(self, cmd: str, f: Fields) -> None:
        conn = self.conn
        if conn.phase == NEW:
            if cmd == "initack":
                return self.initack(f)
            if cmd == "init" and f.get("pmi_version") == "2":
                return self.init(f)  # PMI-2 over TCP authenticates at fullinit
            return conn.abandon(f"unauthenticated TCP peer sent cmd={cmd[:40]} before initack")
        reply = self.REPLIES.get(cmd)
        if reply is None:
            return conn.violation(lambda: self.send("error", rc=1, msg="unknown_command"),
                                  f"unknown command {cmd[:40]!r}")
        phase = conn.phase
        if cmd == "init":
            # Allowed again after finalize: MPICH keeps the fd open so that PMI
            # can be re-initialized (e.g. MPI sessions after MPI_Finalize).
            if phase == ACTIVE:
                return conn.violation(lambda: self.send(reply, rc=1, msg="already_initialized"),
                                      "second init")
        elif cmd == "initack":
            return conn.violation(lambda: self.send(reply, rc=1, msg="unexpected_initack"),
                                  "initack on an authenticated connection")
        elif cmd == "abort":
            if phase == ABORTED:
                return
        elif phase != ACTIVE:
            why = {READY: "not_initialized", DONE: "finalized", ABORTED: "aborted"}[phase]
            return conn.violation(lambda: self.send(reply, rc=1, msg=why), f"cmd={cmd} while {phase}")
        getattr(self, cmd)(f)

    def _missing(self, cmd: str, *names: str, f: Fields) -> bool:
        lacking = [n for n in names if n not in f]
        if lacking:
            self.conn.violation(lambda: self.send(self.REPLIES[cmd], rc=1, msg="missing_" + lacking[0]),
                                f"cmd={cmd} without {lacking[0]}")
        return bool(lacking)

    # -- commands ---------------------------------------------------------
    def initack(self, f: Fields) -> None:
        conn = self.conn
        if not conn.server._authenticate(conn, f.get("pmiid")):
            return
        st, rank = self.state, conn.rank
        assert rank is not None
        conn.phase = READY
        conn.send(format_v1("initack", {"rc": 0, "rank": rank, "size": st.size,
                                        "appnum": st.appnum(rank), "debug": 0})
                  + format_v1("set", {"size": st.size})
                  + format_v1("set", {"rank": rank})
                  + format_v1("set", {"debug": 0}))

    def init(self, f: Fields) -> None:
        version = f.get("pmi_version")
        if version == "1":
            self.conn.phase = ACTIVE
            self.send("response_to_init", rc=0, pmi_version=1, pmi_subversion=1)
        elif version == "2":
            self.send("response_to_init", rc=0, pmi_version=2, pmi_subversion=0)
            self.conn.switch_to_v2()
        else:
            self.conn.violation(lambda: self.send("response_to_init", rc=1, msg="unsupported_version",
                                                  pmi_version=1, pmi_subversion=1),
                                f"init with pmi_version={version}")

    def get_maxes(self, f: Fields) -> None:
        self.send("maxes", rc=0, kvsname_max=KVSNAME_MAX, keylen_max=KEYLEN_MAX, vallen_max=VALLEN_MAX)

    def get_appnum(self, f: Fields) -> None:
        self.send("appnum", rc=0, appnum=self.state.appnum(self.conn.rank))

    def get_my_kvsname(self, f: Fields) -> None:
        self.send("my_kvsname", rc=0, kvsname=self.state.kvsname)

    def get_universe_size(self, f: Fields) -> None:
        self.send("universe_size", rc=0, size=self.state.universe_size)

    def put(self, f: Fields) -> None:
        if self._missing("put", "key", "value", f=f):
            return
        key, value = f["key"], f["value"]
        if f.get("kvsname", self.state.kvsname) != self.state.kvsname:
            self.send("put_result", rc=1, msg="unknown_kvsname")
        elif key.startswith("PMI_"):
            self.send("put_result", rc=1, msg="reserved_key")
        elif len(key) > KEYLEN_MAX or len(value) > VALLEN_MAX:
            self.send("put_result", rc=1, msg="too_long")
        else:
            self.state.kvs_put(self.conn.rank, key, value)
            self.send("put_result", rc=0)

    def get(self, f: Fields) -> None:
        if self._missing("get", "key", f=f):
            return
        key = f["key"]

        def answer(value: Optional[str]) -> None:
            if value:
                self.send("get_result", rc=0, value=value)
            else:  # never an empty value=: the client cannot parse it
                self.send("get_result", rc=1, msg="key_not_found")

        if f.get("kvsname", self.state.kvsname) != self.state.kvsname:
            answer(None)
        elif key.startswith("PMI_"):
            answer(self.state.job_attr(key))
        else:
            self.state.kvs_get(self.conn.rank, key, self.conn.deferred(answer))

    def barrier_in(self, f: Fields) -> None:
        self.conn.enter_barrier(lambda: self.send("barrier_out", rc=0))

    def finalize(self, f: Fields) -> None:
        self.conn.phase = DONE
        self.send("finalize_ack", rc=0)

    def abort(self, f: Fields) -> None:
        _abort(self.conn, f)

    def publish_name(self, f: Fields) -> None:
        if self._missing("publish_name", "service", "port", f=f):
            return
        self.state.publish(f["service"], f["port"], self.conn.deferred(
            lambda ok: self.send("publish_result", rc=0) if ok
            else self.send("publish_result", rc=1, msg="already_published")))

    def lookup_name(self, f: Fields) -> None:
        if self._missing("lookup_name", "service", f=f):
            return
        self.state.lookup(f["service"], self.conn.deferred(
            lambda port: self.send("lookup_result", rc=0, port=port) if port
            else self.send("lookup_result", rc=1, msg="service_not_found")))

    def unpublish_name(self, f: Fields) -> None:
        if self._missing("unpublish_name", "service", f=f):
            return
        self.state.unpublish(f["service"], self.conn.deferred(
            lambda ok: self.send("unpublish_result", rc=0) if ok
            else self.send("unpublish_result", rc=1, msg="service_not_found")))

    def spawn(self, f: Fields) -> None:
        self.send("spawn_result", rc=1, msg="spawn_not_supported_by_mslaunch")


class _V2Protocol:
    """PMI-2 requests of one connection."""

    COMMANDS = {
        "init", "fullinit", "job-getid", "kvs-put", "kvs-get", "kvs-fence", "info-getjobattr",
        "info-putnodeattr", "info-getnodeattr", "name-publish", "name-lookup",
        "name-unpublish", "finalize", "abort", "spawn",
    }

    def __init__(self, conn: "_Conn") -> None:
        self.conn = conn
        self.state = conn.server.state
        self.thrid: Optional[str] = None

    def send(self, cmd: str, **fields: object) -> None:
        if self.thrid is not None:
            fields["thrid"] = self.thrid
        try:
            data = format_v2(cmd, fields)
        except WireError:
            data = format_v2(cmd, {"rc": 1, "errmsg": "value_not_representable"})
        self.conn.send(data)

    def reply(self, cmd: str, **fields: object) -> None:
        self.send(cmd + "-response", rc=0, **fields)

    def fail(self, cmd: str, errmsg: str) -> Callable[[], None]:
        return lambda: self.send(cmd + "-response", rc=1, errmsg=errmsg)

    def handle(self, cmd: str, f: Fields) -> None:
        conn = self.conn
        self.thrid = f.get("thrid")
        if cmd not in self.COMMANDS:
            if conn.rank is None:
                return conn.abandon(f"unauthenticated PMI-2 peer sent cmd={cmd[:40]}")
            return conn.violation(lambda: self.send("error", rc=1, errmsg="unknown_command"),
                                  f"unknown PMI-2 command {cmd[:40]!r}")
        phase = conn.phase
        if cmd in ("init", "fullinit"):
            if phase in (NEW, READY, V2_PRE, DONE):
                return self.init(f) if cmd == "init" else self.fullinit(f)
            return conn.violation(self.fail(cmd, "already_initialized"), f"{cmd} while {phase}")
        if conn.rank is None:
            return conn.abandon(f"unauthenticated PMI-2 peer sent cmd={cmd[:40]}")
        if cmd == "abort" and phase != ABORTED:
            return self.abort(f)
        if phase != ACTIVE:
            return conn.violation(self.fail(cmd, f"not_allowed_while_{phase}"), f"{cmd} while {phase}")
        getattr(self, cmd.replace("-", "_"))(f)

    def _need(self, cmd: str, f: Fields, *names: str) -> bool:
        lacking = [n for n in names if n not in f]
        if lacking:
            self.conn.violation(self.fail(cmd, "missing_" + lacking[0]), f"{cmd} without {lacking[0]}")
        return not lacking

    # -- commands ---------------------------------------------------------
    def init(self, f: Fields) -> None:
        self.send("response_to_init", rc=0, pmi_version=2, pmi_subversion=0)
        if self.conn.phase != NEW:
            self.conn.phase = V2_PRE

    def fullinit(self, f: Fields) -> None:
        conn = self.conn
        if conn.rank is None:
            if not conn.server._authenticate(conn, f.get("pmirank")):
                return
        # On an inherited socket the fd identifies the rank; pmirank is advisory.
        conn.phase = ACTIVE
        rank = conn.rank
        # Slurm's libpmi2 needs pmi-version/pmi-subversion and takes booleans
        # only as TRUE/FALSE; MPICH reads rank, size and appnum.
        self.reply("fullinit", **{
            "rank": rank, "size": self.state.size, "appnum": self.state.appnum(rank),
            "pmi-version": 2, "pmi-subversion": 0, "pmiverbose": "FALSE", "debugged": "FALSE"})

    def job_getid(self, f: Fields) -> None:
        self.reply("job-getid", jobid=self.state.kvsname)

    def kvs_put(self, f: Fields) -> None:
        if not self._need("kvs-put", f, "key", "value"):
            return
        key, value = f["key"], f["value"]
        if key.startswith("PMI_"):
            self.send("kvs-put-response", rc=1, errmsg="reserved_key")
        elif len(key) > KEYLEN_MAX or len(value) > VALLEN_MAX:
            self.send("kvs-put-response", rc=1, errmsg="too_long")
        else:
            self.state.kvs_put(self.conn.rank, key, value)
            self.reply("kvs-put")

    def _found(self, cmd: str) -> Callable[[Optional[str]], None]:
        return lambda value: (self.reply(cmd, found="TRUE", value=value) if value
                              else self.reply(cmd, found="FALSE"))

    def kvs_get(self, f: Fields) -> None:
        if not self._need("kvs-get", f, "key"):
            return
        answer = self._found("kvs-get")
        if f.get("jobid", self.state.kvsname) != self.state.kvsname:
            answer(None)
        else:
            self.state.kvs_get(self.conn.rank, f["key"], self.conn.deferred(answer))

    def kvs_fence(self, f: Fields) -> None:
        self.conn.enter_barrier(lambda: self.reply("kvs-fence"))

    def info_getjobattr(self, f: Fields) -> None:
        if self._need("info-getjobattr", f, "key"):
            self._found("info-getjobattr")(self.state.job_attr(f["key"]))

    def info_putnodeattr(self, f: Fields) -> None:
        if self._need("info-putnodeattr", f, "key", "value"):
            self.state.node_attr_put(self.conn.rank, f["key"], f["value"])
            self.reply("info-putnodeattr")

    def info_getnodeattr(self, f: Fields) -> None:
        if self._need("info-getnodeattr", f, "key"):
            self.state.node_attr_get(self.conn.rank, f["key"], f.get("wait") == "TRUE",
                                     self.conn.deferred(self._found("info-getnodeattr")))

    def name_publish(self, f: Fields) -> None:
        if self._need("name-publish", f, "name", "port"):
            self.state.publish(f["name"], f["port"], self.conn.deferred(
                lambda ok: self.reply("name-publish") if ok
                else self.fail("name-publish", "already_published")()))

    def name_lookup(self, f: Fields) -> None:
        if self._need("name-lookup", f, "name"):
            self.state.lookup(f["name"], self.conn.deferred(
                lambda port: self.reply("name-lookup", port=port) if port
                else self.fail("name-lookup", "service_not_found")()))

    def name_unpublish(self, f: Fields) -> None:
        if self._need("name-unpublish", f, "name"):
            self.state.unpublish(f["name"], self.conn.deferred(
                lambda ok: self.reply("name-unpublish") if ok
                else self.fail("name-unpublish", "service_not_found")()))

    def finalize(self, f: Fields) -> None:
        self.conn.phase = DONE
        self.reply("finalize")

    def abort(self, f: Fields) -> None:
        _abort(self.conn, f)

    def spawn(self, f: Fields) -> None:
        self.fail("spawn", "spawn_not_supported_by_mslaunch")()


class _Conn:
    """One PMI connection: socket, buffers, framing, request ordering."""

    def __init__(self, server: "PMIServer", sock: socket.socket, rank: Optional[int], tcp: bool) -> None:
        self.server = server
        self.sock = sock
        self.fd = sock.fileno()
        self.rank = rank
        self.tcp = tcp
        self.phase = NEW if rank is None else READY
        self.inbuf = bytearray()
        self.outbuf = bytearray()
        self.proto: Optional[object] = None  # _V1Protocol or _V2Protocol once detected
        self.wire = ""
        self.mcmd: Optional[List[Tuple[str, str]]] = None
        self.mcmd_bytes = 0
        self.waiting = 0
        self.pumping = False
        self.closed = False
        self.logged = False
        self.errors = 0
        self.auth_timer: Optional[Timer] = None
        sock.setblocking(False)
        server.loop.add_reader(self.fd, self._on_readable)

    def describe(self) -> str:
        return f"rank {self.rank}" if self.rank is not None else f"unauthenticated connection fd {self.fd}"

    def log(self, text: str) -> None:
        if not self.logged:
            self.logged = True
            self.server._emit_log(f"PMI {self.describe()}: {text}")

    # -- failure handling ---------------------------------------------------
    def abandon(self, why: str) -> None:
        """Cut off a peer that broke the protocol; one log line."""
        if not self.closed:
            self.log(why + "; closing the connection")
            self.close()

    def violation(self, send_error: Callable[[], None], why: str) -> None:
        """A parseable but misplaced request: error reply, one log line."""
        self.errors += 1
        if self.errors > MAX_ERRORS:
            return self.abandon(f"{why} (too many errors)")
        self.log(why)
        send_error()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.auth_timer is not None:
            self.auth_timer.cancel()
        self.server.loop.forget(self.fd)
        try:
            self.sock.close()
        except OSError:
            pass
        self.server._conn_closed(self)

    # -- input ----------------------------------------------------------------
    def _on_readable(self) -> None:
        started = time.perf_counter()
        try:
            self._read_and_handle()
        finally:
            self.server.busy_seconds += time.perf_counter() - started

    def _read_and_handle(self) -> None:
        try:
            try:
                data = self.sock.recv(65536)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data = b""
            if not data:
                self.close()
                return
            self.inbuf += data
            cap = MAX_PREAUTH_MESSAGE if self.rank is None else 2 * MAX_MESSAGE
            if len(self.inbuf) > cap and (self.waiting or self.rank is None):
                return self.abandon(f"sent more than {cap} bytes without waiting for replies")
            self.pump()
        except Exception as exc:  # never let a peer break the loop
            self.abandon(f"internal error {exc!r}")

    def pump(self) -> None:
        """Handle buffered requests in order; stops while a reply is pending."""
        if self.pumping:
            return
        self.pumping = True
        try:
            while not self.closed and not self.waiting:
                msg = self._next_message()
                if msg is None:
                    break
                cmd, fields = msg
                self.server._count(cmd)
                self.proto.handle(cmd, fields)  # type: ignore[attr-defined]
        except WireError as exc:
            self.abandon(str(exc))
        finally:
            self.pumping = False

    def _next_message(self) -> Optional[Tuple[str, Fields]]:
        if not self.wire:
            if len(self.inbuf) < 4:
                return None
            if self.inbuf.startswith((b"cmd=", b"mcmd")):
                self.wire, self.proto = "v1", _V1Protocol(self)
            else:
                self.wire, self.proto = "v2", _V2Protocol(self)
        limit = MAX_PREAUTH_MESSAGE if self.rank is None else MAX_MESSAGE
        while True:
            if self.wire == "v2":
                body = take_frame(self.inbuf, limit)
                return None if body is None else parse_v2(_decode(body))
            line = take_line(self.inbuf, limit)
            if line is None:
                return None
            text = _decode(line)
            if self.mcmd is None and not text.startswith("mcmd="):
                return parse_v1(text)
            msg = self._mcmd_line(text)
            if msg is not None:
                return msg

    def _mcmd_line(self, text: str) -> Optional[Tuple[str, Fields]]:
        # The spawn form: one key=value per line, segments closed by `endcmd`,
        # complete when spawnssofar == totspawns at an `endcmd`.
        if self.mcmd is None:
            self.mcmd, self.mcmd_bytes = [], 0
        self.mcmd_bytes += len(text) + 1
        if self.mcmd_bytes > MAX_MESSAGE:
            raise WireError("multi-line spawn message too long")
        if text != "endcmd":
            key, sep, value = text.partition("=")
            if not sep or not _rx.KEY.fullmatch(key):
                raise WireError(f"bad line in multi-line message: {text[:40]!r}")
            self.mcmd.append((key, value))
            return None
        pairs = dict(reversed(self.mcmd))  # first occurrence wins...
        last = dict(self.mcmd)             # ...but the segment counter is the latest
        total, sofar = _int(pairs.get("totspawns"), 0), _int(last.get("spawnssofar"), 0)
        if sofar < total:
            return None
        self.mcmd = None
        return "spawn", {k: v for k, v in pairs.items() if k != "mcmd"}

    def switch_to_v2(self) -> None:
        self.wire, self.proto = "v2", _V2Protocol(self)
        if self.phase != NEW:
            self.phase = V2_PRE

    # -- replies held by the job state --------------------------------------
    def deferred(self, answer: Callable[..., None]) -> Callable[..., None]:
        """Wrap a reply the job state may call later; input is held until then."""
        self.waiting += 1
        called = False

        def reply(*args: object) -> None:
            nonlocal called
            if called or self.closed:
                return
            called = True
            self.waiting -= 1
            try:
                answer(*args)
                if not self.waiting:
                    self.pump()
            except Exception as exc:
                self.abandon(f"internal error {exc!r}")
        return reply

    def enter_barrier(self, answer: Callable[[], None]) -> None:
        reply = self.deferred(answer)
        try:
            self.server.state.barrier(self.rank, reply)  # type: ignore[arg-type]
        except ValueError as exc:
            self.abandon(str(exc))

    # -- output ---------------------------------------------------------------
    def send(self, data: bytes) -> None:
        if self.closed:
            return
        if not self.outbuf:
            try:
                sent = self.sock.send(data, _socket.MSG_NOSIGNAL)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError:
                self.close()
                return
            if sent == len(data):
                return
            self.outbuf += data[sent:]
            self.server.loop.add_writer(self.fd, self._on_writable)
        else:
            self.outbuf += data
        if len(self.outbuf) > MAX_OUTPUT:
            self.abandon(f"does not read its replies ({len(self.outbuf)} bytes queued)")

    def _on_writable(self) -> None:
        try:
            try:
                sent = self.sock.send(self.outbuf, _socket.MSG_NOSIGNAL)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self.close()
                return
            del self.outbuf[:sent]
            if not self.outbuf:
                self.server.loop.remove_writer(self.fd)
        except Exception as exc:
            self.abandon(f"internal error {exc!r}")


# ---------------------------------------------------------------------------
# the server
# ---------------------------------------------------------------------------



class PMIServer:
    """Serves the PMI-1 and PMI-2 wires of one job on a :class:`Loop`.

    Per rank, either ``child_fd(rank)`` (export ``PMI_FD``, ``PMI_RANK``,
    ``PMI_SIZE``) or, after ``listen_tcp()``, ``tcp_env(rank)``.
    """

    auth_timeout = 5.0

    def __init__(self, loop: Loop, *, kvsname: str, size: int, process_mapping: str,
                 universe_size: int, appnums: Sequence[int], listener: PMIListener,
                 state: Optional[JobState] = None) -> None:
        if size < 1:
            raise ValueError("size must be at least 1")
        if len(appnums) != size:
            raise ValueError(f"{len(appnums)} appnums for {size} ranks")
        if (not kvsname or len(kvsname) >= KVSNAME_MAX or kvsname in ("0", "singinit")
                or not all(c.isascii() and c.isalnum() or c in "_-.:" for c in kvsname)):
            # MPICH derives the shm segment name from it; "0"/"singinit" hang.
            raise ValueError(f"unusable kvsname {kvsname!r}")
        self.loop = loop
        self.listener = listener
        self.state: JobState = state or LocalJobState(
            kvsname=kvsname, size=size, process_mapping=process_mapping,
            universe_size=universe_size, appnums=appnums)
        self.size = size
        self.stats: Dict[str, int] = {"total": 0}
        self.busy_seconds = 0.0   # time spent reading and answering ranks
        self.max_pending = 64 + size
        self._conns: Dict[int, _Conn] = {}
        self._child_socks: Dict[int, socket.socket] = {}
        self._socketpair_ranks: Set[int] = set()
        self._lost: Set[int] = set()
        self._lsock: Optional[socket.socket] = None
        self._host = ""
        self._port = 0
        self._ids: Dict[int, int] = {}
        self._rank_ids: List[int] = []
        self._tcp_ranks: Set[int] = set()
        self._pending = 0
        self._refusing = False
        self._closed = False

    # -- inherited socket -------------------------------------------------------
    def child_fd(self, rank: int) -> int:
        """Create rank's socketpair; returns the inheritable child end (PMI_FD)."""
        self._check_rank(rank)
        if rank in self._socketpair_ranks:
            raise ValueError(f"rank {rank} already has a PMI socket")
        ours, theirs = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_STREAM)
        os.set_inheritable(theirs.fileno(), True)
        self._socketpair_ranks.add(rank)
        self._child_socks[rank] = theirs
        conn = _Conn(self, ours, rank, tcp=False)
        self._conns[conn.fd] = conn
        return theirs.fileno()

    def release_child_fds(self, rank: Optional[int] = None) -> None:
        """Close the child ends in the launcher (one rank's, or all) after spawning."""
        for r in ([rank] if rank is not None else list(self._child_socks)):
            sock = self._child_socks.pop(r, None)
            if sock is not None:
                sock.close()

    # -- TCP ------------------------------------------------------------------
    def listen_tcp(self, host: str = "127.0.0.1") -> int:
        """Listen for ``PMI_PORT`` clients on an IPv4 address; returns the port."""
        if self._lsock is not None:
            raise RuntimeError("already listening")
        import socket
        lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            lsock.bind((host, 0))
            lsock.listen(min(socket.SOMAXCONN, max(128, self.size)))
            lsock.setblocking(False)
        except OSError:
            lsock.close()
            raise
        self._lsock = lsock
        self._host = "127.0.0.1" if host in ("", "0.0.0.0") else host
        self._port = lsock.getsockname()[1]
        # MPICH atoi()s PMI_ID and sends it back with %d: positive 31-bit ints.
        while len(self._ids) < self.size:
            self._ids.setdefault(int.from_bytes(os.urandom(4), "big") % (2**31 - 1) + 1, len(self._ids))
        self._rank_ids = [0] * self.size
        for pmi_id, rank in self._ids.items():
            self._rank_ids[rank] = pmi_id
        self.loop.add_reader(lsock.fileno(), self._on_accept)
        return self._port

    def tcp_env(self, rank: int) -> Dict[str, str]:
        """``PMI_PORT`` and ``PMI_ID`` for a rank that connects over TCP."""
        self._check_rank(rank)
        if self._lsock is None:
            raise RuntimeError("listen_tcp() first")
        return {"PMI_PORT": f"{self._host}:{self._port}", "PMI_ID": str(self._rank_ids[rank])}

    def _on_accept(self) -> None:
        try:
            self._accept_some()
        except Exception as exc:  # never let a peer break the loop
            self._emit_log(f"PMI listener: internal error {exc!r}")

    def _accept_some(self) -> None:
        lsock = self._lsock
        for _ in range(64):
            if lsock is None or self._closed:
                return
            try:
                sock, _addr = lsock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    self._emit_log(f"PMI listener: accept failed ({exc.strerror}); pausing")
                    self.loop.remove_reader(lsock.fileno())
                    self.loop.call_later(0.5, self._resume_accept)
                return
            if self._pending >= self.max_pending:
                sock.close()
                if not self._refusing:
                    self._refusing = True
                    self._emit_log(f"PMI listener: {self._pending} unauthenticated connections; refusing more")
                continue
            try:
                sock.setsockopt(_socket.IPPROTO_TCP, _socket.TCP_NODELAY, 1)
                conn = _Conn(self, sock, None, tcp=True)
            except OSError:
                sock.close()
                continue
            self._pending += 1
            self._conns[conn.fd] = conn
            conn.auth_timer = self.loop.call_later(
                self.auth_timeout, lambda c=conn: c.abandon("no initack within the time limit"))

    def _resume_accept(self) -> None:
        if self._lsock is not None and not self._closed:
            self.loop.add_reader(self._lsock.fileno(), self._on_accept)

    def _authenticate(self, conn: _Conn, pmiid: Optional[str]) -> bool:
        rank = self._ids.get(int(pmiid)) if pmiid and _rx.PMI_ID.fullmatch(pmiid) else None
        if rank is None:
            conn.abandon("wrong PMI_ID")
            return False
        if rank in self._tcp_ranks:
            conn.abandon(f"PMI_ID of rank {rank} used twice")
            return False
        self._tcp_ranks.add(rank)
        conn.rank = rank
        conn.phase = READY
        self._pending -= 1
        if self._pending < self.max_pending:
            self._refusing = False
        if conn.auth_timer is not None:
            conn.auth_timer.cancel()
            conn.auth_timer = None
        return True

    # -- bookkeeping ----------------------------------------------------------
    def _check_rank(self, rank: int) -> None:
        if not 0 <= rank < self.size:
            raise ValueError(f"rank {rank} outside 0..{self.size - 1}")

    def _count(self, cmd: str) -> None:
        key = cmd if (cmd in _V1Protocol.REPLIES or cmd in _V2Protocol.COMMANDS) else "other"
        self.stats[key] = self.stats.get(key, 0) + 1
        self.stats["total"] += 1

    def _conn_closed(self, conn: _Conn) -> None:
        self._conns.pop(conn.fd, None)
        if conn.tcp and conn.rank is None:
            self._pending -= 1
            if self._pending < self.max_pending:
                self._refusing = False
        if conn.rank is not None and conn.phase in (ACTIVE, V2_PRE) and not self._closed:
            if conn.rank not in self._lost:
                self._lost.add(conn.rank)
                try:
                    self.listener.pmi_lost(conn.rank)
                except Exception as exc:
                    self._emit_log(f"PMI listener.pmi_lost raised {exc!r}")

    def _emit_abort(self, rank: Optional[int], code: int, message: str) -> None:
        try:
            self.listener.pmi_abort(rank if rank is not None else -1, code, message)
        except Exception as exc:
            self._emit_log(f"PMI listener.pmi_abort raised {exc!r}")

    def _emit_log(self, message: str) -> None:
        try:
            self.listener.pmi_log(message)
        except Exception:
            pass

    def close(self) -> None:
        """Unregister and close every socket (no pmi_lost is reported after this)."""
        self._closed = True
        for conn in list(self._conns.values()):
            conn.close()
        self.release_child_fds()
        if self._lsock is not None:
            self.loop.forget(self._lsock.fileno())
            self._lsock.close()
            self._lsock = None
