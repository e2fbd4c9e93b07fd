"""mslaunch side by side with a real Open MPI 4.1.4 ``mpirun`` (Debian's /usr/bin/mpirun.openmpi).

Every test runs one command line under both launchers and compares what the ranks saw
and what was printed, modulo what legitimately differs: pids, host names, jobids
(``[12345,1]``), session directories and times.  Where mslaunch deliberately does
better than Open MPI (README: default binding none, 128+signal on a stop signal,
correct OMPI_FIRST_RANKS, scrubbed launcher variables), the test asserts mslaunch's
documented behaviour and a comment says what Open MPI does.

Open MPI runs as root through OMPI_ALLOW_RUN_AS_ROOT(_CONFIRM), with stdin on
/dev/null, a timeout and a unique MSL_TEST_TAG so that its ranks can be found and
killed if something goes wrong.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
import xml.etree.ElementTree as ET

import pytest

from helpers import PY, REPO, clean_env, cmd, comm, kill_tagged, new_tag, tagged_pids, wait_for

OMPIRUN = "/usr/bin/mpirun.openmpi"
NODE = os.uname().nodename
HOSTS = sorted({NODE, NODE.split(".")[0]}, key=len, reverse=True)

#: A ctime() date as --timestamp-output writes it: "Sun Nov  2 12:27:30 2026".
CTIME = re.compile(r"[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4}")


# -- helpers -------------------------------------------------------------------
def _run(argv, env, cwd, timeout, tag):
    try:
        return subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True,
                              env=env, cwd=cwd, timeout=timeout, check=False)
    except BaseException:
        kill_tagged(tag)           # mpirun SIGKILLed by the timeout orphans its ranks
        raise


#: The module's own temporary directory (see _private_tmp).
_TMP = {}


@pytest.fixture(scope="module", autouse=True)
def _private_tmp(tmp_path_factory):
    """Both launchers' temporary files in a directory of this module's: a run of
    Open MPI's mpirun that a test's timeout ends leaves its session directory
    (``ompi.<host>.<uid>/pid.N``), which would otherwise stay in the machine's /tmp."""
    _TMP["dir"] = str(tmp_path_factory.mktemp("tmpdir"))
    yield
    _TMP.clear()


def _env(tag, env):
    full = clean_env(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                     MSL_TEST_TAG=tag, TMPDIR=_TMP["dir"])
    full.update(env or {})
    return full


def ompi(*args, env=None, cwd=None, timeout=30):
    """Run Open MPI 4.1.4's mpirun; CompletedProcess with bytes."""
    tag = new_tag()
    return _run([OMPIRUN, *args], _env(tag, env), cwd, timeout, tag)


def msl(*args, env=None, cwd=None, timeout=30):
    """Run mslaunch with the same environment as :func:`ompi`."""
    tag = new_tag()
    return _run(cmd(*args), _env(tag, env), cwd, timeout, tag)


def both(*args, **kw):
    return ompi(*args, **kw), msl(*args, **kw)


def text(data) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else data


def no_host(data) -> str:
    out = text(data)
    for h in HOSTS:
        out = re.sub(rf"(?<![\w.-]){re.escape(h)}(?![\w.-])", "HOST", out)
    return out


def no_jobid(data) -> str:
    return re.sub(r"\[\d+,(\d+)\]", r"[JOB,\1]", text(data))


def no_pid_prefix(line: str) -> str:
    """``[host:01234] MCW rank ...`` -> ``[HOST:PID] MCW rank ...``."""
    return re.sub(r"^\[[^\]:]+:\d+\]", "[HOST:PID]", line)


def json_rows(data):
    return sorted((json.loads(line) for line in text(data).splitlines() if line.startswith("{")),
                  key=lambda row: int(row["OMPI_COMM_WORLD_RANK"]))


def tree(root):
    """``{relative path: bytes}`` of every file (and ``path/: None`` of every directory)."""
    found = {}
    for dirpath, dirs, files in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        for d in dirs:
            found[os.path.normpath(os.path.join(rel, d)) + "/"] = None
        for f in files:
            with open(os.path.join(dirpath, f), "rb") as fh:
                found[os.path.normpath(os.path.join(rel, f))] = fh.read()
    return found


SHOW_ENV = ("import json, os, sys; print(json.dumps({k: os.environ.get(k) for k in"
            " ['OMPI_COMM_WORLD_RANK'] + sys.argv[1:]}))")


# -- fixtures ------------------------------------------------------------------
@pytest.fixture(scope="module", autouse=True)
def openmpi4():
    """Open MPI 4.1.4's mpirun must be there: skip without it, fail in CI or a complete run."""
    reason = None
    if not os.access(OMPIRUN, os.X_OK):
        reason = f"{OMPIRUN} is missing (Debian's openmpi-bin 4.1.4)"
    else:
        r = ompi("--version", timeout=20)
        if b"4.1.4" not in r.stdout:
            reason = f"{OMPIRUN} is not Open MPI 4.1.4: {text(r.stdout)[:80]!r}"
    if reason:
        if os.environ.get("CI") or os.environ.get("MSLAUNCH_TEST_REQUIRE_ALL"):
            pytest.fail(f"required for this test run: {reason}")
        pytest.skip(reason)


