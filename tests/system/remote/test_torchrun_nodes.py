"""A torchrun line run on each of two nodes (the test bed's namespace hosts, no
SSH), side by side with torch's own torchrun on the same lines: one job of
every node's workers, with the variables torchrun gives them; the first failure
on any node ends both, named on both; bad lines are one error line."""

from __future__ import annotations

import json
import subprocess

import pytest

from helpers import (PY, StderrLines, all_gone, clean_env, cmd, end_all, kill_tagged, new_tag,
                     wait_for)
from ports import spare_port
from requires import require
from torchenv import ENV, compare, workers

pytestmark = pytest.mark.remote

ALLREDUCE = """
import os, sys, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([dist.get_rank() + 1])
dist.all_reduce(t)
print("rank", os.environ["RANK"], "sum", int(t), flush=True)
fail = sys.argv[1:] and sys.argv[1] == os.environ["RANK"]
dist.destroy_process_group()
sys.exit(7 if fail else 0)
"""


@pytest.fixture
def nodes(sshbed):
    sshbed.require_netns("torchrun's nodes")
    import importlib.util
    require(importlib.util.find_spec("torch") is not None, "torch (pip install torch==2.13.0)")
    return sshbed.hosts[:2]


def _env(tag: str, **extra: str):
    # gloo's peers offer the address of the name their host calls itself, which
    # the namespace hosts do not resolve: they name their interface instead
    env = clean_env(MSL_TEST_TAG=tag, MSLAUNCH_SECRET="torch-job", GLOO_SOCKET_IFNAME="eth0")
    env.update(extra)
    env.pop("OMP_NUM_THREADS", None)
    return env


