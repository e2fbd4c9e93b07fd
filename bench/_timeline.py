"""Run mslaunch from a source tree, noting when it does what:
``python bench/_timeline.py TREE OUT ARGS...``.

The notes (seconds since the epoch) go to OUT as lines ``TIME WHAT DETAIL``,
written when mslaunch exits: ``main`` once this interpreter (and ``site``)
has started; ``import`` for each of mslaunch's modules, when it starts to be
imported; ``fork`` and ``spawn`` (``posix_spawn``, ``fork_exec``) for each
child, with the program; ``wait``, when the launcher waits for its
watchdog's move into the job's cgroup (its orphan guard's ``ready``,
wrapped here once that module is loaded), with how long in ms; ``exit``.  An audit hook takes them: it costs a
Python call per audited event, a few microseconds, the same for every tree.
"""

import sys
import time

MAIN = time.time()

import os  # noqa: E402

tree, out = sys.argv.pop(1), sys.argv.pop(1)
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
sys.path.insert(0, tree)
sys.argv[0] = "mslaunch"
notes = [(MAIN, "main", "")]
me = os.getpid()


def _waits(ready):
    """The guard's ``ready`` of this tree, noting how long the launcher waited there
    for its watchdog's move into the job's cgroup (``wait`` notes: its start, and
    its length in the detail)."""
    def noted(self):
        if self._answer < 0 or os.getpid() != me:
            return ready(self)
        begun = time.time()
        try:
            return ready(self)
        finally:
            notes.append((begun, "wait", f"{(time.time() - begun) * 1000:.3f}"))
    return noted


def _note(event, args):
    guard = sys.modules.get("mslaunch.machine.guard")
    if guard is not None and hasattr(guard, "Watchdog") and \
            not getattr(guard.Watchdog, "_noted", False):
        guard.Watchdog.ready = _waits(guard.Watchdog.ready)
        guard.Watchdog._noted = True
    if event == "import":
        if args[0].startswith("mslaunch"):
            notes.append((time.time(), "import", args[0]))
    elif event == "os.posix_spawn":
        notes.append((time.time(), "spawn", os.path.basename(str(args[0]))))
    elif event == "subprocess.Popen":
        notes.append((time.time(), "spawn", os.path.basename(str(args[0]))))
    elif event == "os.fork":
        notes.append((time.time(), "fork", ""))


def _write(code):
    if os.getpid() != me:          # (a fork of the launcher's: its watchdog, say)
        return
    notes.append((time.time(), "exit", str(code)))
    with open(out, "w") as f:
        f.writelines(f"{at:.6f} {what} {detail}\n" for at, what, detail in notes)


sys.addaudithook(_note)
_exit = os._exit


def _noted_exit(code):
    _write(code)
    _exit(code)


os._exit = _noted_exit
from mslaunch.__main__ import main  # noqa: E402 -- after the path is set

code = main()
_write(code)
sys.exit(code)
