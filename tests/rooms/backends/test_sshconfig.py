"""``~/.ssh/config`` as mslaunch reads it (mslaunch.backends.agents.starters.ssh.config), against OpenSSH.

OpenSSH's own client is the reference: ``ssh -G`` prints the settings it
would use for a host, without connecting.  Random configurations of ``Host``
and ``Match`` blocks are resolved by both and must agree.
"""

from __future__ import annotations

import os
import shutil
import sys
import subprocess
from typing import Dict, List

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import REPO
from mslaunch.backends.agents.starters.ssh.config import ConfigError, SSHConfig, parse, split_args

SSH = shutil.which("ssh")
needs_ssh = pytest.mark.skipif(SSH is None and not os.environ.get("CI"),
                               reason="needs OpenSSH's ssh client")


def ssh_g(config: str, host: str, home: str, *options: str) -> Dict[str, List[str]]:
    """What ``ssh -G [options]`` says for ``host`` under ``config``: keyword -> values."""
    path = os.path.join(home, "config")
    with open(path, "w") as f:
        f.write(config)
    r = subprocess.run([SSH or "ssh", "-G", "-F", path, *options, host],
                       capture_output=True, text=True,
                       env={"HOME": home, "PATH": os.environ.get("PATH", "/usr/bin:/bin")},
                       stdin=subprocess.DEVNULL, timeout=30)
    assert r.returncode == 0, (config, r.stderr)
    out: Dict[str, List[str]] = {}
    for line in r.stdout.splitlines():
        key, _, value = line.partition(" ")
        out.setdefault(key, []).append(value)
    return out


# ---------------------------------------------------------------------------
# examples

def test_first_value_wins_and_identity_files_add_up(tmp_path):
    config = SSHConfig("Host a*\n  User one\n  IdentityFile /k/1\n"
                       "Host *\n  User two\n  Port=2222\n  IdentityFile /k/2\n  IdentityFile /k/1\n")
    assert config.lookup("ab") == {"user": "one", "identityfile": ["/k/1", "/k/2"],
                                   "port": "2222"}
    assert config.lookup("b") == {"user": "two", "port": "2222",
                                  "identityfile": ["/k/2", "/k/1"]}


def test_negated_host_pattern_vetoes_the_block():
    config = SSHConfig("Host * !bastion\n  ProxyJump bastion\n")
    assert config.lookup("node1") == {"proxyjump": "bastion"}
    assert config.lookup("bastion") == {}
    assert config.lookup("NODE1") == {"proxyjump": "bastion"}   # names in lower case


def test_match_criteria():
    user = SSHConfig().local_user
    config = SSHConfig("Host n1\n  HostName n1.example\n"
                       "Match host *.example !originalhost n2\n  Port 2201\n"
                       f"Match localuser {user} user root,admin\n  ConnectTimeout 7\n"
                       "Match canonical\n  User never\n"
                       "Match all\n  User everyone\n")
    assert config.lookup("n1") == {"hostname": "n1.example", "port": "2201",
                                   "user": "everyone",
                                   **({"connecttimeout": "7"} if user in ("root", "admin")
                                      else {})}


def test_match_final_reads_the_file_again():
    config = SSHConfig("Match host *.example\n  User late\n"
                       "Host n1\n  HostName n1.example\n"
                       "Host n1.example\n  IdentityFile /k/1\n"
                       "Match final\n  Port 2202\n")
    assert config.lookup("n1") == {"hostname": "n1.example", "user": "late", "port": "2202",
                                   "identityfile": ["/k/1"]}
    assert SSHConfig("Match final\n  HostName other\n").lookup("x") == {}
    assert SSHConfig("Match !final\n  Port 1\n").lookup("x") == {"port": "1"}


def test_match_exec_runs_the_command_with_tokens(tmp_path):
    mark = tmp_path / "ran"
    config = SSHConfig(f"Match exec \"test %h = n1 && touch {mark}\"\n  User yes\n"
                       f"Match exec false\n  Port 1\n")
    assert config.lookup("n1") == {"user": "yes"}
    assert mark.exists()
    assert config.lookup("n2") == {}


