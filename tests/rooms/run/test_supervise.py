"""The supervisor's policy, in process, with stand-in rank handles.

The supervisor runs its real event loop, signal handling, timers and exit
status; only the ranks are stand-ins behind the rank-handle seam
(:class:`mslaunch.seams.RankHandle`), so each case takes a fraction of a
second.  Real processes are tested in test_local_jobs.py and test_remote.py.
"""

from __future__ import annotations

import os
import signal
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from standins import StandInGuard

from mslaunch.cli.mpirun import parse_args
from mslaunch.core.errors import HOST_LOST_EXIT, TIMEOUT_EXIT
from mslaunch.backends.backend import Backend
from mslaunch.run.attempt import build_plan
from mslaunch.backends.session import Session
from mslaunch.run.supervise import Supervisor
from mslaunch.machine.terminal import Console
from mslaunch.core.spec import replace
from mslaunch.seams import RankEvents


class StandInRanks:
    """Ranks that exist only as keys: they start with made-up pids, end when the
    test says so, and end at once on SIGTERM or SIGKILL unless told to ignore it."""

    def __init__(self, events: RankEvents, keys: Sequence[int], ignore_term: bool = False
                 ) -> None:
        self.events = events
        self.ranks = set(keys)
        self.running: set = set()
        self.signals: List[Tuple[int, Optional[Tuple[int, ...]]]] = []
        self.ignore_term = ignore_term
        self.released = False
        self.deadline: Optional[float] = None
        self.stdin_pipes: Dict[int, int] = {}

    @property
    def busy(self) -> bool:
        return bool(self.running)

    def start(self) -> None:
        for key in sorted(self.ranks):
            self.running.add(key)
            self.events.rank_started(key, 10000 + key)

    def signal(self, sig: int, ranks: Optional[Sequence[int]] = None) -> None:
        self.signals.append((sig, tuple(ranks) if ranks is not None else None))
        if sig == signal.SIGKILL or (sig == signal.SIGTERM and not self.ignore_term):
            for key in sorted(self.running & set(ranks if ranks is not None else self.ranks)):
                self.events.loop.call_later(0.01, lambda k=key: self.exit(k, None, sig))

    def exit(self, key: int, code: Optional[int], sig: Optional[int] = None) -> None:
        if key in self.running:
            self.running.discard(key)
            self.events.rank_exited(key, code, sig)

    def release(self) -> None:
        self.released = True

    def close(self, deadline: float) -> None:
        self.deadline = deadline

    def sent(self) -> List[int]:
        return [sig for sig, _ in self.signals]


class StandInBackend(Backend):
    """A way ranks start whose every rank is a stand-in (and some on stand-in hosts)."""

    def __init__(self, test: PolicyUnderTest, job, session, planning) -> None:
        super().__init__(job, {}, session, planning)
        self.test = test
        self.remote: Dict[str, StandInHost] = {}
        self.remote_hosts = StandInHosts(self.remote)

    def check(self, plan) -> None:
        pass

    def handles(self, view, here, pmi, pmi_env):
        test = self.test
        keys = [s.key for s in view.plan.ranks if not any(s.key in h.ranks
                                                           for h in self.remote.values())]
        test.stand_in = StandInRanks(view.events, keys, **test.stand_in_options)
        for when, key, code in test.script:
            view.loop.call_later(when, lambda k=key, c=code: test.stand_in.exit(k, c))
        for when, what in test.timed:
            view.loop.call_later(when, what)
        return [test.stand_in, *self.remote.values()]


class StandInHosts:
    """The stand-in remote hosts as the supervisor asks them (``seams.RemoteHosts``)."""

    def __init__(self, remote: Dict[str, StandInHost]) -> None:
        self.remote = remote
        self.left_out: Dict[str, str] = {}
        self.let_go_with: List[bool] = []
        self.stdin_asked = False

    @property
    def hosts(self):
        return dict(self.remote)

    def let_go(self, keep: bool) -> None:
        self.let_go_with.append(keep)

    def relay_stdin(self, local_pipes):
        self.stdin_asked = True          # once every rank started
        return None


class _Planned:
    def __init__(self, plan) -> None:
        self._plan = plan
        self.entries = ()

    def plan(self, topologies=None):
        return self._plan


class PolicyUnderTest(Supervisor):
    """A supervisor whose ranks are stand-ins (its backend's)."""

    def __init__(self, argv: Sequence[str], **kw) -> None:
        job = parse_args(["--mpi", "none", *argv, "true"], environ={}, cwd="/")
        null = os.open(os.devnull, os.O_WRONLY)
        self._null = null
        plan = build_plan(job, {})
        session = Session(StandInGuard(), Console(null, null))  # type: ignore[arg-type]
        self.backend_under_test = StandInBackend(self, job, session, _Planned(plan))
        super().__init__(job, plan, self.backend_under_test, session, **kw)
        self.script: List[Tuple[float, int, Optional[int]]] = []   # (when, key, code)
        self.timed: List[Tuple[float, Callable[[], object]]] = []  # (when, what), once started
        self.stand_in: Optional[StandInRanks] = None

    stand_in_options: Dict[str, object] = {}

    def run(self):
        try:
            return super().run()
        finally:
            os.close(self._null)


