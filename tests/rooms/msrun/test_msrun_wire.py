"""Property tests for msrun mode's parsers and its node service wire.

The msrun command line, the TLS config file and both ends of the node
service's link are fed random input: each must end in a spec, one error
line or a closed connection -- never an exception out of the event loop --
and a real node must still be able to join the service afterwards.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import tempfile
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mslaunch.cli.common import Exit
from mslaunch.cli.msrun import EXTRAS, OPTIONS, parse_msrun
from mslaunch.core.errors import LaunchError, UsageError
from mslaunch.msrun import secret as auth
from mslaunch.msrun import service as svc
from mslaunch.msrun.nodelink import NodeLink
from mslaunch.msrun import tls
from mslaunch.wire import link
from mslaunch.machine.loop import Loop
from mslaunch.core.spec import MsrunSpec

FAST = settings(max_examples=120, deadline=None,
                suppress_health_check=[HealthCheck.too_slow])
SECRET = b"s" * 32

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.floats(allow_nan=False)
    | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12),
                                                                inner, max_size=4),
    max_leaves=12)
values = st.sampled_from(["8", "0", "-1", "True", "False", "1", "x", "", "65535", "127.0.0.1",
                          "net.py", "{\"device0\":[\"0-1\"]}", "{}", "[1]", "99999999999",
                          "\u00b2", "a\nb", "--worker_num"]) | st.text(max_size=12)


def one_line(err: Exception) -> str:
    text = str(err)
    assert text and "\n" not in text, text
    return text


# -- the command line ---------------------------------------------------------------
@st.composite
def msrun_argv(draw):
    words = []
    for name in draw(st.lists(st.sampled_from(sorted(OPTIONS) + sorted(EXTRAS) + ["bogus"]),
                              max_size=6)):
        value = draw(values)
        if draw(st.booleans()):
            words.append(f"--{name}={value}")
        else:
            words += [f"--{name}", value]
    words += draw(st.lists(st.sampled_from(["net.py", "-v", "--", "--x=1", "a b"])
                           | st.text(max_size=8), max_size=3))
    return words


@FAST
@given(msrun_argv())
def test_msrun_command_line_gives_a_spec_or_one_error_line(argv):
    try:
        spec = parse_msrun(argv)
    except UsageError as err:
        one_line(err)
        return
    except Exit:
        return
    assert isinstance(spec, MsrunSpec)
    assert 1 <= spec.local_worker_num <= spec.worker_num
    assert spec.argv and spec.argv[0] not in ("",)


# -- the TLS config ----------------------------------------------------------------
config_fields = st.fixed_dictionaries({}, optional={
    key: json_values | st.sampled_from(["a.pem", "", "cert.p12"])
    for key in ("server_cert_path", "client_cert_path", "ca_cert_path", "crl_path",
                "cipher_list", "cert_expire_warning_time_in_day")})


@FAST
@given(st.one_of(config_fields.map(json.dumps), json_values.map(json.dumps),
                 st.binary(max_size=64).map(lambda b: b.decode("latin-1"))))
def test_tls_config_gives_fields_or_one_error_line(text):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "config.json")
        with open(path, "w", encoding="utf-8", errors="surrogateescape") as f:
            f.write(text)
        try:
            config = tls.read_config(path)
        except LaunchError as err:
            assert path in one_line(err)
            return
    for key in ("server_cert_path", "client_cert_path", "ca_cert_path"):
        assert isinstance(config[key], str) and os.path.isabs(config[key])
    assert isinstance(config["cert_expire_warning_time_in_day"], int)


# -- the service, against hostile peers --------------------------------------------
def pump(loop: Loop, until, seconds: float = 2.0) -> None:
    end = time.monotonic() + seconds
    while not until() and time.monotonic() < end:
        loop.run_once(0.02)


def frame(kind: int, body: bytes) -> bytes:
    return struct.pack(">IB", len(body) + 1, kind) + body


hostile_messages = st.one_of(
    st.dictionaries(st.sampled_from(["op", "protocol", "nonce", "proof", "heartbeat",
                                     "workers", "node_rank", "ranks", "code", "message",
                                     "order"]),
                    json_values, max_size=6),
    st.fixed_dictionaries({"op": st.sampled_from(["auth", "register", "stop", "done", "hello",
                                                  "welcome", "ranks", "refuse"]),
                           "protocol": st.sampled_from([1, 2, "1", None]),
                           "nonce": st.sampled_from(["0" * 32, "zz", 5, None]) | st.text(max_size=40),
                           "proof": st.text(max_size=70) | json_values,
                           "heartbeat": json_values,
                           "code": json_values, "message": json_values,
                           "ranks": json_values}))
hostile_bytes = st.one_of(
    st.binary(max_size=300),
    st.lists(hostile_messages, min_size=1, max_size=3).map(
        lambda ms: b"".join(link.encode(link.NODE, m) for m in ms)),
    st.tuples(st.integers(0, 255), st.binary(max_size=64)).map(lambda kb: frame(*kb)),
    st.integers(0, 2**32 - 1).map(lambda n: struct.pack(">IB", n, link.NODE)))


def join(loop: Loop, port: int, workers: int = 1, order: str = "",
         store: tuple = ("", 0), log=lambda _line: None) -> dict:
    """A real node's link to the service on ``port``; its outcome lands in the dict."""
    state: dict = {}
    state["link"] = NodeLink(
        loop, addresses=["127.0.0.1"], port=port, secret=SECRET, node_rank=-1,
        workers=workers, deadline=time.monotonic() + 30, heartbeat=(1.0, 5),
        on_ranks=lambda ranks: state.setdefault("ranks", ranks),
        on_stop=lambda code, text: state.setdefault("stop", (code, text)), order=order,
        store=store, log=log)
    return state


