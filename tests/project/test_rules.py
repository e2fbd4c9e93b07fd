"""The test suite's own rules (CONTRIBUTING, "Under load"), held on its source.

- A test module imports no other test module, nor conftest: what several
  modules share lives in ``tests/support`` (helpers, test beds, stand-ins), and
  fixtures in conftest.py.
- A test waits for the event it needs, never for a while: no ``time.sleep`` (nor
  a ``threading.Timer``) in a test module but the few below, each a duration
  that is itself what the test exercises (a pause, a slow reader, a stall), or
  a wait for an event mslaunch does not show yet.  Sleeps in the programs that
  tests run as ranks (strings, and tests/programs) are the ranks' business.
"""

from __future__ import annotations

import ast
import os
from typing import Dict, Iterator, List, Tuple

from helpers import TESTS

#: (module, function) -> (how many sleeps, why each is no wait for an event).
SLEEPS: Dict[Tuple[str, str], Tuple[int, str]] = {
    ("test_hostile", "test_a_non_blocking_stdout_is_waited_on_and_gets_every_byte"):
        (1, "a slow reader of mslaunch's non-blocking stdout: the fault"),
    ("test_hostile", "attack"):
        (1, "the pace of idle connections opened against the PMI port: the attack"),
    ("test_hostile", "test_processes_that_clear_their_environment_do_not_escape"):
        (1, "WAITS FOR A PRODUCT CHANGE: without a cgroup the watchdog notes what the "
            "launcher adopted every 0.25 s and says nothing when it has"),
    ("test_dialproof", "test_an_agent_started_early_waits_for_the_launcher_to_answer"):
        (1, "the launcher busy planning for 12 s, longer than an agent's old read timeout: "
            "the fault"),
    ("test_restart_hosts", "test_a_pause_of_the_launcher_is_not_blamed_on_the_hosts"):
        (1, "the launcher stopped for 2.5 s, longer than a restartable job's heartbeat: "
            "the fault"),
    ("test_restart_hosts", "test_ctrl_z_of_the_launcher_stops_the_remote_ranks_and_fg_goes_on"):
        (1, "Ctrl-Z for 6 s, longer than the 5 s heartbeat: the fault"),
    ("test_restart_hosts", "test_ctrl_z_waits_until_every_agent_has_heard_it"):
        (1, "an agent that cannot hear the Ctrl-Z for 3 s: the fault"),
    ("test_restart_hosts",
     "test_a_pause_of_the_launcher_longer_than_its_agents_wait_leaves_no_host_out"):
        (1, "the launcher stopped for 32 s, longer than its waiting agents wait: the fault"),
    ("test_splice", "read"):
        (2, "slow readers of mslaunch's stdout: the fault"),
    ("test_splice", "send"):
        (1, "a sender's bytes in pieces, now and then: the fault"),
    ("test_srun_ranks", "test_output_held_back_by_a_slow_reader_is_all_read_after_the_ranks_end"):
        (1, "nobody reads mslaunch's output across three of its looks after srun's end: "
            "the fault"),
    ("test_stall", "test_stall_report_names_the_stuck_rank_once_and_the_job_goes_on"):
        (1, "the stall goes on after its report: the fault"),
    ("test_stall", "test_a_rank_waiting_for_the_input_mslaunch_forwards_is_not_stalled"):
        (1, "nobody types for four stall periods: the situation under test"),
}


def _python_files() -> Iterator[str]:
    for top, dirs, files in os.walk(TESTS):
        dirs[:] = sorted(d for d in dirs if d not in ("__pycache__", "programs", "data"))
        for name in sorted(files):
            if name.endswith(".py"):
                yield os.path.join(top, name)


def _test_modules() -> Iterator[str]:
    return (p for p in _python_files()
            if os.path.basename(p).startswith("test_"))


def _parse(path: str) -> ast.Module:
    with open(path, encoding="utf-8") as f:
        return ast.parse(f.read(), path)


def _imported(tree: ast.Module) -> Iterator[Tuple[int, str]]:
    """(line, top-level module name) of every import, dynamic ones with a literal name too."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module.split(".")[0]
        elif isinstance(node, ast.Call) and node.args and \
                isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) \
                else ""
            if name in ("__import__", "import_module"):
                yield node.lineno, node.args[0].value.split(".")[0]


def test_no_module_of_the_tests_imports_a_test_module_or_conftest():
    found = [f"{os.path.relpath(path, TESTS)}:{line}: {name}"
             for path in _python_files() for line, name in _imported(_parse(path))
             if name.startswith("test_") or name == "conftest"]
    assert found == [], "move what they share to tests/support (fixtures: conftest.py)"


def _sleeps(tree: ast.Module) -> Iterator[Tuple[int, str]]:
    """(line, enclosing function) of each call of time.sleep, time's sleep imported by
    name, or threading.Timer."""
    time_names = {"time"}
    sleep_names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            time_names |= {a.asname or a.name for a in node.names if a.name == "time"}
        elif isinstance(node, ast.ImportFrom) and node.module == "time":
            sleep_names |= {a.asname or a.name for a in node.names if a.name == "sleep"}
        elif isinstance(node, ast.ImportFrom) and node.module == "threading":
            sleep_names |= {a.asname or a.name for a in node.names if a.name == "Timer"}

    def visit(node: ast.AST, function: str) -> Iterator[Tuple[int, str]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield from visit(child, child.name)
                continue
            if isinstance(child, ast.Call):
                f = child.func
                if (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name)
                        and ((f.attr == "sleep" and f.value.id in time_names)
                             or (f.attr == "Timer" and f.value.id == "threading"))) \
                        or (isinstance(f, ast.Name) and f.id in sleep_names):
                    yield child.lineno, function
            yield from visit(child, function)
    yield from visit(tree, "<module>")


def test_tests_wait_for_events_not_for_a_while():
    counts: Dict[Tuple[str, str], List[int]] = {}
    for path in _test_modules():
        module = os.path.basename(path)[:-3]
        for line, function in _sleeps(_parse(path)):
            counts.setdefault((module, function), []).append(line)
    unexpected = {f"{m}.{f}: lines {lines}" for (m, f), lines in counts.items()
                  if len(lines) > SLEEPS.get((m, f), (0, ""))[0]}
    assert unexpected == set(), \
        "wait for the event the sleep stands for (helpers.wait_for, read_until, ...)"
    # and the list says what is there: an entry whose sleep has gone goes with it
    stale = {key for key, (n, _) in SLEEPS.items() if len(counts.get(key, [])) != n}
    assert stale == set()


def test_the_rules_see_what_they_forbid():
    """The two checks above find what they look for (a rule that cannot fail is none)."""
    tree = ast.parse("import time\nfrom time import sleep as nap\nimport test_remote\n"
                     "from conftest import x\n__import__('test_slurm')\n"
                     "def test_x():\n    time.sleep(1)\n    nap(1)\n"
                     "    def inner():\n        threading.Timer(1, f)\n"
                     "    'time.sleep(1)'\n")
    assert [name for _, name in _imported(tree)] == ["time", "time", "test_remote", "conftest",
                                                     "test_slurm"]
    assert sorted(_sleeps(tree)) == [(7, "test_x"), (8, "test_x"), (10, "inner")]
