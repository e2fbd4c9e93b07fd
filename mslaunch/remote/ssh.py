"""SSH connections to the job's remote hosts, and their agents, with paramiko.

paramiko is imported here only, when a plan has remote hosts, and in a
thread while the TCP connections are being opened, so that its import
(about half a second with ``invoke`` installed, which is kept out) overlaps
with the network.  Every host is connected in parallel (at most
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
"""

from __future__ import annotations

import errno
import glob
import os
import socket
import sys
import threading
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..errors import LaunchError
from . import bootstrap, link

#: Simultaneous handshakes to one sshd (OpenSSH drops some above 10 by default).
PER_SSHD = 8
#: Connections being set up at once, over all hosts.
CONCURRENCY = 64
#: Seconds for the remote side to answer once the command runs.
AGENT_TIMEOUT = 60.0
DEFAULT_KEYS = ("id_ed25519", "id_ecdsa", "id_rsa", "id_dsa")


class HostFailure(Exception):
    """One host could not be set up; ``stage`` says where it failed."""

    def __init__(self, stage: str, reason: str) -> None:
        super().__init__(f"{stage}: {reason}")
        self.stage = stage
        self.reason = reason


class Options:
    """SSH settings from the command line (they win over ``~/.ssh/config``)."""

    def __init__(self, *, config: Optional[str] = None, user: Optional[str] = None,
                 port: Optional[int] = None, identity: Optional[str] = None,
                 accept_new: bool = False, connect_timeout: float = 10.0,
                 pythons: Sequence[str] = ()) -> None:
        self.config = config
        self.user = user
        self.port = port
        self.identity = identity
        self.accept_new = accept_new
        self.connect_timeout = connect_timeout
        self.pythons = tuple(pythons)


# ---------------------------------------------------------------------------
# paramiko, imported once and in the background

_paramiko: Dict[str, Any] = {}
_import_done = threading.Event()


def _paramiko_version() -> Optional[str]:
    """paramiko's version from its ``dist-info`` directory, without importlib.metadata."""
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for name in names:
            if name.startswith("paramiko-") and name.endswith(".dist-info"):
                return name[len("paramiko-"):-len(".dist-info")]
    return None


class _Metadata:
    """Stands in for :mod:`importlib.metadata` while paramiko is imported.

    paramiko's ``__init__`` asks it for its own version only, and the module
    (with :mod:`email` and :mod:`zipfile` behind it) costs about 15 ms, on
    the path of every remote launch.  Anything else is the real module's.
    """

    def __init__(self, version: str) -> None:
        self.__name__ = "importlib.metadata"
        self._version = version

    def version(self, name: str) -> str:
        return self._version if name == "paramiko" else self.__getattr__("version")(name)

    def __getattr__(self, name: str):
        if name.startswith("__"):     # the import system's look-ups (__spec__...)
            raise AttributeError(name)
        if sys.modules.get("importlib.metadata") is self:
            del sys.modules["importlib.metadata"]
        import importlib.metadata
        return getattr(importlib.metadata, name)


def _import_paramiko() -> None:
    try:
        # paramiko.config imports invoke when it is installed (for Match
        # exec); that costs a tenth of a second and is not needed here.
        blocked = "invoke" not in sys.modules
        if blocked:
            sys.modules["invoke"] = None  # type: ignore[assignment]
        stand_in = None
        if "importlib.metadata" not in sys.modules:
            version = _paramiko_version()
            if version is not None:
                stand_in = sys.modules["importlib.metadata"] = _Metadata(version)  # type: ignore
        try:
            import paramiko
        finally:
            if blocked:
                sys.modules.pop("invoke", None)
            if stand_in is not None and sys.modules.get("importlib.metadata") is stand_in:
                del sys.modules["importlib.metadata"]
        _paramiko["module"] = paramiko
    except Exception as err:  # ImportError, or a broken install
        _paramiko["error"] = err
    finally:
        _import_done.set()


def start_import() -> None:
    """Begin importing paramiko in a thread (once)."""
    if not _paramiko and not _import_done.is_set() and "thread" not in _paramiko:
        thread = threading.Thread(target=_import_paramiko, name="import-paramiko", daemon=True)
        _paramiko["thread"] = thread
        bootstrap.finish_before_exit(thread)


def import_finished() -> None:
    """Wait until paramiko's import, once started, has succeeded or failed."""
    if "thread" in _paramiko or _import_done.is_set():
        _import_done.wait()


