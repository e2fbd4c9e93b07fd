"""Which failure is a job's cause (mslaunch.run.failures) and the clock offset of a
link (mslaunch.backends.agents.host.clock_offset): the pure rules; the real jobs that need
them are in tests/system/openmpi/test_pmix.py (a death and a peer's abort on two hosts)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from mslaunch.run.failures import VICTIM_WINDOW, Failures
from mslaunch.backends.agents.host import clock_offset


class R:
    def __init__(self, n, signal=None):
        self.n = n
        self.signal = signal


def test_the_earliest_failure_is_the_cause_whatever_the_order_of_reports():
    a, b, c = R(0), R(1), R(2)
    f = Failures()
    f.note(a, 14, 10.008, True, abort=True)      # a peer's abort, reported first
    f.stopped(10.009)
    f.note(b, 137, 10.001, True)                 # the death, reported later
    f.note(c, 143, 10.020, True, stop_reached=10.010)   # after the stop: its doing
    assert (f.root, f.root_code, f.root_at) == (b, 137, 10.001)
    assert [(round(after, 3), r) for after, r in f.followed()] == [(0.007, a)]


def test_an_abort_just_before_a_death_is_the_deaths_victim():
    dead, peer = R(1), R(3)
    f = Failures()
    f.note(peer, 14, 5.000, True, abort=True)
    f.note(dead, 137, 5.000 + VICTIM_WINDOW / 2, True)
    assert f.root is dead and f.root_code == 137
    assert f.followed()[0][1] is peer and f.followed()[0][0] < 0


def test_an_abort_long_before_a_death_is_the_cause():
    first, later = R(1), R(3)
    f = Failures()
    f.note(first, 7, 5.0, True, abort=True)
    f.note(later, 137, 5.0 + VICTIM_WINDOW * 2, True)
    assert f.root is first and f.root_code == 7


def test_a_death_its_host_saw_late_is_the_cause_of_an_abort_before_it():
    """Seen after the stop was sent and before the stop reached its host: its agent
    was not running, so its time says only that it came before the stop."""
    dead, peer = R(1), R(3)
    f = Failures()
    f.note(peer, 14, 5.0, True, abort=True)
    f.stopped(5.001)
    f.note(dead, 1, 5.0 + VICTIM_WINDOW * 3, True, stop_reached=None)
    assert f.root is dead and f.root_code == 1
    seen_after_the_stop = Failures()
    seen_after_the_stop.note(peer, 14, 5.0, True, abort=True)
    seen_after_the_stop.stopped(5.001)
    seen_after_the_stop.note(dead, 137, 5.0 + VICTIM_WINDOW * 3, True,
                             stop_reached=5.0 + VICTIM_WINDOW * 4)
    assert seen_after_the_stop.root is peer and seen_after_the_stop.root_code == 14


def test_a_host_noticed_lost_after_the_stop_is_not_the_cause_of_an_abort_before_it():
    """A lost host's time is when its loss was noticed (seconds after its last
    sign of life, for a cut link): never a late sight of an earlier end."""
    aborter, lost = R(1), R(3)
    f = Failures()
    f.note(aborter, 14, 5.0, True, abort=True)
    f.stopped(5.001)
    f.note(lost, 255, 5.0 + VICTIM_WINDOW * 8, True, lost=True)
    assert f.root is aborter and f.root_code == 14
    assert [r for _, r in f.followed()] == [lost]
    just_after = Failures()                       # a loss its abort reacted to
    just_after.note(aborter, 14, 5.0, True, abort=True)
    just_after.note(lost, 255, 5.0 + VICTIM_WINDOW / 2, True, lost=True)
    assert just_after.root is lost


def test_a_ranks_end_after_its_own_abort_is_that_abort():
    aborter, victim = R(1), R(3)
    f = Failures()
    f.note(aborter, 7, 1.000, True, abort=True)
    f.note(aborter, 7, 1.002, True)                # its exit after MPI_Abort
    f.note(victim, 14, 1.001, True, abort=True)
    assert f.root is aborter and f.root_code == 7


def test_failures_after_the_stop_reached_their_host_are_not_noted():
    a, b = R(0), R(1)
    f = Failures()
    f.note(a, 1, 2.0, True)
    f.note(b, 143, 2.5, True, stop_reached=2.4)
    assert f.followed() == []


def test_a_death_by_a_signal_the_stop_had_not_sent_is_seen_late_not_caused():
    """Killed (SIGKILL) before the stop, its host's agent saw it only after the stop
    reached it: still the cause; one killed by the stop's SIGTERM is not noted."""
    victim, dead, stopped = R(3), R(1, signal=9), R(0, signal=15)
    f = Failures()
    f.note(victim, 14, 7.000, True, abort=True)
    f.stopped(7.001)
    f.note(dead, 137, 7.010, True, stop_reached=7.002, grace=5.0)
    f.note(stopped, 143, 7.011, True, stop_reached=7.002, grace=5.0)
    assert f.root is dead and [r for _, r in f.followed()] == [victim]
    late = Failures()
    late.note(R(2, signal=9), 137, 20.0, True, stop_reached=7.002, grace=5.0)  # the stop's
    assert late.root is None


