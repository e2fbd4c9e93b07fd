"""mslaunch.launch(fn, *args, nprocs=...): a function on every rank, each rank's
return value back in rank order, side by side with torch's elastic_launch on
the same function; the first failure raised with its rank and host; restarts;
hosts over SSH; and the frames that carry the values, taken out of the output
whole whatever the output around them."""

from __future__ import annotations

import importlib.util
import subprocess
import textwrap

import pytest
from hypothesis import given, settings, strategies as st

from helpers import PROGRAMS, PY, clean_env, new_tag, all_gone, tagged_pids
from mslaunch.api import Frames, frame_lines, PIECE
from requires import require


def _python(code: str, cwd, timeout: float = 120, **env: str) -> subprocess.CompletedProcess:
    """``code`` run by a fresh interpreter that imports mslaunch and fncalls."""
    header = f"import sys; sys.path.insert(0, {PROGRAMS!r})\nimport mslaunch, fncalls\n"
    return subprocess.run([PY, "-c", header + textwrap.dedent(code)], capture_output=True,
                          timeout=timeout, cwd=str(cwd), env=clean_env(**env))


def _lines(r: subprocess.CompletedProcess):
    return r.stdout.decode().splitlines()


def test_the_return_values_in_rank_order_where_elastic_launch_gives_a_dict(tmp_path):
    require(importlib.util.find_spec("torch") is not None, "torch (pip install torch==2.13.0)")
    r = _python("""
        import json, uuid
        from torch.distributed.launcher.api import LaunchConfig, elastic_launch
        config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=2, run_id=str(uuid.uuid4()),
                              rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0)
        if __name__ == "__main__":
            print("torch", json.dumps(elastic_launch(config, fncalls.times_ten)(7), sort_keys=True))
            print("mslaunch", json.dumps(mslaunch.launch(fncalls.times_ten, 7, nprocs=2)))
            print("torch gloo", json.dumps(elastic_launch(config, fncalls.gloo_sum)(),
                                           sort_keys=True))
            print("mslaunch gloo", json.dumps(mslaunch.launch(fncalls.gloo_sum, nprocs=2)))
    """, tmp_path)
    assert r.returncode == 0, r.stderr.decode()[-3000:]
    said = _lines(r)
    assert 'torch {"0": 70, "1": 71}' in said and "mslaunch [70, 71]" in said, said
    assert 'torch gloo {"0": 1.0, "1": 1.0}' in said and "mslaunch gloo [1.0, 1.0]" in said
    # each rank's line passed on, once (torch's workers' too), and no frame byte
    assert said.count("rank 0 of 2 says hi") == 2 and said.count("rank 1 of 2 says hi") == 2
    assert b"\x1e" not in r.stdout


def test_a_function_of_the_script_itself_and_its_guard(tmp_path):
    script = tmp_path / "main.py"
    script.write_text(textwrap.dedent("""
        import os, sys
        import mslaunch
        print("top of the script, in", os.environ.get("RANK", "the caller"), flush=True)
        def square(x):
            return x * x + int(os.environ["RANK"])
        if __name__ == "__main__":
            print(mslaunch.launch(square, 3, nprocs=3), sys.argv[1:])
    """))
    r = subprocess.run([PY, str(script), "a", "b"], capture_output=True, timeout=120,
                       cwd=str(tmp_path), env=clean_env())
    assert r.returncode == 0, r.stderr.decode()
    said = _lines(r)
    assert said[-1] == "[9, 10, 11] ['a', 'b']", said
    # every rank ran the script's top as __mp_main__, as multiprocessing's spawn does
    assert sorted(said[:-1]) == ["top of the script, in 0", "top of the script, in 1",
                                 "top of the script, in 2", "top of the script, in the caller"]


