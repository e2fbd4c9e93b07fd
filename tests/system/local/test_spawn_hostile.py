"""Hostile tests of MPI_Comm_spawn under mslaunch.

Real launches of real processes: ranks are a raw PMI client written here
(``RAW``, speaking PMI-1 or PMI-2 over the inherited ``PMI_FD``) or mpi4py on
the MPICH wheel.  What every launch must show: one error reply (``rc=1``) per
bad request and at most one ``mslaunch: PMI:`` line for it, no traceback, no
hang, no process left behind, no singleton-probe directory left in TMPDIR.
"""

from __future__ import annotations

import json
import os
import re
import resource
import signal
import subprocess
import time

import pytest
from helpers import PY, clean_env, cmd, kill_tagged, new_tag, read_until, tagged_pids, wait_for
from remote import FAST_BEAT, agents, no_agents

from mslaunch.mpi.pmi.files import shm_segments

# -- a raw PMI client ------------------------------------------------------------
# argv[1]: JSON steps (or @FILE holding them); a dict of steps is keyed by PMI_RANK
# ("*": the rest).  Every reply read is printed as one JSON line [kind, text].
RAW = r'''
import json, os, signal, socket, sys, time
arg = sys.argv[1]
steps = json.loads(open(arg[1:]).read() if arg.startswith("@") else arg)
if isinstance(steps, dict):
    steps = steps.get(os.environ.get("PMI_RANK", ""), steps.get("*", []))
if "PMI_FD" in os.environ:
    s = socket.socket(fileno=int(os.environ["PMI_FD"]))
else:                                   # -pmi-port
    host, port = os.environ["PMI_PORT"].rsplit(":", 1)
    s = socket.create_connection((host, int(port)))
s.settimeout(30)
buf = bytearray()
def out(kind, text):
    print(json.dumps([kind, text]), flush=True)
def fill():
    data = s.recv(1 << 20)
    if not data:
        raise EOFError
    buf.extend(data)
def line():
    while b"\n" not in buf:
        fill()
    i = buf.index(b"\n"); text = bytes(buf[:i]); del buf[:i + 1]
    return text.decode("utf-8", "replace")
def frame():
    while len(buf) < 6 or len(buf) < 6 + int(buf[:6]):
        fill()
    n = int(buf[:6]); text = bytes(buf[6:6 + n]); del buf[:6 + n]
    return text.decode("utf-8", "replace")
def v2(body):
    data = body.encode()
    return b"%6d" % len(data) + data
try:
    for kind, a in steps:
        if kind == "v1":
            s.sendall(a.encode() + b"\n"); out("line", line())
        elif kind == "v2":
            s.sendall(v2(a)); out("frame", frame())
        elif kind == "raw":
            s.sendall(a.encode())
        elif kind == "rawv2":
            s.sendall(v2(a))
        elif kind == "line":
            for _ in range(a): out("line", line())
        elif kind == "frame":
            for _ in range(a): out("frame", frame())
        elif kind == "sleep":
            time.sleep(a)
        elif kind == "touch":
            open(a, "w").close()
        elif kind == "waitfile":
            while not os.path.exists(a): time.sleep(0.02)
        elif kind == "env":
            out("env", {k: os.environ.get(k) for k in a})
        elif kind == "ignore_term":
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        elif kind == "initack":         # -pmi-port: authenticate, read initack + 3 sets
            s.sendall(b"cmd=initack pmiid=%s\n" % os.environ["PMI_ID"].encode())
            for _ in range(4): out("line", line())
        elif kind == "fds":             # descriptors the launcher (our parent) holds:
            fds = []                    # the fewest seen within a seconds
            end = time.monotonic() + a
            while not fds or time.monotonic() < end:
                fds.append(len(os.listdir("/proc/%d/fd" % os.getppid()))); time.sleep(0.05)
            out("fds", min(fds))
        elif kind == "exit":
            sys.stdout.flush(); os._exit(a)
except (EOFError, ConnectionResetError):
    out("eof", "")
except socket.timeout:
    out("timeout", "")
'''

INIT = ["v1", "cmd=init pmi_version=1 pmi_subversion=1"]
FIN = ["v1", "cmd=finalize"]
INIT2 = [["v1", "cmd=init pmi_version=2 pmi_subversion=0"], ["v2", "cmd=fullinit;pmirank=0;"]]
FIN2 = ["v2", "cmd=finalize;"]
JOB = ["env", ["MSLAUNCH_JOB", "PMI_SPAWNED"]]
VALLEN_MAX = 32768


def seg(exe: str = "/bin/true", nprocs: object = 1, args=(), tot: object = 1,
        sofar: object = 1, argcnt: int | None = None, preput=(), info=(),
        first: bool = True) -> str:
    """One segment of PMI-1's multi-line spawn, as MPICH's client writes it."""
    lines = [f"nprocs={nprocs}", f"execname={exe}", f"totspawns={tot}",
             f"spawnssofar={sofar}", f"argcnt={len(args) if argcnt is None else argcnt}"]
    lines += [f"arg{i + 1}={a}" for i, a in enumerate(args)]
    if first:
        lines.append(f"preput_num={len(preput)}")
        for i, (k, v) in enumerate(preput):
            lines += [f"preput_key_{i}={k}", f"preput_val_{i}={v}"]
    lines.append(f"info_num={len(info)}")
    for i, (k, v) in enumerate(info):
        lines += [f"info_key_{i}={k}", f"info_val_{i}={v}"]
    return "\n".join(lines) + "\nendcmd\n"