def test_tokens_and_tilde(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    config = SSHConfig("Host *\n  HostName %h.lan\n  User bob\n  Port 2022\n"
                       "  IdentityFile ~/.ssh/%r@%n_%p\n  IdentityFile %d/k%%\n"
                       "  UserKnownHostsFile ~/kh1 /etc/kh2\n  ProxyCommand nc %h %p\n")
    found = config.lookup("web")
    assert found["hostname"] == "web.lan"
    assert found["identityfile"] == [f"{tmp_path}/.ssh/bob@web_2022", f"{tmp_path}/k%"]
    assert found["userknownhostsfile"] == [f"{tmp_path}/kh1", "/etc/kh2"]
    assert found["proxycommand"] == "nc web.lan 2022"


@pytest.mark.parametrize("text, message", [
    ('Host x\n  User "bob\n', "line 2: unbalanced quote"),
    ("Host\n", "line 1: host without an argument"),
    ("Match bogus x\n  User a\n", "line 1: unsupported Match criterion 'bogus'"),
    ("Match user\n", "line 1: Match user needs an argument"),
    ("Host *\n  IdentityFile /k/%Z\n", "the token %Z is not allowed"),
    ("Host *\n  HostName %p.x\n", "the token %p is not allowed"),
])
def test_bad_lines_are_named(text, message):
    with pytest.raises(ConfigError) as info:
        SSHConfig(text, origin="cfg").lookup("x")
    assert message in str(info.value)
    assert str(info.value).startswith("cfg")


# ---------------------------------------------------------------------------
# properties

WORD = st.text(alphabet=st.characters(blacklist_characters='"\n\r\0', blacklist_categories=("Cs",)),
               min_size=1, max_size=12)


@given(st.lists(WORD, min_size=1, max_size=6))
def test_split_args_keeps_quoted_words_whole(words):
    assert split_args(" ".join('"' + w + '"' for w in words)) == words


@given(st.lists(WORD.filter(lambda w: not any(c.isspace() for c in w)), min_size=1, max_size=6))
def test_split_args_splits_plain_words_on_blanks(words):
    assert split_args(" \t ".join(words)) == words


@given(st.text(max_size=400))
def test_parse_never_fails_other_than_config_error(text):
    try:
        lines = parse(text)
    except ConfigError as err:
        assert "line" in str(err)
        return
    for number, keyword, args in lines:
        assert keyword == keyword.lower() and number >= 1
        assert all(isinstance(a, str) for a in args)


NAMES = ["a1", "a2", "b1"]
PATTERNS = st.sampled_from(["a1", "a2", "b1", "*", "a*", "?1", "!a1", "!b*", "*.example",
                            "a1.example"])
PATTERN_LIST = st.lists(PATTERNS, min_size=1, max_size=3).map(",".join)
SETTING = st.one_of(
    st.sampled_from(["a1", "b1", "%h.example", "c9", "B1.Example"]).map(lambda v: f"HostName {v}"),
    st.sampled_from(["nc %h %p", "none"]).map(lambda v: f"ProxyCommand {v}"),
    st.sampled_from(["root", "u1", "u2"]).map(lambda v: f"User {v}"),
    st.integers(1, 65535).map(lambda v: f"Port {v}"),
    st.sampled_from(["/k/1", "/k/2", "/k/3"]).map(lambda v: f"IdentityFile {v}"),
    st.sampled_from(["j1", "j2"]).map(lambda v: f"ProxyJump {v}"),
    st.integers(1, 99).map(lambda v: f"ConnectTimeout {v}"),
)
CRITERION = st.one_of(
    st.just("all"), st.sampled_from(["final", "!final", "canonical", "!canonical"]),
    st.tuples(st.sampled_from(["host", "originalhost", "!host", "!originalhost"]),
              PATTERN_LIST).map(" ".join),
    st.tuples(st.sampled_from(["user", "localuser", "!user"]),
              st.lists(st.sampled_from(["root", "u1", "u2", "u3", "u*", "!u1", "*"]),
                       min_size=1, max_size=3).map(",".join)).map(" ".join))
HEADER = st.one_of(st.lists(PATTERNS, min_size=1, max_size=3).map(lambda p: "Host " + " ".join(p)),
                   st.lists(CRITERION, min_size=1, max_size=3).map(
                       lambda c: "Match " + " ".join(c)))
BLOCK = st.tuples(HEADER, st.lists(SETTING, max_size=4))
CONFIG = st.tuples(st.lists(SETTING, max_size=2), st.lists(BLOCK, max_size=5)).map(
    lambda t: "\n".join(t[0] + [f"{h}\n" + "".join(f"  {s}\n" for s in body)
                                for h, body in t[1]]) + "\n")


def _fix_match_all(config: str) -> str:
    # OpenSSH takes "all" only alone (or after canonical/final); keep the
    # random configurations to what it accepts.
    out = []
    for line in config.split("\n"):
        if line.startswith("Match ") and "all" in line.split()[1:] and line != "Match all":
            line = "Match all"
        out.append(line)
    return "\n".join(out)


@needs_ssh
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(CONFIG.map(_fix_match_all), st.sampled_from([None, "u1", "u3"]),
       st.sampled_from([None, 2222]))
def test_lookup_agrees_with_openssh(tmp_path_factory, config, user, port):
    # user, port: --ssh-user/--ssh-port, given to ssh as -l/-p (set before
    # the file is read: they win, and Match user sees them)
    home = str(tmp_path_factory.mktemp("home"))
    ours = SSHConfig(config)
    options = (["-l", user] if user else []) + (["-p", str(port)] if port else [])
    for name in NAMES:
        theirs = ssh_g(config, name, home, *options)
        mine = ours.lookup(name, user, port)
        shown = f"config:\n{config}\nhost {name} {options}: ours {mine}, ssh -G {theirs}"
        assert theirs["hostname"] == [mine.get("hostname", name)], shown
        assert theirs["user"] == [mine.get("user", ours.local_user)], shown
        assert theirs["port"] == [mine.get("port", "22")], shown
        assert theirs.get("proxyjump") == ([mine["proxyjump"]] if "proxyjump" in mine
                                           else None), shown
        # the first of ProxyJump and ProxyCommand wins ("none" too)
        assert ("proxycommand" in theirs) == (
            str(mine.get("proxycommand", "none")).lower() != "none"), shown
        assert theirs["connecttimeout"] == [mine.get("connecttimeout", "none")], shown
        if mine.get("identityfile"):
            assert theirs["identityfile"] == mine["identityfile"], shown


def test_paramiko_is_imported_without_importlib_metadata():
    """paramiko asks importlib.metadata for its own version only; mslaunch answers
    from the dist-info directory and leaves the real module unimported."""
    probe = ("import sys, importlib.util\n"
             "from mslaunch.backends.agents.starters.ssh import paramiko_import as ssh\n"
             "ssh._import_paramiko()\n"
             "import paramiko\n"
             "print('importlib.metadata' in sys.modules, paramiko.__version__)\n"
             "from importlib import metadata\n"
             "print(metadata.version('paramiko'))\n")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, PYTHONPATH=REPO))
    assert r.returncode == 0, r.stderr
    first, real = r.stdout.split("\n")[:2]
    assert first == f"False {real}"


