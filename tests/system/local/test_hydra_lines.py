"""Hydra's own lines (``mpiexec.hydra``, MPICH's) run by mslaunch side by side with
Hydra: its output patterns and its exit codes line."""

from __future__ import annotations

import os
import subprocess

import pytest

from helpers import PY, clean_env, cmd, run
from requires import require


HYDRA = os.path.join(os.path.dirname(PY), "mpiexec.hydra")


def _hydra(argv, **kw) -> subprocess.CompletedProcess:
    """Hydra's mpiexec on ``argv``, its stdin a pipe that stays open: it forwards the
    end of a stdin at its end to its proxy and, when the proxy has already exited
    (a fast job, mpiexec descheduled), dies of SIGPIPE in that write (seen in a full
    run beside two busy loops; see tests/rooms/cli/test_mca.py)."""
    read_end, write_end = os.pipe()
    try:
        return subprocess.run([HYDRA, *argv], stdin=read_end, capture_output=True,
                              timeout=60, env=clean_env(), **kw)
    finally:
        os.close(read_end)
        os.close(write_end)


def _hydra_and_ours(tmp_path, *args):
    """The same line under Hydra's mpiexec (in t/) and mslaunch (in m/): their
    outputs and the files each made."""
    require(os.access(HYDRA, os.X_OK), "MPICH's Hydra (pip install mpich)")
    done = []
    for who in ("t", "m"):
        where = tmp_path / who
        where.mkdir()
        r = _hydra(args, cwd=str(where)) if who == "t" else \
            subprocess.run(cmd(*args), capture_output=True, timeout=60, cwd=str(where),
                           env=clean_env())
        assert r.returncode == 0, (who, r.stderr)
        files = {str(f.relative_to(where)): f.read_text() for f in sorted(where.rglob("*"))
                 if f.is_file()}
        done.append((sorted(r.stdout.decode().splitlines()),
                     sorted(r.stderr.decode().splitlines()), files))
    return done


def test_hydras_prepend_pattern(tmp_path):
    theirs, ours = _hydra_and_ours(tmp_path, "-n", "2", "-prepend-pattern", "<%r|%g|%p|%h> ",
                                   "sh", "-c", "echo out; echo err >&2")
    host = os.uname().nodename
    assert ours == theirs, (ours, theirs)
    assert ours[0] == [f"<0|0|0|{host}> out", f"<1|0|0|{host}> out"], ours


@pytest.mark.parametrize("files", [
    ["-outfile-pattern", "o.%r.%h", "-errfile-pattern", "e.%r"],
    ["-outfile-pattern", "both.%r", "-errfile-pattern", "both.%r"],
    ["-l", "-outfile-pattern", "all"],
], ids=["out-and-err", "one-file-per-rank", "one-file-for-all"])
def test_hydras_output_file_patterns(tmp_path, files):
    line = "echo out$PMI_RANK; echo err$PMI_RANK >&2"
    theirs, ours = _hydra_and_ours(tmp_path, *files, "-n", "2", "sh", "-c", line)
    assert ours[:2] == theirs[:2], (ours, theirs)
    assert sorted(ours[2]) == sorted(theirs[2]), (ours, theirs)
    for name in ours[2]:          # (two ranks in one file: in any order)
        assert sorted(ours[2][name].splitlines()) == sorted(theirs[2][name].splitlines())


def test_hydras_print_all_exitcodes():
    # (keep going: every rank ends by itself; Hydra kills the others with SIGKILL all the
    # same when one dies of a signal, so only exits are held side by side)
    line = ["-disable-auto-cleanup", "-print-all-exitcodes", "-n", "3", "sh", "-c",
            "exit $PMI_RANK"]
    require(os.access(HYDRA, os.X_OK), "MPICH's Hydra (pip install mpich)")
    theirs = _hydra(line)
    ours = run(*line)
    said = [x.split("Exit codes: ", 1)[1] for r in (theirs, ours)
            for x in (r.stdout + r.stderr).decode().splitlines() if "Exit codes: " in x]
    host = os.uname().nodename
    assert said == [f"[{host}] 0,256,512"] * 2, (theirs.stderr, ours.stderr)
    # a rank a signal ended: that signal, as Hydra's wait status says it
    ours = run(*line[:-1], "[ $PMI_RANK = 2 ] && kill -USR1 $$; exit $PMI_RANK")
    assert ours.stderr.decode().splitlines()[-1] == f"mslaunch: Exit codes: [{host}] 0,256,10"
