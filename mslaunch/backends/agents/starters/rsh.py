"""Agents started by an rsh agent: any command run as ``CMD [ARGS] HOST 'command'``.

This is Open MPI's ``plm_rsh_agent`` / ``plm_rsh_args`` and Hydra's
``-launcher ssh|rsh -launcher-exec CMD``: the OpenSSH client itself (with
everything ``ssh_config`` offers: Kerberos, certificates, ``ControlMaster``,
hardware keys), ``rsh``, Grid Engine's ``qrsh -inherit``, LSF's ``blaunch``,
the MPI Operator's ``kubexec.sh`` (``kubectl exec POD -- /bin/sh -c "$*"``).
The last word is one command line, which the remote side runs through a
shell; it needs nothing on the host but ``/bin/sh`` and Python 3.8.

Such a command need not forward stdin, so the agent dials back, as under
srun (:mod:`.dialin`): the command line carries the launcher's addresses;
the launcher sends the bootstrap on the connection a one-time token opens.
A host the launcher cannot resolve (a pod's name, an alias of
``ssh_config``) is given every address of this machine, tried in turn.

The token never goes into a command line, which every user of either host
may read (``ps``) while the agent starts, and could then dial back first in
the agent's place.  It goes both ways that only the job's user can see: in
the command's environment (``qrsh -V`` and ``blaunch`` carry it to the
host) and as the first line of its stdin (``ssh`` and ``rsh`` forward it);
the agent takes the one that arrived.  Only ``kubectl exec`` without
``-i`` (the MPI Operator v1's ``kubexec.sh``) carries neither: an rsh agent
named ``kube*`` (or ``oc``) gets the token in the command line, as before,
where each pod is one tenant's.

Each host has its own command process, in a session of its own.  When it
ends before its agent dialled back, or the agent does not dial back in
time, the start fails with one line naming the host and the command, and
every command started is ended.  When it ends under a running agent (the
SSH session or the ``kubectl exec`` dropped), the link is cut: the agent
stops its ranks and the job ends with the host lost, as Open MPI's daemon
is lost with its ssh session.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import socket
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple

    from ....machine.loop import Loop
    from ....core.spec import SSHSpec

from ....core.errors import HostsFailed, LaunchError, UsageError, one_line
from .. import bootstrap
from ....machine import timeline
from .dialin import DialedConnection, StartingProcess, dial_program, greet

#: Open MPI's default ``plm_rsh_agent``: the first found on PATH is used.
DEFAULT_AGENT = "ssh : rsh"
#: Seconds the other hosts are given to fail too, once one host's start failed
#: (at least; twice as long as that start took, if longer), each from its own start.
FAILURE_SETTLE = 2.0

#: The token: from the environment if the command carried it there, else the
#: first line of stdin (EOF: none came, and the program says so).
_DIAL = dial_program("", "e.pop('MSLAUNCH_DIAL_TOKEN','') or "
                     "io.FileIO(0,closefd=False).readline().strip().decode('latin-1')",
                     "no token of the launcher came to this host, neither in the "
                     "environment nor on stdin (the rsh agent passes on neither)")
#: The token's variable, in the rsh command's own environment.
TOKEN_VARIABLE = "MSLAUNCH_DIAL_TOKEN"


def agent_words(agent: str, args: str, environ: Mapping[str, str],
                setting: str = "plm_rsh_agent") -> List[str]:
    """The command (and arguments) that reaches a host: the first alternative of
    ``agent`` (Open MPI's ``A : B`` list) found on ``PATH``, then ``args``."""
    tried = []
    for alternative in agent.split(":"):
        try:
            words = shlex.split(alternative)
        except ValueError as err:
            raise UsageError(f"{setting} {one_line(agent, 60)}: {err}") from None
        if not words:
            continue
        tried.append(words[0])
        found = shutil.which(words[0], path=environ.get("PATH", os.defpath))
        if found is not None:
            try:
                return words + shlex.split(args)
            except ValueError as err:
                raise UsageError(f"plm_rsh_args {one_line(args, 60)}: {err}") from None
    if not tried:
        raise UsageError(f"{setting}: empty command")
    missing = tried[0] if len(tried) == 1 else "neither " + " nor ".join(tried)
    shown = f"{setting} '{one_line(agent, 60)}'" if setting == "plm_rsh_agent" else setting
    raise LaunchError(f"{shown}: {missing} is on PATH; no remote host can be reached"
                      if len(tried) > 1 else
                      f"{shown}: {missing} is not on PATH; no remote host can be reached")


def engine_agent(environ: Mapping[str, str]) -> Tuple[str, str]:
    """The rsh agent of the Grid Engine or LSF job ``environ`` is in, as Open MPI
    and Hydra use them, and how to name it in messages."""
    from ....hosts.allocations import in_grid_engine
    if in_grid_engine(environ):
        # Open MPI: $SGE_ROOT/bin/$ARC/qrsh, else qrsh on PATH.
        qrsh = os.path.join(environ["SGE_ROOT"], "bin", environ["ARC"], "qrsh")
        if not os.access(qrsh, os.X_OK):
            qrsh = "qrsh"
        return f"{shlex.quote(qrsh)} -inherit -nostdin -V", "inside a Grid Engine job"
    blaunch = os.path.join(environ.get("LSF_BINDIR", ""), "blaunch")
    if not (environ.get("LSF_BINDIR") and os.access(blaunch, os.X_OK)):
        blaunch = "blaunch"
    return shlex.quote(blaunch), "inside an LSF job"


def remote_command(pythons: Sequence[str], dial: str, token: str = "",
                   wrapper: Sequence[str] = ()) -> str:
    """The command line an agent's host runs: the interpreter search of
    :mod:`mslaunch.backends.agents.bootstrap`, running the dial program with ``dial``
    (set inside ``wrapper``, which need not pass its environment on), and
    ``token`` only for an rsh agent that carries it no other way."""
    words = bootstrap.agent_argv(_DIAL, pythons)
    return " ".join(["exec", *(bootstrap.shell_quote(w) for w in wrapper), "env",
                     f"MSLAUNCH_DIAL={dial}",
                     *([f"{TOKEN_VARIABLE}={token}"] if token else []),
                     *(bootstrap.shell_quote(w) for w in words)])


def token_in_command(words: Sequence[str]) -> bool:
    """Whether the rsh agent ``words`` passes on neither its environment nor its
    stdin (``kubectl exec`` without ``-i``: the MPI Operator v1's ``kubexec.sh``;
    OpenShift's ``oc exec``), so that the token must go in the command line."""
    name = os.path.basename(words[0]) if words else ""
    return name.startswith("kube") or name == "oc"


def dial_addresses(names: Sequence[str]) -> List[str]:
    """The addresses the agents on ``names`` are told to dial: this machine's
    towards them, or (for a name this machine cannot resolve) all of its own,
    loopback last."""
    from ....hosts.local import local_ipv4_addresses, route_address
    found: List[str] = []
    for name in names:
        try:
            addr = str(socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)[0][4][0])
        except (OSError, UnicodeError):
            break
        mine = route_address(addr)
        if mine is None or mine.startswith("127.") or mine == "::1":
            break
        if mine not in found:
            found.append(mine)
    else:
        return found
    everything = sorted(local_ipv4_addresses(), key=lambda a: (a.startswith("127."), a))
    return found + [a for a in everything if a not in found]