C_PROGRAMS = {
    # stdio line-buffered on a terminal: both lines survive the crash only on a pty
    "seg": r"""
        #include <stdio.h>
        #include <signal.h>
        int main(void) { printf("one\n"); printf("two\n"); raise(SIGSEGV); return 0; }
    """,
    "argv0": r"""
        #include <stdio.h>
        #include <stdlib.h>
        int main(int argc, char **argv) {
            printf("%s %s|%s\n", getenv("OMPI_COMM_WORLD_RANK"), argv[0], argc > 1 ? argv[1] : "");
            return 0;
        }
    """,
    "csleep": r"""
        #include <unistd.h>
        void zzz_c_sleeper_4711(void) { for (;;) sleep(100); }
        int main(void) { zzz_c_sleeper_4711(); return 0; }
    """,
}


@pytest.fixture(scope="session")
def cprog(tmp_path_factory):
    """``{name: path}`` of the small C programs above, compiled with gcc."""
    gcc = shutil.which("gcc")
    if not gcc:
        if os.environ.get("CI") or os.environ.get("MSLAUNCH_TEST_REQUIRE_ALL"):
            pytest.fail("required for this test run: gcc")
        pytest.skip("gcc is missing")
    d = tmp_path_factory.mktemp("cprogs")
    paths = {}
    for name, source in C_PROGRAMS.items():
        (d / f"{name}.c").write_text(source)
        subprocess.run([gcc, "-g", "-O0", "-o", str(d / name), str(d / f"{name}.c")],
                       check=True, capture_output=True, timeout=60)
        paths[name] = str(d / name)
    return paths


# -- 1, 2: --output-filename ---------------------------------------------------
RANK_WRITER = ('r=$OMPI_COMM_WORLD_RANK; printf "out-a %s\\n" $r; printf "err-a %s\\n" $r >&2; '
               'printf "l1 %s\\nl2 %s\\n\\n" $r $r; printf "nonl %s" $r')


@pytest.mark.parametrize("n", [1, 2, 10, 11])
def test_output_filename_layout_padding_and_contents(tmp_path, n):
    for who in ("ompi", "msl"):
        (tmp_path / who).mkdir()
    args = ("--oversubscribe", "-n", str(n), "--output-filename", "logs", "sh", "-c", RANK_WRITER)
    a = ompi(*args, cwd=str(tmp_path / "ompi"))
    b = msl(*args, cwd=str(tmp_path / "msl"))
    assert a.returncode == 0, a.stderr
    assert b.returncode == 0, b.stderr
    ta, tb = tree(tmp_path / "ompi" / "logs"), tree(tmp_path / "msl" / "logs")
    # Open MPI pads to the number of digits of np (rank.00 ... rank.09 at np=10)
    width = len(str(n))
    assert sorted(p for p in ta if p.endswith("/stdout")) == \
        sorted(f"1/rank.{r:0{width}d}/stdout" for r in range(n))
    assert tb == ta


@pytest.mark.parametrize("opts", [["--tag-output"], ["--timestamp-output"],
                                  ["--tag-output", "--timestamp-output"]])
def test_output_filename_files_carry_tags_and_timestamps(tmp_path, opts):
    args = (*opts, "-n", "2", "--output-filename", "logs", "sh", "-c", RANK_WRITER)
    (tmp_path / "ompi").mkdir()
    (tmp_path / "msl").mkdir()
    a = ompi(*args, cwd=str(tmp_path / "ompi"))
    b = msl(*args, cwd=str(tmp_path / "msl"))
    assert a.returncode == 0 and b.returncode == 0, (a.stderr, b.stderr)

    def files(root):
        return {p: None if v is None else CTIME.sub("DATE", v.decode())
                for p, v in tree(root).items()}

    fa, fb = files(tmp_path / "ompi" / "logs"), files(tmp_path / "msl" / "logs")
    prefix = ("DATE" if "--timestamp-output" in opts else "") + \
        ("[1,1]" if "--tag-output" in opts else "")
    assert fa["1/rank.1/stdout"] == "".join(
        f"{prefix}<stdout>:{line}" for line in ("out-a 1\n", "l1 1\n", "l2 1\n", "\n", "nonl 1"))
    assert fb == fa


# -- 3, 4: number of ranks, slots ----------------------------------------------
RANK_SIZE = 'echo "$OMPI_COMM_WORLD_RANK/$OMPI_COMM_WORLD_SIZE/$OMPI_UNIVERSE_SIZE"'


