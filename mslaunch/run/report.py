"""What the supervisor tells the user about a job that did not simply succeed.

The failure summary (the root cause, how many others were stopped or, when
the job keeps going, every failed rank; the end of the root cause's stderr,
a long Python traceback shortened by :mod:`.tails`), the state report of
``--report-state-on-timeout``, the ranks a hung MPI job waited for
(``--get-stack-traces``' merged stacks are :mod:`mslaunch.inspect.stall`'s), ``--report-pid``,
``--report-bindings`` and ``-v``'s lines of started ranks, and msrun's
recovery of a failed process.  Imported only when one of them is wanted.
"""

from __future__ import annotations

from ..core.errors import one_line

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Optional, Sequence, Tuple

    from ..machine.local import LocalRanks
    from ..core.spec import RankResult
    from ..seams import RankState
    from .lent import Reported

from ..core.errors import TIMEOUT_EXIT, LaunchError
from ..machine.spawn import how_ended
from ..core.spec import JobResult, replace
from ..core.states import FAILURE

#: Lines listing the failed ranks of a keep-going job (grouped by host and end).
FAILED_LINES = 20


def told(view: Reported, rank: RankState) -> str:
    """The root cause in one line, for the job's other nodes: the summary's
    first line, and what the rank's error file says, if it wrote one."""
    line = summary(view, rank).split("\n", 1)[0][len("mslaunch: "):]
    from .errorfiles import read_error
    said = read_error(rank.spec.error_file)
    if said is not None and said[0]:
        line += f"; its error: {one_line(said[0], 300)}"
    return line


def _where(rank: RankState) -> str:
    """``pid 4242 on h1``; for a rank whose start its host had not reported (a
    host lost as the ranks started), ``on h1, its start not reported``."""
    host = rank.spec.host.name
    return f"pid {rank.pid} on {host}" if rank.pid else f"on {host}, its start not reported"


def summary(view: Reported, rank: RankState) -> str:
    """The lines that name the root cause of a failed job."""
    spec = rank.spec
    job = f" of spawned job {spec.job}" if spec.job != 1 else ""
    name = spec.label or f"rank {spec.rank}{job}"
    who = f"{name} ({_where(rank)})"
    what = rank.reason or how_ended(rank.code, rank.signal)
    if view.job.keep_going and view.ending != FAILURE:
        failed = [r for r in view.ranks if r.failed]
        head = (f"mslaunch: {len(failed)} of {len(view.ranks)} rank(s) failed; "
                f"first: {who} {what}")
        if len(failed) > 1:
            head += "\n" + failed_ranks(failed, bool(view.job.report_json))
    else:
        others = sum(1 for r in view.ranks if r is not rank and r.pid)
        kind = "process(es)" if spec.label else "rank(s)"
        head = f"mslaunch: {who} {what}; terminated the job" + \
            (f" ({others} other {kind})" if others else "")
        head += _followed(view, rank)
    tail = rank.tail
    from .errorfiles import read_error
    said = read_error(spec.error_file)
    if said is not None:
        from .tails import shown_tail
        head += f"\nmslaunch: rank {spec.rank}'s error file ({spec.error_file}): {said[0]}"
        if said[1].strip():
            head += "\n" + "\n".join("    " + line for line in shown_tail(said[1]))
    elif tail.strip() and not (rank.outputs and rank.outputs[-1].last_on_terminal):
        # (a tail that is the last thing on the terminal is right above: not again)
        from .tails import shown_tail
        lines = shown_tail(tail.decode("utf-8", "replace"))
        stream = "stdout+stderr" if view.job.output.merge_stderr else "stderr"
        whose = f"{spec.label}'s log" if spec.label else f"rank {spec.rank}'s {stream}"
        head += f"\nmslaunch: last lines of {whose}:\n" + \
            "\n".join("    " + line for line in lines)
    if said is None and not spec.label and MINDSPORE_WANTS_MPIRUN in tail:
        # (whether or not the tail was shown again above)
        head += "\n" + msrun_hint([r.spec.host.name for r in view.ranks], spec.argv)
    return head


def failed_result(view: Reported, results: Sequence[RankResult]) -> JobResult:
    """The result of a job that failed: its cause's code, the summary, the failures."""
    from ..core import signal
    f = view.failures
    cause = f.root
    assert cause is not None, "a failed job has its cause"
    results = [_with_error(r, state.spec.error_file) if r.returncode or r.signal else r
               for r, state in zip(results, view.ranks)]
    root = results[cause.spec.key]
    # A rank stopped by a broken pipe because mslaunch's own reader went away
    # (``| head``) is the shell's quiet SIGPIPE, not news; so is one that exited
    # of the write error instead (Python ignores SIGPIPE: on its pseudo-terminal
    # it meets EIO), where no file took its output: the job ends 141 as a
    # shell pipeline's writer does.
    closed = not view.console.is_open(1)
    quiet = closed and (root.signal == signal.SIGPIPE or (
        not root.signal and view.job.output.directory is None and not cause.spec.label))
    return JobResult(exit_code=128 + signal.SIGPIPE if quiet else f.root_code,
                     ranks=tuple(results), root_cause=root,
                     message="" if quiet else summary(view, cause),
                     ending=view.ending or FAILURE, failures=(
                         (f.root_at, root), *((f.root_at + after, results[r.spec.key])
                                              for after, r in f.followed())))


