"""The rank handles that stand for ranks with processes of the launcher's own
(this machine's ranks, Open MPI's mpirun, srun's step and its looks) hear
nothing of the supervisor: they report through ``seams.RankEvents`` and hold
no supervisor (docs/design.md, "The seams, as protocols"), held on the
package's source.  A handle that named ``sup`` or ``JobView`` would have its
way back into the supervisor's policy again.  No module of the backends names
it either: they are lent a ``LaunchView`` (mslaunch.backends.backend); nor does
any of the job's MPI services (``mslaunch/serve``), lent a ``seams.ServedJob``,
nor any look inside the job (``mslaunch/inspect``), lent a ``seams.LookedAt``."""

from __future__ import annotations

import ast
import os
from typing import List

from helpers import REPO

#: (module, the handle classes in it).
HANDLES = (
    ("mslaunch/machine/local.py", ("LocalRanks",)),
    ("mslaunch/machine/child.py", ("ProcessHandle",)),
    ("mslaunch/backends/mpirun/openmpi.py", ("MpirunHandle",)),
    ("mslaunch/backends/srunsteps/srunranks.py", ("SrunRanks",)),
    ("mslaunch/backends/srunsteps/srunlook.py", ("Look",)),
)
#: What names the supervisor in a handle.
SUPERVISOR = {"sup", "JobView", "Supervisor"}


def named_supervisor(tree: ast.Module, classes) -> List[str]:
    """``Class:line`` of each name or attribute of the supervisor's in ``classes``
    (None: anywhere in the module, ``module:line``)."""
    found = []
    for cls in tree.body if classes is not None else [tree]:
        if classes is not None and not (isinstance(cls, ast.ClassDef) and cls.name in classes):
            continue
        for node in ast.walk(cls):
            name = (node.id if isinstance(node, ast.Name) else
                    node.attr if isinstance(node, ast.Attribute) else
                    node.arg if isinstance(node, ast.arg) else
                    node.name if isinstance(node, ast.alias) else
                    node.value if isinstance(node, ast.Constant)
                    and isinstance(node.value, str) and node.value.isidentifier() else None)
            if name in SUPERVISOR:
                where = cls.name if isinstance(cls, ast.ClassDef) else "module"
                found.append(f"{where}:{getattr(node, 'lineno', '?')}")
    return found


def test_the_rank_handles_report_through_events_and_hold_no_supervisor():
    for module, classes in HANDLES:
        with open(os.path.join(REPO, module), encoding="utf-8") as f:
            tree = ast.parse(f.read())
        present = {c.name for c in tree.body if isinstance(c, ast.ClassDef)}
        assert set(classes) <= present, f"{module}: {set(classes) - present} moved?"
        assert named_supervisor(tree, classes) == [], module


def _modules_name_no_supervisor(room: str) -> int:
    """How many modules under ``mslaunch/<room>`` were read, none naming the supervisor."""
    seen = 0
    for folder, _dirs, files in os.walk(os.path.join(REPO, "mslaunch", room)):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8") as f:
                    tree = ast.parse(f.read())
                seen += 1
                assert named_supervisor(tree, None) == [], os.path.relpath(path, REPO)
    return seen


def test_no_backend_module_names_the_supervisor():
    assert _modules_name_no_supervisor("backends") > 20     # (all of them were read)


def test_no_module_of_the_mpi_services_names_the_supervisor():
    assert _modules_name_no_supervisor("serve") >= 5


def test_no_look_inside_the_job_names_the_supervisor():
    assert _modules_name_no_supervisor("inspect") >= 5


def test_the_check_finds_a_supervisor_in_a_module():
    sample = ast.parse("from ..seams import JobView\n"
                       "def f(sup):\n"
                       "    return sup.plan\n")
    assert named_supervisor(sample, None) == ["module:1", "module:2", "module:3"]


def test_the_check_finds_a_supervisor_in_a_handle():
    sample = ast.parse(
        "class H:\n"
        "    def __init__(self, sup: 'JobView') -> None:\n"
        "        self.sup = sup\n"
        "    def start(self) -> None:\n"
        "        self.sup.rank_started(0, 1)\n"
        "class Other:\n"
        "    sup = None\n")
    assert sorted(named_supervisor(sample, ("H",))) == ["H:2", "H:2", "H:3", "H:3", "H:5"]
