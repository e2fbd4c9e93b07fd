"""The seam between the launcher and what starts its agents on remote hosts.

A :class:`Starter` starts one agent on each named host and hands back, for
each, an :class:`AgentConnection`: the launcher's end of that agent's link
(see :mod:`.link`) and what the launcher needs to know of the agent.  The
starters are paramiko's SSH (:class:`.ssh.starter.SSHStarter`), an rsh agent such as
the OpenSSH client (:class:`.rsh.RshStarter`) and Slurm's srun
(:class:`.slurm.SrunStarter`); :func:`starter_for` makes the job's, as
:func:`.slurm.choose` decides.  The launcher uses only what the two
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
        def one_fate(self) -> bool:
            """One agent's failure ends every agent it started (srun's step): after
            a lost host none of them is kept for a job's next attempt."""

        @property
        def first_phase(self) -> str:
            """What a host is doing until it marks anything (see :mod:`.timeline`)."""

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


class _NoStarter:
    """``--launcher local``: remote hosts cannot be reached; saying so is :meth:`start`'s."""

    plain_link = True
    begun = False
    one_fate = False
    first_phase = ""

    def prepare(self, names: Sequence[str] = (), job: str = "") -> None:
        pass

    def close(self) -> None:
        pass

    def start(self, names: Sequence[str], *, cancelled: Optional[Callable[[], bool]] = None,
              say: Optional[Callable[[str], None]] = None) -> Dict[str, AgentConnection]:
        raise LaunchError(f"--launcher local: {', '.join(names[:4])} "
                          f"{'is' if len(names) == 1 else 'are'} not this machine")


def starter_for(spec: SSHSpec, environ: Mapping[str, str],
                pythons: Optional[Sequence[str]] = None,
                port_range: Optional[Tuple[int, int]] = None) -> Starter:
    """The starter of a job whose remote hosts are reached as ``spec`` says.

    ``spec.launcher`` decides, through :func:`.slurm.choose` (UsageError for
    ``slurm`` outside an allocation).  ``pythons`` are the interpreters the
    agents try on the hosts: ``--remote-python``, else this one's path, then
    ``python3``.  The agents that dial in (srun, an rsh agent) are listened for
    on a port of ``port_range`` if given.  Nothing is started or read yet.
    """
    from ....hosts.allocation import choose
    from .slurm import SrunStarter
    how = choose(spec.launcher, environ)
    if pythons is None:
        pythons = [spec.remote_python] if spec.remote_python else [sys.executable, "python3"]
    if how == "slurm":
        return SrunStarter(pythons, environ, port_range, spec.agent_wrapper)
    if how == "local":
        return _NoStarter()
    agent, setting = spec.rsh_agent, "plm_rsh_agent"
    if not agent and spec.launcher == "auto":
        from ....hosts.allocation import in_grid_engine, in_lsf
        if in_grid_engine(environ) or in_lsf(environ):
            from .rsh import engine_agent
            agent, setting = engine_agent(environ)
    if agent or spec.rsh_args:
        from .rsh import RshStarter
        return RshStarter(spec, pythons, environ, agent, setting, port_range)
    from .ssh.starter import SSHStarter
    return SSHStarter(spec, pythons, environ)


def let_go(conn) -> None:
    """Send an agent that will get no ranks away: ``BYE`` (it exits 0), then close.

    Only cutting the link would make it exit 1, and under Slurm that ends
    every other agent of the step (srun runs them with ``--kill-on-bad-exit``)."""
    from ....wire import link
    try:
        os.write(conn.fd, link.encode(link.BYE))
    except OSError:
        pass
    conn.close()
    os.close(conn.fd)
