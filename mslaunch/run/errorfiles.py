"""A failed rank's own account of its failure: the file torchrun's ``@record``
writes (``TORCHELASTIC_ERROR_FILE``), read once the rank has ended.

``torch.distributed.elastic.multiprocessing.errors.record`` writes, for an
exception that ends the worker, ``{"message": {"message": "ValueError: boom",
"extraInfo": {"py_callstack": "Traceback ...", "timestamp": "..."}}}``; a
nested launcher may write the message as a plain string.  What the rank wrote
is its own business: a file that is not that shape, too large, or not a
regular file is passed over, never an error of the job.

A torchrun line's launcher copies its root cause's file to its own
``TORCHELASTIC_ERROR_FILE``, as torchrun's does (:func:`copy_for_launcher`).
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, Mapping, Optional, Tuple

    from ..core.spec import JobResult

#: Bytes read of an error file at most (a traceback with its frames' locals is
#: large; anything larger is not torchrun's format).
MAX_BYTES = 1 << 20


def _error_body(path: Optional[str]) -> Optional[Dict[str, Any]]:
    """The JSON object of the error file at ``path``: a regular file (no link
    followed) of at most :data:`MAX_BYTES`; else None."""
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
    return body if isinstance(body, dict) else None


def read_error(path: Optional[str]) -> Optional[Tuple[str, str]]:
    """(message, traceback) of the error file at ``path``, or None."""
    body = _error_body(path)
    return None if body is None else _said(body)


def _said(body: Dict[str, Any]) -> Optional[Tuple[str, str]]:
    """(message, traceback) of an error file's JSON object, or None."""
    said = body.get("message")
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


#: The launcher's own error file, as torchrun's (its ``main`` is under ``@record``).
LAUNCHER_VARIABLE = "TORCHELASTIC_ERROR_FILE"


def copy_for_launcher(result: JobResult, environ: Mapping[str, str]) -> None:
    """As torchrun's launcher does when a worker fails: the root cause's error file,
    if it wrote one, copied to the launcher's own ``TORCHELASTIC_ERROR_FILE`` (what
    a scheduler that started the launcher reads), its ``errorCode`` the worker's
    exit status; a file that cannot be written is said in one line, as torchrun
    warns of it."""
    target = environ.get(LAUNCHER_VARIABLE)
    cause = result.root_cause
    if not target or cause is None or not cause.error_file:
        return
    body = _error_body(cause.error_file)
    if body is None or _said(body) is None:      # (not torchrun's shape)
        return
    code = cause.returncode if cause.signal is None else -cause.signal
    said = body.get("message")
    if isinstance(said, dict) and code:
        said["errorCode"] = code
    import json
    try:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o644)
        with os.fdopen(fd, "w") as f:
            json.dump(body, f)
    except OSError as err:
        import sys
        sys.stderr.write(f"mslaunch: cannot write {LAUNCHER_VARIABLE} {target}: "
                         f"{err.strerror}\n")
