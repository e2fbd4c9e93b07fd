"""The variables a PMIx server gives its ranks, kept so that a job can be given them
before the server is started (see :mod:`.door`).

``PMIx_server_setup_fork`` answers with the same variables for every rank of
every job of one library in one setting; only the job's namespace, the
rank, the server's directory, its process id and its port differ.  Once a
server has run, its answer is kept in the per-user cache as a template with
those five as fields, under a key of what chose and set up the library
(the variables the choice reads, the Python's prefixes, the ``PMIX_*``
settings, the linker's cache), a few keys to a file of the host; the library
that was loaded is recorded with its size and time, so that an upgraded
library is noticed.  A template is
kept only if filling it in gives back exactly what the library said.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Dict, List, Mapping, Optional, Tuple

#: The first line of a template file.
MAGIC = "mslaunch pmix env 2"


def _uri(value: str) -> Optional[Tuple[str, str, str]]:
    """A server URI's (text up to the port, host, port), as in
    ``pmix-server.12;tcp4://127.0.0.1:4242``; None for anything else."""
    head, sep, port = value.rpartition(":")
    scheme = head.find(";tcp4://")
    if not sep or scheme < 0 or not port.isdigit():
        return None
    host = head[scheme + len(";tcp4://"):]
    if not host or not all(part.isdigit() for part in host.split(".")) or host.count(".") != 3:
        return None
    return head + ":", host, port


def key(environ: Mapping[str, str]) -> Optional[str]:
    """What the template depends on, as one line (None if a part holds a line end):
    what chooses the library (:func:`.where.candidates` reads the variables and
    the Python's prefixes), the ``PMIX_*`` settings, the dynamic linker's cache."""
    import sys
    parts = [sys.prefix, sys.base_prefix] + [
        f"{name}={environ.get(name, '')}" for name in (
            "MSLAUNCH_PMIX_LIBRARY", "OPAL_PREFIX", "LD_LIBRARY_PATH", "PATH")]
    parts += sorted(f"{k}={v}" for k, v in environ.items() if k.startswith("PMIX_"))
    try:
        parts.append(str(os.stat("/etc/ld.so.cache").st_mtime_ns))
    except OSError:
        pass
    line = "\x1f".join(parts)
    return None if "\n" in line else line


def file_name() -> str:
    """The templates' file in the per-user cache (each host of a shared home its own)."""
    return f"pmix-env-{os.uname().nodename[:64]}.txt"


def make(env: Mapping[str, str], directory: str, pid: int, nspace: str,
         rank: int) -> Optional[Dict[str, str]]:
    """``env`` (one rank's variables) as a template, or None if one of the five
    cannot be told apart from the rest."""
    import re
    port = ""
    for name, value in env.items():
        if "\n" in name or "\n" in value or "=" in name:
            return None
        uri = _uri(value)
        if uri:
            if port and uri[2] != port:
                return None             # two listeners: not one door's
            port = uri[2]
    if not port:
        return None
    out: Dict[str, str] = {}
    for name, value in env.items():
        if name == "PMIX_NAMESPACE" and value == nspace:
            out[name] = "{nspace}"
            continue
        if name == "PMIX_RANK" and value == str(rank):
            out[name] = "{rank}"
            continue
        value = value.replace("{", "{{").replace("}", "}}").replace(directory, "{dir}")
        uri = _uri(value)
        if uri:
            # the server's own name before the ';' (pmix-server.PID), not its address
            server, _, rest = uri[0].partition(";")
            value = re.sub(rf"(?<![0-9]){pid}(?![0-9])", "{pid}", server) + ";" + rest + "{port}"
        else:
            value = re.sub(rf"(?<![0-9.]){pid}(?![0-9.])", "{pid}", value)
        if nspace in value:
            return None
        out[name] = value
    if fill(out, directory, port=int(port), pid=pid, nspace=nspace, rank=rank) != dict(env):
        return None
    return out


def fill(template: Mapping[str, str], directory: str, *, port: int, pid: int, nspace: str,
         rank: int) -> Dict[str, str]:
    return {name: value.format(dir=directory, port=port, pid=pid, nspace=nspace, rank=rank)
            for name, value in template.items()}


def retarget(env: Mapping[str, str], port: int) -> Dict[str, str]:
    """``env`` with ``port`` in its server URIs (a door's, before the server)."""
    out: Dict[str, str] = {}
    for name, value in env.items():
        uri = _uri(value)
        out[name] = uri[0] + str(port) if uri else value
    return out


def door_host(template: Mapping[str, str]) -> Optional[str]:
    """The address the server listened on (where its door must listen)."""
    for value in template.values():
        uri = _uri(value.replace("{port}", "0"))
        if uri:
            return uri[1]
    return None


def server_port(env: Mapping[str, str]) -> Optional[int]:
    """The port in a rank's variables' server URIs."""
    for value in env.values():
        uri = _uri(value)
        if uri:
            return int(uri[2])
    return None


def _identity(path: str) -> Optional[List[int]]:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns]


def loaded_path(name: str) -> Optional[str]:
    """Where the library ``name`` (a soname or a path) this process loaded is."""
    base = os.path.basename(name)
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            for line in f:
                path = line.rstrip("\n").split(None, 5)[-1]
                if path.startswith("/") and os.path.basename(path).startswith(base):
                    return path
    except OSError:
        pass
    return name if name.startswith("/") else None


#: Templates kept in one file (of different settings), the newest first.
KEPT = 4


def _entries(path: str) -> List[List[str]]:
    """The file's entries, each its lines: key, library, identity, variables."""
    try:
        with open(path, "rb") as f:
            text = f.read(1 << 20).decode("utf-8", "surrogateescape")
    except OSError:
        return []
    lines = text.split("\n")
    if not lines or lines[0] != MAGIC or lines[-1] != "":
        return []
    entries: List[List[str]] = []
    for line in lines[1:-1]:
        if line.startswith("key "):
            entries.append([line[4:]])
        elif entries:
            entries[-1].append(line)
    return entries


def save(path: str, key: str, template: Mapping[str, str], library: str,
         save_whole: Callable[[str, bytes], None]) -> None:
    """Keep ``template`` of the library loaded from ``library``, for ``key``, in the
    file ``path`` (with the others it holds)."""
    real = loaded_path(library)
    ident = _identity(real) if real else None
    if real is None or ident is None or "\n" in real:
        return
    entry = [key, real, f"{ident[0]} {ident[1]}"] + [f"{k}={v}" for k, v in
                                                      sorted(template.items())]
    entries = [entry] + [e for e in _entries(path) if e[0] != key][:KEPT - 1]
    lines = [MAGIC] + [line for e in entries for line in ["key " + e[0]] + e[1:]]
    save_whole(path, ("\n".join(lines) + "\n").encode("utf-8", "surrogateescape"))


def load(path: str, key: str) -> Optional[Tuple[Dict[str, str], str]]:
    """The template kept in ``path`` for ``key`` and its library's path, if that
    library has not changed since."""
    entry = next((e for e in _entries(path) if e[0] == key), None)
    if entry is None or len(entry) < 4:
        return None
    library, ident = entry[1], entry[2].split()
    env: Dict[str, str] = {}
    for line in entry[3:]:
        name, sep, value = line.partition("=")
        if not sep or not name:
            return None
        env[name] = value
    if (len(ident) != 2 or not all(x.isdigit() for x in ident)
            or _identity(library) != [int(x) for x in ident] or door_host(env) is None):
        return None
    try:
        fill(env, "", port=0, pid=0, nspace="", rank=0)
    except (KeyError, IndexError, ValueError):
        return None         # not a template of ours
    return env, library
