"""Every command block of the README and the guides, run as printed.

What a user types is in ``sh`` fences; what a command prints is in ``text``
fences, where a line that starts with ``$ `` is the command that printed the
lines after it (a transcript).  The README, docs/index.md and docs/guides/
have no other fences, and no typed command in an output block.  Each ``sh``
block is in :data:`HOW`, keyed by its commands, which says how it runs:

``here``      as printed, one shell for the block, in a directory with the
              repository's ``scripts/`` and ``tests/programs/``, a hostfile
              ``hosts`` and a stand-in for each program a page names
              (``train.py``, ``mypkg/train.py``...);
``hosts``     the same, on the SSH test hosts (``h1`` to ``h4``; ``node1`` and
              ``node2`` are names of h1 and h2, which ``hosts`` names);
``template``  not as printed: its first line, ``# A template: ...``, says on
              the page what to put in first; a block has that line if and
              only if it is a template;
``set-up``    the README's install and test commands, run elsewhere
              (tests/system/remote/test_first_install.py and
              tests/project/test_scripts.py run the first, .ci/run the second).

A transcript's command runs here and must print the lines the page shows.  A
block added or changed fails this test until it is placed, so the pages
cannot drift from what runs.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from typing import List, NamedTuple, Tuple

import pytest
from helpers import PY, REPO, clean_env, kill_tagged, new_tag
from requires import require
from remote import settle

PAGES = ["README.md"] + sorted(
    os.path.relpath(os.path.join(d, f), REPO)
    for d, _, files in os.walk(os.path.join(REPO, "docs")) for f in files if f.endswith(".md"))
#: the pages whose fences are all ``sh`` (commands) or ``text`` (output)
TYPED = [p for p in PAGES if p in ("README.md", os.path.join("docs", "index.md"))
         or p.startswith(os.path.join("docs", "guides", ""))]
#: the first line of a block that does not run as printed, then what to put in
TEMPLATE = "# A template: "
#: a line of an output block that reads as a command typed (not "mslaunch: ...")
TYPED_COMMAND = re.compile(r"^\s*(\w+=\S*\s+)*(mslaunch|mslaunch-stacks|mslaunch-top|mpirun|"
                           r"mpiexec|torchrun|salloc|sbatch|pip|export)(\s|$)")

#: How each block of commands runs (see the module's docstring).
HOW = {
    # README.md
    "python3 -m venv .venv && . .venv/bin/activate && pip install -q '.[mpi]' && DEVICE_NUM=4 "
    "bash scripts/run_single.sh && cat scripts/log_output/1/rank.0/stdout": "set-up",
    "bash scripts/test.sh": "set-up",
    "mslaunch -n 8 python scripts/net.py\n"
    "mslaunch -n 4 --output-filename log_output --merge-stderr-to-stdout python scripts/net.py\n"
    "mslaunch -n 4 --tag-output python -c 'import os; print(os.environ[\"RANK\"])'\n"
    "mslaunch -n 1 hostname : -n 2 python -c 'import os; print(os.environ[\"RANK\"])'": "here",
    "mslaunch -n 4 -H node1:2,node2:2 python net.py\n"
    "mslaunch -n 16 --hostfile hosts --output-filename log_output -x DATA_PATH python train.py":
        "hosts",
    # docs/guides/long-jobs.md
    "mslaunch --max-restarts 3 -n 8 -H h1:4,h2:4,h3:4 python train.py": "hosts",
    "mslaunch --max-restarts 2 -n 4 -H h1:2,h2:2,h3:2 python train.py": "hosts",
    "mslaunch --max-restarts 3 --health-check 'nvidia-smi -L >/dev/null && df /scratch' -n 8 "
    "--hostfile hosts python train.py": "template",
    "export MSLAUNCH_HEARTBEAT=1,5\n"
    "mslaunch --max-restarts 3 -n 8 -H h1:4,h2:4,h3:4 python train.py": "hosts",
    # docs/guides/mpi.md
    "mslaunch -n 4 python -c \"from mpi4py import MPI; c = MPI.COMM_WORLD; "
    "print(c.allreduce(c.rank))\"": "here",
    "mpirun -n 4 python -m mslaunch.rankenv train.py": "here",
    # docs/guides/msrun.md
    "mslaunch --worker_num=8 --local_worker_num=8 --master_port=8118 --log_dir=msrun_log "
    "--join=True --cluster_time_out=300 net.py": "here",
    "mslaunch --worker_num=16 --local_worker_num=8 --master_addr=192.168.1.10 "
    "--master_port=8118 --log_dir=msrun_log --join=True net.py": "template",
    # docs/guides/openmpi-mode.md
    "mslaunch --mpi openmpi -n 4 --oversubscribe python3 train.py": "here",
    # docs/guides/remote-hosts.md
    "mslaunch -n 16 -H node1:8,node2:8 --output-filename log_output "
    "--merge-stderr-to-stdout python net.py\n"
    "mslaunch -n 16 --hostfile hosts -x DATA_PATH=$DATA_PATH -x PATH python train.py": "hosts",
    # docs/guides/rsh-agents-kubernetes.md
    "mslaunch --mca plm_rsh_agent ssh -H node1:8,node2:8 -n 16 python net.py": "hosts",
    "mslaunch --mca plm_rsh_agent 'ssh : rsh' --mca plm_rsh_args '-p 2222' ...\n"
    "mslaunch -launcher ssh -launcher-exec /usr/bin/ssh -bootstrap-exec-args "
    "'-o ConnectionAttempts=10' ...\n"
    "OMPI_MCA_plm_rsh_agent=/etc/mpi/kubexec.sh mslaunch --hostfile /etc/mpi/hostfile -np 4 "
    "python train.py": "template",
    # docs/guides/slurm.md
    "salloc -N 4 --ntasks-per-node=8 mslaunch python net.py\n"
    "mslaunch -n 32 python net.py": "template",
    "salloc -N 8 mslaunch --launcher srun -n 8 python net.py": "template",
    # docs/guides/stacks.md
    "rm -f release\n"
    "mslaunch -n 4 -H h1:2,h2:2 python tests/programs/stuck_ranks.py stuck "
    "release > job.out &\n"
    "while [ \"$(grep -c '^started' job.out)\" != 4 ] && kill -0 $!; do sleep 1; done\n"
    "mslaunch-stacks\n"
    "touch release; wait": "hosts",
    # docs/guides/torchrun.md
    "mslaunch --nproc-per-node=4 train.py --epochs 3\n"
    "mslaunch --standalone --nproc_per_node 4 -m mypkg.train\n"
    "mslaunch --nproc-per-node=2 --max-restarts=3 --log-dir=logs -r 3 -t 2 train.py": "here",
    # docs/guides/deepspeed.md
    "mslaunch --num_gpus 2 train.py --deepspeed ds_config.json\n"
    "mslaunch --hostfile hostfile --include 'h1:0,1@h2:0' --master_port 29500 train.py "
    "--deepspeed ds_config.json": "template",
    "mslaunch --nproc_per_node=2 train.py --epochs 3\n"
    "mslaunch --use_env --nproc_per_node=2 train.py --epochs 3": "template",
    "mslaunch --nnodes=2 --nproc-per-node=4 --node-rank=0 --master-addr=node1 "
    "--master-port=29500 train.py\n"
    "mslaunch --nnodes=2 --nproc-per-node=4 --node-rank=1 --master-addr=node1 "
    "--master-port=29500 train.py\n"
    "mslaunch --nnodes=2 --nproc-per-node=4 --rdzv-backend=c10d --rdzv-endpoint=node1:29400 "
    "--rdzv-id=job7 train.py": "template",
    "HEAD=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1)\n"
    "srun --ntasks-per-node=1 mslaunch --nnodes=\"$SLURM_NNODES\" --nproc-per-node=4 "
    "--rdzv-backend=c10d --rdzv-endpoint=\"$HEAD:29500\" --rdzv-id=\"$SLURM_JOB_ID\" train.py":
        "template",
    "mslaunch --nnodes=2:4 --nproc-per-node=4 --max-restarts=3 --rdzv-backend=c10d "
    "--rdzv-endpoint=node1:29400 --rdzv-id=job7 train.py": "template",
    "torchrun --nnodes=2 --node_rank=0 --nproc_per_node=4 --master_addr=node1 "
    "--master_port=29500 train.py --epochs 3": "template",
    "mslaunch -H node1:4,node2:4 python train.py --epochs 3": "hosts",
    # transcripts (docs/guides/torchrun.md)
    "mslaunch --hostfiel hosts python x.py": "here",
    "mslaunch -n 4 --nproc_per_node=4 train.py": "here",
}
STAND_IN = ("import os, sys\nrank = os.environ.get('RANK', '?')\n"
            "print('%s rank %s of %s' % (os.path.basename(sys.argv[0]), rank, "
            "os.environ.get('WORLD_SIZE')), flush=True)\n")


class Block(NamedTuple):
    page: str
    line: int          # the opening fence's
    tag: str           # sh, text, ...; "" untagged
    body: str
    closing: str       # the closing fence's line ("" when the page ends first)

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def blocks(page: str, text: str) -> List[Block]:
    """The fenced blocks of a page."""
    found: List[Block] = []
    opening, body = None, []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.lstrip().startswith("```"):
            body.append(line)
        elif opening is None:
            opening, body = (n, line.strip()[3:].strip()), []
        else:
            found.append(Block(page, opening[0], opening[1], "\n".join(body) + "\n",
                               line.strip()))
            opening = None
    if opening is not None:
        found.append(Block(page, opening[0], opening[1], "\n".join(body) + "\n", ""))
    return found


def commands(body: str) -> List[str]:
    """The commands of an ``sh`` block: continued lines joined, comments off."""
    found = []
    for line in body.replace("\\\n", " ").splitlines():
        line = re.sub(r"\s+", " ", re.sub(r"(^|\s)#.*$", "", line)).strip()
        if line:
            found.append(line)
    return found


def key(block: Block) -> str:
    return "\n".join(commands(block.body))


def transcripts(block: Block) -> List[Tuple[str, List[str]]]:
    """(command, the lines it printed) of each ``$ `` line of an output block."""
    found: List[Tuple[str, List[str]]] = []
    for line in block.body.splitlines():
        if line.startswith("$ "):
            found.append((re.sub(r"\s+", " ", line[2:]).strip(), []))
        elif found and line.strip():
            found[-1][1].append(line)
    return found


def fence_problems(page: str, text: str) -> List[str]:
    """What breaks the rule of a typed page: a fence that is neither ``sh`` nor
    ``text``, a closing fence with more on its line, a command typed into an
    output block, a template line anywhere but first in an ``sh`` block."""
    bad = []
    for b in blocks(page, text):
        if b.tag not in ("sh", "text"):
            bad.append(f"{b.where}: a fence tagged {b.tag or 'nothing'!r}: tag commands sh, "
                       f"output text")
        if b.closing != "```":
            bad.append(f"{b.where}: its closing fence is {b.closing or 'missing'!r}")
        for n, line in enumerate(b.body.splitlines()):
            if b.tag == "text" and TYPED_COMMAND.match(line):
                bad.append(f"{b.where}: a command in an output block, {line.strip()!r}: put it "
                           f"in an sh block, or as '$ command' before what it prints")
            if TEMPLATE.strip() in line and (b.tag != "sh" or n > 0):
                bad.append(f"{b.where}: {TEMPLATE.strip()!r} is the first line of an sh block")
    return bad


def mark_problems(found: List[Block], how: dict) -> List[str]:
    """Templates without their mark on the page, and marks on blocks that run."""
    bad = []
    for b in found:
        if b.tag != "sh":
            continue
        first = b.body.splitlines()[0] if b.body.strip() else ""
        marked = first.startswith(TEMPLATE) and len(first) > len(TEMPLATE) + 10
        if how.get(key(b)) == "template" and not marked:
            bad.append(f"{b.where}: a template whose first line is not "
                       f"'{TEMPLATE}what to put in'")
        if marked and how.get(key(b)) != "template":
            bad.append(f"{b.where}: marked as a template, but placed as {how.get(key(b))!r}")
    return bad


def _read(page: str) -> str:
    with open(os.path.join(REPO, page), encoding="utf-8") as f:
        return f.read()


BLOCKS = [b for page in PAGES for b in blocks(page, _read(page))]
SH = [b for b in BLOCKS if b.tag == "sh"]
TRANSCRIPTS = [(b, command, shown) for b in BLOCKS if b.tag == "text"
               for command, shown in transcripts(b)]


def test_every_fence_is_commands_or_output():
    bad = [problem for page in TYPED for problem in fence_problems(page, _read(page))]
    assert not bad, "\n".join(bad)


def test_every_block_and_transcript_is_placed():
    printed = {key(b): b.where for b in SH} | {c: b.where for b, c, _ in TRANSCRIPTS}
    unknown = {where: c for c, where in printed.items() if c not in HOW}
    assert not unknown, f"commands the pages print that this test does not know: {unknown}"
    stale = set(HOW) - set(printed)
    assert not stale, f"commands no page prints any more: {stale}"
    assert set(HOW.values()) <= {"here", "hosts", "template", "set-up"}
    assert all(HOW[c] == "here" for _, c, _ in TRANSCRIPTS)


def test_a_template_is_marked_on_its_page_and_only_a_template_is():
    bad = mark_problems(SH, HOW)
    assert not bad, "\n".join(bad)


def test_the_set_up_commands_are_the_readme_s_two():
    setup = [b for b in SH if HOW[key(b)] == "set-up"]
    assert [b.page for b in setup] == ["README.md", "README.md"], setup
    assert [b.body.strip() for b in setup] == [b.body.strip() for b in BLOCKS
                                               if b.page == "README.md" and b.tag == "sh"][:2]


def test_the_rules_find_each_kind_of_fault():
    page = ("```sh\nmslaunch -n 2 true\n```\n\n```\nuntagged\n```\n\n"
            "```text\nmslaunch: fine\n$ mslaunch -n 2 false\nmslaunch: told\n"
            "mslaunch -n 2 typed here\n```\n\n"
            "```sh\n# A template: put your hosts for h1, h2\nmslaunch -H h1,h2 true\n```\n\n"
            "```sh\nmslaunch -H h1 true\n```\n\n"
            "```console\n$ x\n``` text after\n")
    assert fence_problems("p.md", page) == [
        "p.md:5: a fence tagged 'nothing': tag commands sh, output text",
        "p.md:9: a command in an output block, 'mslaunch -n 2 typed here': put it in an sh "
        "block, or as '$ command' before what it prints",
        "p.md:25: a fence tagged 'console': tag commands sh, output text",
        "p.md:25: its closing fence is '``` text after'"]
    found = blocks("p.md", page)
    assert transcripts(found[2]) == [("mslaunch -n 2 false", ["mslaunch: told",
                                                              "mslaunch -n 2 typed here"])]
    how = {"mslaunch -n 2 true": "here", "mslaunch -H h1,h2 true": "template",
           "mslaunch -H h1 true": "template"}
    assert mark_problems(found, how) == [
        "p.md:21: a template whose first line is not '# A template: what to put in'"]
    how["mslaunch -H h1,h2 true"] = "hosts"
    assert mark_problems(found[:4], how) == [
        "p.md:16: marked as a template, but placed as 'hosts'"]


@pytest.fixture
def workdir(tmp_path):
    """A directory as a user's: the repository's scripts/ and tests/programs/, stand-in
    programs, a hostfile, and bin/ with mslaunch's commands for this Python."""
    work = tmp_path / "work"
    shutil.copytree(os.path.join(REPO, "scripts"), work / "scripts")
    shutil.copytree(os.path.join(REPO, "tests", "programs"), work / "tests" / "programs")
    shutil.copy(os.path.join(REPO, "scripts", "net.py"), work / "net.py")
    (work / "train.py").write_text(STAND_IN)
    (work / "mypkg").mkdir()
    (work / "mypkg" / "__init__.py").write_text("")
    (work / "mypkg" / "train.py").write_text(STAND_IN)
    (work / "hosts").write_text("node1 slots=8\nnode2 slots=8\n")
    (work / "bin").mkdir()
    # The pages' `mpirun` is the user's MPI: here Hydra's, always.  The venv's own
    # bin/mpirun is whichever MPI wheel pip installed last (Open MPI 5's prterun
    # refuses root).
    hydra = os.path.join(os.path.dirname(PY), "mpiexec.hydra")
    require(os.access(hydra, os.X_OK), "the mpich wheel's mpiexec.hydra beside this Python")
    (work / "bin" / "mpirun").write_text(f'#!/bin/sh\nexec "{hydra}" "$@"\n')
    (work / "bin" / "mpirun").chmod(0o755)
    for name in ("mslaunch", "mslaunch-stacks", "mslaunch-top"):
        with open(os.path.join(REPO, "scripts", name)) as f:
            script = f.read().split("\n", 1)[1]
        (work / "bin" / name).write_text(f"#!{PY}\n{script}")
        (work / "bin" / name).chmod(0o755)
    return work


