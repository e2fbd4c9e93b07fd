"""SSH's handshakes off the launcher: helper processes that start the agents.

At many hosts, paramiko's key exchanges and the links' encryption, all in
Python, are most of what the launcher pays per host, and one process pays
them one after the other.  So a job of at least :data:`MIN_HOSTS` SSH
hosts has them done by helper processes: one per :data:`HOSTS_PER_HELPER`
hosts (at least one), at most one per usable core.  The first is a fork of the launcher, made as
soon as the hosts are known (the starter's ``prepare``, while the job is
still being planned) and before the launcher imports paramiko, which it
then has no need of (unless it starts a few hosts itself, as a restart
may): the first helper imports paramiko, on a core of its own,
forks the other helpers (which so share its import rather than pay for
their own), and reaps them in the end.  Each starts the agents of its share
of the hosts exactly as the launcher would (:mod:`.connect`), and hands each
agent to the launcher as a running connection:

- the launcher's end of the link, a socket pair the helper copies to and
  from the SSH channel, as :class:`.channel.SSHAgentConnection` does in
  the launcher; the link is the same, only the copying is elsewhere;
- the read end of a pipe that receives the agent's stderr tail once its
  output ended (before the link's end-of-file) and is closed once the
  agent's SSH session is over: the launcher waits for that end as it would
  for the session.

Each helper speaks to the launcher on a socket pair of its own: one message
a datagram (:func:`.fork.encode`), the two descriptors of an agent beside its
``up``.  The launcher says nothing on it: its end closing (the job ended,
the launcher gave up starting, or it died) makes the helper close every
SSH session it holds, which ends their agents, and exit.  A helper whose agents
have all ended exits by itself.  It runs in a session of its own, so that
the terminal's signals reach only the launcher, which decides; ``ps`` names
it ``mslaunch-ssh``.

``MSLAUNCH_SSH_HELPERS`` sets the number of helpers (0: none, the launcher
starts every host itself).
"""

from __future__ import annotations

import os
import socket

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

    from .connect import Options

from .....core.errors import HostsFailed, LaunchError, UsageError
from .....machine import timeline
from .files import HostFailure
from .fork import WireError, decode, fork_helpers, readable

#: SSH hosts from which helpers start them (fewer: the launcher itself does).
MIN_HOSTS = 8
#: SSH hosts per helper past the first.  Each helper costs a fork and its
#: copies of the launcher's pages (some 20 ms of CPU on a 2-core machine
#: whose cores also ran the hosts, where a second helper at 16 hosts bought
#: no time); a helper's 32 hosts cost it about 350 ms.
HOSTS_PER_HELPER = 32
#: The longest message on a helper's socket (an agent's HELLO is a few KiB).
MAX_MESSAGE = 256 << 10
#: Helpers at most, by default: as many SSH handshakes as one sshd is given at once.
PER_SSHD = 8
#: Seconds between looks at ``cancelled`` while the helpers work.
TICK = 0.05


