"""Ctrl-Z of the launcher (SIGTSTP), as under mpirun and Hydra: the ranks get it
too, and the launcher stops itself once the remote hosts' agents have heard it
(so that they take its silence for a pause, not a loss), or after
:data:`~mslaunch.core.switches.PAUSE_PATIENCE` seconds: a net for a host lost
meanwhile.  At SIGCONT (``fg``, ``bg``) the ranks are continued."""

from __future__ import annotations

import os

from ..core import signal
from ..core.switches import PAUSE_PATIENCE

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Set

    from ..machine.loop import Loop


class Pause:
    """One Ctrl-Z: ``waiting`` are the hosts yet to hear it; ``signal_all`` signals
    every rank."""

    def __init__(self, loop: Loop, waiting: Set[str],
                 signal_all: Callable[[int], None]) -> None:
        self.waiting, self.signal_all = waiting, signal_all
        self.done = False
        if waiting:
            loop.call_later(PAUSE_PATIENCE, self.stop)
        else:
            self.stop()

    def heard(self, name: str) -> None:
        """A host's agent heard that the launcher stops."""
        self.waiting.discard(name)
        if not self.waiting:
            self.stop()

    def stop(self) -> None:
        if self.done:
            return
        self.done = True
        os.kill(os.getpid(), signal.SIGSTOP)
        self.signal_all(signal.SIGCONT)        # (here again after SIGCONT)