def test_the_first_failure_is_the_root_cause_and_stops_the_others():
    sup = PolicyUnderTest(["-n", "3"])
    sup.script = [(0.05, 1, 7), (0.10, 2, 9)]     # rank 2 fails after rank 1
    result = sup.run()
    assert result.exit_code == 7
    assert result.root_cause is not None and result.root_cause.rank == 1
    assert "rank 1 (pid 10001" in result.message and "exited with code 7" in result.message
    assert sup.stand_in.sent()[:2] == [signal.SIGCONT, signal.SIGTERM]
    assert not sup.stand_in.running and sup.stand_in.released


def test_a_clean_job_exits_zero_and_signals_nobody():
    sup = PolicyUnderTest(["-n", "2"])
    sup.script = [(0.02, 0, 0), (0.03, 1, 0)]
    result = sup.run()
    assert result.exit_code == 0 and result.message == ""
    assert sup.stand_in.signals == []


def test_a_rank_killed_by_a_signal_is_reported_with_its_name():
    sup = PolicyUnderTest(["-n", "2"])
    sup.timed = [(0.02, lambda: sup.stand_in.exit(0, None, signal.SIGSEGV))]
    result = sup.run()
    assert result.exit_code == 128 + signal.SIGSEGV
    assert "killed by signal 11 (SIGSEGV)" in result.message


def test_ranks_that_ignore_sigterm_get_sigkill_after_the_grace_period():
    sup = PolicyUnderTest(["-n", "2", "--timeout", "0.05"])
    sup.job = replace(sup.job, grace=0.1)
    sup.stand_in_options = {"ignore_term": True}
    result = sup.run()
    assert result.exit_code == TIMEOUT_EXIT
    sent = sup.stand_in.sent()
    assert sent[:2] == [signal.SIGCONT, signal.SIGTERM] and signal.SIGKILL in sent


def test_timeout_ends_the_job_with_status_110():
    sup = PolicyUnderTest(["-n", "2", "--timeout", "0.05"])
    result = sup.run()
    assert result.exit_code == TIMEOUT_EXIT == 110
    assert sup.ending == "timeout"
    assert sup.stand_in.sent()[:2] == [signal.SIGCONT, signal.SIGTERM]


def test_a_stop_signal_stops_the_ranks_and_exits_128_plus_it():
    sup = PolicyUnderTest(["-n", "2"])
    sup.timed = [(0.02, lambda: os.kill(os.getpid(), signal.SIGTERM))]
    result = sup.run()
    assert result.exit_code == 128 + signal.SIGTERM
    assert result.message == "mslaunch: stopped by SIGTERM"
    assert signal.SIGTERM in sup.stand_in.sent()
    # the launcher's own handlers are back
    assert signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, signal.default_int_handler) \
        or callable(signal.getsignal(signal.SIGTERM))


def test_other_signals_are_forwarded_to_every_rank():
    sup = PolicyUnderTest(["-n", "2"])
    sup.script = [(0.2, 0, 0), (0.2, 1, 0)]
    sup.timed = [(0.02, lambda: os.kill(os.getpid(), signal.SIGUSR1))]
    result = sup.run()
    assert result.exit_code == 0
    assert (signal.SIGUSR1, None) in sup.stand_in.signals


class StandInHost(StandInRanks):
    name = "h1"


def test_a_lost_host_fails_its_ranks_with_255_and_stops_the_rest():
    sup = PolicyUnderTest(["-n", "2"])
    # rank 1 lives on a remote host, behind the same seam
    host = StandInHost(sup.events, [1])
    sup.backend_under_test.remote["h1"] = host
    sup.timed = [(0.03, lambda: (host.running.clear(),
                                 sup.ranks_lost(host.ranks, "connection reset")))]
    result = sup.run()
    assert result.exit_code == HOST_LOST_EXIT == 255
    assert result.root_cause.rank == 1
    assert "was lost with its host: connection reset" in result.message
    assert sup.stand_in.sent()[:2] == [signal.SIGCONT, signal.SIGTERM]
    assert host.released and host.deadline is not None
    # the supervisor asked the backend's hosts: they are the job's, and let go
    assert sup.hosts == {"h1": host}
    assert sup.backend_under_test.remote_hosts.let_go_with == [False]
    assert sup.backend_under_test.remote_hosts.stdin_asked     # once all had started


class UnreportedHost(StandInHost):
    """A host lost before it reported its ranks' start: no pid is known."""

    def start(self) -> None:
        self.running.update(self.ranks)


def test_a_rank_lost_before_its_start_was_reported_is_named_without_a_pid():
    sup = PolicyUnderTest(["-n", "2"])
    host = UnreportedHost(sup.events, [1])
    sup.backend_under_test.remote["h1"] = host
    sup.timed = [(0.03, lambda: (host.running.clear(),
                                 sup.ranks_lost(host.ranks, "connection reset")))]
    result = sup.run()
    assert result.exit_code == HOST_LOST_EXIT
    assert "rank 1 (on " in result.message and \
        ", its start not reported) was lost with its host" in result.message, result.message
    assert "pid ?" not in result.message


def test_keep_going_reports_the_first_of_several_failures():
    # Open MPI's spelling: orte_abort_on_non_zero_status off
    sup = PolicyUnderTest(["-n", "3", "--mca", "orte_abort_on_non_zero_status", "0"])
    sup.script = [(0.02, 0, 3), (0.04, 1, 4), (0.06, 2, 0)]
    result = sup.run()
    assert result.exit_code == 3
    assert "2 of 3 rank(s) failed; first: rank 0" in result.message
    assert sup.stand_in.signals == []