def test_the_first_failure_is_raised_with_its_rank_and_host(tmp_path):
    r = _python("""
        try:
            mslaunch.launch(fncalls.fail_in, 1, nprocs=3)
        except KeyError as err:
            cause = err.__cause__
            print("raised", repr(err), type(cause).__name__, cause.rank, cause.status,
                  cause.host == __import__("os").uname().nodename)
            print("note", err.__notes__ if hasattr(err, "__notes__") else "")
            print("traceback", "fncalls.py" in cause.traceback)
    """, tmp_path)
    assert r.returncode == 0, r.stderr.decode()
    said = _lines(r)
    assert "raised KeyError('no such key in rank 1') RankFailed 1 1 True" in said, said
    assert "traceback True" in said
    err = r.stderr.decode()
    assert "KeyError: 'no such key in rank 1'" in err and "mslaunch: rank 1 (pid" in err


@pytest.mark.parametrize("how, status, says", [
    ("3", 3, "exited with code 3"), ("None, 9", 137, "killed by signal 9"),
    ("", 1, "raised fncalls.Unpicklable: holds a handle")])
def test_a_rank_that_raised_nothing_it_can_send_raises_rank_failed(tmp_path, how, status, says):
    call = "fncalls.unpicklable, 0" if not how else f"fncalls.fail_in, 0, {how}"
    r = _python(f"""
        try:
            mslaunch.launch({call}, nprocs=2)
        except mslaunch.RankFailed as err:
            print("failed", err.rank, err.status, "|", err)
    """, tmp_path)
    assert r.returncode == 0, r.stderr.decode()
    (said,) = [line for line in _lines(r) if line.startswith("failed")]
    assert said.startswith(f"failed 0 {status} |") and says in said, said


def test_restarts_give_the_last_attempt_s_values(tmp_path):
    r = _python("""
        print(mslaunch.launch(fncalls.flaky, 1, nprocs=2, max_restarts=1))
        try:
            mslaunch.launch(fncalls.flaky, 1, nprocs=2)
        except RuntimeError as err:
            print("no restart:", err)
    """, tmp_path)
    assert r.returncode == 0, r.stderr.decode()
    assert _lines(r)[-2:] == ["[1, 1]", "no restart: the first attempt fails"], _lines(r)


def test_large_values_and_partial_lines_from_every_rank_at_once(tmp_path):
    size = 3 * PIECE + 17
    r = _python(f"""
        values = mslaunch.launch(fncalls.big, {size}, nprocs=4)
        print()
        print([(len(v), v[:1]) for v in values] == [({size}, bytes([n])) for n in range(4)])
    """, tmp_path)
    assert r.returncode == 0, r.stderr.decode()
    out = r.stdout.decode()
    assert out.endswith("\nTrue\n"), out[-500:]
    for rank in range(4):
        assert f"partial line of rank {rank} without a newline" in out
    assert "\x1e" not in out


