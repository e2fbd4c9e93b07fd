"""Published names of PMIx ranks (``MPI_Publish_name``, and Open MPI's connect/accept).

Open MPI's ``MPI_Comm_accept``/``MPI_Comm_connect`` and ``MPI_Comm_join``
exchange their sides' processes through PMIx publish and lookup (a lookup
that waits until the other side has published), then ``PMIx_Connect``
all of them; ``MPI_Publish_name`` and ``MPI_Lookup_name`` use the same
calls.  The names of a launch live in one :class:`NameBoard`, at the
launcher; an agent's ranks reach it through the link (see
:mod:`mslaunch.serve.agentpmi`).  Pure: values are text (a string or
the base64 of bytes, tagged by :mod:`.dpm`), and how an answer travels is
the caller's.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Dict, List, Optional, Sequence, Set, Tuple

    #: A lookup's answer: ``{key: (value, publisher's namespace, its rank)}``.
    Found = Dict[str, Tuple[str, str, int]]

#: Names one launch keeps, and lookups it lets wait, at most.
MAX_NAMES = 10000
MAX_WAITING = 10000


class NameBoard:
    """Every name published in a launch, and the lookups waiting for theirs."""

    def __init__(self) -> None:
        self.names: Dict[str, Tuple[str, str, int]] = {}
        self.first_read: Set[str] = set()        # names gone once looked up
        self.waiting: List[Tuple[Sequence[str], Callable[[Found], None]]] = []

    def publish(self, pairs: Dict[str, str], nspace: str, rank: int,
                first_read: bool = False) -> Optional[str]:
        """Publish ``pairs`` for a rank (until the first lookup that finds them, with
        ``first_read``); why not, if not (a name already taken)."""
        taken = [k for k in pairs if k in self.names]
        if taken:
            return f"{taken[0][:60]!r} is published already"
        if len(self.names) + len(pairs) > MAX_NAMES:
            return "too many published names"
        for key, value in pairs.items():
            self.names[key] = (value, nspace, rank)
            if first_read:
                self.first_read.add(key)
        waiting, self.waiting = self.waiting, []
        for keys, done in waiting:
            if all(k in self.names for k in keys):
                done(self._take(keys))
            else:
                self.waiting.append((keys, done))
        return None

    def _take(self, keys: Sequence[str]) -> Found:
        found = {k: self.names[k] for k in keys if k in self.names}
        for key in self.first_read.intersection(found):
            self.first_read.discard(key)
            del self.names[key]
        return found

    def lookup(self, keys: Sequence[str], wait: bool, done: Callable[[Found], None]) -> None:
        """``done`` gets what is published of ``keys``; with ``wait``, once all are."""
        if all(k in self.names for k in keys) or not wait or \
                len(self.waiting) >= MAX_WAITING:
            done(self._take(keys))
        else:
            self.waiting.append((list(keys), done))

    def unpublish(self, keys: Sequence[str], nspace: str, rank: int) -> None:
        """Remove a rank's names among ``keys`` (another's stay)."""
        for key in keys:
            entry = self.names.get(key)
            if entry is not None and entry[1:] == (nspace, rank):
                del self.names[key]
                self.first_read.discard(key)
