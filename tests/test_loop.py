"""The event loop's pause of a reader, and make_room, the listeners' admission rule."""

from __future__ import annotations

import os
import time

from mslaunch.run.loop import Loop, make_room


def _run_for(loop: Loop, seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        loop.run_once(0.01)


def test_a_paused_reader_is_read_again_after_the_pause():
    loop = Loop()
    r, w = os.pipe()
    calls = []
    try:
        loop.add_reader(r, lambda: calls.append(os.read(r, 10)))
        os.write(w, b"x")
        loop.pause_reader(r, 0.2)
        _run_for(loop, 0.1)
        assert calls == []
        _run_for(loop, 0.3)
        assert calls == [b"x"]
    finally:
        loop.close()
        os.close(r)
        os.close(w)


def test_a_reader_forgotten_or_replaced_during_its_pause_stays_so():
    loop = Loop()
    r, w = os.pipe()
    calls = []
    try:
        os.write(w, b"x")
        loop.add_reader(r, lambda: calls.append("old"))
        loop.pause_reader(r, 0.05)
        loop.forget(r)
        _run_for(loop, 0.2)
        assert calls == []
        loop.add_reader(r, lambda: calls.append("old"))
        loop.pause_reader(r, 0.05)
        loop.add_reader(r, lambda: (calls.append("new"), loop.remove_reader(r)))
        _run_for(loop, 0.2)
        assert calls == ["new"]
    finally:
        loop.close()
        os.close(r)
        os.close(w)


class _Conn:
    def __init__(self, age: float) -> None:
        self.accepted = time.monotonic() - age


def test_make_room_pushes_out_only_strangers_that_had_their_time():
    held = {i: _Conn(age) for i, age in enumerate([5.0, 1.0, 0.01])}
    dropped = []

    def drop(c: _Conn) -> None:
        key = next(k for k, v in held.items() if v is c)
        dropped.append(key)
        del held[key]

    assert make_room(held.values, 4, drop, grace=0.5) == 0.0 and dropped == []
    assert make_room(held.values, 2, drop, grace=0.5) == 0.0 and dropped == [0, 1]
    wait = make_room(held.values, 1, drop, grace=0.5)
    assert 0.4 < wait <= 0.5 and dropped == [0, 1] and list(held) == [2]
