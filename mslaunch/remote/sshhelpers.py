"""SSH's handshakes off the launcher: helper processes that start the agents.

At many hosts, paramiko's key exchanges and the links' encryption, all in
Python, are most of what the launcher pays per host, and one process pays
them one after the other.  So a job of at least :data:`MIN_HOSTS` SSH
hosts has them done by helper processes: one per :data:`HOSTS_PER_HELPER`
hosts (at least one), at most one per usable core.  The first is a fork of the launcher, made as
soon as the hosts are known (the starter's ``prepare``, while the job is
still being planned) and before the launcher imports paramiko, which it
then never does: the first helper imports paramiko, on a core of its own,
forks the other helpers (which so share its import rather than pay for
their own), and reaps them in the end.  Each starts the agents of its share
of the hosts exactly as the launcher would (:mod:`.ssh`), and hands each
agent to the launcher as a running connection:

- the launcher's end of the link, a socket pair the helper copies to and
  from the SSH channel, as :class:`.sshchannel.SSHAgentConnection` does in
  the launcher; the link is the same, only the copying is elsewhere;
- the read end of a pipe that receives the agent's stderr tail once its
  output ended (before the link's end-of-file) and is closed once the
  agent's SSH session is over: the launcher waits for that end as it would
  for the session.

Each helper speaks to the launcher on a socket pair of its own: one message
a datagram (:func:`encode`), the two descriptors of an agent beside its
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

import json
import os
import socket
import threading

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

    from .ssh import Options
    from .sshchannel import SSHAgentConnection

from ..errors import LaunchError, UsageError
from . import timeline
from .sshfiles import HostFailure

#: SSH hosts from which helpers start them (fewer: the launcher itself does).
MIN_HOSTS = 8
#: SSH hosts per helper past the first.  Each helper costs a fork and its
#: copies of the launcher's pages (some 20 ms of CPU on a 2-core machine
#: whose cores also ran the hosts, where a second helper at 16 hosts bought
#: no time); a helper's 32 hosts cost it about 350 ms.
HOSTS_PER_HELPER = 32
#: The longest message on a helper's socket (an agent's HELLO is a few KiB).
MAX_MESSAGE = 1 << 20
#: A helper's process name.
COMM = "mslaunch-ssh"
#: Seconds between looks at ``cancelled`` while the helpers work.
TICK = 0.05


class WireError(LaunchError):
    """A helper's message that is not one."""


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
    return 0 if hosts < MIN_HOSTS else min(cores, max(1, hosts // HOSTS_PER_HELPER))


# -- the wire -------------------------------------------------------------------
_FIELDS: Dict[str, Tuple[Tuple[str, type], ...]] = {
    "mark": (("at", float), ("event", str), ("host", str)),
    "up": (("host", str), ("hello", dict), ("local", str)),
    "failed": (("host", str), ("stage", str), ("reason", str), ("key", list)),
    "done": (),
}


def encode(kind: str, **fields: Any) -> bytes:
    """One message of a helper to the launcher."""
    return json.dumps({"t": kind, **fields}, separators=(",", ":")).encode()


def decode(data: bytes) -> Dict[str, Any]:
    """A message :func:`encode` made; WireError for anything else."""
    try:
        message = json.loads(data.decode())
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise WireError("an SSH helper process sent a message that is not JSON") from None
    if not isinstance(message, dict) or not isinstance(message.get("t"), str) \
            or message["t"] not in _FIELDS:
        raise WireError("an SSH helper process sent a message of no known kind")
    for field, kind in _FIELDS[message["t"]]:
        value = message.get(field)
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = message[field] = float(value)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise WireError(f"an SSH helper process sent a {message['t']!r} message "
                            f"without a valid {field!r}")
    key = message.get("key") if message["t"] == "failed" else None
    if key and (len(key) != 2 or not all(isinstance(k, str) for k in key)):
        raise WireError("an SSH helper process sent a host key that is not one")
    return message


# -- the launcher's side -------------------------------------------------------------
class HelpedConnection:
    """An agent a helper started (the seam's ``AgentConnection``)."""

    ended_because = ""

    def __init__(self, name: str, hello: Dict[str, Any], local: str, fd: int,
                 status: int, helper: socket.socket) -> None:
        self.name = name
        # The helper holds the agent's SSH session while its socket is open:
        # each of its agents keeps it open, and the last one closed closes it.
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
        from ..machine.loop import wait_fd
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
        ever in the helper): :class:`.sshstarter.SSHStarter` forks them before it
        begins either, or once both are done."""
        from .ssh import CONCURRENCY, PER_SSHD
        per_sshd, concurrency = max(1, PER_SSHD // count), max(1, CONCURRENCY // count)
        self.names, self.count = list(names), count
        shares = [list(names[i::count]) for i in range(count)]
        try:
            pid, ctls = _fork(shares, self.options, per_sshd, concurrency)
        except OSError as err:
            raise LaunchError(f"cannot start a helper process for SSH: "
                              f"{err.strerror or err}") from None
        self.forked.append((pid, ctls))
        self._talking.update(zip(ctls, shares))

    def collect(self, cancelled: Optional[Callable[[], bool]] = None
                ) -> Dict[str, HelpedConnection]:
        """An agent on every host of :meth:`begin`'s; all of them or none
        (LaunchError, as :func:`.ssh.connect_all`)."""
        from .ssh import close_all, describe_failures
        done: Dict[str, HelpedConnection] = {}
        failures: Dict[str, HostFailure] = {}
        helpers = self._talking
        try:
            while helpers:
                ready = _readable(helpers, TICK)
                timeline.tick()
                if cancelled is not None and cancelled():
                    raise LaunchError("stopped while connecting to the remote hosts", 130)
                for ctl in ready:
                    if not _take(ctl, helpers[ctl], done, failures):
                        helpers.pop(ctl)
        except BaseException:
            for ctl in helpers:
                ctl.close()
            helpers.clear()
            close_all(done)
            raise
        if failures:
            close_all(done)
            raise LaunchError(describe_failures(failures, len(self.names)))
        return done

    def end(self, wait: float = 2.0) -> None:
        """Close each helper's socket (it ends the SSH sessions it still holds and
        exits) and see it reaped: SIGKILLed after ``wait`` s."""
        import signal
        import time
        from ..machine.spawn import helper_pids
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


def _readable(watched: Any, timeout: Optional[float]) -> List[Any]:
    """Those of ``watched`` (sockets or descriptors) ready to read (or ended) within
    ``timeout`` s: ``poll``, as descriptors past 1023 are many hosts' lot."""
    import select
    poller = select.poll()
    by_fd = {}
    for item in watched:
        fd = item if isinstance(item, int) else item.fileno()
        by_fd[fd] = item
        poller.register(fd, select.POLLIN)
    wait = None if timeout is None else int(timeout * 1000)
    return [by_fd[fd] for fd, _ in poller.poll(wait)]


