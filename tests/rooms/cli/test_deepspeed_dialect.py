"""DeepSpeed's launcher lines: which lines are DeepSpeed's, its hostfile, and its
--include/--exclude filters read as DeepSpeed 0.19 reads them (compared with its
own functions on any pool and filter), each bad value one error line."""

from __future__ import annotations

import importlib.util
import os
import re
import time

import pytest
from hypothesis import given, settings, strategies as st

from mslaunch.cli import DIALECTS
from mslaunch.cli.deepspeed import hostfile_lines, read_line, resources
from mslaunch.core.errors import UsageError

from requires import require


def _dialect(argv):
    return next(name for name, whose, *_ in DIALECTS if whose(argv))


@pytest.mark.parametrize("argv, expected", [
    (["--num_gpus", "2", "train.py"], "deepspeed"),
    (["--hostfile", "hosts", "--include", "h1:0,1@h2", "train.py"], "deepspeed"),
    (["-H", "hosts", "--num_nodes=2", "train.py"], "deepspeed"),
    (["--master_port", "29501", "--no_local_rank", "train.py"], "deepspeed"),
    (["--launcher", "openmpi", "--hostfile", "h", "train.py"], "deepspeed"),
    (["--launcher", "ssh", "-n", "2", "x"], "mpirun"),        # mslaunch's own --launcher
    (["--launcher", "slurm", "-n", "2", "x"], "mpirun"),      # (Hydra's, and DeepSpeed's)
    (["--hostfile", "hosts", "-n", "2", "x"], "mpirun"),
    (["--master_port", "29501", "--nproc_per_node", "2", "x.py"], "torchrun"),
    (["-n", "1", "true"], "mpirun"),
    (["-H", "hf", "-i", "h1@h2", "train.py"], "deepspeed"),
    (["-e", "h1:0", "train.py"], "deepspeed"),
    (["--num_g", "2", "train.py"], "deepspeed"),              # (a unique start, as argparse)
    (["--incl=localhost:0", "train.py"], "deepspeed"),
    (["--no", "train.py"], "mpirun"),                         # (the start of several)
])
def test_a_line_s_dialect(argv, expected):
    assert _dialect(argv) == expected


def test_spellings_prefixes_short_names_and_the_script_s_words():
    given_, script = read_line(["-H", "hosts", "-i", "h1", "--num_g=2", "--force_m", "--",
                                "x.py", "--num_gpus", "5"])
    assert given_ == {"hostfile": "hosts", "include": "h1", "num_gpus": "2", "force_multi": "1"}
    assert script == ["x.py", "--num_gpus", "5"]


@pytest.mark.parametrize("call, message", [
    (lambda: read_line(["--num", "2", "x.py"]), "ambiguous option '--num'"),
    (lambda: read_line(["--module=1", "x.py"]), "--module takes no value"),
    (lambda: read_line(["--num_gpus"]), "--num_gpus: expected a value"),
    (lambda: read_line(["--num_gpus", "1"]), "no training script given"),
    (lambda: hostfile_lines(["h1 slots=2", "h1 slots=3"], "hf"), "hf:2: h1 is named twice"),
    (lambda: hostfile_lines(["# nothing"], "hf"), "hf: no 'HOST slots=N' line"),
    (lambda: resources([("h1", 2)], "h1", "h1"), "cannot both be given"),
    (lambda: resources([("h1", 2)], "h1:x", ""), "'x' is not a slot number"),
    (lambda: resources([("h1", 2)], ":0", ""), "a node spec has no host"),
])
def test_bad_values_are_one_line(call, message):
    with pytest.raises(UsageError, match=re.escape(message)):
        call()


def _env_of(words):
    return dict(w.split("=", 1) for w, x in zip(words[1:], words) if x == "-x")


