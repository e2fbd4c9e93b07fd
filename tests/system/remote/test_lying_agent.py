"""The launcher facing a lying agent on a real SSH host: malformed frames before
and after START, garbage, and hosts lost at every stage."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, Optional, Sequence, Tuple

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import PY, clean_env, cmd, error_lines, wait_for
from linkhelpers import JSON_KINDS, header_is_invalid
from mslaunch.wire import link

pytestmark = pytest.mark.remote

# ---------------------------------------------------------------------------
# the launcher facing a lying agent, over a real SSH host
# ---------------------------------------------------------------------------

#: Run on the host as its "remote Python": ignores its arguments, says what it is
#: told to say (part after part), then, if it lingers, reads its stdin until the
#: launcher closes the link.  ``alarm`` keeps a broken test from leaving it behind.
FAKE_AGENT = """#!{python}
import json, os, signal, socket, ssl, struct, sys, time
signal.alarm(30)
with open({pidfile!r}, "w") as f:
    f.write(str(os.getpid()))
out = sys.stdout.buffer
inp = sys.stdin.buffer
booted = False
out.write(b"\\0mslaunch-package need nothing: a lying agent\\n")    # the bootstrap's answer
out.flush()


def frame():
    length, kind = struct.unpack(">IB", inp.read(5))
    return kind, inp.read(length - 1)


def boot():
    global booted
    if not booted:
        booted = True
        for _ in range(2):
            inp.read(int(inp.readline()))


for i, path in enumerate({parts!r}):
    if i and {wait_start!r}:
        boot()
        while frame()[0] != {start_kind!r}:
            pass
    elif i:
        boot()          # the launcher has sent everything: it reads what follows
        time.sleep({pause!r})
    with open(path, "rb") as f:
        out.write(f.read())
    out.flush()
    if i == 0 and {dial!r}:
        # Read the bootstrap and the JOB frame, and dial back as an agent does.
        boot()
        data = json.loads(frame()[1])["data"]
        conn = socket.create_connection((data["addresses"][0], data["port"]), timeout=5)
        if data.get("cert"):
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            context.check_hostname = False
            context.load_verify_locations(cadata=data["cert"])
            conn = context.wrap_socket(conn)
        # (the two-way proof of mslaunch/wire/dialproof.py, the agent's side)
        import hashlib, hmac, os
        tok, ours = data["token"], os.urandom(16).hex()
        tag = hashlib.sha256(("mslaunch-dial " + tok).encode()).hexdigest()[:32]
        conn.sendall(("mslaunch-dial %s %s\\n" % (tag, ours)).encode())
        said = b""
        while not said.endswith(b"\\n"):
            said += conn.recv(1)
        theirs, where = said.split()[0].decode(), conn.getpeername()[0]
        conn.sendall(hmac.new(tok.encode(), ("agent %s %s %s" % (ours, theirs, where)).encode(),
                              hashlib.sha256).hexdigest().encode() + b"\\n")
        with open({dial!r}, "rb") as f:
            conn.sendall(f.read())
if {linger!r}:
    while inp.read1(1 << 16):
        pass
else:
    time.sleep(0.3)