def test_n_0_means_one_rank_per_slot():
    a, b = both("-n", "0", "-H", "localhost:3", "sh", "-c", RANK_SIZE)
    assert a.returncode == 0 and b.returncode == 0, (a.stderr, b.stderr)
    assert sorted(text(a.stdout).split()) == ["0/3/3", "1/3/3", "2/3/3"]
    assert sorted(text(b.stdout).split()) == sorted(text(a.stdout).split())


def test_hostfile_max_slots_without_slots_and_oversubscribe_past_max_slots(tmp_path):
    hf1 = tmp_path / "hf_max3"
    hf1.write_text("localhost max_slots=3\n")
    hf2 = tmp_path / "hf_s2m3"
    hf2.write_text("localhost slots=2 max_slots=3\n")

    # max_slots=3 alone gives 3 slots (not the 2 cores)
    a, b = both("--hostfile", str(hf1), "-n", "3", "--display-allocation", "sh", "-c", RANK_SIZE)
    assert a.returncode == 0 and b.returncode == 0, (a.stderr, b.stderr)

    def ranks(r):
        return sorted(w for w in text(r.stdout).split() if re.fullmatch(r"\d+/\d+/\d+", w))

    def alloc(r):
        return [no_host(line) for line in text(r.stdout).splitlines() if "flags=" in line]

    assert ranks(a) == ["0/3/3", "1/3/3", "2/3/3"] and ranks(b) == ranks(a)
    assert alloc(a) == ["\tHOST: flags=0x11 slots=3 max_slots=3 slots_inuse=0 state=UP"]
    assert alloc(b) == alloc(a)

    # -n 4 on 3 slots: refused by both, nothing started
    a, b = both("--hostfile", str(hf1), "-n", "4", "sh", "-c", RANK_SIZE)
    assert a.returncode == 1 and b"not enough slots" in a.stderr
    assert b.returncode == 1 and a.stdout == b.stdout == b""
    lines = text(b.stderr).splitlines()
    assert len(lines) == 1 and lines[0].startswith("mslaunch: error: ") and \
        "oversubscribe" in lines[0], b.stderr

    # --oversubscribe ignores max_slots in Open MPI 4.1.4: 4 ranks on slots=2 max_slots=3
    a, b = both("--hostfile", str(hf2), "--oversubscribe", "-n", "4", "sh", "-c", RANK_SIZE)
    assert a.returncode == 0 and b.returncode == 0, (a.stderr, b.stderr)
    assert ranks(a) == ["0/4/2", "1/4/2", "2/4/2", "3/4/2"] and ranks(b) == ranks(a)


# -- 5: environment ------------------------------------------------------------
def test_mpmd_rank_environment_exports_and_outer_launch_variables():
    same = ["OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
            "OMPI_COMM_WORLD_NODE_RANK", "OMPI_UNIVERSE_SIZE", "OMPI_APP_CTX_NUM_PROCS",
            "OMPI_NUM_APP_CTX", "XA", "XB", "OMPI_MCA_foo", "PMIX_MCA_bar", "MY_SETTING"]
    differ = ["OMPI_FIRST_RANKS", "PMI_RANK", "PMIX_RANK", "HYDI_CONTROL_FD"]
    names = same + differ
    env = {"XB": "from-env", "OMPI_MCA_foo": "1", "PMIX_MCA_bar": "2", "MY_SETTING": "kept",
           # left over from an outer launch
           "OMPI_COMM_WORLD_RANK": "99", "PMI_RANK": "7", "PMIX_RANK": "5",
           "HYDI_CONTROL_FD": "9"}
    args = ("--oversubscribe", "-n", "2", "-x", "XA=va", PY, "-c", SHOW_ENV, *names,
            ":", "-n", "3", "-x", "XB", PY, "-c", SHOW_ENV, *names)
    a, b = both(*args, env=env)
    assert a.returncode == 0 and b.returncode == 0, (a.stderr, b.stderr)
    ra, rb = json_rows(a.stdout), json_rows(b.stdout)
    # the outer OMPI_COMM_WORLD_RANK is overwritten by both
    assert [r["OMPI_COMM_WORLD_RANK"] for r in ra] == ["0", "1", "2", "3", "4"]
    assert [r["OMPI_COMM_WORLD_RANK"] for r in rb] == ["0", "1", "2", "3", "4"]
    assert [r["XA"] for r in ra] == ["va", "va", None, None, None]
    assert ra[0]["OMPI_APP_CTX_NUM_PROCS"] == "2 3" and ra[0]["OMPI_UNIVERSE_SIZE"] == "2"
    assert [{k: r[k] for k in same} for r in rb] == [{k: r[k] for k in same} for r in ra]
    for rank, (x, y) in enumerate(zip(ra, rb)):
        # Open MPI 4.1.4 computes OMPI_FIRST_RANKS before mapping: "0 0" (a bug);
        # mslaunch documents the correct first rank of each context.
        assert x["OMPI_FIRST_RANKS"] == "0 0"
        assert y["OMPI_FIRST_RANKS"] == "0 2"
        # Open MPI strips nothing it does not set itself: PMI_RANK=7 and HYDI_CONTROL_FD
        # pass through, PMIX_RANK is overwritten.  mslaunch removes outer launchers'
        # variables (README) and serves PMI and PMIx itself: both ranks are the rank.
        assert (x["PMI_RANK"], x["PMIX_RANK"], x["HYDI_CONTROL_FD"]) == ("7", str(rank), "9")
        assert (y["PMI_RANK"], y["PMIX_RANK"], y["HYDI_CONTROL_FD"]) == \
            (str(rank), str(rank), None)


