"""A failed rank's own account of its failure: the file torchrun's ``@record``
writes (``TORCHELASTIC_ERROR_FILE``), read once the rank has ended.

``torch.distributed.elastic.multiprocessing.errors.record`` writes, for an
exception that ends the worker, ``{"message": {"message": "ValueError: boom",
"extraInfo": {"py_callstack": "Traceback ...", "timestamp": "..."}}}``; a
nested launcher may write the message as a plain string.  What the rank wrote
is its own business: a file that is not that shape, too large, or not a
regular file is passed over, never an error of the job.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Optional, Tuple

#: Bytes read of an error file at most (a traceback with its frames' locals is
#: large; anything larger is not torchrun's format).
MAX_BYTES = 1 << 20


def read_error(path: Optional[str]) -> Optional[Tuple[str, str]]:
    """(message, traceback) of the error file at ``path``, or None."""
    if not path:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        import stat
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = os.read(fd, MAX_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(data) > MAX_BYTES:
        return None
    import json
    try:
        body = json.loads(data.decode("utf-8", "replace"))
    except ValueError:
        return None
    said = body.get("message") if isinstance(body, dict) else None
    if isinstance(said, str):
        return (said, "") if said else None
    if not isinstance(said, dict):
        return None
    message = said.get("message")
    extra = said.get("extraInfo")
    stack = extra.get("py_callstack") if isinstance(extra, dict) else None
    message = message if isinstance(message, str) else ""
    stack = stack if isinstance(stack, str) else ""
    return (message, stack) if message or stack else None
