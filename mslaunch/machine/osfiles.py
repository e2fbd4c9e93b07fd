"""Idioms of files, written once: a file replaced whole or left as it was, a
name removed if it can be, what a non-blocking descriptor has to read, and a
file of this user's own written where another user could have made the name
first (:func:`open_own`, :func:`check_dirs`)."""

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
    unlink_quietly(tmp)                 # (a dead process's of this pid)
    try:
        # a new file, never through a link someone else left under that name
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o644)
        with open(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        unlink_quietly(tmp)
        raise


def open_own(path: str, append: bool = False, mode: int = 0o644) -> int:
    """``path`` opened for writing (and reading) as a regular file of this user's:
    made if new, emptied unless ``append``.  Never through a symbolic link, and never another
    user's file (one made first under that name, to read what is written, or a
    link to have it written elsewhere): OSError then, whose text says so."""
    import errno
    import stat
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags | (os.O_APPEND if append else 0), mode)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise OSError(errno.EPERM, "a symbolic link: not followed", path) from None
        if err.errno == errno.ENXIO:
            raise OSError(errno.EPERM, "a FIFO, not a file", path) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            raise OSError(errno.EPERM, f"not a file of this user's (owner uid {st.st_uid})",
                          path)
        if not append:
            os.ftruncate(fd, 0)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_dirs(path: str) -> None:
    """OSError unless no other user can put a link or a directory of theirs in the
    way of what is made in directory ``path``: no directory on the way there
    (``path`` and those above it that exist) is writable by every user without
    the sticky bit (as /tmp has), and no link on it is another user's but
    root's.  (A directory that another user owns is allowed: a workspace of
    the host's user mounted in a container, written by root.)"""
    import errno
    import stat
    me = os.geteuid()
    here = os.sep
    for part in os.path.abspath(path).split(os.sep)[1:]:
        here = os.path.join(here, part)
        try:
            st = os.lstat(here)
        except FileNotFoundError:
            return
        if stat.S_ISLNK(st.st_mode):
            if st.st_uid not in (me, 0):
                raise OSError(errno.EPERM, f"a link of another user's (uid {st.st_uid})",
                              here)
            check_dirs(os.path.join(os.path.dirname(here), os.readlink(here)))
        elif stat.S_ISDIR(st.st_mode) and st.st_mode & 0o002 and not st.st_mode & 0o1000:
            raise OSError(errno.EPERM, "writable by every user, without the sticky bit: "
                                       "another user could put links of theirs in it", here)