def paramiko_module():
    start_import()
    _import_done.wait()
    if "error" in _paramiko:
        raise LaunchError("remote hosts need paramiko: pip install 'mslaunch[ssh]' "
                          f"({_paramiko['error']})")
    return _paramiko["module"]


# ---------------------------------------------------------------------------
# ~/.ssh/config

def _home() -> str:
    return os.environ.get("HOME") or os.path.expanduser("~")


def _expand_includes(path: str, depth: int = 0) -> str:
    """The config text with ``Include`` lines replaced by the files they name."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().split("\n")
    except OSError:
        return ""
    out = []
    ssh_dir = os.path.join(_home(), ".ssh")
    for line in lines:
        words = line.strip().split(None, 1)
        if words and words[0].lower() == "include" and len(words) == 2 and depth < 8:
            for pattern in words[1].split():
                pattern = os.path.expanduser(pattern.replace("~", _home(), 1)
                                             if pattern.startswith("~") else pattern)
                if not os.path.isabs(pattern):
                    pattern = os.path.join(ssh_dir, pattern)
                for included in sorted(glob.glob(pattern)):
                    out.append(_expand_includes(included, depth + 1))
        else:
            out.append(line)
    return "\n".join(out)


class _Config:
    """``~/.ssh/config`` (or ``--ssh-config``), Include expanded (see :mod:`.sshconfig`)."""

    def __init__(self, path: Optional[str]) -> None:
        from .sshconfig import ConfigError, SSHConfig, login_name
        path = path or os.path.join(_home(), ".ssh", "config")
        self.local_user = login_name()
        self.config: Optional[SSHConfig] = None
        self.error = ""
        try:
            self.config = SSHConfig(_expand_includes(path) if os.path.exists(path) else "",
                                    origin=path, local_user=self.local_user)
        except ConfigError as err:    # said for every host, which all use the file
            self.error = str(err)

    def lookup(self, name: str, user: Optional[str] = None,
               port: Optional[int] = None) -> Dict[str, Any]:
        from .sshconfig import ConfigError
        if self.config is None:
            raise HostFailure("resolve", self.error)
        try:
            return self.config.lookup(name, user, port)
        except ConfigError as err:
            raise HostFailure("resolve", str(err)) from None


# ---------------------------------------------------------------------------
# known hosts

class _KnownHosts:
    """The known host keys, and adding new ones (``accept-new``)."""

    def __init__(self, paramiko, extra: Sequence[str] = ()) -> None:
        self.paramiko = paramiko
        self.keys = paramiko.HostKeys()
        self.user_file = os.path.join(_home(), ".ssh", "known_hosts")
        self.files = [self.user_file, "/etc/ssh/ssh_known_hosts", *extra]
        for path in self.files:
            self._load(path)
        self.lock = threading.Lock()

    def _load(self, path: str) -> None:
        try:
            self.keys.load(os.path.expanduser(path))
        except (OSError, IOError):
            pass
        except Exception:   # a line paramiko cannot read (e.g. @cert-authority)
            pass

    def add_files(self, paths: Sequence[str]) -> None:
        for path in paths:
            if path not in self.files:
                self.files.append(path)
                self._load(path)

    def check(self, lookup: str, key, accept_new: bool, shown: str, port: int) -> None:
        known = self.keys.lookup(lookup)
        if known is not None and key.get_name() in known:
            if known[key.get_name()] == key:
                return
            raise HostFailure("host key", f"the host key of {shown} has CHANGED since it was "
                              f"recorded in known_hosts (possibly someone in the middle); if the "
                              f"change is expected, remove the old key with: ssh-keygen -R "
                              f"{bootstrap.shell_quote(lookup)}")
        if known is not None and not accept_new:
            raise HostFailure("host key", f"{shown} offered a {key.get_name()} key, but "
                              f"known_hosts holds only {', '.join(known.keys())} for it")
        if not accept_new:
            scan = f"ssh-keyscan {'-p ' + str(port) + ' ' if port != 22 else ''}" \
                   f"-t {key.get_name()} {lookup.strip('[]').rsplit(']:', 1)[0]}"
            raise HostFailure("host key", f"{shown} is not in known_hosts; after checking its "
                              f"fingerprint ({_fingerprint(key)}), trust it with: {scan} >> "
                              f"~/.ssh/known_hosts, or run with --ssh-accept-new")
        with self.lock:
            self.keys.add(lookup, key.get_name(), key)
            os.makedirs(os.path.dirname(self.user_file), mode=0o700, exist_ok=True)
            with open(self.user_file, "a") as f:
                f.write(f"{lookup} {key.get_name()} {key.get_base64()}\n")


def _fingerprint(key) -> str:
    import base64
    import hashlib
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


# ---------------------------------------------------------------------------
# one host

class AgentConnection:
    """A running agent: the SSH transport and channel, and the link's descriptor.

    ``fd`` is the launcher's end of a socket pair; two threads copy bytes
    between it and the SSH channel, a third keeps the agent's stderr (the
    last 4 KiB, shown if the host is lost).
    """

    def __init__(self, name: str, transport, channel, leftover: bytes,
                 hello: Dict[str, Any]) -> None:
        self.name = name
        self.transport = transport
        self.channel = channel
        self.hello = hello
        self.stderr_tail = b""
        self.ended_because = ""     # the seam's "why the link was cut", when known here
        ours, theirs = socket.socketpair()
        self._sock = theirs
        self.fd = ours.detach()
        self._threads = [
            threading.Thread(target=self._up, args=(leftover,), daemon=True,
                             name=f"ssh-up-{name}"),
            threading.Thread(target=self._down, daemon=True, name=f"ssh-down-{name}"),
            threading.Thread(target=self._stderr, daemon=True, name=f"ssh-err-{name}")]
        for thread in self._threads:
            thread.start()

    def _up(self, leftover: bytes) -> None:
        try:
            if leftover:
                self._sock.sendall(leftover)
            while True:
                data = self.channel.recv(1 << 18)
                if not data:
                    break
                self._sock.sendall(data)
        except (OSError, EOFError, Exception):
            pass
        try:
            self._sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def _down(self) -> None:
        try:
            while True:
                data = self._sock.recv(1 << 18)
                if not data:
                    break
                self.channel.sendall(data)
        except (OSError, EOFError, Exception):
            pass
        try:
            self.channel.shutdown_write()
        except Exception:
            pass

    def _stderr(self) -> None:
        try:
            while True:
                data = self.channel.recv_stderr(4096)
                if not data:
                    break
                self.stderr_tail = (self.stderr_tail + data)[-4096:]
        except Exception:
            pass

    @property
    def local_address(self) -> Optional[str]:
        """This machine's address on the connection to the host (None through a proxy)."""
        sock = getattr(self.transport, "sock", None)
        if isinstance(sock, _QuickAck):
            sock = sock.socket
        if not isinstance(sock, socket.socket):
            return None
        try:
            return sock.getsockname()[0]
        except OSError:
            return None

    def wait_exit(self, deadline: float) -> bool:
        """Wait until the agent has closed its end (it exited); False at ``deadline``."""
        self._threads[0].join(max(0.0, deadline - time.monotonic()))
        return not self._threads[0].is_alive()

    def close(self, wait: float = 1.0) -> None:
        """Close the link (the agent sees end-of-file and exits) and the connection."""
        deadline = time.monotonic() + wait
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        try:
            self.channel.close()
        except Exception:
            pass
        try:
            self.transport.close()
        except Exception:
            pass
        self._sock.close()