def mcmd(*segments: str) -> str:
    return "mcmd=spawn\n" + "".join(segments)


def spawn1(*segments: str):
    """Steps: send one PMI-1 spawn and read its reply."""
    return [["raw", mcmd(*segments)], ["line", 1]]


def spawn2(exe: str, nprocs: int = 1, args=(), info=(), preput=(), extra: str = "") -> str:
    """A PMI-2 spawn frame's body (argv numbered from 0, as MPICH does)."""
    body = f"cmd=spawn;ncmds=1;preputcount={len(preput)};"
    body += "".join(f"ppkey{i}={k};ppval{i}={v};" for i, (k, v) in enumerate(preput))
    body += f"subcmd={exe};maxprocs={nprocs};argc={len(args)};"
    body += "".join(f"argv{i}={a};" for i, a in enumerate(args))
    body += f"infokeycount={len(info)};"
    body += "".join(f"infokey{i}={k};infoval{i}={v};" for i, (k, v) in enumerate(info))
    return body + extra


# -- running launches ---------------------------------------------------------------
class Launch:
    def __init__(self, rc: int | None, out: bytes, err: bytes, elapsed: float,
                 left: list[int], probes: list[str]) -> None:
        self.rc, self.out, self.err, self.elapsed = rc, out, err, elapsed
        self.left, self.probes = left, probes
        self.text = err.decode("utf-8", "replace")

    def replies(self, job: int | None = None) -> list[tuple[str, object]]:
        """The raw client's lines ([kind, text]); with --tag-output, of job ``job`` only."""
        found = []
        for line in self.out.decode("utf-8", "replace").splitlines():
            m = re.match(r"\[(\d+),\d+\]<stdout>:(.*)", line)
            if m:
                if job is not None and int(m.group(1)) != job:
                    continue
                line = m.group(2)
            if line.startswith("["):
                try:
                    kind, text = json.loads(line)
                except ValueError:
                    continue
                found.append((kind, text))
        return found

    def answers(self, job: int | None = None) -> list[str]:
        return [t for k, t in self.replies(job) if k in ("line", "frame")]

    def clean(self) -> None:
        """No traceback, nothing left running, no probe directory left."""
        assert "Traceback" not in self.text, self.text
        assert self.left == [], self.left
        assert self.probes == [], self.probes


@pytest.fixture(scope="module")
def raw(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("raw") / "raw_pmi.py"
    path.write_text(RAW)
    return str(path)


def r_raw() -> str:
    """The raw client's path, for arguments of spawned processes."""
    return RAW_PATH[0]


RAW_PATH: list[str] = []


@pytest.fixture(autouse=True)
def _raw_path(raw):
    RAW_PATH[:] = [raw]


@pytest.fixture
def launch(raw, tmp_path):
    """``launch(*options, steps=..., n=1)``: mslaunch -n N PY RAW STEPS; a Launch."""
    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir()

    def go(*options: str, steps, n: int = 1, timeout: float = 30, env=None,
           program=None, preexec_fn=None, tmp=None) -> Launch:
        tag = new_tag()
        full = clean_env(MSL_TEST_TAG=tag, TMPDIR=str(tmp or tmpdir))
        full.update(env or {})
        data = json.dumps(steps)
        if len(data) > 60000:
            f = tmp_path / f"steps-{tag}.json"
            f.write_text(data)
            data = "@" + str(f)
        argv = cmd(*options, "-n", str(n), *(program or [PY, raw, data]))
        t0 = time.monotonic()
        p = subprocess.Popen(argv, env=full, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, preexec_fn=preexec_fn)
        try:
            out, err = p.communicate(timeout=timeout)
            rc: int | None = p.returncode
        except subprocess.TimeoutExpired:
            p.kill()                 # the watchdog ends what it started
            out, err = p.communicate()
            rc = None
        elapsed = time.monotonic() - t0
        wait_for(lambda: tagged_pids(tag) == [], 10)
        left = tagged_pids(tag)
        kill_tagged(tag)
        wait_for(lambda: not [n for n in os.listdir(tmp or tmpdir)
                              if n.startswith("mslaunch-ompi-")], 3)
        probes = [n for n in os.listdir(tmp or tmpdir) if n.startswith("mslaunch-ompi-")]
        return Launch(rc, out, err, elapsed, left, probes)
    return go


def pmi_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("mslaunch: PMI:")]


def rc_of(answer: str) -> str:
    m = re.search(r"(?:^| |;)rc=(\d+)", answer)
    return m.group(1) if m else "?"


# -- 1. hostile spawn requests on the wires -----------------------------------------

