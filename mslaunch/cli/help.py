"""``mslaunch --help``: one screen naming every dialect and the common options;
``--help all``: every option of every dialect, grouped by topic; ``--help TOPIC``:
one of them.

The mpirun dialect's part is made from the option records of :mod:`.options`:
each record's ``help`` is ``"LEFT\\tRIGHT"`` (the spellings, then what they do,
from column 28) or a whole line; a newline in it continues at column 28.
A topic is a section's name, or the name Open MPI 4's ``mpirun --help TOPIC``
gives it (``mapping``, ``binding``, ``output``, ``launch``...).
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, Optional, Tuple

_HEAD = """\
usage: mslaunch [options] program [args...] [: [options] program2 [args...]]
       mslaunch --worker_num=N --local_worker_num=M [msrun options] script [args...]

A drop-in for mpirun (Open MPI 4/5 and MPICH Hydra spellings; one or two dashes)
and for MindSpore's msrun (its --flag=value options; see "msrun dialect" below).
Every option of Open MPI 4.1.4's `mpirun --help all` is implemented, accepted
with a note (-v shows it), or refused with a hint.
A program that is a script without its execute bit runs with its interpreter:
its '#!' line's, or the python of PATH for a .py file -- as msrun and torchrun
run a script (mpirun would refuse it, and nothing else can be meant).

