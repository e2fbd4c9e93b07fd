"""Directories of a job's own: made private (:func:`private_dir`), and removed
with what they hold (:func:`remove_tree`: a symbolic link in it is removed and
never followed, and what cannot be removed is left without a word)."""

from __future__ import annotations

import os
import stat


def remove_tree(path: str) -> None:
    """Remove directory ``path`` and what is under it, as far as it can; a symbolic
    link is removed, never followed.  (``shutil.rmtree``'s work, without the 10 ms
    that importing it costs the end of every job.)"""
    try:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            return
        entries = list(os.scandir(path))
    except OSError:
        return
    for entry in entries:
        try:
            if entry.is_dir(follow_symlinks=False):
                remove_tree(entry.path)
            else:
                os.unlink(entry.path)
        except OSError:
            pass
    try:
        os.rmdir(path)
    except OSError:
        pass


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