def _run(block: Block, cwd, env, timeout: float = 180) -> subprocess.CompletedProcess:
    """The block as printed, in one shell that stops at the first failing command; a
    session of its own, so that mslaunch-stacks finds this block's job."""
    return subprocess.run(["sh", "-ec", block.body], cwd=str(cwd), env=env,
                          capture_output=True, timeout=timeout, start_new_session=True)


def _user_env(work, **extra: str):
    env = clean_env(DATA_PATH="/data/set", **extra)
    # mslaunch's commands, then the user's python
    env["PATH"] = f"{work}/bin:{os.path.dirname(PY)}:{env['PATH']}"
    return env


def _placed(how: str):
    return [pytest.param(b, id=b.where) for b in SH if HOW.get(key(b)) == how]


@pytest.mark.parametrize("block", _placed("here"))
def test_a_printed_block_runs_here(block, workdir):
    tag = new_tag()
    try:
        r = _run(block, workdir, _user_env(workdir, MSL_TEST_TAG=tag))
    finally:
        kill_tagged(tag)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:])
    assert b"Traceback" not in r.stderr, r.stderr[-2000:]


@pytest.mark.parametrize("block, command, shown",
                         [pytest.param(b, c, s, id=f"{b.where}:{c}") for b, c, s in TRANSCRIPTS])
