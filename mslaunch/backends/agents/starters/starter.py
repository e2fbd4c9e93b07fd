"""The seam between the launcher and what starts its agents on remote hosts.

A :class:`Starter` starts one agent on each named host and hands back, for
each, an :class:`AgentConnection`: the launcher's end of that agent's link
(see :mod:`mslaunch.wire.link`) and what the launcher needs to know of the agent.  The
starters are paramiko's SSH (:class:`.ssh.starter.SSHStarter`), an rsh agent such as
the OpenSSH client (:class:`.rsh.RshStarter`) and Slurm's srun
(:class:`.slurm.SrunStarter`); :func:`starter_for` makes the job's, the first
of :data:`STARTERS` that wants it.  The launcher uses only what the two
protocols below say, whichever starter it has.

The protocols are for type checkers: importing this module costs nothing.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, Mapping, Optional, Protocol, Sequence, Tuple

    from ....core.spec import SSHSpec
    from ....core.states import LauncherName

    #: A starter's or backend's ``--launcher`` word, and its other spellings.
    LauncherWords = Optional[Tuple[LauncherName, Tuple[str, ...]]]

    #: Whether a starter starts the agents of a job reaching its hosts so, here.
    Wanted = Callable[[SSHSpec, Mapping[str, str]], bool]

    class AgentConnection(Protocol):
        """A running agent, as a starter hands it to the launcher.

        ``fd`` is the launcher's end of the link (the caller closes it after
        :meth:`close`); ``hello`` is the agent's ``HELLO`` message (host,
        Python, topology); ``local_address`` is this machine's address
        towards the host (None when the way there does not tell, as through
        a proxy), which the agent can dial back for its output connection;
        ``stderr_tail`` is the end of what the agent wrote to its stderr and
        ``ended_because`` what the starter knows of why the link ended ("" if
        nothing), both shown when the host is lost.
        """

        @property
        def name(self) -> str: ...
        @property
        def fd(self) -> int: ...
        @property
        def hello(self) -> Dict[str, Any]: ...
        @property
        def local_address(self) -> Optional[str]: ...
        @property
        def stderr_tail(self) -> bytes: ...
        @property
        def ended_because(self) -> str: ...

        def wait_exit(self, deadline: float) -> bool:
            """Wait until the agent has closed its end (it exited); False at ``deadline``."""

        def close(self, wait: float = 1.0, gone: bool = False) -> None:
            """Close the link (the agent sees end-of-file and exits), waiting up to
            ``wait`` s; ``gone``: the agent does not answer (its host was lost), so
            what started it cannot end by itself and is not waited for."""

    class Starter(Protocol):
        """Starts the job's agents on remote hosts.

        ``plain_link`` is true when the links travel in plain TCP: the
        agents' output connections beside them then stay plain too.
        """

        @property
        def plain_link(self) -> bool: ...

        @property
        def spares_later(self) -> bool:
            """:meth:`start` may be called from a thread, for the spare hosts, while
            the job runs (see :meth:`~mslaunch.backends.agents.fleet.Fleet.start_spares`)."""

        @property
        def first_phase(self) -> str:
            """What a host is doing until it marks anything (see :mod:`mslaunch.machine.timeline`)."""

        @property
        def begun(self) -> bool:
            """:meth:`prepare` already started the agents (srun's step): until
            :meth:`start` has them, the launcher has nothing to wait for but them."""

        def prepare(self, names: Sequence[str] = (), job: str = "") -> None:
            """Begin, in the background, what :meth:`start` will need (the agent's
            package, a module to import), while the job is still being planned;
            given the hosts :meth:`start` will be given, a starter may begin
            starting their agents (srun does).  ``job`` (the kvsname) names the
            job to the agents as they are greeted."""

        def close(self) -> None:
            """End what :meth:`prepare` began that :meth:`start` did not take (the
            job failed before it started its hosts)."""

        def start(self, names: Sequence[str], *, cancelled: Optional[Callable[[], bool]] = None,
                  say: Optional[Callable[[str], None]] = None) -> Mapping[str, AgentConnection]:
            """An agent on every host of ``names``, by name; all of them or none
            (LaunchError, exit code 130 when ``cancelled`` turned true while
            waiting).  ``say``, when given, is told (verbose) what starts them."""

from ....core.errors import LaunchError
from ....core.states import AUTO, LOCAL_ONLY, SLURM, SSH


class _NoStarter:
    """``--launcher local``: remote hosts cannot be reached; saying so is :meth:`start`'s."""

    plain_link = True
    spares_later = False
    begun = False
    first_phase = ""

    def prepare(self, names: Sequence[str] = (), job: str = "") -> None:
        pass

    def close(self) -> None:
        pass

    def start(self, names: Sequence[str], *, cancelled: Optional[Callable[[], bool]] = None,
              say: Optional[Callable[[str], None]] = None) -> Dict[str, AgentConnection]:
        raise LaunchError(f"--launcher local: {', '.join(names[:4])} "
                          f"{'is' if len(names) == 1 else 'are'} not this machine")


def _under_slurm(spec: SSHSpec, environ: Mapping[str, str]) -> bool:
    from ....hosts.allocations import choose_launcher
    return choose_launcher(spec.launcher, environ) == SLURM   # (UsageError outside one)


def _nowhere(spec: SSHSpec, environ: Mapping[str, str]) -> bool:
    return spec.launcher == LOCAL_ONLY


def _rsh(spec: SSHSpec, environ: Mapping[str, str]) -> bool:
    if spec.rsh_agent or spec.rsh_args:
        return True
    from ....hosts.allocations import in_grid_engine, in_lsf
    return spec.launcher == AUTO and (in_grid_engine(environ) or in_lsf(environ))


def _ssh(spec: SSHSpec, environ: Mapping[str, str]) -> bool:
    return True


#: The starters, asked in this order whether they start the job's agents (as
#: Hydra's bootstrap table): (name, the ``--launcher`` word that names it and its
#: other spellings (Hydra's, Open MPI's ``plm``), when, module).  Each module has
#: ``make(spec, environ, pythons, port_range)``, imported only when chosen; a
#: new starter is one module and its line here.
STARTERS: Tuple[Tuple[str, LauncherWords, Wanted, str], ...] = (
    ("srun", (SLURM, ()), _under_slurm, "mslaunch.backends.agents.starters.slurm"),
    ("none", (LOCAL_ONLY, ("fork", "isolated")), _nowhere,
     "mslaunch.backends.agents.starters.starter"),
    # (Hydra's sge and lsf: qrsh and blaunch, which "auto" takes inside those allocations)
    ("rsh", (AUTO, ("sge", "lsf")), _rsh, "mslaunch.backends.agents.starters.rsh"),
    ("ssh", (SSH, ("rsh",)), _ssh, "mslaunch.backends.agents.starters.ssh.starter"),
)


def starter_for(spec: SSHSpec, environ: Mapping[str, str],
                pythons: Optional[Sequence[str]] = None,
                port_range: Optional[Tuple[int, int]] = None) -> Starter:
    """The starter of a job whose remote hosts are reached as ``spec`` says: the
    first of :data:`STARTERS` that wants it (UsageError for ``--launcher slurm``
    outside an allocation).  ``pythons`` are the interpreters the agents try on
    the hosts: ``--remote-python``, else this one's path, then ``python3``.  The
    agents that dial in (srun, an rsh agent) are listened for on a port of
    ``port_range`` if given.  Nothing is started or read yet."""
    if pythons is None:
        pythons = [spec.remote_python] if spec.remote_python else [sys.executable, "python3"]
    for _name, _words, wanted, module in STARTERS:
        if wanted(spec, environ):
            made: Starter = __import__(module, fromlist=["make"]).make(
                spec, environ, pythons, port_range)
            return made
    raise AssertionError("the SSH starter takes every job")


def make(spec: SSHSpec, environ: Mapping[str, str], pythons: Sequence[str],
         port_range: Optional[Tuple[int, int]]) -> Starter:
    """``--launcher local``: no starter (remote hosts cannot be reached)."""
    return _NoStarter()


def let_go(conn) -> None:
    """Send an agent that will get no ranks away: ``BYE`` (it exits 0), then close.

    Only cutting the link would make it exit 1, as an agent that lost its
    launcher does."""
    from ....wire import link
    try:
        os.write(conn.fd, link.encode(link.BYE))
    except OSError:
        pass
    conn.close()
    os.close(conn.fd)