class _QuickAck:
    """A TCP socket for paramiko that acknowledges what it receives at once.

    sshd (which keeps Nagle's algorithm on for commands without a terminal)
    holds a small packet back until its previous one is acknowledged, and
    Linux delays acknowledgements by up to 40 ms once a connection looks
    interactive: the channel's opening waited that long.  ``TCP_QUICKACK``
    does not stick, so it is set again after every read."""

    _OPTION = getattr(socket, "TCP_QUICKACK", None)

    def __init__(self, sock: socket.socket) -> None:
        self.socket = sock

    def recv(self, size: int) -> bytes:
        data = self.socket.recv(size)
        if self._OPTION is not None:
            try:
                self.socket.setsockopt(socket.IPPROTO_TCP, self._OPTION, 1)
            except OSError:
                pass
        return data

    def __getattr__(self, name: str):
        return getattr(self.socket, name)


class _Connector:
    """Sets up the agents of many hosts in parallel."""

    def __init__(self, options: Options, pythons: Sequence[str]) -> None:
        self.options = options
        self.command = bootstrap.remote_command(pythons)
        self.config = _Config(options.config)
        self.paramiko: Any = None
        self.known: Optional[_KnownHosts] = None
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
                "accept_new": opts.accept_new or str(cfg.get("stricthostkeychecking", "")
                                                      ).lower() in ("accept-new", "no", "off"),
                "known_files": list(cfg.get("userknownhostsfile") or [])
                + list(cfg.get("globalknownhostsfile") or [])}

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
            try:
                transport.start_client(timeout=s["timeout"])
            except Exception as err:
                transport.close()
                raise HostFailure("connect", f"SSH handshake with {s['hostname']} failed: "
                                             f"{_reason(err)}") from None
            try:
                self.check_host_key(transport, s)
                self.authenticate(transport, s)
            except BaseException:
                transport.close()
                raise
        return transport

    def through_jump(self, s: Dict[str, Any]):
        """A channel to the host through its ``ProxyJump`` host(s)."""
        hops = [h.strip() for h in s["proxyjump"].split(",") if h.strip()]
        transport = None
        for i, hop in enumerate(hops + [None]):  # type: ignore[list-item]
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
                                             f"{_reason(err)}") from None
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
            return self.sshd_slots.setdefault(addr, threading.Semaphore(PER_SSHD))

    def check_host_key(self, transport, s: Dict[str, Any]) -> None:
        key = transport.get_remote_server_key()
        host = s["alias"] or s["hostname"]
        lookup = host if s["port"] == 22 else f"[{host}]:{s['port']}"
        with self.lock:
            self.known.add_files(s["known_files"])  # type: ignore[union-attr]
        self.known.check(lookup, key, s["accept_new"], s["hostname"], s["port"])  # type: ignore[union-attr]

    def authenticate(self, transport, s: Dict[str, Any]) -> None:
        paramiko = self.paramiko
        user = s["user"]
        tried: List[str] = []
        keys = []
        explicit = [os.path.expanduser(p) for p in s["identities"]]
        files = explicit or [os.path.join(_home(), ".ssh", k) for k in DEFAULT_KEYS]
        wanted_blobs = set()
        for path in files:
            if os.path.exists(path + ".pub"):
                try:
                    with open(path + ".pub") as f:
                        wanted_blobs.add(f.read().split()[1])
                except (OSError, IndexError):
                    pass
        if os.environ.get("SSH_AUTH_SOCK"):
            try:
                for key in paramiko.Agent().get_keys():
                    if not s["identities_only"] or key.get_base64() in wanted_blobs:
                        keys.append(("ssh-agent key", key))
            except Exception:
                pass
        for path in files:
            if not os.path.exists(path):
                if path in explicit:
                    tried.append(f"{path} (missing)")
                continue
            try:
                keys.append((path, paramiko.PKey.from_path(path)))
            except paramiko.PasswordRequiredException:
                tried.append(f"{path} (has a passphrase; add it to ssh-agent)")
            except Exception as err:
                tried.append(f"{path} (unreadable: {_reason(err)})")
        for label, key in keys:
            try:
                transport.auth_publickey(user, key)
            except paramiko.AuthenticationException:
                tried.append(label)
                continue
            except Exception as err:
                raise HostFailure("authentication", f"{user}@{s['hostname']}: "
                                                    f"{_reason(err)}") from None
            if transport.is_authenticated():
                return
        raise HostFailure("authentication", f"{user}@{s['hostname']} accepted none of the keys "
                          f"({', '.join(tried) or 'no keys found'})")

    # -- the agent --------------------------------------------------------------
    def start_agent(self, name: str, transport) -> AgentConnection:
        try:
            channel = transport.open_session(timeout=30)
            channel.exec_command(self.command)
        except Exception as err:
            raise HostFailure("agent start", f"cannot run a command: {_reason(err)}") from None
        try:
            channel.sendall(bootstrap.payload())
            reader = link.Reader(expect_sync=True)
            deadline = time.monotonic() + AGENT_TIMEOUT
            frames: List[Tuple[int, bytes]] = []
            channel.settimeout(1.0)
            while not frames:
                if time.monotonic() > deadline:
                    raise HostFailure("agent start", f"no answer within {AGENT_TIMEOUT:g} s")
                try:
                    data = channel.recv(1 << 16)
                except socket.timeout:
                    continue
                if not data:
                    raise self._start_failure(channel)
                frames = reader.feed(data)
            channel.settimeout(None)
        except HostFailure:
            channel.close()
            raise
        except link.LinkError as err:
            channel.close()
            raise HostFailure("agent start", str(err)) from None
        except Exception as err:
            channel.close()
            raise HostFailure("agent start", _reason(err)) from None
        try:
            hello, leftover = link.hello(frames, reader)
        except link.LinkError as err:
            channel.close()
            raise HostFailure("agent start", str(err)) from None
        return AgentConnection(name, transport, channel, leftover, hello)

    def _start_failure(self, channel) -> HostFailure:
        deadline = time.monotonic() + 2
        while not channel.exit_status_ready() and time.monotonic() < deadline:
            time.sleep(0.01)
        status = channel.recv_exit_status() if channel.exit_status_ready() else None
        err = b""
        while channel.recv_stderr_ready():
            err += channel.recv_stderr(4096)
        text = err.decode("utf-8", "replace").strip().splitlines()
        last = text[-1] if text else f"the command exited with status {status}"
        stage = "remote Python" if status in (126, 127) else "agent start"
        return HostFailure(stage, last[:300])

    def _paramiko_ready(self) -> None:
        """Wait for paramiko's import (once); read the known hosts."""
        with self.lock:
            if self.paramiko is None:
                paramiko = paramiko_module()
                self.known = _KnownHosts(paramiko)
                self.paramiko = paramiko

    def connect(self, name: str) -> AgentConnection:
        s = self.settings(name)
        sock = None
        if not s["proxycommand"] and not s["proxyjump"]:
            # The TCP connection, and sshd's start of a session process, go
            # ahead while paramiko is still being imported.
            sock, _ = self.open_socket(s)
        try:
            self._paramiko_ready()
        except BaseException:
            if sock is not None:
                sock.close()
            raise
        transport = self.transport(name, s, sock)
        try:
            return self.start_agent(name, transport)
        except BaseException:
            transport.close()
            raise


