"""Agents started with ``srun`` inside a Slurm allocation, dialling back over TCP.

One job step starts one agent on every remote node of the plan, as Hydra
starts its proxies::

    srun --nodelist=h1,h2 -N 2 -n 2 --ntasks-per-node=1 --kill-on-bad-exit
         --mpi=none --cpu-bind=none --input=none --overlap [--external-launcher]
         /bin/sh -c '<find a Python, run the dial program>' ...

The step has no stdin, so each agent dials back: the launcher listens on the
addresses it has towards the nodes (found from the nodes' addresses, Slurm's
``NodeAddr`` first, without sending a packet), and each node's agent
presents the token of its node (``SLURMD_NODENAME``), a random secret that
reaches it in the step's environment, never in argv, and is removed from
the environment before anything else runs.  The launcher then sends the
same bootstrap and package as over SSH (:mod:`.bootstrap`) on that
connection, and from there on the link is the SSH mode's: ranks, output,
PMI, signals, heartbeats, the agent's own lifeline.

srun itself runs in a session of its own, so that a Ctrl-C at the terminal
reaches only mslaunch (srun would print status on one SIGINT and kill its
tasks at once on two), and its signal handling is never used: signals,
grace and exit codes travel over the link.  When the job ends, the agents
exit and the step ends with them; a step still there a moment later is
ended with SIGTERM, then SIGKILL.
"""

from __future__ import annotations

import os
import socket
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from ..errors import LaunchError, UsageError, one_line
from ..machine.loop import Loop, wait_fd
from ..machine.spawn import signal_name
from . import bootstrap, link, timeline

#: Seconds for every agent to dial back once srun runs.
AGENT_TIMEOUT = 60.0

#: The dial program: drop the step's own variables (the ranks' identity is
#: mslaunch's, not the agent's task's), connect to the launcher, present this
#: node's token, make the connection stdin and stdout, then read the bootstrap
#: as over SSH.  TCP_NODELAY (6, 1): the agent's hello follows the bootstrap's
#: answer at once, and would otherwise wait for the launcher's delayed ACK.  Single quotes only, for the ``sh -c`` double quotes around it.
_DIAL = ("import io,os,socket;e=os.environ;"
         "[e.pop(k) for k in list(e) if k.startswith(('SLURM_STEP','SLURM_PROCID',"
         "'SLURM_LOCALID','SLURM_NODEID','SLURM_TASK','SLURM_CPU_BIND','SLURM_GTIDS',"
         "'SLURM_NTASKS','SLURM_NPROCS','SLURM_SRUN','SLURM_LAUNCH','SLURM_DISTRIBUTION',"
         "'SLURM_UMASK','SLURM_PRIO'))];"
         "t=dict(x.split('=',1) for x in e.pop('MSLAUNCH_DIAL_TOKENS').split())"
         ".get(e.get('SLURMD_NODENAME',''));"
         "a,p=e.pop('MSLAUNCH_DIAL').rsplit(':',1);"
         "t or exit('mslaunch: this node is not one the launcher started an agent for');"
         "s=socket.create_connection((a,int(p)),30);s.settimeout(None);s.setsockopt(6,1,1);"
         "s.sendall(('mslaunch-dial '+t+chr(10)).encode());"
         "os.dup2(s.fileno(),0);os.dup2(s.fileno(),1);s.close();"
         "b=io.BufferedReader(io.FileIO(0,closefd=False),1);"
         "exec(b.read(int(b.readline())))")


def in_allocation(environ: Mapping[str, str]) -> bool:
    return bool(environ.get("SLURM_JOB_ID")) and bool(
        environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST"))


def choose(launcher: str, environ: Mapping[str, str]) -> str:
    """"ssh", "slurm" or "local" for ``--launcher`` (auto: srun inside an allocation).

    The one place where the job's starter is chosen (see
    :func:`.starter.starter_for`); it raises UsageError for ``slurm`` outside
    an allocation."""
    if launcher == "auto":
        return "slurm" if in_allocation(environ) else "ssh"
    if launcher == "slurm" and not in_allocation(environ):
        raise UsageError("--launcher slurm: not inside a Slurm allocation (no SLURM_JOB_ID "
                         "and node list); run mslaunch within salloc or sbatch")
    return launcher


def _allocation_nodes(environ: Mapping[str, str]) -> List[str]:
    from ..hosts.allocation import expand_nodelist
    text = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST") or ""
    return expand_nodelist(text)


def _start(argv: Sequence[str]) -> Any:
    """A Slurm client started (its stdout piped), for :func:`_output`."""
    import subprocess
    try:
        return subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL)
    except OSError as err:
        raise LaunchError(f"{argv[0]}: {err}") from None


