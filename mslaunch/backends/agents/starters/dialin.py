"""Agents that dial back: the launcher's side, shared by srun and rsh agents.

When the command that starts the agents gives them no stdin (``srun
--input=none``, ``kubectl exec`` without ``-i``), each agent connects back
to the launcher over TCP, presents a one-time token (see :mod:`mslaunch.wire.dialback`),
and reads the same bootstrap and package as over SSH on that connection
(:class:`~..bootstrap.Handshake`).  Here are the
launcher's pieces: the one-line program the agents run
(:func:`dial_program`), the loop that greets them (:func:`greet`, or
:class:`Greeter` in two steps: start now, greet later), the process that
started them (:class:`StartingProcess`: its output's tail, and what its end
means) and the launcher's end of a link (:class:`DialedConnection`).

The starting process (srun, ssh, kubectl...) is only the way there: once
an agent dialled, the link is the TCP connection.  When that process ends
while a link is still open and quiet, the link is cut, so that the agent
stops its ranks and the launcher reports the host lost, naming the
process and how it ended -- as Open MPI treats the end of an ssh session
as the loss of its daemon.
"""

from __future__ import annotations

from ....core import socket as _socket
import os
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    import socket
    from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from ....core.errors import HostsFailed, LaunchError, one_line
from ....machine.loop import Loop, bind, wait_fd
from ....machine.spawn import signal_name
from .. import bootstrap
from ....wire import link
from ....machine import timeline


def dial_program(prelude: str, token: str,
                 missing: str = "this host is not one the launcher started an agent for") -> str:
    """The one-line program an agent runs: ``prelude`` (Python statements, each
    ending in ``;``), then it takes its token (the Python expression ``token``;
    empty: it says ``missing``) and ``MSLAUNCH_DIAL`` (``ADDR:PORT[,ADDR:PORT...]``,
    tried in turn) out of the environment, connects to the first address whose
    far end proves it knows the token (:mod:`mslaunch.wire.dialproof`), proves
    it knows it too, makes the connection its stdin and stdout and reads the
    bootstrap as over SSH.  Single quotes only, for the ``sh -c`` double quotes
    around it (and none in ``missing``)."""
    assert "'" not in missing and '"' not in missing
    from ....wire.dialproof import AGENT_HANDSHAKE, HELLO
    # ``_socket``, the C module: ``socket`` would cost the agent's start 10 ms.
    # sys.exit: under -S there is no exit() builtin.
    return ("import io,os,sys,_socket as socket;e=os.environ;" + prelude + "t=" + token + ";"
            "a=e.pop('MSLAUNCH_DIAL');"
            "t or sys.exit('mslaunch: " + missing + "');"
            # After the nonce, the interpreter's bytecode version: an agent of the
            # launcher's is sent the bootstrap compiled (see bootstrap.Handshake).
            "m=getattr(sys.modules.get('_frozen_importlib_external'),'MAGIC_NUMBER',b'').hex();"
            "h='" + HELLO + "';"
            "exec(bytes.fromhex('" + AGENT_HANDSHAKE.encode().hex() + "').decode());"
            "s or sys.exit('mslaunch: cannot reach the launcher at '+a);"
            "os.dup2(s.fileno(),0);os.dup2(s.fileno(),1);s.close();"
            "b=io.BufferedReader(io.FileIO(0,closefd=False),1);"
            "exec(b.read(int(b.readline())))")


