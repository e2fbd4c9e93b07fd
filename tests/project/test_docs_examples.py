"""Every mslaunch command the README and the docs print, run as printed.

The fenced ``sh`` examples are read from the pages; each command that starts
mslaunch must be in :data:`HOW`, which says where it runs: here (in a
directory with the repository's ``scripts/`` and a stand-in for each program a
page names, such as ``train.py``), on the SSH test hosts (``node1`` and
``node2`` are names of ``h1`` and ``h2`` in the test's ssh config, and the
``hosts`` file names them), or not here, with the reason.  A command added to
the docs, or changed, fails this test until it is placed, so the docs cannot
drift from what runs.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest
from helpers import PY, REPO, clean_env, kill_tagged, new_tag
from remote import settle

PAGES = ["README.md"] + sorted(
    os.path.relpath(os.path.join(d, f), REPO)
    for d, _, files in os.walk(os.path.join(REPO, "docs")) for f in files if f.endswith(".md"))
FENCE = re.compile(r"^```sh\n(.*?)^```", re.M | re.S)
#: How each printed command runs: "here", "hosts" (the SSH test hosts), or why not.
HOW = {
    "mslaunch -n 8 python scripts/net.py": "here",
    "mslaunch -n 4 --output-filename log_output --merge-stderr-to-stdout python scripts/net.py":
        "here",
    "mslaunch -n 4 --tag-output python -c 'import os; print(os.environ[\"RANK\"])'": "here",
    "mslaunch -n 1 hostname : -n 2 python -c 'import os; print(os.environ[\"RANK\"])'": "here",
    "mslaunch -n 4 -H node1:2,node2:2 python net.py": "hosts",
    "mslaunch -n 16 --hostfile hosts --output-filename log_output -x DATA_PATH python train.py":
        "hosts",
    "mslaunch --max-restarts 3 -n 8 -H h1:4,h2:4,h3:4 python train.py": "hosts",
    "mslaunch --max-restarts 2 -n 4 -H h1:2,h2:2,h3:2 python train.py": "hosts",
    "mslaunch --max-restarts 3 --health-check 'nvidia-smi -L >/dev/null && df /scratch' -n 8 "
    "--hostfile hosts python train.py": "a GPU host's check (nvidia-smi); the health check "
                                        "is tested in tests/system/local/test_restarts.py",
    "mslaunch -n 4 python -c \"from mpi4py import MPI; c = MPI.COMM_WORLD; "
    "print(c.allreduce(c.rank))\"": "here",
    "mslaunch --worker_num=8 --local_worker_num=8 --master_port=8118 --log_dir=msrun_log "
    "--join=True --cluster_time_out=300 net.py": "here",
    "mslaunch --worker_num=16 --local_worker_num=8 --master_addr=192.168.1.10 "
    "--master_port=8118 --log_dir=msrun_log --join=True net.py":
        "two machines at a given address; msrun mode's nodes are tested in "
        "tests/system/msrun/test_msrun_nodes.py",
    "mslaunch --mpi openmpi -n 4 --oversubscribe python3 train.py": "here",
    "mslaunch -n 16 -H node1:8,node2:8 --output-filename log_output "
    "--merge-stderr-to-stdout python net.py": "hosts",
    "mslaunch -n 16 --hostfile hosts -x DATA_PATH=$DATA_PATH -x PATH python train.py": "hosts",
    "mslaunch --mca plm_rsh_agent ssh -H node1:8,node2:8 -n 16 python net.py": "hosts",
    "mslaunch --mca plm_rsh_agent 'ssh : rsh' --mca plm_rsh_args '-p 2222' ...":
        "a sketch ('...'): rsh agents are tested in tests/system/remote/test_rsh.py",
    "mslaunch -launcher ssh -launcher-exec /usr/bin/ssh -bootstrap-exec-args "
    "'-o ConnectionAttempts=10' ...": "a sketch ('...'): tested in tests/system/remote/test_rsh.py",
    "OMPI_MCA_plm_rsh_agent=/etc/mpi/kubexec.sh mslaunch --hostfile /etc/mpi/hostfile -np 4 "
    "python train.py": "Kubernetes' MPI Operator; its stand-in runs in tests/system/remote/test_rsh.py",
    "salloc -N 4 --ntasks-per-node=8 mslaunch python net.py":
        "a Slurm allocation of 4 nodes; Slurm is tested in tests/system/slurm/test_slurm.py",
    "mslaunch -n 32 python net.py": "inside an sbatch script (32 slots of an allocation); "
                                    "tested in tests/system/slurm/test_slurm.py",
    "salloc -N 8 mslaunch --launcher srun -n 8 python net.py":
        "a Slurm allocation of 8 nodes; --launcher srun is tested in tests/system/slurm/test_srun_ranks.py",
    "mslaunch -H node1:4,node2:4 python train.py --epochs 3": "hosts",
    "mslaunch --nproc-per-node=4 train.py --epochs 3": "here",
    "mslaunch --standalone --nproc_per_node 4 -m mypkg.train": "here",
    "mslaunch --nproc-per-node=2 --max-restarts=3 --log-dir=logs -r 3 -t 2 train.py": "here",
}
STAND_IN = ("import os, sys\nrank = os.environ.get('RANK', '?')\n"
            "print('%s rank %s of %s' % (os.path.basename(sys.argv[0]), rank, "
            "os.environ.get('WORLD_SIZE')), flush=True)\n")


def commands(text: str):
    """The commands of a page's ``sh`` fences: continued lines joined, comments off."""
    for block in FENCE.findall(text):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+#.*$", "", re.sub(r"^\s*#.*$", "", line)).strip()
            line = re.sub(r"\s+", " ", line)
            if line:
                yield line


