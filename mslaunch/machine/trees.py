"""Removing a directory tree: what it holds is removed, a symbolic link in it is
removed and never followed, and what cannot be removed is left without a word."""

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
