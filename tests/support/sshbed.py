"""A multi-host SSH test bed: real OpenSSH ``sshd`` hosts on this one machine.

Each host ``h1`` .. ``hN`` runs its own ``/usr/sbin/sshd`` in its own network,
UTS and mount namespaces (see :mod:`netbed`): its own address
``198.18.K.(10+i)``, port 22, hostname ``hI`` and an ``/etc/hosts`` that names
every host and the runner (``198.18.K.1``, the test process's side).  The root
namespace's ``/etc/hosts`` is not modified, so from the test process ``h1``
resolves only through an SSH client config's ``HostName`` (see
:meth:`SSHBed.make_home` and :attr:`SSHBed.ssh_config`).

When namespaces are not permitted (e.g. a container without CAP_SYS_ADMIN) and
CI is not ``true``, the bed falls back to loopback aliases: host ``hI`` listens
on ``127.K.0.(10+i)`` on a high port, every host shares the machine's hostname
and network, and the namespace-only helpers (:meth:`SSHBed.link_down`,
:meth:`SSHBed.hide_path`, :meth:`SSHBed.run_in` ...) skip the test (or fail it
under ``CI=true`` / ``MSLAUNCH_TEST_REQUIRE_ALL=1``, where the loopback mode is
never used: a bed that cannot be built fails the tests, it never skips them).
``MSLAUNCH_SSHBED_MODE=loopback`` forces the fallback, to try it.

Using it from tests (the fixtures come from this module as a pytest plugin:
``pytest_plugins = ["sshbed"]`` in a test module or in tests/conftest.py)::

    def test_two_hosts(sshbed, tmp_path):          # session bed, 4 hosts
        home = sshbed.make_home(tmp_path / "home") # a HOME with ~/.ssh
        h1, h2 = sshbed.hosts[:2]
        ...

    def test_many_hosts(sshbeds):                  # N hosts: shared per N
        bed = sshbeds.get(8)

    @pytest.fixture(scope="module")
    def bed16(sshbeds):                            # the same, as a fixture
        return sshbeds.get(16)

    def test_private(sshbeds):                     # a bed of its own
        bed = sshbeds.new(2)                       # (stopped at session end,
        ...                                        #  or earlier by bed.stop())

Fault helpers (:meth:`SSHBed.link_down`, :meth:`SSHBed.hide_path`,
:meth:`SSHBed.rekey_host`, :meth:`SSHBed.refuse_logins`, killing processes
...) change a shared bed; after every test the plugin calls
:meth:`SSHBed.restore` on each bed that was changed, so the next test gets
healthy hosts again.  Processes a test leaves running on a host are not
touched by restore (only :meth:`SSHBed.kill_host_processes` or the final
teardown end them).  When a test fails, the new lines of the sshd logs
(``LogLevel VERBOSE``: why a login was refused) are added to its report.

Things to know when writing tests on the bed:

* paramiko finds ``~/.ssh/config`` through ``$HOME``; OpenSSH's ``ssh``
  finds ``~/.ssh`` through the passwd entry and ignores ``$HOME``: run it as
  ``ssh -F HOME/.ssh/config`` or put ``HOME/bin`` (a wrapper doing that,
  written by make_home) first on PATH.
* Remote commands run as root through root's login shell, but (in network
  namespaces of the bed's own) without this machine's ``~/.bashrc``, which each host sees
  empty (:func:`login_rc_files`): what bash reads there for every SSH
  command is the runner's own set-up, such as ``pyenv init``, which cost
  about a second of CPU per command here and queued concurrent logins on
  its lock.  PATH is sshd's default; use absolute interpreter paths
  (``sys.executable``).  ``SSHBed(login_rc=True)`` keeps the file (the
  benchmarks' hosts "as this machine's logins are"); a slow login on
  purpose is :meth:`SSHBed.slow_logins`.
* A process started over SSH on ``hI`` lives in ``hI``'s namespaces; it
  reaches the runner as ``198.18.K.1`` (:attr:`SSHBed.runner_addr`, or the
  runner's hostname, which the hosts resolve to that address), never as
  127.0.0.1.  A server in the test process must listen on that address (or on
  0.0.0.0) to be reachable from the hosts.
* A command run on a host that itself uses ``ssh`` gets root's ``~/.ssh``,
  not a test HOME: pass ``-F`` :attr:`SSHBed.ssh_config`, or put
  :attr:`SSHBed.bin_dir` (an ``ssh`` wrapper with that ``-F``) first on PATH.
* MPI across the hosts (mpi4py over the bed): all hosts share one kernel, so
  UCX (MPICH's ch4:ucx, Open MPI's pml ucx) treats them as one node and uses
  shared memory and CMA between "hosts".  Set ``UCX_TLS=tcp`` to make ranks
  talk over the bed's network (:func:`remote.renv` does, and keeps this machine's
  own ranks on the bed's uplink: :meth:`SSHBed.mpi_network`).  MPICH's hydra connects back to the runner's
  hostname, which the hosts' /etc/hosts maps to ``198.18.K.1``; to let
  ``mpiexec -launcher ssh`` reach the hosts, put :attr:`SSHBed.bin_dir` first
  on PATH.
* sshd ignores the "signal" channel request for root logins, and a remote
  process started without a pty survives the closing of its channel.

Machine needs: root, ``/usr/sbin/sshd`` (openssh-server, installed without
starting the system sshd), ``ssh``/``ssh-keygen`` (openssh-client), ``ip``
(iproute2), ``nsenter``/``unshare`` (util-linux).  ``scripts/test.sh``
installs them.  Nothing listens on a wildcard address of the root namespace,
and the bed removes every process, namespace and link it created, also after
failures (the next run removes the beds of crashed runs: their sshds carry the
bed's tag, see :mod:`netbed`).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import random
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Iterator, List, Optional, Sequence, Tuple, Union

import pytest

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
import netbed  # noqa: E402
import sshprobe  # noqa: E402
from netbed import NetBed, NetBedError, NetHost  # noqa: E402

SSHD = "/usr/sbin/sshd"
REQUIRED_TOOLS = (SSHD, "ssh", "ssh-keygen", "ip", "nsenter", "unshare")
PREFIX_BASE = "mt"
#: A test HOME's file of ``NAME=VALUE`` lines: :meth:`SSHBed.mpi_network`.
MPI_NET_FILE = ".bed-mpi-network"
DEFAULT_HOSTS = 4


class SSHBedError(NetBedError):
    """The SSH bed could not be built or a helper could not do its job."""


class NotSupportedInMode(SSHBedError):
    """The helper needs network namespaces and the bed runs on loopback aliases."""


def strict() -> bool:
    """True when a missing bed must fail the tests (CI=true or MSLAUNCH_TEST_REQUIRE_ALL=1)."""
    return os.environ.get("CI") == "true" or os.environ.get("MSLAUNCH_TEST_REQUIRE_ALL") == "1"


def detect_mode() -> Tuple[str, str]:
    """``("netns", "")`` when namespaces may be created, else ``("loopback", reason)``.

    ``MSLAUNCH_SSHBED_MODE=netns|loopback`` forces a mode (to try the fallback).
    """
    forced = os.environ.get("MSLAUNCH_SSHBED_MODE", "")
    if forced in ("netns", "loopback"):
        return forced, f"MSLAUNCH_SSHBED_MODE={forced}"
    ok, reason = netbed.namespaces_permitted()
    return ("netns", "") if ok else ("loopback", reason)


def missing_tools() -> List[str]:
    return netbed.missing_tools(REQUIRED_TOOLS)


@dataclass
class SSHHost:
    """One SSH host of a bed."""

    name: str
    index: int
    addr: str
    port: int
    namespace: Optional[str]  # network namespace name (None in loopback mode)
    host_key: str = field(repr=False)
    conf: str = field(repr=False)
    log: str = field(repr=False)
    pid: Optional[int] = None  # the sshd listener
    net: Optional[NetHost] = field(default=None, repr=False)
    proc: Optional[subprocess.Popen] = field(default=None, repr=False)
    key_override: Optional[str] = field(default=None, repr=False)
    auth_override: Optional[str] = field(default=None, repr=False)
    slow_login: float = field(default=0.0, repr=False)     # seconds before a command runs
    hidden: List[str] = field(default_factory=list, repr=False)
    link_is_down: bool = field(default=False, repr=False)

    @property
    def target(self) -> str:
        """``ADDR`` for port 22, else ``[ADDR]:PORT`` (the known_hosts spelling)."""
        return self.addr if self.port == 22 else f"[{self.addr}]:{self.port}"


HostRef = Union[SSHHost, str, int]

def _keygen(path: str, comment: str) -> subprocess.Popen:
    for p in (path, path + ".pub"):
        if os.path.exists(p):
            os.unlink(p)
    return subprocess.Popen([netbed._tool("ssh-keygen"), "-q", "-t", "ed25519", "-N", "",
                             "-C", comment, "-f", path], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _wait_keygen(procs: Sequence[subprocess.Popen]) -> None:
    for p in procs:
        out, _ = p.communicate(timeout=30)
        if p.returncode != 0:
            raise SSHBedError(f"ssh-keygen failed: {out.strip()}")


def _read_pub(path: str) -> str:
    with open(path + ".pub") as f:
        kind, blob = f.read().split()[:2]
    return f"{kind} {blob}"


def _write(path: str, text: str, mode: int = 0o644) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(path, mode)


def _tail(path: str, n: int = 20) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return ""


def login_rc_files() -> List[str]:
    """The files a login shell of this user reads when sshd runs a command in it
    (bash reads ``~/.bashrc`` then), from the password database's home."""
    home = pwd.getpwuid(os.getuid()).pw_dir
    return [p for p in (os.path.join(home, ".bashrc"),) if os.path.isfile(p)]


