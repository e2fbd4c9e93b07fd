"""mslaunch.machine.cgroups (Outside): when the launcher leaves its job's cgroup and when it
comes back, with a move that notes what it was asked (the cgroup itself is in
tests/system/local/test_cgroup_outside.py)."""

from __future__ import annotations

import os
import threading
from typing import List, Tuple

from helpers import wait_for
from mslaunch.machine import cgroups as outside
from mslaunch.machine.cgroups import Outside


class Moves:
    """A move that notes each call, and can be held until let go."""

    def __init__(self) -> None:
        self.calls: List[Tuple[int, bool]] = []
        self.entered = threading.Event()
        self.go = threading.Event()
        self.go.set()

    def __call__(self, pid: int, into: bool) -> bool:
        self.entered.set()
        self.go.wait(30)
        self.calls.append((pid, into))
        return True


def _settled(o: Outside) -> None:
    """Once the thread asked to move out has done what it would."""
    assert wait_for(lambda: not o.pending, 30)


def _out(moves: Moves) -> Outside:
    """An Outside whose launcher has left."""
    o = Outside(moves)
    o.leave()
    moves.entered.wait(30)
    _settled(o)
    assert o.out and moves.calls == [(os.getpid(), False)]
    return o


def test_a_start_after_the_move_out_comes_back_first():
    moves = Moves()
    o = _out(moves)
    outside._current = o
    try:
        outside._before_start("os.posix_spawn", ())
    finally:
        outside._current = None
    assert not o.out and moves.calls == [(os.getpid(), False), (os.getpid(), True)]


def test_no_move_out_is_made_beside_a_start_on_another_thread():
    moves = Moves()
    o = Outside(moves)
    o.enter_start()              # a start being made elsewhere
    o.leave()
    _settled(o)
    assert not o.out and moves.calls == []     # not out beside it
    o.end_start()


def test_a_start_during_the_move_out_waits_for_it_and_undoes_it():
    moves = Moves()
    moves.go.clear()
    o = Outside(moves)
    o.leave()
    assert moves.entered.wait(30)                 # the move out is under way
    started = threading.Event()

    def start() -> None:
        o.enter_start()
        started.set()
    t = threading.Thread(target=start)
    t.start()
    assert not started.wait(0.2)                  # held until the move out is made
    moves.go.set()
    t.join(30)
    assert started.is_set() and not o.out
    assert [into for _, into in moves.calls] == [False, True]
    o.end_start()


def test_once_the_cgroup_is_to_go_nothing_moves():
    moves = Moves()
    o = _out(moves)
    assert o.stay_out() is True
    o.back()
    o.leave()
    assert moves.calls == [(os.getpid(), False)]


def test_a_fork_of_the_launcher_forgets_it():
    moves = Moves()
    o = Outside(moves)
    saved = outside._current
    try:
        outside._watch(o)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.write(w, b"none" if outside._current is None else b"kept")
            os._exit(0)
        os.close(w)
        said = os.read(r, 16)
        os.close(r)
        os.waitpid(pid, 0)
        assert said == b"none"
    finally:
        outside._current = saved