def _both(bed, launcher, per_node, tag: str, timeout: float = 180, env_for=None):
    """Run ``launcher + per_node(i)`` on h1 and h2 at once; their (status, output)."""
    procs = []
    for i, host in enumerate(bed.hosts[:2]):
        procs.append(bed.spawn_in(host, [*launcher, *per_node(i)],
                                  env=_env(tag, **(env_for(i) if env_for else {})),
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    out = []
    try:
        for p in procs:
            text, _ = p.communicate(timeout=timeout)
            out.append((p.returncode, text.decode(errors="replace")))
    finally:
        end_all(procs, tag)
    return out


MSLAUNCH = cmd()
TORCHRUN = [PY, "-m", "torch.distributed.run"]


def _line(kind: str, nodes, port: int):
    h1 = nodes[0]
    if kind == "static":
        return lambda i: ["--nnodes=2", "--nproc-per-node=2", f"--node-rank={i}",
                          f"--master-addr={h1.addr}", f"--master-port={port}"]
    # (--local-addr: torchrun names the master by its host's name otherwise,
    # which the namespace hosts do not resolve; mslaunch by the endpoint's.)
    # The endpoint is on h2, whose node mostly comes first: the node ranks must
    # still follow the addresses, h1's first, as under torchrun.
    return lambda i: ["--nnodes=2", "--nproc-per-node=2", "--rdzv-backend=c10d",
                      f"--rdzv-endpoint={nodes[1].addr}:{port}", "--rdzv-id=job7",
                      f"--local-addr={nodes[i].addr}"]


@pytest.mark.timeout(600)         # three pairs of jobs of torch ranks, torchrun's and ours
@pytest.mark.parametrize("kind", ["static", "c10d"])
def test_the_nodes_form_one_job_as_torchrun_s_do(sshbed, nodes, tmp_path, kind):
    script = tmp_path / "allreduce.py"
    script.write_text(ALLREDUCE)
    tag = new_tag()
    line = _line(kind, nodes, _port())
    ours = _both(sshbed, MSLAUNCH, lambda i: [*line(i), str(script)], tag)
    assert [code for code, _ in ours] == [0, 0], ours
    said = sorted(x for _, text in ours for x in text.splitlines() if x.startswith("rank"))
    assert said == [f"rank {r} sum 10" for r in range(4)], ours
    assert all_gone(tag, 15)
    # each node's workers get what torchrun's agent gives them on the same line
    dirs = {}
    for who, launcher in (("t", TORCHRUN), ("m", MSLAUNCH)):
        for i in (0, 1):
            dirs[who, i] = tmp_path / f"{who}{i}"
            dirs[who, i].mkdir()
        tag = new_tag()
        line = _line(kind, nodes, _port())
        done = _both(sshbed, launcher, lambda i: [*line(i), ENV], tag,
                     env_for=lambda i: {"TORCH_ENV_DIR": str(dirs[who, i])})
        assert [code for code, _ in done] == [0, 0], done
        assert all_gone(tag, 15)
    parent = _env("x", TORCH_ENV_DIR="x")
    for i in (0, 1):
        pairs = list(zip(workers(dirs["t", i]), workers(dirs["m", i])))
        assert len(pairs) == 2
        for theirs, mine in pairs:
            theirs["env"].pop("TORCH_ENV_DIR"), mine["env"].pop("TORCH_ENV_DIR")
            theirs["env"].pop("MSL_TEST_TAG"), mine["env"].pop("MSL_TEST_TAG")
            compare(theirs, mine, parent)
            assert mine["env"]["GROUP_RANK"] == str(i) and mine["env"]["WORLD_SIZE"] == "4"


def _port() -> int:
    return spare_port(2)


def test_the_first_failure_ends_both_nodes_named_on_both(sshbed, nodes, tmp_path):
    script = tmp_path / "allreduce.py"
    script.write_text(ALLREDUCE)
    tag = new_tag()
    line = _line("static", nodes, _port())
    done = _both(sshbed, MSLAUNCH, lambda i: [*line(i), str(script), "2"], tag)
    assert [code for code, _ in done] == [7, 7], done
    for _, text in done:
        assert "rank 2 (pid " in text and "exited with code 7" in text, text
    assert all_gone(tag, 15)


def test_a_rank_that_raises_under_record_is_named_with_its_error_on_every_node(sshbed, nodes,
                                                                              tmp_path):
    tag = new_tag()
    line = _line("static", nodes, _port())
    files = [tmp_path / f"node{i}.json" for i in (0, 1)]
    done = _both(sshbed, MSLAUNCH, lambda i: [*line(i), ENV, "--fail", "2"], tag,
                 env_for=lambda i: {"TORCHELASTIC_ERROR_FILE": str(files[i])})
    assert [code for code, _ in done] == [1, 1], done
    for _, text in done:
        assert "rank 2 (pid " in text and "ValueError: boom from rank 2" in text, text
    # its own node shows the traceback the rank's error file holds
    failing = done[1][1]
    assert "rank 2's error file (" in failing and 'raise ValueError(f"boom' in failing, failing
    # and its launcher's own error file is that file, as torchrun's agent writes it
    said = json.loads(files[1].read_text())["message"]
    assert said["message"] == "ValueError: boom from rank 2" and said["errorCode"] == 1, said
    assert not files[0].exists()
    assert all_gone(tag, 15)


@pytest.mark.parametrize("line, message", [
    (["--nnodes=1:2", "--nproc-per-node=1"], "elastic membership needs --rdzv-backend=c10d"),
    (["--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d", "--rdzv-endpoint=h1",
      "--rdzv-conf=last_call_timeout=0"], "last_call_timeout=0: expected seconds above 0"),
    (["--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d"], "needs --rdzv-endpoint"),
    (["--nnodes=2", "--nproc-per-node=1", "--node-rank=2"], "--node-rank=2: expected a whole "
                                                             "number from 0 to 1"),
])
def test_a_bad_line_for_several_nodes_is_one_error_line(line, message):
    from helpers import one_error_line, run
    r = run(*line, ENV)
    assert r.returncode == 2 and message in one_error_line(r.stderr), r.stderr


HANG = """
import os, time
def waiting_here():
    print("up", os.environ["RANK"], flush=True)
    time.sleep(300)
waiting_here()
"""


def test_mslaunch_stacks_on_one_node_shows_every_node_s_workers(sshbed, nodes, tmp_path):
    import json
    script = tmp_path / "hang.py"
    script.write_text(HANG)
    tag = new_tag()
    line = _line("static", nodes, _port())
    procs = [sshbed.spawn_in(host, [*MSLAUNCH, *line(i), str(script)], env=_env(tag),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for i, host in enumerate(nodes[:2])]
    try:
        for p in procs:
            said = [p.stdout.readline() for _ in range(3)]    # OMP's warning, two workers
            assert sum(u.startswith(b"up ") for u in said) == 2, said
        for asked in procs:            # either node's launcher, by its pid
            looked = subprocess.run([PY, "-c", "import sys; from mslaunch.cli.stacks import "
                                     "main; sys.exit(main())", str(asked.pid), "--json"],
                                    capture_output=True, env=_env(tag), timeout=60)
            assert looked.returncode == 0, looked.stderr
            report = json.loads(looked.stdout)
            ranks = {r["rank"]: r for r in report["ranks"]}
            assert sorted(ranks) == [0, 1, 2, 3], report
            assert {r["host"] for r in ranks.values()} == {"h1", "h2"}, report
            assert all(any("waiting_here" in f for t in r["threads"] for f in t)
                       for r in ranks.values()), report
            assert "of 4 running rank(s) on 2 host(s)" in report["title"], report["title"]
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.communicate()
        kill_tagged(tag)
    assert all_gone(tag, 15)


@pytest.mark.parametrize("fault", ["same node rank", "wrong secret"])
def test_a_node_the_job_cannot_take_is_refused_in_one_line(sshbed, nodes, tmp_path, fault):
    # the second node is refused; the first waits out its join timeout (5 s here)
    # and ends naming what came and what was refused
    tag = new_tag()
    port = _port()
    line = _line("static", nodes, port)

    def per_node(i: int):
        words = [*line(i), "--rdzv-conf=join_timeout=5", ENV]
        return [w.replace("--node-rank=1", "--node-rank=0") if fault == "same node rank" else w
                for w in words]
    done = _both(sshbed, MSLAUNCH, per_node, tag, env_for=lambda i: {
        "MSLAUNCH_SECRET": "another job" if fault == "wrong secret" and i == 1
        else "torch-job"})
    assert [code for code, _ in done] == [1, 1], done
    # the node refused is the second for another secret; for the same rank,
    # whichever came second
    refused = 1 if fault == "wrong secret" else next(
        i for i, (_, text) in enumerate(done) if "mslaunch: error: the node service refused"
        in text)
    took, said_refused, said_took = 1 - refused, done[refused][1], done[1 - refused][1]
    errors = [x for x in said_refused.splitlines() if x.startswith("mslaunch: error:")]
    assert len(errors) == 1, said_refused
    assert (f"--node-rank=0: rank 0 belongs to node h{took + 1}" in errors[0]
            if fault == "same node rank" else "secret" in errors[0]), errors
    assert "cluster time out" in said_took and "refused" in said_took, said_took
    assert f"(nodes: h{took + 1} (pid " in said_took, said_took
    assert all_gone(tag, 15)


def test_the_master_node_refused_keeps_its_service_for_the_nodes_it_took(sshbed, nodes,
                                                                        tmp_path):
    # The master's own node is refused when another node came first with its
    # node rank.  Forced here: h1's connections to its own node service fail
    # until the service (LOGLEVEL=INFO) says h2 came as node 0; then h1's node
    # joins, and is refused.  The service stays up on h1 for the nodes it took,
    # and h3 completes the job with h2.
    script = tmp_path / "rank.py"
    script.write_text("import os\nprint('rank', os.environ['RANK'], flush=True)\n")
    tag = new_tag()
    port = _port()
    line = _line("static", nodes, port)
    h1, h2, h3 = sshbed.hosts[:3]

    def start(host, rank: int, **popen):
        words = [f"--node-rank={rank}" if w.startswith("--node-rank=") else w
                 for w in line(0)]
        return sshbed.spawn_in(host, [*MSLAUNCH, *words, "--rdzv-conf=join_timeout=120",
                                      str(script)], env=_env(tag, LOGLEVEL="INFO"), **popen)
    procs = []
    try:
        with sshbed.refusing_own(h1, port + 1):      # (the node service's port)
            procs.append(start(h1, 0, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
            master = StderrLines(procs[0])
            procs.append(start(h2, 0, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
            assert wait_for(lambda: master.said("waits for every node: 2 of 4 workers came"),
                            60), master.lines
        procs.append(start(h3, 1, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
        outs = [p.communicate(timeout=120)[0].decode(errors="replace") for p in procs[1:]]
        assert procs[0].wait(timeout=60) == 1, master.text()
    finally:
        end_all(procs, tag)
    said = master.text()
    assert [p.returncode for p in procs] == [1, 0, 0], (said, outs)
    errors = [x for x in said.splitlines() if x.startswith("mslaunch: error:")]
    assert len(errors) == 1 and "--node-rank=0: rank 0 belongs to node h2" in errors[0], said
    ranks = sorted(x for out in outs for x in out.splitlines() if x.startswith("rank "))
    assert ranks == ["rank 0", "rank 1", "rank 2", "rank 3"], outs
    assert all_gone(tag, 15)


def test_a_stall_with_stall_exit_ends_every_node(sshbed, nodes, tmp_path):
    script = tmp_path / "hang.py"
    script.write_text(HANG)
    tag = new_tag()
    line = _line("static", nodes, _port())
    done = _both(sshbed, MSLAUNCH, lambda i: [*line(i), "--stall-report=2", "--stall-exit",
                                              str(script)], tag)
    assert [code for code, _ in done] == [111, 111], done
    assert any("waiting_here" in text for _, text in done), done
    assert all("stalled" in text for _, text in done), done
    assert all_gone(tag, 15)


def test_a_static_node_starts_no_worker_before_every_node_came(sshbed, nodes, tmp_path):
    # torchrun's static rendezvous starts a node's workers once every node is
    # there: node 0 alone (node 1 never comes) starts none, and ends at the join
    # timeout with one line, where its workers used to start at once and wait.
    script = tmp_path / "worker.py"
    script.write_text("import os, sys\n"
                      "open(os.path.join(sys.argv[1], 'started.' + os.environ['RANK']), 'w')\n")
    tag = new_tag()
    h1 = nodes[0]
    p = sshbed.spawn_in(h1, [*MSLAUNCH, "--nnodes=2", "--nproc-per-node=2", "--node-rank=0",
                             f"--master-addr={h1.addr}", f"--master-port={_port()}",
                             "--rdzv-conf=join_timeout=3", str(script), str(tmp_path)],
                        env=_env(tag), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        text = p.communicate(timeout=120)[0].decode(errors="replace")
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        kill_tagged(tag)
    assert p.returncode == 1, text
    assert list(tmp_path.glob("started.*")) == [], text
    assert "cluster time out: only 2 of 4 workers joined" in text, text
    assert all_gone(tag, 15)
