"""The spawn request on both PMI wires, read into a :class:`~mslaunch.core.spec.SpawnRequest`.

PMI-1 sends ``MPI_Comm_spawn_multiple`` as one multi-line message: per
command a segment of ``key=value`` lines (``nprocs``, ``execname``,
``totspawns``, ``spawnssofar``, ``argcnt``, ``arg1``.., ``info_num``,
``info_key_i``/``info_val_i``; the first segment also ``preput_num`` and
``preput_key_i``/``preput_val_i``), each closed by ``endcmd``.  PMI-2 sends
one frame: ``ncmds``, ``preputcount``, ``ppkeyN``/``ppvalN``, then per
command ``subcmd``, ``maxprocs``, ``argc``, ``argvN``.., ``infokeycount``,
``infokeyN``/``infovalN``.  Keys repeat from command to command, so both
are read as ordered pairs.  Anything inconsistent is a ``ValueError``
naming the problem; sizes are capped so that a hostile rank cannot make
the launcher allocate without bound.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Sequence, Tuple

    Pairs = Sequence[Tuple[str, str]]

from ...core.spec import SpawnCommand, SpawnRequest

#: Limits on one spawn request.
MAX_COMMANDS = 1024
MAX_PROCS = 100_000
MAX_ARGS = 4096
MAX_INFO = 256
MAX_PREPUT = 1024


def _count(text: str, what: str, high: int, low: int = 0) -> int:
    if not text.isascii() or not text.isdigit() or not low <= int(text) <= high:
        raise ValueError(f"{what}={text[:20]!r} is not a number in {low}..{high}")
    return int(text)


def _numbered(values: Dict[str, str], prefix: str, count: int, base: int,
              what: str) -> List[str]:
    try:
        return [values[f"{prefix}{i}"] for i in range(base, base + count)]
    except KeyError as missing:
        raise ValueError(f"{what}: {str(missing)[1:-1]} is missing") from None


def _segment_dict(pairs: Pairs) -> Dict[str, str]:
    out: Dict[str, str] = {}
    for key, value in pairs:
        out.setdefault(key, value)
    return out


def spawn_from_v1(segments: Sequence[Pairs]) -> SpawnRequest:
    """The request of a PMI-1 ``mcmd=spawn`` message (its segments, without ``endcmd``)."""
    if not segments or len(segments) > MAX_COMMANDS:
        raise ValueError(f"{len(segments)} spawn segments")
    commands = []
    preput: List[Tuple[str, str]] = []
    total = 0
    for i, pairs in enumerate(segments):
        seg = _segment_dict([(k, v) for k, v in pairs if k != "mcmd"])
        if _count(seg.get("totspawns", ""), "totspawns", MAX_COMMANDS, 1) != len(segments) \
                or _count(seg.get("spawnssofar", ""), "spawnssofar", MAX_COMMANDS, 1) != i + 1:
            raise ValueError("spawn segments out of order")
        if "execname" not in seg or not seg["execname"]:
            raise ValueError("a spawn command without execname")
        nprocs = _count(seg.get("nprocs", ""), "nprocs", MAX_PROCS, 1)
        total += nprocs
        argc = _count(seg.get("argcnt", "0"), "argcnt", MAX_ARGS)
        args = _numbered(seg, "arg", argc, 1, "spawn arguments")
        ninfo = _count(seg.get("info_num", "0"), "info_num", MAX_INFO)
        info = list(zip(_numbered(seg, "info_key_", ninfo, 0, "spawn info"),
                        _numbered(seg, "info_val_", ninfo, 0, "spawn info")))
        if i == 0:
            npre = _count(seg.get("preput_num", "0"), "preput_num", MAX_PREPUT)
            preput = list(zip(_numbered(seg, "preput_key_", npre, 0, "spawn preput"),
                              _numbered(seg, "preput_val_", npre, 0, "spawn preput")))
        commands.append(SpawnCommand(program=seg["execname"], args=tuple(args),
                                     nprocs=nprocs, info=tuple(info)))
    return _request(commands, preput, total)


def _request(commands, preput, total: int) -> SpawnRequest:
    from .wire import KEYLEN_MAX, VALLEN_MAX
    if total > MAX_PROCS:
        raise ValueError(f"a spawn of {total} processes")
    for key, value in preput:
        # The pairs go into the new job's key-value space: the limits of put.
        if not key or len(key) > KEYLEN_MAX or len(value) > VALLEN_MAX:
            raise ValueError(f"a preput pair beyond the key-value limits ({KEYLEN_MAX} "
                             f"characters of key, {VALLEN_MAX} of value)")
    return SpawnRequest(commands=tuple(commands), preput=tuple(preput))


def spawn_from_v2(pairs: Pairs) -> SpawnRequest:
    """The request of a PMI-2 ``spawn`` frame (its pairs in order, ``cmd`` excluded)."""
    head: List[Tuple[str, str]] = []
    parts: List[List[Tuple[str, str]]] = []
    for key, value in pairs:
        if key == "subcmd":
            if len(parts) >= MAX_COMMANDS:
                raise ValueError("too many spawn commands")
            parts.append([])
        (parts[-1] if parts else head).append((key, value))
    top = _segment_dict(head)
    ncmds = _count(top.get("ncmds", ""), "ncmds", MAX_COMMANDS, 1)
    if ncmds != len(parts):
        raise ValueError(f"ncmds={ncmds} but {len(parts)} commands")
    npre = _count(top.get("preputcount", "0"), "preputcount", MAX_PREPUT)
    preput = list(zip(_numbered(top, "ppkey", npre, 0, "spawn preput"),
                      _numbered(top, "ppval", npre, 0, "spawn preput")))
    commands = []
    total = 0
    for part in parts:
        seg = _segment_dict(part)
        program = part[0][1]
        if not program:
            raise ValueError("a spawn command without a program")
        nprocs = _count(seg.get("maxprocs", ""), "maxprocs", MAX_PROCS, 1)
        total += nprocs
        argc = _count(seg.get("argc", "0"), "argc", MAX_ARGS)
        # MPICH numbers the arguments from 0, the PMI-2 document from 1.
        base = 0 if argc == 0 or "argv0" in seg else 1
        args = _numbered(seg, "argv", argc, base, "spawn arguments")
        ninfo = _count(seg.get("infokeycount", "0"), "infokeycount", MAX_INFO)
        info = list(zip(_numbered(seg, "infokey", ninfo, 0, "spawn info"),
                        _numbered(seg, "infoval", ninfo, 0, "spawn info")))
        commands.append(SpawnCommand(program=program, args=tuple(args), nprocs=nprocs,
                                     info=tuple(info)))
    return _request(commands, preput, total)


def v2_pairs(body: str) -> List[Tuple[str, str]]:
    """Every ``key=value`` of a PMI-2 frame body in order (empty values allowed)."""
    tokens = body.split(";")
    if tokens and tokens[-1] == "":
        tokens.pop()
    pairs = []
    for token in tokens:
        key, sep, value = token.partition("=")
        if not sep or not key:
            raise ValueError(f"bad token {token[:40]!r}")
        pairs.append((key, value))
    return pairs
