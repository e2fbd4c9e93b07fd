"""Every state of mslaunch is named (docs/design.md, "States and frames"), held on
the package's source.

- No ``.state``, ``.ending`` or ``.phase`` is compared with a word written out, nor
  set to one: the words are ``core/states.py``'s constants (a door's, a kernel
  letter's: their module's), whose ``Literal`` types the checker holds.
- A remote host's state changes in ``RemoteHost._become`` alone, a node's (msrun's and
  torchrun's nodes) in the node service's ``_Peer.become`` and ``NodeLink._become``,
  and a job's ending in ``Supervisor._end_as`` alone (each says the change in
  ``-v``; the supervisor's base, ``LookingInside``, calls it too), but for the
  first value each is given in ``__init__``; no object's ``.state`` or
  ``.ending`` is set from outside it.
"""

from __future__ import annotations

import ast
import os
from typing import Iterator, List, Tuple

from helpers import REPO

PACKAGE = os.path.join(REPO, "mslaunch")
NAMED = ("state", "ending", "phase")
#: (attribute, the class whose objects carry it, the one method that changes it).
ONE_WAY = (("state", "RemoteHost", "_become"), ("ending", "Supervisor", "_end_as"),
           ("ending", "LookingInside", "_end_as"), ("state", "_Peer", "become"),
           ("state", "NodeLink", "_become"))


def _modules() -> Iterator[Tuple[str, ast.Module]]:
    for root, _dirs, files in os.walk(PACKAGE):
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(root, name)
                with open(path, encoding="utf-8") as f:
                    yield os.path.relpath(path, REPO), ast.parse(f.read(), path)


def _words(node: ast.AST) -> bool:
    """Whether ``node`` is a string written out, or a tuple, list or set holding one."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_words(e) for e in node.elts)
    return False


def _named(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr in NAMED


def words_for_states(tree: ast.Module) -> List[int]:
    """The lines where a named state meets a word written out."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_named(s) for s in sides) and any(_words(s) for s in sides):
                lines.append(node.lineno)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            flat = [e for t in targets for e in (t.elts if isinstance(t, ast.Tuple) else [t])]
            value = node.value
            values = value.elts if isinstance(value, ast.Tuple) else [value]
            if any(_named(t) for t in flat) and any(v is not None and _words(v)
                                                     for v in values):
                lines.append(node.lineno)
    return lines


def changes_elsewhere(tree: ast.Module, attr: str, owner: str, method: str) -> List[int]:
    """The lines of class ``owner`` where ``self.ATTR`` is set outside ``method``
    and ``__init__``."""
    lines = []
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        if cls.name != owner:
            continue
        for fn in (n for n in ast.walk(cls) if isinstance(n, ast.FunctionDef)):
            if fn.name in (method, "__init__"):
                continue
            for node in ast.walk(fn):
                targets = (node.targets if isinstance(node, ast.Assign) else
                           [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign))
                           else [])
                for t in targets:
                    for e in (t.elts if isinstance(t, ast.Tuple) else [t]):
                        if isinstance(e, ast.Attribute) and e.attr == attr \
                                and isinstance(e.value, ast.Name) and e.value.id == "self":
                            lines.append(node.lineno)
    return lines


def set_from_outside(tree: ast.Module, attrs=("state", "ending")) -> List[int]:
    """The lines where another object's ``.state`` or ``.ending`` is set (``x.state =``,
    ``x`` not ``self``)."""
    lines = []
    for node in ast.walk(tree):
        targets = (node.targets if isinstance(node, ast.Assign) else
                   [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else [])
        for t in targets:
            for e in (t.elts if isinstance(t, ast.Tuple) else [t]):
                if isinstance(e, ast.Attribute) and e.attr in attrs and not (
                        isinstance(e.value, ast.Name) and e.value.id == "self"):
                    lines.append(node.lineno)
    return lines


def test_no_state_is_a_word_written_out():
    found = [f"{path}:{line}" for path, tree in _modules() for line in words_for_states(tree)]
    assert found == [], "compare and set states with core/states.py's constants: " + \
        ", ".join(found)


def test_a_host_s_state_and_a_job_s_ending_change_in_one_method_each():
    owners = {owner for _attr, owner, _method in ONE_WAY}
    seen = set()
    found = []
    for path, tree in _modules():
        for cls in ast.walk(tree):
            if isinstance(cls, ast.ClassDef) and cls.name in owners:
                seen.add(cls.name)
        for attr, owner, method in ONE_WAY:
            found += [f"{path}:{line} ({owner}.{attr})"
                      for line in changes_elsewhere(tree, attr, owner, method)]
    assert seen == owners, f"classes not found: {owners - seen}"
    assert found == [], "outside the one method: " + ", ".join(found)


def test_no_object_s_state_or_ending_is_set_from_outside_it():
    found = [f"{path}:{line}" for path, tree in _modules() for line in set_from_outside(tree)]
    assert found == [], "set through the object's one method: " + ", ".join(found)


def test_the_checks_see_what_they_forbid():
    sample = ast.parse(
        "class RemoteHost:\n"
        "    def __init__(self):\n"
        "        self.state = NEW\n"
        "    def _become(self, s):\n"
        "        self.state = s\n"
        "    def start(self):\n"
        "        if self.state == 'ready':\n"            # 7
        "            self.state = RUNNING\n"             # 8
        "        if h.state in (READY, 'done'):\n"       # 9
        "            self.phase, x = 'over', 1\n"        # 10
        "        if self.ending is None and ok:\n"
        "            pass\n")
    assert words_for_states(sample) == [7, 9, 10]
    assert changes_elsewhere(sample, "state", "RemoteHost", "_become") == [8]
    outside = ast.parse("peer.state = HELD\n"
                        "self.state = HELD\n"
                        "a, p.ending = 1, SIGNAL\n"
                        "p.phase = OVER\n")
    assert set_from_outside(outside) == [1, 3]