"""

_SHORT = """\
usage: mslaunch [options] program [args...] [: [options] program2 [args...]]
       mslaunch [torchrun's options] script [args...]
       mslaunch [DeepSpeed's launcher's options] script [args...]
       mslaunch --worker_num=N --local_worker_num=M [msrun's options] script

A drop-in for mpirun (Open MPI 4/5, MPICH Hydra), torchrun (and
torch.distributed.launch), DeepSpeed's launcher and MindSpore's msrun: replace
the launcher's name by mslaunch. A line is read in the dialect of its options.

common options (mpirun's dialect; one or two dashes):
  -n, -np N                number of ranks (none: one per slot)
  -H, --host H1:N,H2:M     hosts and their slots (SSH; none: this machine, or
                           the Slurm, PBS, Grid Engine or LSF allocation)
  --hostfile, -f FILE      hosts from a file (Open MPI's or Hydra's lines)
  -N, -ppn N               ranks per host
  -x NAME[=VALUE]          set or pass on a variable to the ranks
  --map-by, --bind-to      placement and binding (see --help mapping)
  --output-filename DIR    each rank's output also in DIR/1/rank.N/
  --tag-output             [job,rank]<stream>: before each line
  --timeout SECONDS        stop the job after SECONDS (exit 110)
  --max-restarts N         start the job again after a failure, N times at most
  --report-json FILE       the job's report, rank by rank, as JSON
  -v, -q, -V               more messages, fewer, the version
torchrun's:  --nproc-per-node N, --nnodes, --standalone, --max-restarts ...
DeepSpeed's: --num_gpus N, --hostfile FILE, --include h1:0,1@h2, ...
msrun's:     --worker_num N, --local_worker_num N, --master_addr, --join ...

"""

#: lines of a section that belong to no option: (before its options, after them)
_PROSE: Dict[str, Tuple[str, str]] = {
    "Size and hosts": ("", "(no hosts: a Slurm or PBS allocation, else this machine, "
                           "which runs what -n asks)"),
    "Other": ("--\tend of options: the next word is the program", ""),
}

_MSRUN = """\
msrun dialect (MindSpore's msrun command lines; --name=value or --name value):
  --worker_num N           workers of the whole job (default 8)
  --local_worker_num N     workers on this node (default 8)
  --master_addr ADDR       the master node (default 127.0.0.1); it runs the scheduler
  --master_port N          the scheduler's port (default 8118)
  --node_rank N            this node's rank: its workers are N*local+i (default -1:
                           ranks in the order nodes join)
  --log_dir DIR            scheduler.log and worker_<rank>.log go here (default .)
  --join True|False        wait for the job (default False: return at once and
                           leave a supervisor, see --wait_job / --stop_job)
  --cluster_time_out S     seconds for every worker to join (default 600; <0: for ever)
  --bind_core True|False|MAP   pin workers to CPUs: equal blocks, or
                           '{"device0":["0-3"],"scheduler":["4"]}'
  --bind_numa True|False|MAP|FILE.json   pin workers to NUMA nodes' CPUs (the file: CPUs and memory)
  --sim_level N, --sim_rank_id N, --rank_table_file FILE
  --worker_log_name NAME   log name pattern ({ip}, {hostname} replaced)
  --tail_worker_log IDS    which workers' output --join=True shows (default all)
 mslaunch's own, in this dialect:
  --node_service_port N    the node service of a multi-node job (default master_port+1)
  --secret_file FILE       the job's secret (default: $MSLAUNCH_SECRET, else
                           ~/.mslaunch/secret, made on first use)
  --tls_config FILE        TLS for the node service (msrun's config.json fields)
  --max_restarts N         restarts per worker with MS_ENABLE_RECOVERY=1 (default 3)
  --grace SECONDS          SIGTERM-to-SIGKILL delay (default 5)
  --wait_job=DIR, --stop_job=DIR   wait for / stop the --join=False job of DIR
  --verbose, --quiet       more / fewer messages
  --report_json FILE       the job's report (JSON) at its end, as --report-json
  --no-pty                 no pseudo-terminal for the processes (the default here,
                           as under msrun; MSLAUNCH_PTY=1 gives them one)
"""

_EXAMPLES = """\
examples:
  mslaunch -n 4 python train.py             4 ranks on this machine
  mslaunch -n 2 hello.py                    a .py script runs with python
  mslaunch -H node1:4,node2:4 python x.py   8 ranks on two hosts over SSH
  mslaunch --hostfile hosts -N 2 ./a.out    2 ranks per host of a hostfile
  mslaunch --mca orte_abort_on_non_zero_status 0 --report-json job.json \\
      -n 4 ./a.out                          go on when a rank fails; a report
  mslaunch --nproc-per-node=4 train.py      torchrun's line
  mslaunch --num_gpus 4 train.py            DeepSpeed's line
  mslaunch --worker_num=8 --local_worker_num=8 --join=True net.py    msrun's
"""

_DOCS = """\
More: mslaunch --help TOPIC, one of:
  {topics}.
Documentation: man mslaunch; README.md and docs/ in mslaunch's source: every
option and MCA parameter (docs/reference/), torchrun and DeepSpeed users
(docs/guides/torchrun.md, deepspeed.md), the job report
(docs/reference/job-report.md), Python use (docs/reference/python-api.md).
"""

#: topic -> the title of its section in :data:`.options.SECTIONS`, or a text of its own
#: (Open MPI 4's names for its own help topics too)
TOPICS: Dict[str, str] = {
    "hosts": "Size and hosts", "size": "Size and hosts", "launch": "Size and hosts",
    "mapping": "Placement and binding", "placement": "Placement and binding",
    "binding": "Placement and binding", "ranking": "Placement and binding",
    "environment": "Environment and working directory", "env": "Environment and "
    "working directory", "tuning": "Environment and working directory",
    "mca": "Environment and working directory",
    "output": "Output", "input": "Output",
    "lifecycle": "Lifecycle", "failures": "Lifecycle", "debug": "Lifecycle",
    "fault-tolerance": "Lifecycle",
    "remote": "Remote hosts", "ssh": "Remote hosts",
    "other": "Other",
    "msrun": "msrun", "torchrun": "torchrun", "deepspeed": "deepspeed",
    "examples": "examples",
    "all": "all", "general": "all",
}

_INDENT = " " * 27


def _entry(text: str) -> str:
    """One option's help lines."""
    left, tab, right = text.partition("\t")
    first, *more = (right if tab else text).split("\n")
    if not tab:
        head = f"  {first}\n"
    elif len(left) < len(_INDENT) - 2:
        head = f"  {left:<24} {first}\n"
    else:
        head = f"  {left}\n{_INDENT}{first}\n"
    return head + "".join(f"{_INDENT}{line}\n" for line in more)


def mpirun_sections() -> str:
    """The ``--help`` of the mpirun dialect: a section per titled group of options."""
    from .options import SECTIONS
    sections = []
    for title, options in SECTIONS:
        if title:
            before, after = _PROSE.get(title, ("", ""))
            entries = [before, *(option.help for option in options), after]
            sections.append(f"{title}:\n" + "".join(_entry(e) for e in entries if e))
    return "\n".join(sections)


_TORCHRUN = """\
torchrun's command line (torchrun or python -m torch.distributed.launch replaced
by mslaunch, python -m torch.distributed.run by python -m mslaunch): its
options, spelled with '-' or '_', '=' or a space, a unique prefix; each reads
PET_<NAME> as its default.

  mslaunch --nproc-per-node=4 train.py ARGS      torchrun's workers on this node
  mslaunch --standalone --nproc-per-node=4 -m pkg.train
  mslaunch --nproc-per-node=2 --max-restarts=3 --log-dir=logs -r 3 -t 2 train.py

  --nproc-per-node N|cpu|auto|gpu  workers on this node (gpu: one per GPU)
  --nnodes N            the same line on each of N nodes forms one job (static:
                        --node-rank, --master-addr, --master-port; c10d:
                        --rdzv-endpoint, --rdzv-id); MIN:MAX (c10d): the job
                        goes on while MIN nodes are there, takes new ones to MAX
  --standalone, --rdzv-backend static|c10d, --rdzv-endpoint, --rdzv-id,
  --rdzv-conf, --master-addr, --master-port, --local-addr, --node-rank
                        MASTER_ADDR, MASTER_PORT and TORCHELASTIC_RUN_ID as
                        torchrun gives them (etcd: not served)
  --max-restarts N      the whole job again after a failure, at most N times
  -m, --no-python, --run-path, --role, --signals-to-handle, --shutdown-timeout,
  --virtual-local-rank  as torchrun's
  --log-dir DIR, -r/--redirects, -t/--tee, --local-ranks-filter
                        DIR/<run id>_XXXXXXXX/attempt_N/<local rank>/ with
                        stdout.log, stderr.log, error.json; without --log-dir
                        the directory is removed at the end
  --monitor-interval, --start-method, --event-log-handler, --numa-binding,
  --logs-specs default  accepted: a worker's end is seen at once, every worker
                        is a process started anew
  --use-env             torch.distributed.launch's: without it, a script that
                        declares --local-rank (or --local_rank) is given it
  --report-json FILE    mslaunch's job report, with a worker's error file
  --stall-report S, --stall-exit
                        mslaunch's: the workers' merged stacks once none has
                        written or moved for S seconds (default 300; 0: off)

Every worker gets torchrun's variables (RANK, LOCAL_RANK, WORLD_SIZE, GROUP_RANK,
ROLE_RANK, TORCHELASTIC_ERROR_FILE, ...); TORCHELASTIC_USE_AGENT_STORE is False:
worker rank 0 hosts the job's store, fresh in every attempt.  A failed worker's
error file (torch's @record) is in the failure summary; the exit status is the
failed worker's own.
"""


_DEEPSPEED = """\
DeepSpeed's launcher's line (deepspeed replaced by mslaunch): a line with an
option only DeepSpeed's has before the script (--num_gpus, --include, ...).

  mslaunch --num_gpus 2 train.py --deepspeed ds.json     this machine's GPUs 0, 1
  mslaunch --hostfile hostfile --include 'h1:0,1@h2:0' train.py --deepspeed ds.json

  --hostfile, -H FILE   DeepSpeed's 'HOST slots=N' lines (/job/hostfile if there;
                        none: this machine, its GPUs or NUMA nodes)
  --include, --exclude, --num_nodes, --num_gpus
                        the nodes and slots, as DeepSpeed chooses them
  --master_addr, --master_port, --module, --no_python, --no_local_rank
                        as DeepSpeed's (MASTER_PORT 29500 by default)
  --launcher, --launcher_args, --force_multi, --ssh_port
                        mslaunch starts the nodes itself, over SSH

Every worker gets DeepSpeed's --local_rank=N and RANK, LOCAL_RANK, WORLD_SIZE,
LOCAL_SIZE, CROSS_RANK, CROSS_SIZE, MASTER_ADDR, MASTER_PORT and
CUDA_VISIBLE_DEVICES; across nodes also the PYTHON*, NCCL*, UCX*, MLFLOW* and
MV2* variables and .deepspeed_env's lines, as DeepSpeed's runners export them.
"""


def _torchrun() -> str:
    """torchrun's dialect, then its options' spellings in the other dialects."""
    from .hints import TORCHRUN, TORCHRUN_MSRUN
    lines = [_TORCHRUN + "\ntorchrun's options in the other dialects (mpirun's, then msrun's):"]
    import textwrap
    for table in (TORCHRUN, TORCHRUN_MSRUN):
        if table is TORCHRUN_MSRUN:
            lines.append("in msrun's dialect:\n")
        for name, what in table.items():
            what = what.replace("{n}", "N").replace("{dir}", "DIR")
            dashes = "-" if len(name) == 1 else "--"
            lines.append(_entry(f"{dashes}{name}\t" + "\n".join(textwrap.wrap(what, 52))))
    return lines[0] + "\n" + "".join(lines[1:])


def _topic_list() -> str:
    import textwrap
    topics = ("hosts", "mapping", "environment", "output", "lifecycle", "remote", "other",
              "msrun", "torchrun", "deepspeed", "examples", "all")
    return "\n  ".join(textwrap.wrap(", ".join(topics), 76))


def help_text(topic: Optional[str] = None) -> str:
    """``--help`` (all of it, with examples), or ``--help TOPIC``; UsageError for an
    unknown topic."""
    docs = _DOCS.format(topics=_topic_list())
    if topic is None:
        return _SHORT + _EXAMPLES + "\n" + docs
    if TOPICS.get(topic.lower()) == "all":
        return TEXT + "\n" + _torchrun() + "\n" + _DEEPSPEED + "\n" + _EXAMPLES + "\n" + docs
    what = TOPICS.get(topic.lower())
    if what is None:
        from ..core.errors import UsageError
        from ..core.errors import one_line
        raise UsageError(f"--help {one_line(topic, 40)!r}: no such topic (topics: "
                         f"{_topic_list()})")
    if what == "msrun":
        body = _MSRUN
    elif what == "torchrun":
        body = _torchrun()
    elif what == "deepspeed":
        body = _DEEPSPEED
    elif what == "examples":
        body = _EXAMPLES
    else:
        body = next(section for section in mpirun_sections().split("\n\n")
                    if section.startswith(what))
        body = body.rstrip("\n") + "\n"
    return body + "\n" + docs


TEXT = _HEAD + mpirun_sections() + "\n" + _MSRUN
