"""SSH's handshakes in helper processes (``...starters.ssh.helpers``, ``.fork``), on real
sshd hosts.

The helpers are forks of the launcher that start the agents of a share of
the hosts and hold their SSH sessions.  A job started through them must be
the job the launcher starts by itself: its output, its exit code, its
losses (the launcher, a helper; an agent and a session are
``test_remote``'s, with and without helpers), one line for the
hosts that cannot be reached, nothing left anywhere; and a helper must hold
nothing of the launcher's (its descriptors, its terminal's signals).
``MSLAUNCH_SSH_HELPERS=2`` asks for them at a few hosts; the default
(one helper from eight hosts on) is checked at eight.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import PY, cmd, error_lines, kill_tagged, new_tag, wait_for
from remote import agents, no_agents, renv, run_remote, settle
from remote import start_sleepers as start_sleepers_on

from mslaunch.core.errors import UsageError
from mslaunch.backends.agents.starters.ssh import fork as sshfork, helpers as sshhelpers

HOSTS = "h1,h2,h3,h4"


def henv(home, helpers: str = "2", **extra):
    return renv(home, MSLAUNCH_SSH_HELPERS=helpers, **extra)


def _children(pid: int):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def helpers_of(launcher: int):
    """The launcher's helpers: its children named so, and theirs (the first
    helper forks the others)."""
    found = []
    todo = _children(launcher)
    while todo:
        pid = todo.pop()
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() != sshfork.COMM:
                    continue
        except OSError:
            continue
        found.append(pid)
        todo.extend(_children(pid))
    return found


def start_sleepers(home, tag, hosts=HOSTS, helpers="2"):
    return start_sleepers_on(home, tag, hosts=hosts, helpers=helpers)


# -- the job, as the launcher itself would start it ----------------------------------

WORDS = """
import os, socket, sys
r = os.environ['RANK_ID']
print(f"rank {r} on {socket.gethostname()}", flush=True)
print(f"err {r}", file=sys.stderr, flush=True)
sys.exit(int(sys.argv[1]) if r == sys.argv[2] else 0)
"""


def test_a_job_started_by_helpers_gives_every_ranks_output_and_the_real_exit_code(sshbed, home):
    r = run_remote(home, "-v", "-H", HOSTS, "-n", "4", PY, "-c", WORDS, "0", "-",
                   env=henv(home))
    err = r.stderr.decode()
    assert r.returncode == 0, err
    assert "over SSH in 2 helper process(es)" in err
    assert sorted(r.stdout.decode().splitlines()) == [f"rank {i} on h{i + 1}" for i in range(4)]
    assert sorted(line for line in err.splitlines() if line.startswith("err ")) == \
        [f"err {i}" for i in range(4)]
    r = run_remote(home, "-H", HOSTS, "-n", "4", PY, "-c", WORDS, "7", "2", env=henv(home))
    assert r.returncode == 7, r.stderr
    assert wait_for(lambda: no_agents(sshbed), 15)


def test_helpers_send_the_package_to_hosts_that_ask_for_it(sshbed, home):
    """A helper reads the agents' package only when a host asks for it, after
    it has shed the descriptors it inherited (the launcher's open cache file
    among them)."""
    r = run_remote(home, "-v", "-H", HOSTS, "-n", "4", PY, "-c", WORDS, "0", "-",
                   env=henv(home, MSLAUNCH_HOST_PACKAGE="0"))
    err = r.stderr.decode()
    assert r.returncode == 0, err
    assert err.count("agent package sent (") == 4, err
    assert sorted(r.stdout.decode().splitlines()) == [f"rank {i} on h{i + 1}" for i in range(4)]
    assert wait_for(lambda: no_agents(sshbed), 15)


@pytest.mark.parametrize("direct", ["1", "0"])
def test_no_byte_is_lost_through_a_helper(sshbed, home, direct):
    """1 MiB from each rank, on its own connection or inside the helper's copy of the link."""
    program = ("import os, sys, hashlib\n"
               "data = hashlib.sha256(os.environ['RANK_ID'].encode()).digest() * 32768\n"
               "sys.stdout.buffer.write(data)\n")
    r = run_remote(home, "-H", HOSTS, "-n", "4", "--output-filename", "out", PY, "-c", program,
                   env=henv(home, MSLAUNCH_DIRECT_OUTPUT=direct), cwd=home)
    assert r.returncode == 0, r.stderr
    for rank in range(4):
        with open(os.path.join(home, "out", "1", f"rank.{rank}", "stdout"), "rb") as f:
            got = f.read()
        want = hashlib.sha256(str(rank).encode()).digest() * 32768
        assert got == want, (rank, len(got))


