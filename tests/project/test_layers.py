"""The package's imports point down its layers (docs/design.md), with no cycle.

Every import of an mslaunch module counts: at the top of a file, inside a
function, or under ``TYPE_CHECKING``.  The layers, lowest first, are the
ranks below; a module may import from its own rank or a lower one, and the
subpackages of one rank must not import each other in a circle.
"""

from __future__ import annotations

import ast
import os
from typing import Dict, List, Set, Tuple

import pytest

from helpers import REPO

PACKAGE = os.path.join(REPO, "mslaunch")

#: The rooms of mslaunch (a top-level module or subpackage, or a subpackage given
#: a layer of its own), by layer.  A module belongs to the longest room that holds it.
RANKS: Dict[str, float] = {
    # records, errors, named states, small pure modules
    "mslaunch": 0, "core": 0,
    # the Python API's calls, both ends (they start the command; they import nothing)
    "api": 0,
    # pure parsers and the pure planner; the ranks' own side
    "hosts": 1, "plan": 1, "rankenv": 1,
    # the mechanisms of one machine
    "machine": 2,
    # what the rooms above see of the running job (type checkers only), and the
    # supervisor's book of its ranks, which those that look at ranks read
    "seams": 2.5, "rankbook": 2.5,
    # the MPI services of one host
    "mpi": 3,
    # the link between the launcher and its agents, both ends
    "wire": 4,
    # how a job's MPI is served across its hosts
    "serve": 4.5,
    # the agent; the ways ranks start
    "agent": 5, "backends": 5,
    # looking inside a running job
    "inspect": 6,
    # running a job: attempts, the supervisor, the report
    "run": 7,
    # msrun's nodes, built on it
    "msrun": 8,
    # the dialects
    "cli": 9, "__main__": 9,
}


def _module_name(path: str) -> str:
    rel = os.path.relpath(path, REPO)[:-3].replace(os.sep, ".")
    return rel[:-len(".__init__")] if rel.endswith(".__init__") else rel


def _targets(path: str, module: str) -> Set[str]:
    """The mslaunch modules (or packages) that a file imports, anywhere in it."""
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    found: Set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "mslaunch")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1])
                name = f"{base}.{node.module}" if node.module else base
            else:
                name = node.module or ""
            if name.split(".")[0] != "mslaunch":
                continue
            for alias in node.names:
                sub = os.path.join(REPO, *f"{name}.{alias.name}".split("."))
                found.add(f"{name}.{alias.name}"
                          if os.path.exists(sub + ".py") or os.path.isdir(sub) else name)
    return found


def _imports() -> Dict[str, Set[str]]:
    edges: Dict[str, Set[str]] = {}
    for folder, dirs, files in os.walk(PACKAGE):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                module = _module_name(path)
                edges[module] = _targets(path, module) - {module}
    return edges


def _group(module: str) -> str:
    parts = module.split(".")[1:]
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in RANKS:
            return ".".join(parts[:n])
    return parts[0] if parts else "mslaunch"


def _cycle(graph: Dict[str, Set[str]]) -> List[str]:
    """One cycle of ``graph`` as a list of nodes, or [] when it has none."""
    state: Dict[str, int] = {}
    stack: List[str] = []

    def visit(node: str) -> List[str]:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return []

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return []


def test_every_part_of_the_package_has_a_layer():
    groups = {_group(m) for m in _imports()}
    assert groups - set(RANKS) == set(), "a new module or subpackage: give it a layer here"


def test_imports_point_down():
    upward: List[Tuple[str, str]] = []
    for module, targets in sorted(_imports().items()):
        for target in sorted(targets):
            if RANKS.get(_group(target), 99) > RANKS.get(_group(module), -1):
                upward.append((module, target))
    assert upward == []


def test_no_cycle_between_subpackages_or_files():
    edges = _imports()
    groups: Dict[str, Set[str]] = {}
    for module, targets in edges.items():
        groups.setdefault(_group(module), set()).update(
            _group(t) for t in targets if _group(t) != _group(module))
    assert _cycle(groups) == []
    # Files: an import of a package means its __init__, which imports none of its files
    # here unless it says so itself.
    assert _cycle(edges) == []


@pytest.mark.parametrize("graph, has_cycle", [
    ({"a": {"b"}, "b": {"c"}, "c": set()}, False),
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, True),
    ({"a": {"a"}}, True),
])
def test_the_cycle_finder_finds_cycles(graph, has_cycle):
    assert bool(_cycle(graph)) is has_cycle
