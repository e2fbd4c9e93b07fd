"""A rank on its way out when the launcher's stop reaches its host
(mslaunch.serve.agentpmi): its end is dated before the stop, however late its exit
(or the PMIx library's sight of its lost connection) is read on a busy host."""

from __future__ import annotations

import os
import subprocess
import sys

from mslaunch.serve.agentpmi import AgentPMI


class Proc:
    def __init__(self, pid):
        self.pid = pid


class Local:
    def __init__(self, pids):
        self.ranks = {key: type("R", (), {"proc": Proc(pid)})() for key, pid in pids.items()}


def test_a_rank_exiting_when_the_stop_came_ended_before_it():
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    live = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                            stdin=subprocess.PIPE)
    try:
        # the first one exits, unreaped (a zombie: exiting), before the stop
        os.waitid(os.P_PID, gone.pid, os.WEXITED | os.WNOWAIT)
        pmi = AgentPMI(None, None, lambda job: None)     # type: ignore[arg-type]
        pmi.local = Local({0: gone.pid, 1: live.pid})   # type: ignore[assignment]
        assert pmi.before_stop(0, 5.0) == 5.0            # no stop yet: as read
        pmi.stopping([gone.pid, live.pid])
        stop = pmi.stop_at
        assert stop is not None
        assert pmi.before_stop(0, stop + 0.5) < stop     # read after the stop, ended before
        assert pmi.before_stop(0, stop - 1.0) == stop - 1.0
        assert pmi.before_stop(1, stop + 0.5) == stop + 0.5   # still running: as read
    finally:
        live.stdin.close()                               # type: ignore[union-attr]
        live.wait()
        gone.wait()