def _with_error(result: RankResult, path: Optional[str]) -> RankResult:
    """``result`` with what the rank's error file said (see :mod:`.errorfiles`)."""
    if not path:
        return result
    from .errorfiles import read_error
    said = read_error(path)
    if said is None:
        return result
    return replace(result, error=said[0], error_traceback=said[1], error_file=path)


def _followed(view: Reported, root: RankState) -> str:
    """Lines naming the failures that followed the cause (see :mod:`.failures`);
    those that failed as the cause did (every singleton of a job) add nothing."""
    from .failures import FOLLOWED_SHOWN
    if view.failures.root is not root:
        return ""
    what = root.reason or how_ended(root.code, root.signal)
    followed = [(after, r) for after, r in view.failures.followed()
                if (r.reason or how_ended(r.code, r.signal)) != what]
    lines = []
    for after, r in followed[:FOLLOWED_SHOWN]:
        s = r.spec
        name = s.label or f"rank {s.rank}" + (f" of spawned job {s.job}" if s.job != 1 else "")
        when = f"{after * 1000:.0f} ms later" if after >= 0 else \
            f"seen {-after * 1000:.0f} ms before it (taken for its victim)"
        lines.append(f"\nmslaunch: then {name} ({_where(r)}) "
                     f"{r.reason or how_ended(r.code, r.signal)}, {when}")
    if len(followed) > FOLLOWED_SHOWN:
        lines.append(f"\nmslaunch: then {len(followed) - FOLLOWED_SHOWN} more rank(s) failed")
    return "".join(lines)


def _ranges(numbers: Sequence[int]) -> str:
    """``0-3, 5, 7-8`` for the numbers 0 1 2 3 5 7 8."""
    parts: List[str] = []
    for n in sorted(numbers):
        if parts and parts[-1].split("-")[-1] == str(n - 1):
            parts[-1] = parts[-1].split("-")[0] + f"-{n}"
        else:
            parts.append(str(n))
    return ", ".join(parts)


def failed_ranks(failed: Sequence[RankState], report: bool) -> str:
    """Every failed rank of a keep-going job, a line per host and way of ending."""
    groups: Dict[Tuple[str, str, str], List[int]] = {}
    for r in failed:
        spec = r.spec
        job = f"job {spec.job} " if spec.job != 1 else ""
        name = spec.label or f"{job}rank"
        key = (name, spec.host.name, r.reason or how_ended(r.code, r.signal))
        groups.setdefault(key, []).append(spec.rank)
    lines = []
    for (name, host, what), ranks in groups.items():
        who = name if name != "rank" and not name.endswith(" rank") else \
            f"{name}{'s' if len(ranks) > 1 else ''} {_ranges(ranks)}"
        lines.append(f"    {who} on {host} {what}")
    if len(lines) > FAILED_LINES:
        more = len(lines) - FAILED_LINES + 1
        lines[FAILED_LINES - 1:] = [f"    ... and {more} more line(s)"
                                    + ("" if report else " (--report-json FILE has every rank)")]
    return "mslaunch: the failed ranks:\n" + "\n".join(lines)


#: In MindSpore's error when init() finds neither msrun's variables nor Open MPI's.
MINDSPORE_WANTS_MPIRUN = b"without using 'mpirun'"


def msrun_hint(hosts: Sequence[str], argv: Sequence[str]) -> str:
    """The msrun-dialect command line that starts this MindSpore script, whose
    ranks ran on ``hosts`` (a name per rank)."""
    import shlex
    words = list(argv[1:]) if argv and os.path.basename(argv[0]).startswith("python") \
        else list(argv)
    per_host: Dict[str, int] = {}
    for name in hosts:
        per_host[name] = per_host.get(name, 0) + 1
    counts = sorted(set(per_host.values()))
    local = str(counts[0]) if len(counts) == 1 else "N"
    line = (f"mslaunch: MindSpore wants its own launcher's variables: run it in msrun's "
            f"dialect, e.g. mslaunch --worker_num={len(hosts)} --local_worker_num={local} "
            f"{' '.join(shlex.quote(w) for w in words)}")
    if len(per_host) > 1:
        first = next(iter(per_host))
        line += (f" on each of the {len(per_host)} nodes, with --master_addr={first} and "
                 f"--node_rank=0..{len(per_host) - 1}")
        if len(counts) > 1:
            line += " (N: " + ", ".join(f"{n} on {h}" for h, n in per_host.items()) + ")"
    return line