def test_outer_ompi_universe_size_is_scrubbed():
    # Open MPI 4.1.4 refuses to run ("mpirun does not support recursive calls", rc 1)
    # when OMPI_UNIVERSE_SIZE is set; mslaunch scrubs it (README) and runs.
    env = {"OMPI_UNIVERSE_SIZE": "9"}
    a, b = both("-n", "2", "sh", "-c", RANK_SIZE, env=env)
    assert a.returncode == 1 and b"does not support recursive calls" in a.stderr
    assert b.returncode == 0, b.stderr
    assert sorted(text(b.stdout).split()) == ["0/2/2", "1/2/2"]


def test_pwd_is_the_physical_working_directory(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "lnk").symlink_to("real")
    show = "import os; print(os.environ.get('PWD'), os.getcwd())"
    for wdir in ("real", "lnk", str(tmp_path / "lnk"), ".."):
        a, b = both("-n", "1", "-wdir", wdir, PY, "-c", show, cwd=str(tmp_path),
                    env={"PWD": "/bogus"})
        assert a.returncode == 0 and b.returncode == 0, (a.stderr, b.stderr)
        expect = str(tmp_path.parent if wdir == ".." else real)
        assert text(a.stdout).split() == [expect, expect], wdir
        assert b.stdout == a.stdout, wdir
    # launched from a symlinked directory, no -wdir: Open MPI gives the physical path too
    a, b = both("-n", "1", PY, "-c", show, cwd=str(tmp_path / "lnk"),
                env={"PWD": str(tmp_path / "lnk")})
    assert text(a.stdout).split() == [str(real), str(real)]
    assert b.stdout == a.stdout


# -- 6: rank stdout is a pty ------------------------------------------------------
def test_rank_stdout_is_a_pty_and_stderr_a_pipe():
    show = "import os; print(os.isatty(1), os.isatty(2))"
    a, b = both("-n", "2", PY, "-c", show)
    assert a.returncode == 0 and b.returncode == 0, (a.stderr, b.stderr)
    assert a.stdout == b.stdout == b"True False\nTrue False\n"   # and no \r added
    c = msl("--no-pty", "-n", "2", PY, "-c", show)
    assert c.stdout == b"False False\nFalse False\n"


def test_line_buffered_output_survives_a_crash(cprog):
    a, b = both("-n", "1", cprog["seg"])
    # Open MPI 4.1.4: rc 139 (128+SIGSEGV) for a rank killed by a signal; mslaunch the same
    assert a.returncode == b.returncode == 128 + signal.SIGSEGV
    assert a.stdout == b.stdout == b"one\ntwo\n"
    # through a pipe the C library buffers fully, and the crash loses both lines
    c = msl("--no-pty", "-n", "1", cprog["seg"])
    assert c.returncode == 139 and c.stdout == b""


# -- 7: --report-bindings, --display-map, --display-allocation ---------------------
def binding_lines(r):
    return sorted(no_pid_prefix(no_host(line)) for line in text(r.stderr).splitlines()
                  if "MCW rank" in line)


def test_report_bindings_bind_to_core_map_by_core():
    a, b = both("-n", "2", "--report-bindings", "--bind-to", "core", "--map-by", "core", "true")
    assert a.returncode == 0 and b.returncode == 0, (a.stderr, b.stderr)
    assert binding_lines(a) == [
        "[HOST:PID] MCW rank 0 bound to socket 0[core 0[hwt 0]]: [B/.]",
        "[HOST:PID] MCW rank 1 bound to socket 0[core 1[hwt 0]]: [./B]"]
    assert binding_lines(b) == binding_lines(a)
    # Without --bind-to, Open MPI 4.1.4 binds to cores when np <= 2 and prints the lines
    # above; mslaunch's documented default is no binding, and a line says so per rank.
    a, b = both("-n", "2", "--report-bindings", "true")
    assert len(binding_lines(a)) == 2
    assert binding_lines(b) == [
        "[HOST:PID] MCW rank 0 is not bound (or bound to all available processors)",
        "[HOST:PID] MCW rank 1 is not bound (or bound to all available processors)"]
    # --bind-to none, said: no line, in both
    a, b = both("-n", "2", "--report-bindings", "--bind-to", "none", "true")
    assert binding_lines(a) == binding_lines(b) == []


