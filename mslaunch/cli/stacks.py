"""``mslaunch-stacks [JOB] [--json] [--timeout S]``: every rank's stacks, merged.

The job keeps running: Python ranks dump their own stacks, native frames are
read with a pause of milliseconds.  The report is one tree of call paths
whose branches carry rank ranges and hosts, innermost frames last, and names
the outliers (the ranks whose stacks differ from the biggest group's).
Exit status: 0, or 1 with one line when the job cannot be found or asked.
"""

from __future__ import annotations

import sys
from typing import List, Optional

from ..core.errors import LaunchError

USAGE = """\
usage: mslaunch-stacks [JOB] [--json] [--timeout SECONDS]

Print the stacks of every rank of a running mslaunch job, merged into one tree
labelled with rank ranges and hosts; the job keeps running.
  JOB               the launcher's pid (mslaunch -v prints it) or the job id
                    (kvs_...); default: this user's only job on this machine
  --json            the same report as JSON, for tools
  --timeout SECONDS how long every rank has to answer (default 10)
  --version         mslaunch's version
"""


def main(argv: Optional[List[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if "-h" in args or "--help" in args:
        sys.stdout.write(USAGE)
        return 0
    if "-V" in args or "--version" in args:
        from .. import __version__
        sys.stdout.write(f"mslaunch-stacks {__version__}\n")
        return 0
    as_json = "--json" in args
    args = [a for a in args if a != "--json"]
    timeout = 10.0
    try:
        if "--timeout" in args:
            at = args.index("--timeout")
            try:
                timeout = float(args[at + 1])
            except (IndexError, ValueError):
                raise LaunchError("--timeout needs a number of seconds") from None
            if not 0 < timeout <= 60:
                raise LaunchError("--timeout: between 0 and 60 seconds")
            del args[at:at + 2]
        if len(args) > 1 or (args and args[0].startswith("-")):
            raise LaunchError(f"unexpected {args[-1]!r} (see mslaunch-stacks --help)")
        from .attach import ask, find_job
        path, _ = find_job(args[0] if args else None)
        answer = ask(path, {"op": "stacks", "timeout": timeout}, timeout + 15)
    except LaunchError as err:
        sys.stderr.write(f"mslaunch-stacks: {err}\n")
        return 1
    if as_json:
        import json
        sys.stdout.write(json.dumps(answer, indent=1) + "\n")
        return 0
    from ..inspect.stacktree import from_json, render
    try:
        sys.stdout.write(render(from_json(answer)))
    except ValueError as err:
        sys.stderr.write(f"mslaunch-stacks: the job's answer is malformed: {err}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
