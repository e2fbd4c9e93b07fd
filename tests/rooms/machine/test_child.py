"""The process-handle base of mpirun's and srun's rank handles, on real processes:
a session of its own, its end seen through the loop and reaped once, its end
forced (SIGTERM, then SIGKILL to its group at the deadline), its pipes finished,
and nothing signalled once it is reaped."""

from __future__ import annotations

import os
import signal
import time

import pytest

from mslaunch.machine.child import ProcessHandle
from mslaunch.machine.loop import Loop
from mslaunch.machine.output import RankPipe


class _Sink:
    tail = pending = b""
    wanted = True
    congested = False

    def __init__(self) -> None:
        self.data = bytearray()
        self.finished = False

    def wait_for_room(self, source) -> None:
        source.resume()

    def feed(self, data) -> None:
        self.data += bytes(data)

    def finish(self) -> None:
        self.finished = True


class _Shell(ProcessHandle):
    """``sh -c SCRIPT``, its stdout and stderr into one pipe."""

    def __init__(self, loop: Loop, script: str, cwd=None) -> None:
        super().__init__(loop)
        self.ended = None
        self.sink = _Sink()
        r, w = os.pipe()
        try:
            pid = self._spawn("/bin/sh", ["sh", "-c", script], dict(os.environ), cwd=cwd,
                              out=(w, w))
        finally:
            os.close(w)
        self._watch(pid, None)
        self.pipes = [RankPipe(loop, r, self.sink)]

    def _on_exit(self) -> None:
        self._forget_pidfd()
        self._reap(block=True)
        self.ended = self.ended_as


def _run(loop: Loop, done, limit: float = 60.0) -> None:
    end = time.monotonic() + limit
    while not done():
        assert time.monotonic() < end, "the event never came"
        loop.run_once(0.05)


def _gone(pid: int) -> bool:
    """Whether ``pid`` has ended (a zombie waiting for its reaper counts)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.fixture
def loop():
    loop = Loop()
    yield loop
    loop.close()


def test_the_process_runs_in_a_session_and_directory_of_its_own_and_its_end_is_reported(
        loop, tmp_path):
    h = _Shell(loop, 'echo "$(cut -d" " -f6 /proc/$$/stat) $$ $(pwd)"; exit 3',
               cwd=str(tmp_path))
    _run(loop, lambda: h.ended is not None and not h.busy)
    assert h.ended == (3, None)
    session, pid, cwd = h.sink.data.decode().split()
    assert int(session) == int(pid) == h.pid
    assert cwd == str(tmp_path) and os.getcwd() != str(tmp_path)
    assert h.sink.finished and h.pidfd == -1


def test_a_process_deaf_to_sigterm_and_its_group_are_killed_at_the_deadline(loop):
    h = _Shell(loop, "trap '' TERM; sleep 600 & echo $!; wait")
    _run(loop, lambda: b"\n" in h.sink.data)
    child = int(h.sink.data.split()[0])
    began = time.monotonic()
    h._end(began + 0.5)
    assert h.ended_as == (None, signal.SIGKILL)
    assert time.monotonic() - began >= 0.5        # SIGTERM was given its time
    end = time.monotonic() + 30
    while not _gone(child):
        assert time.monotonic() < end, "the group's other process survived"
        loop.run_once(0.05)
    h._finish_pipes()
    assert h.sink.finished and not h.busy


def test_a_process_that_heeds_sigterm_ends_before_its_deadline(loop):
    h = _Shell(loop, "exec sleep 600")
    h._end(time.monotonic() + 60)       # SIGKILL, should SIGTERM not end it by then
    assert h.ended_as == (None, signal.SIGTERM)
    h._finish_pipes()
    assert not h.busy


def test_nothing_is_signalled_once_the_process_is_reaped(loop):
    h = _Shell(loop, "exit 0")
    _run(loop, lambda: h.ended is not None)
    # As if its pid were taken again: by another process, leading its own group.
    other = ProcessHandle._spawn("/bin/sleep", ["sleep", "600"], {})
    try:
        h.pid = other
        h._kill(signal.SIGKILL)
        h._kill(signal.SIGKILL, group=True)
        assert os.waitpid(other, os.WNOHANG) == (0, 0), "the other process was signalled"
    finally:
        os.kill(other, signal.SIGKILL)
        os.waitpid(other, 0)
    assert h.ended == (0, None)
    h._finish_pipes()


def test_a_program_that_cannot_start_raises(loop, tmp_path):
    with pytest.raises(FileNotFoundError):
        ProcessHandle._spawn(str(tmp_path / "none"), ["none"], {})
    with pytest.raises(FileNotFoundError):
        ProcessHandle._spawn(str(tmp_path / "none"), ["none"], {}, cwd="/")
