"""How much of mslaunch the launcher process runs through for one job.

    python bench/trace_launch.py [MSLAUNCH ARGS...]

Runs the ``mslaunch`` command in this process under ``sys.setprofile`` (its
threads too) and says, once it exits: the package's files and functions it
called, and how often the folder changed in the order the files were first
touched (a job that crosses the house back and forth changes folders often).
Run it from a checkout, with that checkout's package first on ``sys.path``
(``PYTHONPATH=.``); the numbers of two commits compare the shape of their
code, not their speed (``launch_overhead.py`` measures that).
"""

from __future__ import annotations

import os
import sys
import threading

files: set = set()
funcs: set = set()
order: list = []


def main() -> None:
    import mslaunch
    package = os.path.dirname(os.path.abspath(mslaunch.__file__))

    def profile(frame, event, arg):
        if event != "call":
            return
        path = frame.f_code.co_filename
        if not path.startswith(package):
            return
        rel = os.path.relpath(path, package)
        funcs.add((rel, frame.f_code.co_firstlineno, frame.f_code.co_name))
        if rel not in files:
            files.add(rel)
            order.append(os.path.dirname(rel) or ".")

    real_exit = os._exit

    def report(code: int) -> None:
        sys.setprofile(None)
        changes = sum(1 for a, b in zip(order, order[1:]) if a != b)
        sys.stderr.write(f"trace: {len(files)} files, {len(funcs)} functions, {changes} "
                         f"folder changes in the order of first touch\n")
        sys.stderr.flush()
        real_exit(code)

    os._exit = report           # the command ends with os._exit (mslaunch/__main__.py)
    sys.setprofile(profile)
    threading.setprofile(profile)
    sys.argv = ["mslaunch", *sys.argv[1:]]
    from mslaunch.__main__ import main as command
    code = command()
    report(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
