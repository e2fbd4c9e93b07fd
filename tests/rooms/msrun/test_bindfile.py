"""msrun's ``--bind_numa`` JSON file (mslaunch/msrun/bindfile.py), fed random
content: each file is a binding or one error line, never another exception."""

from __future__ import annotations

import json
import os
import tempfile

from hypothesis import given, settings
from hypothesis import strategies as st

from mslaunch.cli.msrun import _map_form
from mslaunch.core.errors import UsageError
from mslaunch.msrun.bindfile import BindFile, read as read_file


def read(word):
    """The file as the msrun dialect reads it (its older form through the map form's parser)."""
    return read_file(word, lambda value: _map_form("bind_numa", value))

keys = st.sampled_from(["device0", "device_1", "device12", "scheduler", "gpu0", "device",
                        "device__2", "device-3", ""]) | st.text(max_size=8)
numbers = st.integers(-3, 70000) | st.sampled_from(["0", "0-3", "1,3", "3-1", "", ",", "x",
                                                    " 2 ", "0-65535"]) | st.text(max_size=6)
values = st.none() | st.booleans() | numbers | st.lists(numbers, max_size=3) | \
    st.dictionaries(st.sampled_from(["main", "other"]), st.none() | numbers, max_size=2)
configs = st.fixed_dictionaries({}, optional={
    "bind_config": st.none() | st.integers() | st.fixed_dictionaries({}, optional={
        "bind_cpu_mode": st.sampled_from(["cpu", "NUMA", "none", "bogus"]) | st.integers(),
        "bind_memory_mode": st.sampled_from(["numa", "none", "cpu"])}),
    "bind_cpu": st.dictionaries(keys, values, max_size=3) | st.integers(),
    "bind_memory": st.dictionaries(keys, values, max_size=3) | st.text(max_size=3),
}) | st.dictionaries(keys, values, max_size=3) | st.lists(st.integers(), max_size=2)


@settings(max_examples=300, deadline=None)
@given(configs)
def test_any_file_is_a_binding_or_one_error_line(config):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(config, f)
    try:
        try:
            bound = read(f.name)
        except UsageError as err:
            text = str(err)
            assert text.startswith("--bind_numa: ") and "\n" not in text
            return
        assert isinstance(bound, BindFile) and bound.path == f.name
        for table in (bound.cpu, bound.memory):
            for key, found in table:
                assert key == "scheduler" or (key.startswith("device") and key[6:].isdigit())
                assert found and all(isinstance(n, int) and n >= 0 for n in found)
    finally:
        os.unlink(f.name)


@given(st.binary(max_size=40))
def test_a_file_that_is_no_json_is_one_error_line(raw):
    with tempfile.NamedTemporaryFile("wb", suffix=".json", delete=False) as f:
        f.write(raw)
    try:
        try:
            read(f.name)
        except UsageError as err:
            assert "\n" not in str(err)
    finally:
        os.unlink(f.name)


def test_a_word_that_names_no_file_is_another_form():
    assert read("True") is None and read('{"device0": ["0"]}') is None