def test_hostile_pmi1_spawns_get_one_error_reply_each_and_the_job_goes_on(launch, tmp_path):
    (tmp_path / "adir").mkdir()
    bad = [
        seg(nprocs=100001),                                   # over the cap
        seg(nprocs=0),
        seg(nprocs="1e3"),
        seg(tot=3, sofar=2) + seg(tot=3, sofar=1, first=False)
        + seg(tot=3, sofar=3, first=False),                   # spawnssofar going backwards
        seg(args=["a"], argcnt=5),                            # argcnt larger than the args
        seg(args=["x"] * 5000),                               # over the 4096 arguments
        seg(exe=""),                                          # empty execname
        seg(exe=str(tmp_path / "adir")),                      # a directory
        seg(exe="/nonexistent/program"),
        seg(info=[("wdir", "\u00e9\u2603 x=y;z\\"), ("k\u00ff", "v")]),   # odd bytes
        seg(info=[("host", "no-such-host.invalid")]),
        seg(info=[("hostfile", str(tmp_path / "missing-hostfile"))]),
        seg(preput=[("k", "v")], first=True).replace("preput_num=1", "preput_num=1025"),
        seg().replace("info_num=0", "info_num=99999"),
    ]
    steps = [["raw", mcmd(seg())], ["line", 1], INIT]         # before init
    for s in bad:
        steps += spawn1(s)
    steps += spawn1(seg(exe="/bin/echo", args=["child-ran"]))  # a good one still works
    steps += [["raw", mcmd(seg()) + mcmd(seg())], ["line", 2]]  # two without waiting
    steps += [FIN] + spawn1(seg())                            # after finalize
    r = launch(steps=steps)
    r.clean()
    assert r.rc == 0, (r.text, r.replies())
    answers = r.answers()
    assert len(answers) == 1 + 1 + len(bad) + 1 + 2 + 1 + 1, answers
    assert rc_of(answers[0]) == "1" and "not_initialized" in answers[0]
    assert [rc_of(a) for a in answers[2:2 + len(bad)]] == ["1"] * len(bad), answers
    assert answers[2 + len(bad):5 + len(bad)] == ["cmd=spawn_result rc=0"] * 3, answers
    assert rc_of(answers[-1]) == "1" and "finalized" in answers[-1]
    assert b"child-ran" in r.out
    lines = r.text.splitlines()
    assert all(line.startswith("mslaunch: PMI: ") for line in lines), r.text
    assert len(lines) <= len(bad) + 2, r.text


def test_hostile_pmi2_spawns_get_one_error_reply_each_pipelined_spawns_both_run(launch):
    bad = [
        "cmd=spawn;ncmds=2;preputcount=0;subcmd=/bin/true;maxprocs=1;argc=0;infokeycount=0;",
        "cmd=spawn;ncmds=1;subcmd=;maxprocs=1;",
        "cmd=spawn;ncmds=1;subcmd=/bin/true;maxprocs=0;",
        "cmd=spawn;ncmds=1;subcmd=/bin/true;maxprocs=100001;",
        "cmd=spawn;ncmds=1;subcmd=/bin/true;maxprocs=1;argc=3;argv0=a;",
        "cmd=spawn;ncmds=1;preputcount=2;ppkey0=a;ppval0=b;subcmd=/bin/true;maxprocs=1;",
        "cmd=spawn;ncmds=1;subcmd=/nonexistent;maxprocs=1;",
        ("cmd=spawn;ncmds=1;subcmd=/bin/true;maxprocs=1;infokeycount=1;infokey0=wdir;"
         "infoval0=/nonexistent/\u00e9 x;"),
        "cmd=spawn;ncmds=1;subcmd=/bin/true;maxprocs=1;bogus;",
    ]
    good = spawn2("/bin/true")
    steps = INIT2 + [["v2", b] for b in bad] + [
        ["rawv2", good], ["rawv2", good], ["frame", 2],       # two without waiting
        FIN2]
    r = launch(steps=steps)
    r.clean()
    assert r.rc == 0, r.text
    answers = r.answers()[2:]
    assert [rc_of(a) for a in answers] == ["1"] * len(bad) + ["0", "0", "0"], answers
    jobs = [re.search(r"jobid=([^;]*)", a).group(1) for a in answers[len(bad):-1]]
    assert [j.rsplit("_", 1)[1] for j in jobs] == ["2", "3"], jobs
    assert len(pmi_lines(r.text)) <= len(bad), r.text


def test_pmi2_spawn_response_echoes_thrid(launch):
    r = launch(steps=INIT2 + [["v2", "cmd=kvs-put;key=a;value=b;thrid=7;"],
                              ["v2", spawn2("/bin/true", extra="thrid=7;")], FIN2])
    r.clean()
    put, spawned = r.answers()[2:4]
    assert "thrid=7;" in put                  # the ordinary commands echo it
    assert rc_of(spawned) == "0" and "thrid=7;" in spawned, spawned


def test_a_multiline_spawn_cut_by_eof_ends_the_job_with_one_line(launch):
    # totspawns=2 but the rank leaves after the first segment
    r = launch(steps=[INIT, ["raw", mcmd(seg(tot=2))], ["sleep", 0.2], ["exit", 0]])
    r.clean()
    assert r.rc == 1, r.text
    assert "exited without MPI_Finalize" in r.text
    assert len(r.text.splitlines()) == 1, r.text    # (a launch that hung: rc None)


