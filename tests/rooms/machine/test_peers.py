"""Who is at the other end of a connection (mslaunch.machine.peers), with real
sockets and a real other user (``nobody``, through ``setpriv``)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys

import pytest
from requires import require
from helpers import NOBODY

from mslaunch.machine.peers import MOST_PORTS, Admission, judge

#: Connects to ARGV[1]:ARGV[2], says "up" once connected, holds until stdin closes.
HOLDER = ("import socket, sys; c = socket.create_connection((sys.argv[1], int(sys.argv[2]))); "
          "print('up', flush=True); sys.stdin.read()")


def _listener(host):
    lsock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    lsock.bind((host, 0))
    lsock.listen(8)
    return lsock


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_a_peer_of_this_user_is_ours_and_one_of_another_user_a_stranger(host):
    require(os.geteuid() == 0 and shutil.which("setpriv") is not None,
            "root and setpriv, to connect as another user")
    lsock = _listener(host)
    port = lsock.getsockname()[1]
    mine = socket.create_connection((host, port))
    conn, _ = lsock.accept()
    assert judge(conn) == "ours"
    other = subprocess.Popen([*NOBODY, sys.executable, "-c", HOLDER, host, str(port)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd="/")
    try:
        assert other.stdout.readline() == b"up\n"
        theirs, _ = lsock.accept()
        assert judge(theirs) == "stranger"
    finally:
        other.stdin.close()
        other.wait(30)
    assert other.returncode == 0
    for s in (mine, conn, theirs, lsock):
        s.close()


def test_a_peer_that_closed_before_it_was_judged_is_a_stranger():
    lsock = _listener("127.0.0.1")
    gone = socket.create_connection(lsock.getsockname())
    gone.close()
    conn, _ = lsock.accept()
    assert judge(conn) == "stranger"
    conn.close()
    lsock.close()


def test_a_unix_peer_is_judged_by_its_credentials():
    a, b = socket.socketpair()
    assert judge(a) == "ours"
    a.close()
    b.close()


def test_a_filtered_listener_completes_only_the_connections_it_was_told_of():
    lsock = _listener("127.0.0.1")
    target = lsock.getsockname()
    admission = Admission([target[1]], "127.0.0.1")
    try:
        assert len(admission.socks) == 1
        stranger = socket.socket()
        stranger.settimeout(1.0)
        # the kernel drops its SYN: the connection never completes, nothing is queued
        with pytest.raises(socket.timeout):
            stranger.connect(target)
        stranger.close()
        ours = socket.socket()
        ours.bind(("127.0.0.1", 0))
        admission.allow(ours.getsockname()[1])
        ours.connect(target)
        conn, peer = lsock.accept()
        assert peer == ours.getsockname()
        conn.close()
        ours.close()
        # past the most one filter names, the listener takes any connection again
        admission.allowed.update(range(20000, 20000 + MOST_PORTS))
        admission.allow(1)
        anyone = socket.create_connection(target, timeout=5)
        anyone.close()
    finally:
        admission.close()
        lsock.close()