def test_eight_hosts_have_one_helper_by_default(sshbeds, tmp_path):
    bed = sshbeds.get(8)
    home = bed.make_home(tmp_path / "home")
    hosts = ",".join(f"h{i}" for i in range(1, 9))
    r = run_remote(home, "-v", "-H", hosts, "-n", "8", "hostname", env=renv(home))
    err = r.stderr.decode()
    assert r.returncode == 0, err
    assert "over SSH in 1 helper process(es)" in err
    assert sorted(r.stdout.decode().split()) == sorted(hosts.split(","))
    r = run_remote(home, "-v", "-H", ",".join(hosts.split(",")[:7]), "-n", "7", "true",
                   env=renv(home))
    assert r.returncode == 0 and b"helper process" not in r.stderr, r.stderr
    assert wait_for(lambda: no_agents(bed), 15)


def test_a_helper_holds_nothing_of_the_launchers_and_ends_with_it(sshbed, home):
    """In a session of its own, with /dev/null for its standard descriptors and
    none of the launcher's (the test's pipes): a helper holding the launcher's
    stdout would keep a reader of the job's output waiting after the job."""
    tag = new_tag()
    p = start_sleepers(home, tag)
    try:
        helpers = helpers_of(p.pid)
        assert len(helpers) == 2
        theirs = {os.stat(f"/proc/{p.pid}/fd/{fd}").st_ino for fd in (1, 2)}
        null = os.stat(os.devnull)
        for pid in helpers:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            assert int(fields[3]) == pid              # its own session
            for fd in os.listdir(f"/proc/{pid}/fd"):
                st = os.stat(f"/proc/{pid}/fd/{fd}")
                assert st.st_ino not in theirs, (pid, fd, os.readlink(f"/proc/{pid}/fd/{fd}"))
                if fd in ("0", "1", "2"):
                    assert (st.st_dev, st.st_ino) == (null.st_dev, null.st_ino)
        # The terminal's Ctrl-C reaches the launcher alone, which stops the job.
        os.kill(p.pid, signal.SIGINT)
        _, err = p.communicate(timeout=30)
        assert p.returncode == 130, err
        settle(tag, sshbed)
        assert not any(os.path.exists(f"/proc/{pid}") for pid in helpers)
    finally:
        p.kill()
        p.wait()
        kill_tagged(tag)


def test_a_local_rank_inherits_no_link_a_helper_handed_over(sshbed, home):
    """The links and status pipes come from the helpers over a socket: they are
    the launcher's alone, as its own links are, never its local ranks'."""
    program = ("import os, re\n"
               "print(sorted(re.sub(r'[0-9]+', 'N', os.readlink('/proc/self/fd/' + f))"
               " for f in os.listdir('/proc/self/fd') if os.path.exists('/proc/self/fd/' + f)))")

    def descriptors(helpers: str) -> str:
        r = run_remote(home, "-H", "localhost,h1,h2,h3", "-n", "1", PY, "-c", program, ":",
                       "-n", "3", "true", env=henv(home, helpers))
        assert r.returncode == 0, r.stderr
        return r.stdout.decode()
    assert descriptors("2") == descriptors("0")


# -- losses -----------------------------------------------------------------------------

def test_a_sigkilled_launcher_takes_its_helpers_and_every_agent_with_it(sshbed, home):
    tag = new_tag()
    p = start_sleepers(home, tag)
    try:
        helpers = helpers_of(p.pid)
        assert len(helpers) == 2
        p.kill()
        p.wait()
        settle(tag, sshbed)
    finally:
        kill_tagged(tag)