def test_cuda_visible_devices_is_read_as_deepspeed_reads_it(monkeypatch, tmp_path):
    import mslaunch.cli.deepspeed as ds
    monkeypatch.setattr(ds, "local_devices", lambda: 4)
    monkeypatch.chdir(tmp_path)
    words = ds.mpirun_words({}, {"CUDA_VISIBLE_DEVICES": "2,3"}, str(tmp_path))
    assert words[:2] == ["-H", "localhost:2"]
    assert _env_of(words)["CUDA_VISIBLE_DEVICES"] == "2,3"
    # with a filter of the line, the variable is not read (DeepSpeed says so and drops it)
    words = ds.mpirun_words({"num_gpus": "1"}, {"CUDA_VISIBLE_DEVICES": "2,3"}, str(tmp_path))
    assert _env_of(words)["CUDA_VISIBLE_DEVICES"] == "0"


def test_one_remote_host_gets_what_deepspeed_exports_to_nodes(tmp_path):
    import mslaunch.cli.deepspeed as ds
    (tmp_path / "hf").write_text("h1 slots=2\n")
    words = ds.mpirun_words({"hostfile": str(tmp_path / "hf"), "master_addr": "10.0.0.1"},
                            {"PYTHONFOO": "1", "HOME": str(tmp_path)}, str(tmp_path))
    env = _env_of(words)
    assert env["PYTHONFOO"] == "1" and env["PYTHONPATH"] == str(tmp_path)


def test_a_deepspeed_env_file_is_judged_by_what_was_opened_not_by_its_name(tmp_path):
    # Another user swaps the launch directory's .deepspeed_env between a link to a
    # trusted (empty) file and a link to theirs while it is judged and read: what
    # is read is what was judged, never their LD_PRELOAD.
    import threading
    import mslaunch.cli.deepspeed as ds
    require(os.geteuid() == 0, "root, to give a file to another user")
    theirs = tmp_path / "theirs"
    theirs.write_text("LD_PRELOAD=/tmp/x.so\n")
    os.chown(theirs, 65534, 65534)
    empty = tmp_path / "empty"
    empty.write_text("")
    launch = tmp_path / "launch"
    launch.mkdir()
    name = launch / ".deepspeed_env"
    name.symlink_to(empty)
    done = threading.Event()

    def swap() -> None:
        while not done.is_set():
            for target in (theirs, empty):
                (launch / "next").symlink_to(target)
                os.rename(launch / "next", name)

    swapper = threading.Thread(target=swap, daemon=True)
    swapper.start()
    seen = {"refused": 0, "empty": 0, "theirs": 0}
    try:
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            try:
                got = ds.deepspeed_env({"HOME": str(tmp_path / "nohome")}, str(launch))
            except UsageError:
                seen["refused"] += 1
                continue
            seen["theirs" if got else "empty"] += 1
    finally:
        done.set()
        swapper.join(10)
    assert seen["theirs"] == 0 and seen["refused"] and seen["empty"], seen


def test_a_deepspeed_env_file_another_user_may_write_is_refused(tmp_path):
    import mslaunch.cli.deepspeed as ds
    (tmp_path / ".deepspeed_env").write_text("LD_PRELOAD=/tmp/x.so\n")
    (tmp_path / ".deepspeed_env").chmod(0o666)
    with pytest.raises(UsageError, match="another user owns it or may write it"):
        ds.deepspeed_env({"HOME": str(tmp_path / "nohome")}, str(tmp_path))
    (tmp_path / ".deepspeed_env").chmod(0o644)
    assert ds.deepspeed_env({}, str(tmp_path)) == [("LD_PRELOAD", "/tmp/x.so")]


def test_the_filters_of_deepspeed_s_help():
    pool = [("worker-0", 4), ("worker-1", 4)]
    assert resources(pool, "worker-0@worker-1:0,2", "") == [("worker-0", [0, 1, 2, 3]),
                                                            ("worker-1", [0, 2])]
    assert resources(pool, "", "worker-1:0") == [("worker-0", [0, 1, 2, 3]),
                                                 ("worker-1", [1, 2, 3])]
    assert resources(pool, "", "worker-0") == [("worker-1", [0, 1, 2, 3])]


HOSTS = st.sampled_from(["h1", "h2", "h3", "worker-0"])
SPEC = st.builds(lambda host, slots: host + (":" + ",".join(map(str, slots)) if slots else ""),
                 HOSTS, st.lists(st.integers(0, 4), max_size=3))