def connect_all(names: Sequence[str], words: Sequence[str], pythons: Sequence[str], *,
                timeout: float, cancelled: Optional[Callable[[], bool]] = None,
                port_range: Optional[Tuple[int, int]] = None,
                wrapper: Sequence[str] = (), concurrent: int = 128) -> Dict[str, DialedConnection]:
    """Start an agent on every host in ``names`` with ``words + [host, command]``;
    all of them or none (LaunchError).

    At most ``concurrent`` starts are under way at once (Open MPI's
    ``plm_rsh_num_concurrent``): a host's start ends when its agent dials back,
    and the next host's begins.  Each host has ``timeout`` seconds from its own
    start: a few hundred rsh clients, logins and Python starts at once can
    outlast one timeout for all on a launcher that cannot run them together."""
    from ....wire.dialback import new_token
    tokens = {name: new_token() for name in names}
    in_command = token_in_command(words)
    shown = " ".join(words)
    queue = list(names)
    began: Dict[str, float] = {}
    dial: List[str] = []

    def launch(procs: Dict[str, StartingProcess], room: int) -> None:
        while queue and room > 0:
            name = queue.pop(0)
            token = tokens[name]
            argv = list(words) + [name, remote_command(
                pythons, dial[0], token if in_command else "", wrapper)]
            # (the agent takes the token from its environment or its stdin,
            # whichever the rsh agent carried: see the module docstring)
            procs[name] = StartingProcess(argv, {**os.environ, TOKEN_VARIABLE: token},
                                          os.path.basename(words[0]),
                                          stdin=f"{token}\n".encode())
            began[name] = time.monotonic()
            room -= 1

    def start(dial_value: str, procs: Dict[str, StartingProcess]) -> None:
        dial.append(dial_value)
        launch(procs, concurrent)

    def wait(loop: Loop, done: Dict[str, DialedConnection],
             procs: Dict[str, StartingProcess]) -> None:
        failed_at: Optional[float] = None    # when the first host's start failed
        window = 0.0                         # how long each host is given from its own start
        while len(done) < len(names):
            if cancelled is not None and cancelled():
                raise LaunchError(f"stopped while starting the agents with {words[0]}", 130)
            now = time.monotonic()
            pending = [n for n in procs if n not in done and procs[n].proc.poll() is None]
            late = {n for n in pending if now > began[n] + timeout}
            ended = [n for n in procs if n not in done and n not in pending]
            if failed_at is None and ended:
                # A host failed: the others that fail alike (every host, often) are
                # given a moment to say so, so that one report counts them all; each
                # twice as long from its own start as the failed start took, on a
                # machine too busy to run their clients together.
                failed_at = now
                window = min(max(FAILURE_SETTLE, 2 * min(now - began[n] for n in ended)), timeout)
            if late or failed_at is not None and (not pending or (
                    now > failed_at + FAILURE_SETTLE
                    and all(now > began[n] + window for n in pending))):
                message, failed, unreachable = _failure(names, done, procs, shown, timeout,
                                                        late)
                raise HostsFailed(message, failed, unreachable=unreachable)
            if failed_at is None:
                launch(procs, concurrent - len(pending))
            loop.run_once(0.1)
            timeline.tick()

    return greet(dial_addresses(names), tokens, start, wait, port_range)