def _output(p: Any, timeout: float = 30) -> str:
    """What a client of :func:`_start` printed, "" if it failed; it is reaped."""
    import subprocess
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        raise LaunchError(f"{p.args[0]}: no answer within {timeout:g} s") from None
    return out.decode("utf-8", "replace") if p.returncode == 0 else ""


def _run(argv: Sequence[str], timeout: float = 30) -> str:
    return _output(_start(argv), timeout)


def _node_addresses(text: str) -> Dict[str, str]:
    """``NodeName`` to ``NodeAddr`` in what ``scontrol -o show node`` printed."""
    found = {}
    for line in text.splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        if fields.get("NodeName") and fields.get("NodeAddr"):
            found[fields["NodeName"]] = fields["NodeAddr"]
    return found


class _Lookups:
    """What the step needs from Slurm's clients -- srun's version, the
    allocation's node addresses -- asked side by side as soon as the starter
    is made ready, while mslaunch still plans the job."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST") or ""
        self._version = _start(["srun", "--version"])
        self._nodes = _start(["scontrol", "-o", "show", "node", nodelist]) if nodelist else None
        self._answers: Dict[str, Any] = {}

    def srun_version(self) -> str:
        if "version" not in self._answers:
            self._answers["version"] = _output(self._version)
        return self._answers["version"]

    def node_addresses(self) -> Dict[str, str]:
        if "nodes" not in self._answers:
            self._answers["nodes"] = _node_addresses(_output(self._nodes)) if self._nodes else {}
        return self._answers["nodes"]


def node_address(name: str, known: Optional[Mapping[str, str]] = None) -> str:
    """A node's address: Slurm's ``NodeAddr`` (from ``known``, else asked), else
    the name's resolution."""
    found = known.get(name) if known is not None else None
    if found is None:
        found = _node_addresses(_run(["scontrol", "-o", "show", "node", name])).get(name)
    if found:
        return found
    try:
        return str(socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)[0][4][0])
    except (OSError, UnicodeError):
        raise LaunchError(f"--launcher slurm: cannot find the address of node {name} "
                          f"(neither scontrol nor the resolver knows it)") from None


def route_address(addr: str) -> str:
    """This machine's address towards node address ``addr``."""
    from ..hosts.local import route_address as route
    mine = route(addr)
    if mine is None:
        raise LaunchError(f"--launcher slurm: no route to node address {addr}")
    return mine


def srun_argv(names: Sequence[str], pythons: Sequence[str], version: str) -> List[str]:
    n = len(names)
    argv = ["srun", f"--nodelist={','.join(names)}", f"--nodes={n}", f"--ntasks={n}",
            "--ntasks-per-node=1", "--kill-on-bad-exit=1", "--mpi=none", "--cpu-bind=none",
            "--input=none", "--overlap", "--job-name=mslaunch-agents"]
    if _version_at_least(version, (23, 11)):
        argv.append("--external-launcher")
    return argv + ["/bin/sh", "-c", bootstrap.interpreter_script(_DIAL), "mslaunch-agent",
                   *pythons]


def _version_at_least(text: str, wanted) -> bool:
    words = text.split()
    parts = words[-1].split(".") if words else []
    try:
        return tuple(int(p) for p in parts[:2]) >= wanted
    except ValueError:
        return False


class _Step:
    """The srun process that runs every agent of the job, and its stderr's tail."""

    def __init__(self, argv: Sequence[str], env: Dict[str, str]) -> None:
        import subprocess
        import threading
        try:
            self.proc = subprocess.Popen(list(argv), env=env, stdin=subprocess.DEVNULL,
                                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        except OSError as err:
            raise LaunchError(f"cannot run srun: {err.strerror}") from None
        self.tail = b""
        self.open = 0
        self.closing = False          # mslaunch itself is ending the step
        self.ended_because = ""
        self.links: List[socket.socket] = []
        self._reader = threading.Thread(target=self._read, daemon=True, name="srun-output")
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.tail = (self.tail + line)[-4096:]
        code = self.proc.wait()
        # srun gone while agents still run (srun killed: its tasks live on,
        # unseen by Slurm's own tools): the job ends as when a node is lost.
        # Cutting a link makes its agent stop its ranks and the launcher
        # report the node.  A link whose agent has closed it (the normal end,
        # after which srun ends) is left alone; one with unread bytes is
        # looked at again.
        how = f"killed by {signal_name(-code)}" if code < 0 else f"status {code}"
        because = f"srun, which ran the agents, ended ({how})"
        if code < 0 and not self.closing:
            # srun itself was killed; its agents may go down with it, and
            # their links' end should then be reported as this.
            self.ended_because = because
        deadline = time.monotonic() + 5.0
        todo = list(self.links)
        while todo and not self.closing and time.monotonic() < deadline:
            time.sleep(0.2)
            for sock in list(todo):
                try:
                    if sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT):
                        continue                     # unread bytes: not known yet
                except BlockingIOError:
                    if self.closing:
                        return
                    self.ended_because = because
                    try:
                        sock.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                except OSError:
                    pass
                todo.remove(sock)

    def last_line(self) -> str:
        """What srun and the agents said last: the last line that is not srun's own
        report of ending the step (which follows the real cause)."""
        lines = self.tail.decode("utf-8", "replace").strip().splitlines()
        useful = [ln for ln in lines if ln.strip() and not ln.startswith(
            ("srun: Force Terminated", "srun: error: Timed out", "slurmstepd: error: ***"))]
        pick = useful or lines
        return one_line(pick[-1], 300) if pick else ""

    def end(self, wait: float) -> None:
        """Wait up to ``wait`` s for the step to end (its agents exited), then end it."""
        import signal
        import subprocess
        try:
            self.proc.wait(max(wait, 0.05))
            return
        except subprocess.TimeoutExpired:
            pass
        for sig, grace in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 5.0)):
            try:
                self.proc.send_signal(sig)
                self.proc.wait(grace)
                return
            except subprocess.TimeoutExpired:
                continue
            except OSError:
                return


