"""Which command lines are torchrun's, and torchrun's options read with its
spellings, its PET_ defaults, and one error line for each bad value."""

from __future__ import annotations

import os
import re

import pytest
from hypothesis import given, settings as hsettings, strategies as st

from mslaunch.cli import DIALECTS
from mslaunch.cli.torchjob import endpoint, nnodes, nproc, rdzv_conf, streams, visible_gpus
from mslaunch.cli.torchrun import is_torchrun, read_line, settings
from mslaunch.core.errors import UsageError

from helpers import one_error_line, run


def _dialect(argv, environ=None):
    import os
    saved = dict(os.environ)
    try:
        os.environ.clear()
        os.environ.update(environ or {})
        return next(name for name, whose, *_ in DIALECTS if whose(argv))
    finally:
        os.environ.clear()
        os.environ.update(saved)


@pytest.mark.parametrize("argv, expected", [
    (["-n", "2", "x"], "mpirun"),
    (["-mca", "btl", "tcp", "-n", "1", "x"], "mpirun"),
    (["-rf", "ranks", "-n", "1", "x"], "mpirun"),
    (["--max-restarts", "2", "-n", "2", "x"], "mpirun"),
    (["--report-json", "r.json", "-n", "1", "x"], "mpirun"),
    (["x.py"], "mpirun"),
    (["--worker_num=2", "--local_worker_num=2", "--master_addr=h", "x.py"], "msrun"),
    (["--master_addr", "h", "--worker_num", "2", "x.py"], "msrun"),
    (["--nproc-per-node", "2", "x.py"], "torchrun"),
    (["--nproc_per_node=2", "--nnodes=1", "x.py"], "torchrun"),
    (["--node-rank", "0", "x.py"], "torchrun"),
    (["--max-restarts", "2", "--standalone", "x.py"], "torchrun"),
    (["-m", "pkg.train"], "torchrun"),
    (["-r3", "x.py"], "torchrun"),
    (["--node_rank=0", "--master_addr=h", "x.py"], "torchrun"),    # refused there: whose?
    (["--nproc-per-nod", "2", "x.py"], "torchrun"),      # a unique prefix, first in the line
    (["--nproc_p=2", "x.py"], "torchrun"),
    (["--use-env", "--nproc_per_node=2", "x.py"], "torchrun"),  # torch.distributed.launch's
    (["--use_env", "x.py"], "torchrun"),
    (["--np", "2", "x"], "mpirun"),                      # whole spellings stay mpirun's
    (["--n", "2", "x"], "mpirun"),
])
def test_a_line_s_dialect(argv, expected):
    assert _dialect(argv) == expected


def test_a_pytorchjob_s_line_is_torchrun_s():
    assert _dialect(["train.py"], {"PET_NPROC_PER_NODE": "2"}) == "torchrun"
    assert is_torchrun(["train.py"], {"PET_NNODES": "1"})
    assert not is_torchrun(["-n", "2", "train.py"], {"PET_NNODES": "1"})


def test_spellings_prefixes_and_the_script_s_words():
    given_, rest = read_line(["--nproc_per_node", "2", "--rdzv-id=a", "--stand", "-r3", "--",
                              "x.py", "--nproc-per-node", "5"])
    assert given_ == {"nproc_per_node": "2", "rdzv_id": "a", "standalone": "1",
                      "redirects": "3"}
    assert rest == ["x.py", "--nproc-per-node", "5"]
    assert read_line(["--nproc", "2", "x.py"])[0] == {"nproc_per_node": "2"}


def test_the_other_dialects_whole_spellings_that_begin_a_torchrun_name_are_theirs():
    from mslaunch.cli.common import MSRUN_EXTRAS, MSRUN_OPTIONS, NOT_PREFIXES, TORCHRUN_OPTIONS
    from mslaunch.cli.options import SECTIONS
    torchrun = [name for name, _, _ in TORCHRUN_OPTIONS]
    others = {name.replace("-", "_") for _, options in SECTIONS for option in options
              for name in option.names} | set(MSRUN_OPTIONS + MSRUN_EXTRAS)
    begins = {name for name in others - set(torchrun)
              if any(t.startswith(name) for t in torchrun)}
    assert begins == set(NOT_PREFIXES)