def test_every_change_of_a_node_s_state_is_said_at_both_ends():
    # -v: the link says each of its steps, the service each node's; a node that
    # leaves is said gone, and its link ended
    loop = Loop()
    said: list = []
    service = svc.NodeService(loop, address="127.0.0.1", port=0, secret=SECRET,
                              worker_num=3, time_out=-1, log=said.append)
    port = service.sock.getsockname()[1]
    first_link: list = []
    first = join(loop, port, 2, log=first_link.append)
    second = join(loop, port, 1)
    try:
        pump(loop, lambda: "ranks" in first and "ranks" in second, 10)
        assert first_link == ["node link: connecting -> proving",
                              "node link: proving -> registering",
                              "node link: registering -> joined"]
        nodes = [line for line in said if "node service: node " in line]
        assert len(nodes) == 2 and all(line.endswith(": new -> joined") for line in nodes)
        first["link"].close()
        pump(loop, lambda: len([line for line in said if "-> gone" in line]) == 1, 10)
        assert first_link[-1] == "node link: joined -> ended"
        gone = [line for line in said if line.endswith(": joined -> gone")]
        assert len(gone) == 1 and f"(pid {os.getpid()})" in gone[0]
    finally:
        for node in (first, second):
            node["link"].close()
        service.close()
        loop.close()


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.permutations(["10.0.0.12", "10.0.0.2", "node-a"]), st.integers(0, 2))
def test_nodes_with_a_sort_key_get_their_ranks_in_its_order_once_all_came(keys, leaver):
    # torchrun's c10d rendezvous: node ranks follow the nodes' addresses (as
    # strings), whatever order they come in; a node that leaves before every
    # worker came is forgotten (it would sort first and take rank 0 otherwise)
    loop = Loop()
    service = svc.NodeService(loop, address="127.0.0.1", port=0, secret=SECRET,
                              worker_num=6, time_out=-1, log=lambda _line: None)
    port = service.sock.getsockname()[1]
    nodes = {}
    try:
        for i, key in enumerate(keys):
            if i == leaver:
                gone = join(loop, port, 1, "10.0.0.0", ("10.0.0.0", 999))
                pump(loop, lambda: any(p.state == "held" and p.order == "10.0.0.0"
                                       for p in service.peers.values()), 10)
                gone["link"].close()
                pump(loop, lambda: not any(p.order == "10.0.0.0"
                                           for p in service.peers.values()), 10)
                assert service.stopped is None and "ranks" not in gone
            nodes[key] = join(loop, port, 2, key, ("" if key == "node-a" else key, 1000 + i))
            pump(loop, lambda: sum(p.state in ("held", "joined")
                                   for p in service.peers.values()) == len(nodes), 10)
            if len(nodes) < 3:
                assert not any("ranks" in n or "stop" in n for n in nodes.values())
        pump(loop, lambda: all("ranks" in n or "stop" in n for n in nodes.values()), 10)
        assert {k: n.get("ranks") for k, n in nodes.items()} == {
            "10.0.0.12": [0, 1], "10.0.0.2": [2, 3], "node-a": [4, 5]}
        # rank 0's node names the store for all: its address and port
        port0 = 1000 + keys.index("10.0.0.12")
        assert {(n["link"].master_addr, n["link"].master_port) for n in nodes.values()} == {
            ("10.0.0.12", port0)}
    finally:
        for n in nodes.values():
            n["link"].close()
        service.close()
        loop.close()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(hostile_bytes, min_size=1, max_size=3), st.booleans())
