"""The same program on every host: what ``PATH`` finds where mslaunch runs is what
runs on a remote host, when that path exists there.

A user who typed ``mslaunch -H h1,h2 python train.py`` in an activated virtual
environment means that environment's Python.  Over SSH the ranks get the
host's login ``PATH`` (Open MPI's rule), where ``python`` is the system's:
the job then fails on every rank (``No module named 'mpi4py'``), or worse,
runs without MPI.  So the launcher tells each agent where each program named
without a ``/`` was found here (:func:`found_here`), and the agent
(:func:`same_programs`):

- runs that path when this host's ``PATH`` finds another one and the path
  exists here (a shared or identical install): a Python by its full path (its
  ``sys.executable`` and so its environment come from how it was named), any
  other program with its name as typed; when the path is in the virtual (or
  conda) environment active where mslaunch runs, that environment's ``bin``
  goes first in ``PATH`` and ``VIRTUAL_ENV`` (``CONDA_PREFIX``) is set, as
  activating it would;
- says so, with both paths, when that path does not exist here: the ranks then
  run what this host's ``PATH`` finds, as Open MPI's would.

A program the user placed (``--prefix``, ``-path``, a ``/`` in its name) is
left alone, as is one this host's ``PATH`` finds at the same path.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Mapping, Optional, Sequence, Tuple

    from ..core.spec import RankSpec

from ..core.spec import replace

#: The variables that name an active environment, and its programs' folder.
ENVIRONMENTS = ("VIRTUAL_ENV", "CONDA_PREFIX")


def _placed(spec: RankSpec) -> bool:
    """Whether the user said where the program is, or mslaunch did (preload)."""
    return bool(spec.program or spec.path_prefix or spec.search or "/" in spec.argv[0])


def found_here(specs: Sequence[RankSpec], environ: Mapping[str, str]) -> Dict[str, object]:
    """The ``here`` field of a host's ``JOB`` frame: {"programs": {name: path},
    "env": [variable, folder]} of the programs of ``specs`` named without a ``/``."""
    from .spawn import find_program
    programs: Dict[str, str] = {}
    for spec in specs:
        name = spec.argv[0]
        if _placed(spec) or name in programs:
            continue
        path = find_program(name, spec.env if "PATH" in spec.env else environ, spec.cwd)
        if path is not None:
            programs[name] = os.path.normpath(os.path.join(spec.cwd, path))
    env: Optional[List[str]] = None
    for variable in ENVIRONMENTS:
        folder = environ.get(variable, "")
        if folder.startswith("/") and any(p.startswith(folder.rstrip("/") + "/bin/")
                                          for p in programs.values()):
            env = [variable, folder.rstrip("/")]
            break
    return {"programs": programs, "env": env}


def read_here(value: object) -> Dict[str, object]:
    """A frame's ``here`` checked (what :func:`found_here` makes), or empty."""
    if not isinstance(value, dict):
        return {"programs": {}, "env": None}
    programs, env = value.get("programs"), value.get("env")
    if not (isinstance(programs, dict) and all(
            isinstance(k, str) and isinstance(v, str) and v.startswith("/")
            for k, v in programs.items())):
        programs = {}
    if not (isinstance(env, list) and len(env) == 2 and env[0] in ENVIRONMENTS
            and isinstance(env[1], str) and env[1].startswith("/")):
        env = None
    return {"programs": programs, "env": env}


def same_programs(specs: Sequence[RankSpec], here: Mapping[str, object],
                  ) -> Tuple[List[RankSpec], List[str], List[str]]:
    """``specs`` (each with its whole environment on this host) running what runs
    where mslaunch does; with what was done (notes, for ``-v``) and what could not
    be (warnings)."""
    from .spawn import find_program
    programs: Mapping[str, str] = here.get("programs") or {}  # type: ignore[assignment]
    active: Optional[Sequence[str]] = here.get("env")  # type: ignore[assignment]
    out: List[RankSpec] = []
    notes: Dict[str, None] = {}
    warnings: Dict[str, None] = {}
    for spec in specs:
        name = spec.argv[0]
        wanted = programs.get(name)
        if wanted is None or _placed(spec):
            out.append(spec)
            continue
        found = find_program(name, spec.env, spec.cwd)
        there = os.path.normpath(os.path.join(spec.cwd, found)) if found else None
        if there == wanted:
            out.append(spec)
        elif os.access(wanted, os.X_OK) and not os.path.isdir(wanted):
            out.append(_switched(spec, wanted, active))
            notes[f"{name} is {wanted}, as where mslaunch runs (this host's PATH finds "
                  f"{there or 'none'})"] = None
        else:
            out.append(spec)
            if there is not None:
                warnings[f"{name} is {there} on this host, not {wanted} as where mslaunch "
                         f"runs, which is not here: the ranks run {there}; to run the same "
                         f"everywhere, install {wanted} on every host (or share it), or name "
                         f"a program every host has"] = None
    return out, list(notes), list(warnings)


def _switched(spec: RankSpec, path: str, active: Optional[Sequence[str]]) -> RankSpec:
    env = dict(spec.env)
    if active is not None and path.startswith(active[1] + "/bin/"):
        variable, folder = active
        if variable not in env:
            env[variable] = folder
        old = env.get("PATH")
        env["PATH"] = f"{folder}/bin" + (f":{old}" if old else "")
    if os.path.basename(spec.argv[0]).startswith("python"):
        # Python finds its prefix (and a virtual environment) from how it was named
        return replace(spec, argv=(path,) + tuple(spec.argv[1:]), env=env)
    return replace(spec, program=path, env=env)
