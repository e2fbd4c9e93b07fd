"""Agents on the job's remote hosts over paramiko: the connections (the starter is :mod:`.starter`).

paramiko is imported in the background (:mod:`.paramiko_import`) while the
TCP connections are being opened.  Every host is connected in parallel (at most
``concurrency`` at once, and at most :data:`PER_SSHD` handshakes to any one
sshd, below OpenSSH's ``MaxStartups``), each with a connect timeout.

The user's OpenSSH setup is honoured: ``~/.ssh/config`` found through
``$HOME`` (``Host``, ``Match``, ``HostName``, ``User``, ``Port``,
``IdentityFile``, ``IdentitiesOnly``, ``ConnectTimeout``, ``ProxyJump``,
``ProxyCommand``, ``HostKeyAlias``, ``UserKnownHostsFile``,
``StrictHostKeyChecking``, and ``Include``, which paramiko does not read and
is expanded here), the ssh-agent, the default keys, ``~/.ssh/known_hosts``
and ``/etc/ssh/ssh_known_hosts`` (hashed entries too).  A host whose key is
unknown is refused with the ``ssh-keyscan`` line that would trust it, unless
``--ssh-accept-new`` (or ``StrictHostKeyChecking accept-new``) adds it, as
OpenSSH's ``accept-new`` does; a changed key is always refused.  Nothing
ever prompts: keys with a passphrase are used only through the agent.

Each failing host is reported with its stage -- resolve, connect, host key,
authentication, remote Python, agent start -- and the reason; when any host
fails, the agents already started on the others are stopped (their link
closes, so they exit) before the error is raised.

The user's files are read in :mod:`.files`, the agent's channel is
:mod:`.channel`'s; here are one host's connection (socket, jump hosts,
handshake, host key, login) and the pool of them.
"""

from __future__ import annotations

import os
import socket
import threading

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple


from .....core.errors import HostsFailed, LaunchError
from ... import bootstrap
from .....machine import timeline
from .paramiko_import import paramiko_module, start_import
from .channel import SSHAgentConnection, _QuickAck, start_agent
from .files import Config, HostFailure, KnownHosts, authenticate, short_reason

#: Simultaneous handshakes to one sshd (OpenSSH drops some above 10 by default).
PER_SSHD = 8
#: Connections being set up at once, over all hosts.
CONCURRENCY = 64


class Options:
    """SSH settings from the command line (they win over ``~/.ssh/config``)."""

    def __init__(self, *, config: Optional[str] = None, user: Optional[str] = None,
                 port: Optional[int] = None, identity: Optional[str] = None,
                 accept_new: bool = False, connect_timeout: float = 10.0,
                 pythons: Sequence[str] = (), wrapper: Sequence[str] = ()) -> None:
        self.config = config
        self.user = user
        self.port = port
        self.identity = identity
        self.accept_new = accept_new
        self.connect_timeout = connect_timeout
        self.pythons = tuple(pythons)
        self.wrapper = tuple(wrapper)