def test_service_survives_hostile_peers_and_still_takes_a_real_node(chunks, hang_up):
    loop = Loop()
    lines: list = []
    service = svc.NodeService(loop, address="127.0.0.1", port=0, secret=SECRET,
                              worker_num=1, time_out=-1, log=lines.append)
    port = service.sock.getsockname()[1]
    try:
        rogue = socket.create_connection(("127.0.0.1", port), timeout=2)
        rogue.setblocking(False)
        pump(loop, lambda: bool(service.peers))
        for chunk in chunks:
            try:
                rogue.sendall(chunk)
            except (BlockingIOError, OSError):
                break
            pump(loop, lambda: False, 0.03)
        if hang_up:
            rogue.close()
        pump(loop, lambda: False, 0.05)
        assert not service.taken and service.stopped is None
        assert all(not p.authenticated for p in service.peers.values())
        node = join(loop, port)
        pump(loop, lambda: "ranks" in node or "stop" in node)
        assert node.get("ranks") == [0], node
        assert len(lines) <= 5 and all("\n" not in line for line in lines)
        node["link"].close()
        if not hang_up:
            rogue.close()
    finally:
        service.close()
        loop.close()


def test_service_keeps_its_place_for_real_nodes_under_a_connection_flood():
    loop = Loop()
    lines: list = []
    service = svc.NodeService(loop, address="127.0.0.1", port=0, secret=SECRET,
                              worker_num=2, time_out=-1, log=lines.append)
    port = service.sock.getsockname()[1]
    rogues = []
    try:
        for _ in range(svc.MAX_PENDING * 2):
            rogues.append(socket.create_connection(("127.0.0.1", port), timeout=2))
            loop.run_once(0)
        pump(loop, lambda: False, 0.2)
        assert len(service.peers) <= svc.MAX_PENDING
        nodes = [join(loop, port), join(loop, port)]
        pump(loop, lambda: all("ranks" in n or "stop" in n for n in nodes), 5)
        assert sorted(r for n in nodes for r in n.get("ranks", [])) == [0, 1], nodes
        # (beside the two nodes' own changes of state, said once they proved themselves)
        joined = [line for line in lines if line.endswith(": new -> joined")]
        assert len(joined) == 2 and len(lines) - len(joined) <= 5, lines
        for s in rogues:
            s.close()
        pump(loop, lambda: len(service.peers) == 2, 5)
        assert len(service.peers) == 2
        assert not [line for line in lines if line.endswith("-> gone")], lines
    finally:
        for s in rogues:
            s.close()
        service.close()
        loop.close()


# -- a node, against a hostile service ---------------------------------------------
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(hostile_bytes, min_size=0, max_size=3), st.booleans())
def test_node_ends_cleanly_against_a_hostile_service(chunks, greet):
    loop = Loop()
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    port = server.getsockname()[1]
    node = join(loop, port)
    try:
        pump(loop, lambda: node["link"].state != "connecting")
        server.settimeout(3)
        conn, _ = server.accept()
        conn.settimeout(1)
        if greet:
            # A greeting that is right in form but proves nothing.
            conn.sendall(link.encode(link.NODE, {"op": "hello", "protocol": 1,
                                                 "nonce": auth.new_nonce()}))
        for chunk in chunks:
            try:
                conn.sendall(chunk)
            except OSError:
                break
            pump(loop, lambda: "stop" in node, 0.03)
        conn.close()
        pump(loop, lambda: "stop" in node, 3)
        assert "ranks" not in node, node
        code, text = node["stop"]
        assert 1 <= code <= 255 and text and "\n" not in text and len(text) < 1200
    finally:
        node["link"].close()
        server.close()
        loop.close()


def test_node_refuses_a_service_without_the_secret():
    loop = Loop()
    service = svc.NodeService(loop, address="127.0.0.1", port=0, secret=b"x" * 32,
                              worker_num=1, time_out=-1, log=lambda _l: None)
    node = join(loop, service.sock.getsockname()[1])
    try:
        pump(loop, lambda: "stop" in node or "ranks" in node, 3)
        code, text = node["stop"]
        assert code == 1 and "secret" in text and "\n" not in text
        assert "ranks" not in node and not service.taken
    finally:
        node["link"].close()
        service.close()
        loop.close()


@pytest.mark.parametrize("nonce", ["", "0" * 31, "g" * 32, "0" * 200, 5, None])
def test_nonces_of_the_wrong_form_are_refused(nonce):
    assert not auth.valid_nonce(nonce)
    assert auth.valid_nonce(auth.new_nonce())


def test_no_option_of_mpiruns_dialect_is_taken_for_a_start_of_msruns():
    # msrun's names are taken by a unique start (as its argparse does): none of the
    # mpirun dialect's long spellings may begin one, or its lines would turn msrun's
    from mslaunch.cli.common import is_msrun
    from mslaunch.cli.options import SPELLINGS
    for spelling in SPELLINGS:
        assert not is_msrun([f"--{spelling}=1", "./a.out"]), spelling
        assert not is_msrun([f"--{spelling}", "1", "./a.out"]), spelling
    assert is_msrun(["--worker_n=2", "net.py"]) and is_msrun(["--local_w", "2", "net.py"])