class SrunAgentConnection:
    """A running agent that dialled back: the same face as SSH's ``AgentConnection``."""

    def __init__(self, name: str, sock: socket.socket, hello: Dict[str, Any],
                 step: _Step) -> None:
        self.name = name
        self.hello = hello
        self._sock = sock
        self._step = step
        step.open += 1
        step.links.append(sock)
        self.fd = os.dup(sock.fileno())
        os.set_blocking(self.fd, False)
        self._address = sock.getsockname()[0]

    @property
    def stderr_tail(self) -> bytes:
        return self._step.tail

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

    def close(self, wait: float = 1.0) -> None:
        if self._sock.fileno() < 0:
            return
        self._step.open -= 1
        if self._step.open <= 0:
            # The step ends because mslaunch ends it.  Closing only some links
            # (agents the plan does not use) must not hide a killed srun later.
            self._step.closing = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        if self._step.open <= 0:
            self._step.end(wait)


def connect_all(names: Sequence[str], pythons: Sequence[str], *,
                cancelled: Optional[Callable[[], bool]] = None,
                environ: Optional[Mapping[str, str]] = None,
                lookups: Optional[_Lookups] = None) -> Dict[str, SrunAgentConnection]:
    """Start an agent on every node in ``names`` with one srun step; all or none."""
    from .dialback import Listener, new_token
    environ = os.environ if environ is None else environ
    timeline.mark("waiting for Slurm client calls (srun --version, scontrol show node)")
    mine, srun_version = _dial_address(names, environ, lookups)
    timeline.mark("Slurm client calls done")
    # Every agent is greeted at once: each takes a while to unpack the package
    # and say hello, and a stranger that never speaks must not hold up the
    # others (the listener cuts it off, as it does on the output connections).
    loop = Loop()
    listener = Listener(loop, [mine], tls=False, log=lambda text: None)
    port = listener.port_of(mine)
    if port is None:
        loop.close()
        raise LaunchError(f"--launcher slurm: cannot listen on {mine}, this machine's "
                          f"address towards node {names[0]}")
    tokens = {name: new_token() for name in names}
    env = dict(environ)
    env["MSLAUNCH_DIAL"] = f"{mine}:{port}"
    env["MSLAUNCH_DIAL_TOKENS"] = " ".join(f"{n}={t}" for n, t in tokens.items())
    done: Dict[str, SrunAgentConnection] = {}
    greeting: Dict[str, _Greeting] = {}

    def presented(name: str, sock: socket.socket, rest: bytes) -> None:
        if rest:              # an agent says nothing before it has the bootstrap
            sock.close()
            return
        timeline.mark("dialled back", name)
        g = greeting[name] = _Greeting(name, sock)
        loop.add_reader(sock.fileno(), lambda: ready(g))
        ready(g)

    def ready(g: _Greeting) -> None:
        fd = g.sock.fileno()
        try:
            hello = g.on_ready()
        except (OSError, link.LinkError):
            del greeting[g.name]      # broke off
            loop.forget(fd)
            g.sock.close()
            return
        if hello is None:     # the bootstrap goes as the agent takes it
            if g.out:
                loop.add_writer(fd, lambda: ready(g))
            else:
                loop.remove_writer(fd)
            return
        loop.forget(fd)
        del greeting[g.name]
        done[g.name] = SrunAgentConnection(g.name, g.sock, hello, step)

    for name, token in tokens.items():
        listener.expect(token, lambda sock, rest, name=name: presented(name, sock, rest))
    step = _Step(srun_argv(names, pythons, srun_version), env)
    timeline.mark("srun started")
    try:
        _await_agents(loop, step, names, done, cancelled)
    except BaseException:
        for conn in done.values():
            conn.close(0)
        if not done:
            step.end(0)
        raise
    finally:
        for g in greeting.values():
            g.sock.close()
        listener.close()
        loop.close()
    return done