def _in_pid_namespace(argv, tag):
    """Run ``argv`` as pid 2 of a new pid namespace (pid 1 is a waiting sh)."""
    env = _env(tag, None)
    script = '"$@"; exit $?'          # not exec: the command stays pid 2
    try:
        return subprocess.run(["unshare", "--pid", "--fork", "--kill-child", "--mount-proc",
                               "sh", "-c", script, "sh", *argv],
                              stdin=subprocess.DEVNULL, capture_output=True, env=env, timeout=30,
                              check=False)
    except BaseException:
        kill_tagged(tag)
        raise


def test_report_bindings_pid_is_zero_padded_to_five_digits():
    if not shutil.which("unshare"):
        pytest.skip("unshare (util-linux) is missing")
    args = ("-n", "2", "--report-bindings", "--bind-to", "core", "--map-by", "core", "true")
    a = _in_pid_namespace([OMPIRUN, *args], new_tag())
    b = _in_pid_namespace(cmd(*args), new_tag())
    assert a.returncode == 0 and b.returncode == 0, (a.stderr, b.stderr)

    def lines(r):
        return sorted(no_host(line) for line in text(r.stderr).splitlines() if "MCW" in line)

    # the launcher is pid 2 in its namespace
    assert lines(a) == ["[HOST:00002] MCW rank 0 bound to socket 0[core 0[hwt 0]]: [B/.]",
                        "[HOST:00002] MCW rank 1 bound to socket 0[core 1[hwt 0]]: [./B]"]
    assert lines(b) == lines(a)


def test_display_map_and_display_allocation():
    def shown(r):
        return no_jobid(no_host(r.stdout))

    a, b = both("-n", "2", "--bind-to", "core", "--display-map", "--display-allocation",
                "-H", "localhost:2", "true")
    assert a.returncode == 0 and b.returncode == 0, (a.stderr, b.stderr)
    assert "ALLOCATED NODES" in shown(a) and "Bound: socket 0[core 1[hwt 0]]:[./B]" in shown(a)
    assert shown(b) == shown(a)
    # 3 ranks on 2 cores: unbound in both
    a, b = both("-n", "3", "-H", "localhost:3", "--display-map", "true")
    assert shown(a).count("Bound: N/A") == 3
    assert shown(b) == shown(a)
    # no --bind-to: Open MPI shows the default core binding; mslaunch binds nothing (README)
    a, b = both("-n", "2", "-H", "localhost:2", "--display-map", "true")
    assert shown(a).count("Bound: socket 0[core") == 2
    assert shown(b) == shown(a).replace("socket 0[core 0[hwt 0]]:[B/.]", "N/A") \
                               .replace("socket 0[core 1[hwt 0]]:[./B]", "N/A")


# -- 8: rankfile -------------------------------------------------------------------
def test_rankfile_slots_give_the_same_affinity(tmp_path):
    rf = tmp_path / "rf"
    rf.write_text("rank 0=localhost slot=1\nrank 1=localhost slot=0\n")
    show = ("import json, os; print(json.dumps({'OMPI_COMM_WORLD_RANK':"
            " os.environ['OMPI_COMM_WORLD_RANK'], 'cpus': sorted(os.sched_getaffinity(0))}))")
    a, b = both("-n", "2", "--rankfile", str(rf), "--report-bindings", PY, "-c", show)
    assert a.returncode == 0 and b.returncode == 0, (a.stderr, b.stderr)
    ra, rb = json_rows(a.stdout), json_rows(b.stdout)
    assert [r["cpus"] for r in ra] == [[1], [0]]
    assert rb == ra
    assert binding_lines(b) == binding_lines(a) == [
        "[HOST:PID] MCW rank 0 bound to socket 0[core 1[hwt 0]]: [./B]",
        "[HOST:PID] MCW rank 1 bound to socket 0[core 0[hwt 0]]: [B/.]"]


# -- 9, 10: appfile, --index-argv-by-rank ------------------------------------------------
def test_appfile_runs_the_same_ranks_argv_and_env(tmp_path):
    show = tmp_path / "show.py"
    show.write_text(
        "import json, os, sys\n"
        "print(json.dumps({'OMPI_COMM_WORLD_RANK': os.environ['OMPI_COMM_WORLD_RANK'],\n"
        "                  'argv': sys.argv[1:], 'cwd': os.getcwd(),\n"
        "                  **{k: os.environ.get(k) for k in ('AF', 'AG', 'OMPI_COMM_WORLD_SIZE',\n"
        "                     'OMPI_APP_CTX_NUM_PROCS', 'OMPI_NUM_APP_CTX')}}))\n")
    wdir = tmp_path / "w"
    wdir.mkdir()
    app = tmp_path / "app"
    # Open MPI's appfile tokenizer splits on whitespace (no quoting); '#' starts a
    # comment anywhere, even inside a word.
    app.write_text(f"# an appfile\n"
                   f"-n 1 -x AF=one {PY} {show} a \"b c\" x#y   # trailing comment\n"
                   f"\n"
                   f"   # indented comment\n"
                   f"-np 2 -x AG=two -wdir {wdir} {PY} {show} second 'q r'\n")
    a, b = both("--oversubscribe", "--app", str(app), cwd=str(tmp_path))
    assert a.returncode == 0 and b.returncode == 0, (a.stderr, b.stderr)
    ra, rb = json_rows(a.stdout), json_rows(b.stdout)
    assert [r["argv"] for r in ra] == [["a", '"b', 'c"', "x"], ["second", "'q", "r'"],
                                       ["second", "'q", "r'"]]
    assert [(r["AF"], r["AG"], r["cwd"]) for r in ra] == \
        [("one", None, str(tmp_path)), (None, "two", str(wdir)), (None, "two", str(wdir))]
    assert rb == ra


