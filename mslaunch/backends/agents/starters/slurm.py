"""Agents started with ``srun`` inside a Slurm allocation, dialling back over TCP.

One job step starts one agent on every remote node of the plan, as Hydra
starts its proxies::

    srun --nodelist=h1,h2 -N 2 -n 2 --ntasks-per-node=1 --no-kill
         --kill-on-bad-exit=0 --wait=0 --mpi=none --cpu-bind=none --input=none --overlap [--external-launcher]
         /bin/sh -c '<find a Python, run the dial program>' ...

The step has no stdin, so each agent dials back.  The step starts in
:meth:`SrunStarter.prepare`, as soon as the plan names its nodes and before
the launcher builds its supervisor: the launcher listens on one port of
every address (one dual-stack socket where it has IPv6), the agents dial
the address srun's request came from (``SLURM_LAUNCH_NODE_IPADDR``), and
srun's version comes from the cache (:func:`cached_srun_version`), so no
Slurm client runs first.  Inside a launch agent's wrapper, which need not
pass the environment on, the launcher listens instead on the addresses it
has towards the nodes (Slurm's ``NodeAddr`` first, without sending a
packet), asked beside the planning, and the dial-back variables are set
again by ``env`` on the command line, as over an rsh agent.  Each node's
agent presents the token of its node (``SLURMD_NODENAME``, else its short
host name), a random secret that reaches it in the step's environment,
never in argv, and is removed from the environment before anything else
runs.  The launcher then sends the same bootstrap and package as over SSH
(:mod:`mslaunch.backends.agents.bootstrap`) on that connection, and from there on the link is the
SSH mode's: ranks, output, PMI, signals, heartbeats, the agent's own
lifeline.

srun itself runs in a session of its own, so that a Ctrl-C at the terminal
reaches only mslaunch (srun would print status on one SIGINT and kill its
tasks at once on two), and its signal handling is never used: signals,
grace and exit codes travel over the link.  When the job ends, the agents
exit and the step ends with them; a step still there a moment later is
ended with SIGTERM, then SIGKILL.

The agents' fates are mslaunch's to decide, not the step's: with
``--no-kill`` (and ``--kill-on-bad-exit=0 --wait=0``, where a site's
``KillOnBadExit`` or ``WaitTime`` would end the step once a task ended) an
agent that ends (one whose host's link was down for a
while gives up on the launcher and exits 1) does not end the others, and a
node Slurm finds dead has only its own task ended, where the step's other
tasks would have been killed (slurmctld ends a step on a failed node
unless the step has ``no_kill``).  A spare node lost while a job runs is
then left out, and the job goes on, as over SSH; the allocation itself
must be made with ``--no-kill`` (``salloc -k``) for Slurm to keep the job
when a node fails.
"""

from __future__ import annotations

import os
import re
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

    from ....core.spec import SSHSpec

from ....core.errors import HostsFailed, LaunchError, one_line
from ....hosts.allocations.slurm import check_nodes
from ....machine.loop import Loop
from ....machine.osfiles import unlink_quietly
from .. import bootstrap
from ....machine import timeline
from .dialin import DialedConnection, Greeter, StartingProcess, dial_program, greet, names_node

#: Seconds for every agent to dial back once srun runs.
AGENT_TIMEOUT = 60.0

#: The dial program: drop the step's own variables (the ranks' identity is
#: mslaunch's, not the agent's task's), connect to the launcher, present this
#: node's token, make the connection stdin and stdout, then read the bootstrap
#: as over SSH (see :func:`.dialin.dial_program`).
#: A ``*`` in ``MSLAUNCH_DIAL`` is the launcher's address as the node's slurmd
#: saw srun's request come from (``SLURM_LAUNCH_NODE_IPADDR``): the agents of
#: a step started before any address lookup dial that (see :class:`SrunStarter`).
_DIAL = dial_program(
    "L=e.get('SLURM_LAUNCH_NODE_IPADDR','');d=e['MSLAUNCH_DIAL'];"
    "'*' in d and not L and sys.exit('mslaunch: srun gave no SLURM_LAUNCH_NODE_IPADDR to dial');"
    "e['MSLAUNCH_DIAL']=d.replace('*',L);"
    "[e.pop(k) for k in list(e) if k.startswith(('SLURM_STEP','SLURM_PROCID',"
    "'SLURM_LOCALID','SLURM_NODEID','SLURM_TASK','SLURM_CPU_BIND','SLURM_GTIDS',"
    "'SLURM_NTASKS','SLURM_NPROCS','SLURM_SRUN','SLURM_LAUNCH','SLURM_DISTRIBUTION',"
    "'SLURM_UMASK','SLURM_PRIO'))];",
    "dict(x.split('=',1) for x in e.pop('MSLAUNCH_DIAL_TOKENS').split())"
    ".get(e.get('SLURMD_NODENAME') or socket.gethostname().split('.')[0])")


