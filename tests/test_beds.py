"""netbed's Bed and BedPool, with beds that build nothing."""

from __future__ import annotations

import pytest

import netbed


class _Bed(netbed.Bed):
    log: list = []

    def __init__(self, name: str, fail: bool = False) -> None:
        super().__init__()
        self.dir, self.fail = name, fail

    def _check(self, *args) -> None:
        if self._started:
            raise RuntimeError("started once")

    def _build(self, *args) -> None:
        self.log.append(("build", self.dir))
        if self.fail:
            raise OSError("no such thing")

    def _teardown(self) -> None:
        self.log.append(("stop", self.dir))


def test_a_bed_that_fails_to_build_is_taken_down_and_with_stops_it():
    _Bed.log = []
    with pytest.raises(OSError):
        _Bed("a", fail=True).start()
    assert _Bed.log == [("build", "a"), ("stop", "a")]
    with _Bed("b") as bed:
        assert bed.running
    assert not bed.running and _Bed.log[-2:] == [("build", "b"), ("stop", "b")]
    bed.stop()                          # idempotent
    assert _Bed.log[-1] == ("stop", "b")


def test_beds_still_up_at_exit_stop_last_started_first():
    _Bed.log = []
    first, second = _Bed("owner").start(), _Bed("borrower").start()
    netbed._stop_all_live()
    assert _Bed.log[-2:] == [("stop", "borrower"), ("stop", "owner")]
    assert not first.running and not second.running


def test_a_pool_remembers_a_failure_and_raises_it_afresh():
    made = []

    def build(name: str, fail: bool = False) -> _Bed:
        made.append(name)
        if fail:
            pytest.fail(f"cannot build {name}", pytrace=False)
        return _Bed(name).start()
    pool = netbed.BedPool(build)
    first = second = None
    for _ in range(2):
        try:
            pool.get("k", "x", fail=True)
        except pytest.fail.Exception as e:
            first, second = second, e
    assert made == ["x"]                                 # built once
    assert first is not second and str(first) == str(second) == "cannot build x"
    shared = pool.get("ok", "y")
    assert pool.get("ok", "y") is shared and pool.new("z") is not shared
    assert [b.dir for b in pool.beds] == ["y", "z"]
    pool.close()
    assert not pool.beds
