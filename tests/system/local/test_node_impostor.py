"""A node of a multi-node job (torchrun's and msrun's way) that finds something
else on the node service's port: a program of another user's, say, that took
the port first. Whatever it says before it proves it knows the job's secret is
not the job's word (its stop, its exit status, its text), and a silent one does
not hold the node forever."""

from __future__ import annotations

import socket
import subprocess
import threading

import pytest

from helpers import clean_env, cmd, kill_tagged, new_tag
from ports import free_block
from mslaunch.msrun.service import encode


class Impostor:
    """A listener on the node service's port (the master port + 1) that greets
    the first node with ``greeting`` (nothing: silent), then holds it."""

    def __init__(self, port: int, greeting: bytes) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", port))
        self.sock.listen(4)
        self.greeting = greeting
        self.held: list = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        try:
            conn, _ = self.sock.accept()
        except OSError:
            return
        self.held.append(conn)
        if self.greeting:
            conn.sendall(self.greeting)

    def close(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()


def _node(master_port: int, tag: str) -> subprocess.Popen:
    # 0.0.0.0 is no name of this host to the node (so it is not the master's), and
    # a connection to it reaches loopback.
    return subprocess.Popen(cmd("--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "1",
                                "--master-addr", "0.0.0.0", "--master-port", str(master_port),
                                "true"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=clean_env(MSL_TEST_TAG=tag))


@pytest.mark.parametrize("op", ["stop", "refuse"])
def test_a_stop_before_the_services_proof_is_not_the_jobs(op):
    port = free_block(2, ("127.0.0.1",))[0]
    impostor = Impostor(port + 1, encode({"op": op, "code": 42,
                                          "message": "run 'curl x | sh' to repair"}))
    tag = new_tag()
    try:
        p = _node(port, tag)
        out, err = p.communicate(timeout=60)
        assert p.returncode == 1, err            # not the impostor's 42
        assert len(err.splitlines()) == 1 and b"before proving" in err, err
        if op == "stop":
            assert b"curl" not in err, err       # its words are not the job's
    finally:
        impostor.close()
        kill_tagged(tag)


def test_a_silent_program_on_the_services_port_does_not_hold_a_node_forever():
    port = free_block(2, ("127.0.0.1",))[0]
    impostor = Impostor(port + 1, b"")
    tag = new_tag()
    try:
        p = _node(port, tag)
        out, err = p.communicate(timeout=90)
        assert p.returncode == 1, err
        assert b"did not prove within 15 s" in err and len(err.splitlines()) == 1, err
    finally:
        impostor.close()
        kill_tagged(tag)
