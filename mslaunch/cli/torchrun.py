"""torchrun's dialect: ``torchrun`` (or ``python -m torch.distributed.run``, or
``python -m torch.distributed.launch``) replaced by ``mslaunch`` runs the same job.

Options are torchrun 2.x's, with its spellings (``--nproc-per-node`` and
``--nproc_per_node``; ``--opt=value`` or ``--opt value``; ``-r3``; a unique
prefix of a name, as argparse takes it) and its defaults; each reads its
default from ``PET_<NAME>`` as torchrun does (Kubernetes' PyTorchJob sets
them).  The first word that is not an option is the script; every word after
it is the script's.

Which lines are torchrun's (:func:`is_torchrun`): one whose options, before
the script, name an option only torchrun has (and none only msrun has: that
line is msrun's, whose errors name torchrun's options in msrun's words); or
one with no option at all when a ``PET_`` variable is set.  ``--node_rank``,
``--master_addr``, ``--master_port`` and ``--log_dir`` are msrun's too: a
line with only those is refused in one line naming both dialects.

torch.distributed.launch's lines are torchrun's with ``--use-env`` (its
``--use_env``) added; without it, a script that declares ``--local-rank`` (or
only ``--local_rank``) gets that argument, as the legacy launcher gives it (see
:func:`mslaunch.cli.torchjob.legacy_argument`).

One node (``--nnodes 1``, ``--standalone``, or the default) is a job of this
machine: the workers get torchrun's variables and files (see
:mod:`mslaunch.plan.torchrun`).  The table of options is
``docs/guides/torchrun.md``'s.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

    from ..core.spec import JobSpec

from ..core.errors import UsageError, one_line
from .common import MSRUN_EXTRAS, MSRUN_OPTIONS, TORCHRUN_OPTIONS as OPTIONS, torchrun_name, \
    torchrun_short

_KIND = {name: kind for name, kind, _ in OPTIONS}
_SHORT = {"m": "module", "r": "redirects", "t": "tee"}
#: Read from the environment by torchrun's own argparse only when given (no PET_).
_NO_PET = ("logs_specs", "numa_binding", "report_json", "stall_report", "stall_exit",
           "use_env")
#: torchrun's options that msrun's dialect has too (with other defaults).
SHARED = ("node_rank", "master_addr", "master_port", "log_dir")
#: torchrun's options that mpirun's dialect has too: they do not make a line torchrun's.
MPIRUN_TOO = ("max_restarts", "report_json", "stall_report", "stall_exit")
#: The rendezvous configuration's keys torchrun knows (others are taken, as torchrun does).
RDZV_KEYS = ("join_timeout", "last_call_timeout", "close_timeout", "heartbeat_timeout",
             "keep_alive_interval", "keep_alive_max_attempt", "read_timeout", "is_host",
             "store_type", "timeout", "rank")
def _leading_options(argv: Sequence[str]) -> List[Tuple[str, str]]:
    """(name, word) of each option of a line before its script (the word after
    an option that takes a value and has no ``=`` is its value)."""
    found: List[Tuple[str, str]] = []
    skip = False
    for word in argv:
        if skip:
            skip = False
            continue
        if not word.startswith("-") or word == "--":
            break
        long = word.startswith("--")
        if not long and not torchrun_short(word):
            found.append((word, word))      # (another launcher's: -n, -mca, -rf ...)
            continue
        name = (torchrun_name(word) or word[2:].split("=", 1)[0].replace("-", "_")) if long \
            else word[1:2]
        found.append((name, word))
        # the next word is this option's value
        if long and "=" not in word:
            skip = (name in _KIND and _KIND[name] != "flag") or name in MSRUN_OPTIONS + MSRUN_EXTRAS
        elif not long:
            skip = name in ("r", "t") and len(word) == 2
    return found


def is_torchrun(argv: Sequence[str], environ: Optional[Mapping[str, str]] = None) -> bool:
    """Whether a command line is torchrun's (see the module's docstring); a line
    that is both torchrun's and msrun's is taken here, and refused by
    :func:`command` in one line."""
    environ = os.environ if environ is None else environ
    options = _leading_options(argv)
    if not options:
        return bool(argv) and any(k.startswith("PET_") for k in environ)
    names = [n for n, _ in options]
    if any(n in MSRUN_OPTIONS + MSRUN_EXTRAS and n not in SHARED and n not in _KIND
           for n in names):
        return False        # msrun's (which names a torchrun option there in its words)
    if any(_torchrun_only(name, word) for name, word in options):
        return True
    return all(n in SHARED for n in names)      # (refused by command: whose is it?)


def _torchrun_only(name: str, word: str) -> bool:
    """Whether an option is torchrun's and not msrun's: ``--node-rank`` (with
    '-') is torchrun's spelling of a shared one; msrun writes '_' only."""
    if not word.startswith("--"):
        return name in _SHORT
    if name not in _KIND or name in MPIRUN_TOO:
        return False
    return name not in SHARED or "-" in word[2:].split("=", 1)[0]


