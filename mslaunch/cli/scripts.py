"""A program that is a script without its execute bit: run with its interpreter.

``mslaunch -n 2 hello.py`` is what a torchrun or msrun user types: both run
the script with Python.  mpirun would refuse it ("not found"), but nothing
else can be meant, so mslaunch runs it the way msrun's dialect does:

* a file whose first line is ``#!INTERPRETER [ARG]`` runs as
  ``INTERPRETER [ARG] FILE ARGS...``, as the kernel would run it were it
  executable (the interpreter must exist, else one error line says so);
* a ``.py`` file without ``#!`` runs as ``python FILE ARGS...`` with the
  ``python`` of the ranks' ``PATH`` (the active environment, as under
  msrun), else ``python3``.

An executable program is never touched, nor a file of any other kind (its
error says ``chmod +x``).  ``-v`` notes each rewrite.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import List, Mapping, Optional, Sequence, Tuple

from ..core.errors import UsageError
from ..machine.spawn import file_head, find_program


def _shebang(path: str) -> Optional[Tuple[str, ...]]:
    """The interpreter and its argument from a ``#!`` line (None: no such line)."""
    head = file_head(path)
    if head is None or not head.startswith(b"#!"):
        return None
    line = os.fsdecode(head[2:].split(b"\n", 1)[0]).strip()
    # Linux ends the interpreter at a space or a tab, and passes everything
    # after it as one argument.
    end = next((k for k, c in enumerate(line) if c in " \t"), len(line))
    interpreter, arg = line[:end], line[end:].strip(" \t")
    return (interpreter, arg) if arg else (interpreter,)


def _command(before: Optional[Sequence[str]], run: Sequence[str]) -> str:
    """The mslaunch command line to type: the options given, then ``run``."""
    import shlex
    options = " ".join(shlex.quote(w) for w in before) if before is not None else "[options]"
    return " ".join(["mslaunch", *([options] if options else []),
                     *(shlex.quote(w) for w in run)])


def interpreted(argv: Sequence[str], cwd: str, environ: Mapping[str, str],
                search: Sequence[str] = (),
                before: Optional[Sequence[str]] = None) -> Tuple[List[str], str]:
    """``argv`` with the interpreter put first when its program is a script that
    is not executable; and a note saying so ("" when unchanged).  ``before``:
    the options written before the program, for the command line an error
    proposes (None: unknown)."""
    program = argv[0]
    if find_program(program, environ, cwd, search) is not None:
        return list(argv), ""
    path = os.path.join(cwd, program)
    if not os.path.isfile(path):
        return list(argv), ""
    words = _shebang(path)
    # The file as the interpreter's argument: a name like "-v.py" is not an option.
    named = [os.path.join(".", program) if program.startswith("-") else program, *argv[1:]]
    if words is not None:
        if not words[0] or not os.access(words[0], os.X_OK) or os.path.isdir(words[0]):
            # the interpreter's name, found in PATH: "/opt/x/python3" or "/usr/bin/env python3"
            guess = os.path.basename(words[-1].split()[0] if words[0].endswith("/env") and
                                     len(words) > 1 else words[0]) or "sh"
            raise UsageError(f"program {program!r} is not executable, and the interpreter "
                             f"its '#!' line names ({words[0] or 'none'!r}) does not exist; "
                             f"name one: {_command(before, [guess, *argv])}")
        run = [*words, *named]
    elif program.endswith(".py"):
        python = next((p for p in ("python", "python3")
                       if find_program(p, environ, cwd) is not None), None)
        if python is None:
            raise UsageError(f"program {program!r} is not executable, and there is no python "
                             f"or python3 in PATH to run it with")
        run = [python, *named]
    else:
        return list(argv), ""
    shown = " ".join(run[:len(run) - len(argv) + 1])
    return run, f"{program} is not executable: running it as '{shown}', as msrun and torchrun do"