FILTER = st.lists(SPEC, min_size=1, max_size=3).map("@".join)
POOL = st.dictionaries(HOSTS, st.integers(1, 4), min_size=1)


@settings(max_examples=300, deadline=None)
@given(POOL, FILTER, st.booleans())
def test_a_filter_leaves_what_deepspeed_s_own_leaves(pool, text, include):
    require(importlib.util.find_spec("deepspeed") is not None,
            "DeepSpeed (pip install deepspeed==0.19.8)")
    from deepspeed.launcher.runner import parse_inclusion_exclusion
    try:
        theirs = list(parse_inclusion_exclusion(pool, text if include else "",
                                                "" if include else text).items())
    except ValueError:
        theirs = None
    try:
        mine = resources(list(pool.items()), text if include else "", "" if include else text)
    except UsageError as err:
        assert "\n" not in str(err)
        mine = None
    assert mine == theirs


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(max_size=30) | st.sampled_from(["h1 slots=2", "# c", "", "h2 slots=x",
                                                        "h1 slots=1 extra"]), max_size=6))
def test_any_hostfile_is_read_or_refused_in_one_line_naming_it(lines):
    try:
        pool = hostfile_lines(lines, "hf")
    except UsageError as err:
        assert str(err).startswith("hf") and "\n" not in str(err)
    else:
        assert pool and len({host for host, _ in pool}) == len(pool)


def test_no_other_dialect_s_option_is_taken_for_a_start_of_a_deepspeed_one():
    from mslaunch.cli.common import (DEEPSPEED_ONLY, MSRUN_EXTRAS, MSRUN_OPTIONS,
                                     TORCHRUN_OPTIONS, deepspeed_name)
    from mslaunch.cli.options import SPELLINGS
    others = {s for s in SPELLINGS if len(s) > 1} | {n for n, _, _ in TORCHRUN_OPTIONS} | \
        set(MSRUN_OPTIONS + MSRUN_EXTRAS)
    assert not [o for o in others if deepspeed_name(o) in DEEPSPEED_ONLY]
    # nor any start of msrun's and torchrun's, which their dialects take by a start too
    prefixed = {n for n, _, _ in TORCHRUN_OPTIONS} | set(MSRUN_OPTIONS + MSRUN_EXTRAS)
    starts = {o[:k] for o in prefixed for k in range(2, len(o) + 1)}
    assert not [o for o in starts if deepspeed_name(o) in DEEPSPEED_ONLY]


def test_without_a_hostfile_master_addr_is_this_machine_s_as_deepspeed_has_it(monkeypatch,
                                                                              tmp_path):
    import mslaunch.cli.deepspeed as ds
    monkeypatch.setattr(ds, "local_devices", lambda: 2)
    words = ds.mpirun_words({"master_addr": "10.1.2.3"}, {}, str(tmp_path))
    assert _env_of(words)["MASTER_ADDR"] == "127.0.0.1"
    (tmp_path / "hf").write_text("localhost slots=2\n")
    words = ds.mpirun_words({"master_addr": "10.1.2.3", "hostfile": str(tmp_path / "hf")}, {},
                            str(tmp_path))
    assert _env_of(words)["MASTER_ADDR"] == "10.1.2.3"


def test_mpi_runners_across_nodes_start_workers_without_local_rank():
    from mslaunch.cli.deepspeed import MPI_RUNNERS, worker_command
    for launcher in MPI_RUNNERS:
        assert worker_command({"launcher": launcher}, ["t.py", "a"], many=True)[1] == -1
        # on one node DeepSpeed's launch.py starts them, whatever --launcher says
        assert worker_command({"launcher": launcher}, ["t.py", "a"], many=False)[1] == 3
    assert worker_command({"launcher": "pdsh"}, ["t.py"], many=True)[1] == 3


def test_this_machine_named_twice_in_the_hostfile_is_one_error_line(tmp_path):
    import mslaunch.cli.deepspeed as ds
    (tmp_path / "hf").write_text("localhost slots=2\n127.0.0.1 slots=2\n")
    with pytest.raises(UsageError, match="localhost, 127.0.0.1 are all this machine"):
        ds.mpirun_words({"hostfile": str(tmp_path / "hf")}, {}, str(tmp_path))