def test_a_multiline_spawn_over_the_size_limit_closes_only_that_connection(launch):
    # 10,000 long arguments: more than a PMI message may hold
    r = launch(steps=[INIT, ["raw", mcmd(seg(args=[f"{i:05d}" for i in range(10000)]))],
                      ["line", 1]])
    r.clean()
    assert r.rc == 1, r.text
    assert ["eof"] == [k for k, _ in r.replies()][1:], r.replies()
    assert len(pmi_lines(r.text)) == 1 and "too long" in r.text, r.text


def test_a_spawn_while_the_job_is_being_stopped_is_refused(launch, tmp_path):
    marker = tmp_path / "should-not-exist"
    ready = tmp_path / "rank-0-ignores-sigterm"
    steps = {"1": [["waitfile", str(ready)], ["exit", 5]],
             "0": [["ignore_term", 0], ["touch", str(ready)], INIT, ["sleep", 1.5],
                   *spawn1(seg(exe="/usr/bin/touch", args=[str(marker)])), ["exit", 0]]}
    r = launch("--grace", "5", steps=steps, n=2)
    r.clean()
    assert r.rc == 5, r.text
    assert [rc_of(a) for a in r.answers()[1:]] == ["1"], r.replies()
    assert "ending" in r.answers()[1]
    assert not marker.exists()


def test_pmi_keys_in_preput_do_not_change_the_childrens_job_attributes(launch):
    child = [INIT, ["v1", "cmd=get key=PMI_process_mapping"], ["v1", "cmd=get key=mine"], FIN]
    from mslaunch.core.procmap import process_mapping
    preput = [("PMI_process_mapping", "(vector,(0,99,1))"), ("PMI_size", "9"),
              ("mine", "\u00e9t\u00e9=1 2")]
    r = launch("--tag-output", steps=[INIT, *spawn1(seg(exe=PY, args=[r_raw(), json.dumps(child)],
                                                       preput=preput)), FIN])
    r.clean()
    assert r.rc == 0, r.text
    assert r.answers(1)[1] == "cmd=spawn_result rc=0"
    got = r.answers(2)
    assert got[1] == f"cmd=get_result rc=0 value={process_mapping([0])}", got
    assert got[2] == "cmd=get_result rc=0 value=\u00e9t\u00e9=1\\ 2", got


def test_preput_values_respect_vallen_max(launch):
    child = [INIT, ["v1", "cmd=get key=big"], FIN]
    r = launch("--tag-output", steps=[INIT, *spawn1(seg(exe=PY, args=[r_raw(), json.dumps(child)],
                                                       preput=[("big", "v" * 40000)])), FIN])
    r.clean()
    assert r.rc == 0, r.text
    refused = rc_of(r.answers(1)[1]) == "1"
    values = [a for a in r.answers(2) if "get_result" in a]
    assert refused or all(len(a.partition("value=")[2]) <= VALLEN_MAX for a in values), \
        [len(a) for a in values]


# -- 2. spawn storms -------------------------------------------------------------------

def test_fifty_spawns_in_a_row_get_their_own_job_numbers_files_and_tags(launch, tmp_path):
    logs = tmp_path / "logs"
    steps = list(INIT2)
    for i in range(50):
        steps.append(["v2", spawn2("/bin/echo", args=[f"s{i + 2}"])])
    steps.append(FIN2)
    r = launch("--tag-output", "--output-filename", str(logs), steps=steps)
    r.clean()
    assert r.rc == 0, r.text
    answers = r.answers(1)[2:]
    jobs = [re.search(r"jobid=([^;]*)", a).group(1) for a in answers[:-1]]
    assert [j.rsplit("_", 1)[1] for j in jobs] == [str(n) for n in range(2, 52)], answers
    assert len(set(jobs)) == 50
    out = set(r.out.decode().splitlines())
    for n in range(2, 52):
        assert f"[{n},0]<stdout>:s{n}" in out
        assert (logs / str(n) / "rank.0" / "stdout").read_text() == f"[{n},0]<stdout>:s{n}\n"
    assert sorted(int(p.name) for p in logs.iterdir()) == list(range(1, 52))
    assert r.err == b""


def test_a_spawn_chain_five_levels_deep(launch):
    def level(depth: int):
        if depth == 0:
            return [JOB, INIT, FIN]
        return [JOB, INIT, *spawn1(seg(exe=PY, args=[r_raw(), json.dumps(level(depth - 1))])),
                FIN]
    r = launch("--tag-output", steps=level(5))
    r.clean()
    assert r.rc == 0, r.text
    envs = {}
    for job in range(1, 7):
        [env] = [t for k, t in r.replies(job) if k == "env"]
        envs[job] = env
        if job < 6:
            assert "cmd=spawn_result rc=0" in r.answers(job), r.out
    first = envs[1]["MSLAUNCH_JOB"]
    assert [envs[j]["MSLAUNCH_JOB"] for j in range(2, 7)] == [f"{first}_{j}" for j in range(2, 7)]
    assert [envs[j]["PMI_SPAWNED"] for j in range(1, 7)] == [None] + ["1"] * 5