def _failure(names: Sequence[str], done: Dict[str, DialedConnection],
             procs: Dict[str, StartingProcess], shown: str, timeout: float,
             late: Set[str]) -> Tuple[str, Dict[str, str], List[str]]:
    """One line: every host whose agent is not there, and why (those whose
    command ended, and those ``late``: past their time), those still starting
    when the start was given up named last; each failed host with its reason;
    and those that could not be reached (late, or the command's 255: ssh's
    status for a connection that failed)."""
    groups: Dict[str, Tuple[List[str], str]] = {}   # why, names left out -> (hosts, the first why)
    failed: Dict[str, str] = {}
    unreachable: List[str] = []
    given_up: List[str] = []                  # still starting, past the others' failure
    for name in names:
        if name in done or name not in procs:     # (not started: the start stopped)
            continue
        proc = procs[name]
        code = proc.proc.poll()
        said = proc.last_line(wait=0.5)
        if code is None and name not in late:
            given_up.append(name)
            continue
        if code is None:
            why = f"did not dial back within {timeout:g} s" + (f"; it said: {said}" if said else "")
        else:
            how = f"killed by signal {-code}" if code < 0 else f"status {code}"
            why = f"ended with {how} before the agent dialled back" + (f": {said}" if said else "")
        failed[name] = why
        if code is None or code == 255:
            unreachable.append(name)
        # The host's own name in what it said would keep hosts that failed alike
        # apart: grouped without it, said with the first host's.
        alike = re.sub(rf"(?<![\w.-]){re.escape(name)}(?![\w.-])", "\0", why)
        groups.setdefault(alike, ([], why))[0].append(name)
    missing = sum(len(hosts) for hosts, _ in groups.values())
    from ....hosts.ranges import host_ranges
    parts = [f"{host_ranges(hosts)} ({first}" + (
        "; the others alike, each with its own name)" if len(hosts) > 1 and "\0" in alike
        else ")") for alike, (hosts, first) in groups.items()]
    return (f"cannot start the job's agent on {missing} of {len(names)} remote host(s) "
            f"with '{one_line(shown, 200)} HOST ...'; nothing was started: "
            + "; ".join(parts[:6]) + (f"; and {len(parts) - 6} more reasons"
                                      if len(parts) > 6 else "")
            + (f"; {host_ranges(given_up)} still starting, given up" if given_up else ""),
            failed, unreachable)