def test_index_argv_by_rank(cprog):
    args = ("--oversubscribe", "--index-argv-by-rank", "-n", "1", cprog["argv0"], "x",
            ":", "-n", "1", "sh", "-c", "echo $0")
    a, b = both(*args, cwd=os.path.dirname(cprog["argv0"]))
    assert a.returncode == 0 and b.returncode == 0, (a.stderr, b.stderr)
    assert sorted(text(a.stdout).splitlines()) == [f"0 {cprog['argv0']}-0|x", "sh-1"]
    assert sorted(text(b.stdout).splitlines()) == sorted(text(a.stdout).splitlines())
    # a relative program path keeps its form: ./argv0-0
    a, b = both("-n", "1", "--index-argv-by-rank", "./argv0", cwd=os.path.dirname(cprog["argv0"]))
    assert a.stdout == b.stdout == b"0 ./argv0-0|\n"
    # (Open MPI 4.1.4 ignores --index-argv-by-rank written in a later MPMD context;
    # mslaunch applies it to the whole job.  Not compared.)


def test_program_in_the_working_directory_is_found(cprog):
    d = os.path.dirname(cprog["argv0"])
    a, b = both("-n", "1", "argv0", cwd=d)
    assert a.returncode == 0 and a.stdout == b"0 argv0|\n", a.stderr
    assert b.returncode == 0 and b.stdout == a.stdout, b.stderr


# -- 11, 12: --timeout with --get-stack-traces / --report-state-on-timeout -------------
PY_SLEEPER = ("import time\n"
              "def zzz_py_sleeper_4711():\n"
              "    time.sleep(60)\n"
              "zzz_py_sleeper_4711()\n")
STACK_HEAD = re.compile(r"^STACK TRACE FOR PROC \[\[\d+,1\],(\d+)\] \((\S+), PID (\d+)\)$")


@pytest.fixture(scope="module")
def stack_runs(cprog, tmp_path_factory):
    """Both launchers on ``-n 1 python sleeper : -n 1 C sleeper`` with --timeout 1."""
    d = tmp_path_factory.mktemp("stacks")
    (d / "sleeper.py").write_text(PY_SLEEPER)
    args = ("--timeout", "1", "--get-stack-traces", "-n", "1", PY, str(d / "sleeper.py"),
            ":", "-n", "1", cprog["csleep"])
    a = ompi(*args, timeout=40)
    t0 = time.monotonic()
    b = msl(*args, timeout=40)
    return a, b, time.monotonic() - t0


def test_get_stack_traces_shows_the_python_stack(stack_runs):
    a, b, took_b = stack_runs
    # Open MPI 4.1.4: timeout box, rc 110; it runs `gstack`, which Debian lacks, so it
    # prints "Failed to find "gstack"" for rank 0 only.  mslaunch: 110 as documented.
    assert a.returncode == 110 and b.returncode == 110, (a.stderr, b.stderr)
    assert b"Waiting for stack traces" in a.stderr and b"STACK TRACE FOR PROC" in a.stderr
    err = text(b.stderr)
    assert "zzz_py_sleeper_4711" in err and "sleeper.py" in err, err
    assert "zzz_c_sleeper_4711" in err, err      # gdb's stack of the C rank
    assert took_b < 20


def test_get_stack_traces_header_of_a_native_rank_is_open_mpis(stack_runs):
    a, b, _ = stack_runs
    heads_a = [STACK_HEAD.match(line) for line in text(a.stderr).splitlines()
               if line.startswith("STACK TRACE")]
    assert heads_a and all(heads_a), a.stderr           # Open MPI's form, rank 0


def test_get_stack_traces_is_one_merged_labelled_report_read_without_killing(stack_runs):
    # Where mslaunch differs on purpose: one report for all ranks, each branch headed
    # by its ranks and host, innermost frames last; no rank is killed to get it
    # (Open MPI 4.1.4 prints one block per process; Python ranks used to get SIGABRT).
    _, b, _ = stack_runs
    lines = [no_host(line) for line in text(b.stderr).splitlines()]
    assert not any(line.startswith("STACK TRACE") for line in lines), b.stderr
    py = lines.index("+ rank 0 on HOST:")
    c = next(i for i, line in enumerate(lines) if line.startswith("+ rank 1 on HOST:"))
    assert any("zzz_py_sleeper_4711 (sleeper.py:3)" in line for line in lines[py:c]), b.stderr
    assert any("zzz_c_sleeper_4711" in line for line in lines[c:]), b.stderr
    assert "Fatal Python error" not in text(b.stderr)