@pytest.mark.parametrize("which", ["first", "other"])
def test_a_helper_that_dies_under_a_running_job_loses_its_hosts(sshbed, home, which):
    """Its hosts' links end with it: they are lost, and their agents, whose SSH
    sessions ended, stop their ranks.  The first helper (h1 and h3) forked the
    other (h2 and h4) and reaps it: the other does not outlive it, and its
    hosts are lost too."""
    tag = new_tag()
    p = start_sleepers(home, tag)
    try:
        helpers = helpers_of(p.pid)
        first = [pid for pid in helpers if pid in _children(p.pid)]
        other = [pid for pid in helpers if pid not in first]
        assert len(first) == 1 and len(other) == 1, helpers
        os.kill((first if which == "first" else other)[0], signal.SIGKILL)
        if which == "first":
            assert wait_for(lambda: not os.path.exists(f"/proc/{other[0]}/fd"), 10)
        _, err = p.communicate(timeout=30)
        assert p.returncode == 255, err
        lost = {h for h in ("h1", "h2", "h3", "h4") if f"lost host {h}:".encode() in err}
        # (the first one's end is the other's too: every host may be lost then)
        assert lost and (which == "first" or lost <= {"h2", "h4"}), err
        settle(tag, sshbed)
    finally:
        p.kill()
        p.wait()
        kill_tagged(tag)