class SSHBed(netbed.Bed):
    """N sshd hosts; see the module docstring.

    ``SSHBed(directory).start(n)`` builds it (``with SSHBed(d) as bed:`` also
    works, with 4 hosts unless ``start`` was called), :meth:`stop` removes it.
    ``mode`` is ``"netns"``, ``"loopback"`` or None (detect).
    """

    prefix_base = PREFIX_BASE

    def __init__(self, directory: Optional[str] = None, mode: Optional[str] = None,
                 login_rc: bool = False) -> None:
        super().__init__()
        self.login_rc = login_rc
        self.dir = os.path.abspath(str(directory) if directory else
                                   tempfile.mkdtemp(prefix="sshbed-"))
        self.mode = mode
        self.mode_reason = ""
        self.hosts: List[SSHHost] = []
        self.user = pwd.getpwuid(os.getuid()).pw_name
        self.client_key = os.path.join(self.dir, "client_key")
        self.known_hosts = os.path.join(self.dir, "known_hosts")
        self.ssh_config = os.path.join(self.dir, "ssh_config")
        self.authorized_keys = os.path.join(self.dir, "authorized_keys")
        self.bin_dir = os.path.join(self.dir, "bin")
        self.net: Optional[NetBed] = None
        self.k: Optional[int] = None
        self.dirty = False
        self._record: Optional[str] = None
        self._extra_conf: List[str] = []
        self._hide_count = 0
        self._borrowed: Optional[NetBed] = None   # namespaces owned by another bed

    # ------------------------------------------------------------------ lifecycle
    def start(self, n_hosts: int = DEFAULT_HOSTS, net: Optional[NetBed] = None) -> SSHBed:
        """Build the bed with ``n_hosts`` hosts ``h1``..``hN``; clean up and raise on failure.

        With ``net``, the sshds run in the hosts ``h1``..``hN`` of that
        existing :class:`NetBed` (e.g. a Slurm bed's nodes) instead of new
        namespaces; :meth:`stop` then ends the sshds and leaves the
        namespaces to their owner.
        """
        return super().start(n_hosts, net)

    def _check(self, n_hosts: int, net: Optional[NetBed]) -> None:
        if self._started or self.hosts:
            raise SSHBedError("a bed is started once; make a new SSHBed")
        if not 1 <= n_hosts <= 200:
            raise SSHBedError(f"n_hosts must be in 1..200, not {n_hosts}")
        missing = missing_tools()
        if missing:
            raise SSHBedError("the SSH test bed needs " + ", ".join(missing)
                              + " (openssh-server, openssh-client, iproute2, util-linux)")
        if self.mode is None:
            self.mode, self.mode_reason = detect_mode()

    def _build(self, n_hosts: int, net: Optional[NetBed]) -> None:
        os.makedirs(self.bin_dir, exist_ok=True)
        self._prepare_run_dir()
        if net is not None:
            self.mode, self._borrowed = "netns", net
            by_name = {nh.name: nh for nh in net.hosts}
            self.net, self.k = net, net.k
            for i in range(1, n_hosts + 1):
                nh = by_name[f"h{i}"]
                self.hosts.append(self._new_host(i, nh.addr, 22, nh))
        elif self.mode == "netns":
            self.net = NetBed(os.path.join(self.dir, "net"), PREFIX_BASE)
            self.net.create([f"h{i}" for i in range(1, n_hosts + 1)])
            self.k = self.net.k
            for i, nh in enumerate(self.net.hosts, 1):
                self.hosts.append(self._new_host(i, nh.addr, 22, nh))
        elif self.mode == "loopback":
            self.k, self._record = netbed.claim_k(PREFIX_BASE, network=False,
                                                  info={"dir": self.dir, "mode": "loopback"})
            addrs = [f"127.{self.k}.0.{10 + i}" for i in range(1, n_hosts + 1)]
            port = self._free_port(addrs)
            for i, a in enumerate(addrs, 1):
                self.hosts.append(self._new_host(i, a, port, None))
        else:
            raise SSHBedError(f"unknown mode {self.mode!r}")
        own = self.net is not None and self._borrowed is None
        self.record_owner(netns=self.net.namespace_ids() if own else ())
        self._make_keys()
        self._write_client_files()
        if not self.login_rc and self.net is not None and self._borrowed is None:
            # (in namespaces of its own only: a cover would outlive it in borrowed ones)
            for h in self.hosts:
                for path in login_rc_files():
                    self._cover(h, path)
        for h in self.hosts:
            self._write_conf(h)
        self._check_conf(self.hosts[0])
        for h in self.hosts:
            self._spawn_sshd(h)
        self._wait_ready(self.hosts)
        self._update_record()

    def _teardown(self) -> None:
        """Remove every process, namespace, link and state file of the bed."""
        try:
            if self.net is not None and self._borrowed is None:
                self.net.teardown()
            else:
                def tree() -> List[int]:
                    pids: List[int] = []
                    for h in self.hosts:
                        if h.pid and netbed.process_alive(h.pid):
                            pids += [h.pid] + [p for p in netbed.descendants(h.pid)
                                               if netbed.process_alive(p)]
                    return pids
                netbed.kill_until_gone(tree, "the loopback sshd trees")
            for h in self.hosts:
                if h.proc is not None:
                    try:
                        h.proc.wait(timeout=5)
                    except subprocess.TimeoutExpired:
                        pass
                    h.proc = None
                h.pid = None
        finally:
            netbed.remove_record(self._record)
            self._record = None
            if self._borrowed is not None:
                self.net = self._borrowed = None

    # ----------------------------------------------------------------- building
    @staticmethod
    def _prepare_run_dir() -> None:
        # sshd's compiled-in privilege separation directory (install -d -m 0755 /run/sshd)
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        if os.stat("/run/sshd").st_mode & 0o777 != 0o755:
            os.chmod("/run/sshd", 0o755)

    def _new_host(self, i: int, addr: str, port: int, nh: Optional[NetHost]) -> SSHHost:
        base = os.path.join(self.dir, f"h{i}")
        return SSHHost(name=f"h{i}", index=i, addr=addr, port=port,
                       namespace=nh.netns if nh else None, host_key=base + "_host_key",
                       conf=base + ".conf", log=base + ".log", net=nh)

    @staticmethod
    def _free_port(addrs: Sequence[str]) -> int:
        for _ in range(100):
            port = random.randint(10000, 30000)
            socks = []
            try:
                for a in addrs:
                    s = socket.socket()
                    socks.append(s)
                    s.bind((a, port))
                return port
            except OSError:
                continue
            finally:
                for s in socks:
                    s.close()
        raise SSHBedError("no free port on the loopback aliases")

    def _make_keys(self) -> None:
        procs = [_keygen(self.client_key, "sshbed-client")]
        procs += [_keygen(h.host_key, f"sshbed-{h.name}") for h in self.hosts]
        _wait_keygen(procs)
        for p in [self.client_key] + [h.host_key for h in self.hosts]:
            os.chmod(p, 0o600)
        _write(self.authorized_keys, _read_pub(self.client_key) + "\n", 0o600)
        _write(os.path.join(self.dir, "no_authorized_keys"), "", 0o600)

    def known_hosts_lines(self, hosts: Optional[Sequence[HostRef]] = None) -> List[str]:
        """One explicit line per host: ``ADDR,hI KEY`` (``[ADDR]:P,[hI]:P KEY`` off port 22)."""
        out = []
        for h in self._hosts(hosts):
            names = [h.target, h.name if h.port == 22 else f"[{h.name}]:{h.port}"]
            out.append(f"{','.join(names)} {_read_pub(h.host_key)}")
        return out

    def _config_text(self, hosts: Sequence[SSHHost], identity: str, known_hosts: str,
                     extra: str = "") -> str:
        lines = [extra.rstrip("\n")] if extra.strip() else []
        for h in hosts:
            lines += [f"Host {h.name}", f"    HostName {h.addr}", f"    Port {h.port}"]
        lines += ["Host *",
                  f"    User {self.user}",
                  f"    IdentityFile {identity}",
                  "    IdentitiesOnly yes",
                  f"    UserKnownHostsFile {known_hosts}",
                  "    GlobalKnownHostsFile /dev/null",
                  "    StrictHostKeyChecking yes",
                  "    BatchMode yes"]
        return "\n".join(lines) + "\n"

    def _write_client_files(self) -> None:
        _write(self.known_hosts, "\n".join(self.known_hosts_lines()) + "\n")
        _write(self.ssh_config, self._config_text(self.hosts, self.client_key, self.known_hosts),
               0o600)
        ssh = netbed._tool("ssh")
        _write(os.path.join(self.bin_dir, "ssh"),
               f'#!/bin/sh\nexec {ssh} -F "{self.ssh_config}" "$@"\n', 0o755)

    def _use_pam(self) -> str:
        # UsePAM no refuses a locked account ("!" in the shadow field); UsePAM yes does not
        try:
            with open("/etc/shadow") as f:
                for line in f:
                    parts = line.split(":")
                    if parts[0] == self.user and len(parts) > 1:
                        return "yes" if parts[1].startswith("!") else "no"
        except OSError:
            pass
        return "no"

    def _write_conf(self, h: SSHHost) -> None:
        text = "\n".join([
            f"ListenAddress {h.addr}:{h.port}",
            f"HostKey {h.key_override or h.host_key}",
            f"PidFile {os.path.join(self.dir, h.name + '.pid')}",
            f"AuthorizedKeysFile {h.auth_override or self.authorized_keys}",
            "PermitRootLogin prohibit-password",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            f"UsePAM {self._use_pam()}",
            "StrictModes no",
            "UseDNS no",
            "AcceptEnv LANG LC_* MSL_*",
            "MaxStartups 200:30:400",
            "MaxSessions 256",
            "LogLevel VERBOSE",
            "Subsystem sftp internal-sftp",
            *([f"ForceCommand sleep {h.slow_login:g}; eval \"$SSH_ORIGINAL_COMMAND\""]
              if h.slow_login else []),
            *self._extra_conf,
        ]) + "\n"
        _write(h.conf, text)

    def _check_conf(self, h: SSHHost) -> None:
        # (once, when the bed is built) OpenSSH >= 9.8 penalises a source address after
        # refused logins and connections that never log in (refusing it for up to 10
        # minutes): here every connection comes from the runner, so one test's refused
        # logins would refuse the next test's connects.  Older sshds do not know the keyword.
        probe = subprocess.run([SSHD, "-t", "-f", h.conf, "-o", "PerSourcePenalties=no"],
                               stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
        if probe.returncode == 0:
            self._extra_conf.append("PerSourcePenalties no")
            for x in self.hosts:
                self._write_conf(x)
        r = subprocess.run([SSHD, "-t", "-f", h.conf], stdin=subprocess.DEVNULL,
                           capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            raise SSHBedError(f"{SSHD} -t -f {h.conf} failed: {r.stderr.strip()}")

    def _spawn_sshd(self, h: SSHHost) -> None:
        # The tag on the command line marks the listener (its title overwrites its
        # environment), and SetEnv every session's processes.
        argv = [SSHD, "-D", "-e", "-f", h.conf, "-o", f"SetEnv={netbed.TAG_VAR}={self.tag}"]
        if self.net is not None and h.net is not None:
            h.proc = self.net.spawn(h.net, argv, log=h.log, env=self.tag_env())
        else:
            with open(h.log, "ab") as log:
                h.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                          stderr=subprocess.STDOUT, start_new_session=True,
                                          env=self.tag_env())
        h.pid = h.proc.pid

    @staticmethod
    def _listening(h: SSHHost) -> bool:
        """Whether the host's sshd has its socket in LISTEN state (read from the sshd's own
        network namespace, /proc/PID/net/tcp, so that no probe connection is needed: a probe
        leaves a per-connection sshd behind for a moment)."""
        want = "%08X:%04X" % (struct.unpack("=I", socket.inet_aton(h.addr))[0], h.port)
        try:
            with open(f"/proc/{h.pid}/net/tcp") as f:
                next(f)
                return any(line.split()[1] == want and line.split()[3] == "0A" for line in f)
        except (OSError, StopIteration, IndexError):
            return False

    def _wait_ready(self, hosts: Sequence[SSHHost], timeout: float = 15.0) -> None:
        """Wait until each host's port accepts connections (its socket listens)."""
        deadline = time.monotonic() + timeout
        todo = list(hosts)
        while todo:
            for h in list(todo):
                if h.proc is not None and h.proc.poll() is not None:
                    raise SSHBedError(f"sshd of {h.name} exited with status {h.proc.returncode}:\n"
                                      + _tail(h.log))
                if self._listening(h):
                    todo.remove(h)
            if todo:
                if time.monotonic() > deadline:
                    raise SSHBedError("sshd not accepting connections on "
                                      + ", ".join(f"{h.name} ({h.target})" for h in todo))
                time.sleep(0.002)

    def _update_record(self) -> None:
        if self._record:  # loopback: the sshd pids are how a later run finds stale ones
            rec = netbed.read_record(self._record) or {}
            rec["pids"] = [[h.pid, netbed.process_start_time(h.pid)] for h in self.hosts if h.pid]
            netbed._write_json(self._record, rec, exclusive=False)

    # --------------------------------------------------------------- lookups
    def host(self, ref: HostRef) -> SSHHost:
        """A host by object, name (``"h2"``) or index (2 = ``h2``)."""
        if isinstance(ref, SSHHost):
            return ref
        for h in self.hosts:
            if h.name == ref or h.index == ref:
                return h
        raise KeyError(ref)

    def _hosts(self, hosts: Optional[Sequence[HostRef]]) -> List[SSHHost]:
        return list(self.hosts) if hosts is None else [self.host(h) for h in hosts]

    @property
    def runner_addr(self) -> str:
        """The test process's address as the hosts see it."""
        return self.net.gateway if self.net is not None else "127.0.0.1"

    @property
    def names(self) -> List[str]:
        return [h.name for h in self.hosts]

    def ssh_argv(self, host: HostRef, *command: str) -> List[str]:
        """``ssh -F ssh_config hI COMMAND...`` (OpenSSH client, the bed's own config)."""
        return [netbed._tool("ssh"), "-F", self.ssh_config, self.host(host).name, *command]

    # ------------------------------------------------------------------- homes
    def make_home(self, path: Union[str, os.PathLike[str]],
                  hosts: Optional[Sequence[HostRef]] = None, user_config_extra: str = "",
                  known: Optional[Sequence[HostRef]] = None) -> str:
        """Create a HOME for a test: ``~/.ssh/{config,id_ed25519,id_ed25519.pub,known_hosts}``.

        ``config`` has ``Host hI`` / ``HostName ADDR`` / ``Port P`` for each of
        ``hosts`` (default: all), then ``Host *`` with User, IdentityFile,
        IdentitiesOnly yes, StrictHostKeyChecking yes, BatchMode yes and this
        home's UserKnownHostsFile, so that ``hI`` works as a host name for
        paramiko (``paramiko.SSHConfig`` lookup of ``$HOME/.ssh/config``) and
        for OpenSSH.  OpenSSH's ``ssh`` finds ``~/.ssh`` through the passwd
        entry, not ``$HOME``: give it ``-F HOME/.ssh/config``, or put
        ``HOME/bin`` (an ``ssh`` wrapper doing that) first on PATH.
        known_hosts holds the keys of ``known`` (default: ``hosts``).
        ``user_config_extra`` goes first in the file, so its settings win
        (first match wins in both clients).  Returns the home's path.
        """
        home = os.path.abspath(os.fspath(path))
        ssh_dir = os.path.join(home, ".ssh")
        os.makedirs(ssh_dir, exist_ok=True)
        os.chmod(home, 0o755)
        os.chmod(ssh_dir, 0o700)
        chosen = self._hosts(hosts)
        key = os.path.join(ssh_dir, "id_ed25519")
        kh = os.path.join(ssh_dir, "known_hosts")
        with open(self.client_key) as f:
            _write(key, f.read(), 0o600)
        with open(self.client_key + ".pub") as f:
            _write(key + ".pub", f.read(), 0o644)
        lines = self.known_hosts_lines(chosen if known is None else known)
        _write(kh, "".join(line + "\n" for line in lines), 0o644)
        config = os.path.join(ssh_dir, "config")
        _write(config, self._config_text(chosen, key, kh, user_config_extra), 0o600)
        os.makedirs(os.path.join(home, "bin"), exist_ok=True)
        _write(os.path.join(home, "bin", "ssh"),
               f'#!/bin/sh\nexec {netbed._tool("ssh")} -F "{config}" "$@"\n', 0o755)
        _write(os.path.join(home, MPI_NET_FILE), "".join(
            f"{k}={v}\n" for k, v in self.mpi_network().items()), 0o644)
        return home

    def mpi_network(self) -> dict:
        """Variables that keep MPI ranks of this machine's root namespace on the bed's
        own link.  UCX and Open MPI's TCP transport otherwise use every interface there,
        other beds' uplinks included, which come and go with the tests beside: a rank
        then fails (UCX: ``Destination is unreachable`` at MPI_Init, ``Endpoint
        timeout`` at MPI_Finalize).  The hosts' namespaces have only ``eth0``."""
        if self.net is None:
            return {}
        return {"UCX_NET_DEVICES": self.net.uplink}

    # ------------------------------------------------------------------ faults
    def require_netns(self, what: str = "this test") -> None:
        """Skip (or fail, when strict) unless the bed runs in network namespaces."""
        if self.mode != "netns":
            msg = f"{what} needs network namespaces ({self.mode_reason or self.mode})"
            if strict():
                pytest.fail(msg, pytrace=False)
            pytest.skip(msg)

    def _net(self, h: SSHHost, what: str) -> Tuple[NetBed, NetHost]:
        if self.net is None or h.net is None:
            raise NotSupportedInMode(f"{what} needs network namespaces "
                                     f"(bed mode {self.mode}: {self.mode_reason})")
        return self.net, h.net

    def link_down(self, host: HostRef) -> None:
        """Take the host's link down: packets to and from it are lost (connects time out)."""
        h = self.host(host)
        net, nh = self._net(h, "link_down")
        self.dirty = True
        net.link_down(nh)
        h.link_is_down = True

    def link_up(self, host: HostRef) -> None:
        """Bring the host's link back; TCP connections that did not time out go on."""
        h = self.host(host)
        net, nh = self._net(h, "link_up")
        net.link_up(nh)
        h.link_is_down = False

    @contextlib.contextmanager
    def refusing_own(self, host: HostRef, port: int) -> Iterator[None]:
        """Within the block, TCP connections that the host opens to its own
        ``port`` fail at once (EACCES); those from other hosts still come in."""
        h = self.host(host)
        net, nh = self._net(h, "refusing_own")
        net.refuse_own(nh, port, True)
        try:
            yield
        finally:
            net.refuse_own(nh, port, False)

    def host_pids(self, host: HostRef) -> List[int]:
        """Live pids on the host: everything in its network namespace (``ip netns pids``).

        In loopback mode: its sshd listener and the listener's descendants.
        """
        h = self.host(host)
        if self.net is not None and h.net is not None:
            return self.net.pids(h.net)
        if h.pid and netbed.process_alive(h.pid):
            return [h.pid] + netbed.descendants(h.pid)
        return []

    @staticmethod
    def _is_sshd(pid: int) -> bool:
        try:
            exe = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
        except OSError:
            return False
        return exe == "sshd" or exe.startswith("sshd-")

    def kill_host_processes(self, host: HostRef, exclude_sshd: bool = True) -> List[int]:
        """SIGKILL the processes on the host; return their pids.

        ``exclude_sshd=True``: every sshd process (listener and per-connection
        ones) is spared: the host stays reachable, and each SSH session reports
        its command as killed by SIGKILL.  ``exclude_sshd=False``: the host
        "crashes": sessions see EOF and new connects are refused (restore()
        restarts its sshd).
        """
        h = self.host(host)
        self.dirty = True
        if self.net is not None and h.net is not None:
            killed = self.net.kill_host(h.net, keep=self._is_sshd if exclude_sshd else None)
        else:
            def targets() -> List[int]:
                pids = [p for p in self.host_pids(h) if netbed.process_alive(p)]
                return [p for p in pids if not (exclude_sshd and self._is_sshd(p))]
            killed = netbed.kill_until_gone(targets, h.name)
        if h.proc is not None and h.proc.poll() is not None:
            h.pid = None
        return killed

    def drop_session_children(self, host: HostRef) -> List[int]:
        """Kill the sshd listener's per-connection children: every SSH connection
        to the host drops (clients see EOF), while the commands they started keep
        running (sshd's session processes call setsid).  New connects still work."""
        h = self.host(host)
        if not h.pid:
            return []
        self.dirty = True
        kids = [p for p in netbed.children_map().get(h.pid, [])]
        return netbed.kill_pids(kids)

    def run_in(self, host: HostRef, argv: Sequence[str], timeout: Optional[float] = 60,
               **kw) -> subprocess.CompletedProcess:
        """Run ``argv`` inside the host (the namespaces its sshd runs in), without SSH.

        Output is captured as text unless overridden; ``cwd=`` and other
        ``subprocess.run`` keywords are accepted.
        """
        h = self.host(host)
        net, nh = self._net(h, "run_in")
        return net.run(nh, argv, timeout=timeout, **kw)

    def spawn_in(self, host: HostRef, argv: Sequence[str], **popen_kw) -> subprocess.Popen:
        """Start ``argv`` inside the host without SSH, in a session of its own
        (``subprocess.Popen`` keywords accepted; stdin is /dev/null, output is
        discarded unless redirected).  The bed's teardown ends it if it still runs."""
        h = self.host(host)
        net, nh = self._net(h, "spawn_in")
        return net.spawn(nh, argv, **popen_kw)

    def hide_path(self, host: HostRef, path: str) -> None:
        """Make ``path`` look empty on one host only (e.g. "python missing").

        A directory is covered by an empty read-only directory, anything else
        by /dev/null (read-only), with a bind mount in that host's mount
        namespace; the root namespace and the other hosts are not affected.
        To make a program "not found" (ENOENT) rather than "not executable",
        hide the directory that holds it (e.g. a venv's ``bin``).
        """
        h = self.host(host)
        self._net(h, "hide_path")
        path = os.path.abspath(path)
        self.dirty = True
        self._cover(h, path)
        h.hidden.append(path)

    def _cover(self, h: SSHHost, path: str) -> None:
        if not os.path.lexists(path):
            raise FileNotFoundError(path)
        if os.path.isdir(path):
            self._hide_count += 1
            source = os.path.join(self.dir, "hidden", str(self._hide_count))
            os.makedirs(source, mode=0o555)
        else:
            source = "/dev/null"
        r = self.run_in(h, ["mount", "--bind", "-o", "ro", source, path], timeout=30)
        if r.returncode != 0:
            raise SSHBedError(f"hide {path} on {h.name}: {r.stderr.strip()}")

    def unhide_path(self, host: HostRef, path: str) -> None:
        """Undo :meth:`hide_path`."""
        h = self.host(host)
        path = os.path.abspath(path)
        if path not in h.hidden:
            raise SSHBedError(f"{path} is not hidden on {h.name}")
        r = self.run_in(h, ["umount", path], timeout=30)
        if r.returncode != 0:
            raise SSHBedError(f"unhide {path} on {h.name}: {r.stderr.strip()}")
        h.hidden.reverse()
        h.hidden.remove(path)  # the most recent one
        h.hidden.reverse()

    @staticmethod
    def _settle_connections(h: SSHHost, timeout: float = 0.5) -> None:
        """Give connections that are still being set up or torn down (per-connection sshd
        without a session, e.g. a just refused login) a moment to end, so that a restart
        does not orphan them."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            busy = False
            for c in netbed.children_map().get(h.pid or 0, []):
                try:
                    with open(f"/proc/{c}/cmdline", "rb") as f:
                        title = f.read().replace(b"\0", b" ")
                except OSError:
                    continue
                if b"@" not in title:  # sessions are titled "sshd: USER@TTY"
                    busy = True
            if not busy:
                return
            time.sleep(0.005)

    def restart_sshd(self, host: HostRef) -> None:
        """Stop the host's sshd listener (sessions stay) and start it again with its current
        config, in the same namespaces; wait until it accepts connections."""
        h = self.host(host)
        if h.pid:
            self._settle_connections(h)
        if h.proc is not None:
            if h.proc.poll() is None:
                h.proc.terminate()
                try:
                    h.proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    h.proc.kill()
                    h.proc.wait()
            h.proc = None
        elif h.pid and netbed.process_alive(h.pid):
            netbed.kill_pids([h.pid], signal.SIGTERM)
        h.pid = None
        self._write_conf(h)
        self._spawn_sshd(h)
        self._wait_ready([h])
        self._update_record()

    def rekey_host(self, host: HostRef) -> None:
        """Give the host a new host key and restart its sshd: known_hosts no longer matches."""
        h = self.host(host)
        self.dirty = True
        new = h.host_key + ".rekeyed"
        _wait_keygen([_keygen(new, f"sshbed-{h.name}-rekeyed")])
        os.chmod(new, 0o600)
        h.key_override = new
        self.restart_sshd(h)

    def refuse_logins(self, host: HostRef) -> None:
        """Restart the host's sshd with an empty AuthorizedKeysFile: every login is refused
        ("Permission denied (publickey)"), while the port still accepts connections."""
        h = self.host(host)
        self.dirty = True
        h.auth_override = os.path.join(self.dir, "no_authorized_keys")
        self.restart_sshd(h)

    def slow_logins(self, host: HostRef, seconds: float) -> None:
        """Restart the host's sshd so that every command starts ``seconds`` late (a
        ForceCommand that sleeps first): a slow host, as one with a slow login
        shell or file system."""
        h = self.host(host)
        self.dirty = True
        h.slow_login = seconds
        self.restart_sshd(h)

    def restore(self) -> None:
        """Undo every fault: links up, paths unhidden, original keys and logins, sshd running."""
        if not self._started:
            return
        for h in self.hosts:
            if h.link_is_down:
                self.link_up(h)
            while h.hidden:
                self.unhide_path(h, h.hidden[-1])
            alive = h.proc is not None and h.proc.poll() is None
            if h.key_override or h.auth_override or h.slow_login or not alive:
                h.key_override = h.auth_override = None
                h.slow_login = 0.0
                self.restart_sshd(h)
        self.dirty = False

    def log_files(self) -> List[str]:
        return [h.log for h in self.hosts]



# ------------------------------------------------------------------ pytest part


class SSHBedPool(netbed.BedPool):
    """Session-wide beds: :meth:`get` shares a bed per host count; :meth:`new` gives your own."""

    def __init__(self, base_dir: str) -> None:
        self.base_dir = base_dir
        self._count = 0
        super().__init__(self._make)

    def _make(self, n: int) -> SSHBed:
        mode, reason = detect_mode()
        if mode != "netns" and strict() and not os.environ.get("MSLAUNCH_SSHBED_MODE"):
            _unavailable("network namespaces are required when CI=true or "
                         f"MSLAUNCH_TEST_REQUIRE_ALL=1, and {reason}")
        self._count += 1
        bed = SSHBed(os.path.join(self.base_dir, f"bed{self._count}-{n}hosts"), mode=mode)
        bed.mode_reason = reason
        try:
            bed.start(n)
        except (NetBedError, OSError, subprocess.SubprocessError) as e:
            _unavailable(f"{type(e).__name__}: {e}")
        return bed

    def get(self, n_hosts: int = DEFAULT_HOSTS) -> SSHBed:  # type: ignore[override]
        """The session's shared bed with exactly ``n_hosts`` hosts (built on first use)."""
        return super().get(n_hosts, n_hosts)  # type: ignore[return-value]

    def new(self, n_hosts: int = DEFAULT_HOSTS) -> SSHBed:  # type: ignore[override]
        """A bed of the caller's own, stopped at session end (or by its ``stop()``)."""
        return super().new(n_hosts)  # type: ignore[return-value]


