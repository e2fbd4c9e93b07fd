"""When a rank's PMI connection closed before MPI_Finalize (mslaunch.serve.mpijobs):
the failure is dated when the loss was first seen, not when its exit was reported
(on a busy host that can come after the job's stop, which would hide the cause)."""

from __future__ import annotations

from mslaunch.rankbook import Rank
from mslaunch.serve.mpijobs import MPIJobs


class Spec:
    def __init__(self, key):
        self.key = key
        self.rank = key
        self.job = 1


class StandIn:
    """The supervisor's side that MPIJobs uses here: its ranks, ``fail`` and the loop."""

    def __init__(self, n):
        self.ranks = [Rank(Spec(k)) for k in range(n)]   # type: ignore[arg-type]
        self.failed = []
        self.later = []
        self.loop = self

    def call_later(self, delay, fn):
        self.later.append(fn)

    def fail(self, rank, reason, code, *, abort, at=None, **_):
        self.failed.append((rank.spec.key, reason, code, at))


def test_a_loss_is_dated_when_it_was_seen_though_its_exit_is_reported_later():
    sup = StandIn(2)
    jobs = MPIJobs(sup)                                  # type: ignore[arg-type]
    jobs.pmi_lost(1, 100.0)                              # before the rank's exit is read
    assert sup.ranks[1].pmi_lost == 100.0 and not sup.failed
    r = sup.ranks[1]
    r.ended, r.code, r.end = True, 0, 100.4              # its host reported the exit late
    jobs.check_lost(r)
    assert sup.failed == [(1, "exited without MPI_Finalize (its PMI connection closed "
                              "early)", 1, 100.0)]
    sup.later[0]()                                       # the settle's own look: the same time
    assert sup.failed[-1][3] == 100.0


def test_the_earliest_sight_of_a_loss_is_kept():
    sup = StandIn(1)
    jobs = MPIJobs(sup)                                  # type: ignore[arg-type]
    jobs.pmi_lost(0, 50.2)
    jobs.pmi_lost(0, 50.0)
    jobs.pmi_lost(0, 50.1)
    assert sup.ranks[0].pmi_lost == 50.0
    r = sup.ranks[0]
    r.ended, r.code, r.end = True, 0, 49.9               # an end seen before: that time
    jobs.check_lost(r)
    assert sup.failed[-1][3] == 49.9


def test_a_rank_that_failed_in_its_own_right_is_not_failed_again():
    sup = StandIn(1)
    jobs = MPIJobs(sup)                                  # type: ignore[arg-type]
    jobs.pmi_lost(0, 10.0)
    r = sup.ranks[0]
    r.ended, r.code, r.end = True, 3, 10.1
    jobs.check_lost(r)
    assert sup.failed == []


def test_the_settles_look_is_not_a_later_runs():
    """A rank started again (msrun's restarts) before the settle's look: that look
    belongs to its run before, which was judged already by its exit."""
    sup = StandIn(1)
    jobs = MPIJobs(sup)                                  # type: ignore[arg-type]
    jobs.pmi_lost(0, 10.0)
    r = sup.ranks[0]
    r.restarts, r.pmi_lost = 1, None                     # as run/report.py's restart leaves it
    sup.later[0]()
    assert sup.failed == []
