"""The real agent, driven over pipes (no SSH): fuzzed, fed frames in the wrong
order and malformed jobs, and through a whole conversation.

Every agent here is started the way SSH starts it -- ``sh -c <remote command>`` with
the bootstrap written to its stdin -- only without SSH in between, so the tests see
exactly what a launcher sees: the link's start mark, frames, the exit status and
the agent's stderr.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import time
import uuid
from typing import Any, Dict, List, Optional, Tuple

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import PY, clean_env, kill_tagged, tagged_pids, wait_for
from linkhelpers import JSON_KINDS, Frame, header_is_invalid, json_bodies, stops_at_first_frame
from mslaunch.backends.agents import bootstrap
from mslaunch.wire import link
from mslaunch.machine.output import CHUNK

# ---------------------------------------------------------------------------
# the real agent over pipes
# ---------------------------------------------------------------------------

PAYLOAD = bootstrap.payload()
SLEEPER = "import time; time.sleep(60)"


class AgentProc:
    """An agent started as SSH would start it, with the launcher's side of the link."""

    def __init__(self, tag: str) -> None:
        self.tag = tag
        self.proc = subprocess.Popen(
            ["sh", "-c", bootstrap.remote_command([PY])], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=clean_env(MSL_TEST_TAG=tag))
        self.fd = self.proc.stdout.fileno()
        self.reader = link.Reader(expect_sync=True)
        self.pending: List[Frame] = []
        self.eof = False
        self.output: Dict[Tuple[int, int], bytes] = {}
        self.ended: set = set()
        try:
            self.send(PAYLOAD)
            frame = self.next_frame(15)
            assert frame is not None and frame[0] == link.HELLO, (frame, self.stderr_now())
            # nothing before the link's start but the bootstrap's answer
            assert self.reader.preamble.startswith(bootstrap.MARK + b"need ")
            assert self.reader.preamble.count(b"\n") == 1, self.reader.preamble
            self.hello = link.decode_json(*frame)
        except BaseException:
            self.cleanup()
            raise

    # -- link ------------------------------------------------------------------
    def send(self, data: bytes) -> None:
        try:
            self.proc.stdin.write(data)
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            pass

    def close_link(self) -> None:
        try:
            self.proc.stdin.close()
        except BrokenPipeError:
            pass

    def _pump(self, timeout: float) -> bool:
        """Read once (up to ``timeout``); False at end-of-file or when nothing came."""
        if self.eof:
            return False
        ready, _, _ = select.select([self.fd], [], [], max(0.0, timeout))
        if not ready:
            return False
        data = os.read(self.fd, 1 << 16)
        if not data:
            self.eof = True
            return False
        self.pending += self.reader.feed(data)
        return True

    def next_frame(self, timeout: float = 5.0, beats: bool = False) -> Optional[Frame]:
        """The next frame (BEATs skipped unless ``beats``), or None at end-of-file."""
        deadline = time.monotonic() + timeout
        while True:
            while self.pending:
                kind, body = self.pending.pop(0)
                if kind == link.BEAT and not beats:
                    continue
                if kind == link.OUTPUT:
                    rank, stream, data = link.decode_binary(body)
                    if data:
                        self.output[rank, stream] = self.output.get((rank, stream), b"") + data
                    else:
                        self.ended.add((rank, stream))
                return kind, body
            if self.eof:
                return None
            left = deadline - time.monotonic()
            assert left > 0, "no frame from the agent in time"
            self._pump(left)

    def expect(self, wanted: int, timeout: float = 10.0) -> Tuple[Dict[str, Any], List[Frame]]:
        """Frames up to one of kind ``wanted``: its JSON body and the frames before it."""
        seen: List[Frame] = []
        deadline = time.monotonic() + timeout
        while True:
            frame = self.next_frame(max(0.01, deadline - time.monotonic()))
            assert frame is not None, (f"link ended before {link.NAMES[wanted]}: "
                                       f"{self.stderr_now()}")
            if frame[0] == wanted:
                return link.decode_json(*frame), seen
            assert frame[0] not in (link.ERROR,), link.decode_json(*frame)
            seen.append(frame)

    def drain(self, seconds: float) -> List[Frame]:
        """Everything the agent says for ``seconds`` (it keeps the pipe from filling)."""
        deadline = time.monotonic() + seconds
        got: List[Frame] = []
        while time.monotonic() < deadline and not self.eof:
            self._pump(deadline - time.monotonic())
            got += self.pending
            self.pending = []
        return got

    # -- process ----------------------------------------------------------------
    def finish(self, timeout: float) -> Tuple[Optional[int], str]:
        """Wait (reading the link) until the agent exits: (status or None, stderr)."""
        deadline = time.monotonic() + timeout
        while not self.eof and time.monotonic() < deadline:
            self._pump(deadline - time.monotonic())
        try:
            code: Optional[int] = self.proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            code = None
            self.kill()
        return code, self.stderr_now()

    def stderr_now(self) -> str:
        if self.proc.poll() is None:
            return "(agent still running)"
        if not hasattr(self, "_err"):
            self._err = self.proc.stderr.read().decode("utf-8", "replace")
        return self._err

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def cleanup(self) -> None:
        self.kill()
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            try:
                f.close()
            except OSError:
                pass
        kill_tagged(self.tag)