def _start(argv: Sequence[str]) -> Any:
    """A Slurm client started (its stdout piped), for :func:`_output`."""
    import subprocess

    from ....machine.cgroups import starting
    try:
        with starting():
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
    import socket
    try:
        return str(socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)[0][4][0])
    except (OSError, UnicodeError):
        raise LaunchError(f"--launcher slurm: cannot find the address of node {name} "
                          f"(neither scontrol nor the resolver knows it)") from None


def route_address(addr: str) -> str:
    """This machine's address towards node address ``addr``."""
    from ....hosts.local import route_address as route
    mine = route(addr)
    if mine is None:
        raise LaunchError(f"--launcher slurm: no route to node address {addr}")
    return mine


def srun_argv(names: Sequence[str], pythons: Sequence[str], version: str,
              wrapper: Sequence[str] = (), dial_env: Sequence[str] = ()) -> List[str]:
    """The srun step of the agents; inside a ``wrapper`` (a container's runner,
    which need not pass its environment on) the dial-back variables ``dial_env``
    are set again by ``env``."""
    n = len(names)
    argv = ["srun", f"--nodelist={','.join(names)}", f"--nodes={n}", f"--ntasks={n}",
            "--ntasks-per-node=1", "--no-kill", "--kill-on-bad-exit=0", "--wait=0",
            "--mpi=none", "--cpu-bind=none", "--input=none", "--overlap",
            "--job-name=mslaunch-agents"]
    if _version_at_least(version, (23, 11)):
        argv.append("--external-launcher")
    inside = [*wrapper, "env", *dial_env] if wrapper else []
    return argv + inside + bootstrap.agent_argv(_DIAL, pythons)


def _version_at_least(text: str, wanted) -> bool:
    words = text.split()
    parts = words[-1].split(".") if words else []
    try:
        return tuple(int(p) for p in parts[:2]) >= wanted
    except ValueError:
        return False


class _Step(StartingProcess):
    """The srun process that runs every agent of the job, and its stderr's tail."""

    ran = "agents"
    several = True

    def __init__(self, argv: Sequence[str], env: Dict[str, str]) -> None:
        super().__init__(argv, env, "srun")

    def last_line(self, skip: Sequence[str] = (), wait: float = 0.0) -> str:
        """What srun and the agents said last: the last line that is not srun's own
        report of ending the step (which follows the real cause)."""
        return super().last_line(("srun: Force Terminated", "srun: error: Timed out",
                                  "slurmstepd: error: ***", *skip), wait)


#: The launcher's end of an srun agent's link.
SrunAgentConnection = DialedConnection


def connect_all(names: Sequence[str], pythons: Sequence[str], *,
                cancelled: Optional[Callable[[], bool]] = None,
                environ: Optional[Mapping[str, str]] = None,
                lookups: Optional[_Lookups] = None,
                port_range: Optional[Tuple[int, int]] = None,
                wrapper: Sequence[str] = ()) -> Dict[str, SrunAgentConnection]:
    """Start an agent on every node in ``names`` with one srun step; all or none."""
    from ....wire.dialback import new_token
    environ = os.environ if environ is None else environ
    timeline.mark("waiting for Slurm client calls (srun --version, scontrol show node)")
    mine, srun_version = _dial_address(names, environ, lookups)
    timeline.mark("Slurm client calls done")
    tokens = {name: new_token() for name in names}
    start = _step_starter(names, pythons, srun_version, wrapper, tokens, environ)
    return greet([mine], tokens, start, _waiter(names, cancelled), port_range)


def _step_starter(names: Sequence[str], pythons: Sequence[str], srun_version: str,
                  wrapper: Sequence[str], tokens: Mapping[str, str],
                  environ: Mapping[str, str]) -> Callable[[str, Dict[str, Any]], None]:
    """What starts the step, given the ``MSLAUNCH_DIAL`` value (see :func:`.dialin.greet`)."""
    def start(dial: str, procs: Dict[str, StartingProcess]) -> None:
        env = dict(environ)
        env["MSLAUNCH_DIAL"] = dial
        env["MSLAUNCH_DIAL_TOKENS"] = " ".join(f"{n}={t}" for n, t in tokens.items())
        dial_env = [f"{k}={env[k]}" for k in ("MSLAUNCH_DIAL", "MSLAUNCH_DIAL_TOKENS")]
        step = _Step(srun_argv(names, pythons, srun_version, wrapper, dial_env), env)
        procs.update((name, step) for name in names)
        timeline.mark("srun started")
    return start