class _Connector:
    """Sets up the agents of many hosts in parallel."""

    def __init__(self, options: Options, pythons: Sequence[str], per_sshd: int = PER_SSHD) -> None:
        self.options = options
        self.per_sshd = per_sshd
        self.command = bootstrap.remote_command(pythons, options.wrapper)
        self.config = Config(options.config)
        self.paramiko: Any = None
        self.known: Optional[KnownHosts] = None
        self.sshd_slots: Dict[Tuple[str, int], threading.Semaphore] = {}
        self.jumps: Dict[str, Any] = {}
        self.lock = threading.Lock()

    def settings(self, name: str) -> Dict[str, Any]:
        opts = self.options
        return self._settings(name, opts.user, opts.port, opts.identity)

    def _settings(self, name: str, user: Optional[str], port: Optional[int],
                  identity: Optional[str] = None) -> Dict[str, Any]:
        # user, port, identity: what ssh's -l, -p and -i would say (for a jump
        # host, its ProxyJump entry's; --ssh-* are for the hosts of the job).
        opts = self.options
        cfg = self.config.lookup(name, user, port)
        try:
            port = int(cfg.get("port", 22))
        except ValueError:
            raise HostFailure("resolve", f"~/.ssh/config: Port {cfg['port']!r} of {name} "
                                         f"is not a number") from None
        user = cfg.get("user") or self.config.local_user
        identities = [identity] if identity else list(cfg.get("identityfile") or [])
        timeout = opts.connect_timeout
        if "connecttimeout" in cfg:
            try:
                timeout = float(cfg["connecttimeout"])
            except ValueError:
                pass
        return {"hostname": cfg.get("hostname", name), "port": port, "user": user,
                "identities": identities, "timeout": timeout,
                "identities_only": str(cfg.get("identitiesonly", "no")).lower() == "yes",
                "proxyjump": _unless_none(cfg.get("proxyjump")),
                "proxycommand": _unless_none(cfg.get("proxycommand")),
                "alias": cfg.get("hostkeyalias"),
                "accept_new": _accepts_new(opts.accept_new, cfg.get("stricthostkeychecking")),
                "known_files": KnownHosts.files(cfg.get("userknownhostsfile"),
                                                cfg.get("globalknownhostsfile"))}

    # -- the network ----------------------------------------------------------
    def open_socket(self, s: Dict[str, Any]):
        """A connected TCP socket to the host (no SSH yet)."""
        try:
            infos = socket.getaddrinfo(s["hostname"], s["port"], type=socket.SOCK_STREAM)
        except socket.gaierror as err:
            raise HostFailure("resolve", f"cannot resolve {s['hostname']!r}: "
                                         f"{err.strerror}") from None
        last: Optional[OSError] = None
        for family, kind, proto, _, addr in infos:
            sock = socket.socket(family, kind, proto)
            sock.settimeout(s["timeout"])
            try:
                sock.connect(addr)
                sock.settimeout(None)
                # paramiko sends some messages back to back (NEWKEYS, then
                # the service request): with Nagle on, the second waits for
                # the ACK of the first, which the server delays by up to 40 ms.
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                return sock, addr
            except OSError as err:
                sock.close()
                last = err
        reason = "timed out" if isinstance(last, socket.timeout) else \
            (last.strerror if last and last.strerror else str(last))
        raise HostFailure("connect", f"{s['hostname']} port {s['port']}: {reason}")

    def transport(self, name: str, s: Dict[str, Any], sock=None):
        """An authenticated paramiko transport to host ``name``."""
        paramiko = self.paramiko
        if s["proxycommand"] and sock is None:
            try:
                sock = paramiko.ProxyCommand(s["proxycommand"])
            except Exception as err:
                raise HostFailure("connect", f"ProxyCommand failed: {err}") from None
        elif s["proxyjump"] and sock is None:
            sock = self.through_jump(s)
        elif sock is None:
            sock, _ = self.open_socket(s)
        addr = (s["hostname"], s["port"])
        slot = self._sshd_slot(addr)
        with slot:
            transport = paramiko.Transport(_QuickAck(sock) if isinstance(sock, socket.socket)
                                           else sock)
            # The banner is waited for as long as the handshake (paramiko's own
            # wait is 15 s whatever --ssh-timeout says), and a moment more: a
            # silent server is then told by start_client's own time-out below.
            transport.banner_timeout = s["timeout"] + 1.0
            try:
                transport.start_client(timeout=s["timeout"])
            except Exception as err:
                transport.close()
                raise HostFailure("connect", f"SSH handshake with {s['hostname']} failed: "
                                             f"{handshake_reason(err)}") from None
            if not getattr(transport, "initial_kex_done", True):
                # start_client returns at its timeout without a word; paramiko's
                # thread would go on waiting for the banner (15 s more).
                transport.close()
                raise HostFailure("connect", f"SSH handshake with {s['hostname']} timed out "
                                             f"after {s['timeout']:g} s (no SSH answer: a slow "
                                             f"or overloaded sshd, or not an SSH server)")
            try:
                self.check_host_key(transport, s)
                authenticate(self.paramiko, transport, s)
            except BaseException:
                transport.close()
                raise
        return transport

    def through_jump(self, s: Dict[str, Any]):
        """A channel to the host through its ``ProxyJump`` host(s)."""
        hops = [h.strip() for h in s["proxyjump"].split(",") if h.strip()]
        transport = None
        for hop in hops + [None]:
            target = s if hop is None else self._hop_settings(hop)
            if transport is None:
                transport = self._jump_transport(hop, target)
                continue
            try:
                channel = transport.open_channel("direct-tcpip", (target["hostname"],
                                                                   target["port"]),
                                                 ("127.0.0.1", 0), timeout=target["timeout"])
            except Exception as err:
                raise HostFailure("connect", f"through ProxyJump to {target['hostname']}: "
                                             f"{short_reason(err)}") from None
            if hop is None:
                return channel
            transport = self._jump_transport(hop, target, channel)
        raise HostFailure("connect", "empty ProxyJump")

    def _hop_settings(self, hop: str) -> Dict[str, Any]:
        user, _, rest = hop.rpartition("@")
        host, _, port = rest.partition(":")
        if port and not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
            raise HostFailure("resolve", f"ProxyJump {hop}: the port is not a number")
        s = self._settings(host, user or None, int(port) if port else None)
        s["proxyjump"] = None
        return s

    def _jump_transport(self, hop: str, s: Dict[str, Any], sock=None):
        key = f"{s['user']}@{s['hostname']}:{s['port']}"
        with self.lock:
            lock = self.jumps.setdefault(key + "#lock", threading.Lock())
        with lock:
            transport = self.jumps.get(key)
            if transport is None or not transport.is_active():
                transport = self.transport(hop, s, sock)
                self.jumps[key] = transport
            return transport

    def _sshd_slot(self, addr: Tuple[str, int]) -> threading.Semaphore:
        with self.lock:
            return self.sshd_slots.setdefault(addr, threading.Semaphore(self.per_sshd))

    def check_host_key(self, transport, s: Dict[str, Any]) -> None:
        key = transport.get_remote_server_key()
        host = s["alias"] or s["hostname"]
        lookup = host if s["port"] == 22 else f"[{host}]:{s['port']}"
        assert self.known is not None
        self.known.check(lookup, key, s["accept_new"], s["hostname"], s["port"],
                         *s["known_files"])

    def _paramiko_ready(self) -> None:
        """Wait for paramiko's import (once); read the known hosts."""
        with self.lock:
            if self.paramiko is None:
                paramiko = paramiko_module()
                self.known = KnownHosts(paramiko)
                self.paramiko = paramiko

    def connect(self, name: str) -> SSHAgentConnection:
        s = self.settings(name)
        sock = None
        if not s["proxycommand"] and not s["proxyjump"]:
            # The TCP connection, and sshd's start of a session process, go
            # ahead while paramiko is still being imported.
            sock, _ = self.open_socket(s)
            timeline.mark("TCP connected", name)
        try:
            self._paramiko_ready()
        except BaseException:
            if sock is not None:
                sock.close()
            raise
        timeline.mark("paramiko imported", name)
        transport = self.transport(name, s, sock)
        timeline.mark("SSH logged in", name)
        try:
            return start_agent(name, transport, self.command)
        except BaseException:
            transport.close()
            raise


