"""What refused Open MPI singletons leave in /tmp: their session directories.

An Open MPI 4 singleton makes its job family's session directory
(``$TMPDIR/ompi.<host>.<uid>/jf.<n>``) in ``MPI_Init`` and removes it only in
``MPI_Finalize``; stopped before that (a refused singleton, see
:mod:`.singletons`), it leaves it behind, empty.  Its name comes from the PMIx
segments the process maps (``.../pid.<m>/pmix_dstor_ds<v>_<m>/smseg-<jobid>-0``:
the family is the jobid's upper 16 bits, as measured with Debian's 4.1.4).  It
is noted with the singleton's /dev/shm files and removed with them if it is
still empty: ``rmdir`` only, nothing in it is ever deleted.

The singleton's own ``orted`` (its child, the PMIx server) keeps
``ompi.<host>.<uid>/pid.<its pid>``, with its contact file and PMIx segments,
and removes it when the singleton ends -- unless it is killed too (a singleton
that ignores SIGTERM, stopped at the end of the grace period, or by the guard
when mslaunch dies).  That directory is noted from the segments the orted
maps, and removed whole once that orted is gone (not before: a live one
removes its own).

An Open MPI 5 singleton has no orted; its job's session directory is
``ompi.<host>.<uid>/jf.0/<jobid>`` under the first of ``TMPDIR``, ``TEMP``
and ``TMP`` it has (else ``/tmp``), and it leaves that directory behind,
empty, even when it ends normally (5.0.11's ``ompi_rte.c``).  The host, uid
and jobid are read from the name of the shared-memory segment it maps
(``sm_segment.<host>.<uid>.<jobid in hex>.<n>``), the base from its
environment; the directory is removed as a ``jf.<n>`` is: ``rmdir`` only.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import List, Optional, Tuple


def sessions_of(pid: int) -> List[str]:
    """The session directories process ``pid`` has: its own (:func:`session_directory`)
    and, for an orted, its daemon's (:func:`daemon_directory`)."""
    return [d for d in (session_directory(pid), daemon_directory(pid)) if d is not None]


def session_directory(pid: int) -> Optional[str]:
    """The session directory of Open MPI process ``pid``: 4's ``jf.<n>`` or 5's
    ``jf.0/<jobid>``, from the segments it maps (see the module docstring); None
    if it maps none."""
    try:
        with open(f"/proc/{pid}/maps", "rb") as f:
            for line in f:
                session = session_of_mapping(line)
                if session is not None:
                    return session
                job = segment_job(line)
                if job is not None:
                    return _job_session(_tmpdir_of(pid), *job)
    except OSError:
        pass
    return None


def segment_job(line: bytes) -> Optional[Tuple[str, str, int]]:
    """``(host, uid, jobid)`` from a line of ``/proc/PID/maps`` that maps an Open
    MPI 5 shared-memory segment (``sm_segment.<host>.<uid>.<jobid hex>.<n>``)."""
    fields = line.rstrip(b"\n").split(None, 5)
    name = os.path.basename(fields[5]) if len(fields) == 6 else b""
    if not name.startswith(b"sm_segment."):
        return None
    parts = name[len(b"sm_segment."):].rsplit(b".", 3)
    if len(parts) != 4:
        return None
    host, uid, job, number = parts
    if not (host and b"/" not in host and uid.isdigit() and number.isdigit()
            and 0 < len(job) <= 8 and all(c in b"0123456789abcdef" for c in job)):
        return None
    text = host.decode("ascii", "replace")
    return (text, uid.decode(), int(job, 16)) if text.isprintable() else None