def printed():
    """(page, command) of every command that starts mslaunch."""
    found = []
    for page in PAGES:
        with open(os.path.join(REPO, page), encoding="utf-8") as f:
            text = f.read()
        for command in commands(text):
            words = command.split()
            if "mslaunch" in words and not command.startswith(("pip ", "python3 -m venv")):
                found.append((page, command))
    return found


PRINTED = printed()


def test_every_printed_command_is_placed():
    unknown = [(page, c) for page, c in PRINTED if c not in HOW]
    assert not unknown, f"commands the docs print that this test does not know: {unknown}"
    stale = set(HOW) - {c for _, c in PRINTED}
    assert not stale, f"commands no page prints any more: {stale}"


@pytest.fixture
def workdir(tmp_path):
    """A directory as a user's: the repository's scripts/, stand-in programs, a hostfile."""
    work = tmp_path / "work"
    shutil.copytree(os.path.join(REPO, "scripts"), work / "scripts")
    shutil.copy(os.path.join(REPO, "scripts", "net.py"), work / "net.py")
    for name in ("train.py", "server.py", "worker.py"):
        (work / name).write_text(STAND_IN)
    (work / "mypkg").mkdir()
    (work / "mypkg" / "__init__.py").write_text("")
    (work / "mypkg" / "train.py").write_text(STAND_IN)
    (work / "hosts").write_text("node1 slots=8\nnode2 slots=8\n")
    return work


def _run(command: str, cwd, env, timeout: float = 180):
    return subprocess.run(["sh", "-c", command.replace("mslaunch", f"{PY} -m mslaunch", 1)],
                          cwd=str(cwd), env=env, capture_output=True, timeout=timeout)


def _user_env(**extra: str):
    env = clean_env(DATA_PATH="/data/set", **extra)
    env["PATH"] = f"{os.path.dirname(PY)}:{env['PATH']}"     # the user's python first
    return env


@pytest.mark.parametrize("command", sorted(c for c, how in HOW.items() if how == "here"))
def test_a_printed_command_runs_here(command, workdir):
    tag = new_tag()
    try:
        r = _run(command, workdir, _user_env(MSL_TEST_TAG=tag))
    finally:
        kill_tagged(tag)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:])
    assert b"Traceback" not in r.stderr, r.stderr[-2000:]


@pytest.mark.remote
@pytest.mark.parametrize("command", sorted(c for c, how in HOW.items() if how == "hosts"))
def test_a_printed_command_runs_on_the_test_hosts(command, workdir, sshbed, tmp_path):
    aliases = "".join(f"Host node{i}\n  HostName {sshbed.host(f'h{i}').addr}\n"
                      f"  Port {sshbed.host(f'h{i}').port}\n" for i in (1, 2))
    home = sshbed.make_home(tmp_path / "home", user_config_extra=aliases)
    tag = new_tag()
    env = _user_env(HOME=home, MSL_TEST_TAG=tag, UCX_TLS="tcp")
    env["PATH"] = f"{home}/bin:{env['PATH']}"       # the OpenSSH client with this home's config
    try:
        r = _run(command, workdir, env)
        settle(tag, sshbed)
    finally:
        kill_tagged(tag)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:])
    assert b"Traceback" not in r.stderr, r.stderr[-2000:]