def test_many_ranks_spawning_at_once(launch):
    steps = {"*": INIT2 + [["v2", spawn2("/bin/true", nprocs=2)] for _ in range(3)] + [FIN2]}
    r = launch(steps=steps, n=4)
    r.clean()
    assert r.rc == 0, r.text
    spawned = [a for a in r.answers() if a.startswith("cmd=spawn-response")]
    assert len(spawned) == 12 and all(rc_of(a) == "0" for a in spawned), spawned
    numbers = sorted(int(re.search(r"jobid=[^;]*_(\d+);", a).group(1)) for a in spawned)
    assert numbers == list(range(2, 14))


def test_nojobid_output_files_of_a_spawned_job_do_not_overwrite_the_first_jobs(launch,
                                                                               tmp_path):
    logs = tmp_path / "logs"
    r = launch("--output-filename", f"{logs}:nojobid",
               steps=[INIT, *spawn1(seg(exe="/bin/echo", args=["kid"])), FIN])
    r.clean()
    assert r.rc == 0, r.text
    assert (logs / "2" / "rank.0" / "stdout").read_text() == "kid\n"
    assert "spawn_result rc=0" in (logs / "rank.0" / "stdout").read_text()


@pytest.mark.parametrize("mode", [
    "inherited",
    pytest.param("-pmi-port"),
])
def test_spawned_jobs_that_ended_hold_no_descriptors_in_the_launcher(launch, mode):
    first = [["initack", 0]] if mode == "-pmi-port" else []
    steps = first + [INIT, ["fds", 0.1]]
    for _ in range(100):
        steps += spawn1(seg())
    steps += [["fds", 1.0], FIN]
    r = launch(*([mode] if mode == "-pmi-port" else []), steps=steps)
    r.clean()
    assert r.rc == 0, r.text
    assert r.answers().count("cmd=spawn_result rc=0") == 100
    before, after = [t for k, t in r.replies() if k == "fds"]
    assert after - before <= 10, (before, after)


def test_a_large_spawn_raises_the_open_file_limit_as_the_first_job_does(launch):
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 4096:
        pytest.skip("the hard open-file limit is too low to show it")

    def limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
    first = launch(program=["/bin/sleep", "0.5"], steps=[], n=300, preexec_fn=limit)
    assert first.rc == 0, first.text     # 300 processes as the first job: the limit is raised
    r = launch(steps=[INIT, *spawn1(seg(exe="/bin/sleep", nprocs=300, args=["0.5"])), FIN],
               preexec_fn=limit)
    r.clean()
    assert r.answers()[1] == "cmd=spawn_result rc=0", r.text


# -- 3. failure policy with children -------------------------------------------------

@pytest.mark.parametrize("child, status, says", [
    (["/bin/sh", "-c", "kill -9 $$"], 137, "rank 0 of spawned job 2 (pid"),
    ("abort", 3, "rank 0 of spawned job 2 (pid"),
    (["/bin/sh", "-c", "trap '' TERM; sleep 60"], 4, "rank 0 (pid"),   # the parent aborts
], ids=["child-sigkill", "child-abort", "parent-abort"])
def test_a_failure_in_a_family_ends_the_launch_with_its_status(launch, child, status, says):
    then = [["sleep", 30]]
    if child == "abort":
        child = [PY, r_raw(), json.dumps([INIT, ["raw", "cmd=abort exitcode=3\n"],
                                          ["sleep", 30]])]
    elif status == 4:
        then = [["sleep", 0.3], ["raw", "cmd=abort exitcode=4\n"], ["sleep", 30]]
    r = launch("--grace", "1", steps=[INIT, *spawn1(seg(exe=child[0], args=child[1:])),
                                      *then, FIN])
    r.clean()
    assert r.rc == status, r.text
    what = {137: "was killed by signal 9", 3: "called MPI_Abort with exit code 3",
            4: "called MPI_Abort with exit code 4"}[status]
    assert says in r.text and what in r.text, r.text   # (one that waited for the sleep: rc None)


def test_the_launch_waits_for_children_that_outlive_their_parent(launch):
    r = launch(steps=[INIT, *spawn1(seg(exe="/bin/sh", args=["-c", "sleep 1; echo late"],
                                        nprocs=2)), FIN])
    r.clean()
    assert r.rc == 0, r.text
    assert r.out.decode().count("late") == 2
    assert r.elapsed >= 1.0


def test_a_child_that_never_joins_mpi_while_its_peer_did_ends_the_launch(launch):
    peer = [PY, r_raw(), json.dumps([INIT, ["v1", "cmd=barrier_in"], FIN])]
    two = seg(exe=peer[0], args=peer[1:], tot=2) + seg(exe="/bin/true", tot=2, sofar=2,
                                                       first=False)
    r = launch(steps=[INIT, *spawn1(two), ["sleep", 30], FIN], timeout=40)
    r.clean()
    assert r.rc == 1, r.text
    assert "rank 1 of spawned job 2" in r.text and "without joining MPI" in r.text, r.text
    assert r.elapsed < 30, r.elapsed        # ended by the launcher, not by the parent's sleep