_POOLS: List[SSHBedPool] = []


def _unavailable(reason: str) -> None:
    """Fail the test: a bed that cannot be built is an error, never a skip."""
    pytest.fail(f"SSH test bed unavailable: {reason}", pytrace=False)


@pytest.fixture(scope="session")
def sshbeds(tmp_path_factory) -> Iterator[SSHBedPool]:
    """Factory of SSH beds: ``sshbeds.get(n)`` (shared per n) or ``sshbeds.new(n)``."""
    missing = missing_tools()
    if missing:
        _unavailable("missing " + ", ".join(missing)
                     + " (install openssh-server openssh-client iproute2 util-linux; "
                       "scripts/test.sh does)")
    pool = SSHBedPool(str(tmp_path_factory.mktemp("sshbed")))
    _POOLS.append(pool)
    try:
        yield pool
    finally:
        _POOLS.remove(pool)
        pool.close()


@pytest.fixture(scope="session")
def sshbed(sshbeds: SSHBedPool) -> SSHBed:
    """The session's shared bed of 4 hosts h1..h4."""
    return sshbeds.get(DEFAULT_HOSTS)


#: Tests this worker ran since its shared bed last answered (sshprobe's suspects).
_SINCE_SOUND: List[str] = []
_PROBE_ALL = os.environ.get("MSLAUNCH_TEST_PROBE_BEDS") == "1"


