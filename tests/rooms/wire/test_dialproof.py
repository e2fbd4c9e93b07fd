"""The dial-back's two-way proof: an agent runs nothing and sends nothing of its
token to a far end that has not proved it knows the token (another user listening
first on an address the agent dials: the host's own loopback, a bridge's address
both machines have), and the launcher takes no connection that has not proved it.

The impostors here listen on 127.0.0.2 at the launcher's port, the first address
the agents are given; the launcher listens on 127.0.0.1.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import socket
import subprocess
import sys
import threading
import time
from typing import List

import pytest
from hypothesis import given, settings, strategies as st

from mslaunch.machine.loop import Loop
from mslaunch.wire import dialback, dialproof

HEX = "0123456789abcdef"


ADDRESSES = st.one_of(st.ip_addresses(v=4).map(str), st.ip_addresses(v=6).map(str),
                      st.ip_addresses(v=6).map(lambda a: a.exploded),
                      st.ip_addresses(v=4).map(lambda a: f"::ffff:{a}"))


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=HEX, min_size=1, max_size=64), st.sampled_from(["launcher", "agent"]),
       st.text(alphabet=HEX, min_size=32, max_size=32),
       st.text(alphabet=HEX, min_size=32, max_size=32), ADDRESSES)
def test_a_proof_is_rfc_2104_hmac_sha256_on_both_sides(token, who, ours, theirs, addr):
    import ipaddress
    where = dialproof.address(addr)
    # one spelling: what the address is, IPv4-mapped IPv6 as IPv4
    parsed = ipaddress.ip_address(addr)
    mapped = getattr(parsed, "ipv4_mapped", None)
    assert ipaddress.ip_address(where) == (mapped or parsed)
    assert dialproof.address(where) == where
    want = hmac.new(token.encode(), f"{who} {ours} {theirs} {where}".encode(),
                    hashlib.sha256).hexdigest()
    assert dialproof.proof(token, who, ours, theirs, where) == want
    # the agents' one-line program computes the same (no address: it dials nothing)
    space = {"h": dialproof.HELLO, "t": token, "a": "", "m": "", "socket": socket}
    exec(dialproof.AGENT_HANDSHAKE, space)
    assert space["s"] is None and space["where"](addr) == where
    assert space["mac"](who, ours, theirs, where) == want
    assert dialproof.tag_of(token) == hashlib.sha256(
        f"mslaunch-dial {token}".encode()).hexdigest()[:32]


class Impostor:
    """Listens on 127.0.0.2:``port`` and answers each connection with ``answer``
    (then a "bootstrap" that would note it ran); keeps what it was sent."""

    def __init__(self, port: int, answer: bytes, ran: str) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.2", port))
        self.sock.listen(8)
        self.heard = b""
        self.answer = answer
        code = f"open({ran!r}, 'w').close()\n".encode()
        self.bootstrap = str(len(code)).encode() + b"\n" + code
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(2)
                try:
                    self.heard += conn.recv(4096)
                    conn.sendall(self.answer + self.bootstrap)
                    while True:
                        more = conn.recv(4096)
                        if not more:
                            break
                        self.heard += more
                except OSError:
                    pass

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def launcher():
    loop = Loop()
    lines: List[str] = []
    listener = dialback.Listener(loop, ["127.0.0.1"], tls=False, log=lines.append)
    yield loop, listener, lines
    listener.close()
    loop.close()


def _expect(listener, close: bool = False):
    """A token the launcher expects: (the token, what each connection that proved
    it brought with it, the launcher's port); ``close``: the connection is closed."""
    token = dialback.new_token()
    got: List[bytes] = []

    def taken(sock, first, about) -> None:
        got.append(first)
        if close:
            sock.close()
    listener.expect(token, taken)
    return token, got, listener.port_of("127.0.0.1")


def _dial(loop, addresses, port: int, token: str, until=lambda: True):
    """An agent's output connection (``dialback.dial``) made on a thread while the
    launcher's loop runs (until ``until()`` too): its socket, or None."""
    result: List[object] = []
    dialer = threading.Thread(target=lambda: result.append(
        dialback.dial(addresses, port, token, None, timeout=3.0)))
    dialer.start()
    deadline = time.monotonic() + 30
    while (dialer.is_alive() or not until()) and time.monotonic() < deadline:
        loop.run_once(0.02)
    dialer.join()
    return result[0]


def _answers():
    nonce = "ab" * 16
    return [b"", b"junk\n", f"{nonce} {'0' * 64}\n".encode(),
            f"{nonce} {dialproof.proof('not-the-token', 'launcher', 'x', nonce, 'y')}\n".encode()]


@pytest.mark.parametrize("answer", _answers())
def test_the_dial_program_runs_nothing_an_impostor_sends_and_tells_it_nothing(
        tmp_path, launcher, answer):
    from mslaunch.backends.agents.starters.rsh import _DIAL
    loop, listener, _ = launcher
    token, got, port = _expect(listener, close=True)
    ran = str(tmp_path / "impostor-ran")
    impostor = Impostor(port, answer, ran)
    try:
        env = dict(os.environ, MSLAUNCH_DIAL=f"127.0.0.2:{port},127.0.0.1:{port}",
                   MSLAUNCH_DIAL_TOKEN=token)
        agent = subprocess.Popen([sys.executable, "-S", "-c", _DIAL], env=env,
                                 stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 30
        while not got and time.monotonic() < deadline:
            loop.run_once(0.05)
        # the agent passed the impostor by and proved itself to the launcher,
        # which closed it (no bootstrap here): it never ran the impostor's code
        assert got == [b""]
        agent.wait(timeout=30)
    finally:
        impostor.close()
    assert not os.path.exists(ran)
    assert token.encode() not in impostor.heard
    assert impostor.heard.startswith(b"mslaunch-dial " + dialproof.tag_of(token).encode())


def test_the_dial_program_alone_with_an_impostor_says_so_in_one_line(tmp_path):
    from mslaunch.backends.agents.starters.rsh import _DIAL
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]          # held, never listened on: refused
    ran = str(tmp_path / "impostor-ran")
    token = dialback.new_token()
    impostor = Impostor(port, b"", ran)
    impostor.answer = f"{'ab' * 16} {'0' * 64}\n".encode()
    try:
        env = dict(os.environ, MSLAUNCH_DIAL=f"127.0.0.2:{port},127.0.0.1:{port}",
                   MSLAUNCH_DIAL_TOKEN=token)
        r = subprocess.run([sys.executable, "-S", "-c", _DIAL], env=env, timeout=60,
                           stdin=subprocess.DEVNULL, capture_output=True)
    finally:
        impostor.close()
        probe.close()
    assert r.returncode == 1
    assert r.stderr.decode().splitlines() == [
        f"mslaunch: cannot reach the launcher at 127.0.0.2:{port},127.0.0.1:{port}"]
    assert not os.path.exists(ran) and token.encode() not in impostor.heard


@pytest.mark.parametrize("answer", _answers())
def test_an_agent_s_output_connection_passes_an_impostor_by(tmp_path, launcher, answer):
    loop, listener, _ = launcher
    token, got, port = _expect(listener)
    impostor = Impostor(port, answer, str(tmp_path / "ran"))
    try:
        sock = _dial(loop, ["127.0.0.2", "127.0.0.1"], port, token)
        assert sock is not None and sock.getpeername()[0] == "127.0.0.1"
        sock.sendall(b"output")
        deadline = time.monotonic() + 10
        while not got and time.monotonic() < deadline:
            loop.run_once(0.02)
        sock.close()
    finally:
        impostor.close()
    assert got in ([b""], [b"output"])
    assert token.encode() not in impostor.heard


def test_the_launcher_takes_no_connection_without_the_agent_s_proof(launcher):
    # Another user who learnt the tag (it answered an agent's dial in the
    # launcher's place) connects to the launcher with it: the launcher proves
    # itself, which tells nothing of the token; a wrong proof back is closed,
    # and the real agent's place is still kept.
    loop, listener, lines = launcher
    token, got, port = _expect(listener)
    tag = dialproof.tag_of(token).encode()
    thief = socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        thief.sendall(b"mslaunch-dial " + tag + b" " + b"cd" * 16 + b"\n")
        answer = b""
        deadline = time.monotonic() + 10
        while not answer.endswith(b"\n") and time.monotonic() < deadline:
            loop.run_once(0.02)
            try:
                thief.settimeout(0.05)
                answer += thief.recv(200)
            except socket.timeout:
                pass
        assert answer.endswith(b"\n") and token.encode() not in answer
        thief.settimeout(5)
        thief.sendall(b"0" * 64 + b"\n")
        deadline = time.monotonic() + 5
        while not lines and time.monotonic() < deadline:
            loop.run_once(0.02)
        assert lines == ["link listener: closed a connection that gave a wrong proof"], lines
        assert thief.recv(10) == b""
    finally:
        thief.close()
    sock = _dial(loop, ["127.0.0.1"], port, token, until=lambda: bool(got))
    assert got == [b""] and sock is not None
    sock.close()


class Relay:
    """Listens on 127.0.0.2:``port`` and relays each connection both ways to the
    launcher at 127.0.0.1:``port``, byte for byte."""

    def __init__(self, port: int) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.2", port))
        self.sock.listen(8)
        self.port = port
        self.relayed = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                near, _ = self.sock.accept()
            except OSError:
                return
            far = socket.create_connection(("127.0.0.1", self.port), timeout=5)
            self.relayed += 1
            for a, b in ((near, far), (far, near)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src, dst) -> None:
        try:
            while True:
                data = src.recv(4096)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        self.sock.close()


def test_one_who_relays_both_ways_is_not_taken_for_the_launcher(launcher):
    # The relay passes the launcher's proof on unchanged: it is for the
    # launcher's address, 127.0.0.1, and the agent reached 127.0.0.2.
    loop, listener, _ = launcher
    token, got, port = _expect(listener)
    relay = Relay(port)
    try:
        relayed = _dial(loop, ["127.0.0.2"], port, token)
    finally:
        relay.close()
    assert relay.relayed == 1 and relayed is None and got == []
    # the same agent, told the launcher's own address, is taken
    sock = _dial(loop, ["127.0.0.1"], port, token, until=lambda: bool(got))
    assert got == [b""] and sock is not None
    sock.close()


def test_the_dial_program_is_not_taken_in_by_a_relay(launcher):
    from mslaunch.backends.agents.starters.rsh import _DIAL
    loop, listener, _ = launcher
    token, got, port = _expect(listener)
    relay = Relay(port)
    try:
        env = dict(os.environ, MSLAUNCH_DIAL=f"127.0.0.2:{port}", MSLAUNCH_DIAL_TOKEN=token)
        agent = subprocess.Popen([sys.executable, "-S", "-c", _DIAL], env=env,
                                 stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 30
        while agent.poll() is None and time.monotonic() < deadline:
            loop.run_once(0.05)
        _, err = agent.communicate(timeout=30)
    finally:
        relay.close()
    assert relay.relayed == 1 and got == []
    assert agent.returncode == 1 and err.decode().splitlines() == [
        f"mslaunch: cannot reach the launcher at 127.0.0.2:{port}"], err


def test_an_agent_started_early_waits_for_the_launcher_to_answer(launcher):
    # Under Slurm the agents are started while the launcher still plans: their
    # connections wait in the kernel's queue, unanswered, longer than a read's
    # timeout of 10 s (the planning is the sleep here: nothing runs the loop).
    from mslaunch.backends.agents.starters.rsh import _DIAL
    loop, listener, _ = launcher
    token, got, port = _expect(listener, close=True)
    env = dict(os.environ, MSLAUNCH_DIAL=f"127.0.0.1:{port}", MSLAUNCH_DIAL_TOKEN=token)
    agent = subprocess.Popen([sys.executable, "-S", "-c", _DIAL], env=env,
                             stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        time.sleep(12)
        assert agent.poll() is None, agent.stderr.read()
        deadline = time.monotonic() + 30
        while not got and time.monotonic() < deadline:
            loop.run_once(0.05)
        assert got == [b""]
    finally:
        agent.kill()
        agent.communicate()


def test_an_impostor_that_answers_slowly_holds_an_agent_no_longer_than_its_wait(
        tmp_path, launcher, monkeypatch):
    # One byte at a time, each within a read's timeout: the agent's wait for a
    # proof is one deadline per address (here 2 s), not a timeout per byte.
    from mslaunch.backends.agents.starters.dialin import dial_program
    monkeypatch.setattr(dialproof, "AGENT_HANDSHAKE",
                        dialproof.AGENT_HANDSHAKE.replace("WAIT = 120.0", "WAIT = 2.0"))
    program = dial_program("", "e.pop('MSLAUNCH_DIAL_TOKEN')")
    loop, listener, _ = launcher
    token, got, port = _expect(listener, close=True)
    slow = socket.socket()
    slow.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    slow.bind(("127.0.0.2", port))
    slow.listen(1)
    stop = threading.Event()

    def trickle() -> None:
        conn, _ = slow.accept()
        with conn:
            while not stop.wait(0.2):
                try:
                    conn.sendall(b"a")
                except OSError:
                    return
    threading.Thread(target=trickle, daemon=True).start()
    env = dict(os.environ, MSLAUNCH_DIAL=f"127.0.0.2:{port},127.0.0.1:{port}",
               MSLAUNCH_DIAL_TOKEN=token)
    agent = subprocess.Popen([sys.executable, "-S", "-c", program], env=env,
                             stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while not got and time.monotonic() < deadline:
            loop.run_once(0.05)
        assert got == [b""]
    finally:
        stop.set()
        slow.close()
        agent.kill()
        agent.communicate()


def test_an_interpreter_without_its_own_sha256_proves_with_openssl_s():
    # (a FIPS build: --with-builtin-hashlib-hashes without sha256)
    code = ("import sys; sys.modules['_sha256'] = sys.modules['_sha2'] = None\n"
            "from mslaunch.wire import dialproof\n"
            "print(dialproof.proof('t', 'agent', 'a', 'b', 'c'))\n"
            "space = {'h': 'mslaunch-dial', 't': 't', 'a': '', 'm': '', 'socket': None}\n"
            "exec(dialproof.AGENT_HANDSHAKE, space)\n"
            "print(space['mac']('agent', 'a', 'b', 'c'))\n")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(dialproof.__file__))))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60, cwd=root)
    assert r.returncode == 0, r.stderr
    want = hmac.new(b"t", b"agent a b c", hashlib.sha256).hexdigest()
    assert r.stdout.decode().split() == [want, want]