def test_a_helper_that_dies_while_starting_fails_its_hosts_in_one_line(sshbed, home):
    """h2 does not answer (its link is down): its helper still waits on it when it
    is killed; h2 is then named, and the agent already up on h1 is gone."""
    sshbed.require_netns("a host that does not answer")
    tag = new_tag()
    sshbed.link_down("h2")
    try:
        p = subprocess.Popen(cmd("--ssh-timeout", "20", "-H", "h1,h2", "-n", "2", "-x",
                                 "MSL_TEST_TAG", "sleep", "120"),
                             env=henv(home, MSL_TEST_TAG=tag), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
        try:
            assert wait_for(lambda: agents(sshbed, "h1"), 30)
            for pid in helpers_of(p.pid):
                os.kill(pid, signal.SIGKILL)
            _, err = p.communicate(timeout=30)
            lines = error_lines(err.decode())
            assert p.returncode == 1 and len(lines) == 1, err
            assert "h2 (agent start: the SSH helper process ended)" in lines[0], err
        finally:
            p.kill()
            p.wait()
    finally:
        sshbed.link_up("h2")
        kill_tagged(tag)
    settle(tag, sshbed)


def test_hosts_that_cannot_be_reached_are_one_line_as_without_helpers(sshbed, tmp_path):
    tag = new_tag()
    home = sshbed.make_home(tmp_path / "home", known=["h1", "h3", "h4"])
    sshbed.refuse_logins("h3")
    r = run_remote(home, "-H", HOSTS, "-n", "4", "-x", "MSL_TEST_TAG", "sleep", "30",
                   env=henv(home, MSL_TEST_TAG=tag))
    err = r.stderr.decode()
    lines = error_lines(err)
    assert r.returncode == 1 and len(lines) == 1, err
    assert "2 of 4" in err and "nothing was started" in err
    assert "h2 (host key: " in err and "ssh-keyscan" in err
    assert "h3 (authentication: " in err
    settle(tag, sshbed)


# -- the count and the wire ---------------------------------------------------------------

def test_the_number_of_helpers():
    assert sshhelpers.helper_count(4, {"MSLAUNCH_SSH_HELPERS": "0"}) == 0
    assert sshhelpers.helper_count(3, {"MSLAUNCH_SSH_HELPERS": "8"}) == 3
    assert sshhelpers.helper_count(7, {}) == 0
    assert sshhelpers.helper_count(8, {}) == 1
    cores = len(os.sched_getaffinity(0))
    assert sshhelpers.helper_count(63, {}) == 1
    assert sshhelpers.helper_count(64, {}) == min(cores, 2)
    # at most 8 (one handshake each with one sshd), whatever the cores
    assert sshhelpers.helper_count(1024, {}) == min(cores, 8)
    for bad in ("two", "-1", "1.5", "٣"):
        with pytest.raises(UsageError, match="MSLAUNCH_SSH_HELPERS"):
            sshhelpers.helper_count(4, {"MSLAUNCH_SSH_HELPERS": bad})


def test_a_bad_number_of_helpers_is_one_line():
    r = subprocess.run(cmd("-H", "h1,h2", "-n", "2", "true"), capture_output=True, timeout=60,
                       env={**os.environ, "MSLAUNCH_SSH_HELPERS": "many"})
    err = r.stderr.decode()
    assert r.returncode != 0 and len(error_lines(err)) == 1, err
    assert "MSLAUNCH_SSH_HELPERS='many'" in err and "Traceback" not in err


_text = st.text(max_size=40)
_messages = st.one_of(
    st.builds(lambda at, e, h: ("mark", {"at": at, "event": e, "host": h}),
              st.floats(allow_nan=False, allow_infinity=False), _text, _text),
    st.builds(lambda h, hello, local: ("up", {"host": h, "hello": hello, "local": local}),
              _text, st.dictionaries(_text, st.one_of(_text, st.integers())), _text),
    st.builds(lambda h, s, r, k: ("failed", {"host": h, "stage": s, "reason": r, "key": k}),
              _text, _text, _text, st.one_of(st.just([]), st.lists(_text, min_size=2,
                                                                    max_size=2))),
    st.just(("done", {})))


@given(_messages)
def test_every_message_comes_back_as_it_went(message):
    kind, fields = message
    got = sshfork.decode(sshfork.encode(kind, **fields))
    assert got == {"t": kind, **fields}


@settings(max_examples=300)
@given(st.one_of(st.binary(max_size=200),
                 st.dictionaries(st.sampled_from(["t", "at", "event", "host", "hello", "local",
                                                  "stage", "reason", "key"]),
                                 st.one_of(st.sampled_from(["mark", "up", "failed", "done"]),
                                           st.integers(), st.booleans(), st.none(), _text,
                                           st.lists(st.one_of(_text, st.integers()),
                                                    max_size=3),
                                           st.dictionaries(_text, _text, max_size=2)))
                 .map(lambda d: __import__("json").dumps(d).encode())))
def test_anything_else_is_a_wire_error_and_nothing_else(data):
    try:
        message = sshfork.decode(data)
    except sshfork.WireError:
        return
    assert message["t"] in ("mark", "up", "failed", "done")


def test_a_message_nested_past_pythons_stack_is_a_wire_error():
    with pytest.raises(sshfork.WireError):
        sshfork.decode(b"[" * 100000 + b"]" * 100000)


def test_a_helpers_time_mark_is_the_launchers():
    """A mark's time is the helper's monotonic clock, which is the launcher's."""
    from mslaunch.machine import timeline
    before = time.monotonic()
    timeline.mark("TCP connected", "hx", at=before)
    assert (before, "TCP connected", "hx") in timeline._marks


@pytest.mark.parametrize("cgroup", ["1", "0"])
def test_a_local_ranks_leftover_is_stopped_and_the_helpers_are_not(sshbed, home, cgroup):
    """Once the local ranks ended, what holds their pipes is stopped as a
    leftover: the helpers, children of the launcher too, are not leftovers."""
    tag = new_tag()
    try:
        r = run_remote(home, "--grace", "1", "-H", "localhost,h1,h2", "-x", "MSL_TEST_TAG",
                       "-n", "1", "sh", "-c", "setsid sleep 60 & echo started", ":",
                       "-n", "2", "sh", "-c", "sleep 3; echo done",
                       env=henv(home, MSL_TEST_TAG=tag, MSLAUNCH_CGROUP=cgroup))
        assert r.returncode == 0, r.stderr
        assert sorted(r.stdout.decode().split()) == ["done", "done", "started"]
        settle(tag, sshbed)
    finally:
        kill_tagged(tag)