def one_agent_line(err: str) -> str:
    """Assert the agent said exactly one line, its own, and no traceback."""
    assert "Traceback" not in err, err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("mslaunch agent on "), err
    return lines[0]


def no_tagged_processes(tag: str, timeout: float = 5.0) -> None:
    assert wait_for(lambda: tagged_pids(tag) == [], timeout), tagged_pids(tag)


def rank_entry(rank: int, size: int, argv: List[str], cwd: str, **env: str) -> Dict[str, Any]:
    return {"rank": rank, "app": 0, "local_rank": rank, "local_size": size, "node_id": 0,
            "argv": argv, "cwd": cwd, "stdin": "null", "inherit": "launcher",
            "path_prefix": None, "env": dict(env)}


def job_body(tag: str, cwd: str, argvs: List[List[str]], **over: Any) -> Dict[str, Any]:
    """A JOB frame as jobframe.job_frame builds it, for ``len(argvs)`` ranks on this host."""
    n = len(argvs)
    body = {"kvsname": f"kvs_link_{tag[:12]}", "grace": 1.0, "heartbeat": [1.0, 30],
            "credit": 1 << 22, "merge_stderr": False, "pmi": None, "size": n,
            "universe_size": n, "appnums": None, "process_mapping": "", "bind_to": "none",
            "launch_dir": cwd, "host": "linktest",
            "common_env": {"MSL_TEST_TAG": tag, "PATH": os.environ.get("PATH", "/usr/bin:/bin")},
            "ranks": [rank_entry(i, n, a, cwd, LINK_RANK=str(i)) for i, a in enumerate(argvs)]}
    body.update(over)
    return body


@pytest.fixture
def agents():
    """Start agents with ``agents.new()``; each is killed and its tag swept afterwards."""
    started: List[AgentProc] = []

    class Factory:
        @staticmethod
        def new() -> AgentProc:
            a = AgentProc(uuid.uuid4().hex)
            started.append(a)
            return a

    yield Factory
    for a in started:
        a.cleanup()


def _fresh_agent() -> AgentProc:
    """For hypothesis tests (no function-scoped fixtures there): clean up yourself."""
    return AgentProc(uuid.uuid4().hex)


# ---------------------------------------------------------------------------
# fuzz of the real agent
# ---------------------------------------------------------------------------