def connect_each(connector: _Connector, names: Sequence[str], concurrency: int,
                 up: Callable[[str, SSHAgentConnection], None],
                 failed: Callable[[str, HostFailure], None],
                 halt: threading.Event) -> List[threading.Thread]:
    """Start the agents of ``names`` in at most ``concurrency`` threads, telling
    ``up`` or ``failed`` of each host (from those threads), until ``halt`` is
    set; the threads, started."""
    lock = threading.Lock()
    todo = list(names)

    def work() -> None:
        while True:
            with lock:
                if not todo or halt.is_set():
                    return
                name = todo.pop(0)
            try:
                conn = connector.connect(name)
            except HostFailure as err:
                failed(name, err)
                continue
            except LaunchError as err:
                failed(name, HostFailure("connect", str(err)))
                continue
            except Exception as err:   # never a traceback for a host's trouble
                failed(name, HostFailure("connect", short_reason(err)))
                continue
            up(name, conn)

    workers = [threading.Thread(target=work, daemon=True, name=f"connect-{i}")
               for i in range(min(concurrency, len(names)))]
    for w in workers:
        w.start()
    return workers


def connect_all(names: Sequence[str], options: Options,
                cancelled: Optional[Callable[[], bool]] = None) -> Dict[str, SSHAgentConnection]:
    """Start an agent on every host in ``names``; all of them, or HostsFailed (with
    those that started).

    ``cancelled`` is polled while waiting: when it turns true, the hosts
    still connecting are abandoned and a LaunchError is raised.
    """
    start_import()
    connector = _Connector(options, options.pythons)
    failures: Dict[str, HostFailure] = {}
    done: Dict[str, SSHAgentConnection] = {}
    lock = threading.Lock()
    halt = threading.Event()

    def up(name: str, conn: SSHAgentConnection) -> None:
        with lock:
            if not halt.is_set():
                done[name] = conn
                return
        conn.close(wait=0)
        os.close(conn.fd)

    def failed(name: str, err: HostFailure) -> None:
        with lock:
            failures[name] = err

    for w in connect_each(connector, names, CONCURRENCY, up, failed, halt):
        while w.is_alive():
            w.join(0.05)
            timeline.tick()
            if cancelled is not None and cancelled():
                with lock:
                    halt.set()
                close_all(done)
                raise LaunchError("stopped while connecting to the remote hosts", 130)
    for transport in connector.jumps.values():
        if not isinstance(transport, type(lock)) and failures and not done:
            try:
                transport.close()
            except Exception:
                pass
    if failures:
        raise HostsFailed(describe_failures(failures, len(names)),
                          {name: str(f) for name, f in failures.items()}, done,
                          [name for name, f in failures.items() if f.stage == "connect"])
    return done