class StartingProcess:
    """A process that started agents (srun, an rsh command): its output's tail,
    and the cut of its agents' links when it ends under them."""

    ran = "agent"             # what it ran, as its end is reported
    several = False           # it runs the agents of several hosts (srun)

    def __init__(self, argv: Sequence[str], env: Optional[Dict[str, str]], what: str,
                 stdin: bytes = b"") -> None:
        from ....machine.spawn import Helper
        self.what = what
        try:
            self.proc = Helper(argv, env, stdin)
        except OSError as err:
            raise LaunchError(f"cannot run {what}: {err.strerror}") from None
        import threading          # after the start: srun's step waits for nothing here
        self.tail = b""
        self.open = 0
        self.closing = False          # mslaunch itself is ending the process
        #: A link's agent does not answer (its host was lost): the process cannot
        #: end by itself (srun waits for that host, until Slurm marks it down),
        #: so it is not waited for.
        self.hopeless = False
        self.ended_because = ""
        self.links: List[socket.socket] = []
        self._ended = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True, name=f"{what}-output")
        self._reader.start()
        threading.Thread(target=self._watch, daemon=True, name=f"{what}-watch").start()

    def _read(self) -> None:
        with self.proc.stdout:
            for line in self.proc.stdout:
                self.tail = (self.tail + line)[-4096:]

    def _watch(self) -> None:
        # Its output may stay open in processes it left behind: the end of
        # the process itself is what counts.
        code = self.proc.wait()
        self._ended.set()
        # Gone while agents still run: the job ends as when a host is lost.
        # Cutting a link makes its agent stop its ranks and the launcher
        # report the host.  A link whose agent has closed it (the normal
        # end, after which the process ends) is left alone; one with unread
        # bytes is looked at again.
        how = f"killed by {signal_name(-code)}" if code < 0 else f"status {code}"
        because = f"{self.what}, which ran the {self.ran}, ended ({how})"
        if code < 0 and not self.closing:
            self.ended_because = because
        deadline = time.monotonic() + 5.0
        todo = list(self.links)
        while todo and not self.closing and time.monotonic() < deadline:
            time.sleep(0.2)
            for sock in list(todo):
                try:
                    if sock.recv(1, _socket.MSG_PEEK | _socket.MSG_DONTWAIT):
                        continue                     # unread bytes: not known yet
                except BlockingIOError:
                    if self.closing:
                        return
                    self.ended_because = because
                    try:
                        sock.shutdown(_socket.SHUT_RDWR)
                    except OSError:
                        pass
                except OSError:
                    pass
                todo.remove(sock)

    def last_line(self, skip: Sequence[str] = (), wait: float = 0.0) -> str:
        """What the process said last: the last line not starting with ``skip``.
        When it has ended, up to ``wait`` s go to reading what it wrote just
        before (its output may stay open in processes it left behind)."""
        if wait and self.proc.poll() is not None:
            self._reader.join(wait)
        lines = self.tail.decode("utf-8", "replace").strip().splitlines()
        useful = [ln for ln in lines if ln.strip() and not ln.startswith(tuple(skip))]
        pick = useful or lines
        return one_line(pick[-1], 300) if pick else ""

    def end(self, wait: float) -> None:
        """Wait up to ``wait`` s for the process to end (its agents exited), then
        end its process group."""
        import signal
        # The watching thread reaps it: its event says so at once, where
        # Popen.wait(timeout) would look again only after growing sleeps.
        if self._ended.wait(max(wait, 0.05)):
            return
        for sig, grace in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(self.proc.pid, sig)
            except OSError:
                return
            if self._ended.wait(grace):
                return


def plain_address(address: str) -> str:
    """``address`` without the IPv4-mapped form a dual-stack listener gives
    (``::ffff:10.0.0.1`` is ``10.0.0.1``)."""
    if address.lower().startswith("::ffff:") and "." in address:
        return address[7:]
    return address


