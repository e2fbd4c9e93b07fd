"""The msrun dialect: MindSpore's launcher's command line, read into a MsrunSpec.

``msrun --worker_num=8 --local_worker_num=8 --master_port=8118 --log_dir=msrun_log
--join=True --cluster_time_out=300 net.py`` works with ``msrun`` replaced by
``mslaunch``.  Options take ``--name=value`` or ``--name value``, or a
unique start of the name (``--worker_n=8``), as msrun's argparse does, with
its defaults; the first word that is not an option is the task script and
the rest its arguments.  Every problem msrun would only
notice once its scheduler runs (a local worker count above the total, a bad
port, a malformed binding map, a node rank out of range) is one error line
here, before anything starts.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Optional, Sequence, Tuple

from ..core.errors import UsageError, one_line
from ..core.spec import MsrunSpec
from ..core.switches import pty_wanted
from .common import MSRUN_EXTRAS, MSRUN_OPTIONS, Exit, launch_dir, msrun_names

OPTIONS, EXTRAS = MSRUN_OPTIONS, MSRUN_EXTRAS


def _int(flag: str, text: str, low: Optional[int] = None, high: Optional[int] = None) -> int:
    body = text[1:] if text.startswith(("-", "+")) else text
    if not body.isascii() or not body.isdigit() or len(body) > 9:
        raise UsageError(f"--{flag}={one_line(text, 40)}: expected a whole number")
    value = int(text)
    if (low is not None and value < low) or (high is not None and value > high):
        bound = f"at least {low}" if high is None else f"between {low} and {high}"
        raise UsageError(f"--{flag}={value}: must be {bound}")
    return value


def _bool(flag: str, text: str) -> bool:
    # msrun evaluates the value as a Python literal: True, False, 1, 0.
    word = text.strip()
    if word in ("True", "true", "1"):
        return True
    if word in ("False", "false", "0"):
        return False
    raise UsageError(f"--{flag}={one_line(text, 40)}: expected True or False")


def _cpus(flag: str, key: str, value) -> str:
    from ..core.cputopo import parse_cpulist
    items = value if isinstance(value, list) else [value]
    texts = []
    for item in items:
        if not isinstance(item, str):
            raise UsageError(f"--{flag}: {key!r} must list CPU ranges as strings, like \"0-3\"")
        try:
            parse_cpulist(item)
        except ValueError as err:
            raise UsageError(f"--{flag}: {key!r}: {err}") from None
        texts.append(item)
    return ",".join(texts)


def _binding(flag: str, text: str):
    """None, "auto", or a tuple of ``(key, cpu list)`` from the JSON map form."""
    word = text.strip()
    if word in ("True", "true", "1"):
        return "auto"
    if word in ("False", "false", "0", ""):
        return None
    if flag == "bind_numa":
        from ..msrun.bindfile import read
        found = read(word, lambda value: _map_form(flag, value))
        if found is not None:
            return found
    import json
    try:
        value = json.loads(word)
    except ValueError:
        raise UsageError(f"--{flag}: expected True, False or a JSON map such as "
                         f"'{{\"device0\":[\"0-3\"],\"scheduler\":[\"4\"]}}'") from None
    return _map_form(flag, value)


def _map_form(flag: str, value) -> Tuple[Tuple[str, str], ...]:
    """The JSON map form's ``(key, cpu list)`` pairs (given on the line, or as
    ``--bind_numa``'s older file form)."""
    if not isinstance(value, dict) or not value:
        raise UsageError(f"--{flag}: the JSON value must be a non-empty map")
    pairs: List[Tuple[str, str]] = []
    for key, cpus in value.items():
        if not (key == "scheduler" or (key.startswith("device") and key[6:].isdigit())):
            raise UsageError(f"--{flag}: unknown key {key[:40]!r} (deviceN or scheduler)")
        pairs.append((key, _cpus(flag, key, cpus)))
    return tuple(pairs)


