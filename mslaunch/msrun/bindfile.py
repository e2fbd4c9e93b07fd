"""msrun 2.10's ``--bind_numa FILE.json``: one JSON object that binds each process
of a node, read and checked as msrun reads it (pure: no topology here).

The file's form::

    {"bind_config": {"bind_cpu_mode": "cpu", "bind_memory_mode": "numa"},
     "bind_cpu": {"device0": {"main": "0-3"}, "scheduler": {"main": "4"}},
     "bind_memory": {"device0": 0}}

``bind_cpu_mode`` ``cpu`` gives each process the CPUs of its ``main`` entry,
``numa`` the CPUs of the NUMA nodes its entry names, ``none`` (the default)
leaves CPUs alone; ``bind_memory_mode`` ``numa`` binds its memory to the
nodes of its ``bind_memory`` entry.  Keys are ``deviceN`` (or ``device_N``),
the node's N-th worker, and ``scheduler``.  A process without an entry is
not bound.  A file without ``bind_config`` is msrun's older map form
(``{"device0": ["0"]}``: NUMA nodes by worker).  Every process gets the
file's absolute path in ``MSRUN_BIND_FILE`` and the SHA-256 of its text in
``MSRUN_BIND_FILE_HASH``, which MindSpore's ``set_cpu_affinity`` checks
against the file it is given.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..core.errors import UsageError, one_line

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, Literal, Optional, Tuple

    CpuMode = Literal["cpu", "numa", "none"]
    MemoryMode = Literal["numa", "none"]
    #: Key -> the numbers its entry gives (CPUs, or NUMA nodes), in key order.
    Entries = Tuple[Tuple[str, Tuple[int, ...]], ...]


@dataclass(frozen=True)
class BindFile:
    """See the module docstring; ``legacy`` holds the older map form's
    ``(key, node list)`` pairs, where the file has no ``bind_config``."""

    path: str
    digest: str
    cpu_mode: CpuMode = "none"
    memory_mode: MemoryMode = "none"
    cpu: Entries = ()
    memory: Entries = ()
    legacy: Optional[Tuple[Tuple[str, str], ...]] = None

    def entry(self, table: Entries, key: str) -> Tuple[int, ...]:
        """The numbers ``key`` is given in ``table`` (nothing: none)."""
        for name, numbers in table:
            if name == key:
                return numbers
        return ()


def read(word: str, map_form: Callable[[Any], Tuple[Tuple[str, str], ...]]
         ) -> Optional[BindFile]:
    """``--bind_numa``'s value as a file (None where it names none and does not
    end in ``.json``: another form of the option); UsageError, one line, for
    what msrun refuses.  ``map_form`` reads the older form's object, as the
    option's own JSON map is read."""
    shown = one_line(word, 80)
    is_json = word.lower().endswith(".json")
    if is_json and not os.path.exists(word):
        raise UsageError(f"--bind_numa: the JSON file '{shown}' does not exist")
    if is_json and not os.path.isfile(word):
        raise UsageError(f"--bind_numa: '{shown}' is not a file")
    if not os.path.isfile(word):
        return None
    import hashlib
    import json
    path = os.path.abspath(word)
    try:
        with open(path, encoding="utf-8") as f:
            raw = f.read(1 << 22)
        config = json.loads(raw)
    except (OSError, ValueError) as err:
        raise UsageError(f"--bind_numa: cannot read the JSON file '{shown}': "
                         f"{one_line(str(err), 80)}") from None
    if not isinstance(config, dict):
        raise UsageError(f"--bind_numa: '{shown}' should hold a JSON object")
    digest = hashlib.sha256(raw.encode("utf-8")).hexdigest()
    if "bind_config" not in config:
        return BindFile(path=path, digest=digest, legacy=map_form(config))
    settings = config["bind_config"]
    if not isinstance(settings, dict):
        raise UsageError(f"--bind_numa: {shown}: bind_config must be a JSON object")
    cpu_mode = str(settings.get("bind_cpu_mode", "none")).lower()
    if cpu_mode not in ("cpu", "numa", "none"):
        raise UsageError(f"--bind_numa: {shown}: 'bind_cpu_mode' only supports "
                         f"'cpu'/'numa'/'none'")
    memory_mode = str(settings.get("bind_memory_mode", "none")).lower()
    if memory_mode not in ("numa", "none"):
        raise UsageError(f"--bind_numa: {shown}: 'bind_memory_mode' only supports "
                         f"'numa'/'none'")
    cpu: Entries = ()
    if cpu_mode != "none":
        cpu = _entries(shown, "bind_cpu", config.get("bind_cpu", {}),
                       main=cpu_mode == "cpu")
    memory: Entries = ()
    if memory_mode == "numa":
        memory = _entries(shown, "bind_memory", config.get("bind_memory", {}), main=False)
    return BindFile(path=path, digest=digest, cpu_mode=cpu_mode,  # type: ignore[arg-type]
                    memory_mode=memory_mode, cpu=cpu, memory=memory)  # type: ignore[arg-type]


def _key(shown: str, key: Any) -> str:
    """``deviceN`` for ``deviceN`` or ``device_N``, or ``scheduler``."""
    if key == "scheduler":
        return key
    body = key[6:].lstrip("_") if isinstance(key, str) and key.startswith("device") else ""
    if not (body.isascii() and body.isdigit() and len(body) <= 6) or key[6:].count("_") > 1:
        raise UsageError(f"--bind_numa: {shown}: invalid key '{one_line(str(key), 40)}' "
                         f"(deviceN, device_N or scheduler)")
    return f"device{int(body)}"


def _entries(shown: str, table: str, value: Any, main: bool) -> Entries:
    """A ``bind_cpu`` (``main``: its ``{"main": CPUs}`` form) or ``bind_memory``
    table: each key's numbers."""
    if not isinstance(value, dict):
        raise UsageError(f"--bind_numa: {shown}: {table} must be a JSON object")
    out: Dict[str, Tuple[int, ...]] = {}
    for key, item in value.items():
        name = _key(shown, key)
        if item is None:
            continue
        if main:
            if not isinstance(item, dict):
                raise UsageError(f"--bind_numa: {shown}: {table}'s {name} must be an object "
                                 f"such as {{\"main\": \"0-3\"}}")
            item = item.get("main")
            if item is None or item == "":
                continue
            if not isinstance(item, str):
                raise UsageError(f"--bind_numa: {shown}: {table}'s {name}: 'main' must be a "
                                 f"string of CPUs, such as \"0-3\"")
        out[name] = _numbers(shown, f"{table}'s {name}", item)
    return tuple(out.items())


def _numbers(shown: str, where: str, item: Any) -> Tuple[int, ...]:
    """``"0-3,6"`` or ``3``: the numbers, sorted and distinct."""
    from ..core.cputopo import parse_cpulist
    if isinstance(item, bool) or not isinstance(item, (int, str)):
        raise UsageError(f"--bind_numa: {shown}: {where} must be a number or a string of "
                         f"ranges such as \"0-3,6\"")
    if isinstance(item, int):
        if not 0 <= item < 1 << 16:
            raise UsageError(f"--bind_numa: {shown}: {where}: {item} is out of range")
        return (item,)
    try:
        return parse_cpulist(item.replace(" ", ""))
    except ValueError as err:
        raise UsageError(f"--bind_numa: {shown}: {where}: {err}") from None