def _take(ctl: socket.socket, share: List[str], done: Dict[str, HelpedConnection],
          failures: Dict[str, HostFailure]) -> bool:
    """Read one message of a helper; False once it said all (or ended)."""
    try:
        data, fds, flags, _ = socket.recv_fds(ctl, MAX_MESSAGE, 2)
    except OSError:
        data, fds, flags = b"", [], 0
    if not data or flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
        for fd in fds:
            os.close(fd)
        for name in share:
            if name not in done and name not in failures:
                failures[name] = HostFailure("agent start", "the SSH helper process ended")
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
    return kind != "done"


def _fork(shares: List[List[str]], options: Options, per_sshd: int, concurrency: int
          ) -> Tuple[int, List[socket.socket]]:
    """The first helper, which forks the others (see :func:`_first_helper`): its
    pid, and the launcher's end of each helper's socket."""
    from ..machine.spawn import wait_in_background
    import warnings
    pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET) for _ in shares]
    with warnings.catch_warnings():
        # Python 3.12 warns of a fork beside threads: no thread of the launcher
        # imports or builds anything by now (see Helpers.begin), and the
        # helper sheds the rest.
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            pid = os.fork()
        except OSError:
            for pair in pairs:
                for sock in pair:
                    sock.close()
            raise
    if pid == 0:               # the helper: it never returns from here
        code = 70
        try:
            fds = [theirs.detach() for _, theirs in pairs]
            code = _first_helper(fds, shares, options, per_sshd, concurrency)
        finally:
            os._exit(code)
    for _, theirs in pairs:
        theirs.close()
    wait_in_background(pid)
    return pid, [ours for ours, _ in pairs]


# -- the helpers ---------------------------------------------------------------------
def _become_helper(keep: List[int]) -> None:
    """Shed the launcher: its signals, its terminal, every descriptor but ``keep``."""
    import gc
    import signal
    # Nothing of the launcher's is collected here: a file object's finalizer
    # would close a descriptor by number, which may be one of the helper's
    # by then.
    gc.freeze()
    os.setsid()
    try:
        signal.set_wakeup_fd(-1)
    except ValueError:
        pass
    for sig in signal.valid_signals():
        try:
            if callable(signal.getsignal(sig)):
                signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError):
            pass
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    low = 3
    for fd in sorted(keep) + [max(os.sysconf("SC_OPEN_MAX"), max(keep) + 1)]:
        os.closerange(low, fd)
        low = fd + 1
    try:
        with open("/proc/self/comm", "w") as f:      # its name in ps and top
            f.write(COMM)
    except OSError:
        pass


