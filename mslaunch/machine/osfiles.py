"""Idioms of files, written once: a file replaced whole or left as it was, a
name removed if it can be, and what a non-blocking descriptor has to read."""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Optional


def read_ready(fd: int, size: int = 1 << 16) -> Optional[bytes]:
    """What non-blocking ``fd`` (a pipe's, a stream socket's) has now: None when
    nothing yet, ``b""`` at its end or on an error (a reset connection), else
    the bytes."""
    try:
        return os.read(fd, size)
    except (BlockingIOError, InterruptedError):
        return None
    except OSError:
        return b""


def unlink_quietly(path: str) -> None:
    """Remove ``path`` if it can be removed; nothing said if it cannot."""
    try:
        os.unlink(path)
    except OSError:
        pass


def write_whole(path: str, data: bytes, *, shared: bool = False) -> None:
    """``path`` holds ``data`` whole, or is left as it was (OSError): written
    under a name of this process -- and of this host when ``shared``, for a file
    that hosts share (a cache in a home directory on NFS) -- then renamed over
    ``path``, which readers thus never see half written."""
    tmp = f"{path}.{os.uname().nodename[:64]}.{os.getpid()}" if shared else \
        f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        unlink_quietly(tmp)
        raise
