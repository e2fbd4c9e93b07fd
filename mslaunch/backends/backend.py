"""The one seam for every way a job's ranks start, and the registry that picks it.

A :class:`Backend` says how the ranks of one job get started and watched:
this machine's processes (:class:`LocalBackend`), agents on remote hosts
started by a starter (:class:`~mslaunch.backends.agents.agents.AgentsBackend`), one srun step with no
agent (:class:`~mslaunch.backends.srunsteps.srunranks.SrunStepsBackend`), Open MPI's own ``mpirun``
(:class:`~mslaunch.backends.mpirun.openmpi.MpirunBackend`), or this node's part of a job run one
command per node (:class:`~.nodes.NodesBackend`).  The supervisor
(:mod:`mslaunch.run.supervise`) is only policy: it calls every backend the same way, in
this order --

1. :meth:`~Backend.begin` (before the supervisor is built: what takes long
   begins in the background); the plan is the backend's :attr:`~Backend.planning`'s
   (what ``--dry-run`` shows);
2. :meth:`~Backend.connect`: reach every place the ranks run (the plan may be
   made again there with the hosts' topologies);
3. :meth:`~Backend.here`, :meth:`~Backend.check`: which ranks run as this
   machine's processes, and whether they can start;
4. :meth:`~Backend.handles`: hand every place its ranks; every rank handle
   (:class:`~mslaunch.seams.RankHandle`) the supervisor starts, signals and waits
   for, this machine's ranks' included;
5. :meth:`~Backend.started`: every rank runs;
6. :meth:`~Backend.close`: the end; :meth:`~Backend.outcome`: the job's
   result as this way reports it.

``connect``, ``handles`` and ``started`` are lent a :class:`LaunchView`, not the
supervisor: the job as it stands, where the handles report, and the few things
only the supervisor does.

What only one way has is an object of its own that the supervisor asks, not
a hook of every backend's: the remote hosts' agents (:attr:`~Backend.remote_hosts`,
told to let go or to wait for the next attempt before the handles are
released) and the other nodes of a job run one command per node
(:attr:`~Backend.other_nodes`, told when the job is stopped here and asked for
their stacks); :meth:`~Backend.lookers` are what answers looks inside ranks
this machine cannot read (the agents, srun's step).

:func:`choose` picks the backend once, from :data:`BACKENDS` (Hydra's
bootstrap table and PRRTE's ``plm`` components play the same part): the first
that wants the job.  Each entry names its module, imported only when chosen,
so that a job on this machine imports none of the others.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Dict, List, Mapping, Optional, Protocol, Sequence, Tuple

    from ..core.cputopo import Topology
    from .agents.starters.starter import LauncherWords
    from ..core.spec import HostEntry, JobResult, JobSpec, Plan, RankSpec
    from ..core.states import BackendName, Ending
    from ..machine.local import LocalRanks, PMIEnv
    from ..machine.loop import Loop
    from ..machine.terminal import Console
    from ..seams import (Closable, Looker, OtherNodes, RankEvents, RankHandle, RemoteHosts,
                         SharedByAttempts)
    from ..serve.mpijobs import MPIJobs
    from .session import Session

    class LaunchView(Protocol):
        """What a backend is lent of the job it starts (by the supervisor, which
        keeps everything else): the job and its plan as they stand, where its
        handles report (:attr:`events`), and the few things only the supervisor does."""

        @property
        def job(self) -> JobSpec: ...

        @property
        def plan(self) -> Plan:
            """The plan, as made again by :meth:`replanned` if it was."""

        @property
        def loop(self) -> Loop: ...

        @property
        def console(self) -> Console: ...

        @property
        def events(self) -> RankEvents: ...

        @property
        def session(self) -> SharedByAttempts: ...

        @property
        def ending(self) -> Optional[Ending]:
            """How the job ends, once it does (None while it runs)."""

        @property
        def stop_signal(self) -> Optional[int]: ...

        @property
        def launched(self) -> bool:
            """Every handle was made, and told to start."""

        @property
        def mpi_jobs(self) -> Optional[MPIJobs]:
            """The job's MPI as mslaunch serves it, once made (None without)."""

        def stop_requested(self) -> bool:
            """Whether a stop signal came while the places were being reached."""

        def replanned(self, plan: Plan) -> None:
            """The plan made again (with the remote hosts' topologies), before any rank runs."""

        def answer_while_starting(self, status: Callable[[], str]) -> Optional[Closable]:
            """What answers ``mslaunch-stacks`` while the places are reached."""

        def host_paused(self, name: str) -> None:
            """A remote host's ranks are stopped (Ctrl-Z), as asked."""

        def local_ranks(self, specs: Sequence[RankSpec], pmi: object, pmi_env: Optional[PMIEnv],
                        stdin_fd: Optional[int]) -> LocalRanks:
            """The handle of this machine's ranks ``specs``, as the job's own processes."""

    class Planning(Protocol):
        """The hosts and the plan of one attempt: the plan made on first use and
        kept; given the remote hosts' cpus (``{host: Topology}``), made again with
        them (the same job name and ports)."""

        @property
        def entries(self) -> Sequence[HostEntry]: ...

        def plan(self, topologies: Optional[Dict[str, Topology]] = None) -> Plan: ...

    #: Whether a way starts a job's ranks.
    Wanted = Callable[[JobSpec, Session, Planning], bool]

