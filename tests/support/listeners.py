"""Loopback ports that misbehave as a host's "sshd" can, and the ssh_config that
names them as hosts (the ``listeners`` fixture in conftest makes one of each)."""

from __future__ import annotations

import socket
import threading
from typing import Dict, List


class Listener:
    """A loopback TCP port that misbehaves as a host's "sshd" can: it answers
    something that is not SSH, closes at once (sshd's MaxStartups), says its
    banner and closes in the key exchange, or says nothing at all."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.conns: List[socket.socket] = []
        self.stopped = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stopped:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            if self.mode == "not-ssh":
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                conn.close()
            elif self.mode == "dropped":
                conn.close()
            elif self.mode == "mid-handshake":
                conn.sendall(b"SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n")
                conn.recv(65536)
                conn.close()
            # "silent": holds the connection and says nothing
        except OSError:
            pass

    def stop(self) -> None:
        self.stopped = True
        self.sock.close()
        for conn in self.conns:
            conn.close()


#: What a Listener does: answers something that is not SSH, closes at once, closes in
#: the key exchange, or says nothing at all.
BAD_KINDS = ("not-ssh", "dropped", "mid-handshake", "silent")


def bad_hosts_config(listeners: Dict[str, Listener]) -> str:
    """An ssh_config whose hosts are the ``listeners``, each named by its kind."""
    return "".join(f"Host {kind}\n  HostName 127.0.0.1\n  Port {lis.port}\n"
                   for kind, lis in listeners.items())