def _dial_address(names: Sequence[str], environ: Mapping[str, str],
                  lookups: Optional[_Lookups] = None) -> Tuple[str, str]:
    """The address the agents dial (this machine's towards the nodes), and srun's
    version; LaunchError for a host outside the allocation."""
    nodes = set(_allocation_nodes(environ))
    stray = [n for n in names if n not in nodes]
    if stray:
        raise LaunchError(f"--launcher slurm: {', '.join(stray[:4])} "
                          f"{'is' if len(stray) == 1 else 'are'} not a node of Slurm job "
                          f"{environ.get('SLURM_JOB_ID')} (its nodes: "
                          f"{one_line(environ.get('SLURM_JOB_NODELIST', ''), 80)}); use "
                          f"--launcher ssh for hosts outside the allocation")
    # srun's version (which options it takes) is asked beside the addresses.
    lookups = lookups or _Lookups(environ)
    try:
        # The address this machine has towards the first node is the one
        # they all dial (the nodes of an allocation share a network).
        mine = route_address(node_address(names[0], lookups.node_addresses()))
    finally:
        srun_version = lookups.srun_version()
    return mine, srun_version


def _await_agents(loop: Loop, step: _Step, names: Sequence[str],
                  done: Dict[str, SrunAgentConnection],
                  cancelled: Optional[Callable[[], bool]]) -> None:
    """Run ``loop`` until every agent of ``names`` is in ``done``; LaunchError when
    stopped, when srun ends first, or at the timeout."""
    deadline = time.monotonic() + AGENT_TIMEOUT
    while len(done) < len(names):
        if cancelled is not None and cancelled():
            raise LaunchError("stopped while starting the agents with srun", 130)
        if step.proc.poll() is not None:
            raise LaunchError(f"srun ended (status {step.proc.returncode}) before every "
                              f"agent started: {step.last_line() or 'no message'}")
        if time.monotonic() > deadline:
            missing = [n for n in names if n not in done]
            raise LaunchError(f"the agents on {', '.join(missing[:6])} did not dial back "
                              f"within {AGENT_TIMEOUT:g} s (srun said: "
                              f"{step.last_line() or 'nothing'})")
        loop.run_once(0.1)


class SrunStarter:
    """The :class:`~.starter.Starter` that starts agents with one srun step of the
    Slurm allocation ``environ`` is in."""

    plain_link = True         # the agents dial back in plain TCP

    def __init__(self, pythons: Sequence[str], environ: Optional[Mapping[str, str]] = None) -> None:
        self.pythons = list(pythons)
        self.environ = environ
        self._lookups: Optional[_Lookups] = None

    def prepare(self) -> None:
        """The agent's package, in the background (no paramiko, and plain output),
        and Slurm's answers the step needs."""
        bootstrap.prepare_in_background(credentials=False)
        try:
            self._lookups = _Lookups(os.environ if self.environ is None else self.environ)
        except LaunchError:         # no srun or scontrol: start() says so
            pass

    def start(self, names: Sequence[str], *, cancelled: Optional[Callable[[], bool]] = None,
              say: Optional[Callable[[str], None]] = None) -> Dict[str, SrunAgentConnection]:
        if say is not None:
            say(f"mslaunch: starting agents on {len(names)} remote host(s) with srun")
        return connect_all(names, self.pythons, cancelled=cancelled, environ=self.environ,
                           lookups=self._lookups)


class _Greeting:
    """An agent that presented its node's token: greeted (:class:`.bootstrap.Handshake`),
    what it is sent going as it takes it, and its ``HELLO`` awaited."""

    def __init__(self, name: str, sock: socket.socket) -> None:
        self.name = name
        self.sock = sock
        self.handshake = bootstrap.Handshake(name=name)
        self.out: Optional[memoryview] = memoryview(self.handshake.take())  # left to send

    def on_ready(self) -> Optional[Dict[str, Any]]:
        """Send and read what can be; the agent's greeting once it is complete."""
        if self.out is not None:
            try:
                self.out = self.out[self.sock.send(self.out):] or None
            except (BlockingIOError, InterruptedError):
                pass
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
        more = self.handshake.take()
        if more:              # the package, which the agent asked for
            self.out = memoryview(bytes(self.out or b"") + more)
            try:
                self.out = self.out[self.sock.send(self.out):] or None
            except (BlockingIOError, InterruptedError):
                pass
        if greeted is None:
            return None
        hello, rest = greeted
        if rest:      # the agent says nothing more until it has its job
            raise LaunchError(f"the agent on {self.name} sent frames before its job")
        self.sock.setblocking(True)
        return hello
