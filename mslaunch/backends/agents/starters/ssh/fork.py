"""The SSH helper processes themselves (see :mod:`.helpers`), and their wire.

:func:`fork_helpers` forks the first helper from the launcher; it imports
paramiko, forks the others, and each starts the agents of its share of the
hosts (:func:`~.connect.connect_each`), hands each agent over on its socket
(:func:`encode`: one JSON message a datagram, an agent's two descriptors
beside its ``up``), and holds the agents' SSH sessions until they end or
the launcher's end of its socket closes.
"""

from __future__ import annotations

import json
import os
import socket
import threading

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

    from .connect import Options
    from .channel import SSHAgentConnection

from .....core.errors import LaunchError
from .....machine import timeline
from .files import HostFailure

#: A helper's process name.
COMM = "mslaunch-ssh"


class WireError(LaunchError):
    """A helper's message that is not one."""


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


def readable(watched: Any, timeout: Optional[float]) -> List[Any]:
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


def fork_helpers(shares: List[List[str]], options: Options, per_sshd: int, concurrency: int
                 ) -> Tuple[int, List[socket.socket]]:
    """Fork the first helper, which forks the others (see :func:`_first_helper`):
    its pid, and the launcher's end of each helper's socket."""
    from .....machine.spawn import wait_in_background
    pairs: List[Tuple[socket.socket, socket.socket]] = []
    try:
        for _ in shares:
            pairs.append(socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET))
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
    gc.enable()       # held off by the launcher until its loop waits; a helper has none
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


def _die_with_parent(parent: int) -> None:
    """SIGKILL this process when the first helper, ``parent``, ends (it reaps the
    others: an end of it that it did not choose, the launcher's kill
    included, would leave them to no one)."""
    import signal
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)   # PR_SET_PDEATHSIG
    except (ImportError, OSError, AttributeError):
        pass
    if os.getppid() != parent:       # it ended before the signal was asked for
        os._exit(0)


def _first_helper(fds: List[int], shares: List[List[str]], options: Options, per_sshd: int,
                  concurrency: int) -> int:
    """Import paramiko, fork a helper for each share but the first (each sharing
    the import, not paying for one), serve the first, and reap the others."""
    from ...bundle import bundle_digest
    from .paramiko_import import import_finished, start_import
    _become_helper(fds)
    start_import()
    # The agents' package's digest, read meanwhile (every agent's start needs it;
    # the package itself is read if a host asks for it).
    bundle = threading.Thread(target=bundle_digest, daemon=True, name="agent-bundle")
    bundle.start()
    kids = []
    if len(fds) > 1:
        import_finished()
        bundle.join()
        me = os.getpid()
        for fd, share in zip(fds[1:], shares[1:]):
            try:
                pid = os.fork()
            except OSError:
                continue       # its hosts fail: its socket closes unanswered
            if pid == 0:
                code = 70
                try:
                    _become_helper([fd])
                    _die_with_parent(me)
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
    from .connect import _Connector, connect_each
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
        except OSError as err:
            # The launcher is gone (then see below), or the message cannot go.
            failed(name, HostFailure("agent start", f"cannot hand the agent over: "
                                                    f"{err.strerror or err}"))
        finally:
            os.close(status_r)
            os.close(conn.fd)
        threading.Thread(target=_hold, args=(conn, hand_over, status_w, state, lock, wake),
                         daemon=True, name=f"hold-{name}").start()

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
        ready = readable([ctl, wake_r], None)
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
    # Ending the process ends every SSH session it holds at once; closing each
    # channel first could wait for ever on a host that no longer answers.
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
    """Until the agent's output ends, then close its session and the status pipe
    (a host that no longer answers: see :data:`.channel.GONE_AFTER`)."""
    import time
    while not conn.wait_exit(time.monotonic() + 3600):
        pass
    hand_over(conn.stderr_tail)                 # if it ended before it was listened to
    conn.close(wait=1.0)
    os.close(status_w)
    with lock:
        state["live"] -= 1
    wake()