def make(spec: SSHSpec, environ: Mapping[str, str], pythons: Sequence[str],
         port_range: Optional[Tuple[int, int]]) -> RshStarter:
    """The job's rsh agent: the one given, else (``--launcher auto``) Grid Engine's
    ``qrsh`` or LSF's ``blaunch`` inside such a job."""
    agent, setting = spec.rsh_agent, "plm_rsh_agent"
    if not agent and spec.launcher == "auto" and not spec.rsh_args:
        agent, setting = engine_agent(environ)
    return RshStarter(spec, pythons, environ, agent, setting, port_range)


class RshStarter:
    """The :class:`~.starter.Starter` that starts agents with an rsh agent."""

    plain_link = True         # the agents dial back in plain TCP
    begun = False             # the agents start in start()
    first_phase = "waiting for the rsh agent's command to start the agent"
    spares_later = True

    def __init__(self, spec: SSHSpec, pythons: Sequence[str], environ: Mapping[str, str],
                 agent: str = "", setting: str = "plm_rsh_agent",
                 port_range: Optional[Tuple[int, int]] = None) -> None:
        self.port_range = port_range
        self.spec = spec
        self.words = agent_words(agent or spec.rsh_agent or DEFAULT_AGENT, spec.rsh_args,
                                 environ, setting)
        self.pythons = list(pythons)
        # The command must reach the host and start Python there.
        self.timeout = 3 * spec.connect_timeout

    def prepare(self, names: Sequence[str] = (), job: str = "") -> None:
        """The agent's package, in the background (no paramiko, and plain output)."""
        bootstrap.prepare_in_background(credentials=False, job=job, compiled=True)

    def close(self) -> None:
        pass

    def start(self, names: Sequence[str], *, cancelled: Optional[Callable[[], bool]] = None,
              say: Optional[Callable[[str], None]] = None) -> Dict[str, DialedConnection]:
        spec = self.spec
        given = [flag for flag, value in (("--ssh-user", spec.user), ("--ssh-port", spec.port),
                                          ("--ssh-identity", spec.identity),
                                          ("--ssh-config", spec.config),
                                          ("--ssh-accept-new", spec.accept_new or None))
                 if value is not None]
        if given:
            raise UsageError(f"{', '.join(given)}: mslaunch's own SSH settings do not reach "
                             f"the rsh agent '{one_line(' '.join(self.words), 80)}'; give the "
                             f"agent's own arguments instead (plm_rsh_args, "
                             f"-bootstrap-exec-args), e.g. '-l USER -p PORT -i FILE'")
        if say is not None:
            say(f"mslaunch: starting agents on {len(names)} remote host(s) with "
                f"{' '.join(self.words)} HOST")
        return connect_all(names, self.words, self.pythons, timeout=self.timeout,
                           cancelled=cancelled, port_range=self.port_range,
                           wrapper=spec.agent_wrapper, concurrent=spec.rsh_concurrent)
