"""What a newcomer meets: one line for every failure, torchrun's and msrun's habits,
failures that people and tools can read, ``--help`` topics, and the Python entry point."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from typing import Dict, List, Optional

import pytest

from helpers import PY, REPO, clean_env, cmd, run

# -- never a traceback: every kind of SSH failure is one line -------------------------


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


BAD_KINDS = ("not-ssh", "dropped", "mid-handshake", "silent")


@pytest.fixture
def listeners():
    made = {kind: Listener(kind) for kind in BAD_KINDS}
    yield made
    for listener in made.values():
        listener.stop()


def _bad_hosts_config(listeners: Dict[str, Listener]) -> str:
    return "".join(f"Host {kind}\n  HostName 127.0.0.1\n  Port {lis.port}\n"
                   for kind, lis in listeners.items())


def _one_error_line(stderr: bytes) -> str:
    text = stderr.decode()
    lines = text.splitlines()
    assert len(lines) == 1, text
    assert lines[0].startswith("mslaunch: error: ") and "Traceback" not in text, text
    return lines[0]


@pytest.mark.parametrize("kind", BAD_KINDS)
def test_a_port_that_is_not_a_working_sshd_is_one_line(listeners, kind, tmp_path):
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(_bad_hosts_config(listeners))
    r = subprocess.run(cmd("--ssh-timeout", "2", "-H", kind, "-n", "1", "true"),
                       capture_output=True, timeout=60, env=clean_env(HOME=str(home)))
    assert r.returncode == 1
    line = _one_error_line(r.stderr)
    assert f"{kind} (connect: " in line
    expected = {"not-ssh": "no SSH banner", "dropped": "no SSH banner",
                "mid-handshake": "closed during the key exchange", "silent": "timed out after 2 s"}
    assert expected[kind] in line, line


def test_every_ssh_failure_kind_together_is_one_line_naming_each_host(sshbed, listeners,
                                                                       tmp_path):
    home = sshbed.make_home(tmp_path / "home", user_config_extra=_bad_hosts_config(listeners))
    sshbed.refuse_logins("h3")
    sshbed.rekey_host("h2")
    hosts = ",".join([*BAD_KINDS, "h2", "h3"])
    r = subprocess.run(cmd("--ssh-timeout", "2", "-v", "-H", hosts, "-n", "6", "true"),
                       capture_output=True, timeout=90, env=clean_env(HOME=home))
    assert r.returncode == 1
    text = r.stderr.decode()
    # -v adds mslaunch's own lines; still no traceback, and one error line.
    assert "Traceback" not in text and "File \"" not in text, text
    errors = [line for line in text.splitlines() if line.startswith("mslaunch: error:")]
    assert len(errors) == 1, text
    for host in (*BAD_KINDS, "h2", "h3"):       # grouped by reason: "dropped, not-ssh (..."
        assert f" {host} (" in errors[0] or f" {host}, " in errors[0], text
    assert "h2 (host key: " in errors[0] and "CHANGED" in errors[0], text
    assert "h3 (authentication: " in errors[0], text
    assert "6 of 6" in errors[0], text


def test_library_messages_are_one_line_each_with_two_v(listeners, tmp_path):
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(_bad_hosts_config(listeners))
    r = subprocess.run(cmd("-v", "-v", "--ssh-timeout", "2", "-H", "dropped", "-n", "1", "true"),
                       capture_output=True, timeout=60, env=clean_env(HOME=str(home)))
    text = r.stderr.decode()
    assert r.returncode == 1 and "Traceback" not in text and "  File " not in text, text
    assert "mslaunch: debug: paramiko.transport: " in text, text
