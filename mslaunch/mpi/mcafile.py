"""Open MPI's MCA parameter sources, parsed without reading anything.

A parameter file (``$HOME/.openmpi/mca-params.conf``, the installation's
``openmpi-mca-params.conf``, ``-tune`` and ``-am`` files) holds, one per line,
as Open MPI 4.1.4's reader takes them:

- ``name = value``: the value is the rest of the line with its outer white
  space removed, kept as written (a ``#`` after it or quotes are part of it);
- ``-mca name value`` or ``--mca name value`` (the command-line form);
- ``-x NAME[=VALUE]``: a variable for the ranks;
- ``#`` at the start of a line (after white space) comments it; blank lines are skipped.

The environment gives parameters as ``OMPI_MCA_name=value``.  Reading the
files is the caller's business: these functions take text and mappings.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple

from ..core.errors import UsageError, one_line

ENV_PREFIX = "OMPI_MCA_"

if TYPE_CHECKING:
    class Setting(NamedTuple):
        """One setting of a parameter file: an MCA parameter, or (``kind`` "x") a variable."""

        kind: str              # "mca" or "x"
        name: str
        value: Optional[str]   # None: ``-x NAME`` (copy the launcher's value)
        line: int
else:
    from collections import namedtuple
    Setting = namedtuple("Setting", "kind name value line")


def _name(text: str, where: str) -> str:
    if not text or any(c.isspace() or c in "=\0" for c in text):
        raise UsageError(f"{where}: bad MCA parameter name {one_line(text, 40)!r}")
    return text


def parse_param_file(text: str, origin: str) -> Tuple[Setting, ...]:
    """The settings in a parameter file's text; ``origin`` names it in errors (``FILE:LINE:``)."""
    out: List[Setting] = []
    for number, raw in enumerate(text.split("\n"), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{origin}:{number}"
        words = line.split()
        if words[0] in ("-mca", "--mca", "-gmca", "--gmca"):
            if len(words) < 3:
                raise UsageError(f"{where}: expected '{words[0]} NAME VALUE'")
            value = line.split(None, 2)[2]
            out.append(Setting("mca", _name(words[1], where), value, number))
        elif words[0] in ("-x", "--x"):
            if len(words) != 2:
                raise UsageError(f"{where}: expected '-x NAME[=VALUE]'")
            name, eq, value = words[1].partition("=")
            if not name or name[0].isdigit():
                raise UsageError(f"{where}: bad variable name {one_line(name, 40)!r}")
            out.append(Setting("x", name, value if eq else None, number))
        else:
            name, eq, value = line.partition("=")
            if not eq:
                raise UsageError(f"{where}: expected 'name = value', got {one_line(line, 40)!r}")
            out.append(Setting("mca", _name(name.strip(), where), value.strip(), number))
    return tuple(out)


def environment_params(environ: Mapping[str, str]) -> Tuple[Tuple[str, str], ...]:
    """``(name, value)`` of every ``OMPI_MCA_name`` variable, in the mapping's order."""
    n = len(ENV_PREFIX)
    return tuple((key[n:], value) for key, value in environ.items()
                 if key.startswith(ENV_PREFIX) and len(key) > n)


#: Open MPI's words for true and false (``mca_base_var_enum`` of booleans).
_TRUE = ("1", "t", "true", "enabled", "yes", "y")
_FALSE = ("0", "f", "false", "disabled", "no", "n")


def boolean(value: str) -> Optional[bool]:
    """Open MPI's reading of a boolean parameter; None if it is not one.

    An integer other than 0 is true, as there.
    """
    word = value.strip().lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    try:
        return int(word) != 0
    except ValueError:
        return None


def param_file_list(value: str) -> Tuple[str, ...]:
    """The files ``mca_base_param_files`` names (``:`` or ``,`` separated)."""
    return tuple(p for p in value.replace(",", ":").split(":") if p.strip())


def command_line_params(argv: Sequence[str]) -> Dict[str, str]:
    """``--mca NAME VALUE`` settings (``-mca``, ``--gmca``) written in ``argv``, by name
    (the last of a name wins)."""
    found: Dict[str, str] = {}
    for i, word in enumerate(argv[:-2]):
        if word in ("-mca", "--mca", "-gmca", "--gmca"):
            found[argv[i + 1]] = argv[i + 2]
    return found