def test_timeout_reaches_a_grandchild_that_ignores_sigterm(launch):
    child = [JOB, INIT, *spawn1(seg(exe="/bin/sh", args=["-c", "trap '' TERM; sleep 60"])),
             FIN]
    r = launch("--timeout", "2", "--grace", "1",
               steps=[INIT, *spawn1(seg(exe=PY, args=[r_raw(), json.dumps(child)])), FIN])
    r.clean()
    assert r.rc == 110, r.text               # (a launch that waited for the grandchild: rc None)


def test_sigterm_stops_every_generation(raw, tmp_path):
    tag = new_tag()
    grand = [INIT, *spawn1(seg(exe="/bin/sleep", args=["60"])), ["sleep", 60]]
    child = [INIT, *spawn1(seg(exe=PY, args=[raw, json.dumps(grand)])), ["sleep", 60]]
    p = subprocess.Popen(cmd("-n", "1", PY, raw, json.dumps(
        [INIT, *spawn1(seg(exe=PY, args=[raw, json.dumps(child)])), ["sleep", 60]])),
        env=clean_env(MSL_TEST_TAG=tag, TMPDIR=str(tmp_path)), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        assert wait_for(lambda: b"sleep\x0060\x00" in _cmdlines(tag), 20)   # the great-grandchild
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=20)
        assert p.returncode == 128 + signal.SIGTERM, err
        assert b"Traceback" not in err
        assert wait_for(lambda: tagged_pids(tag) == [], 10), tagged_pids(tag)
        assert not [n for n in os.listdir(tmp_path) if n.startswith("mslaunch-ompi-")]
    finally:
        p.kill()
        p.wait()
        kill_tagged(tag)


def _cmdlines(tag: str) -> bytes:
    found = b""
    for pid in tagged_pids(tag):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                found += f.read() + b"\n"
        except OSError:
            pass
    return found


def test_a_spawn_that_starts_only_partly_does_not_hang_the_launch(launch, tmp_path):
    junk = tmp_path / "junk"
    junk.write_text("hello world\n")
    junk.chmod(0o755)
    peer = [PY, r_raw(), json.dumps([INIT, ["v1", "cmd=barrier_in"], FIN])]
    two = seg(exe=peer[0], args=peer[1:], tot=2) + seg(exe=str(junk), tot=2, sofar=2,
                                                       first=False)
    r = launch("--timeout", "4", steps=[INIT, *spawn1(two), FIN])
    r.clean()
    assert rc_of(r.answers()[1]) == "1", r.out
    assert r.rc == 0, r.text


MPI_PARENT = """
import json, os, sys
from mpi4py import MPI
if len(sys.argv) > 1:                      # a child: both abort once MPI runs
    MPI.COMM_WORLD.Barrier()
    MPI.COMM_WORLD.Abort(3)
print(json.dumps(["env", {"MSLAUNCH_JOB": os.environ["MSLAUNCH_JOB"]}]), flush=True)
MPI.COMM_SELF.Spawn(sys.executable, [__file__, "child"], maxprocs=2)
"""


@pytest.mark.mpi
def test_mpi_children_that_abort_leave_no_shared_memory(launch, mpich, tmp_path):
    prog = tmp_path / "parent.py"
    prog.write_text(MPI_PARENT)
    r = launch(program=[PY, str(prog)], steps=[], timeout=60)
    r.clean()
    assert r.rc == 3, r.text
    assert "of spawned job 2" in r.text and "MPI_Abort with exit code 3" in r.text, r.text
    # (MPICH's MPI_Abort in a spawned process may return: a child can print too)
    kvs = min((t["MSLAUNCH_JOB"] for k, t in r.replies() if k == "env"), key=len)
    assert shm_segments(kvs) == [] and shm_segments(kvs + "_2") == []


# -- 4. the singleton probe --------------------------------------------------------

PROBE_WRITER = (
    "import os, sys, time\n"
    "d = os.path.dirname(os.environ['OMPI_MCA_mpi_show_mca_params_file'])\n"
    "if os.environ['PMI_RANK'] == '0':\n"
    "    with open(os.path.join(d, sys.argv[1]), 'w') as f:\n"
    "        f.write('# by MPI_COMM_WORLD rank 0 (out of a total of 1) on x\\n')\n"
    "time.sleep(0.7)\n")


def _probe_junk(name: str, hazard: str):
    return pytest.param(name)


@pytest.mark.parametrize("name", [
    _probe_junk("\u00b2", "mpi/early.py SingletonProbe.check: name.isdigit() is true for "
                "'\u00b2' (superscript two) but int(name) raises ValueError"),
    _probe_junk("99999", "serve/mpijobs.py MPIJobs.singleton: self.sup.ranks[key] with the key "
                "99999 taken from the file name raises IndexError (from_agent checks "
                "'key not in host.ranks' for remote reports; the local path does not)"),
    "not-a-rank",
    "0.tmp",
])
def test_junk_in_the_probe_directory_does_not_crash_the_launcher(launch, name):
    r = launch(program=[PY, "-c", PROBE_WRITER, name], steps=[], n=2)
    assert "Traceback" not in r.text, r.text
    assert r.rc == 0, r.text
    r.clean()


