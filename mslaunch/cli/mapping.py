"""Placement options of the mpirun dialect: ``--map-by``, ``--rank-by``, ``--bind-to`` and kin.

:func:`mapping_fields` turns what the command line said (Open MPI 4 and 5
spellings, the deprecated ones included) into the :class:`~mslaunch.core.spec.JobSpec`
fields the planner reads; every error is one :class:`UsageError` line.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Optional, Tuple

from ..core.errors import UsageError

#: --map-by policies (Open MPI 4 names); "package" is Open MPI 5's socket.
MAP_POLICIES = ("slot", "node", "core", "hwthread", "socket", "numa", "l1cache",
                "l2cache", "l3cache", "board")
RANK_POLICIES = ("slot", "node", "hwthread", "core", "socket", "numa", "l1cache",
                 "l2cache", "l3cache", "board")
BIND_POLICIES = ("none", "hwthread", "core", "l1cache", "l2cache", "l3cache", "socket",
                 "numa", "board", "cpu-list")
PPR_OBJECTS = ("node", "board", "socket", "numa", "l3cache", "l2cache", "l1cache", "core",
               "hwthread")
_MAP_MODIFIERS = ("SPAN", "FILL", "NOOVERSUBSCRIBE", "OVERSUBSCRIBE", "NOLOCAL", "DISPLAY",
                  "DISPLAYALLOC", "DISPLAYDEVEL", "HWTCPUS", "CORECPUS", "INHERIT",
                  "NOINHERIT", "ORDERED")


def _kind(word: str, allowed, what: str, value: str) -> str:
    kind = word.lower()
    if kind == "package":
        kind = "socket"
    if kind not in allowed:
        raise UsageError(f"{what} {value}: unknown policy {word!r} (expected "
                         f"{', '.join(allowed)})")
    return kind


def _count(what: str, text: str) -> int:
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= 65536:
        raise UsageError(f"{what}: expected a count from 1 to 65536, got {text[:20]!r}")
    return int(text)


def parse_map_by(value: str) -> Dict[str, object]:
    """``--map-by POLICY[:MODIFIER...]`` as JobSpec fields (and flags it implies)."""
    parts = value.split(":")
    head = parts[0].lower()
    out: Dict[str, object] = {}
    if head == "ppr":
        if len(parts) < 3:
            raise UsageError(f"--map-by {value}: expected ppr:N:OBJECT, e.g. ppr:2:socket")
        n = _count("--map-by ppr", parts[1])
        obj = _kind(parts[2], PPR_OBJECTS, "--map-by", value)
        if obj in ("node", "board"):
            out["per_node"] = n
        else:
            out["ppr"] = (n, obj)
        mods = parts[3:]
    elif head in ("seq", "dist", "rankfile"):
        raise UsageError(f"--map-by {value}: the {head} mapper is not supported; "
                         f"place ranks one by one with a rankfile (-rf FILE)")
    else:
        out["map_by"] = _kind(parts[0] or "slot", MAP_POLICIES, "--map-by", value)
        mods = parts[1:]
    for mod in filter(None, mods):
        name, _, arg = mod.partition("=")
        upper = name.upper()
        if upper == "PE":
            out["pe"] = _count("--map-by ...:PE", arg)
        elif upper == "OVERSUBSCRIBE":
            out["oversubscribe"] = True
        elif upper == "NOOVERSUBSCRIBE":
            out["oversubscribe"] = False
        elif upper == "NOLOCAL":
            out["nolocal"] = True
        elif upper in ("DISPLAY", "DISPLAYDEVEL"):
            out["display-map"] = True
        elif upper == "DISPLAYALLOC":
            out["display-allocation"] = True
        elif upper == "HWTCPUS":
            out["use_hwthreads"] = True
        elif upper in _MAP_MODIFIERS:
            pass
        else:
            raise UsageError(f"--map-by {value}: unknown modifier {mod[:20]!r}")
    return out


def parse_rank_by(value: str) -> str:
    policy = value.split(":")[0]
    return _kind(policy, RANK_POLICIES, "--rank-by", value)


def parse_bind_to(value: str) -> Dict[str, object]:
    parts = value.split(":")
    out: Dict[str, object] = {"bind_to": _kind(parts[0], BIND_POLICIES, "--bind-to", value)}
    for q in parts[1:]:
        ql = q.lower()
        if ql == "overload-allowed":
            out["bind_overload"] = True
        elif ql == "ordered":
            out["bind_ordered"] = True
        elif ql not in ("if-supported", "report", ""):
            raise UsageError(f"--bind-to {value}: unknown qualifier {q[:20]!r} (expected "
                             f"overload-allowed, if-supported or ordered)")
    return out


def parse_ppr(value: str) -> Dict[str, object]:
    """Open MPI 4's ``--ppr N:OBJECT`` (an older spelling of ``--map-by ppr:N:OBJECT``)."""
    return parse_map_by("ppr:" + value)


def parse_cpus(flag: str, value: str) -> Tuple[int, ...]:
    from ..core.cputopo import parse_cpulist
    try:
        return parse_cpulist(value)
    except ValueError as err:
        raise UsageError(f"{flag}: {err}") from None


def mapping_fields(settings: List[Tuple[str, str]]) -> Dict[str, object]:
    """The placement fields of a JobSpec from ``(option, value)`` pairs in command-line order.

    Later settings win over earlier ones, as in Open MPI, except that two
    different ways of fixing the ranks per node conflict.
    """
    out: Dict[str, object] = {}
    per_node_from: Optional[str] = None
    for name, value in settings:
        if name == "map-by":
            fields = parse_map_by(value)
        elif name == "ppr":
            fields = parse_ppr(value)
        elif name == "rank-by":
            fields = {"rank_by": parse_rank_by(value)}
        elif name == "bind-to":
            fields = parse_bind_to(value)
        elif name == "npernode":
            fields = {"per_node": _count("-npernode", value)}
        elif name == "ppn":
            fields = {"per_node": _count("-ppn", value), "per_node_wrap": True}
        elif name == "pernode":
            fields = {"per_node": 1}
        elif name == "npersocket":
            fields = {"ppr": (_count("-npersocket", value), "socket")}
        elif name == "cpus-per-proc":
            fields = {"pe": _count("--cpus-per-proc", value)}
        elif name == "bynode":
            fields = {"map_by": "node"}
        elif name == "byslot":
            fields = {"map_by": "slot"}
        elif name == "bycore":
            fields = {"map_by": "core"}
        elif name == "bind-to-core":
            fields = {"bind_to": "core"}
        elif name == "bind-to-socket":
            fields = {"bind_to": "socket"}
        elif name == "cpu-set":
            fields = {"cpu_set": parse_cpus("--cpu-set", value)}
        elif name == "cpu-list":
            fields = {"cpu_list": parse_cpus("--cpu-list", value)}
        else:
            raise AssertionError(name)
        if "per_node" in fields or "ppr" in fields:
            source = f"{name} {value}".strip()
            if per_node_from is not None and per_node_from != source:
                raise UsageError(f"{per_node_from} and {source} both fix the ranks per node; "
                                 f"give one of them")
            per_node_from = source
        out.update(fields)
    if out.get("ppr") and out.get("per_node"):
        raise UsageError("a ppr pattern and -npernode both fix the ranks per node; give one")
    return out
