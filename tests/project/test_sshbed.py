"""Fast checks of the multi-host SSH test bed itself (tests/support/sshbed.py, tests/support/netbed.py).

The paramiko client here is used the way the launcher uses it: the host name is
looked up in ``~/.ssh/config`` with ``paramiko.SSHConfig``, known hosts come
from that config's UserKnownHostsFile with ``load_host_keys`` and unknown host
keys are rejected.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from typing import TYPE_CHECKING

import pytest

import netbed
from helpers import wait_for

if TYPE_CHECKING:
    import paramiko

    from sshbed import SSHBed, SSHBedPool

pytestmark = pytest.mark.remote


def paramiko_connect(home: str, name: str, timeout: float = 10) -> paramiko.SSHClient:
    """Connect to ``name`` as configured in ``home``/.ssh/config."""
    import paramiko
    cfg = paramiko.SSHConfig.from_path(os.path.join(home, ".ssh", "config"))
    opts = cfg.lookup(name)
    client = paramiko.SSHClient()
    for kh in opts.get("userknownhostsfile", "").split():
        client.load_host_keys(os.path.expanduser(kh))
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    try:
        client.connect(opts["hostname"], port=int(opts.get("port", 22)), username=opts.get("user"),
                       key_filename=[os.path.expanduser(p) for p in opts.get("identityfile", [])],
                       look_for_keys=False, allow_agent=False, timeout=timeout,
                       banner_timeout=timeout, auth_timeout=timeout)
    except BaseException:
        client.close()  # a failed connect leaves the transport open otherwise
        raise
    return client


def remote(client: paramiko.SSHClient, command: str, timeout: float = 10):
    """``(exit status, stdout, stderr)`` of ``command`` on an open client."""
    _, out, err = client.exec_command(command, timeout=timeout)
    status = out.channel.recv_exit_status()
    return status, out.read().decode(), err.read().decode()


def test_hostnames_over_paramiko_and_openssh(sshbed: SSHBed, tmp_path):
    home = sshbed.make_home(tmp_path / "home")
    for h in sshbed.hosts:
        client = paramiko_connect(home, h.name)
        try:
            status, out, _ = remote(client, "hostname")
        finally:
            client.close()
        assert status == 0
        if sshbed.mode == "netns":  # loopback hosts all share the machine's hostname
            assert out.strip() == h.name
    # OpenSSH reads ~/.ssh from the passwd entry, not $HOME: HOME/bin/ssh adds -F
    r = subprocess.run(["ssh", "h2", "echo ok"], capture_output=True, text=True, timeout=30,
                       stdin=subprocess.DEVNULL,
                       env=dict(os.environ, PATH=os.path.join(home, "bin") + os.pathsep
                                + os.environ.get("PATH", "")))
    assert (r.returncode, r.stdout.strip()) == (0, "ok"), r.stderr
    # the root namespace's /etc/hosts is untouched: the names live only in the SSH config
    with open("/etc/hosts") as f:
        assert sshbed.hosts[0].addr not in f.read()


def test_known_hosts_is_enforced(sshbed: SSHBed, tmp_path):
    import paramiko
    home = sshbed.make_home(tmp_path / "home", known=["h1"])
    paramiko_connect(home, "h1").close()
    with pytest.raises(paramiko.SSHException, match="not found in known_hosts"):
        paramiko_connect(home, "h2")


def test_h2_reachable_from_h1_by_name(sshbed: SSHBed, tmp_path):
    sshbed.require_netns()
    home = sshbed.make_home(tmp_path / "home")
    probe = ("import socket; s = socket.create_connection(('h2', 22), 5); "
             "print(s.getpeername()[0], s.getsockname()[0], s.recv(8).decode())")
    client = paramiko_connect(home, "h1")
    try:
        status, out, err = remote(client, f"{sys.executable} -c \"{probe}\"")
    finally:
        client.close()
    assert status == 0, err
    assert out.split() == [sshbed.host("h2").addr, sshbed.host("h1").addr, "SSH-2.0-"]


def test_link_down_makes_connect_time_out(sshbed: SSHBed):
    sshbed.require_netns()
    h3 = sshbed.host("h3")
    socket.create_connection((h3.addr, h3.port), timeout=2).close()
    sshbed.link_down(h3)
    t0 = time.monotonic()
    with pytest.raises(socket.timeout):
        socket.create_connection((h3.addr, h3.port), timeout=0.5)
    assert time.monotonic() - t0 >= 0.4
    sshbed.link_up(h3)
    socket.create_connection((h3.addr, h3.port), timeout=2).close()


def test_hide_path_on_one_host_only(sshbed: SSHBed, tmp_path):
    sshbed.require_netns()
    (tmp_path / "pkg").mkdir()
    marker = tmp_path / "pkg" / "marker"
    marker.write_text("here")
    conf = tmp_path / "file.conf"
    conf.write_text("content")

    def visible(host, path) -> bool:
        return sshbed.run_in(host, ["test", "-s", str(path)]).returncode == 0

    sshbed.hide_path("h2", str(tmp_path / "pkg"))
    sshbed.hide_path("h2", str(conf))
    assert not visible("h2", marker) and not visible("h2", conf)
    assert visible("h1", marker) and visible("h3", conf)
    assert marker.read_text() == "here" and conf.read_text() == "content"  # root namespace
    # an SSH session on h2 sees the host's mounts too
    r = subprocess.run(sshbed.ssh_argv("h2", "cat", str(marker)), capture_output=True, text=True,
                       timeout=30, stdin=subprocess.DEVNULL)
    assert r.returncode != 0 and "No such file" in r.stderr
    sshbed.unhide_path("h2", str(tmp_path / "pkg"))
    assert visible("h2", marker) and not visible("h2", conf)
    sshbed.restore()
    assert visible("h2", conf) and not sshbed.host("h2").hidden


def test_the_hosts_logins_read_none_of_this_machine_s_bashrc(sshbed: SSHBed):
    # (what root's ~/.bashrc runs, pyenv init here, is this machine's set-up, not a
    # host's: a second of CPU for every SSH command, and a lock they queue on)
    from sshbed import login_rc_files
    sshbed.require_netns()
    files = [f for f in login_rc_files() if os.path.getsize(f)]
    if not files:
        pytest.skip("this user has no ~/.bashrc to hide")
    sshbed.restore()            # (restore leaves it hidden: it is not a fault of a test)
    for h in sshbed.hosts:
        r = subprocess.run(sshbed.ssh_argv(h.name, "wc", "-c", *files), capture_output=True,
                           text=True, timeout=30, stdin=subprocess.DEVNULL)
        assert r.returncode == 0 and [line.split()[0] for line in r.stdout.splitlines()[
            :len(files)]] == ["0"] * len(files), (h.name, r.stdout, r.stderr)
    assert all(os.path.getsize(f) for f in files)     # the machine's own, untouched


def test_rekey_and_refused_logins_then_restore(sshbed: SSHBed, tmp_path):
    import paramiko
    home = sshbed.make_home(tmp_path / "home")
    sshbed.rekey_host("h4")
    with pytest.raises(paramiko.BadHostKeyException):
        paramiko_connect(home, "h4")
    sshbed.refuse_logins("h3")
    with pytest.raises(paramiko.AuthenticationException):
        paramiko_connect(home, "h3")
    sshbed.restore()
    for name in ("h3", "h4"):
        paramiko_connect(home, name).close()


def test_a_host_whose_sshd_closes_each_connection_is_told_with_its_log(sshbed: SSHBed):
    import sshprobe
    sshbed.require_netns()
    assert sshprobe.unanswered(sshbed) == []
    # each connection's sshd loads the host key again: hidden, it closes at once
    sshbed.hide_path("h3", sshbed.host("h3").host_key)
    try:
        bad = sshprobe.unanswered(sshbed)
        assert len(bad) == 1 and bad[0].startswith("h3 ") and "closed" in bad[0], bad
        said = sshprobe.diagnosis(sshbed, bad, ["tests/x.py::test_y"])
        assert "no hostkeys available" in said and said.endswith("tests/x.py::test_y"), said
    finally:
        sshbed.restore()
    assert sshprobe.unanswered(sshbed) == []


def test_kill_host_processes_and_dropped_sessions(sshbed: SSHBed, tmp_path):
    home = sshbed.make_home(tmp_path / "home")
    client = paramiko_connect(home, "h2")
    try:
        _, out, _ = client.exec_command("exec sleep 30")
        def sleeping() -> list:
            return [p for p in sshbed.host_pids("h2") if _comm(p) == "sleep"]
        assert wait_for(lambda: sleeping() != [], 5, 0.01), \
            "the remote sleep did not show up among the host's pids"
        found = sleeping()
        killed = sshbed.kill_host_processes("h2")
        assert set(found) <= set(killed)
        assert out.channel.recv_exit_status() == -1  # exit-signal KILL: no exit status
        assert client.get_transport().is_active()  # sshd itself was spared
        status, text, _ = remote(client, "echo still")
        assert (status, text.strip()) == (0, "still")
        sshbed.drop_session_children("h2")
        assert wait_for(lambda: not client.get_transport().is_active(), 5, 0.01)
    finally:
        client.close()
    paramiko_connect(home, "h2").close()  # new connects still work


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def test_teardown_leaves_nothing(sshbeds: SSHBedPool):
    bed = sshbeds.new(2)
    pids = [h.pid for h in bed.hosts]
    prefix = bed.net.prefix if bed.net is not None else None
    assert all(netbed.process_alive(p) for p in pids)
    bed.stop()
    assert not any(netbed.process_alive(p) for p in pids)
    if prefix is not None:
        assert not [n for n in netbed.list_netns() if netbed.belongs_to(n, prefix)]
        assert not os.path.exists(f"/sys/class/net/{prefix}up")
        assert not os.path.exists(os.path.join(netbed.state_dir(), prefix + ".json"))
    bed.stop()  # idempotent
