"""Running a parsed job: hosts → plan → backend → supervise → report.

This module holds the impure glue around the pure planner: it reads the
host sources, asks the machine for its core count, a free port and a unique
job name, makes the run's orphan guard and session, and runs each attempt of
the job (one, or several with ``--max-restarts``: :mod:`.restarts`) with the
backend the registry chooses (:mod:`mslaunch.backends.backend`) under the one supervisor
(:func:`run_attempt`); then it writes the report.
"""

from __future__ import annotations

import os
import sys
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, List, Mapping, Optional, Tuple

    from ..backends.allocationend import AllocationEnd
    from ..machine.guard import Watchdog
    from ..machine.terminal import Console
    from ..core.spec import HostEntry, JobResult, Plan

from ..core.errors import HOST_LOST_EXIT, HostsFailed, LaunchError, NoHostLeft, Stopped, \
    os_error_reason
from ..mpi.pmi.files import job_guard, new_kvsname, public_id
from ..core.spec import JobSpec
from ..core.states import OPENMPI
from .attempt import JobPlanning, run_attempt


def _warn_missing_exports(job: JobSpec, environ: Mapping[str, str]) -> None:
    pairs = list(job.global_env) + [p for app in job.apps for p in app.env]
    for name, value in pairs:
        if value is None and name not in environ and not job.quiet:
            # (named without its option: -x, -genvlist or -envlist, of either dialect)
            sys.stderr.write(f"mslaunch: warning: {name} is not set in the environment: "
                             f"not exported\n")


def run_job(job: JobSpec, early: Optional[Tuple[str, Watchdog]] = None) -> int:
    """Run ``job`` and return mslaunch's exit status (and write its report, if asked).
    ``early``: the job's name and its orphan guard, if the command started them
    before it read the job's line: a job run closes the guard at its end; one that
    never ran (a dry run, an error first) leaves it to the caller to forgo."""
    watch = None
    if not (job.quiet or job.dry_run) and os.environ.get("SLURM_JOB_ID"):
        from ..backends.allocationend import allocation_end
        watch = allocation_end(os.environ)
    if watch is None:
        return _reported(job, None, early)
    # A stop the job's supervisor saw has asked already; one between two
    # attempts, or for want of hosts, ends in an error: it asks at the end.
    stopped = True
    try:
        code = _reported(job, watch, early)
        stopped = False
        return code
    except LaunchError as err:
        stopped = isinstance(err, (NoHostLeft, Stopped, HostsFailed)) or \
            err.exit_code == HOST_LOST_EXIT
        raise
    finally:
        # (after the report: the workload manager may kill mslaunch any moment now)
        watch.finish(stopped)


def _reported(job: JobSpec, watch: Optional[AllocationEnd],
              early: Optional[Tuple[str, Watchdog]]) -> int:
    """Run ``job``; its report written, whatever its end."""
    if job.report_json is None or job.dry_run:
        return _run_job(job, watch, early)
    import time
    from . import jobreport
    jobreport.check_writable(job.report_json)
    started = time.time()
    try:
        return _run_job(job, watch, early, started)
    except LaunchError as err:
        try:
            jobreport.write(job.report_json, jobreport.build(None, started, error=str(err),
                                                             exit_code=err.exit_code))
        except LaunchError as failed:      # the job's own error stays the news
            sys.stderr.write(f"mslaunch: error: {failed}\n")
        raise


def _run_job(job: JobSpec, watch: Optional[AllocationEnd],
             early: Optional[Tuple[str, Watchdog]], started: float = 0.0) -> int:
    environ = os.environ
    kvsname = new_kvsname() if early is None else early[0]
    hosts = _hosts_of(job, environ)
    if job.dry_run:
        from typing import cast

        from ..machine.guard import Watchdog
        from ..machine.terminal import Console
        from ..backends.backend import choose
        from ..backends.session import Session
        session = Session(cast(Watchdog, _NoGuard()), Console())
        backend = choose(job, environ, session, JobPlanning(job, environ, kvsname, hosts))
        sys.stdout.write(_dry_run(backend.planning.plan(), backend.reports_itself))
        return 0
    # The orphan guard first (a small fork, before more is imported), so that
    # it settles into the job's cgroup while the job is planned.
    if early is None:
        try:
            guard = job_guard(public_id(kvsname), job.grace)
        except OSError as err:
            raise LaunchError(f"cannot start the job's orphan guard: "
                              f"{os_error_reason(err)}") from None
    else:
        guard = early[1]
        guard.set_grace(job.grace)
    try:
        if job.mpi != OPENMPI:     # (mpirun says itself what it does not export)
            _warn_missing_exports(job, environ)
        console = _xml_console(job)
        from ..machine.terminal import Console
        from ..backends.session import Session
        session = Session(guard, console or Console(), wants_control=job.mpi != OPENMPI,
                          allocation_end=watch)
        if watch is not None:
            watch.say = session.console.message
        try:
            if not job.max_job_restarts and not job.health_check:
                result = run_attempt(job, environ, session, JobPlanning(job, environ, kvsname,
                                                                      hosts)).result
            else:
                from .restarts import run_restartable
                result = run_restartable(job, environ, session, kvsname, hosts)
            return _finish(job, result, session.console, started)
        finally:
            session.close()
            session.console.close()
            if watch is not None:
                watch.say = None
    finally:
        if watch is not None:
            watch.outlive(guard)
        guard.close()


def _hosts_of(job: JobSpec, environ: Mapping[str, str]) -> Callable[[], List[HostEntry]]:
    """The job's host list, read once when first asked for."""
    read: List[List[HostEntry]] = []

    def hosts() -> List[HostEntry]:
        if not read:
            from ..hosts import host_entries
            read.append(list(host_entries(job, environ)))
        return read[0]
    return hosts


def _dry_run(plan: Plan, one_launcher: bool) -> str:
    """What ``--dry-run`` shows: the plan, or the command line of the way's own
    launcher where that is the job's one process (Open MPI's mpirun)."""
    if one_launcher:
        import shlex
        return shlex.join(plan.ranks[0].argv) + "\n"
    from ..plan import describe_plan
    return describe_plan(plan)


class _NoGuard:
    """``--dry-run`` starts nothing: no guard, but a name for what would be its."""

    marker = "dry-run"


def _xml_console(job: JobSpec) -> Optional[Console]:
    """--xml-file: all output, mslaunch's own lines too, into the file (else None)."""
    if not job.output.xml_file:
        return None
    try:
        fd = os.open(job.output.xml_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC,
                     0o644)
    except OSError as err:
        raise LaunchError(f"--xml-file {job.output.xml_file}: {err.strerror}") from None
    from ..machine.terminal import Console
    return Console(fd, fd, owned=True)


def _finish(job: JobSpec, result: JobResult, console: Console, started: float) -> int:
    """The job's exit status, once its report (if asked for) is written."""
    if job.torch is not None and result.root_cause is not None:
        from .errorfiles import copy_for_launcher
        copy_for_launcher(result, os.environ)
    if job.report_json is not None:
        from . import jobreport
        try:
            jobreport.write(job.report_json, jobreport.build(result, started))
        except LaunchError as err:      # the job's own status stays the news
            console.message(f"mslaunch: error: {err}")
            return result.exit_code or err.exit_code
    return result.exit_code