def _read_options(argv: Sequence[str]) -> Tuple[Dict[str, str], List[str]]:
    """The ``--name=value`` / ``--name value`` options, and the words after them."""
    values: Dict[str, str] = {}
    i = 0
    while i < len(argv):
        word = argv[i]
        if word in ("-h", "--help"):
            from .help import help_text
            raise Exit(help_text("msrun"), 0)
        if word in ("--verbose", "--quiet", "--no-pty"):   # mslaunch's own, without a value
            values[word[2:]] = "1"
            i += 1
            continue
        if word.startswith("-") and not word.startswith("--") and len(word) > 1:
            raise UsageError(f"unknown msrun option '{one_line(word, 40)}' (msrun's options are "
                             f"--name=value; mslaunch's --verbose, --quiet and --no-pty)")
        if not word.startswith("--"):
            break
        name, sep, value = word[2:].partition("=")
        found = msrun_names(name)
        if len(found) > 1:
            raise UsageError(f"ambiguous option '--{one_line(name, 40)}': it could be "
                             f"{', '.join('--' + n for n in found)}")
        if not found:
            from .hints import unknown_option
            after = value if sep else (argv[i + 1] if i + 1 < len(argv) else None)
            raise UsageError("msrun dialect: " + unknown_option(
                word, name, after, OPTIONS + EXTRAS, msrun=True))
        name = found[0]         # (a unique start of a name is that option, as argparse has it)
        if name == "help":
            from .help import help_text
            raise Exit(help_text("msrun"), 0)
        if not sep:
            if i + 1 >= len(argv):
                raise UsageError(f"--{name}: missing value")
            value = argv[i + 1]
            i += 1
        values[name] = value
        i += 1
    return values, list(argv[i:])


def _task_argv(rest: List[str]) -> Tuple[str, ...]:
    if not rest:
        raise UsageError("msrun dialect: no task script given (the last word should be "
                         "the script, e.g. net.py)")
    script = rest[0]
    # msrun runs "python SCRIPT ARGS", unless the script is an interpreter itself.
    return tuple(rest) if os.path.basename(script) in ("python", "python3", "pytest") \
        else ("python", *rest)


def _layout(values: Dict[str, str]) -> Tuple[int, int, int, int, Tuple[str, ...]]:
    """worker_num, local_worker_num, master_port and node_rank, checked together,
    and msrun's warnings of them."""
    worker_num = _int("worker_num", values.get("worker_num", "8"), 1)
    local = _int("local_worker_num", values.get("local_worker_num", "8"), 1)
    # A value the user never typed is named as msrun's default.
    said_local = f"--local_worker_num={local}" if "local_worker_num" in values else \
        f"--local_worker_num={local} (msrun's default, not given)"
    said_workers = f"--worker_num={worker_num}" if "worker_num" in values else \
        f"--worker_num={worker_num} (msrun's default, not given)"
    if local > worker_num:
        fix = (f"; give --local_worker_num={worker_num} for one node" if "local_worker_num"
               not in values else f"; give --worker_num={local} or more"
               if "worker_num" not in values else "")
        raise UsageError(f"{said_local} is more than {said_workers}{fix}")
    port = _int("master_port", values.get("master_port", "8118"), 1, 65535)
    node_rank = _int("node_rank", values.get("node_rank", "-1"), -1)
    if local == worker_num and node_rank > 0:
        # (one node: msrun says so, and ignores it)
        return worker_num, local, port, -1, (
            f"All workers will be spawned on this node, so 'node_rank': [{node_rank}] "
            f"will be ignored.",)
    if node_rank >= 0 and (node_rank + 1) * local > worker_num:
        raise UsageError(f"--node_rank={node_rank}: with {said_local} its "
                         f"workers would be ranks {node_rank * local}-"
                         f"{(node_rank + 1) * local - 1}, beyond {said_workers}")
    return worker_num, local, port, node_rank, ()


def _master_addr(values: Dict[str, str]) -> str:
    master = values.get("master_addr", "127.0.0.1").strip()
    if master.startswith("[") and master.endswith("]"):
        master = master[1:-1]
    if not master or any(c.isspace() for c in master) or len(master) > 253:
        raise UsageError(f"--master_addr={master[:40]!r}: expected an IP address or host name")
    return master