@settings(max_examples=8, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(min_size=1, max_size=600).filter(stops_at_first_frame))
def test_agent_survives_random_bytes(data):
    agent = _fresh_agent()
    try:
        agent.send(data)
        if not header_is_invalid(data):
            # An incomplete frame: only the end of the link can end the wait.
            agent.close_link()
        code, err = agent.finish(5)
        assert code == 1, err
        line = one_agent_line(err)
        assert ("protocol error" in line) != (not header_is_invalid(data)), line
        no_tagged_processes(agent.tag)
    finally:
        agent.cleanup()


def _truncatable(tag: str, cwd: str) -> st.SearchStrategy:
    return st.one_of(
        st.just(link.encode(link.JOB, job_body(tag, cwd, [[PY, "-c", SLEEPER]]))),
        st.sampled_from([link.START, link.BYE, link.BEAT]).map(link.encode),
        st.integers(1, 31).map(lambda s: link.encode(link.SIGNAL, {"sig": s})),
        st.integers(0, 1 << 20).map(lambda n: link.encode(link.CREDIT, {"bytes": n})),
        st.binary(max_size=100).map(lambda d: link.encode_stdin(0, d)),
        st.tuples(st.sampled_from(JSON_KINDS), json_bodies).map(lambda kb: link.encode(*kb)))


@settings(max_examples=5, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), st.booleans())
def test_agent_gives_up_on_a_truncated_frame(tmp_path_factory, data, start_ranks):
    cwd = str(tmp_path_factory.getbasetemp())
    agent = _fresh_agent()
    try:
        agent.send(link.encode(link.JOB, job_body(agent.tag, cwd, [[PY, "-c", SLEEPER]],
                                                  heartbeat=[0.1, 3])))
        agent.expect(link.READY)
        if start_ranks:
            agent.send(link.encode(link.START))
            started, _ = agent.expect(link.STARTED)
            assert list(started["pids"]) == ["0"]
        frame = data.draw(_truncatable(agent.tag, cwd))
        cut = data.draw(st.integers(1, len(frame) - 1))
        agent.send(frame[:cut])
        # The launcher's half frame, then silence: a partitioned network, say.
        code, err = agent.finish(5)
        assert code == 1, err
        assert "no sign of life" in one_agent_line(err)
        no_tagged_processes(agent.tag)
    finally:
        agent.cleanup()


WRONG_ORDER = {
    "START before JOB": ([], [link.encode(link.START)], "START without a JOB"),
    "START twice": (["job", "start"], [link.encode(link.START)], "START without a JOB, or twice"),
    "a second JOB": (["job"], ["job"], "a second JOB frame"),
    "NEXT while ranks run": (["job", "start"], [link.encode(link.NEXT, {"idle": 5.0})],
                             "NEXT while ranks run, or without a wait"),
    "NEXT with a bad heartbeat": ([], [link.encode(link.NEXT, {"idle": 5.0,
                                                               "heartbeat": [0, 5]})],
                                  "NEXT: heartbeat is not"),
    "NEXT without a wait": (["job"], [link.encode(link.NEXT, {})],
                            "NEXT: field 'idle' missing or not seconds up to 1e+09"),
    "OUTPUT downwards": (["job", "start"], [link.encode_output(0, 1, b"hi")],
                         "OUTPUT frames go the other way"),
    "READY downwards": ([], [link.encode(link.READY, {"warnings": []})],
                        "unexpected READY frame"),
    "PMI without a PMI job": (["job", "start"], [link.encode(link.PMI, {"op": "answer",
                                                                       "ask": 1})],
                              "PMI frame without a PMI job"),
    "unknown PMI operation": (["pmijob", "start"], [link.encode(link.PMI, {"op": "nonsense"})],
                              "unknown PMI operation 'nonsense'"),
    "PMI fence_done with numbers": (["pmijob", "start"],
                                    [link.encode(link.PMI, {"op": "fence_done",
                                                            "pairs": {"k": 1}})],
                                    "PMI fence_done: pairs must be strings"),
}