def helper_count(hosts: int, environ: Mapping[str, str]) -> int:
    """How many helpers start the agents of ``hosts`` SSH hosts."""
    setting = environ.get("MSLAUNCH_SSH_HELPERS", "").strip()
    if setting:
        if not (setting.isascii() and setting.isdigit()):
            raise UsageError(f"MSLAUNCH_SSH_HELPERS={setting[:20]!r}: not a number of processes")
        return min(int(setting), hosts)
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    # At most PER_SSHD helpers: each may have a handshake at a time with one
    # sshd (a ProxyJump host's), and more would pass OpenSSH's MaxStartups.
    return 0 if hosts < MIN_HOSTS else min(cores, PER_SSHD, max(1, hosts // HOSTS_PER_HELPER))


# -- the launcher's side -------------------------------------------------------------
class HelpedConnection:
    """An agent a helper started (the seam's ``AgentConnection``)."""

    ended_because = ""

    def __init__(self, name: str, hello: Dict[str, Any], local: str, fd: int,
                 status: int, helper: socket.socket) -> None:
        self.name = name
        # The helper holds the agent's SSH session while its socket is open
        # (Helpers.end closes it).
        self._helper = helper
        self.hello = hello
        self.local_address = local or None
        self.fd = fd
        self._status = status
        self._tail = b""
        os.set_blocking(status, False)

    def _read(self) -> bool:
        """Take what the status pipe holds; True once it ended."""
        while self._status >= 0:
            try:
                data = os.read(self._status, 4096)
            except BlockingIOError:
                return False
            except OSError:
                data = b""
            if not data:
                return True
            self._tail = (self._tail + data)[-4096:]
        return True

    @property
    def stderr_tail(self) -> bytes:
        self._read()
        return self._tail

    def wait_exit(self, deadline: float) -> bool:
        import time
        from .....machine.loop import wait_fd
        while not self._read():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            wait_fd(self._status, timeout=left)
        return True

    def close(self, wait: float = 1.0, gone: bool = False) -> None:
        import time
        try:
            with socket.socket(fileno=os.dup(self.fd)) as sock:
                sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.wait_exit(time.monotonic() + wait)
        if self._status >= 0:
            os.close(self._status)
            self._status = -1


class Helpers:
    """The helpers of one set of hosts: forked by :meth:`begin`, heard by :meth:`collect`."""

    def __init__(self, options: Options) -> None:
        self.options = options
        #: The first helper of each begin, and every helper's socket, till end().
        self.forked: List[Tuple[int, List[socket.socket]]] = []
        self.names: List[str] = []                            # the hosts being started
        self.count = 0                                        # by this many helpers
        self._talking: Dict[socket.socket, List[str]] = {}    # helpers not done yet

    def begin(self, names: Sequence[str], count: int) -> None:
        """Fork ``count`` helpers that start the agents of ``names`` now.

        No other thread may be importing a module or building the agents'
        package meanwhile (a lock held in the launcher would be held for
        ever in the helper): :class:`.starter.SSHStarter` forks them before it
        begins either, or once both are done."""
        from .connect import CONCURRENCY, PER_SSHD
        per_sshd, concurrency = max(1, PER_SSHD // count), max(1, CONCURRENCY // count)
        self.names, self.count = list(names), count
        shares = [list(names[i::count]) for i in range(count)]
        try:
            pid, ctls = fork_helpers(shares, self.options, per_sshd, concurrency)
        except OSError as err:
            raise LaunchError(f"cannot start a helper process for SSH: "
                              f"{err.strerror or err}") from None
        self.forked.append((pid, ctls))
        self._talking.update(zip(ctls, shares))

    def collect(self, cancelled: Optional[Callable[[], bool]] = None
                ) -> Dict[str, HelpedConnection]:
        """An agent on every host of :meth:`begin`'s; all of them, or HostsFailed
        with those that started (as :func:`~mslaunch.backends.agents.starters.ssh.connect.connect_all`)."""
        import time
        from .connect import close_all, describe_failures
        from .channel import AGENT_TIMEOUT
        done: Dict[str, HelpedConnection] = {}
        failures: Dict[str, HostFailure] = {}
        helpers = self._talking
        # A host's every step has its timeout in the helper, which says something
        # of each: silence past them all is a helper that hangs.
        silence = 2 * (self.options.connect_timeout + AGENT_TIMEOUT) + 30
        heard = {ctl: time.monotonic() for ctl in helpers}
        try:
            while helpers:
                ready = readable(helpers, TICK)
                timeline.tick()
                if cancelled is not None and cancelled():
                    raise LaunchError("stopped while connecting to the remote hosts", 130)
                now = time.monotonic()
                for ctl in list(helpers):
                    if ctl in ready:
                        heard[ctl] = now
                        if not _take(ctl, helpers[ctl], done, failures):
                            helpers.pop(ctl)
                    elif now - heard[ctl] > silence:
                        _unanswered(helpers.pop(ctl), done, failures,
                                    f"its SSH helper said nothing for {silence:.0f} s")
                        ctl.close()
        except BaseException:
            for ctl in helpers:
                ctl.close()
            helpers.clear()
            close_all(done)
            raise
        if failures:
            raise HostsFailed(describe_failures(failures, len(self.names)),
                              {name: str(f) for name, f in failures.items()}, done,
                              [name for name, f in failures.items() if f.stage == "connect"])
        return done

    def end(self, wait: float = 2.0) -> None:
        """Close each helper's socket (it ends the SSH sessions it still holds and
        exits) and see it reaped: SIGKILLed after ``wait`` s."""
        import signal
        import time
        from .....machine.spawn import helper_pids
        pids = {pid for pid, _ in self.forked}
        for _, ctls in self.forked:
            for ctl in ctls:
                ctl.close()
        self.forked.clear()
        self._talking.clear()
        for last in (False, True):
            deadline = time.monotonic() + (1.0 if last else wait)
            while pids & helper_pids() and time.monotonic() < deadline:
                time.sleep(0.005)
            for pid in pids & helper_pids() if not last else ():
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass


def _take(ctl: socket.socket, share: List[str], done: Dict[str, HelpedConnection],
          failures: Dict[str, HostFailure]) -> bool:
    """Read one message of a helper; False once it said all (or ended)."""
    why = "the SSH helper process ended"
    try:
        # Close-on-exec as they arrive: no rank started here may inherit a link.
        data, fds, flags = _receive(ctl)
    except OSError as err:
        data, fds, flags = b"", [], 0
        why = f"its SSH helper's socket failed: {err.strerror or err}"
    if flags & socket.MSG_CTRUNC:
        why = "the launcher has no descriptor left for its link (raise ulimit -n)"
    elif flags & socket.MSG_TRUNC:
        why = "its SSH helper sent a message too long to be one"
    if not data or flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
        for fd in fds:
            os.close(fd)
        _unanswered(share, done, failures, why)
        return False
    try:
        message = decode(data)
        if message["t"] == "up" and (len(fds) != 2 or message["host"] not in share):
            raise WireError("an SSH helper process handed over an agent that is not one")
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    kind = message["t"]
    if kind == "up":
        done[message["host"]] = HelpedConnection(message["host"], message["hello"],
                                                 message["local"], fds[0], fds[1], ctl)
        return True
    for fd in fds:
        os.close(fd)
    if kind == "mark":
        timeline.mark(message["event"], message["host"], at=message["at"])
    elif kind == "failed":
        key = message["key"]
        failures[message["host"]] = HostFailure(message["stage"], message["reason"],
                                                (key[0], key[1]) if key else None)
    if kind == "done":
        _unanswered(share, done, failures, "its SSH helper said nothing of it")
    return kind != "done"


def _receive(ctl: socket.socket) -> Tuple[bytes, List[int], int]:
    """One message and its descriptors, close-on-exec from the start (what
    ``socket.recv_fds`` does not ask for, whatever its flags say)."""
    import array
    fds = array.array("i")
    data, ancillary, flags, _ = ctl.recvmsg(MAX_MESSAGE, socket.CMSG_LEN(2 * fds.itemsize),
                                            socket.MSG_CMSG_CLOEXEC)
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
    return data, list(fds), flags


def _unanswered(share: List[str], done: Dict[str, HelpedConnection],
                failures: Dict[str, HostFailure], why: str) -> None:
    """Every host of ``share`` without an answer fails, for ``why``."""
    for name in share:
        if name not in done and name not in failures:
            failures[name] = HostFailure("agent start", why)
