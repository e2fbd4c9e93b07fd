"""Looking inside a running job, as the supervisor does it: the control socket
(``mslaunch-stacks``, ``mslaunch-top``; see :mod:`mslaunch.inspect.control`), the stall watch
(``--stall-report``; see :mod:`mslaunch.inspect.stall`) and when each rank last wrote output.

A base class of :class:`~.supervise.Supervisor`, which owns the state it uses.  The
looks see the job through :class:`~.lent.Looked` alone; :mod:`mslaunch.inspect` is
imported only when a job is looked at.
"""

from __future__ import annotations

import os
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, List, Optional, Tuple

    from ..machine.loop import Loop
    from ..core.spec import JobSpec
    from ..core.states import Ending
    from ..inspect.control import Inspector
    from ..inspect.stall import StallWatch
    from ..rankbook import Rank

from ..core.states import STALL

#: Seconds between looks at how much each rank has written (see _note_output).
OUTPUT_EVERY = 2.0


class LookingInside:
    """The supervisor's part that serves looks at the job while it runs."""

    job: JobSpec
    loop: Loop
    ranks: List[Rank]
    ending: Optional[Ending]
    control: Optional[Tuple[Any, str]]
    dumps: Optional[str]
    inspector: Optional[Inspector]
    stall: Optional[StallWatch]

    def _control_ready(self) -> None:
        if self.inspector is None:
            from ..inspect.control import Inspector
            from .lent import Looked
            self.inspector = Inspector(Looked(self), self.control[0], self.dumps)  # type: ignore[index, arg-type]
        self.inspector.accept()

    def _watch_stall(self) -> None:
        if self.ending is None:
            from ..inspect.stall import StallWatch
            from .lent import Looked
            self.stall = StallWatch(Looked(self), self.job.stall_report,  # type: ignore[arg-type]
                                    self.job.stall_exit)

    def _note_output(self) -> None:
        """When each rank last wrote output (mslaunch-top, --stall-report), to a few seconds."""
        now = time.monotonic()
        for r in self.ranks:
            written = sum(o.written for o in r.outputs)
            if written != r.written or r.last_output is None:
                r.written, r.last_output = written, now
        self.loop.call_later(OUTPUT_EVERY, self._note_output)

    def look_here(self, timeout: float, reply: Callable[[List[Any]], None]) -> None:
        """This node's workers' stacks as rows, for another node that asked."""
        from ..inspect.control import gather
        from ..inspect.stacktree import row
        from .lent import Looked
        gather(Looked(self), timeout, None,  # type: ignore[arg-type]
               lambda stacks: reply([row(s) for s in stacks]), here_only=True)

    def _terminate(self) -> None:
        raise NotImplementedError      # the supervisor's

    def _tell_cluster(self, code: int, message: str) -> None:
        raise NotImplementedError      # the supervisor's

    def _end_as(self, ending: Ending) -> bool:
        raise NotImplementedError      # the supervisor's

    def end_stalled(self) -> None:
        """``--stall-exit``: the stall report was printed; end the job (on every
        node of a job of one command per node: a failure, which restarts it)."""
        if self._end_as(STALL):
            from ..core.errors import STALL_EXIT
            self._tell_cluster(STALL_EXIT, f"the workers on {os.uname().nodename} stalled "
                                           f"(--stall-exit)")
            self._terminate()

    def _close_control(self) -> None:
        if self.control is not None:
            self.loop.forget(self.control[0].fileno())
            if self.inspector is not None:
                self.inspector.close()
            self.control[0].close()
            try:
                # (its directory, and the ranks' dumps', the guard's watchdog removes
                # once the job is over: see Watchdog.private)
                os.unlink(self.control[1])
            except OSError:
                pass
        if self.dumps is not None:
            from ..machine.pydump import forget_dumps
            forget_dumps(self.dumps)