"""

HELLO = link.SYNC + link.encode(link.HELLO, {"protocol": link.PROTOCOL, "host": "fake",
                                             "pid": 1, "python": "3"})
READY = link.encode(link.READY, {"warnings": []})
GRACE = 0
#: The launcher holds a lost host's link open for grace + 2 s, waiting for its agent;
#: a launcher still there after this long hangs.  The rest is a busy machine's: a
#: launch there takes seconds before its host is up (Python, paramiko, SSH), and
#: several at once take turns on its cores.
LAUNCH_LIMIT = 60.0
#: Launchers run at once: more take longer together than one after another.
AT_ONCE = 6
#: A silent fake is lost after 8 s: long enough that a launcher slowed by a busy
#: machine never takes a lie it is about to read for silence (with two dozen
#: launchers at once here, beside other tests, 4 s was seen to be too short:
#: a link's end reached the launcher after them).
HEARTBEAT = "1,8"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def _fake_agent(directory, parts: Sequence[bytes], *, pause: float = 0.3,
                linger: bool = True, dial: Optional[bytes] = None,
                wait_start: bool = False) -> Tuple[str, str]:
    """Write a fake agent script into ``directory``: (its path, its pid file).

    With ``dial``, it also opens the output connection the JOB offers and sends
    ``dial`` on it, after the first part.  With ``wait_start``, every part after
    the first waits for the launcher's START rather than for ``pause``."""
    os.makedirs(directory, exist_ok=True)
    dial_path = None
    if dial is not None:
        dial_path = os.path.join(directory, "dial")
        with open(dial_path, "wb") as f:
            f.write(dial)
    paths = []
    for i, part in enumerate(parts):
        path = os.path.join(directory, f"part{i}")
        with open(path, "wb") as f:
            f.write(part)
        paths.append(path)
    script = os.path.join(directory, "fake-python")
    pidfile = os.path.join(directory, "pid")
    with open(script, "w") as f:
        f.write(FAKE_AGENT.format(python=PY, pidfile=pidfile, parts=paths, pause=pause,
                                  linger=linger, dial=dial_path, wait_start=wait_start,
                                  start_kind=link.START))
    os.chmod(script, 0o755)
    return script, pidfile


def _launch(home: str, fake: str, host: str = "h1", timeout: float = LAUNCH_LIMIT,
            **env_vars: str) -> Tuple[Optional[int], str, float]:
    """mslaunch with the fake as remote Python: (status or None if it hung, stderr, seconds)."""
    # PYTHONFAULTHANDLER: a launcher that hangs is sent SIGABRT, and says where each
    # of its threads stood.
    env = clean_env(HOME=home, MSLAUNCH_HEARTBEAT=HEARTBEAT, PYTHONFAULTHANDLER="1", **env_vars)
    t0 = time.monotonic()
    p = subprocess.Popen(cmd("--grace", str(GRACE), "-H", host, "-n", "1",
                             "--remote-python", fake, "true"),
                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=env)
    try:
        _, err = p.communicate(timeout=timeout)
        code: Optional[int] = p.returncode
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGABRT)
        try:
            _, err = p.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            p.kill()
            _, err = p.communicate()
        code = None
    return code, err.decode("utf-8", "replace"), time.monotonic() - t0


def _host_extras(sshbed, host: str) -> set:
    return {p for p in sshbed.host_pids(host) if not sshbed._is_sshd(p) and _alive(p)}


def _check_launcher_error(code: Optional[int], err: str, pattern: str, host: str = "h1",
                          statuses=(1, 255)) -> None:
    assert code is not None, f"mslaunch did not end: {err}"
    assert "Traceback" not in err, err
    lines = error_lines(err)
    assert len(lines) == 1, err
    assert code in statuses, (code, err)
    assert lines[0].startswith("mslaunch: error: ") and host in lines[0], err
    assert re.search(pattern, lines[0]), (pattern, err)


def _fake_gone(pidfile: str) -> None:
    try:
        with open(pidfile) as f:
            pid = int(f.read())
    except (OSError, ValueError):
        raise AssertionError("the fake agent never ran") from None
    assert wait_for(lambda: not _alive(pid), 5), f"the fake agent {pid} is still running"


def _run_cases(sshbed, tmp_path, cases: Dict[str, tuple], check=None) -> None:
    """Run mslaunch against each fake agent in ``cases`` at once: ``name: (parts,
    pattern[, options of _fake_agent, and ``env`` for mslaunch])``; each must fail with
    one line matching ``pattern``."""
    home = sshbed.make_home(tmp_path / "home")
    before = _host_extras(sshbed, "h1")
    options = {name: dict(case[2]) if len(case) > 2 else {} for name, case in cases.items()}
    envs = {name: options[name].pop("env", {}) for name in cases}
    fakes = {name: _fake_agent(tmp_path / f"case{i}", case[0], **options[name])
             for i, (name, case) in enumerate(cases.items())}
    with ThreadPoolExecutor(max_workers=AT_ONCE) as pool:
        results = dict(zip(cases, pool.map(lambda name: _launch(home, fakes[name][0],
                                                                **envs[name]), cases)))
    problems = []
    for name, (code, err, seconds) in results.items():
        try:
            (check or _check_launcher_error)(code, err, cases[name][1])
            assert seconds < LAUNCH_LIMIT, seconds
            _fake_gone(fakes[name][1])
        except AssertionError as e:
            problems.append(f"{name}: {e}")
    assert not problems, "\n".join(problems)
    assert wait_for(lambda: _host_extras(sshbed, "h1") <= before, 5), \
        _host_extras(sshbed, "h1") - before