def test_pet_variables_are_defaults_and_the_line_wins():
    values = settings({"nnodes": "1"}, {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "4",
                                        "PET_STANDALONE": "", "PET_MODULE": "0"})
    assert values["nnodes"] == "1" and values["nproc_per_node"] == "4"
    assert values["standalone"] == "1" and values["module"] == "0"
    assert values["rdzv_id"] == "none" and values["master_port"] is None
    with pytest.raises(UsageError, match="PET_STANDALONE=yes: expected 1 or 0"):
        settings({}, {"PET_STANDALONE": "yes"})


@pytest.mark.parametrize("call, message", [
    (lambda: nnodes("3:2"), "MIN (3) is above MAX (2)"),
    (lambda: nnodes("0"), "expected a whole number from 1"),
    (lambda: nnodes("1:2:3"), "expected N or MIN:MAX"),
    (lambda: nproc("0"), "from 1"),
    (lambda: nproc("many"), "expected a number, cpu, gpu, xpu or auto"),
    (lambda: nproc("gpu"), "no GPU on this machine"),
    (lambda: streams("redirects", "5"), "expected 0, 1, 2 or 3"),
    (lambda: streams("tee", "0:4"), "expected 0, 1, 2 or 3"),
    (lambda: rdzv_conf("join_timeout"), "join_timeout has no value"),
    (lambda: rdzv_conf("read_timeout=-1"), "expected seconds above 0"),
    (lambda: rdzv_conf("join_timeout=\u0663"), "join_timeout=\u0663: expected seconds above 0"),
    (lambda: rdzv_conf("join_timeout=2e9"), "expected seconds above 0 (1e9 at most)"),
    (lambda: rdzv_conf("=5"), "--rdzv-conf: =5 has no key"),
    (lambda: endpoint("h1:99999", 29400), "expected HOST[:PORT]"),
    (lambda: read_line(["--nope", "x.py"]), "unknown torchrun option '--nope'"),
    (lambda: read_line(["--rdzv", "h", "x.py"]), "ambiguous option"),
    (lambda: read_line(["--nproc-per-node"]), "expected a value"),
    (lambda: read_line(["--standalone=1", "x.py"]), "takes no value"),
    (lambda: read_line(["--standalone"]), "no training script given"),
])
def test_bad_values_are_one_line(call, message):
    with pytest.raises(UsageError, match=re.escape(message)):
        call()


@pytest.mark.parametrize("present, visible, count", [
    (8, None, 8), (8, "", 0), (8, "-1", 0), (8, "0,1", 2), (8, "3, 1", 2),
    (8, "0,9,1", 1),            # CUDA stops at the first entry that names no device
    (8, "1,1", 0), (8, "0,00", 0),  # a device named twice: none (torch on an H100: 0,0)
    (2, "GPU-6f1e,MIG-ab", 2), (1, "0,1", 1), (0, "0", 0), (8, "x", 0),
])
def test_gpu_workers_are_the_gpus_cuda_visible_devices_leaves(present, visible, count):
    assert visible_gpus(present, visible) == count


def test_no_visible_gpu_is_one_line_naming_cuda_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(UsageError, match=re.escape("no GPU visible (CUDA_VISIBLE_DEVICES='')")):
        nproc("gpu")


def test_the_longest_timeout_is_taken():
    assert rdzv_conf("join_timeout=1e9,,bogus=1") == {"join_timeout": "1e9", "bogus": "1"}