def test_a_fifo_in_the_probe_directory_does_not_block_the_launcher(launch, tmp_path):
    code = ("import os, time\n"
            "if os.environ['PMI_RANK'] == '0':\n"
            "    p = os.environ['OMPI_MCA_mpi_show_mca_params_file']\n"
            "    os.mkfifo(p); open(p + '.path', 'w').close()\n"
            "time.sleep(0.5)\n")
    r, unblocked = _unblocking(launch, tmp_path, [], [PY, "-c", code],
                               lambda: _find(tmp_path / "tmpdir", ".path"))
    assert not unblocked, "the launcher waited in open() of the FIFO"
    assert r.rc == 0, r.text


def _find(top, suffix):
    for root, _, files in os.walk(top):
        for f in files:
            if f.endswith(suffix):
                return os.path.join(root, f[: -len(suffix)])
    return None


def _unblocking(launch, tmp_path, options, program, fifo_path, steps=(), wait=30.0):
    """Run a launch that may block in open() of a FIFO; should it still run after
    ``wait`` seconds, remove the FIFO and open it for writing (so that the launcher
    can go on and end).  Returns the launch's result and whether that was needed."""
    import threading
    done = threading.Event()
    unblocked = []

    def unblock():
        if done.wait(wait):
            return
        unblocked.append(True)
        path = fifo_path()
        if path:
            try:
                fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:
                fd = -1
            try:
                os.unlink(path)
            except OSError:
                pass
            if fd >= 0:
                os.close(fd)
    t = threading.Thread(target=unblock, daemon=True)
    t.start()
    try:
        r = launch(*options, program=program, steps=list(steps), n=2 if not steps else 1,
                   timeout=wait + 15)
    finally:
        done.set()
        t.join()
    return r, bool(unblocked)


@pytest.mark.parametrize("tmpdir", ["missing", "a-file"])
def test_a_job_runs_when_tmpdir_is_unusable(launch, tmp_path, tmpdir):
    where = tmp_path / tmpdir
    if tmpdir == "a-file":
        where.write_text("")
    steps = [INIT, ["v1", "cmd=barrier_in"], *spawn1(seg()), FIN]
    r = launch(steps=steps, n=2, env={"TMPDIR": str(where)})
    assert r.rc == 0, r.text
    assert "Traceback" not in r.text and r.left == []
    assert [rc_of(a) for a in r.answers()] == ["0"] * 8


def test_a_rank_running_its_own_one_process_open_mpi_job_is_not_a_singleton(launch):
    if not os.path.exists("/usr/bin/mpirun.openmpi"):
        pytest.skip("Debian's Open MPI 4.1.4")
    code = (
        "import os, subprocess\n"
        "env = {k: v for k, v in os.environ.items() if not k.startswith('OMPI_')"
        " or k.startswith(('OMPI_MCA_', 'OMPI_ALLOW'))}\n"
        "if os.environ['PMI_RANK'] == '0':\n"
        "    r = subprocess.run(['/usr/bin/mpirun.openmpi', '-n', '1', '/usr/bin/python3', '-c',"
        " 'from mpi4py import MPI; print(\"inner\", MPI.COMM_WORLD.size, flush=True)'],"
        " env=env, stdin=subprocess.DEVNULL, timeout=60)\n"
        "    print('mpirun', r.returncode, flush=True)\n")
    r = launch(program=[PY, "-c", code], steps=[], n=2, timeout=60,
               env={"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"})
    r.clean()
    assert b"inner 1" in r.out, r.out + r.err
    assert r.rc == 0, r.text


# -- spawn info that blocks --------------------------------------------------------

def test_a_fifo_as_info_hostfile_does_not_freeze_the_launcher(launch, tmp_path):
    fifo = tmp_path / "hosts.fifo"
    os.mkfifo(fifo)
    steps = [INIT, *spawn1(seg(info=[("hostfile", str(fifo))])), FIN]
    r, unblocked = _unblocking(launch, tmp_path, [], None, lambda: str(fifo), steps=steps)
    assert not unblocked, "the launcher waited in open() of the FIFO"
    assert r.rc == 0, r.text
    assert rc_of(r.answers()[1]) != "0", r.text        # the spawn is refused, not run
    r.clean()


# -- 5. the PMI trace ---------------------------------------------------------------