class DialedConnection:
    """A running agent that dialled back: the :class:`~.starter.AgentConnection`
    of srun and rsh agents."""

    def __init__(self, name: str, sock: socket.socket, hello: Dict[str, Any],
                 starter: StartingProcess) -> None:
        self.name = name
        self.hello = hello
        self._sock = sock
        self._step = starter
        starter.open += 1
        starter.links.append(sock)
        self.fd = os.dup(sock.fileno())
        os.set_blocking(self.fd, False)
        self._address = plain_address(sock.getsockname()[0])

    @property
    def stderr_tail(self) -> bytes:
        tail = self._step.tail
        if self._step.several:
            # One srun for every node: this agent's lines are those naming its
            # node (``srun: error: h3: task 2: ...``, ``mslaunch agent on h3: ...``).
            tail = b"\n".join(ln for ln in tail.split(b"\n")
                              if names_node(ln.decode("utf-8", "replace"), self.name))
        return tail

    @property
    def ended_because(self) -> str:
        return self._step.ended_because

    @property
    def local_address(self) -> Optional[str]:
        return self._address

    def wait_exit(self, deadline: float) -> bool:
        """Wait until the agent has closed its end of the link (it exited)."""
        sock = self._sock
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if not wait_fd(sock, False, left):
                return False
            try:
                if not sock.recv(1 << 16):
                    return True
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                return True

    def close(self, wait: float = 1.0, gone: bool = False) -> None:
        if self._sock.fileno() < 0:
            return
        self._step.open -= 1
        if self._step.open <= 0:
            # The process ends because mslaunch ends it.  Closing only some
            # links (agents the plan does not use) must not hide a kill later.
            self._step.closing = True
        try:
            self._sock.shutdown(_socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        step = self._step
        step.hopeless = step.hopeless or gone
        if step.open <= 0:
            step.end(0.0 if step.hopeless else wait)


def greet(addresses: Sequence[str], tokens: Mapping[str, str],
          start: Callable[[str, Dict[str, StartingProcess]], None],
          wait: Callable[[Loop, Dict[str, DialedConnection], Dict[str, StartingProcess]], None],
          port_range: Optional[Tuple[int, int]] = None) -> Dict[str, DialedConnection]:
    """Listen on ``addresses``, start the agents, greet each that presents its
    host's token (from ``tokens``, by host name), until ``wait`` returns.

    ``start(dial, procs)`` starts the agents, ``dial`` being the ``MSLAUNCH_DIAL``
    value, and puts the starting process of each host in ``procs`` (by name).
    ``wait(loop, done, procs)`` runs the loop until every agent is in ``done``,
    or raises; then the agents already greeted are closed and every starting
    process ended: all or none -- but for :class:`~mslaunch.core.errors.HostsFailed`,
    which carries the agents that did start, unless one process started them
    all.  The listener takes a port of ``port_range`` if given."""
    greeter = Greeter(addresses, tokens, port_range)
    greeter.begin(start)
    return greeter.finish(wait)


class Greeter:
    """:func:`greet` in two steps, so that the agents may be started early and
    greeted later: the kernel holds their connections meanwhile.

    ``shown``, when given, stands for each address in the ``MSLAUNCH_DIAL``
    value (``*``: the agent puts its own idea of the launcher's address there).
    """

    def __init__(self, addresses: Sequence[str], tokens: Mapping[str, str],
                 port_range: Optional[Tuple[int, int]] = None,
                 shown: Optional[str] = None) -> None:
        from ....wire.dialback import Listener
        # Every agent is greeted at once: each takes a while to unpack the package
        # and say hello, and a stranger that never speaks must not hold up the
        # others (the listener cuts it off, as it does on the output connections).
        self.loop = loop = Loop()
        try:
            self.listener = Listener(loop, list(addresses), tls=False, log=lambda text: None,
                                     port_range=port_range)
        except LaunchError:
            loop.close()
            raise
        usable = [a for a in addresses if self.listener.port_of(a) is not None]
        if not usable:
            self.listener.close()
            loop.close()
            raise LaunchError(f"cannot listen for the agents on {', '.join(addresses[:4])}, "
                              f"this machine's address(es) towards the hosts")
        self.dial = ",".join(f"{shown or a}:{self.listener.port_of(a)}" for a in usable)
        self.done: Dict[str, DialedConnection] = {}
        self.greeting: Dict[str, _Greeting] = {}
        self.procs: Dict[str, StartingProcess] = {}
        self.closed = False
        for name, token in tokens.items():
            self.listener.expect(token, bind(self._presented, name))

    def _presented(self, name: str, sock: socket.socket, rest: bytes, about: str) -> None:
        if rest:              # an agent says nothing before it has the bootstrap
            sock.close()
            return
        timeline.mark("dialled back", name)
        try:
            magic = bytes.fromhex(about)
        except ValueError:
            magic = b""
        g = self.greeting[name] = _Greeting(name, sock, magic)
        self.loop.add_reader(sock.fileno(), lambda: self._ready(g))
        self._ready(g)

    def _ready(self, g: _Greeting) -> None:
        fd = g.sock.fileno()
        try:
            hello = g.on_ready()
        except (OSError, link.LinkError):
            del self.greeting[g.name]      # broke off
            self.loop.forget(fd)
            g.sock.close()
            return
        if hello is None:     # the bootstrap goes as the agent takes it
            if g.out:
                self.loop.add_writer(fd, lambda: self._ready(g))
            else:
                self.loop.remove_writer(fd)
            return
        self.loop.forget(fd)
        del self.greeting[g.name]
        self.done[g.name] = DialedConnection(g.name, g.sock, hello, self.procs[g.name])

    def begin(self, start: Callable[[str, Dict[str, StartingProcess]], None]) -> None:
        """Start the agents (see :func:`greet`); on failure nothing is left."""
        try:
            start(self.dial, self.procs)
        except BaseException:
            self.abandon()
            raise

    def finish(self, wait: Callable[[Loop, Dict[str, DialedConnection],
                                     Dict[str, StartingProcess]], None]
               ) -> Dict[str, DialedConnection]:
        """Greet the agents until ``wait`` returns (see :func:`greet`)."""
        try:
            wait(self.loop, self.done, self.procs)
        except HostsFailed as err:
            if len({id(p) for p in self.procs.values()}) < len(self.procs):
                self.abandon()       # one process for all the hosts (srun's step): all go
            else:
                for name, proc in self.procs.items():
                    if name not in self.done:
                        proc.closing = True
                        proc.end(0)
                self._close()
                err.started = dict(self.done)
            raise
        except BaseException:
            self.abandon()
            raise
        self._close()
        return self.done

    def abandon(self) -> None:
        """Close the agents greeted so far and end every starting process."""
        for conn in self.done.values():
            conn.close(0)
        for proc in set(self.procs.values()):
            proc.closing = True
            proc.end(0)
        self._close()

    def _close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for g in self.greeting.values():
            g.sock.close()
        self.greeting.clear()
        self.listener.close()
        self.loop.close()


class _Greeting:
    """An agent that presented its node's token: greeted (:class:`~..bootstrap.Handshake`),
    what it is sent going as it takes it, and its ``HELLO`` awaited."""

    def __init__(self, name: str, sock: socket.socket, magic: bytes) -> None:
        self.name = name
        self.sock = sock
        self.handshake = bootstrap.Handshake(name=name, magic=magic)
        self.out: List[memoryview] = []                     # left to send, in pieces
        self._queue()

    def _queue(self) -> None:
        """Queue what the handshake has to send (the package is one shared object,
        sent from as it is, never copied per agent) and send what the socket takes."""
        self.out.extend(memoryview(part) for part in self.handshake.take_parts())
        while self.out:
            head = self.out[0]
            try:
                n = self.sock.send(head)
            except (BlockingIOError, InterruptedError):
                return
            if n < len(head):
                self.out[0] = head[n:]
                return
            del self.out[0]

    def on_ready(self) -> Optional[Dict[str, Any]]:
        """Send and read what can be; the agent's greeting once it is complete."""
        self._queue()
        try:
            data = self.sock.recv(1 << 16)
        except (BlockingIOError, InterruptedError):
            return None
        if not data:
            raise LaunchError(f"the agent on {self.name} ended before it said hello")
        try:
            greeted = self.handshake.feed(data)
        except link.LinkError as err:
            raise LaunchError(f"the agent on {self.name}: {err}") from None
        self._queue()         # the package, if the agent asked for it
        if greeted is None:
            return None
        hello, rest = greeted
        if rest:      # the agent says nothing more until it has its job
            raise LaunchError(f"the agent on {self.name} sent frames before its job")
        self.sock.setblocking(True)
        return hello


def names_node(text: str, name: str) -> bool:
    """Whether ``text`` names the node ``name`` as a whole word (``h3``, or ``h3``
    with its domain, ``h3.cluster``; never ``h31`` nor ``xh3``)."""
    import re
    return re.search(rf"(?<![\w.-]){re.escape(name)}(?![\w-])", text) is not None