def _waiter(names: Sequence[str], cancelled: Optional[Callable[[], bool]]):
    """What waits for the agents of ``names`` (see :func:`.dialin.greet`)."""
    def wait(loop: Loop, done: Dict[str, DialedConnection],
             procs: Dict[str, StartingProcess]) -> None:
        _await_agents(loop, procs[names[0]], names, done, cancelled)  # type: ignore[arg-type]
    return wait


def _dial_address(names: Sequence[str], environ: Mapping[str, str],
                  lookups: Optional[_Lookups] = None) -> Tuple[str, str]:
    """The address the agents dial (this machine's towards the nodes), and srun's
    version; LaunchError for a host outside the allocation."""
    check_nodes(names, environ, "slurm")
    # srun's version (which options it takes) is asked beside the addresses.
    lookups = lookups or _Lookups(environ)
    try:
        # The address this machine has towards the first node is the one
        # they all dial (the nodes of an allocation share a network).
        mine = route_address(node_address(names[0], lookups.node_addresses()))
    finally:
        srun_version = lookups.srun_version()
    return mine, srun_version


def cached_srun_version(environ: Mapping[str, str]) -> str:
    """What ``srun --version`` prints, asked once per installation of srun (its
    path, inode, size and time in the cache file), not before every job."""
    from ....machine.spawn import exec_path
    path = exec_path("srun", environ)
    try:
        st = os.stat(path) if path else None
    except OSError:
        st = None
    if path is None or st is None:
        raise LaunchError("cannot run srun: it is not on PATH")
    key = f"{os.path.realpath(path)} {st.st_ino} {st.st_size} {st.st_mtime_ns}\n"
    cache = _version_cache()
    try:
        with open(cache, encoding="utf-8", errors="replace") as f:
            lines = f.read(4096).split("\n")
        if lines[0] + "\n" == key and len(lines) > 1 and lines[1].strip():
            return lines[1].strip()
    except OSError:
        pass
    version = _run([path, "--version"]).strip()
    if version:
        from ....machine.topology import save_whole
        save_whole(cache, (key + version + "\n").encode("utf-8"))
    return version


def _version_cache() -> str:
    from ....machine.topology import cache_path
    return cache_path("srun-version")


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
            said = step.last_line(wait=0.5) or "no message"
            refused = [line for line in step.tail.decode("utf-8", "replace").splitlines()
                       if "external-launcher" in line]
            if refused:
                # The cached version is not this srun's (a wrapper script in front
                # of another Slurm): asked again next time.
                unlink_quietly(_version_cache())
                said = (f"{one_line(refused[-1], 200)} (srun's version is asked again "
                        f"on the next run)")
            message = (f"srun ended (status {step.proc.returncode}) before every agent "
                       f"started: {said}")
            said_text = step.tail.decode("utf-8", "replace")
            failed = [n for n in names if n not in done and names_node(said_text, n)]
            if failed:          # srun names the nodes it could not start a task on
                raise HostsFailed(message, {name: said for name in failed},
                                  unreachable=failed)
            raise LaunchError(message)
        ended = _tasks_ended(step.tail.decode("utf-8", "replace"),
                             [n for n in names if n not in done])
        if ended:
            # With --no-kill the step goes on without a node whose agent ended
            # before it dialled back (no Python, no route back): srun says so.
            raise HostsFailed(f"the agent ended on {', '.join(sorted(ended)[:6])} before it "
                              f"dialled back", ended)
        if time.monotonic() > deadline:
            missing = [n for n in names if n not in done]
            raise LaunchError(f"the agents on {', '.join(missing[:6])} did not dial back "
                              f"within {AGENT_TIMEOUT:g} s (srun said: "
                              f"{step.last_line() or 'nothing'})")
        loop.run_once(0.1)
        timeline.tick()


#: srun's line for tasks that ended: ``srun: error: h[2-3]: tasks 1-2: Exited with
#: exit code 127`` (22.05 on; a node list in Slurm's bracket notation).
_ENDED = re.compile(r"^srun: error: (\S+): tasks? [\d,-]+: (.+)$", re.M)


def _tasks_ended(text: str, names: Sequence[str]) -> Dict[str, str]:
    """The nodes of ``names`` whose task srun's output ``text`` says ended, and how."""
    from ....hosts.allocations.slurm import expand_nodelist
    found: Dict[str, str] = {}
    for match in _ENDED.finditer(text):
        try:
            nodes = expand_nodelist(match.group(1))
        except LaunchError:
            continue
        for name in set(nodes) & set(names):
            found[name] = f"its task: {one_line(match.group(2), 120)}"
    return found


