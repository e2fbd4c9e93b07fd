"""The job's control socket while its remote hosts start: mslaunch-stacks and
mslaunch-top are answered what is happening.

Starting the agents keeps the launcher's main thread in the starter (SSH's
handshakes in threads, an rsh agent's or srun's processes in a loop of the
starter's own), so a thread answers the control socket meanwhile: ``info``
as ever (the job is found by its pid or id), ``stacks`` and ``top`` with one
line of where the start stands (``3 of 8 hosts up; h5: SSH: key exchange and
login (3.1 s since the hosts were asked)``), which the commands print as an
error line.  The supervisor's loop takes the socket back once the hosts are up.
"""

from __future__ import annotations

import json
import os
import select
import threading

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, Optional

from . import admitted

#: Seconds a client has to send its request line.
READ_TIMEOUT = 2.0


class StartupAnswers:
    """Answer the listening socket ``sock`` from a thread until :meth:`close`;
    ``status()`` is the start's line, ``info()`` the job's ``info``."""

    def __init__(self, sock: Any, status: Callable[[], str],
                 info: Callable[[], Dict[str, Any]]) -> None:
        self.sock, self.status, self.info = sock, status, info
        self.stopping = threading.Event()
        # close() wakes the thread's select at once through this pipe: the hosts
        # are up, and the supervisor must not wait for a timeout to take over.
        self._wake_r, self._wake_w = os.pipe()
        self.thread = threading.Thread(target=self._serve, name="startup-answers", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        try:
            self._serve_until_woken()
        finally:
            os.close(self._wake_r)      # the thread's own end: closed when it is done

    def _serve_until_woken(self) -> None:
        from ..core import socket
        while not self.stopping.is_set():
            try:
                ready, _, _ = select.select([self.sock.fileno(), self._wake_r], [], [])
            except (OSError, ValueError):
                return
            if self._wake_r in ready or self.stopping.is_set():
                return
            try:
                fd, _ = self.sock._accept()
            except OSError:
                continue
            conn = socket.socket(fileno=fd)
            if admitted(conn):
                try:
                    self._answer(conn)
                except Exception:  # noqa: BLE001 -- a look must never end the job
                    pass
                finally:
                    conn.close()

    def _answer(self, conn: Any) -> None:
        conn.settimeout(READ_TIMEOUT)
        buf = b""
        while b"\n" not in buf and len(buf) < 65536:
            data = conn.recv(65536)
            if not data:
                return
            buf += data
        request: Optional[Any]
        try:
            request = json.loads(buf.split(b"\n", 1)[0].decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            request = None
        op = request.get("op") if isinstance(request, dict) else None
        status = self.status()
        answer: Dict[str, Any] = (dict(self.info(), starting=status) if op == "info" else
                                  {"error": f"its remote hosts are starting: {status}"})
        conn.sendall(json.dumps(answer).encode() + b"\n")

    def close(self) -> None:
        """Stop answering (the supervisor's loop answers from now on)."""
        self.stopping.set()
        # Closing the pipe's write end wakes the thread's select (end of file),
        # also a thread still answering a slow client when the join gives up.
        os.close(self._wake_w)
        self.thread.join(2.0)
