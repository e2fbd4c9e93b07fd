"""One attempt of a job: its plan, its backend, its supervisor.

:func:`run_attempt` is the one place a :class:`~.supervise.Supervisor` is made,
for every way ranks start: the backend the registry chooses (:mod:`mslaunch.backends.backend`)
from the job, its session and its plan (:class:`JobPlanning`, made on first
use); and the job's control socket, which ``mslaunch-stacks`` and
``mslaunch-top`` attach to.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

    from ..core.spec import HostEntry, JobResult
    from ..backends.backend import Backend, Planning
    from ..backends.session import Session

from ..core.errors import NoHostLeft
from ..mpi.pmi.files import new_kvsname
from ..core.spec import AttemptOutcome, JobSpec, Plan
from ..machine.osfiles import unlink_quietly


def control_listener(directory: str, name: str):
    """A listening Unix socket ``directory/name`` (no TCP port: only processes that
    may enter this user's private directory can connect); None if it cannot be made."""
    from ..core import socket
    path = os.path.join(directory, name)
    unlink_quietly(path)             # a dead launcher's of the same pid
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    # Bound under another name and renamed once it listens: a client that finds the
    # path bound but not yet listening is refused, takes it for a dead launcher's
    # and removes it (mslaunch-stacks then found "no running job" for good).
    part = f"{path}.new"
    try:
        unlink_quietly(part)
        sock.bind(part)
        sock.listen(16)
        os.rename(part, path)
    except OSError:
        sock.close()
        unlink_quietly(part)
        return None
    sock.setblocking(False)
    return sock, path


def open_control(watchdog) -> Optional[Tuple[object, str]]:
    """The job's control socket ``PID.sock`` (mslaunch-stacks, mslaunch-top), which
    the guard removes should this process die; None if it cannot be made."""
    from ..machine.procs import in_private

    def listen(where: str) -> Optional[Tuple[object, str]]:
        # told before they exist: this process may be killed the moment after
        for name in (f"{os.getpid()}.sock", f"{os.getpid()}.sock.new"):
            watchdog.private(os.path.join(where, name))
        return control_listener(where, f"{os.getpid()}.sock")

    def drop(made: Tuple[object, str]) -> None:
        made[0].close()          # type: ignore[attr-defined]
        unlink_quietly(made[1])

    return in_private(listen, lambda made: made[1], drop)


def build_plan(job: JobSpec, environ: Optional[Mapping[str, str]] = None, *,
               entries=None, kvsname: Optional[str] = None, master_port: Optional[int] = None,
               remote_topologies=None, jobid: Optional[int] = None) -> Plan:
    """The job's plan; planned again with the remote hosts' real topologies, it
    keeps the first plan's ``kvsname``, ``master_port`` and Open MPI job id."""
    from ..machine.rendezvous import free_port, master_port_of, ompi_jobid
    from ..machine.topology import cached_topology
    from ..plan import make_plan
    environ = os.environ if environ is None else environ
    if entries is None:
        from ..hosts import host_entries
        entries = host_entries(job, environ)
    if master_port is None:
        master_port = master_port_of(environ.get("MASTER_PORT")) or free_port(job.port_range)
    if jobid is None:
        jobid = ompi_jobid(master_port)
    return make_plan(job, entries, environ, topology=cached_topology(),
                     hostname=os.uname().nodename, kvsname=kvsname or new_kvsname(),
                     master_port=master_port, remote_topologies=remote_topologies,
                     ompi_jobid=jobid)


class JobPlanning:
    """The plan of one attempt, made on first use (a job that Open MPI's mpirun
    runs never needs one), and made again with the remote hosts' topologies
    (:class:`~mslaunch.backends.backend.Planning`); its hosts those of the job but ``left_out``."""

    def __init__(self, job: JobSpec, environ: Mapping[str, str], kvsname: str,
                 hosts: Callable[[], Sequence[HostEntry]], left_out: Sequence[str] = ()
                 ) -> None:
        self.job, self.environ, self.kvsname = job, environ, kvsname
        self._hosts, self.left_out = hosts, tuple(left_out)
        self._entries: Optional[List[HostEntry]] = None
        self._plan: Optional[Plan] = None

    @property
    def entries(self) -> Sequence[HostEntry]:
        if self._entries is None:
            from ..hosts import is_local
            left_out, entries = self.left_out, self._hosts()
            # This machine is named by its node name in results, "localhost" or an
            # address of its own in the host list.
            here_out = any(is_local(name) for name in left_out)
            self._entries = [e for e in entries if e.name not in left_out
                             and not (here_out and is_local(e.name))]
            if left_out and not self._entries:
                raise NoHostLeft(f"no host is left for the job ({', '.join(left_out)} "
                                  f"left out)")
        return self._entries

    def plan(self, topologies=None) -> Plan:
        if self._plan is None:
            self._plan = build_plan(self.job, self.environ, entries=self.entries,
                                    kvsname=self.kvsname)
        if topologies is not None:
            first = self._plan
            self._plan = build_plan(self.job, self.environ, entries=self.entries,
                                    kvsname=first.kvsname, master_port=first.master_port,
                                    remote_topologies=topologies, jobid=first.ompi_jobid)
        return self._plan


def as_supervised(job: JobSpec, backend: Backend) -> Tuple[JobSpec, Plan]:
    """The job as its supervisor sees it, and its plan (the backend's planning's).
    Where the way's own launcher reports the ranks (``reports_itself``), signals,
    ``--timeout`` and the grace period are all the supervisor keeps of the job."""
    if backend.reports_itself:
        job = JobSpec(apps=job.apps, mpi=job.mpi, timeout=job.timeout, grace=job.grace,
                      quiet=True, line_quiet=job.quiet, launch_dir=job.launch_dir)
    return job, backend.planning.plan()


def exit_codes(result: JobResult) -> List[str]:
    """Hydra's ``-print-all-exitcodes`` lines: each host's ranks' wait statuses, in
    rank order (the exit code times 256, or the signal; -1: never started)."""
    hosts: Dict[str, List[str]] = {}
    for r in sorted(result.ranks, key=lambda r: r.rank):
        status = r.signal if r.signal is not None else \
            -1 if r.returncode is None else r.returncode << 8
        hosts.setdefault(r.host, []).append(str(status))
    return [f"mslaunch: Exit codes: [{host}] {','.join(codes)}" for host, codes in hosts.items()]


def run_attempt(job: JobSpec, environ: Mapping[str, str], session: Session,
                planning: Planning, note: str = "",
                launched: Optional[Callable[[], None]] = None,
                tell: bool = True) -> AttemptOutcome:
    """One run of the job, by one supervisor -- the only place one is made --
    with the backend the registry chooses (:mod:`mslaunch.backends.backend`)."""
    from ..backends.backend import choose
    backend = choose(job, environ, session, planning)
    try:            # until the supervisor owns it, what the backend began is ended here
        backend.begin()
        from .supervise import Supervisor  # after srun's step began (begin)
        job_s, plan = as_supervised(job, backend)
        control = open_control(session.guard) if session.wants_control else None
        supervisor = Supervisor(job_s, plan, backend, session, control=control, note=note,
                                on_launched=launched)
    except BaseException:
        backend.close()
        raise
    result = supervisor.run()
    if result.message and tell and not job.quiet:     # (-q: none, as Open MPI's)
        session.console.message(result.message)
    if job.print_exit_codes and tell:
        for line in exit_codes(result):
            session.console.message(line)
    return AttemptOutcome(
        result, tuple(dict.fromkeys(r.spec.host.name for r in supervisor.ranks)),
        tuple(name for name, host in supervisor.hosts.items()
              if host.at_fault) + tuple(backend.remote_hosts.left_out
                                        if backend.remote_hosts is not None else ()))