def _tmpdir_of(pid: int) -> Optional[str]:
    """Where Open MPI 5 makes process ``pid``'s session directory: the first of
    TMPDIR, TEMP and TMP in its environment (as it started), else /tmp."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            items = f.read(1 << 20).split(b"\0")
    except OSError:
        return None
    env = dict(item.split(b"=", 1) for item in items if b"=" in item)
    for name in (b"TMPDIR", b"TEMP", b"TMP"):
        if name in env:
            return os.fsdecode(env[name])
    return "/tmp"


def _job_session(tmpdir: Optional[str], host: str, uid: str, jobid: int) -> Optional[str]:
    if tmpdir is None:
        return None
    path = f"{tmpdir}/ompi.{host}.{uid}/jf.0/{jobid}"
    return path if path.startswith("/") and path.isprintable() else None


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


def daemon_directory(pid: int) -> Optional[str]:
    """The session directory ``ompi.<host>.<uid>/pid.<pid>`` of ``pid``, if it is an
    Open MPI 4 ``orted`` that maps its PMIx segments there (module docstring)."""
    if not _is_orted(pid):
        return None
    own = b"/pid.%d/pmix_dstor_ds" % pid
    try:
        with open(f"/proc/{pid}/maps", "rb") as f:
            for line in f:
                fields = line.rstrip(b"\n").split(None, 5)
                at = fields[-1].find(own) if len(fields) == 6 else -1
                if at > 0 and fields[5].startswith(b"/"):
                    top = fields[5][:at]
                    found = os.fsdecode(b"%s/pid.%d" % (top, pid))
                    if os.path.basename(top).startswith(b"ompi.") and found.isprintable():
                        return found
    except OSError:
        pass
    return None


def _is_orted(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/comm", "rb") as f:
            return f.read().strip() == b"orted"
    except OSError:
        return False


def top_session_of(pid: int) -> Optional[str]:
    """Where Open MPI process ``pid`` makes its ``ompi.<host>.<uid>``: under the
    first of ``TMPDIR``, ``TEMP``, ``TMP`` of its environment, else /tmp (None if
    its environment cannot be read)."""
    base = _tmpdir_of(pid)
    return None if base is None else \
        os.path.join(base, f"ompi.{os.uname().nodename}.{os.geteuid()}")


def remove_empty_since(top: str, since: Optional[float]) -> None:
    """``rmdir`` the empty directories of this user in ``top`` (an
    ``ompi.<host>.<uid>``) that changed at ``since`` or later (all if None), the
    deepest first, then ``top`` itself if it is empty."""
    me = os.geteuid()
    for root, dirs, _ in os.walk(top, topdown=False):
        for name in dirs:
            path = os.path.join(root, name)
            try:
                st = os.lstat(path)
                if st.st_uid == me and (since is None or st.st_ctime >= since - 0.05):
                    os.rmdir(path)
            except OSError:
                pass
    try:
        os.rmdir(top)
    except OSError:
        pass


def remove_session(path: str, deadline: float) -> None:
    """Remove a noted session directory: an orted's ``pid.<m>`` whole once that
    orted is gone (waited for until ``deadline``, a ``time.monotonic()``), then
    ``ompi.<host>.<uid>`` if that is empty; any other (a ``jf.<n>``, a
    ``jf.0/<jobid>``) only if empty (:func:`remove_empty_session`)."""
    import stat
    name = os.path.basename(path)
    digits = name[len("pid."):]
    if not (name.startswith("pid.") and digits.isascii() and digits.isdigit()):
        remove_empty_session(path)
        return
    import time
    from ...machine.procs import alive
    while alive(int(digits)) and _is_orted(int(digits)):     # its end is asynchronous
        if time.monotonic() > deadline:
            return                        # it runs on, and removes its own
        time.sleep(0.01)
    try:
        st = os.lstat(path)
    except OSError:
        return
    if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid():
        from ...machine.trees import remove_tree
        remove_tree(path)
        try:
            os.rmdir(os.path.dirname(path))
        except OSError:
            pass


def remove_empty_session(path: str) -> None:
    """``rmdir`` the session directory ``path`` of this user, its empty directories
    first, then its parents up to ``ompi.<host>.<uid>`` while they are empty, as
    Open MPI's own ``MPI_Finalize`` does."""
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
    target = path
    for _ in range(3):        # jf.0/<jobid>, jf.0, ompi.<host>.<uid> at most
        try:
            os.rmdir(target)
        except OSError:
            return
        if os.path.basename(target).startswith("ompi."):
            return
        target = os.path.dirname(target)