def report_pid(view: Reported, where: str) -> None:
    """--report-pid: ``-`` stdout, ``+`` stderr, else a file."""
    text = f"{os.getpid()}\n"
    if where in ("-", "+"):
        view.console.write(1 if where == "-" else 2, view, text.encode())
        return
    try:
        with open(where, "w") as f:
            f.write(text)
    except OSError as err:
        raise LaunchError(f"--report-pid {where}: {err.strerror}") from None


def timed_out(view: Reported, live: List[RankState]) -> None:
    """What is said when ``--timeout`` ends the job (the stacks of
    ``--get-stack-traces`` are :mod:`mslaunch.inspect.stall`'s, printed after it)."""
    # One process with a name of its own (the Open MPI mode's mpirun) is named.
    what = live[0].spec.label if len(live) == 1 and live[0].spec.label else \
        f"{len(live)} rank(s)"
    if view.job.is_check:
        if view.job.timeout_left is None:       # (else the job's --timeout, said after)
            hosts = ", ".join(dict.fromkeys(r.spec.host.name for r in live))
            view.console.message(f"mslaunch: --health-check did not end within "
                                f"{view.job.timeout:g} s on {hosts}; stopping it there")
        return
    # (-q: no line, as Open MPI's; under Open MPI's own mpirun, which says nothing
    # of mslaunch's timeout, the job the supervisor sees is always quiet)
    quiet = view.job.quiet if view.job.line_quiet is None else view.job.line_quiet
    if not quiet:
        view.console.message(f"mslaunch: job timed out after {view.job.timeout:g} s "
                             f"({view.job.timeout_source}); terminating {what}; exit status "
                             f"{TIMEOUT_EXIT}")
    for line in view.mpi.hang_report() if view.mpi is not None else []:
        view.console.message(f"mslaunch: PMI: {line}")
    if view.job.report_state:
        _report_state(view)


def _report_state(view: Reported) -> None:
    from ..machine.stacks import state_report
    from ..plan.display import job_id
    rows = []
    for r in view.ranks:
        state = "RUNNING" if r.pid and not r.ended else ("TERMINATED" if r.ended
                                                         else "NOT STARTED")
        rows.append((r.spec.rank, r.spec.host.name, r.pid, state, r.code or 0))
    view.console.message(state_report(job_id(), rows, len(view.job.apps),
                                     view.mpi.reported() if view.mpi
                                     else 0).rstrip("\n"))


def rank_started(view: Reported, r: RankState) -> None:
    """--report-bindings (Open MPI's line, with the launcher's pid; none for a
    rank of --bind-to none) and -v's line for a rank that started."""
    spec, job = r.spec, view.job
    if job.report_bindings and (spec.cpus or job.bind_to != "none" or job.report_unbound):
        from ..plan.bindings import report_binding
        from ..core.cputopo import Topology
        topo = view.plan.topologies[spec.host.node_id] if view.plan.topologies else None
        text = report_binding(spec.rank, topo, spec.cpus) if isinstance(topo, Topology) else \
            f"MCW rank {spec.rank} bound to cpus {spec.cpus}"
        view.console.message(f"[{spec.host.name}:{os.getpid():05d}] {text}")
    if job.verbose:
        of_job = f" of job {spec.job}" if spec.job != 1 else ""
        who = spec.label or f"rank {spec.rank}{of_job}"
        view.console.message(f"mslaunch: started {who} (pid {r.pid}) "
                            f"on {spec.host.name}: {' '.join(spec.argv)}")


def restart(view: Reported, local: LocalRanks, r: RankState) -> bool:
    """msrun's recovery: start a failed process again, while restarts are left
    (``view.restarts`` per process); False when it is not."""
    if r.restarts >= view.restarts:
        r.reason = f"{how_ended(r.code, r.signal)}, after {r.restarts} restart(s) (the limit, --max_restarts)"
        return False
    r.restarts += 1
    r.last_end = how_ended(r.code, r.signal)
    if not view.job.quiet:
        view.console.message(f"mslaunch: {r.spec.label or 'rank ' + str(r.spec.rank)} "
                            f"{r.last_end}; starting it again ({r.restarts} of "
                            f"{view.restarts} restarts)")
    r.outputs = []
    r.code = r.signal = r.pmi_lost = None
    r.ended = False
    try:
        local.restart(r.spec.key)
    except LaunchError as err:
        r.ended = True
        r.reason = f"could not be started again: {err}"
        return False
    return True