@pytest.mark.parametrize("case", list(WRONG_ORDER))
def test_agent_refuses_frames_in_the_wrong_order(agents, tmp_path, case):
    before, bad, expected = WRONG_ORDER[case]
    agent = agents.new()
    job = job_body(agent.tag, str(tmp_path), [[PY, "-c", SLEEPER]] * 2)

    for step in before:
        if step in ("job", "pmijob"):
            agent.send(link.encode(link.JOB, dict(job, pmi="fd" if step == "pmijob" else None)))
            agent.expect(link.READY)
        else:
            agent.send(link.encode(link.START))
            started, _ = agent.expect(link.STARTED)
            pids = set(started["pids"].values())
            assert len(pids) == 2
            assert wait_for(lambda: pids <= set(tagged_pids(agent.tag)), 5)
    for step in bad:
        agent.send(link.encode(link.JOB, job) if step == "job" else step)
    code, err = agent.finish(5)
    assert code == 1, err
    line = one_agent_line(err)
    assert f"protocol error: {expected}" in line, line
    no_tagged_processes(agent.tag)


def _without(key: str):
    return lambda job: {k: v for k, v in job.items() if k != key}


def _set(key: str, value: Any):
    return lambda job: dict(job, **{key: value})


def _set_rank(key: str, value: Any):
    return lambda job: dict(job, ranks=[dict(job["ranks"][0], **{key: value})])


BAD_JOBS = [
    pytest.param(_without("ranks"), id="ranks missing"),
    pytest.param(_set("ranks", 5), id="ranks an int"),
    pytest.param(_set("ranks", "x"), id="ranks a string"),
    pytest.param(_set("ranks", [["rank", 0]]), id="a rank a list"),
    pytest.param(_set("heartbeat", 3), id="heartbeat an int"),
    pytest.param(_set("heartbeat", "fast"), id="heartbeat a string"),
    pytest.param(_set("heartbeat", ["nan", 3]), id="heartbeat NaN"),
    pytest.param(_set("credit", "lots"), id="credit a string"),
    pytest.param(_set("credit", 1e999), id="credit infinite"),
    pytest.param(_set("grace", [1]), id="grace a list"),
    pytest.param(_set("common_env", [1, 2]), id="common_env a list"),
    pytest.param(_set_rank("env", {"A": 1}), id="env value an int"),
    pytest.param(_set_rank("env", "A=1"), id="env a string"),
    pytest.param(_set_rank("rank", "zero"), id="rank a word"),
    pytest.param(_set_rank("node_id", 1e999), id="node_id infinite"),
    pytest.param(_set_rank("argv", 7), id="argv an int"),
    pytest.param(_set_rank("argv", []), id="argv empty"),
    pytest.param(_set("data", {"addresses": [5], "port": 9, "token": "t"}),
                 id="dial-back address a number"),
    pytest.param(_set("data", {"addresses": ["127.0.0.1"], "port": 9, "token": "t",
                               "cert": "not a certificate"}), id="dial-back cert garbage"),
    pytest.param(_without("kvsname"), id="kvsname missing"),
    pytest.param(lambda job: dict(_without("size")(job), pmi="fd"), id="pmi job without size"),
    pytest.param(_set("kvsname", "kvs\nk/etc"), id="kvsname with a newline"),
    pytest.param(_set("files", [{"name": "f", "mode": 420, "data": "***"}]),
                 id="preloaded file not base64"),
    pytest.param(_set("pmi", "tcp"), id="pmi kind unknown"),
    pytest.param(_set_rank("rank", 7), id="rank beyond size"),
]


@pytest.mark.parametrize("mutate", BAD_JOBS)
def test_agent_refuses_a_malformed_job(agents, tmp_path, mutate):
    agent = agents.new()
    job = mutate(job_body(agent.tag, str(tmp_path), [[PY, "-c", SLEEPER]]))
    agent.send(link.encode(link.JOB, job))
    # Refused at once, before anything starts: no READY, one line, no traceback.
    frame = agent.next_frame(5)
    assert frame is None or frame[0] != link.READY, "a malformed JOB was accepted"
    code, err = agent.finish(2.0)
    assert code == 1, err
    assert "protocol error" in one_agent_line(err)
    no_tagged_processes(agent.tag)