def test_the_pmi_trace_of_hostile_spawns_stays_line_per_message(launch):
    odd = "\u00e9\u2603\u200f\u00a0x\\y=z"
    child = [INIT, ["v1", "cmd=put key=k value=" + "w" * 30000], FIN]
    steps = [INIT, ["v1", "cmd=put key=long value=" + odd * 3000],
             *spawn1(seg(exe=PY, args=[r_raw(), json.dumps(child)] + ["a" * 200] * 300,
                         preput=[("p", odd * 100)], info=[("odd" + "k", odd)])),
             *spawn1(seg(args=["x"] * 5000)), FIN]
    # (tagged: the spawned job's replies, on the same stdout, may come between)
    r = launch("-v", "-v", "--tag-output", steps=steps)
    r.clean()
    assert r.rc == 0, r.text
    answers = r.answers(1)
    assert answers[1] == "cmd=put_result rc=0" and answers[2] == "cmd=spawn_result rc=0"
    assert rc_of(answers[3]) == "1"
    lines = r.text.splitlines()
    assert all(line.startswith("mslaunch: ") for line in lines), \
        [line[:80] for line in lines if not line.startswith("mslaunch: ")]
    spawns = [line for line in lines if "-> cmd=spawn" in line]
    assert len(spawns) == 2 and all(len(line) < 2200 for line in spawns), spawns
    assert any(line.startswith("mslaunch: PMI: job 2: rank 0 -> cmd=put key=k") for line in lines)
    assert len(r.err) < 2_000_000


# -- 6. remote hosts ---------------------------------------------------------------


def _agents(bed, host, before=()):
    """The agent (not its watchdog) on ``host`` that was not there ``before``."""
    return [a for a in agents(bed, host, watchdogs=False) if a not in before]


def _settle(tag, bed):
    ok = wait_for(lambda: tagged_pids(tag) == [], 15) and wait_for(lambda: no_agents(bed), 15)
    left = tagged_pids(tag)
    kill_tagged(tag)
    assert ok, left


def _remote(home, raw, tag, steps, hosts, *extra, **kw):
    env = clean_env(HOME=home, MSL_TEST_TAG=tag, MSLAUNCH_HEARTBEAT=FAST_BEAT)
    return subprocess.Popen(cmd("-H", hosts, "-n", "1", "-x", "MSL_TEST_TAG", *extra, PY, raw,
                                json.dumps(steps)), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, **kw)


@pytest.mark.remote
def test_a_spawn_of_a_program_missing_on_a_remote_host_fails_in_the_parent_only(
        sshbed, home, raw):
    tag = new_tag()
    steps = [INIT, *spawn1(seg(exe="/nonexistent/prog", info=[("host", "h1")])), FIN]
    p = _remote(home, raw, tag, steps, "localhost:1,h1:1")
    try:
        try:
            out, err = p.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
        answers = [json.loads(line)[1] for line in out.decode().splitlines()
                   if line.startswith("[")]
        assert rc_of(answers[1]) == "1", out
        assert b"Traceback" not in err
        assert p.returncode == 0, err
    finally:
        p.kill()
        p.wait()
        _settle(tag, sshbed)


@pytest.mark.remote
def test_a_remote_host_with_spawned_children_lost_ends_the_launch(sshbed, home, raw):
    tag = new_tag()
    steps = [INIT, *spawn1(seg(exe="/bin/sleep", args=["60"], info=[("host", "h1")])),
             ["sleep", 60]]
    before = _agents(sshbed, "h1")      # (a hung launch before may have left one going)
    p = _remote(home, raw, tag, steps, "localhost:1,h1:1")
    try:
        line = p.stdout.readline()
        while line and b"spawn_result" not in line:
            line = p.stdout.readline()
        if b"spawn_result rc=0" not in line:
            p.kill()
            raise AssertionError((line, p.communicate()))
        [agent] = _agents(sshbed, "h1", before)
        os.kill(agent, signal.SIGKILL)
        _, err = p.communicate(timeout=30)
        assert p.returncode == 255, err
        assert b"lost host h1" in err and b"Traceback" not in err
    finally:
        p.kill()
        p.wait()
        _settle(tag, sshbed)


@pytest.mark.remote
def test_a_host_that_dies_before_answering_a_spawn_does_not_hang_the_parent(
        sshbed, home, raw, tmp_path):
    tag = new_tag()
    go = tmp_path / "go"
    steps = [JOB, INIT, ["waitfile", str(go)],
             *spawn1(seg(exe="/bin/sleep", args=["60"], info=[("host", "h1")])), ["sleep", 60]]
    before = _agents(sshbed, "h1")
    p = _remote(home, raw, tag, steps, "localhost:1,h1:1", "-v")
    agent = None
    try:
        assert b'"env"' in p.stdout.readline()
        [agent] = _agents(sshbed, "h1", before)
        os.kill(agent, signal.SIGSTOP)            # it will never answer the spawn
        go.write_text("")
        # the launcher has taken the spawn (-v says so) and asked h1's agent for it
        head = read_until(p.stderr, b"mslaunch: rank 0 spawned job 2: ")
        os.kill(agent, signal.SIGKILL)
        t0 = time.monotonic()
        _, err = p.communicate(timeout=30)
        err = head + err
        assert p.returncode == 255, err
        assert b"could not spawn: on h1: lost host h1" in err, err
        assert b"Traceback" not in err
        assert time.monotonic() - t0 < 15
    finally:
        if agent is not None:
            try:
                os.kill(agent, signal.SIGKILL)
            except OSError:
                pass
        p.kill()
        p.wait()
        _settle(tag, sshbed)
