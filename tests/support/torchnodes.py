"""Jobs of torchrun's lines run one command per node on the test bed's
namespace hosts (no SSH), whose workers train in steps from a checkpoint
(tests/programs/torch_steps.py): a job carried through a failure, a lost node
or a new one ends with the result of an uninterrupted run (:func:`expected`)."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from typing import Dict, List

from helpers import clean_env, cmd, kill_tagged, new_tag, program
from ports import spare_port
from requires import require

STEPS = program("torch_steps.py")


def torch_hosts(sshbed):
    """The bed's first four hosts, for nodes of torchrun's lines (or a skip)."""
    sshbed.require_netns("torchrun's nodes")
    import importlib.util
    require(importlib.util.find_spec("torch") is not None, "torch (pip install torch==2.13.0)")
    return sshbed.hosts[:4]


def expected(steps: int) -> str:
    return f"result {steps * (steps - 1) // 2}"


class Node:
    """One node's ``mslaunch`` (a torchrun line), its output read as it comes."""

    def __init__(self, bed, host, argv: List[str], env: Dict[str, str]) -> None:
        self.host = host
        self.proc = bed.spawn_in(host, argv, env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT)
        self.lines: List[str] = []
        self.times: List[float] = []          # when each line came (time.monotonic)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self.times.append(time.monotonic())
            self.lines.append(raw.decode(errors="replace").rstrip("\n"))

    def said(self, text: str) -> bool:
        return any(text in line for line in list(self.lines))

    def end(self, timeout: float) -> int:
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            code = -999
        self.reader.join(10)
        return code

    def text(self) -> str:
        return f"{self.host.name}: " + "\n".join(self.lines)


class Job:
    """The nodes of one job: each started with the same torchrun line."""

    def __init__(self, bed, tmp_path, nnodes: str, *extra: str, **env: str) -> None:
        self.bed, self.tag, self.port = bed, new_tag(), spare_port(2)
        self.ckpt = tmp_path / "ckpt"
        self.ckpt.mkdir()
        self.nnodes, self.extra = nnodes, extra
        self.env = clean_env(MSL_TEST_TAG=self.tag, MSLAUNCH_SECRET="elastic-job",
                             GLOO_SOCKET_IFNAME="eth0", CKPT=str(self.ckpt), **env)
        self.env.pop("OMP_NUM_THREADS", None)
        self.nodes: List[Node] = []

    def start(self, host, static: bool = False) -> Node:
        """A node on ``host``: c10d, else (``static``) the static rendezvous, its
        node rank the number of nodes started before it."""
        first = self.bed.hosts[0].addr
        how = [f"--master-addr={first}", f"--master-port={self.port}",
               f"--node-rank={len(self.nodes)}"] if static else [
            "--rdzv-backend=c10d", f"--rdzv-endpoint={first}:{self.port}", "--rdzv-id=elastic",
            f"--local-addr={host.addr}"]
        node = Node(self.bed, host, cmd(f"--nnodes={self.nnodes}", "--nproc-per-node=2", *how,
                                        *self.extra, STEPS), self.env)
        self.nodes.append(node)
        return node

    def step(self) -> int:
        try:
            with open(self.ckpt / "state.json") as f:
                return int(json.load(f)["step"])
        except (OSError, ValueError, KeyError):
            return -1

    def texts(self) -> str:
        return "\n".join(n.text() for n in self.nodes)

    def close(self) -> None:
        for node in self.nodes:
            if node.proc.poll() is None:
                node.proc.kill()
                node.proc.wait()
        kill_tagged(self.tag)


class Jobs:
    """``with Jobs(bed, tmp_path) as job_of``: ``job_of(nnodes, *options, **env)``
    makes a :class:`Job`; at the end every node is ended and every link is up."""

    def __init__(self, bed, tmp_path) -> None:
        self.bed, self.tmp_path, self.made = bed, tmp_path, []

    def __enter__(self):
        return self.make

    def make(self, nnodes: str, *extra: str, **env: str) -> Job:
        where = self.tmp_path / str(len(self.made))
        where.mkdir()
        self.made.append(Job(self.bed, where, nnodes, *extra, **env))
        return self.made[-1]

    def __exit__(self, *exc) -> None:
        for job in self.made:
            job.close()
        for host in self.bed.hosts[:4]:
            if getattr(host, "link_is_down", False):
                self.bed.link_up(host)