def test_agent_refuses_a_signal_with_malformed_ranks(agents, tmp_path):
    agent = agents.new()
    agent.send(link.encode(link.JOB, job_body(agent.tag, str(tmp_path), [[PY, "-c", SLEEPER]])))
    agent.expect(link.READY)
    agent.send(link.encode(link.START))
    agent.expect(link.STARTED)
    agent.send(link.encode(link.SIGNAL, {"sig": 15, "ranks": [[0]]}))
    code, err = agent.finish(5)
    assert code == 1, err
    assert "protocol error" in one_agent_line(err)
    no_tagged_processes(agent.tag)


def test_frames_right_behind_the_bootstrap_are_not_lost(tmp_path):
    tag = uuid.uuid4().hex
    job = job_body(tag, str(tmp_path), [[PY, "-c", SLEEPER]])
    proc = subprocess.Popen(["sh", "-c", bootstrap.remote_command([PY])], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=clean_env(MSL_TEST_TAG=tag))
    try:
        proc.stdin.write(PAYLOAD + link.encode(link.JOB, job))
        proc.stdin.flush()
        reader = link.Reader(expect_sync=True)
        kinds: List[int] = []
        deadline = time.monotonic() + 3
        while link.READY not in kinds and time.monotonic() < deadline:
            if select.select([proc.stdout], [], [], 0.1)[0]:
                data = os.read(proc.stdout.fileno(), 1 << 16)
                if not data:
                    break
                kinds += [k for k, _ in reader.feed(data)]
        assert kinds[:1] == [link.HELLO]
        assert link.READY in kinds, "the JOB sent with the bootstrap was never answered"
    finally:
        proc.kill()
        proc.wait()
        for f in (proc.stdin, proc.stdout, proc.stderr):
            f.close()
        kill_tagged(tag)


# ---------------------------------------------------------------------------
# a whole conversation with the agent, without SSH
# ---------------------------------------------------------------------------

TALKER = """
import os, sys
rank = os.environ["LINK_RANK"].encode()
sys.stdout.buffer.write(b"rank " + rank + b": " + os.fsencode(sys.argv[1]) + b"|"
                        + os.environb[b"LINK_BYTES"] + b"\\n")
sys.stdout.buffer.flush()
sys.stderr.buffer.write(b"err " + rank + b"\\n")
sys.exit(3 * int(rank))
"""

ODD_BYTES = b"caf\xc3\xa9 \xff\xfe\x01 $HOME 'q' \"d\" \\"


def test_a_whole_job_through_the_agent(agents, tmp_path):
    agent = agents.new()
    assert agent.hello["protocol"] == link.PROTOCOL
    assert agent.hello["pid"] == agent.proc.pid
    job = job_body(agent.tag, str(tmp_path),
                   [[PY, "-c", TALKER, os.fsdecode(ODD_BYTES + b"%d" % i)] for i in range(2)])
    job["common_env"]["LINK_BYTES"] = os.fsdecode(ODD_BYTES)
    agent.send(link.encode(link.JOB, job))
    ready, _ = agent.expect(link.READY)
    assert ready["warnings"] == []
    assert not ready.get("direct")          # no dial-back offered: output stays on the link
    agent.send(link.encode(link.START))
    started, _ = agent.expect(link.STARTED)
    assert sorted(started["pids"]) == ["0", "1"]
    _, frames_seen = agent.expect(link.DONE)
    exits = {}
    for kind, body in frames_seen:
        assert kind in (link.OUTPUT, link.EXITED), (kind, body)
        if kind == link.EXITED:
            msg = link.decode_json(kind, body)
            assert msg["rank"] not in exits
            exits[msg["rank"]] = (msg["code"], msg["signal"])
    assert exits == {0: (0, None), 1: (3, None)}
    for i in range(2):
        assert agent.output[i, 1] == b"rank %d: %s%d|%s\n" % (i, ODD_BYTES, i, ODD_BYTES)
        assert agent.output[i, 2] == b"err %d\n" % i
    assert agent.ended == {(0, 1), (0, 2), (1, 1), (1, 2)}
    agent.send(link.encode(link.BYE))
    code, err = agent.finish(5)
    assert (code, err) == (0, "")
    no_tagged_processes(agent.tag)


