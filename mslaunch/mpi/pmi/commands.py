"""The PMI-1 and PMI-2 commands of one connection.

:class:`V1Handler` and :class:`V2Handler` turn one parsed request into
:class:`~mslaunch.mpi.pmi.state.JobState` calls and replies, enforcing the order
init -> ... -> finalize.  They also read the spawn request, whose forms do not
fit the plain grammar: PMI-1's multi-line ``mcmd=spawn`` message and PMI-2's
``spawn`` frame with repeated keys.  The connection they serve is named here
only as the :class:`Conn` protocol; the server imports this module when a
connection's first message arrives, so a job whose ranks never speak PMI
does not load it.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Dict, List, Optional, Protocol, Tuple

    from .state import JobState
    from .wire import Fields

    class Conn(Protocol):
        """What a handler needs of its connection."""

        rank: Optional[int]
        phase: str
        spawn_request: object   # the spawn request just read, or its problem

        def send(self, data: bytes) -> None: ...
        def abandon(self, why: str) -> None: ...
        def violation(self, send_error: Callable[[], None], why: str) -> None: ...
        def deferred(self, answer: Callable[..., None]) -> Callable[..., None]: ...
        def enter_barrier(self, answer: Callable[[], None]) -> None: ...
        def spawn(self, answer: Callable[..., None]) -> None: ...
        def switch_to_v2(self) -> None: ...
        def authenticate(self, pmiid: Optional[str]) -> bool: ...
        def initialized(self) -> None: ...
        def finalized(self) -> None: ...
        def aborted(self, code: int, message: str) -> None: ...

from . import ABORTED, ACTIVE, DONE, NEW, READY, V2_PRE
from .state import KVS_MAX_BYTES
from .wire import (
    KEYLEN_MAX,
    KVSNAME_MAX,
    MAX_MESSAGE,
    VALLEN_MAX,
    WireError,
    _decode,
    is_key,
    format_v1,
    format_v2,
    parse_v1,
    parse_v2,
)


def _int(text: Optional[str], default: int) -> int:
    try:
        return int(text) if text is not None else default
    except ValueError:
        return default


def _rank(conn: Conn) -> int:
    """The rank of an authenticated connection (the only kind past NEW)."""
    rank = conn.rank
    assert rank is not None, "a request before authentication"
    return rank


def _word(text: str) -> str:
    """A message as one token of the wire (no spaces, no separators)."""
    return "".join(c if c.isalnum() or c in "_.-" else "_" for c in text[:200]) or "error"


def _abort(conn: Conn, f: Fields) -> None:
    """``abort`` on either wire: report the rank and its code; no reply."""
    # PMI-2 MPICH sends exitcode=-1 (the MPI_Abort code is lost on that wire)
    # and exits 255; Slurm's client sends isworld= and msg= and no exitcode.
    code = _int(f.get("exitcode"), 1)
    conn.aborted(code & 0xFF if code < 0 else code, f.get("message") or f.get("msg", ""))


class V1Handler:
    """PMI-1 requests of one connection."""

    REPLIES = {
        "init": "response_to_init", "initack": "initack", "get_maxes": "maxes",
        "get_appnum": "appnum", "get_my_kvsname": "my_kvsname",
        "get_universe_size": "universe_size", "put": "put_result", "get": "get_result",
        "barrier_in": "barrier_out", "finalize": "finalize_ack",
        "publish_name": "publish_result", "lookup_name": "lookup_result",
        "unpublish_name": "unpublish_result", "spawn": "spawn_result", "abort": "",
    }

    def __init__(self, conn: Conn, state: JobState) -> None:
        self.conn = conn
        self.state = state
        self.mcmd: Optional[List[List[Tuple[str, str]]]] = None
        self.mcmd_bytes = 0

    def send(self, cmd: str, **fields: object) -> None:
        self.conn.send(format_v1(cmd, fields))

    def read(self, text: str) -> Optional[Tuple[str, Fields]]:
        """One line of input as a request, or None inside a multi-line one."""
        if self.mcmd is None and not text.startswith("mcmd="):
            return parse_v1(text)
        # The spawn form: one key=value per line, a segment per command closed
        # by `endcmd`; complete when spawnssofar == totspawns at an `endcmd`.
        if self.mcmd is None:
            self.mcmd, self.mcmd_bytes = [[]], 0
        self.mcmd_bytes += len(text) + 1
        if self.mcmd_bytes > MAX_MESSAGE:
            raise WireError("multi-line spawn message too long")
        segment = self.mcmd[-1]
        if text != "endcmd":
            key, sep, value = text.partition("=")
            if not sep or not is_key(key):
                raise WireError(f"bad line in multi-line message: {text[:40]!r}")
            segment.append((key, value))
            return None
        fields = dict(segment)
        if _int(fields.get("spawnssofar"), 0) < _int(fields.get("totspawns"), 0):
            self.mcmd.append([])
            return None
        segments, self.mcmd = self.mcmd, None
        from .spawn import spawn_from_v1
        try:
            self.conn.spawn_request = spawn_from_v1(segments)
        except ValueError as err:
            self.conn.spawn_request = str(err)
        return "spawn", {}

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
        if not conn.authenticate(f.get("pmiid")):
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
            self.conn.initialized()
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
        self.send("appnum", rc=0, appnum=self.state.appnum(_rank(self.conn)))

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
        elif not self.state.kvs_put(_rank(self.conn), key, value):
            self.conn.violation(lambda: self.send("put_result", rc=1, msg="kvs_full"),
                                f"the job's key-value space is full ({KVS_MAX_BYTES} bytes)")
        else:
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
            self.state.kvs_get(_rank(self.conn), key, self.conn.deferred(answer))

    def barrier_in(self, f: Fields) -> None:
        self.conn.enter_barrier(lambda: self.send("barrier_out", rc=0))

    def finalize(self, f: Fields) -> None:
        self.conn.finalized()
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
        self.conn.spawn(lambda error, jobid=None: self.send("spawn_result", rc=0)
                        if error is None else self.send("spawn_result", rc=1, msg=_word(error)))


class V2Handler:
    """PMI-2 requests of one connection."""

    COMMANDS = {
        "init", "fullinit", "job-getid", "kvs-put", "kvs-get", "kvs-fence", "info-getjobattr",
        "info-putnodeattr", "info-getnodeattr", "name-publish", "name-lookup",
        "name-unpublish", "finalize", "abort", "spawn",
    }

    def __init__(self, conn: Conn, state: JobState, spawner: Optional[str]) -> None:
        self.conn = conn
        self.state = state
        self.spawner = spawner    # the kvsname of the job that spawned this one
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

    def read(self, body: bytes) -> Tuple[str, Fields]:
        """One frame's body as a request."""
        if not body.startswith(b"cmd=spawn;"):
            return parse_v2(_decode(body))
        from .spawn import spawn_from_v2, v2_pairs
        fields: Fields = {}
        try:
            pairs = v2_pairs(_decode(body))[1:]
            # The reply echoes the client thread's id, as every reply does.
            thrid = [v for k, v in pairs if k == "thrid"]
            if thrid and thrid[0]:
                fields["thrid"] = thrid[0]
            self.conn.spawn_request = spawn_from_v2([p for p in pairs if p[0] != "thrid"])
        except ValueError as err:
            self.conn.spawn_request = str(err)
        return "spawn", fields

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
            if not conn.authenticate(f.get("pmirank")):
                return
        # On an inherited socket the fd identifies the rank; pmirank is advisory.
        conn.initialized()
        rank = _rank(conn)
        # Slurm's libpmi2 needs pmi-version/pmi-subversion and takes booleans
        # only as TRUE/FALSE; MPICH reads rank, size and appnum.
        fields: Dict[str, object] = {
            "rank": rank, "size": self.state.size, "appnum": self.state.appnum(rank),
            "pmi-version": 2, "pmi-subversion": 0, "pmiverbose": "FALSE", "debugged": "FALSE"}
        if self.spawner:
            fields["spawner-jobid"] = self.spawner   # this job was spawned
        self.reply("fullinit", **fields)

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
        elif not self.state.kvs_put(_rank(self.conn), key, value):
            self.conn.violation(self.fail("kvs-put", "kvs_full"),
                                f"the job's key-value space is full ({KVS_MAX_BYTES} bytes)")
        else:
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
            self.state.kvs_get(_rank(self.conn), f["key"], self.conn.deferred(answer))

    def kvs_fence(self, f: Fields) -> None:
        self.conn.enter_barrier(lambda: self.reply("kvs-fence"))

    def info_getjobattr(self, f: Fields) -> None:
        if self._need("info-getjobattr", f, "key"):
            self._found("info-getjobattr")(self.state.job_attr(f["key"]))

    def info_putnodeattr(self, f: Fields) -> None:
        if self._need("info-putnodeattr", f, "key", "value"):
            self.state.node_attr_put(_rank(self.conn), f["key"], f["value"])
            self.reply("info-putnodeattr")

    def info_getnodeattr(self, f: Fields) -> None:
        if self._need("info-getnodeattr", f, "key"):
            self.state.node_attr_get(_rank(self.conn), f["key"], f.get("wait") == "TRUE",
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
        self.conn.finalized()
        self.reply("finalize")

    def abort(self, f: Fields) -> None:
        _abort(self.conn, f)

    def spawn(self, f: Fields) -> None:
        self.conn.spawn(lambda error, jobid=None: self.reply("spawn", jobid=jobid)
                        if error is None else self.fail("spawn", _word(error))())


#: The commands counted by name in the server's statistics (others as "other").
COUNTED = frozenset(V1Handler.REPLIES) | V2Handler.COMMANDS
