"""The SSH link's copying threads (``starters/ssh/channel.py``): each joins
another, so each starts after the one it joins.  A link that ended at once
(an agent gone right after its HELLO) reached a join before that thread's
start, and the launcher said "internal error in ssh-up-h1: RuntimeError:
cannot join thread before it is started" (seen once in the suite)."""

from __future__ import annotations

import threading
import time
from typing import List

from mslaunch.backends.agents.starters.ssh import channel


class _EndedChannel:
    """An SSH channel whose agent is gone: every read ends at once."""

    def recv(self, size: int) -> bytes:
        return b""

    def recv_stderr(self, size: int) -> bytes:
        return b""

    def sendall(self, data: bytes) -> None:
        raise OSError("closed")

    def shutdown_write(self) -> None:
        pass

    def close(self) -> None:
        pass


class _Transport:
    def close(self) -> None:
        pass


def test_a_link_that_ends_at_once_joins_no_thread_before_its_start(monkeypatch):
    raised: List[BaseException] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: raised.append(args.exc_value))
    real_start = threading.Thread.start

    def start(thread: threading.Thread) -> None:
        # The stderr thread starts only once a copy up already running (the
        # order that raised) has ended: the widest window, without a sleep.
        if thread.name.startswith("ssh-err-"):
            for other in threading.enumerate():
                if other.name.startswith("ssh-up-"):
                    other.join(10)
        real_start(thread)

    monkeypatch.setattr(threading.Thread, "start", start)
    conn = channel.SSHAgentConnection("x", _Transport(), _EndedChannel(), b"", {})
    try:
        assert conn.wait_exit(time.monotonic() + 10)      # (a deadline, not a timeout)
    finally:
        conn.close(wait=5)
    assert raised == [], raised
