"""An agent's answers to the launcher's looks inside the job: stacks and usage.

The launcher sends ``STACKS`` (``{"id", "timeout", "main"}``) and ``TOP`` (``{"id"}``)
frames; the agent reads its ranks' stacks in a thread of its own (see
:func:`mslaunch.machine.stacks.read`), so heartbeats, output and PMI go on
meanwhile, and answers on the same kind with ``{"id", "ranks": {key: ...}}``.
Python ranks get the hook that lets them dump their own stacks (see
:mod:`mslaunch.machine.pydump`) in a private directory of this agent's,
removed at its end and by its guard.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, Optional, Tuple

    from ..machine.loop import Loop
    from ..wire.endpoint import Endpoint
    from ..wire.frames import Look

from ..wire import frames, link

def same_as_earlier(rows: Dict[int, Any]) -> Dict[int, Any]:
    """Merged on the host before they are sent: a rank whose threads are those of
    an earlier rank says so (``"threads_of": key``) instead of repeating them."""
    seen: Dict[Any, int] = {}
    out: Dict[int, Any] = {}
    for key, row in rows.items():
        threads = row.get("threads")
        same = tuple(tuple(t) for t in threads) if threads else None
        if same is not None and same in seen:
            row = {k: v for k, v in row.items() if k != "threads"}
            row["threads_of"] = seen[same]
        elif same is not None:
            seen[same] = key
        out[key] = row
    return out


class AgentLook:
    """Answers ``STACKS`` and ``TOP`` frames for one agent."""

    def __init__(self, loop: Loop, endpoint: Endpoint) -> None:
        self.loop = loop
        self.endpoint = endpoint
        self.dumps: Optional[str] = None
        self._cpu: Dict[int, Tuple[float, int]] = {}

    def on_frame(self, look: Look, pids: Dict[int, int]) -> None:
        if look.kind == link.TOP:
            from ..machine.stacks import usage
            rows = usage(pids, self._cpu)
            self._answer(look.kind, look.id, rows)
            return
        from ..machine.stacks import read_in_background
        read_in_background(self.loop, pids, self.dumps, look.timeout,
                           lambda result: self._answer(look.kind, look.id, result),
                           main_only=look.main)

    def _answer(self, kind: int, ident: int, rows: Dict[int, Any]) -> None:
        if kind == link.STACKS:
            rows = same_as_earlier(rows)
        if not self.endpoint.closed:
            self.endpoint.send(frames.encode(frames.Looked(
                kind=kind, id=ident, ranks={str(k): v for k, v in rows.items()})))

    def close(self) -> None:
        if self.dumps is not None:
            from ..machine.procs import remove_private
            remove_private(self.dumps)
