"""Remote ranks under Open MPI's rule get only what -x names: a job that names
nothing is told once, on a terminal, which of the launcher's variables they
will not get; under Hydra's spelling (the whole environment forwarded), or with
-x, or in a log, nothing is said."""

from __future__ import annotations

from helpers import error_lines, kill_tagged, new_tag
from remote import on_a_terminal, renv, run_remote, settle

NAME = "AAAA_MSLAUNCH_FORWARD_TEST"
NOTE = "mslaunch: note: remote ranks get their host's login environment and only what -x names"


def _env(home, tmp_path, tag):
    return renv(home, MSL_TEST_TAG=tag, XDG_CACHE_HOME=str(tmp_path / "cache"), **{NAME: "1"})


def _notes(stderr: bytes):
    return [line for line in error_lines(stderr.decode().replace("\r\n", "\n"))
            if line.startswith(NOTE)]


def test_open_mpi_s_spelling_is_told_once_which_variables_stay_here(sshbed, home, tmp_path):
    tag = new_tag()
    env = _env(home, tmp_path, tag)
    try:
        in_a_log = run_remote(home, "-H", "h1", "-n", "1", "true", env=env)
        assert in_a_log.returncode == 0 and _notes(in_a_log.stderr) == [], in_a_log.stderr
        r = on_a_terminal(env, "-H", "h1", "-n", "1", "printenv", NAME)
        assert r.returncode == 1 and r.stdout == b"", r.stderr   # (printenv: not set there)
        (note,) = _notes(r.stderr)
        assert f"so not {NAME}, " in note and "send one with -x NAME" in note, note
        assert "-genvall" in note and "said once for these names" in note
        again = on_a_terminal(env, "-H", "h1", "-n", "1", "true")
        assert again.returncode == 0 and _notes(again.stderr) == [], again.stderr
        settle(tag, sshbed)
    finally:
        kill_tagged(tag)


def test_hydra_s_spelling_and_x_say_nothing(sshbed, home, tmp_path):
    tag = new_tag()
    env = _env(home, tmp_path, tag)
    try:
        r = on_a_terminal(env, "-hosts", "h1", "-n", "1", "printenv", NAME)
        assert r.returncode == 0 and r.stdout == b"1\n", r.stderr
        assert _notes(r.stderr) == []
        r = on_a_terminal(env, "-H", "h1", "-ppn", "1", "-n", "1", "printenv", NAME)
        assert r.returncode == 0 and r.stdout == b"1\n", r.stderr    # -ppn: Hydra's rule
        assert _notes(r.stderr) == []
        r = on_a_terminal(env, "-H", "h1", "-x", NAME, "-n", "1", "printenv", NAME)
        assert r.returncode == 0 and r.stdout == b"1\n", r.stderr
        assert _notes(r.stderr) == []
        settle(tag, sshbed)
    finally:
        kill_tagged(tag)