@pytest.fixture(scope="module")
def state_runs():
    args = ("-n", "2", "--timeout", "1", "--report-state-on-timeout", "sleep", "60")
    return ompi(*args, timeout=40), msl(*args, timeout=40)


def job_block(stderr, job="1"):
    """The lines of the ``DATA FOR JOB: [x,job]`` block (jobid, pids, host normalized)."""
    out, inside = [], False
    for line in text(stderr).splitlines():
        if line.startswith("DATA FOR JOB:"):
            inside = line.rstrip().endswith(f",{job}]")
        if inside and line.strip():
            out.append(no_jobid(no_host(re.sub(r"PID: \d+", "PID: P", line))))
    return out


def test_report_state_on_timeout_names_every_rank(state_runs):
    a, b = state_runs
    assert a.returncode == 110 and b.returncode == 110, (a.stderr, b.stderr)

    def procs(stderr):
        return [line for line in job_block(stderr) if line.startswith("\t\tRank:")]

    assert procs(a.stderr) == [f"\t\tRank: {r}\tNode: HOST\tPID: P\tState: RUNNING\tExitCode 0"
                               for r in range(2)]
    assert procs(b.stderr) == procs(a.stderr)
    assert job_block(b.stderr)[0] == job_block(a.stderr)[0] == "DATA FOR JOB: [JOB,1]"
    # (Open MPI also prints a block for its daemon job [x,0]; mslaunch has no daemons.)


def test_report_state_on_timeout_job_header_is_open_mpis(state_runs):
    a, b = state_runs
    assert job_block(b.stderr)[:3] == job_block(a.stderr)[:3]


# -- 13: --xml --------------------------------------------------------------------
def test_xml_output_elements_and_text():
    prog = ('r=$OMPI_COMM_WORLD_RANK; printf "out-a %s <&> caf\\303\\251\\t|\\n" $r; '
            'printf "err-a %s\\n" $r >&2; printf "\\n"; printf "nonl %s" $r')
    a, b = both("-n", "2", "--xml", "sh", "-c", prog)
    assert a.returncode == 0 and b.returncode == 0, (a.stderr, b.stderr)
    assert a.stderr == b.stderr == b""   # everything on stdout

    def parsed(r):
        root = ET.fromstring(r.stdout)
        assert root.tag == "mpirun"
        streams = {}
        for el in root:
            assert el.tag in ("stdout", "stderr") and set(el.attrib) == {"rank"}, el
            key = (el.tag, el.attrib["rank"])
            streams[key] = streams.get(key, "") + (el.text or "")
        return streams

    pa, pb = parsed(a), parsed(b)
    # bytes above 127 are written as &#NNN; per byte, read back as latin-1 characters
    assert pa[("stdout", "0")] == "out-a 0 <&> caf\u00c3\u00a9\t|\n\nnonl 0"
    assert pa[("stderr", "1")] == "err-a 1\n"
    assert pb == pa
    assert b"&lt;&amp;&gt;" in b.stdout and b"&#195;&#169;&#009;" in b.stdout


# -- 14: every option of `mpirun --help all` ----------------------------------------
OPTION_LINE = re.compile(r"^(?:   )?(-[^\s|]+(?:\|-[^\s|]+)*)((?:\s<arg\d+>)*)")

DRIVER = r"""
import io, json, sys, contextlib
from mslaunch.cli import main
out = {}
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            rc = main(argv, run=lambda job: 0)
        except SystemExit as e:
            rc = e.code
    out[" ".join(argv)] = [rc, err.getvalue()]
print(json.dumps(out))
"""


def help_all_options():
    """``[(spelling, number of values)]`` from the installed mpirun's ``--help all``."""
    r = ompi("--help", "all", timeout=20)
    assert r.returncode == 0
    found = []
    for line in text(r.stdout).splitlines():
        m = OPTION_LINE.match(line)
        if m:
            found.extend((s, m.group(2).count("<arg")) for s in m.group(1).split("|"))
    return found


