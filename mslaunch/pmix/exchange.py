"""The launcher's part of PMIx fences that span hosts: gather, concatenate, hand back.

Each host's PMIx server completes a fence among its own ranks by itself and
then hands the launcher its opaque contribution (the packed data of its
ranks).  A fence is named by its *signature* (the processes taking part,
``ns:*`` for a whole job) and a *sequence* number that each server counts
per signature, so that the n-th fence of one host meets the n-th of every
other.  When every host with a rank in the fence has contributed, the
contributions are concatenated (in host order) and the whole goes back to
each of them -- what the library expects of its host (flux-pmix does the
same).  Pure: what a host is and how the answer travels are the caller's.
"""

from __future__ import annotations

import binascii

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Dict, FrozenSet, List, Optional, Set, Tuple

    Done = Callable[[bytes], None]


#: The signature prefix of a connect or disconnect (a fence without data).
CONNECT_PREFIX = "c/"


class FenceExchange:
    """``participants(kvs, signature)``: the hosts with a rank in that fence."""

    def __init__(self, participants: Callable[[str, str], FrozenSet[str]]) -> None:
        self.participants = participants
        # By signature and sequence only: the hosts of a connect between two jobs
        # each name it through a job of their own.
        self.rounds: Dict[Tuple[str, int], Dict[str, Tuple[bytes, Done]]] = {}
        self.jobs: Dict[Tuple[str, int], str] = {}

    def contribute(self, kvs: str, signature: str, sequence: int, host: str, blob: bytes,
                   done: Done) -> None:
        """``host``'s part of a fence; ``done`` gets the whole.  ValueError for a host
        that takes no part in it, or gives its part twice."""
        expected = self.participants(kvs, signature)
        if host not in expected:
            raise ValueError(f"a fence of {signature[:60]} without ranks on {host or 'here'}")
        key = (signature, sequence)
        parts = self.rounds.setdefault(key, {})
        self.jobs.setdefault(key, kvs)
        if host in parts:
            raise ValueError(f"fence {sequence} of {signature[:60]} given twice")
        parts[host] = (blob, done)
        if len(parts) < len(expected):
            return
        del self.rounds[key]
        self.jobs.pop(key, None)
        whole = b"".join(parts[h][0] for h in sorted(parts))
        for h in sorted(parts):
            parts[h][1](whole)

    def waiting(self) -> List[Tuple[str, Set[str]]]:
        """Fences under way: ``(signature, hosts not yet in)``."""
        return [(sig, set(self.participants(self.jobs.get((sig, seq), ""), sig)) - set(parts))
                for (sig, seq), parts in self.rounds.items()]


def encode_blob(blob: bytes) -> str:
    """A fence's data in a link frame (JSON): base64."""
    return binascii.b2a_base64(blob, newline=False).decode("ascii")


def decode_blob(text: object) -> bytes:
    """The data of :func:`encode_blob`; ValueError if it is not that."""
    if not isinstance(text, str):
        raise ValueError("fence data is not text")
    try:
        return binascii.a2b_base64(text.encode("ascii"))
    except (binascii.Error, UnicodeEncodeError):
        raise ValueError("fence data is not base64") from None


def modex_answered(waiting: Dict[int, Callable[[Optional[bytes]], None]], ask: int,
                   blob: object) -> None:
    """Hand a ``pmix_modex_done`` answer (a process's data in base64, or None where
    nobody had it) to the question ``ask`` of ``waiting``; ValueError if it answers
    none or is not data."""
    done = waiting.pop(ask, None)
    if done is None:
        raise ValueError("an answer for no question")
    done(None if blob is None else decode_blob(blob))


def modex_reply(ask: int, blob: Optional[bytes]) -> Dict[str, object]:
    """The ``pmix_modex_done`` answer to question ``ask``."""
    return {"op": "pmix_modex_done", "ask": ask,
            "blob": None if blob is None else encode_blob(blob)}