def close_all(conns: Dict[str, Any]) -> None:
    """Close the links of agents that will not be used (each exits)."""
    for conn in conns.values():
        conn.close()
        os.close(conn.fd)


def handshake_reason(err: BaseException) -> str:
    """Why paramiko's handshake failed, in a user's words (its own are terse)."""
    text = short_reason(err)
    if text.startswith("Indecipherable protocol version"):
        said = text.split('"', 1)[1].rstrip('"') if '"' in text else ""
        return (f"not an SSH server: it answered {said[:60]!r}" if said.strip() else
                "not an SSH server: no SSH banner")
    if text.startswith("Error reading SSH protocol banner"):
        return ("no SSH banner: the other end closed or reset the connection without "
                "speaking SSH (not an SSH server, or an sshd refusing new connections: its "
                "MaxStartups or PerSourcePenalties, or a fault of its own that its log names)")
    if isinstance(err, (EOFError, ConnectionError)) or text == "Negotiation failed.":
        return "the connection was closed during the key exchange"
    return text


def _accepts_new(flag: bool, strict: Any) -> bool:
    """Whether a host key not known yet is added: ``--ssh-accept-new`` (as ssh's
    ``-o`` over its config), else the host's ``StrictHostKeyChecking``:
    ``accept-new`` (and ``no``/``off``, which adds new keys too, but here never
    takes a changed one); ``yes`` and ``ask`` (no one to ask) refuse it."""
    return flag or str(strict or "").lower() in ("accept-new", "no", "off")


def _unless_none(value: Any) -> Any:
    """A ProxyJump or ProxyCommand setting; None for none (OpenSSH's "none" too)."""
    return None if value is None or str(value).lower() == "none" else value


def describe_failures(failures: Dict[str, HostFailure], total: int) -> str:
    """One line: the failing hosts grouped by stage and reason (unknown host keys
    in one group, with one command that trusts them all)."""
    groups: Dict[str, List[str]] = {}
    unknown = [name for name in sorted(failures) if failures[name].unknown_key is not None]
    if len(unknown) > 1:
        groups[_unknown_keys(unknown, failures)] = unknown
    for name in sorted(failures):
        err = failures[name]
        if name not in unknown or len(unknown) == 1:
            groups.setdefault(f"{err.stage}: {err.reason}", []).append(name)
    from .....hosts.ranges import host_ranges
    parts = [f"{host_ranges(hosts)} ({what})" for what, hosts in groups.items()]
    return (f"cannot start the job's agent on {len(failures)} of {total} remote host(s); "
            f"nothing was started: " + "; ".join(parts))


def _unknown_keys(names: List[str], failures: Dict[str, HostFailure]) -> str:
    """The reason of several hosts whose keys are not in known_hosts, said once."""
    scans: Dict[str, List[str]] = {}       # "ssh-keyscan [-p P] -t TYPE" -> the hosts' names
    for name in names:
        scan = failures[name].unknown_key[0]      # type: ignore[index]
        command, _, host = scan.rpartition(" ")
        scans.setdefault(command, []).append(host)
    commands = " and ".join(f"{command} {' '.join(hosts)} >> ~/.ssh/known_hosts"
                            for command, hosts in scans.items())
    prints = ", ".join(f"{name} {failures[name].unknown_key[1]}"  # type: ignore[index]
                       for name in names[:4])
    more = f" and {len(names) - 4} more" if len(names) > 4 else ""
    return (f"host key: not in known_hosts; after checking their fingerprints ({prints}{more}), "
            f"trust them with: {commands}, or run with --ssh-accept-new")
