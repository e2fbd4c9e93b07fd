"""The agent at the end of an SSH channel, as the launcher sees it.

:func:`start_agent` runs the bootstrap command in a session channel of an
authenticated paramiko transport, sends the package, and waits for the
agent's ``HELLO``; :class:`SSHAgentConnection` then gives the launcher a plain
socket for the link, copied to and from the channel by threads.
:class:`_QuickAck` is the TCP socket under the transport.
"""

from __future__ import annotations

import socket
import threading
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Optional

from .....machine.loop import wait_fd
from ... import bootstrap
from .....wire import link
from .files import HostFailure, short_reason

#: Seconds for the remote side to answer once the command runs.
AGENT_TIMEOUT = 60.0
#: Seconds an agent has to end once the launcher closed its link.
GONE_AFTER = 5.0
#: Bytes handed to the channel at a time (paramiko's packets are at most 32 KiB).
SEND_PIECE = 32 << 10


class SSHAgentConnection:
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
        #: Told the stderr tail once the agent's output ended, before the link's
        #: end-of-file is passed on (a helper process hands the tail over).
        self.on_end: Optional[Callable[[bytes], None]] = None
        ours, theirs = socket.socketpair()
        self._sock = theirs
        self.fd = ours.detach()
        self._threads = [
            threading.Thread(target=self._up, args=(leftover,), daemon=True,
                             name=f"ssh-up-{name}"),
            threading.Thread(target=self._down, daemon=True, name=f"ssh-down-{name}"),
            threading.Thread(target=self._stderr, daemon=True, name=f"ssh-err-{name}")]
        # Each thread joins another (the copy up waits for the stderr tail, the
        # copy down for the copy up), and a join before that one's start raises
        # RuntimeError: a link that ends at once (an agent gone after its HELLO)
        # reached the join first.  So each is started after the one it joins.
        for index in (2, 0, 1):
            self._threads[index].start()

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
        # What the agent said on its way out is kept before the launcher
        # hears the link end, and asks for it.
        self._threads[2].join(1.0)
        if self.on_end is not None:
            self.on_end(self.stderr_tail)
        try:
            self._sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def _down(self) -> None:
        try:
            while True:
                # Waited for first: a blocked recv() would hold its whole
                # buffer, a quarter MiB per host, for as long as the link is quiet.
                wait_fd(self._sock)
                data = self._sock.recv(1 << 18)
                if not data:
                    break
                _send_parts(self.channel, [data])
        except (OSError, EOFError, Exception):
            pass
        try:
            self.channel.shutdown_write()
        except Exception:
            pass
        # The launcher closed the link: an agent that does not end by then is on a
        # host that no longer answers, and its session ends here (a helper
        # process holding it would otherwise hold it for the rest of the job).
        self._threads[0].join(GONE_AFTER)
        if self._threads[0].is_alive():
            try:
                self.transport.close()
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

    def close(self, wait: float = 1.0, gone: bool = False) -> None:
        """Close the link (the agent sees end-of-file and exits) and the connection
        (``gone`` changes nothing: no process here waits for the host)."""
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


def start_agent(name: str, transport, command: str) -> SSHAgentConnection:
    """Run ``command`` on ``transport``, greet the agent (:class:`~...bootstrap.Handshake`)
    and await its ``HELLO``."""
    try:
        channel = transport.open_session(timeout=30)
        channel.exec_command(command)
    except Exception as err:
        raise HostFailure("agent start", f"cannot run a command: {short_reason(err)}") from None
    try:
        handshake = bootstrap.Handshake(name=name)
        sending = _send_unless_ended(channel, handshake.take_parts())
        deadline = time.monotonic() + AGENT_TIMEOUT
        greeted = None
        channel.settimeout(1.0)
        while greeted is None:
            if time.monotonic() > deadline:
                raise HostFailure("agent start", f"no answer within {AGENT_TIMEOUT:g} s")
            try:
                data = channel.recv(1 << 16)
            except socket.timeout:
                continue
            if not data:
                raise _start_failure(channel)
            greeted = handshake.feed(data)
            if sending:
                sending = _send_unless_ended(channel, handshake.take_parts())
        channel.settimeout(None)
    except HostFailure:
        channel.close()
        raise
    except link.LinkError as err:
        channel.close()
        raise HostFailure("agent start", str(err)) from None
    except Exception as err:
        # A command that ended at once (no Python there) closes the channel
        # while the bootstrap is still going out: its status and stderr say why.
        failure = _start_failure(channel) if channel.closed or channel.exit_status_ready() \
            else HostFailure("agent start", short_reason(err))
        channel.close()
        raise failure from None
    hello, leftover = greeted
    return SSHAgentConnection(name, transport, channel, leftover, hello)


def _send_unless_ended(channel, parts: List[bytes]) -> bool:
    """:func:`_send_parts`; False, sending nothing more, when the command has ended
    (the channel closed): what it wrote first is still read, and judged, the same
    whether it ended before or after this side's bytes went out."""
    try:
        _send_parts(channel, parts)
        return True
    except Exception:
        if channel.closed or channel.exit_status_ready():
            return False
        raise


def _send_parts(channel, parts: List[bytes]) -> None:
    """Send ``parts`` in pieces of at most :data:`SEND_PIECE` bytes: paramiko's
    ``sendall`` copies what is left of its argument after every packet, and
    the package bundle, shared by all hosts, must not be copied per host."""
    for part in parts:
        view = memoryview(part)
        while view:
            piece = bytes(view[:SEND_PIECE])
            while piece:
                piece = piece[channel.send(piece):]
            view = view[SEND_PIECE:]


def _start_failure(channel) -> HostFailure:
    """Why the command ended before the agent said hello (status 126/127: no Python)."""
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
