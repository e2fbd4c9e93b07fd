"""The user's health check (``--health-check CMD``) of a job run with
``--max-restarts``: before each attempt, ``CMD`` runs once on every host the
attempt may use (``/bin/sh -c CMD``, with the job's environment and working
directory (the first context's ``-x`` and ``-wdir`` too) but no rank's identity
variables, through the job's own starter); a host where it exits non-zero, is
killed, or runs longer than :data:`HEALTH_TIMEOUT` seconds is left out of this
attempt and every later one (see :mod:`.attempts`).

A check is a small job of its own, one process per host, that does not stop
at its first failure: what it costs is one more start of the hosts' agents
per attempt, and nothing for a job without the option.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Tuple

    from ..core.spec import JobResult, JobSpec

from ..core.spec import AppContext, OutputSpec, RankResult, replace

#: Seconds a check may run on a host before that host counts as failed.
HEALTH_TIMEOUT = 60.0


def health_job(job: JobSpec) -> JobSpec:
    """The check of ``job`` as a job: one ``sh -c CMD`` per host, all run to their end."""
    assert job.health_check is not None
    first = job.apps[0]
    return replace(
        job, apps=(AppContext(argv=("/bin/sh", "-c", job.health_check), env=first.env,
                              wdir=first.wdir),), is_check=True, timeout_left=None,
        per_node=1, per_node_wrap=False, map_by="slot", ppr=None, pe=None, rank_by=None,
        bind_to="none", rankfile=None, cpu_list=None, keep_going=True, mpi="none",
        max_job_restarts=0, health_check=None, report_json=None, report_pid=None,
        timeout=HEALTH_TIMEOUT, stall_report=None, stall_exit=False, stdin="none",
        output=OutputSpec(pty=False, copy_to_terminal=True), display_map=False,
        display_allocation=False, display_diffable=False, display_topo=False,
        report_bindings=False, dry_run=False, index_argv=False, report_state=False,
        stack_traces=False, preload_binary=False, preload_files=())


def failed_hosts(result: JobResult) -> Tuple[Tuple[str, str], ...]:
    """The hosts whose check failed, each with how: ``((host, how), ...)``."""
    failed = {}
    for r in result.ranks:
        if r.host not in failed and (not r.pid or r.failed or r.returncode is None
                                     and r.signal is None):
            failed[r.host] = _how(r)
    return tuple(failed.items())


def _how(r: RankResult) -> str:
    if not r.pid:
        return "it did not start"
    if r.signal is not None:
        return f"killed by signal {r.signal}" + (f" ({r.reason})" if r.reason else "")
    if r.returncode:
        return f"exit code {r.returncode}"
    return r.reason or "it did not end"