def _reason(err: BaseException) -> str:
    text = str(err) or type(err).__name__
    if isinstance(err, OSError) and err.errno == errno.ECONNREFUSED:
        return "connection refused"
    return text.strip().splitlines()[0][:200] if text.strip() else type(err).__name__


def connect_all(names: Sequence[str], options: Options,
                report: Optional[Callable[[str], None]] = None,
                cancelled: Optional[Callable[[], bool]] = None) -> Dict[str, AgentConnection]:
    """Start an agent on every host in ``names``; all of them or none (LaunchError).

    ``cancelled`` is polled while waiting: when it turns true, the hosts
    still connecting are abandoned and a LaunchError is raised.
    """
    start_import()
    connector = _Connector(options, options.pythons)
    failures: Dict[str, HostFailure] = {}
    done: Dict[str, AgentConnection] = {}
    lock = threading.Lock()
    todo = list(names)

    def work() -> None:
        while True:
            with lock:
                if not todo:
                    return
                name = todo.pop(0)
            try:
                conn = connector.connect(name)
            except HostFailure as err:
                with lock:
                    failures[name] = err
                continue
            except LaunchError as err:
                with lock:
                    failures[name] = HostFailure("connect", str(err))
                continue
            except Exception as err:   # never a traceback for a host's trouble
                with lock:
                    failures[name] = HostFailure("connect", _reason(err))
                continue
            with lock:
                done[name] = conn
            if report is not None:
                report(name)

    workers = [threading.Thread(target=work, daemon=True, name=f"connect-{i}")
               for i in range(min(CONCURRENCY, len(names)))]
    for w in workers:
        w.start()
    for w in workers:
        while w.is_alive():
            w.join(0.05)
            if cancelled is not None and cancelled():
                with lock:
                    todo.clear()
                    for conn in done.values():
                        conn.close()
                err = LaunchError("stopped while connecting to the remote hosts")
                err.exit_code = 130
                raise err
    for transport in connector.jumps.values():
        if not isinstance(transport, type(lock)) and failures and not done:
            try:
                transport.close()
            except Exception:
                pass
    if failures:
        for conn in done.values():
            conn.close()
        raise LaunchError(describe_failures(failures, len(names)))
    return done


def _unless_none(value: Any) -> Any:
    """A ProxyJump or ProxyCommand setting; None for none (OpenSSH's "none" too)."""
    return None if value is None or str(value).lower() == "none" else value


def describe_failures(failures: Dict[str, HostFailure], total: int) -> str:
    """One line: the failing hosts grouped by stage and reason."""
    groups: Dict[str, List[str]] = {}
    for name in sorted(failures):
        err = failures[name]
        groups.setdefault(f"{err.stage}: {err.reason}", []).append(name)
    parts = []
    for what, hosts in groups.items():
        shown = ", ".join(hosts[:6]) + (f" and {len(hosts) - 6} more" if len(hosts) > 6 else "")
        parts.append(f"{shown} ({what})")
    return (f"cannot start the job's agent on {len(failures)} of {total} remote host(s); "
            f"nothing was started: " + "; ".join(parts))