def _first_helper(fds: List[int], shares: List[List[str]], options: Options, per_sshd: int,
                  concurrency: int) -> int:
    """Import paramiko, fork a helper for each share but the first (each sharing
    the import, not paying for one), serve the first, and reap the others."""
    from .bundle import package_bundle
    from .paramiko_import import import_finished, start_import
    _become_helper(fds)
    start_import()
    # The agents' package, read meanwhile (every agent's start needs it).
    bundle = threading.Thread(target=package_bundle, daemon=True, name="agent-bundle")
    bundle.start()
    kids = []
    if len(fds) > 1:
        import_finished()
        bundle.join()
        for fd, share in zip(fds[1:], shares[1:]):
            try:
                pid = os.fork()
            except OSError:
                continue       # its hosts fail: its socket closes unanswered
            if pid == 0:
                code = 70
                try:
                    _become_helper([fd])
                    code = _helper(fd, share, options, per_sshd, concurrency)
                finally:
                    os._exit(code)
            kids.append(pid)
        for fd in fds[1:]:
            os.close(fd)
    code = _helper(fds[0], shares[0], options, per_sshd, concurrency)
    for pid in kids:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
    return code


def _helper(ctl_fd: int, share: List[str], options: Options, per_sshd: int,
            concurrency: int) -> int:
    """Start the agents of ``share``, hand them over, and hold their sessions."""
    from .ssh import _Connector, connect_each
    ctl = socket.socket(fileno=ctl_fd)
    wake_r, wake_w = os.pipe()
    lock = threading.Lock()
    held: List[SSHAgentConnection] = []
    state = {"live": 0, "connecting": True}

    def send(data: bytes, fds: Sequence[int] = ()) -> None:
        with lock:
            socket.send_fds(ctl, [data], list(fds))

    def wake() -> None:
        os.write(wake_w, b".")

    timeline.forward(lambda at, event, host: send(encode("mark", at=at, event=event, host=host)))

    def up(name: str, conn: SSHAgentConnection) -> None:
        status_r, status_w = os.pipe()
        with lock:
            held.append(conn)
            state["live"] += 1
        conn.on_end = hand_over = _once(status_w)
        try:
            send(encode("up", host=name, hello=conn.hello, local=conn.local_address or ""),
                 [conn.fd, status_r])
        except OSError:
            pass                                 # the launcher is gone: see below
        finally:
            os.close(status_r)
            os.close(conn.fd)
        threading.Thread(target=_hold, args=(conn, hand_over, status_w, state, lock, wake), daemon=True,
                         name=f"hold-{name}").start()

    def failed(name: str, err: HostFailure) -> None:
        key = list(err.unknown_key) if err.unknown_key else []
        try:
            send(encode("failed", host=name, stage=err.stage, reason=err.reason, key=key))
        except OSError:
            pass

    connector = _Connector(options, options.pythons, per_sshd)
    workers = connect_each(connector, share, concurrency, up, failed, threading.Event())

    def finish() -> None:
        for w in workers:
            w.join()
        with lock:
            state["connecting"] = False
        wake()

    threading.Thread(target=finish, daemon=True, name="connected").start()
    said_done = False
    while True:
        ready = _readable([ctl, wake_r], None)
        if ctl in ready:
            break                               # the launcher ended or gave up
        os.read(wake_r, 512)
        with lock:
            connecting, live = state["connecting"], state["live"]
        if not connecting and not said_done:
            try:
                send(encode("done"))
            except OSError:
                break
            said_done = True
        if said_done and live == 0:
            return 0
    for conn in list(held):
        conn.close(wait=0)
    return 0


def _once(fd: int) -> Callable[[bytes], None]:
    """Write the stderr tail to the status pipe ``fd``, the first time only."""
    lock = threading.Lock()
    said: List[bool] = []

    def hand_over(tail: bytes) -> None:
        with lock:
            if said:
                return
            said.append(True)
        try:
            os.write(fd, tail)
        except OSError:
            pass
    return hand_over


def _hold(conn: SSHAgentConnection, hand_over: Callable[[bytes], None], status_w: int,
          state: Dict[str, Any], lock: threading.Lock, wake: Callable[[], None]) -> None:
    """Until the agent's output ends, then close its session and the status pipe."""
    conn._threads[0].join()
    hand_over(conn.stderr_tail)                 # if it ended before it was listened to
    conn.close(wait=1.0)
    os.close(status_w)
    with lock:
        state["live"] -= 1
    wake()