LOST = r"lost host h1 before the job started: "
BAD = LOST + r"protocol error: "
MALFORMED = {
    "junk after HELLO": ([HELLO, b"\xff" * 16], BAD + r"frame length \d+ out of range"),
    "junk with HELLO": ([HELLO + b"\x7f" * 16], r"frame length \d+ out of range"),
    "length above MAX_FRAME": ([HELLO, link.HEAD.pack(link.MAX_FRAME + 1, link.READY)],
                               BAD + r"frame length 67108865 out of range"),
    "READY not JSON": ([HELLO, link.HEAD.pack(6, link.READY) + b"{nope"],
                       BAD + r"READY frame is not valid JSON"),
    "JOB upwards": ([HELLO, link.encode(link.JOB, {})], BAD + r"unexpected JOB frame"),
    "OUTPUT before START": ([HELLO, link.encode_output(0, 1, b"hi")],
                            BAD + r"OUTPUT before START"),
    "EXITED before START": ([HELLO, READY + link.encode(link.EXITED, {"rank": 0, "code": 3})],
                            BAD + r"EXITED before START"),
    "STARTED before START": ([HELLO, link.encode(link.STARTED, {"pids": {"0": 1}})],
                             BAD + r"STARTED before START"),
    "READY twice": ([HELLO, READY + READY], BAD + r"READY before JOB, or twice"),
    "READY warnings a number": ([HELLO, link.encode(link.READY, {"warnings": 1})],
                                BAD + r"READY: warnings are not a list of strings"),
    "PMI unknown operation": ([HELLO, link.encode(link.PMI, {"op": "nonsense", "ask": 1})],
                              BAD + r"unknown PMI operation 'nonsense'"),
    "PMI abort of a foreign rank": ([HELLO, link.encode(link.PMI, {"op": "abort", "rank": 3,
                                                                   "code": 1})],
                                    BAD + r"PMI abort for rank 3, not on this host"),
    "silence after HELLO": ([HELLO], LOST + r"no sign of life"),
    "another protocol": ([link.SYNC + link.encode(link.HELLO, {"protocol": 2})],
                         r"agent start: the agent speaks another protocol \(2, expected 1\)"),
    "no start mark": ([b"Welcome to h1!\n" * 5000], r"agent start: no agent answered"),
    "end of link after HELLO": ([HELLO], LOST + r"the link reached end-of-file",
                                {"linger": False}),
}


OUTPUT_BAD = LOST + r"its output connection: protocol error: "
#: The agent's own connection for output (dialled back, plain or TLS) carries
#: OUTPUT and LINES only.
MALFORMED_OUTPUT = {
    f"output connection{way}: {what}": ([HELLO], OUTPUT_BAD + pattern,
                                        {"dial": sent, "env": {"MSLAUNCH_OUTPUT_TLS": tls}})
    for way, tls in (("", "0"), (" in TLS", "1"))
    for what, pattern, sent in (("junk", r"frame length \d+ out of range", b"\xee" * 64),
                                ("READY", r"READY frame on the output connection", READY))
}


def test_launcher_refuses_a_lying_agent(sshbed, tmp_path):
    _run_cases(sshbed, tmp_path, {**MALFORMED, **MALFORMED_OUTPUT})


