"""PMIx direct modex over the agents' link: a process's data, asked of the host that has it.

A host's PMIx server asks for the data of a process it does not have (a
spawn's parent or children elsewhere, see :mod:`mslaunch.mpi.pmix.dpm`).  The
question, ``pmix_modex`` (``kvs``, ``rank``, ``ask``), travels over the link
to the side that can answer -- the launcher for an agent, an agent for the
launcher -- and its answer, ``pmix_modex_done`` (``ask`` and the data in
base64, or None where nobody had it), travels back.  Both ends are a
:class:`ModexAsks`: the questions this side has out, and its answers to the
other side's.
"""

from __future__ import annotations

import itertools

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, Optional

    #: ``done(data)``: the answer to one question (None: nobody had the data).
    Done = Callable[[Optional[bytes]], None]
    Send = Callable[[Dict[str, Any]], None]

from ..wire import link


class ModexAsks:
    """One side's questions out, by number, and its reading of the other side's."""

    def __init__(self) -> None:
        self.waiting: Dict[int, Done] = {}
        self._asks = itertools.count(1)

    def ask(self, nspace: str, rank: int, done: Done, send: Send) -> None:
        """Ask the other side (through ``send``) for process ``rank`` of ``nspace``."""
        ask = next(self._asks)
        self.waiting[ask] = done
        send({"op": "pmix_modex", "kvs": nspace, "rank": rank, "ask": ask})

    def received(self, message: Dict[str, Any], send: Send,
                 local: Callable[[str, int, Done], None]) -> None:
        """The other side's question (answered from ``local(nspace, rank, done)``
        through ``send``) or its answer to one of ours; LinkError for a malformed
        frame or an answer to no question."""
        from ..mpi.pmix.exchange import decode_blob, encode_blob
        ask = link.field(message, "ask", int, "PMIx modex")
        if message.get("op") == "pmix_modex_done":
            done = self.waiting.pop(ask, None)
            blob = message.get("blob")
            try:
                if done is None:
                    raise ValueError("an answer for no question")
                data = None if blob is None else decode_blob(blob)
            except ValueError as err:
                raise link.LinkError(f"PMIx modex: {err}") from None
            done(data)
            return
        kvs = link.field(message, "kvs", str, "PMIx modex")
        rank = link.field(message, "rank", int, "PMIx modex")

        def answer(data: Optional[bytes]) -> None:
            send({"op": "pmix_modex_done", "ask": ask,
                  "blob": None if data is None else encode_blob(data)})
        local(kvs, rank, answer)