def _value_of(flag: str, argv: Sequence[str], i: int, inline: Optional[str]
              ) -> Tuple[str, int]:
    if inline is not None:
        return inline, i + 1
    if i + 1 >= len(argv):
        raise UsageError(f"{flag}: expected a value")
    return argv[i + 1], i + 2


def _resolve(body: str) -> str:
    """A long option's name, exact or by a unique prefix (argparse's rule; a
    prefix of both spellings of one option is that option)."""
    name = body.replace("-", "_")
    if name in _KIND:
        return name
    found = sorted({n for n in _KIND if n.startswith(name)}) if len(name) >= 2 else []
    if len(found) == 1:
        return found[0]
    shown = repr(one_line("--" + body, 60))
    if found:
        return _refuse(f"ambiguous option {shown}: it could be "
                       f"{', '.join('--' + n.replace('_', '-') for n in found)}")
    if name in MSRUN_OPTIONS + MSRUN_EXTRAS:
        return _refuse(f"{shown} is msrun's, not torchrun's: a line is one launcher's "
                       f"(see mslaunch --help torchrun)")
    return _refuse(f"unknown torchrun option {shown} (see mslaunch --help torchrun)")


def _refuse(message: str) -> str:
    raise UsageError(message)


def read_line(argv: Sequence[str]) -> Tuple[Dict[str, str], List[str]]:
    """The options given (name -> value, "1" for a flag) and the script with its arguments."""
    given: Dict[str, str] = {}
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            i += 1
            break
        if not word.startswith("-") or word == "-":
            break
        if word.startswith("--"):
            body, eq, inline = word[2:].partition("=")
            name, flag = _resolve(body), word.split("=", 1)[0]
            value_inline = inline if eq else None
        else:
            name = _SHORT[word[1:2]] if torchrun_short(word) else _refuse(
                f"unknown torchrun option {one_line(word, 40)!r} (see mslaunch --help torchrun)")
            flag, value_inline = word[:2], (word[2:] or None)
        if _KIND[name] == "flag":
            if value_inline is not None:
                raise UsageError(f"{flag} takes no value")
            given[name], i = "1", i + 1
        else:
            given[name], i = _value_of(flag, argv, i, value_inline)
    rest = list(argv[i:])
    if not rest:
        raise UsageError("no training script given: mslaunch [torchrun's options] "
                         "SCRIPT [ARGS...] (see mslaunch --help torchrun)")
    return given, rest


def settings(given: Mapping[str, str], environ: Mapping[str, str]) -> Dict[str, Optional[str]]:
    """Every option's value: the line's, else ``PET_<NAME>``'s, else torchrun's default.
    A flag's ``PET_`` value is "1" or "0" -- and empty means set, where torchrun
    2.x fails on it (Kubeflow's PyTorchJob writes ``PET_STANDALONE=""``)."""
    values: Dict[str, Optional[str]] = {}
    for name, kind, default in OPTIONS:
        pet = None if name in _NO_PET else environ.get("PET_" + name.upper())
        if name in given:
            values[name] = given[name]
        elif pet is not None:
            if kind == "flag":
                word = pet.strip()
                if word not in ("", "0", "1"):
                    raise UsageError(f"PET_{name.upper()}={one_line(pet, 20)}: expected 1 or 0")
                values[name] = "0" if word == "0" else "1"
            else:
                values[name] = pet
        else:
            values[name] = "0" if kind == "flag" else default
    return values


def command(argv: Sequence[str]) -> Union[JobSpec, int]:
    """Run a torchrun command line; its exit status."""
    _refuse_mixed(argv)
    given, rest = read_line(argv)
    values = settings(given, os.environ)
    from .torchjob import nodes_of, run_torchrun
    nodes = nodes_of(values, rest)
    if nodes > 1:
        from .torchnodes import run_nodes
        return run_nodes(values, rest, os.environ, nodes)  # type: ignore[arg-type]
    return run_torchrun(values, rest, os.environ)  # type: ignore[arg-type]


def _refuse_mixed(argv: Sequence[str]) -> None:
    options = _leading_options(argv)
    if options and not any(_torchrun_only(n, w) for n, w in options):
        shared = sorted({n for n, _ in options})
        raise UsageError(
            f"--{', --'.join(shared)}: both msrun's and torchrun's; say which: "
            f"--nproc-per-node N (torchrun's workers on this node), --worker_num N "
            f"--local_worker_num N (msrun's) or --num_gpus N (DeepSpeed's launcher's)")