#: Lies told once the job runs: the fake answers READY, waits for START,
#: then lies.
RUNNING = r"lost host h1: protocol error: "
WAIT = {"wait_start": True}
MALFORMED_RUNNING = {
    "OUTPUT of a foreign rank": ([HELLO + READY, link.encode_output(5, 1, b"hi")],
                                 RUNNING + r"rank 5 does not run on this host", WAIT),
    "OUTPUT on stream 3": ([HELLO + READY, link.encode_output(0, 3, b"x")],
                           RUNNING + r"output of rank 0 on stream 3", WAIT),
    "EXITED rank a string": ([HELLO + READY, link.encode(link.EXITED, {"rank": "0"})],
                             RUNNING + r"EXITED: field 'rank' missing or not a number from 0", WAIT),
    "STARTED bad rank": ([HELLO + READY, link.encode(link.STARTED, {"pids": {"x": 1}})],
                         RUNNING + r"STARTED: bad rank or pid", WAIT),
    "STARTED superscript rank": ([HELLO + READY,
                                  link.encode(link.STARTED, {"pids": {"\u00b2": 5}})],
                                 RUNNING + r"STARTED: bad rank or pid", WAIT),
    "STARTED pid zero": ([HELLO + READY, link.encode(link.STARTED, {"pids": {"0": 0}})],
                         RUNNING + r"STARTED: bad rank or pid", WAIT),
    "SIGNAL upwards": ([HELLO + READY, link.encode(link.SIGNAL, {"sig": 9})],
                       RUNNING + r"unexpected SIGNAL frame", WAIT),
}


def _check_running_error(code: Optional[int], err: str, pattern: str) -> None:
    """A lie after START: the host is lost (status 255), said in lines of mslaunch's own."""
    assert code is not None, f"mslaunch did not end: {err}"
    assert "Traceback" not in err, err
    assert code == 255, (code, err)
    lines = err.splitlines()
    assert lines and all(line.startswith("mslaunch: ") for line in lines), err
    assert any(re.search(pattern, line) for line in lines), (pattern, err)


def test_launcher_refuses_a_lying_agent_while_the_job_runs(sshbed, tmp_path):
    _run_cases(sshbed, tmp_path, MALFORMED_RUNNING, check=_check_running_error)


def test_launcher_reports_a_host_lost_while_its_rank_runs(sshbed, tmp_path):
    # The fake answers READY, waits for START, then its link ends: the job has begun.
    code, err, _ = _one_case(sshbed, tmp_path, [HELLO + READY, b""])
    assert code == 255, err
    assert "Traceback" not in err
    lines = error_lines(err)
    assert lines and all(line.startswith("mslaunch: ") for line in lines), err
    assert "lost host h1: the link reached end-of-file" in lines[0], err


garbage = st.one_of(
    st.binary(min_size=5, max_size=300).filter(header_is_invalid),
    st.tuples(st.sampled_from([k for k in JSON_KINDS if k != link.BEAT]),
              st.binary(min_size=1, max_size=200)).filter(
        lambda kb: not kb[1].lstrip().startswith(b"{")).map(
        lambda kb: link.HEAD.pack(len(kb[1]) + 1, kb[0]) + kb[1]))


@settings(max_examples=1, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.lists(garbage, min_size=4, max_size=4))
def test_launcher_fuzz_garbage_after_hello(sshbed, tmp_path_factory, payloads):
    tmp = tmp_path_factory.mktemp("garbage")
    _run_cases(sshbed, tmp, {f"garbage {i} {p[:24]!r}": ([HELLO, p], r"protocol error|frame")
                             for i, p in enumerate(payloads)})


def _one_case(sshbed, tmp_path, parts: Sequence[bytes], *, linger: bool = False,
              timeout: float = LAUNCH_LIMIT,
              wait_start: bool = True) -> Tuple[Optional[int], str, float]:
    home = sshbed.make_home(tmp_path / "home")
    fake, pidfile = _fake_agent(tmp_path / "fake", parts, linger=linger,
                                wait_start=wait_start)
    result = _launch(home, fake, timeout=timeout)
    _fake_gone(pidfile)
    return result


def test_launcher_ends_when_a_host_is_lost_after_its_rank_exited(sshbed, tmp_path):
    # The fake: READY, then after START: STARTED and EXITED, then gone (no end of
    # the rank's streams, with or without DONE): the end of its output is lost.
    for i, done in enumerate((b"", link.encode(link.DONE))):
        code, err, _ = _one_case(sshbed, tmp_path / f"case{i}", [
            HELLO + READY,
            link.encode(link.STARTED, {"pids": {"0": 4242}})
            + link.encode(link.EXITED, {"rank": 0, "code": 0, "signal": None}) + done])
        assert code is not None, f"mslaunch hung after losing h1: {err}"
        assert code == 255, err
        assert "h1" in err and "Traceback" not in err
        assert "lost the end of its output" in err, err
