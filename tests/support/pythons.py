"""The Python versions the package promises, and where their interpreters are.

The promises are read from the project itself: the oldest and the newest
version the package supports (setup.cfg's ``python_requires`` and its
``Programming Language :: Python :: 3.N`` classifiers), and the oldest a
remote host may have (the agent bootstrap's version check).  An interpreter
is looked for as ``pythonX.Y`` on ``PATH``, in /usr/bin and /usr/local/bin,
and in pyenv's versions (``$PYENV_ROOT``, ``~/.pyenv``, /root/.pyenv), and is
taken only when it runs and says it is that version.

    python3 tests/support/pythons.py claims    # "3.9 3.13 3.8": oldest, newest, host floor
    python3 tests/support/pythons.py 3.9       # the interpreter's path; exit 1 if none
"""

from __future__ import annotations

import configparser
import glob
import os
import re
import shutil
import subprocess
import sys
from typing import List, Optional, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def package_versions() -> Tuple[str, str]:
    """(oldest, newest) Python the package claims."""
    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(REPO, "setup.cfg"))
    floor = re.fullmatch(r">=\s*(3\.\d+)", cfg["options"]["python_requires"].strip())
    assert floor, "setup.cfg: python_requires is not '>=3.N'"
    listed = re.findall(r"Programming Language :: Python :: (3\.\d+)\s*$",
                        cfg["metadata"]["classifiers"], re.M)
    newest = max(listed, key=lambda v: int(v.split(".")[1]))
    return floor.group(1), newest


def host_floor() -> str:
    """The oldest Python a remote host may have: the agent bootstrap's check."""
    with open(os.path.join(REPO, "mslaunch", "backends", "agents", "bootstrap.py")) as f:
        found = re.search(r"sys\.version_info < \(3, (\d+)\)", f.read())
    assert found, "mslaunch/backends/agents/bootstrap.py: no version check found"
    return f"3.{found.group(1)}"


def candidates(version: str) -> List[str]:
    name = f"python{version}"
    places = [shutil.which(name), f"/usr/bin/{name}", f"/usr/local/bin/{name}"]
    roots = [os.environ.get("PYENV_ROOT", ""), os.path.expanduser("~/.pyenv"), "/root/.pyenv"]
    for root in filter(None, roots):
        places += sorted(glob.glob(os.path.join(root, "versions", f"{version}.*", "bin", name)),
                         reverse=True)
    return [p for p in dict.fromkeys(places) if p and os.access(p, os.X_OK)]


def find(version: str) -> Optional[str]:
    """A working interpreter of ``version`` (such as "3.9"), or None."""
    for path in candidates(version):
        try:
            r = subprocess.run([path, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                               capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if r.returncode == 0 and r.stdout.strip() == version:
            return path
    return None


def main(argv: List[str]) -> int:
    if argv == ["claims"]:
        print(*package_versions(), host_floor())
        return 0
    if len(argv) == 1 and re.fullmatch(r"3\.\d+", argv[0]):
        path = find(argv[0])
        if path is None:
            return 1
        print(path)
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