def test_a_transcript_prints_what_the_page_shows(block, command, shown, workdir):
    tag = new_tag()
    try:
        r = subprocess.run(["sh", "-c", command], cwd=str(workdir), capture_output=True,
                           env=_user_env(workdir, MSL_TEST_TAG=tag), timeout=60)
    finally:
        kill_tagged(tag)
    said = (r.stdout + r.stderr).decode().splitlines()
    assert [line for line in shown if line not in said] == [], said


@pytest.mark.remote
@pytest.mark.parametrize("block", _placed("hosts"))
def test_a_printed_block_runs_on_the_test_hosts(block, workdir, sshbed, tmp_path):
    aliases = "".join(f"Host node{i}\n  HostName {sshbed.host(f'h{i}').addr}\n"
                      f"  Port {sshbed.host(f'h{i}').port}\n" for i in (1, 2))
    home = sshbed.make_home(tmp_path / "home", user_config_extra=aliases)
    tag = new_tag()
    env = _user_env(workdir, HOME=home, MSL_TEST_TAG=tag, UCX_TLS="tcp")
    env["PATH"] = f"{home}/bin:{env['PATH']}"       # the OpenSSH client with this home's config
    try:
        r = _run(block, workdir, env)
        settle(tag, sshbed)
    finally:
        kill_tagged(tag)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:])
    assert b"Traceback" not in r.stderr, r.stderr[-2000:]
