"""Real MindSpore (its CPU wheel) in msrun-mode jobs: whether it is here, what its
workers print, and the failures of its own that a loaded machine shows."""

from __future__ import annotations

import importlib.util
import json

from requires import require


def need_mindspore() -> None:
    require(importlib.util.find_spec("mindspore") is not None,
            "MindSpore's CPU wheel (pip install mindspore==2.10.0 'numpy<2')")


def rows(text: str) -> list:
    """The JSON lines a worker printed (MindSpore's own log lines skipped)."""
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def mindspore_flake(console: str, logs: dict) -> bool:
    """A failure of MindSpore 2.10's own, seen now and then on a loaded 2-core
    machine: a worker that printed its result then crashed in MindSpore's
    teardown (SIGSEGV at interpreter exit), a worker whose registration with
    the scheduler never went through (the cluster's formation timed out), or a
    worker whose window to reach or register with the scheduler closed while
    the scheduler, started beside it, was still importing MindSpore (its log
    still empty: "Failed to connect to the meta server", or "Failed to register
    and try to reconnect to the meta server")."""
    printed = all(rows(logs.get(f"worker_{i}.log", "")) for i in range(2))
    return (printed and "(SIGSEGV)" in console) or \
        "Failed to initialize distributed job cluster" in console or \
        (("Failed to connect to the meta server" in console or
          "Failed to register and try to reconnect to the meta server" in console)
         and not logs.get("scheduler.log", "").strip())
