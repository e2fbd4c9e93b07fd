"""What torchrun's workers and mslaunch's get, compared: the worker program
that writes its environment (tests/programs/torch_env.py) and the rules by
which two environments are the same."""

from __future__ import annotations

import json
import os
import re
from typing import Dict, List

from helpers import program

ENV = program("torch_env.py")
UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
#: torchrun's worker variables whose value is random by design: compared by form.
RANDOM = ("MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE")
#: The one value mslaunch gives on purpose otherwise (docs/guides/torchrun.md):
#: worker rank 0 hosts the job's store, fresh in every attempt.
DIFFERENT = {"TORCHELASTIC_USE_AGENT_STORE": ("True", "False")}


def workers(where) -> List[dict]:
    """What torch_env.py's workers wrote into ``where``, by local rank."""
    rows = [json.loads((where / name).read_text()) for name in os.listdir(where)]
    return sorted(rows, key=lambda row: int(row["env"]["LOCAL_RANK"]))


def error_file_form(path: str, run_id: str) -> str:
    found = re.match(r"^/.+/(.+)_[a-z0-9_]{8}/(attempt_\d+/\d+/error\.json)$", path)
    assert found, path
    return ("<run id>" if found.group(1) == run_id else found.group(1)) + "/" + found.group(2)


def compare(theirs: dict, ours: dict, parent: Dict[str, str]) -> None:
    added = {k: v for k, v in theirs["env"].items() if parent.get(k) != v and k != "_"}
    assert "RANK" in added and "TORCHELASTIC_RUN_ID" in added
    for name, value in added.items():
        mine = ours["env"].get(name)
        assert mine is not None, f"{name} missing (torchrun: {value!r})"
        if name in DIFFERENT:
            assert (value, mine) == DIFFERENT[name]
        elif name == "MASTER_PORT":
            assert value.isdigit() and mine.isdigit()
        elif name == "TORCHELASTIC_RUN_ID":
            assert bool(UUID.match(value)) == bool(UUID.match(mine)), (value, mine)
            assert UUID.match(value) or value == mine
        elif name == "TORCHELASTIC_ERROR_FILE":
            assert error_file_form(value, theirs["env"]["TORCHELASTIC_RUN_ID"]) == \
                error_file_form(mine, ours["env"]["TORCHELASTIC_RUN_ID"])
        else:
            assert mine == value, f"{name}: torchrun {value!r}, mslaunch {mine!r}"
    assert theirs["argv"] == ours["argv"]
