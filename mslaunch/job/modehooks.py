"""The hooks of a mode that needs none of the supervisor's notices.

A base for :class:`~.seams.ModeHooks` whose mode only brings its own handle
(the Open MPI mode's mpirun, ``--launcher srun``'s step): no restarts, and
nothing to do when processes start, fail or end.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict


class QuietHooks:
    """See the module docstring; a subclass gives ``local_handle``."""

    restarts = 0
    takes_all = False        # its handle starts only this machine's processes

    def started(self, pids: Dict[str, int]) -> None:
        pass

    def failed(self, code: int, message: str) -> None:
        pass

    def finished(self, code: int) -> None:
        pass
