"""Files of command-line words: ``--app`` files, ``-tune`` files and ``-am`` MCA files.

Imported only when one of those options is given.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, List

    from ..spec import JobSpec

from ..errors import UsageError
from .draft import Context
from .options import split_option


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
            job = parse(words, environ={}, cwd=".")
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


def option_file(name: str, flag: str, paths: List[str]) -> List[str]:
    """The options that ``-tune`` files (command-line words) or ``-am`` files
    (``key = value`` MCA settings) hold, as command-line words."""
    words: List[str] = []
    for path in paths:
        for line in _tokens(path, "tune file" if name == "tune" else "MCA parameter file"):
            if name == "am":
                text = " ".join(line)
                key, eq, value = text.partition("=")
                if not eq or not key.strip():
                    raise UsageError(f"{flag} {path}: expected 'key = value' lines, "
                                     f"got {text[:40]!r}")
                words += ["--mca", key.strip(), value.strip()]
            else:
                words += line
    for w in words:
        if w.startswith("-") and split_option(w)[0] not in ("x", "mca", "env", "genv"):
            raise UsageError(f"{flag}: only -x and -mca belong in a tune file, not {w[:30]!r}")
    return words
