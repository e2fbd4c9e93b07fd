"""What a worker of a torchrun command line gets beyond every ecosystem's rank
variables (pure): torchrun's own variables, its files and its console.

torchrun's agent gives each worker ``GROUP_WORLD_SIZE``, ``ROLE_RANK``,
``ROLE_WORLD_SIZE``, the attempt's ``TORCHELASTIC_RESTART_COUNT`` and
``TORCHELASTIC_ERROR_FILE`` (where ``@record`` writes a failure); its files
are ``<run dir>/attempt_<N>/<local rank>/{stdout,stderr}.log`` for the streams
``-r`` redirects, and ``error.json``.  A stream redirected is not on the
terminal unless ``-t`` tees it, then after a prefix (``[default0]:``); the
ranks ``--local-ranks-filter`` leaves out are not on the terminal at all.
``${local_rank}`` in the program's arguments becomes the local rank.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, Optional, Sequence, Tuple

    from ..core.spec import TorchSpec


def _bits(pairs: Sequence[Tuple[int, int]], local_rank: int) -> int:
    for rank, bits in pairs:
        if rank == local_rank or rank < 0:        # (-1: every local rank)
            return bits
    return 0


def _substitute(word: str, local_rank: int) -> str:
    """torchrun's macro (``string.Template.safe_substitute``): ``${local_rank}``
    and ``$local_rank`` become the local rank, ``$$`` becomes ``$``."""
    if "$" not in word:
        return word
    from string import Template
    return Template(word).safe_substitute(local_rank=str(local_rank))


def worker_argv(argv: Sequence[str], local_rank: int) -> Tuple[str, ...]:
    return tuple(_substitute(word, local_rank) for word in argv)


def attempt_dir(torch: TorchSpec, attempt: int, local_rank: int) -> Optional[str]:
    if torch.run_dir is None:
        return None
    return f"{torch.run_dir}/attempt_{attempt}/{local_rank}"


def worker_variables(torch: TorchSpec, *, rank: int, size: int, local_rank: int, groups: int,
                     attempt: int, max_restarts: int) -> Dict[str, str]:
    """torchrun's variables of one worker that every ecosystem's do not cover."""
    where = attempt_dir(torch, attempt, local_rank)
    env = {"GROUP_WORLD_SIZE": str(groups), "ROLE_RANK": str(rank),
           "ROLE_WORLD_SIZE": str(size), "ROLE_NAME": torch.role,
           "TORCHELASTIC_RUN_ID": torch.run_id,
           "TORCHELASTIC_RESTART_COUNT": str(attempt),
           "TORCHELASTIC_MAX_RESTARTS": str(max_restarts),
           "TORCHELASTIC_ERROR_FILE": f"{where}/error.json" if where else ""}
    if torch.virtual_local_rank:
        env["LOCAL_RANK"] = "0"
        devices = torch.cuda_devices
        env["CUDA_VISIBLE_DEVICES"] = devices[local_rank] if devices else str(local_rank)
    return env


def worker_files(torch: TorchSpec, attempt: int, local_rank: int
                 ) -> Tuple[Optional[str], Optional[str], Optional[str]]:
    """The worker's stdout and stderr files (None: not redirected) and its error file."""
    where = attempt_dir(torch, attempt, local_rank)
    if where is None:
        return None, None, None
    bits = _bits(torch.redirects, local_rank) | _bits(torch.tee, local_rank)
    return (f"{where}/stdout.log" if bits & 1 else None,
            f"{where}/stderr.log" if bits & 2 else None, f"{where}/error.json")


def worker_console(torch: TorchSpec, *, rank: int, local_rank: int
                   ) -> Tuple[Optional[bytes], Optional[bytes]]:
    """Per stream: not on the terminal (None), or on it after this prefix."""
    if torch.shown is not None and local_rank not in torch.shown:
        return None, None
    redirected = _bits(torch.redirects, local_rank)
    teed = _bits(torch.tee, local_rank)
    if torch.run_dir is None:
        redirected = teed = 0           # (--log-dir /dev/null: no files to redirect to)
    prefix = None
    if teed:
        from string import Template
        prefix = Template(torch.prefix).safe_substitute(
            role_name=torch.role, rank=str(rank), local_rank=str(local_rank)).encode()
    shown = []
    for bit in (1, 2):
        if teed & bit:
            shown.append(prefix)
        elif redirected & bit:
            shown.append(None)
        else:
            shown.append(b"")
    return shown[0], shown[1]