def test_ssh_connections_send_without_nagle(tmp_path):
    """paramiko writes some messages back to back; with Nagle's algorithm the
    second waited for a delayed ACK, 40 ms twice per handshake."""
    import socket

    from mslaunch.backends.agents.starters.ssh import connect as ssh
    config = tmp_path / "config"
    config.write_text("")
    connector = ssh._Connector(ssh.Options(config=str(config)), ["python3"])
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        sock, addr = connector.open_socket({"hostname": "127.0.0.1", "port": port,
                                            "timeout": 5.0})
        try:
            assert addr == ("127.0.0.1", port)
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        finally:
            sock.close()


def test_ssh_connections_acknowledge_at_once():
    """Linux delays ACKs once a connection looks interactive, and sshd holds a
    small packet back until the one before is acknowledged: the socket
    paramiko reads from asks for a quick ACK after every read."""
    import socket

    from mslaunch.backends.agents.starters.ssh import connect as ssh
    asked = []

    class Watched(socket.socket):          # a real socket that notes its options
        def setsockopt(self, *args):
            asked.append(args)
            return super().setsockopt(*args)

    with socket.create_server(("127.0.0.1", 0)) as server:
        plain = socket.create_connection(server.getsockname())
        peer, _ = server.accept()
        client = Watched(fileno=plain.detach())
        wrapped = ssh._QuickAck(client)
        try:
            for word in (b"one", b"two"):
                peer.send(word)
                assert wrapped.recv(3) == word
                assert asked[-1] == (socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
                asked.clear()
            assert wrapped.getpeername() == peer.getsockname()     # the rest is the socket's
        finally:
            client.close()
            peer.close()


def test_ssh_user_and_port_are_for_the_job_hosts_not_their_jump_hosts(tmp_path):
    """As ``ssh -l bob -p 2222 -J ...``: the options win over the file for the
    host itself (and ``Match user`` sees them); a jump host gets its
    ProxyJump entry's user and port, else its own settings."""
    from mslaunch.backends.agents.starters.ssh import connect as ssh
    config = tmp_path / "config"
    config.write_text("Match user bob\n  IdentityFile /k/bob\n"
                      "Host dest\n  User alice\n  Port 22\n  ProxyJump jump\n"
                      "Host jump\n  User carol\n  Port 2200\n")
    connector = ssh._Connector(ssh.Options(config=str(config), user="bob", port=2222), ["python3"])
    dest = connector.settings("dest")
    assert (dest["user"], dest["port"], dest["identities"]) == ("bob", 2222, ["/k/bob"])
    hop = connector._hop_settings("jump")
    assert (hop["user"], hop["port"], hop["identities"]) == ("carol", 2200, [])
    hop = connector._hop_settings("bob@jump:2300")
    assert (hop["user"], hop["port"], hop["identities"]) == ("bob", 2300, ["/k/bob"])
    plain = ssh._Connector(ssh.Options(config=str(config)), ["python3"]).settings("dest")
    assert (plain["user"], plain["port"], plain["identities"]) == ("alice", 22, [])
    # --ssh-identity too is ssh -i for the job's hosts, not for their jump hosts
    config.write_text("Host jump\n  IdentityFile /k/jump\n")
    with_key = ssh._Connector(ssh.Options(config=str(config), identity="/k/mine"), ["python3"])
    assert with_key.settings("dest")["identities"] == ["/k/mine"]
    assert with_key._hop_settings("jump")["identities"] == ["/k/jump"]
    with pytest.raises(ssh.HostFailure, match="ProxyJump jump:22x: the port is not a number"):
        with_key._hop_settings("jump:22x")