def test_a_python_rank_of_an_agent_run_from_the_bundle_has_the_stack_hook(agents, tmp_path):
    """The hook is a file of the package, read through the module's loader: an agent
    run from the bundle (as every agent here is) reads it from the bundle."""
    agent = agents.new()
    show = "print([l for l in open('/proc/self/status') if l.startswith('SigCgt')][0])"
    agent.send(link.encode(link.JOB, job_body(agent.tag, str(tmp_path), [[PY, "-c", show]])))
    agent.expect(link.READY)
    agent.send(link.encode(link.START))
    agent.expect(link.STARTED)
    agent.expect(link.DONE)
    caught = int(agent.output[0, 1].split()[1], 16)
    assert caught >> (57 - 1) & 1, agent.output
    agent.send(link.encode(link.BYE))
    assert agent.finish(5) == (0, "")


def _one_job(agent: AgentProc, job: Dict[str, Any]) -> Dict[int, Tuple[Any, Any]]:
    """JOB, START, and every rank's exit up to DONE."""
    agent.send(link.encode(link.JOB, job))
    agent.expect(link.READY)
    agent.send(link.encode(link.START))
    agent.expect(link.STARTED)
    _, seen = agent.expect(link.DONE)
    return {m["rank"]: (m["code"], m["signal"]) for m in
            (link.decode_json(k, b) for k, b in seen if k == link.EXITED)}


def test_an_agent_told_next_runs_the_next_job_on_the_same_link(agents, tmp_path):
    """--max-restarts keeps the agents between attempts: after NEXT the agent
    forgets its job (what a rank left behind goes), beats while it waits but gives
    the launcher's silence NEXT's wait (not the job's heartbeat), and takes a new
    JOB of another name; BYE still ends it with 0."""
    agent = agents.new()
    left = tmp_path / "left.pid"
    daemon = ("import os, subprocess, sys\n"
              "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'],"
              " start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
              f"open({str(left)!r}, 'w').write(str(p.pid))\n"
              "sys.exit(3)\n")
    first = job_body(agent.tag, str(tmp_path), [[PY, "-c", daemon], [PY, "-c", "pass"]],
                     heartbeat=[0.2, 3])
    assert _one_job(agent, first) == {0: (3, None), 1: (0, None)}
    pid = int(left.read_text())
    agent.send(link.encode(link.NEXT, {"idle": 20.0}))
    # Its ranks' leftover is gone; the launcher's silence (3 heartbeats of 0.2 s
    # and more) does not end a waiting agent, which beats meanwhile.
    assert wait_for(lambda: not os.path.exists(f"/proc/{pid}"), 10)
    said = agent.drain(1.5)
    assert said and {kind for kind, _ in said} == {link.BEAT} and agent.proc.poll() is None
    second = job_body(agent.tag, str(tmp_path), [[PY, "-c", "print('again')"]] * 2,
                      kvsname=f"kvs_next_{agent.tag[:12]}")
    assert _one_job(agent, second) == {0: (0, None), 1: (0, None)}
    assert agent.output[0, 1] == b"again\n"
    agent.send(link.encode(link.BYE))
    code, err = agent.finish(5)
    assert (code, err) == (0, "")
    no_tagged_processes(agent.tag)