def test_every_help_all_option_is_known():
    from mslaunch.cli.options import OPEN_MPI_4, lookup, nargs
    # The options reference's table lists exactly the live --help all's option lines.
    r = ompi("--help", "all", timeout=20)
    lines = [m.group(1) for m in map(OPTION_LINE.match, text(r.stdout).splitlines()) if m]
    assert sorted(lines) == sorted(OPEN_MPI_4)
    options = help_all_options()
    lines = {s for s, _ in options}
    assert {"-np", "--map-by", "-x", "-H", "--report-state-on-timeout", "-tune"} <= lines
    assert len(options) > 120            # 96 lines, most with two spellings
    for spelling, n in options:
        name, how = lookup(spelling.lstrip("-"))
        assert how, f"{spelling} unknown to mslaunch.cli.options"
        if name != "help":               # Open MPI's --help takes an optional category
            assert nargs(name) == n, f"{spelling}: mslaunch takes {nargs(name)} values, mpirun {n}"
    # and through the real entry point: never "unknown option"
    argvs = [[s, *["dummy"] * n, "-n", "1", "true"] for s, n in options]
    r = subprocess.run([PY, "-c", DRIVER, json.dumps(argvs)], capture_output=True, timeout=60,
                       env=clean_env(), cwd=REPO, check=False)
    assert r.returncode == 0, r.stderr
    for argv, (_rc, err) in json.loads(r.stdout).items():
        assert "unknown option" not in err, (argv, err)


HINT = re.compile(r"\buse\b|\battach\b|\binstead\b|(?<![\w-])--?[a-zA-Z][\w-]*|\b[A-Z][A-Z0-9_]+=")


def test_refused_options_name_an_alternative():
    from mslaunch.cli.options import lookup
    refused = [(s, n) for s, n in help_all_options() if lookup(s.lstrip("-"))[1] == "refused"]
    assert refused
    argvs = [[s, *["dummy"] * n, "-n", "1", "true"] for s, n in refused]
    r = subprocess.run([PY, "-c", DRIVER, json.dumps(argvs)], capture_output=True, timeout=60,
                       env=clean_env(), cwd=REPO, check=False)
    assert r.returncode == 0, r.stderr
    missing = []
    for argv, (rc, err) in json.loads(r.stdout).items():
        lines = err.splitlines()
        assert rc == 2 and len(lines) == 1 and lines[0].startswith("mslaunch: error: "), err
        hint = lines[0].split("not supported by mslaunch:", 1)[-1]
        if not HINT.search(hint):
            missing.append(argv.split()[0])
    assert missing == []


# -- 15: exit status -----------------------------------------------------------------
FAIL_RANK_1 = ('if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then sleep 0.3; {}; fi; exec sleep 30')


@pytest.mark.parametrize("action, status", [("exit 3", 3), ("kill -9 $$", 128 + 9)])
def test_exit_status_of_a_failing_rank(action, status):
    # Open MPI 4.1.4: the first failing rank's code, 128+signal for a signal (3, 137);
    # mslaunch documents the same.
    a, b = both("-n", "2", "sh", "-c", FAIL_RANK_1.format(action))
    assert a.returncode == status, a.stderr
    assert b.returncode == status, b.stderr


@pytest.mark.parametrize("action, status", [("echo gone >&2; exit 3", 3),
                                            ("kill -SEGV $$", 128 + 11)])
def test_quiet_says_nothing_of_a_failing_rank(action, status):
    # Open MPI 4.1.4 with -q: the rank's own output alone, whatever its end
    a, b = both("-q", "-n", "2", "sh", "-c", FAIL_RANK_1.format(action))
    assert a.returncode == b.returncode == status, (a.stderr, b.stderr)
    assert a.stderr == b.stderr == (b"gone\n" if "gone" in action else b""), \
        (a.stderr, b.stderr)


def test_quiet_says_nothing_of_a_timeout():
    a, b = both("-q", "--timeout", "1", "-n", "1", "sleep", "30")
    assert a.returncode == b.returncode == 110 and a.stderr == b.stderr == b"", \
        (a.stderr, b.stderr)


def _sigterm_launcher(argv, tmp_path):
    tag = new_tag()
    p = subprocess.Popen([*argv, "-n", "2", "sh", "-c",
                          f'touch {tmp_path}/up.$OMPI_COMM_WORLD_RANK; exec sleep 30'],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, env=_env(tag, None))
    try:
        # both ranks have exec'd their sleep (after the touch)
        assert wait_for(lambda: [comm(pid) for pid in tagged_pids(tag)].count("sleep") == 2, 15)
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=20)
        left = wait_for(lambda: not tagged_pids(tag), 10)
        return p.returncode, left
    finally:
        p.kill()
        p.wait()
        kill_tagged(tag)


def test_exit_status_when_the_launcher_gets_sigterm(tmp_path):
    (tmp_path / "o").mkdir()
    (tmp_path / "m").mkdir()
    rc_a, _ = _sigterm_launcher([OMPIRUN], tmp_path / "o")
    rc_b, gone = _sigterm_launcher(cmd(), tmp_path / "m")
    # Open MPI 4.1.4 sends CONT, TERM 1 s later, KILL 1 s after that, prints nothing, rc 1.
    assert rc_a == 1
    # mslaunch (README): forwards SIGTERM to every rank group, exits 128+signal.
    assert rc_b == 128 + signal.SIGTERM
    assert gone