def test_torch_distributed_launch_s_argument_for_a_script_that_declares_it(tmp_path,
                                                                           monkeypatch):
    from mslaunch.cli.torchjob import worker_command
    base = settings({}, {})
    (tmp_path / "both.py").write_text('p.add_argument("--local-rank", "--local_rank")\n')
    (tmp_path / "old.py").write_text("p.add_argument('--local_rank', type=int)\n")
    (tmp_path / "new.py").write_text("import os; os.environ['LOCAL_RANK']\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "train.py").write_text('ap.add_argument("--local_rank")\n')
    monkeypatch.chdir(tmp_path)

    def argv(script, **changes):
        return list(worker_command({**base, **changes}, [script, "a"], {})[2:])

    assert argv("both.py") == ["both.py", "--local-rank=${local_rank}", "a"]
    assert argv("old.py") == ["old.py", "--local_rank=${local_rank}", "a"]
    assert argv("new.py") == ["new.py", "a"]
    assert argv("both.py", use_env="1") == ["both.py", "a"]
    assert argv("pkg.train", module="1") == ["-m", "pkg.train", "--local_rank=${local_rank}",
                                             "a"]
    assert argv("missing.py") == ["missing.py", "a"]
    os.mkfifo(tmp_path / "fifo.py")                # (read, it would block the launcher)
    assert argv("fifo.py") == ["fifo.py", "a"]
    assert worker_command({**base, "no_python": "1"}, ["both.py"], {}) == ("both.py",)


def test_every_value_is_read():
    assert nproc("cpu") >= 1 and nproc("3") == 3
    assert nnodes("2") == (2, 2) and nnodes("1:4") == (1, 4)
    assert streams("tee", "3") == ((-1, 3),) and streams("tee", "0:1,12:3") == ((0, 1), (12, 3))
    assert endpoint("h1", 29400) == ("h1", 29400) and endpoint("[::1]:5", 1) == ("::1", 5)
    assert rdzv_conf(" join_timeout = 5 ,is_host=1") == {"join_timeout": "5", "is_host": "1"}


@pytest.mark.parametrize("argv, message", [
    (["--node_rank=0", "--master_addr=h", "x.py"], "both msrun's and torchrun's; say which"),
    (["--nproc-per-node=2", "--worker_num=2", "x.py"],
     "msrun dialect: unknown option '--nproc-per-node=2'"),
    (["--nnodes=1:2", "--nproc-per-node=2", "x.py"], "elastic membership needs "
                                                      "--rdzv-backend=c10d"),
    (["--nnodes=3:2", "--nproc-per-node=2", "x.py"], "MIN (3) is above MAX (2)"),
    (["--nproc-per-node=1", "--rdzv-backend=etcd", "x.py"], "not served by mslaunch"),
    (["--nproc-per-node=1", "--rdzv-backend=zk", "x.py"], "expected static or c10d"),
    (["--nproc-per-node=1", "-m", "--no-python", "x"], "cannot both be given"),
    (["--nproc-per-node=1", "--node-rank=1", "x.py"], "--node-rank=1"),
    (["--nproc-per-node=1", "--logs-specs=mine", "x.py"], "not served by mslaunch"),
])
def test_refused_lines_get_one_error_line(argv, message):
    done = run(*argv)
    assert done.returncode == 2
    assert message in one_error_line(done.stderr)


WORDS = st.sampled_from(["--nproc-per-node", "--nnodes", "--standalone", "-r", "-t", "-m",
                         "--rdzv-conf", "--rdzv_endpoint", "--", "--log-dir", "--stand",
                         "--max-restarts", "=", "1:2", "0", "x.py", "-r9", "--tee=1:3",
                         "--nproc=2", "", "\x00", "--node-rank=-1"])


@hsettings(max_examples=300, deadline=None)
@given(st.lists(WORDS | st.text(max_size=8), max_size=8))
def test_any_line_is_read_or_refused_in_one_error(argv):
    try:
        given_, _rest = read_line(argv)
        values = settings(given_, {})
        nnodes(values["nnodes"])
        streams("redirects", values["redirects"])
        streams("tee", values["tee"])
        rdzv_conf(values["rdzv_conf"])
    except UsageError as err:
        assert "\n" not in str(err)