def test_an_agent_left_waiting_after_next_exits_by_itself(agents, tmp_path):
    # ... once the launcher has been silent for NEXT's wait: with 0, as on BYE
    # (under srun a failing agent would end the other hosts' agents).
    agent = agents.new()
    _one_job(agent, job_body(agent.tag, str(tmp_path), [[PY, "-c", "pass"]]))
    agent.send(link.encode(link.NEXT, {"idle": 1.0}))
    code, err = agent.finish(10)
    line = one_agent_line(err)
    assert code == 0 and "no next job came: no sign of life for " in line \
        and "(waiting at most 1 s)" in line, (code, err)
    no_tagged_processes(agent.tag)


def test_a_spare_hosts_agent_told_next_before_any_job_beats_and_takes_one(agents, tmp_path):
    # An agent the first attempt gives no rank (a spare host) waits from the start,
    # beating as NEXT says, so that the launcher sees it is alive; then a job comes.
    agent = agents.new()
    agent.send(link.encode(link.NEXT, {"idle": 20.0, "heartbeat": [0.1, 5]}))
    said = agent.drain(1.0)
    assert len(said) >= 5 and {kind for kind, _ in said} == {link.BEAT}, said
    body = job_body(agent.tag, str(tmp_path), [[PY, "-c", "print('spare')"]])
    assert _one_job(agent, body) == {0: (0, None)}
    assert agent.output[0, 1] == b"spare\n"
    agent.send(link.encode(link.BYE))
    assert agent.finish(5) == (0, "")
    no_tagged_processes(agent.tag)


#: More than the agent reads at once plus what a rank's pipe holds (1 MiB each at most).
FLOOD_SIZE = 4 << 20
FLOOD = """
import sys
sys.stdout.buffer.write(b"x" * %d)
sys.stdout.buffer.flush()
open(sys.argv[1], "w").close()
sys.stdout.buffer.write(b"\\nFINAL\\n")
""" % FLOOD_SIZE


def test_output_waits_for_credit(agents, tmp_path):
    agent = agents.new()
    marker = tmp_path / "wrote-everything"
    agent.send(link.encode(link.JOB, job_body(agent.tag, str(tmp_path),
                                              [[PY, "-c", FLOOD, str(marker)]], credit=1000)))
    agent.expect(link.READY)
    agent.send(link.encode(link.START))
    agent.expect(link.STARTED)
    # Without credit, the agent stops reading: the rank blocks in write().
    rest = agent.drain(1.5)
    assert all(k in (link.OUTPUT, link.BEAT) for k, _ in rest), rest
    agent.pending = [f for f in rest if f[0] != link.BEAT]
    while agent.pending:
        agent.next_frame(0.1)
    held = len(agent.output.get((0, 1), b""))
    assert 0 < held <= 1000 + CHUNK
    assert not marker.exists()
    assert b"FINAL" not in agent.output.get((0, 1), b"")
    assert tagged_pids(agent.tag)
    # Credit granted: the rest flows, the rank finishes.
    agent.send(link.encode(link.CREDIT, {"bytes": 1 << 30}))
    exited, _ = agent.expect(link.EXITED)
    assert (exited["code"], exited["signal"]) == (0, None)
    agent.expect(link.DONE)
    assert marker.exists()
    assert agent.output[0, 1] == b"x" * FLOOD_SIZE + b"\nFINAL\n"
    agent.send(link.encode(link.BYE))
    assert agent.finish(5) == (0, "")
    no_tagged_processes(agent.tag)