def make(spec: SSHSpec, environ: Mapping[str, str], pythons: Sequence[str],
         port_range: Optional[Tuple[int, int]]) -> SrunStarter:
    """The agents of a job inside a Slurm allocation, started by one srun step."""
    return SrunStarter(pythons, environ, port_range, spec.agent_wrapper)


class SrunStarter:
    """The :class:`~.starter.Starter` that starts agents with one srun step of the
    Slurm allocation ``environ`` is in."""

    plain_link = True         # the agents dial back in plain TCP
    first_phase = "waiting for srun to start the agent"
    spares_later = False      # (one step starts them all; a second beside it is not tried)

    def __init__(self, pythons: Sequence[str], environ: Optional[Mapping[str, str]] = None,
                 port_range: Optional[Tuple[int, int]] = None,
                 wrapper: Sequence[str] = ()) -> None:
        self.pythons = list(pythons)
        self.wrapper = tuple(wrapper)
        self.port_range = port_range
        self.environ = environ
        self._lookups: Optional[_Lookups] = None
        self._early: Optional[Tuple[List[str], Greeter]] = None
        self._early_error: Optional[LaunchError] = None

    def prepare(self, names: Sequence[str] = (), job: str = "") -> None:
        """The agent's package, in the background (no paramiko, and plain output);
        and, for the hosts ``names``, the step itself.

        The step starts here, while mslaunch still builds its supervisor: its
        agents dial ``SLURM_LAUNCH_NODE_IPADDR`` (a listener on every address;
        their tokens keep strangers out) and their connections wait in the
        kernel until :meth:`start` greets them.  srun's version comes from the
        cache, so no Slurm client runs first.  Inside a launch agent's wrapper,
        which need not pass Slurm's variables on, the agents are told the
        address found from ``scontrol`` instead, asked here beside the planning."""
        environ = os.environ if self.environ is None else self.environ
        if names and not self.wrapper:
            try:
                self._early = (list(names), _start_early(names, self.pythons, environ,
                                                        self.port_range))
            except LaunchError as err:        # start() says so, where errors are said
                self._early_error = err
            # The package is wanted once the first agent dials, some 50 ms on.
            bootstrap.prepare_in_background(credentials=False, job=job, compiled=True)
            return
        bootstrap.prepare_in_background(credentials=False, job=job, compiled=True)
        try:
            self._lookups = _Lookups(environ)
        except LaunchError:         # no srun or scontrol: start() says so
            pass

    @property
    def begun(self) -> bool:
        return self._early is not None

    def start(self, names: Sequence[str], *, cancelled: Optional[Callable[[], bool]] = None,
              say: Optional[Callable[[str], None]] = None) -> Dict[str, SrunAgentConnection]:
        if say is not None:
            say(f"mslaunch: starting agents on {len(names)} remote host(s) with srun")
        early, self._early = self._early, None
        if early is not None:
            if early[0] == list(names):
                return early[1].finish(_waiter(names, cancelled))
            early[1].abandon()
        if self._early_error is not None:
            raise self._early_error
        return connect_all(names, self.pythons, cancelled=cancelled, environ=self.environ,
                           lookups=self._lookups, port_range=self.port_range,
                           wrapper=self.wrapper)

    def close(self) -> None:
        """End a step :meth:`prepare` started that :meth:`start` did not take."""
        early, self._early = self._early, None
        if early is not None:
            early[1].abandon()


#: Where the early step's agents are listened for: every address of both
#: families on one port where this machine has IPv6 (Slurm may give either),
#: else every IPv4 one.  One port only: an agent must never try a port this
#: process does not hold.
_EVERYWHERE = (("::",), ("0.0.0.0",))


def _start_early(names: Sequence[str], pythons: Sequence[str], environ: Mapping[str, str],
                 port_range: Optional[Tuple[int, int]]) -> Greeter:
    """The step of :meth:`SrunStarter.prepare`, started; its greeter."""
    from ....wire.dialback import new_token
    check_nodes(names, environ, "slurm")
    version = cached_srun_version(environ)
    tokens = {name: new_token() for name in names}
    try:
        greeter = Greeter(_EVERYWHERE[0], tokens, port_range, shown="*")
    except LaunchError:               # no IPv6 here
        greeter = Greeter(_EVERYWHERE[1], tokens, port_range, shown="*")
    greeter.begin(_step_starter(names, pythons, version, (), tokens, environ))
    return greeter
