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
    from typing import Callable, Dict, FrozenSet, List, Set, Tuple

    Done = Callable[[bytes], None]


#: The signature prefix of a connect or disconnect (a fence without data).
CONNECT_PREFIX = "c/"


class FenceExchange:
    """``participants(kvs, signature)``: the hosts with a rank in that fence."""

    def __init__(self, participants: Callable[[str, str], FrozenSet[str]]) -> None:
        self.participants = participants
        # By signature and sequence only: the hosts of a connect between two jobs
        # each name it through a job of their own (the first one's is kept).
        self.rounds: Dict[Tuple[str, int], Tuple[str, Dict[str, Tuple[bytes, Done]]]] = {}

    def contribute(self, kvs: str, signature: str, sequence: int, host: str, blob: bytes,
                   done: Done) -> None:
        """``host``'s part of a fence; ``done`` gets the whole.  ValueError for a host
        that takes no part in it, or gives its part twice."""
        expected = self.participants(kvs, signature)
        if host not in expected:
            raise ValueError(f"a fence of {signature[:60]} without ranks on {host or 'here'}")
        key = (signature, sequence)
        parts = self.rounds.setdefault(key, (kvs, {}))[1]
        if host in parts:
            raise ValueError(f"fence {sequence} of {signature[:60]} given twice")
        parts[host] = (blob, done)
        if len(parts) < len(expected):
            return
        del self.rounds[key]
        whole = b"".join(parts[h][0] for h in sorted(parts))
        for h in sorted(parts):
            parts[h][1](whole)

    def waiting(self) -> List[Tuple[str, Set[str]]]:
        """Fences under way: ``(signature, hosts not yet in)``."""
        return [(sig, set(self.participants(kvs, sig)) - set(parts))
                for (sig, _), (kvs, parts) in self.rounds.items()]


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