def test_signal_frame_ends_a_sleeping_rank(agents, tmp_path):
    agent = agents.new()
    agent.send(link.encode(link.JOB, job_body(agent.tag, str(tmp_path),
                                              [[PY, "-c", SLEEPER]] * 2)))
    sent = time.time()
    ready, _ = agent.expect(link.READY)
    got, replied = ready["clock"]            # this host's clock, for the launcher's offset
    assert sent <= got <= replied <= time.time()
    agent.send(link.encode(link.START))
    agent.expect(link.STARTED)
    agent.send(link.encode(link.SIGNAL, {"sig": int(signal.SIGTERM), "ranks": [1]}))
    exited, _ = agent.expect(link.EXITED)
    at = exited.pop("at")
    assert exited == {"rank": 1, "code": None, "signal": int(signal.SIGTERM), "stop_at": None}
    stopping = time.time()
    agent.send(link.encode(link.SIGNAL, {"sig": int(signal.SIGTERM)}))   # the job's stop
    exited, _ = agent.expect(link.EXITED)
    assert at <= stopping <= exited["stop_at"] <= exited.pop("at") <= time.time()
    assert exited == {"rank": 0, "code": None, "signal": int(signal.SIGTERM),
                      "stop_at": exited["stop_at"]}
    agent.expect(link.DONE)
    agent.send(link.encode(link.BYE))
    assert agent.finish(5) == (0, "")
    no_tagged_processes(agent.tag)


def _a_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return False


def test_a_ranks_end_before_the_stop_is_reported_as_before_it(agents, tmp_path):
    """The agent's loop may come to the stop before the end of a rank that came first
    (the agent was not running, and a heartbeat was already waiting on its link): that
    end is still reported as before the stop, or the launcher would take it for the
    stop's doing and not count it (tests/rooms/run/test_failure_order.py has the rules)."""
    agent = agents.new()
    go = tmp_path / "go"
    ender = f"import os, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.01)\nos._exit(3)"
    agent.send(link.encode(link.JOB, job_body(agent.tag, str(tmp_path),
                                              [[PY, "-c", ender], [PY, "-c", SLEEPER]])))
    agent.expect(link.READY)
    agent.send(link.encode(link.START))
    started, _ = agent.expect(link.STARTED)
    os.kill(agent.proc.pid, signal.SIGSTOP)
    try:
        agent.send(link.encode(link.BEAT))              # the link is ready first
        go.touch()
        assert wait_for(lambda: _a_zombie(started["pids"]["0"]), 10)
        agent.send(link.encode(link.SIGNAL, {"sig": int(signal.SIGTERM)}))   # the job's stop
    finally:
        os.kill(agent.proc.pid, signal.SIGCONT)
    exited, _ = agent.expect(link.EXITED)
    assert (exited["rank"], exited["code"], exited["stop_at"]) == (0, 3, None), exited
    exited, _ = agent.expect(link.EXITED)
    assert (exited["rank"], exited["signal"]) == (1, int(signal.SIGTERM)), exited
    assert exited["stop_at"] is not None
    agent.expect(link.DONE)
    agent.send(link.encode(link.BYE))
    assert agent.finish(5) == (0, "")
    no_tagged_processes(agent.tag)


def _started_sleepers(agent: AgentProc, cwd: str, **over: Any) -> None:
    agent.send(link.encode(link.JOB, job_body(agent.tag, cwd, [[PY, "-c", SLEEPER]] * 2,
                                              **over)))
    agent.expect(link.READY)
    agent.send(link.encode(link.START))
    started, _ = agent.expect(link.STARTED)
    assert len(started["pids"]) == 2
    assert wait_for(lambda: all(p in tagged_pids(agent.tag) for p in started["pids"].values()),
                    5)


def test_end_of_link_stops_the_ranks(agents, tmp_path):
    agent = agents.new()
    _started_sleepers(agent, str(tmp_path))
    agent.close_link()
    code, err = agent.finish(5)
    assert code == 1, err
    assert one_agent_line(err).endswith("lost the launcher: the link reached end-of-file")
    no_tagged_processes(agent.tag)


def test_heartbeat_silence_stops_the_ranks(agents, tmp_path):
    agent = agents.new()
    _started_sleepers(agent, str(tmp_path), heartbeat=[0.2, 3])
    beats = agent.drain(2.0)             # the launcher says nothing for 2 s
    assert any(k == link.BEAT for k, _ in beats)   # the agent's own beats kept coming
    code, err = agent.finish(10)         # (the silence's 3 s end in the first of these)
    assert code == 1, err
    assert "no sign of life" in one_agent_line(err)
    no_tagged_processes(agent.tag)
