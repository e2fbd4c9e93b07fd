"""Files of command-line words: ``--app`` files, ``-tune`` files and ``-am`` MCA files.

Imported only when one of those options is given.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, List

    from ..core.spec import JobSpec
    from .draft import Draft

from ..core.errors import UsageError
from .draft import Context


def _tokens(path: str, what: str) -> List[List[str]]:
    """The lines of an appfile or tune file as lists of words.

    As Open MPI 4.1.4 reads them: split at white space, no quoting, ``#``
    starts a comment anywhere, blank lines skipped.
    """
    from ..hosts.hostfile import read_host_file
    text = read_host_file(path, what)
    return [words for words in (line.split("#", 1)[0].split() for line in text.split("\n"))
            if words]


def appfile(path: str, parse: Callable[..., JobSpec]) -> List[Context]:
    """``--app FILE``: one MPMD context per line, each read by ``parse`` like a
    command line (without the environment, which is the whole job's)."""
    contexts = []
    for number, words in enumerate(_tokens(path, "appfile"), 1):
        if any(w.lstrip("-") in ("launcher", "bootstrap", "launcher-exec", "bootstrap-exec",
                                 "bootstrap-exec-args") for w in words) or any(
                w.lstrip("-") == "mca" and words[i + 1:i + 2] == ["plm"]
                for i, w in enumerate(words)):
            # (parsed alone, it would be checked against no environment)
            raise UsageError(f"appfile {path}:{number}: how agents start is the whole "
                             f"job's choice: give --launcher (or --mca plm) on the command line")
        try:
            job = parse(words, environ={}, cwd=".", defaults=False)
        except UsageError as err:
            raise UsageError(f"appfile {path}:{number}: {err}") from None
        if len(job.apps) != 1:
            raise UsageError(f"appfile {path}:{number}: one program per line, without ':'")
        app = job.apps[0]
        ctx = Context()
        ctx.np, ctx.env, ctx.wdir, ctx.argv = app.np, list(app.env), app.wdir, list(app.argv)
        contexts.append(ctx)
    if not contexts:
        raise UsageError(f"appfile {path}: no program in it")
    return contexts


def option_file(d: Draft, name: str, flag: str, paths: List[str]) -> List[str]:
    """Apply the MCA settings of ``-tune`` or ``-am`` files to the draft (each
    named by file and line in errors); their ``-x`` settings as command-line words.

    Both take ``name = value``, ``--mca name value`` and ``-x NAME[=VALUE]``
    lines, as Open MPI 4.1.4's ``-tune`` does.  A ``--mca`` of the command line
    wins over a file's setting of the same name, wherever it is written, and so
    does an ``OMPI_MCA_*`` variable (for mpirun's parameters and the ranks' alike,
    as measured with Open MPI 4.1.4).
    """
    from ..mpi.mcafile import command_line_params, parse_param_file
    from .mca import apply_param
    what = "tune file" if name == "tune" else "MCA parameter file"
    words: List[str] = []
    given = set(command_line_params(d.argv))
    given.update(k[9:] for k in d.environ if k.startswith("OMPI_MCA_"))
    for path in paths:
        from ..hosts.hostfile import read_host_file
        for s in parse_param_file(read_host_file(path, what), f"{flag} {path}"):
            if s.kind == "x":
                words += ["-x", s.name if s.value is None else f"{s.name}={s.value}"]
            elif s.name not in given:
                apply_param(d, s.name, s.value or "", f"{flag} {path}:{s.line}: {s.name}")
                d.mca.append((s.name, s.value or ""))
    return words
