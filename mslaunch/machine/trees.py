"""Directories of a job's own: made private (:func:`private_dir`), and removed
with what they hold (:func:`remove_tree`: only this user's, through descriptors,
so that another user can neither have a directory of theirs removed nor
redirect the removal elsewhere; what cannot be removed is left without a word)."""

from __future__ import annotations

import os
import stat

#: Where POSIX shared memory lives (``shm_open``'s files): MPI libraries' segments,
#: and the directories of a job's own made for them.
SHM_DIR = "/dev/shm"
#: How a directory is opened for its removal: never through a symbolic link.
OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def remove_tree(path: str) -> None:
    """Remove directory ``path`` and what is under it, as far as it can, if it is
    this user's: a symbolic link is removed, never followed, and a directory of
    another user's (inside, or ``path`` itself) is left as it is.  The walk
    holds each directory open and names entries relative to it, so a directory
    renamed or replaced by a link during the walk (by whoever may write its
    parent) cannot send the removal elsewhere.  (``shutil.rmtree``'s work,
    without the 10 ms that importing it costs the end of every job.)"""
    try:
        fd = os.open(path, OPEN_DIR)
    except OSError:
        return
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid():
            return
        _empty(fd)
        # Only the directory that was walked: what is at ``path`` now must be it.
        now = os.lstat(path)
        if (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino):
            os.rmdir(path)
    except OSError:
        pass
    finally:
        os.close(fd)


def _empty(fd: int) -> None:
    """Remove what directory ``fd`` holds: this user's directories, emptied first,
    and every other entry."""
    with os.scandir(fd) as entries:
        names = [(e.name, e.is_dir(follow_symlinks=False)) for e in entries]
    for name, is_dir in names:
        try:
            _remove(fd, name, is_dir)
        except OSError:
            pass


def remove_entry(fd: int, name: str) -> None:
    """Remove entry ``name`` of directory ``fd`` as :func:`remove_tree` would: a
    directory of this user's with what it holds, any other entry but another
    user's directory, a link never followed; OSError if it cannot."""
    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
    _remove(fd, name, stat.S_ISDIR(st.st_mode))


def _remove(fd: int, name: str, is_dir: bool) -> None:
    if not is_dir:
        os.unlink(name, dir_fd=fd)
        return
    inner = os.open(name, OPEN_DIR, dir_fd=fd)
    try:
        if os.fstat(inner).st_uid != os.geteuid():
            return
        _empty(inner)
    finally:
        os.close(inner)
    os.rmdir(name, dir_fd=fd)


#: Descriptors of the directories this process holds (see :func:`hold`), kept open
#: until it exits.
_held = []


def hold(path: str) -> None:
    """Hold directory ``path`` (a shared lock on it) for as long as this process
    lives: a sweeper of what dead jobs left (:func:`in_use`) then sees it is in
    use, also from another pid namespace (a container sharing /dev/shm), where
    the pid in its name says nothing."""
    import fcntl
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        _held.append(fd)
    except OSError:
        os.close(fd)


def in_use(path: str) -> bool:
    """Whether a live process holds directory ``path`` (:func:`hold`)."""
    import fcntl
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)


def private_dir(path: str) -> None:
    """Make ``path`` a directory only this user may enter, or take the one there
    if it is that already; OSError if what is there is anything else (a link,
    another user's directory, one that others may enter): a name others can
    see may have been taken before us, to read what the job puts in it."""
    try:
        os.mkdir(path, 0o700)
        return
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise FileExistsError(f"{path} exists and is not a private directory of this user's")