def parse_msrun(argv: Sequence[str]) -> MsrunSpec:
    """msrun's command line to a :class:`MsrunSpec` (UsageError with one line if bad)."""
    values, rest = _read_options(argv)
    argv_out = _task_argv(rest)
    worker_num, local, port, node_rank, warnings = _layout(values)
    master = _master_addr(values)
    sim_level, sim_rank_id = _simulation(values, worker_num, local)
    cwd = launch_dir()
    log_dir = os.path.normpath(os.path.join(cwd, values.get("log_dir", "") or "."))
    service = values.get("node_service_port")
    spec = MsrunSpec(
        argv=argv_out, worker_num=worker_num, local_worker_num=local, master_addr=master,
        master_port=port, node_rank=node_rank, log_dir=log_dir,
        join=_bool("join", values.get("join", "False")),
        cluster_time_out=_int("cluster_time_out", values.get("cluster_time_out", "600")),
        bind_core=_binding("bind_core", values.get("bind_core", "False")),
        bind_numa=_binding("bind_numa", values.get("bind_numa", "False")),
        sim_level=sim_level,
        sim_rank_id=sim_rank_id,
        rank_table_file=values.get("rank_table_file", ""),
        worker_log_name=values.get("worker_log_name", ""),
        tail_worker_log=_tail(values.get("tail_worker_log", "-1"), worker_num),
        launch_dir=cwd,
        service_port=_int("node_service_port", service, 1, 65535) if service else None,
        secret_file=os.path.abspath(values["secret_file"]) if values.get("secret_file")
        else None,
        tls_config=os.path.abspath(values["tls_config"]) if values.get("tls_config") else None,
        max_restarts=_int("max_restarts", values.get("max_restarts", "3"), 0),
        grace=float(_int("grace", values.get("grace", "5"), 0)),
        verbose=int(_bool("verbose", values.get("verbose", "0"))),
        quiet=_bool("quiet", values.get("quiet", "0")),
        log_dir_given=values.get("log_dir", ""), warnings=warnings,
        pty=pty_wanted(os.environ, no_pty="no-pty" in values, default=False),
        report_json=os.path.join(cwd, values["report_json"]) if values.get("report_json")
        else None,
    )
    if spec.service_port is None and port == 65535:
        raise UsageError("--master_port=65535 leaves no port for the node service "
                         "(master_port + 1); give --node_service_port")
    return spec


def _simulation(values: Dict[str, str], worker_num: int, local: int) -> Tuple[int, int]:
    """``--sim_level`` and ``--sim_rank_id`` as msrun reads them: a dry run also
    when ``MS_SIMULATION_LEVEL`` is set, the rank from ``RANK_ID`` when not
    given, and one process (rank 0) for more than 128 local workers."""
    level = _int("sim_level", values.get("sim_level", "-1"), -1, 3)
    rank = _int("sim_rank_id", values.get("sim_rank_id", "-1"), -1, worker_num - 1)
    given = os.environ.get("MS_SIMULATION_LEVEL", "").strip()
    if level < 0 and given:
        level = _int("sim_level (from MS_SIMULATION_LEVEL)", given, 0, 3)
    if level < 0:
        return level, rank
    if rank < 0 and os.environ.get("RANK_ID", "").strip():
        rank = _int("sim_rank_id (from RANK_ID)", os.environ["RANK_ID"].strip(), -1,
                    worker_num - 1)
    if rank < 0 and local > 128:
        rank = 0
    return level, rank


def _tail(text: str, workers: int) -> str:
    """``-1`` (every worker) or a comma-separated list of worker ids."""
    word = text.strip()
    if word == "-1":
        return word
    for item in word.split(","):
        _int("tail_worker_log", item.strip(), 0, workers - 1)
    return ",".join(item.strip() for item in word.split(","))


def command(argv: Sequence[str]) -> int:
    """Run an msrun command line: this node's part (``--join``), a detached
    supervisor, or a wait on or stop of a detached job; its exit status."""
    for word in argv:
        for verb in ("--wait_job=", "--stop_job="):
            if word.startswith(verb):
                from ..msrun.record import wait_job
                return wait_job(os.path.abspath(word[len(verb):]), stop=verb == "--stop_job=")
    spec = parse_msrun(argv)
    if spec.join:
        from ..msrun.node import run_node
        return run_node(spec)
    from ..msrun.record import detach
    return detach(spec)
