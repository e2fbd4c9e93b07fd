"""The supervisor's bookkeeping of one rank: what it is, how it ended, when it wrote."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import List, Optional

    from .machine.output import RankOutput

from .core.spec import RankResult, RankSpec


class Rank:
    """Mutable bookkeeping of one rank."""

    __slots__ = ("spec", "pid", "outputs", "code", "signal", "reason", "ended", "pmi_lost",
                 "discarded", "restarts", "last_end", "start", "end", "started_at",
                 "ended_at", "written", "last_output")

    def __init__(self, spec: RankSpec) -> None:
        self.spec = spec
        self.pid = 0
        self.outputs: List[RankOutput] = []
        self.code: Optional[int] = None
        self.signal: Optional[int] = None
        self.reason = ""
        self.ended = False
        self.pmi_lost: Optional[float] = None   # when it left PMI unfinalized
        self.discarded = False    # of a spawn that failed: stopped, not a failure
        self.restarts = 0         # times started again (msrun's recovery)
        self.last_end = ""        # how the previous run ended, for the log's marker
        self.start: Optional[float] = None   # wall clock, for the job report
        self.end: Optional[float] = None     # (set where it is seen to end)
        self.started_at = self.ended_at = 0.0   # monotonic (mslaunch-top's timeline)
        self.written = 0          # output bytes, and when they last grew (see _note_output)
        self.last_output: Optional[float] = None

    @property
    def failed(self) -> bool:
        return self.signal is not None or bool(self.code) or bool(self.reason)

    @property
    def tail(self) -> bytes:
        return self.outputs[-1].tail if self.outputs else b""

    def result(self) -> RankResult:
        s = self.spec
        return RankResult(rank=s.rank, host=s.host.name, pid=self.pid, returncode=self.code,
                          signal=self.signal, reason=self.reason, stderr_tail=self.tail,
                          name=s.label or f"rank {s.rank}", job=s.job, start=self.start,
                          end=self.end, restarts=self.restarts)
