"""Dial-back: the launcher's certificate and credentials, the token line an
agent dials back with, and the listener that waits for it."""

from __future__ import annotations

import select
import subprocess
import time
from typing import List

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import PY, clean_env

def test_the_launchers_certificate_is_a_self_signed_ca_for_two_days():
    """Its DER is put together by hand: held against cryptography's parser and
    OpenSSL's handshake (here, and in every TLS endpoint test)."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    from mslaunch.wire import dialback
    import warnings
    serials = set()
    for _ in range(400):     # signatures and serials of every length the DER must encode
        key_pem, cert_pem = dialback.self_signed()
        with warnings.catch_warnings():
            warnings.simplefilter("error")      # cryptography warns of a negative serial
            cert = x509.load_pem_x509_certificate(cert_pem)
        key = load_pem_private_key(key_pem, None)
        assert cert.public_key().public_numbers() == key.public_key().public_numbers()
        cert.public_key().verify(cert.signature, cert.tbs_certificate_bytes,
                                 ec.ECDSA(hashes.SHA256()))
        assert cert.version == x509.Version.v3 and cert.issuer == cert.subject
        assert cert.subject.rfc4514_string() == "CN=mslaunch launcher"
        constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints)
        assert constraints.critical and constraints.value.ca
        now = datetime.datetime.now(datetime.timezone.utc)
        assert cert.not_valid_before_utc < now < cert.not_valid_after_utc
        assert cert.not_valid_after_utc - now > datetime.timedelta(days=1, hours=23)
        serials.add(cert.serial_number)
        assert 0 < cert.serial_number < 1 << 127
    assert len(serials) == 400


def test_making_the_credentials_does_not_import_x509():
    code = ("import sys\nfrom mslaunch.wire import dialback\ndialback.tls_credentials()\n"
            "print('cryptography.x509' in sys.modules)")
    out = subprocess.run([PY, "-c", code], capture_output=True, text=True, env=clean_env(),
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="0123456789abcdef", max_size=48), st.binary(max_size=40),
       st.binary(max_size=260), st.text(alphabet="0123456789abcdef ", max_size=20))
def test_the_dial_token_line_is_read_whole_or_not_at_all(token, rest, junk, about):
    from mslaunch.wire.dialback import read_hello as read_token
    line = b"mslaunch-dial " + token.encode() + b"\n"
    for cut in range(len(line)):
        assert read_token(line[:cut]) is None
    assert read_token(line + rest) == (token, "", rest)
    told = b"mslaunch-dial " + token.encode() + b" " + about.encode() + b"\n"
    assert read_token(told + rest) == (token, about, rest)
    try:
        got = read_token(junk)
    except ValueError:
        assert b"\n" not in junk and len(junk) > 200
    else:
        assert got is None or junk.startswith(b"mslaunch-dial ") or got[0] == ""


def test_the_dial_listener_keeps_a_place_for_an_agent_slow_to_speak():
    # An agent's connection is accepted, then a flood of strangers arrives
    # before its token does (a busy host): the strangers wait in the kernel's
    # queue instead of pushing the agent out.
    import socket as socket_mod

    from mslaunch.wire import dialback
    from mslaunch.machine.loop import Loop
    loop = Loop()
    lines: List[str] = []
    listener = dialback.Listener(loop, ["127.0.0.1"], tls=False, log=lines.append)
    got: List[bytes] = []
    token = dialback.new_token()
    # (a plain token, as an srun task's shell presents it)
    listener.expect(token, lambda sock, first, about: got.append(first), plain=True)
    port = listener.port_of("127.0.0.1")
    assert port is not None
    agent = socket_mod.create_connection(("127.0.0.1", port), timeout=2)
    strangers = []
    try:
        deadline = time.monotonic() + 1
        while not listener.pending and time.monotonic() < deadline:
            loop.run_once(0.01)
        assert len(listener.pending) == 1
        for _ in range(dialback.MAX_PENDING + 40):
            strangers.append(socket_mod.create_connection(("127.0.0.1", port), timeout=2))
            loop.run_once(0)
        assert len(listener.pending) == dialback.MAX_PENDING
        # (under load the flood outlasts a stranger's time, and the first ones are
        # rightly pushed out: what counts is that the agent's place is kept)
        agent.sendall(b"mslaunch-dial " + token.encode() + b"\nfirst")
        deadline = time.monotonic() + 2
        while not got and time.monotonic() < deadline:
            loop.run_once(0.01)
        assert got == [b"first"]
        # The strangers that had their time make room for the queued ones.
        deadline = time.monotonic() + 3
        while not lines and time.monotonic() < deadline:
            loop.run_once(0.05)
        assert lines and "a connection that was pushed out by newer connections" in lines[0]
        assert len(listener.pending) <= dialback.MAX_PENDING
    finally:
        for s in strangers + [agent]:
            s.close()
        listener.close()
        loop.close()


def test_an_agent_slow_to_prove_itself_is_let_in():
    """An agent started on a busy machine may take seconds between its connection
    and its proof: one that proved after 4 s was cut off, and, reading its
    bootstrap, met a reset (its host lost as "ConnectionResetError")."""
    import socket as socket_mod

    from mslaunch.wire import dialback
    from mslaunch.wire.dialproof import HELLO, address, new_nonce, proof, tag_of
    from mslaunch.machine.loop import Loop
    loop = Loop()
    lines: List[str] = []
    listener = dialback.Listener(loop, ["127.0.0.1"], tls=False, log=lines.append)
    got: List[bytes] = []
    token = dialback.new_token()
    listener.expect(token, lambda sock, first, about: got.append(first))
    port = listener.port_of("127.0.0.1")
    assert port is not None
    agent = socket_mod.create_connection(("127.0.0.1", port), timeout=2)

    def run_until(done, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not done() and time.monotonic() < deadline:
            loop.run_once(0.05)
    try:
        run_until(lambda: bool(lines), 4.0)           # the agent's Python starting
        assert not lines, lines
        ours = new_nonce()
        agent.sendall(f"{HELLO} {tag_of(token)} {ours}\n".encode())
        run_until(lambda: bool(select.select([agent], [], [], 0)[0]), 5.0)
        theirs = agent.recv(256).decode().split()[0]
        run_until(lambda: bool(lines), 2.0)           # the agent's proof being made
        where = address(agent.getpeername()[0])
        agent.sendall(f"{proof(token, 'agent', ours, theirs, where)}\n".encode())
        run_until(lambda: bool(got), 5.0)
        assert got == [b""], (got, lines)
    finally:
        agent.close()
        listener.close()
        loop.close()


@pytest.mark.parametrize("tls", [False, True])
def test_a_silent_peer_does_not_hold_the_listener_s_loop(tls, monkeypatch):
    # A peer that connects and says nothing (no TLS handshake, no token) must
    # leave the loop free: timers fire, and the peer is closed after its time
    # (here 2 s, not its 20).
    import socket as socket_mod

    from mslaunch.wire import dialback
    from mslaunch.machine.loop import Loop
    monkeypatch.setattr(dialback, "AUTH_SECONDS", 2.0)
    loop = Loop()
    lines: List[str] = []
    listener = dialback.Listener(loop, ["127.0.0.1"], tls=tls, log=lines.append)
    ticks: List[float] = []

    def tick() -> None:
        ticks.append(time.monotonic())
        loop.call_later(0.05, tick)
    loop.call_later(0.05, tick)
    port = listener.port_of("127.0.0.1")
    assert port is not None
    peer = socket_mod.create_connection(("127.0.0.1", port), timeout=2)
    try:
        deadline = time.monotonic() + dialback.AUTH_SECONDS + 2
        while not lines and time.monotonic() < deadline:
            loop.run_once(0.05)
        assert lines and "did not present a token in time" in lines[0], lines
        # about 20 ticks a second while the peer said nothing
        assert len(ticks) > 10 * dialback.AUTH_SECONDS, len(ticks)
    finally:
        peer.close()
        listener.close()
        loop.close()


def test_the_early_step_s_agents_are_told_one_port_held_in_both_families():
    """srun's agents dial the address Slurm gives them, IPv4 or IPv6, at the one
    port in MSLAUNCH_DIAL: this process must hold that port in both families, so
    that no other process can take it in the family the launcher did not bind
    (an agent would present its token there)."""
    import errno
    import socket

    from mslaunch.backends.agents.starters.dialin import Greeter
    from mslaunch.backends.agents.starters.slurm import _EVERYWHERE
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::", 0))
    except OSError:
        pytest.skip("no IPv6 here: the IPv4 listener alone is used")
    greeter = Greeter(_EVERYWHERE[0], {"h1": "t" * 48})
    try:
        entries = greeter.dial.split(",")
        assert len(entries) == 1 and entries[0].startswith("::"), greeter.dial
        port = int(entries[0].rsplit(":", 1)[1])
        for family, address in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
            with socket.socket(family, socket.SOCK_STREAM) as stranger:
                if family == socket.AF_INET6:
                    stranger.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                with pytest.raises(OSError) as err:
                    stranger.bind((address, port))
                assert err.value.errno == errno.EADDRINUSE
        # an IPv4 agent reaches it, and the launcher sees its own plain address
        with socket.create_connection(("127.0.0.1", port), 5):
            pass
    finally:
        greeter.abandon()
    from mslaunch.backends.agents.starters.dialin import plain_address
    assert plain_address("::ffff:10.1.2.3") == "10.1.2.3" and plain_address("::1") == "::1"


@pytest.mark.parametrize("node, address, said", [
    ("h1", None, "mslaunch: srun gave no SLURM_LAUNCH_NODE_IPADDR to dial"),
    ("h9", "127.0.0.1", "mslaunch: this host is not one the launcher started an agent for"),
    ("h1", "127.0.0.1", "mslaunch: cannot reach the launcher at 127.0.0.1:9"),
])
def test_an_srun_agent_that_cannot_dial_says_why_in_one_line(node, address, said):
    """The early step's agents dial SLURM_LAUNCH_NODE_IPADDR with their node's
    token (the interpreter runs with -S: no exit() builtin); each way of failing
    is one line, not a traceback."""
    import os
    import sys

    from mslaunch.backends.agents.starters.slurm import _DIAL
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    env.update(MSLAUNCH_DIAL="*:9", MSLAUNCH_DIAL_TOKENS="h1=t", SLURMD_NODENAME=node)
    if address:
        env["SLURM_LAUNCH_NODE_IPADDR"] = address
    r = subprocess.run([sys.executable, "-S", "-c", _DIAL], env=env, capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 1 and r.stderr.strip() == said, r


@pytest.mark.parametrize("said, expected, cleared", [
    (["srun: error: Unable to create step for job 7: Invalid generic resource"],
     "srun ended (status 1) before every agent started: srun: error: Unable to create step "
     "for job 7: Invalid generic resource", False),
    # an srun older than the cached version: getopt's line, then Slurm's hint
    (["srun: unrecognized option '--external-launcher'",
      'Try "srun --help" for more information'],
     "srun ended (status 1) before every agent started: srun: unrecognized option "
     "'--external-launcher' (srun's version is asked again on the next run)", True),
])
def test_an_srun_that_ends_before_its_agents_gives_one_line(tmp_path, monkeypatch, said,
                                                              expected, cleared):
    from mslaunch.core.errors import LaunchError
    from mslaunch.machine.loop import Loop
    from mslaunch.backends.agents.starters import slurm
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cache = slurm._version_cache()
    os_ = __import__("os")
    os_.makedirs(os_.path.dirname(cache))
    with open(cache, "w") as f:
        f.write("/usr/bin/srun 1 2 3\nslurm 23.11.1\n")
    script = "; ".join(f"echo {line!r} >&2" for line in said) + "; exit 1"
    step = slurm._Step(["sh", "-c", script], dict(os_.environ))
    loop = Loop()
    try:
        with pytest.raises(LaunchError) as err:
            slurm._await_agents(loop, step, ["h1"], {}, None)
    finally:
        loop.close()
    assert str(err.value) == expected
    assert os_.path.exists(cache) is not cleared


hostnames = st.from_regex(r"[a-z][a-z0-9-]{0,10}[a-z0-9]", fullmatch=True)


@given(name=hostnames, before=st.sampled_from(["", "srun: error: ", "mslaunch agent on ", "(", " "]),
       after=st.sampled_from(["", ": task 2: Exited", ".cluster: no route", ")", " ", ","]),
       longer=st.sampled_from(["x", "1", "-b", "_"]))
def test_an_srun_line_names_a_node_only_as_a_whole_word(name, before, after, longer):
    from mslaunch.backends.agents.starters.dialin import names_node
    assert names_node(f"{before}{name}{after}", name)
    # another node whose name holds this one's
    assert not names_node(f"{before}{name}{longer}{after}", name)
    assert not names_node(f"{before}{longer}{name}{after}", name)
    assert not names_node(f"{before}{longer}.{name}{after}", name)