from ..machine.spawn import check_startable
from ..plan import agent_hosts
from ..core.states import OPENMPI, SRUN

def _nodes(job: JobSpec, session: Session, planning: Planning) -> bool:
    return session.nodes is not None          # one command per node: this node's part


def _mpirun(job: JobSpec, session: Session, planning: Planning) -> bool:
    return job.mpi == OPENMPI


def _srun_steps(job: JobSpec, session: Session, planning: Planning) -> bool:
    return job.ssh.launcher == SRUN and bool(agent_hosts(planning.plan(), job))


def _agents(job: JobSpec, session: Session, planning: Planning) -> bool:
    return bool(agent_hosts(planning.plan(), job))


def _local(job: JobSpec, session: Session, planning: Planning) -> bool:
    return True


#: The ways ranks start, in the order they are asked whether they are wanted:
#: (name, the ``--launcher`` word that names it (and its other spellings) if one
#: does, when, module, class).  A new way is one module and its line here.
BACKENDS: Tuple[Tuple[BackendName, LauncherWords, Wanted, str, str], ...] = (
    ("nodes", None, _nodes, "mslaunch.backends.nodes", "NodesBackend"),
    ("mpirun", None, _mpirun, "mslaunch.backends.mpirun.openmpi", "MpirunBackend"),
    ("srun-steps", (SRUN, ()), _srun_steps, "mslaunch.backends.srunsteps.srunranks",
     "SrunStepsBackend"),
    ("agents", None, _agents, "mslaunch.backends.agents.agents", "AgentsBackend"),
    ("local", None, _local, "mslaunch.backends.backend", "LocalBackend"),
)


class Backend:
    """A way ranks start; this base starts them as this machine's processes.
    See the module docstring for the order of the calls."""

    name: BackendName = "local"
    #: mslaunch serves its own PMI (and PMIx) to this way's ranks, when the job
    #: uses PMI; False: the way's own launcher serves them (Open MPI's mpirun, as
    #: Flux's or ``srun --mpi=pmix`` would) and mslaunch starts no server of its
    #: own, with no change to the job (the plan's rank variables stay).
    serves_pmi = True
    #: Processes of the job may run on this machine as the launcher's children (now,
    #: or spawned later): they get this machine's topology file from PMI.
    this_machine = True
    #: :meth:`connect` takes a while and the plan stands meanwhile: the job's PMI is
    #: made before it, while the launcher would only wait.
    pmi_early = False
    #: The way's own launcher is the job's one process, and it reports the ranks:
    #: their failures, the displays and output options asked for (Open MPI's
    #: mpirun). The supervisor keeps only signals, ``--timeout`` and the grace
    #: period, and ``--dry-run`` shows that launcher's command line.
    reports_itself = False
    #: The remote hosts' agents, once reached (the agents' way); None: no remote host.
    remote_hosts: Optional[RemoteHosts] = None
    #: The job's other nodes, each running its own part (one command per node).
    other_nodes: Optional[OtherNodes] = None

    def __init__(self, job: JobSpec, environ: Mapping[str, str], session: Session,
                 planning: Planning) -> None:
        self.job = job
        self.environ = environ
        self.session = session
        self.planning = planning

    def begin(self) -> None:
        """Begin, in the background, what the job will need (an srun step, the
        agents' package, a module to import) while the supervisor is built."""

    def connect(self, view: LaunchView) -> None:
        """Reach every place the ranks run (nothing to reach here)."""

    def here(self, plan: Plan) -> List[RankSpec]:
        """The ranks this machine runs as its own processes."""
        return [r for r in plan.ranks if r.host.local]

    def check(self, plan: Plan) -> None:
        """Fail before anything starts if a program or directory is missing here."""
        check_startable(plan.ranks)

    def handles(self, view: LaunchView, here: Sequence[RankSpec], pmi: object,
                pmi_env: Optional[PMIEnv]) -> List[RankHandle]:
        """Hand every place its ranks and wait until each is ready; every handle,
        this machine's own ranks' included (``view.local_ranks`` makes that one)."""
        return [view.local_ranks(here, pmi, pmi_env, stdin_fd=0)] if here else []

    def started(self, view: LaunchView) -> None:
        """Every rank has been started."""

    def lookers(self) -> Dict[str, Looker]:
        """What answers looks inside the job's ranks that this machine cannot read."""
        return {}

    def close(self) -> None:
        """After the handles are closed."""

    def outcome(self, result: JobResult) -> JobResult:
        """The job's result as this way reports it."""
        return result


class LocalBackend(Backend):
    """Every rank a process of this machine's (:class:`~mslaunch.machine.local.LocalRanks`)."""


def choose(job: JobSpec, environ: Mapping[str, str], session: Session,
           planning: Planning) -> Backend:
    """The backend of ``job``: the first of :data:`BACKENDS` that wants it (its
    module imported then, not before)."""
    for _name, _words, wanted, module, name in BACKENDS:
        if wanted(job, session, planning):
            cls = getattr(__import__(module, fromlist=[name]), name)
            return cls(job, environ, session, planning)
    raise AssertionError("the local backend takes every job")


__all__ = ["BACKENDS", "Backend", "LocalBackend", "choose"]
