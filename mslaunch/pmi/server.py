"""PMI connections and the server of one job.

``_V1Protocol`` and ``_V2Protocol`` turn one parsed request into job-state
calls and replies, enforcing the order init -> ... -> finalize; ``_Conn``
owns a socket, its buffers and the framing; :class:`PMIServer` hands out
inherited sockets (``PMI_FD``) or listens on TCP (``PMI_PORT``/``PMI_ID``).
"""

from __future__ import annotations

import _socket
import os
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    import socket
    from typing import Callable, Dict, List, Optional, Sequence, Set, Tuple

    from ..machine.loop import Loop, Timer
    from .state import JobState, PMIListener
    from .wire import Fields

from ..machine.loop import STRANGER_GRACE, accept_strangers
from .state import KVS_MAX_BYTES, LocalJobState
from .wire import (KEYLEN_MAX, KVSNAME_MAX, MAX_ERRORS, MAX_MESSAGE, MAX_OUTPUT,
                   MAX_PREAUTH_MESSAGE, VALLEN_MAX, WireError, _decode, _rx, format_v1,
                   format_v2, parse_v1, parse_v2, take_frame, take_line)


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


def _word(text: str) -> str:
    """A message as one token of the wire (no spaces, no separators)."""
    return "".join(c if c.isalnum() or c in "_.-" else "_" for c in text[:200]) or "error"


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
            self.conn.server._started(self.conn.rank)
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
        elif not self.state.kvs_put(self.conn.rank, key, value):
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
            self.state.kvs_get(self.conn.rank, key, self.conn.deferred(answer))

    def barrier_in(self, f: Fields) -> None:
        self.conn.enter_barrier(lambda: self.send("barrier_out", rc=0))

    def finalize(self, f: Fields) -> None:
        self.conn.phase = DONE
        self.conn.server.finalized.add(self.conn.rank)
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
        conn.server._started(rank)
        # Slurm's libpmi2 needs pmi-version/pmi-subversion and takes booleans
        # only as TRUE/FALSE; MPICH reads rank, size and appnum.
        fields: Dict[str, object] = {
            "rank": rank, "size": self.state.size, "appnum": self.state.appnum(rank),
            "pmi-version": 2, "pmi-subversion": 0, "pmiverbose": "FALSE", "debugged": "FALSE"}
        if conn.server.spawner:
            fields["spawner-jobid"] = conn.server.spawner   # this job was spawned
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
        elif not self.state.kvs_put(self.conn.rank, key, value):
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
        self.conn.server.finalized.add(self.conn.rank)
        self.reply("finalize")

    def abort(self, f: Fields) -> None:
        _abort(self.conn, f)

    def spawn(self, f: Fields) -> None:
        self.conn.spawn(lambda error, jobid=None: self.reply("spawn", jobid=jobid)
                        if error is None else self.fail("spawn", _word(error))())


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
        self.mcmd: Optional[List[List[Tuple[str, str]]]] = None
        self.mcmd_bytes = 0
        self.spawn_request: object = None    # the SpawnRequest being read, or its problem
        self.waiting = 0
        self.pumping = False
        self.closed = False
        self.logged = False
        self.errors = 0
        self.auth_timer: Optional[Timer] = None
        self.accepted = time.monotonic()
        sock.setblocking(False)
        server.loop.add_reader(self.fd, self._on_readable)

    def describe(self) -> str:
        return f"rank {self.rank}" if self.rank is not None else f"unauthenticated connection fd {self.fd}"

    def log(self, text: str) -> None:
        if not self.logged:
            self.logged = True
            if self.rank is None:
                self.server._log_stranger(f"{self.describe()}: {text}")
            else:
                self.server._emit_log(f"{self.describe()}: {text}")

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
                if self.server.trace:
                    self.server._trace(self, "->", cmd, fields)
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
                if body is not None and body.startswith(b"cmd=spawn;"):
                    from .spawn import spawn_from_v2, v2_pairs
                    fields: Fields = {}
                    try:
                        pairs = v2_pairs(_decode(body))[1:]
                        # The reply echoes the client thread's id, as every reply does.
                        thrid = [v for k, v in pairs if k == "thrid"]
                        if thrid and thrid[0]:
                            fields["thrid"] = thrid[0]
                        self.spawn_request = spawn_from_v2([p for p in pairs if p[0] != "thrid"])
                    except ValueError as err:
                        self.spawn_request = str(err)
                    return "spawn", fields
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
            if not sep or not _rx.KEY.fullmatch(key):
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
            self.spawn_request = spawn_from_v1(segments)
        except ValueError as err:
            self.spawn_request = str(err)
        return "spawn", {}

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

    def spawn(self, answer: Callable[..., None]) -> None:
        """Hand the spawn request just read to the listener; ``answer(error[, jobid])``."""
        request, self.spawn_request = self.spawn_request, None
        if isinstance(request, str) or request is None:
            self.log(f"a malformed spawn request ({request})")
            answer(request or "malformed")
            return
        hook = getattr(self.server.listener, "pmi_spawn", None)
        if hook is None:
            answer("spawn_not_supported_here")
            return
        hook(self.rank, request, self.deferred(answer))

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
        if self.server.trace:
            self.server._trace_sent(self, data)
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

    #: Seconds an unauthenticated TCP connection may take to present its PMI_ID
    #: (MPICH sends it right after connecting).
    auth_timeout = 2.0
    #: Seconds a stranger is safe from newer ones (see ``run.loop.make_room``).
    evict_grace = STRANGER_GRACE
    #: At most this many lines about unauthenticated peers per window of seconds.
    stranger_log_limit = (5, 10.0)

    def __init__(self, loop: Loop, *, kvsname: str, size: int, process_mapping: str,
                 universe_size: int, appnums: Sequence[int], listener: PMIListener,
                 state: Optional[JobState] = None, spawner: Optional[str] = None) -> None:
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
        self.spawner = spawner        # the kvsname of the job that spawned this one
        self.trace = False            # every message to the listener's pmi_log (-v -v)
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
        self.started: Set[int] = set()     # ranks that initialized PMI
        self.finalized: Set[int] = set()   # ranks that finalized it
        self._lsock: Optional[socket.socket] = None
        self._host = ""
        self._port = 0
        self._ids: Dict[int, int] = {}
        self._rank_ids: List[int] = []
        self._tcp_ranks: Set[int] = set()
        self._pending = 0
        self._unauth: Dict[int, _Conn] = {}     # oldest first
        self._stranger_lines = 0
        self._stranger_suppressed = 0
        self._stranger_window: Optional[Timer] = None
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
            self._emit_log(f"listener: internal error {exc!r}")

    def _accept_some(self) -> None:
        lsock = self._lsock
        if lsock is None or self._closed:
            return
        # Idle strangers must never cost a real rank its place: the
        # longest-waiting one makes room, once it has had its time.
        for sock, _addr in accept_strangers(
                self.loop, lsock, self._unauth.values, self.max_pending,
                lambda c: c.abandon("evicted: too many unauthenticated connections"),
                lambda text: self._emit_log(f"listener: {text}"), self.evict_grace):
            if self._closed:
                sock.close()
                return
            try:
                conn = _Conn(self, sock, None, tcp=True)
            except OSError:
                sock.close()
                continue
            self._pending += 1
            self._unauth[conn.fd] = conn
            self._conns[conn.fd] = conn
            conn.auth_timer = self.loop.call_later(
                self.auth_timeout, lambda c=conn: c.abandon("no initack within the time limit"))
            # A rank sends its PMI_ID right after connecting: read it now.
            conn._on_readable()

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
        self._unauth.pop(conn.fd, None)
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
            self._unauth.pop(conn.fd, None)
        if conn.rank is not None and conn.phase in (ACTIVE, V2_PRE) and not self._closed:
            if conn.rank not in self._lost:
                self._lost.add(conn.rank)
                try:
                    self.listener.pmi_lost(conn.rank)
                except Exception as exc:
                    self._emit_log(f"listener.pmi_lost raised {exc!r}")

    def _started(self, rank: Optional[int]) -> None:
        if rank is None or rank in self.started:
            return
        self.started.add(rank)
        hook = getattr(self.listener, "pmi_started", None)
        if hook is not None:
            try:
                hook(rank)
            except Exception as exc:
                self._emit_log(f"listener.pmi_started raised {exc!r}")

    def _emit_abort(self, rank: Optional[int], code: int, message: str) -> None:
        try:
            self.listener.pmi_abort(rank if rank is not None else -1, code, message)
        except Exception as exc:
            self._emit_log(f"listener.pmi_abort raised {exc!r}")

    def _trace(self, conn: _Conn, arrow: str, cmd: str, fields: Fields) -> None:
        if cmd == "spawn" and conn.spawn_request is not None:
            what = f"cmd=spawn {conn.spawn_request!r}"[:2000]
        else:
            what = " ".join([f"cmd={cmd}"] + [f"{k}={v}" for k, v in fields.items()])
        self._emit_log(f"{conn.describe()} {arrow} {what}")

    def _trace_sent(self, conn: _Conn, data: bytes) -> None:
        text = data.decode("utf-8", "replace")
        if conn.wire == "v2":
            text = text[6:].replace(";", " ").strip()
        for line in text.splitlines():
            self._emit_log(f"{conn.describe()} <- {line}")

    def _emit_log(self, message: str) -> None:
        try:
            self.listener.pmi_log(message)
        except Exception:
            pass

    def _log_stranger(self, message: str) -> None:
        """Rate-limited log of unauthenticated peers (a flood must not flood the terminal)."""
        limit, window = self.stranger_log_limit
        if self._stranger_window is None:
            self._stranger_window = self.loop.call_later(window, self._stranger_window_end)
        if self._stranger_lines < limit:
            self._stranger_lines += 1
            self._emit_log(message)
        else:
            self._stranger_suppressed += 1

    def _stranger_window_end(self) -> None:
        self._stranger_window = None
        self._stranger_lines = 0
        if self._stranger_suppressed:
            count, self._stranger_suppressed = self._stranger_suppressed, 0
            self._emit_log(f"listener: {count} more unauthenticated connection(s) closed")

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

