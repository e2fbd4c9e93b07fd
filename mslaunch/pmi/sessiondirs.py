"""What refused Open MPI 4 singletons leave in /tmp: their session directories.

An Open MPI 4 singleton makes its job family's session directory
(``$TMPDIR/ompi.<host>.<uid>/jf.<n>``) in ``MPI_Init`` and removes it only in
``MPI_Finalize``; stopped before that (a refused singleton, see
:mod:`.singletons`), it leaves it behind, empty.  Its name comes from the PMIx
segments the process maps (``.../pid.<m>/pmix_dstor_ds<v>_<m>/smseg-<jobid>-0``:
the family is the jobid's upper 16 bits, as measured with Debian's 4.1.4).  It
is noted with the singleton's /dev/shm files and removed with them if it is
still empty: ``rmdir`` only, nothing in it is ever deleted.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Optional


def session_directory(pid: int) -> Optional[str]:
    """Open MPI 4's ``jf.<n>`` session directory of process ``pid``, from the PMIx
    segments it maps (see the module docstring); None if it maps none."""
    try:
        with open(f"/proc/{pid}/maps", "rb") as f:
            for line in f:
                session = session_of_mapping(line)
                if session is not None:
                    return session
    except OSError:
        pass
    return None


def session_of_mapping(line: bytes) -> Optional[str]:
    """The ``jf.<n>`` directory a line of ``/proc/PID/maps`` names, if it maps a
    PMIx segment of an Open MPI 4 session (see the module docstring)."""
    fields = line.rstrip(b"\n").split(None, 5)
    if len(fields) < 6:
        return None
    path = fields[5]
    name = os.path.basename(path)
    dstor = os.path.dirname(path)
    if b"/pmix_dstor_ds" not in dstor or not name.startswith((b"smseg-", b"smdataseg-")):
        return None
    jobid = name.split(b"-")[1]
    top = os.path.dirname(os.path.dirname(dstor))
    if not (jobid.isascii() and jobid.isdigit()) or not top.startswith(b"/") \
            or not os.path.basename(top).startswith(b"ompi."):
        return None
    session = os.fsdecode(os.path.join(top, b"jf.%d" % (int(jobid) >> 16)))
    return session if session.isprintable() else None


def remove_empty_session(path: str) -> None:
    """``rmdir`` the session directory ``path`` of this user, its empty directories
    first, then its parent (``ompi.<host>.<uid>``) if that is empty too, as Open
    MPI's own ``MPI_Finalize`` does."""
    import stat
    try:
        st = os.lstat(path)
    except OSError:
        return
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        return
    for root, dirs, _ in os.walk(path, topdown=False):
        for name in dirs:
            try:
                os.rmdir(os.path.join(root, name))
            except OSError:
                pass
    for target in (path, os.path.dirname(path)):
        try:
            os.rmdir(target)
        except OSError:
            return