def test_failures_that_cannot_end_the_job_are_named_but_not_the_cause():
    a, b = R(0), R(1)
    f = Failures()
    f.note(a, 0, 1.0, False)
    f.note(b, 3, 2.0, True)
    assert f.root is b and [r for _, r in f.followed()] == [a]


@given(st.floats(-1e4, 1e4), st.floats(0, 5), st.floats(0, 5), st.floats(0, 5),
       st.floats(0, 0.5))
def test_the_offset_is_within_what_the_exchange_proves(offset, there, work, back_way, t0):
    sent = 1.7e9 + t0
    got = sent + there + offset
    replied = got + work
    back = replied - offset + back_way
    found = clock_offset(sent, [got, replied], back)
    assert replied - back - 1e-6 <= found <= got - sent + 1e-6
    assert abs(found - offset) <= there + back_way + 1e-6


@given(st.floats(0, 5), st.floats(0, 5), st.floats(0, 5), st.floats(0, 0.5))
def test_clocks_that_agree_give_no_offset_whatever_the_ways_took(there, work, back_way, t0):
    sent = 1.7e9 + t0
    got = sent + there
    replied = got + work
    assert clock_offset(sent, [got, replied], replied + back_way) == 0.0


@given(st.floats(0.001, 1e4), st.floats(0, 0.01))
def test_a_clock_far_ahead_or_behind_is_corrected_to_within_the_round_trip(offset, way):
    for sign in (1, -1):
        sent = 1.7e9
        got = sent + way + sign * offset
        back = got - sign * offset + way
        assert abs(clock_offset(sent, [got, got], back) - sign * offset) <= 2 * way + 1e-6


@given(st.one_of(st.none(), st.integers(), st.text(),
                 st.lists(st.floats(), max_size=3).filter(
                     lambda ts: len(ts) != 2 or not all(0 < t < 1e11 for t in ts)),
                 st.lists(st.booleans(), min_size=2, max_size=2)))
def test_an_answer_that_is_not_two_times_gives_no_offset(clock):
    assert clock_offset(1.7e9, clock, 1.7e9 + 1) == 0.0


def test_a_death_by_sigpipe_is_the_victim_of_a_death_just_after_it():
    """A rank that writes to a dead peer dies of SIGPIPE; its host may see both
    ends in one wake-up, stamped alike or in either order."""
    import signal
    writer, dead = R(0, signal.SIGPIPE), R(1, signal.SIGSEGV)
    for at in (5.000, 5.000 + VICTIM_WINDOW / 2):
        f = Failures()
        f.note(writer, 141, 5.000, True)
        f.note(dead, 139, at, True)
        assert f.root is dead and f.root_code == 139
    alone = Failures()                   # | head: the broken pipe is the only news
    alone.note(writer, 141, 5.0, True)
    assert alone.root is writer
