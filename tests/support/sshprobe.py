"""Whether an SSH bed's hosts still answer, and why not when they do not.

A shared bed lives for a whole xdist worker's session.  When one test breaks
it in a way :meth:`sshbed.SSHBed.restore` does not undo, every later test of
that worker that logs in fails with the same symptom (an sshd that closes
each new connection, say), far from the cause.  So the plugin greets each
host of the shared bed before every test that asks for it: a bed that no
longer answers, or was stopped, fails that test at once with what its sshds logged, a look at
what sshd needs for each new connection, and the tests this worker ran since
the bed last answered (the suspects).  ``MSLAUNCH_TEST_PROBE_BEDS=1`` probes
after every test instead, to catch the one that breaks it.
"""

from __future__ import annotations

import os
import socket
import stat
from typing import List

#: What sshd needs for each new connection, besides its listener: its binary (each
#: connection re-executes it) and the privilege separation directory.
_NEEDS = ("/usr/sbin/sshd", "/run/sshd")


def greeting(addr: str, port: int, timeout: float = 30.0) -> bytes:
    """The first line a new TCP connection to ``addr:port`` reads (an sshd's
    banner), or what went wrong in parentheses.  (The time allowed is generous:
    this tells a broken host, not a slow one.)"""
    try:
        with socket.create_connection((addr, port), timeout=timeout) as s:
            got = b""
            while b"\n" not in got and len(got) < 512:
                chunk = s.recv(512)
                if not chunk:
                    return got + b"(closed by the other end)"
                got += chunk
            return got.split(b"\n", 1)[0]
    except OSError as err:
        return f"({err})".encode()


def unanswered(bed) -> List[str]:
    """One line for each host of ``bed`` whose sshd does not greet a new
    connection with an SSH banner (hosts whose link a test took down aside)."""
    bad = []
    for h in bed.hosts:
        if h.link_is_down:
            continue
        got = greeting(h.addr, h.port)
        if not got.startswith(b"SSH-"):
            bad.append(f"{h.name} ({h.target}): {got[:200]!r}")
    return bad


def _mode(path: str) -> str:
    try:
        st = os.stat(path)
    except OSError as err:
        return f"{path}: {err.strerror}"
    return f"{path}: {stat.filemode(st.st_mode)} uid {st.st_uid}"


def _listener(pid) -> str:
    if not pid:
        return "no listener pid"
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        with open(f"/proc/{pid}/cgroup") as f:
            cgroup = f.read().strip().replace("\n", " ")
    except OSError as err:
        return f"listener {pid}: {err.strerror}"
    return f"listener {pid} state {state}, cgroup {cgroup}"


def diagnosis(bed, bad: List[str], suspects: List[str]) -> str:
    """Why the hosts in ``bad`` may not answer: a multi-line report."""
    lines = ["the shared SSH bed's hosts did not greet a new connection:", *bad,
             *[_mode(p) for p in _NEEDS]]
    for h in bed.hosts:
        if any(line.startswith(h.name + " ") for line in bad):
            lines += [f"{h.name}: {_listener(h.pid)}", _mode(h.key_override or h.host_key),
                      f"--- the end of {h.name}'s sshd log:"]
            try:
                with open(h.log, "rb") as f:
                    f.seek(max(0, os.path.getsize(h.log) - 3000))
                    lines += f.read().decode(errors="replace").splitlines()[-15:]
            except OSError as err:
                lines.append(f"({err})")
    lines.append("tests this worker ran since the bed last answered: "
                 + (", ".join(suspects) if suspects else "none recorded"))
    return "\n".join(lines)
