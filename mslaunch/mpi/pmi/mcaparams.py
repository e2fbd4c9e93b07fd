"""The MCA parameters an Open MPI rank will find set, before it starts.

A rank's Open MPI takes each parameter from the first source that sets it:
its environment (``OMPI_MCA_name``), then the "tune" files that
``mca_base_envar_file_prefix`` names, then its parameter files -- those
``mca_base_param_files`` names, else the user's
``$HOME/.openmpi/mca-params.conf`` before the installation's
``openmpi-mca-params.conf`` (Open MPI 4.1.4 ``mca_base_var.c``: files read
right to left, so that the leftmost wins).  Which installation a rank runs
is not known before it starts, so the installation's file is looked for
where installations keep it: Debian's and Ubuntu's ``/etc/openmpi``, a
source build's default ``/usr/local/etc``, and ``$OPAL_PREFIX/etc``.

Each file is read and parsed once per process; a line Open MPI would skip
hides no other.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Mapping, Optional

#: Installations' own parameter files, where they are usually found.
SYSTEM_PARAM_FILES = ("/etc/openmpi/openmpi-mca-params.conf",
                      "/usr/local/etc/openmpi-mca-params.conf")

#: The text of each file read so far, by path ("" for one that cannot be read).
_TEXT: Dict[str, str] = {}
#: The settings of each file parsed so far, by path (name -> value, first wins).
_READ: Dict[str, Dict[str, str]] = {}


def files_read(env: Mapping[str, str]) -> List[str]:
    """The files a rank with environment ``env`` reads its parameters from, the
    one that wins first."""
    files = [p for p in env.get("OMPI_MCA_mca_base_envar_file_prefix", "").split(",") if p]
    named = [p for p in env.get("OMPI_MCA_mca_base_param_files", "").replace(",", ":")
             .split(":") if p.strip()]
    if named:
        return files + named
    home = env.get("HOME") or os.environ.get("HOME") or "/"
    files.append(os.path.join(home, ".openmpi", "mca-params.conf"))
    files.extend(SYSTEM_PARAM_FILES)
    if env.get("OPAL_PREFIX"):
        files.append(os.path.join(env["OPAL_PREFIX"], "etc", "openmpi-mca-params.conf"))
    return files


def file_text(path: str) -> str:
    """A parameter file's text (read once per process), "" if it cannot be read."""
    text = _TEXT.get(path)
    if text is None:
        try:
            with open(path, encoding="utf-8", errors="surrogateescape") as f:
                text = f.read(1 << 20)
        except OSError:
            text = ""         # as Open MPI, which reads what it can
        _TEXT[path] = text
    return text


def file_settings(path: str) -> Dict[str, str]:
    """The MCA parameters a parameter file sets (parsed once per process)."""
    known = _READ.get(path)
    if known is None:
        known = _READ[path] = _parse(file_text(path), path)
    return known


def _parse(text: str, path: str) -> Dict[str, str]:
    lines = [line for line in text.split("\n")
             if line.strip() and not line.lstrip().startswith("#")]
    if not lines:
        return {}             # most installations' files: comments only
    found: Dict[str, str] = {}
    for line in lines:
        # the plain 'name = value' of most files, read as mcafile reads it,
        # without importing it (every job reads these files)
        name, eq, value = line.strip().partition("=")
        name = name.strip()
        if eq and name and not name.startswith("-") and not any(
                c.isspace() or c == "\0" for c in name):
            found.setdefault(name, value.strip())
            continue
        from ...core.errors import UsageError
        from ..mcafile import parse_param_file
        try:
            settings = parse_param_file(line, path)
        except UsageError:
            continue
        for s in settings:
            if s.kind == "mca" and s.value is not None:
                found.setdefault(s.name, s.value)
    return found


def from_files(env: Mapping[str, str], name: str) -> Optional[str]:
    """The value the parameter files of a rank with environment ``env`` give
    parameter ``name`` (its environment comes before them), None if none does."""
    for path in files_read(env):
        value = file_settings(path).get(name)
        if value is not None:
            return value
    return None


def names_set(env: Mapping[str, str], mentioning: str = "") -> List[str]:
    """Every parameter a rank with environment ``env`` finds set, by name; with
    ``mentioning``, a file whose text does not hold it is not parsed (nor its
    parameters named): the parser's imports are spared where no file could matter."""
    names = [k[len("OMPI_MCA_"):] for k in env if k.startswith("OMPI_MCA_")]
    for path in files_read(env):
        if mentioning in file_text(path):
            names.extend(file_settings(path))
    return names