def _check_shared(when: str, every: bool) -> None:
    """Fail when a shared bed's hosts (``every`` bed's, else the ``sshbed``
    fixture's) no longer greet a connection (sshprobe)."""
    for bed in [b for pool in _POOLS for b in pool.shared_beds()
                if every or len(b.hosts) == DEFAULT_HOSTS]:
        bad = sshprobe.unanswered(bed) if bed.running else [
            "the bed itself was stopped (by a test: the session's shared beds stop at its end)"]
        if bad:
            suspects = list(_SINCE_SOUND)
            _SINCE_SOUND.clear()    # reported once; the next report names what came after
            pytest.fail(f"{when}: " + sshprobe.diagnosis(bed, bad, suspects), pytrace=False)
    _SINCE_SOUND.clear()


@pytest.fixture(autouse=True)
def _sshbed_restore(request):
    """After each test, undo the faults a test left on a shared bed; remember log offsets.
    Before a test that asks for the shared bed, see that its hosts answer."""
    if "sshbed" in request.fixturenames:
        _check_shared("before this test", every=False)
    request.node._sshbed_log_sizes = netbed.log_offsets(_POOLS)
    yield
    netbed.restore_dirty(_POOLS)
    _SINCE_SOUND.append(request.node.nodeid)
    if _PROBE_ALL:
        _check_shared("after this test", every=True)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    sizes = getattr(item, "_sshbed_log_sizes", None)
    if rep.when == "call" and rep.failed and sizes is not None:
        tails = netbed.log_tails(_POOLS, sizes)
        if tails:
            rep.sections.append(("sshd logs", tails))
