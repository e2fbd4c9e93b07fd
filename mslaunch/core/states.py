"""The named states of mslaunch: each a ``Literal`` of its words, for the type
checker, with a constant per word for the code (no ``enum``: its import costs
the launch milliseconds).

* :data:`Ending` -- how a job was stopped before its ranks all ran to their end.
* :data:`HostState` -- a remote host's agent, as the launcher sees it.
* :data:`MpiKind` -- which MPI a job's ranks are served (``--mpi``).
* :data:`LauncherName` -- how remote hosts are reached (``--launcher``).
* :data:`BackendName` -- the way a job's ranks start (the backends' registry).
* :data:`LinkState` -- a node's link to the node service (msrun's, torchrun's nodes).
* :data:`NodeState` -- a node, as the node service sees it.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Literal, Tuple

    #: ``failure``: a rank failed (or a host was lost); ``timeout``: ``--timeout``;
    #: ``signal``: mslaunch got SIGINT, SIGTERM or SIGHUP; ``output``: its output
    #: could not be written; ``remote``: another node of the job ended it (msrun's
    #: nodes); ``stall``: ``--stall-exit``.
    Ending = Literal["failure", "timeout", "signal", "output", "remote", "stall"]
    #: ``new``: its agent started; ``prepared``: sent its ranks; ``ready``: it
    #: checked them; ``running``: told to start; ``done``: every rank of it ended;
    #: ``lost``: its agent, its link or its network failed.
    HostState = Literal["new", "prepared", "ready", "running", "done", "lost"]
    MpiKind = Literal["pmi", "openmpi", "none"]
    LauncherName = Literal["auto", "ssh", "slurm", "srun", "local"]
    BackendName = Literal["local", "agents", "srun-steps", "mpirun", "nodes"]
    #: ``connecting``; ``handshaking``: TLS; ``proving``: the job's secret, both ways;
    #: ``registering``: asked for its ranks; ``joined``: given them; ``waiting``: for
    #: the next round (a job whose nodes start again together); ``ended``.
    LinkState = Literal["connecting", "handshaking", "proving", "registering", "joined",
                        "waiting", "ended"]
    #: ``new``: connected; ``held``: its ranks kept for it until every node is in;
    #: ``joined``: given them; ``done``: its ranks ended; ``stopped``: stopped by
    #: the service; ``gone``: its link closed before its end.
    NodeState = Literal["new", "held", "joined", "done", "stopped", "gone"]
else:
    Ending = HostState = MpiKind = LauncherName = BackendName = LinkState = NodeState = str

FAILURE: Ending = "failure"
TIMEOUT: Ending = "timeout"
SIGNAL: Ending = "signal"
OUTPUT: Ending = "output"
REMOTE: Ending = "remote"
STALL: Ending = "stall"

NEW: HostState = "new"
PREPARED: HostState = "prepared"
READY: HostState = "ready"
RUNNING: HostState = "running"
DONE: HostState = "done"
LOST: HostState = "lost"

LINK_CONNECTING: LinkState = "connecting"
LINK_HANDSHAKING: LinkState = "handshaking"
LINK_PROVING: LinkState = "proving"
LINK_REGISTERING: LinkState = "registering"
LINK_JOINED: LinkState = "joined"
LINK_WAITING: LinkState = "waiting"
LINK_ENDED: LinkState = "ended"

NODE_NEW: NodeState = "new"
NODE_HELD: NodeState = "held"
NODE_JOINED: NodeState = "joined"
NODE_DONE: NodeState = "done"
NODE_STOPPED: NodeState = "stopped"
NODE_GONE: NodeState = "gone"

#: (The words of ``--launcher``: each starter's or backend's is in its table's line,
#: :data:`~mslaunch.backends.agents.starters.starter.STARTERS`, :data:`~mslaunch.backends.backend.BACKENDS`.)
AUTO: LauncherName = "auto"
SSH: LauncherName = "ssh"
SLURM: LauncherName = "slurm"
SRUN: LauncherName = "srun"
LOCAL_ONLY: LauncherName = "local"

PMI: MpiKind = "pmi"
OPENMPI: MpiKind = "openmpi"
NO_MPI: MpiKind = "none"
MPI_KINDS: Tuple[MpiKind, ...] = (PMI, OPENMPI, NO_MPI)

#: The endings after which a job run with --max-restarts starts again.
RESTARTED_ENDINGS: Tuple[Ending, ...] = (FAILURE, STALL)