def test_a_script_s_own_classes_and_a_module_run_with_python_m(tmp_path):
    """Values of classes defined in the caller's script (pickled on the ranks as
    __mp_main__'s), and a caller started with python -m, as spawn finds them."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "helper.py").write_text("def half(x):\n    return x / 2\n")
    (tmp_path / "pkg" / "job.py").write_text(textwrap.dedent("""
        import dataclasses, os
        import mslaunch
        from .helper import half
        @dataclasses.dataclass
        class Point:
            x: float
        def where():
            return Point(half(int(os.environ["RANK"])))
        if __name__ == "__main__":
            print(mslaunch.launch(where, nprocs=2))
    """))
    r = subprocess.run([PY, "-m", "pkg.job"], capture_output=True, timeout=120,
                       cwd=str(tmp_path), env=clean_env())
    assert r.returncode == 0, r.stderr.decode()
    assert r.stdout.decode().splitlines()[-1] == "[Point(x=0.0), Point(x=0.5)]"


def test_what_a_call_takes_from_the_script_is_found_there_as_spawn_finds_it(tmp_path):
    """The caller's script runs on every rank even when the function is a module's:
    an argument of the script's class, a partial of the script's function, and a
    launch nested in a rank find it; python -m pkg with a function of its
    __main__ (relative imports kept); a zip file on sys.path."""
    import zipfile
    with zipfile.ZipFile(tmp_path / "deps.zip", "w") as z:
        z.writestr("zmod.py", "import os\ndef f():\n    return 'zip ' + os.environ['RANK']\n")
    script = tmp_path / "main.py"
    script.write_text(textwrap.dedent(f"""
        import functools, os, sys
        sys.path.insert(0, {PROGRAMS!r})
        sys.path.insert(0, {str(tmp_path / "deps.zip")!r})
        import mslaunch, fncalls, zmod
        class Point:
            def __init__(self, x):
                self.x = x
        def add(a, b):
            return a + b
        def inner():
            return int(os.environ["RANK"]) * 10
        def outer():
            return mslaunch.launch(inner, nprocs=2)
        if __name__ == "__main__":
            print([p.x for p in mslaunch.launch(fncalls.echo, Point(3), nprocs=2)])
            print(mslaunch.launch(functools.partial(add, 1), 2, nprocs=2))
            print(mslaunch.launch(outer, nprocs=1))
            print(mslaunch.launch(zmod.f, nprocs=2))
            print("__mp_main__" in sys.modules)
    """))
    r = subprocess.run([PY, str(script)], capture_output=True, timeout=180, cwd=str(tmp_path),
                       env=clean_env())
    assert r.returncode == 0, r.stderr.decode()[-3000:]
    assert _lines(r)[-5:] == ["[3, 3]", "[3, 3]", "[[0, 10]]", "['zip 0', 'zip 1']", "False"]
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "__init__.py").write_text("")
    (tmp_path / "app" / "util.py").write_text("def double(x):\n    return 2 * x\n")
    (tmp_path / "app" / "__main__.py").write_text(textwrap.dedent("""
        import os
        import mslaunch
        from .util import double
        def job():
            return double(int(os.environ["RANK"]))
        if __name__ == "__main__":
            print(mslaunch.launch(job, nprocs=2))
    """))
    r = subprocess.run([PY, "-m", "app"], capture_output=True, timeout=120, cwd=str(tmp_path),
                       env=clean_env())
    assert r.returncode == 0, r.stderr.decode()[-3000:]
    assert _lines(r)[-1] == "[0, 2]"


def test_the_failure_s_line_is_the_exception_s_and_rank_failed_pickles(tmp_path):
    r = _python("""
        import pickle
        try:
            mslaunch.launch(fncalls.noted, nprocs=1)
        except ValueError as err:
            print("cause:", err.__cause__)
        back = pickle.loads(pickle.dumps(mslaunch.RankFailed("x", rank=1, host="h", status=3)))
        print("back:", back, back.rank, back.host, back.status)
    """, tmp_path)
    assert r.returncode == 0, r.stderr.decode()
    assert _lines(r)[-2:] == ["cause: rank 0 on " + __import__("os").uname().nodename
                              + " raised ValueError: the real message", "back: x 1 h 3"]


def test_without_a_stdout_the_values_still_come_back(tmp_path):
    r = subprocess.run([PY, "-c", f"import sys; sys.path.insert(0, {PROGRAMS!r})\n"
                        "import mslaunch, fncalls\n"
                        "sys.stderr.write(repr(mslaunch.launch(fncalls.times_ten, 1, nprocs=2)))"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=120,
                       cwd=str(tmp_path), env=clean_env(), pass_fds=(),
                       preexec_fn=lambda: __import__("os").close(1))
    assert r.returncode == 0, r.stderr.decode()[-3000:]
    assert r.stderr.decode().endswith("[10, 11]"), r.stderr.decode()[-3000:]


@pytest.mark.parametrize("how", ["run", "launch"])
def test_a_job_ends_with_its_caller_killed(tmp_path, how):
    # (torch's workers die with their parent too: mslaunch's command ends its job)
    import os
    import signal
    from helpers import wait_for
    tag = new_tag()
    (tmp_path / "up").mkdir()
    call = (f"mslaunch.launch(fncalls.sleeper, {str(tmp_path / 'up')!r}, nprocs=2)"
            if how == "launch" else
            f"mslaunch.run(['-n', '2', 'sh', '-c', 'touch {tmp_path / 'up'}/$RANK; "
            f"exec sleep 600'])")
    p = subprocess.Popen([PY, "-c", f"import sys; sys.path.insert(0, {PROGRAMS!r})\n"
                          f"import mslaunch, fncalls\n{call}"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=str(tmp_path),
                         env=clean_env(MSL_TEST_TAG=tag))
    try:
        assert wait_for(lambda: len(os.listdir(tmp_path / "up")) == 2, 120)
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=30)
        assert all_gone(tag, 30), tagged_pids(tag)
    finally:
        p.kill()
        from helpers import kill_tagged
        kill_tagged(tag)


def test_what_cannot_be_sent_is_one_clear_error_before_any_rank_starts(tmp_path):
    r = _python("""
        for call in (lambda: mslaunch.launch(lambda: 1, nprocs=2),
                     lambda: mslaunch.launch(fncalls.where, open(__file__ if False else "/dev/null")),
                     lambda: mslaunch.launch(fncalls.where, b"x" * 2_000_000),
                     lambda: mslaunch.launch(fncalls.where, 1, nprocs=0),
                     lambda: mslaunch.launch(fncalls.where, 1, options="-v")):
            try:
                call()
            except (TypeError, ValueError) as err:
                print(type(err).__name__, err)
    """, tmp_path)
    assert r.returncode == 0, r.stderr.decode()
    said = _lines(r)
    assert len(said) == 5, said
    assert "has no name the ranks can find it by" in said[0] and "cloudpickle" in said[0]
    assert "the arguments cannot be pickled" in said[1]
    assert "pass a path to the data instead" in said[2]
    assert said[3] == "ValueError nprocs=0: expected a whole number from 1"
    assert said[4].startswith("TypeError options: a list of words")


@pytest.mark.remote
def test_a_function_on_ssh_hosts(sshbed, tmp_path):
    home = sshbed.make_home(tmp_path / "home")
    tag = new_tag()
    r = _python("""
        print(mslaunch.launch(fncalls.where, "t", nprocs=4, hosts=["h1:2", "h2:2"]))
        try:
            mslaunch.launch(fncalls.fail_in, 3, hosts="h1:2,h2:2", nprocs=4)
        except KeyError as err:
            print("raised by", err.__cause__.rank, "on", err.__cause__.host)
    """, tmp_path, HOME=home, MSL_TEST_TAG=tag)
    assert r.returncode == 0, r.stderr.decode()
    assert _lines(r)[-2:] == ["[('t', 0, 0), ('t', 1, 1), ('t', 2, 0), ('t', 3, 1)]",
                              "raised by 3 on h2"], r.stdout
    assert all_gone(tag), tagged_pids(tag)


VALUES = st.binary(max_size=3 * PIECE // 2)
NOISE = st.binary(max_size=200)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(NOISE, st.integers(0, 3), st.sampled_from(["ok", "err"]), VALUES),
                max_size=4),
       NOISE, st.lists(st.integers(1, 5000), min_size=1, max_size=20))
def test_frames_come_out_whole_and_every_other_byte_passes(parts, tail, cuts):
    """Output around the frames (newlines or not, stray \\x1e bytes, a frame of
    another token) is passed on byte for byte, however the stream is cut."""
    stream, expected, want = b"", b"", {}
    for n, (noise, rank, kind, value) in enumerate(parts):
        stream += noise + frame_lines("feedc0de", n, rank, kind, value)
        # (a frame that ended a partial line of the rank's own leaves the line's end)
        expected += noise + (b"\n" if noise and not noise.endswith(b"\n") else b"")
        want[(n, rank)] = (kind, value)
    stray = frame_lines("otherjob", 0, 0, "ok", b"x")
    stream += stray + tail
    expected += stray + tail
    frames, passed, held, at = Frames("feedc0de"), [], b"", 0
    for cut in cuts * (len(stream) // sum(cuts) + 1):
        if at >= len(stream):
            break
        held = frames.feed(held + stream[at:at + cut], passed.append)
        at += cut
    passed.append(held)
    assert b"".join(passed) == expected
    assert frames.done == want
