"""mslaunch-top on real jobs: a snapshot when piped, and the live view in a real
terminal (tmux: send-keys and capture-pane) showing every rank."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess

import pytest

from requires import require
from helpers import PY, REPO, clean_env, kill_tagged, new_tag, start, wait_for

TOP = os.path.join(REPO, "scripts", "mslaunch-top")
TICKER = ("import os, sys, time\n"
          "for i in range(600):\n"
          "    print(f'tick {i} of rank {os.environ[\"RANK\"]}', flush=True)\n"
          "    time.sleep(0.3)\n")


def snapshot(pid: int) -> subprocess.CompletedProcess:
    return subprocess.run([PY, TOP, str(pid)], capture_output=True, timeout=30, env=clean_env())


def test_a_snapshot_when_piped_shows_every_rank_and_its_last_line():
    tag = new_tag()
    p = start("-n", "3", PY, "-c", TICKER, env=clean_env(MSL_TEST_TAG=tag))
    try:
        def ready():
            r = snapshot(p.pid)
            text = r.stdout.decode()
            return r.returncode == 0 and all(f"of rank {i}" in text for i in range(3))
        assert wait_for(ready, 30, 0.5)
        lines = snapshot(p.pid).stdout.decode().splitlines()
        assert lines[0].startswith("mslaunch-top: job kvs_")
        assert "3 rank(s) on 1 host(s)" in lines[0]
        rows = [line.split() for line in lines[2:5]]
        assert [row[0] for row in rows] == ["0", "1", "2"], lines
        assert all(row[3] in ("S", "R") for row in rows), lines
        assert any("3 ranks started" in line for line in lines), lines
    finally:
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=30)
        kill_tagged(tag)


def test_the_first_snapshot_shows_a_line_written_before_anyone_looked(tmp_path):
    """A rank that wrote one line and then waits: the view, asked for the first time
    after that, shows the line (it was kept only from the first look on)."""
    tag = new_tag()
    flag = tmp_path / "written"
    p = start("-n", "2", PY, "-c", "import os, sys, time\n"
              "print(f'written before the view by {os.environ[\"RANK\"]}', flush=True)\n"
              f"open({str(flag)!r} + os.environ['RANK'], 'w').close()\n"
              "sys.stdin.read()\n", env=clean_env(MSL_TEST_TAG=tag), stdin=subprocess.PIPE)
    try:
        assert wait_for(lambda: all(os.path.exists(f"{flag}{n}") for n in (0, 1)), 30)
        # (the rank's line may still be on its way to the launcher: asked until it came)
        assert wait_for(lambda: "written before the view by 1" in snapshot(p.pid).stdout.decode()
                        and "written before the view by 0" in snapshot(p.pid).stdout.decode(),
                        30, 0.2), snapshot(p.pid).stdout.decode()
    finally:
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=30)
        kill_tagged(tag)


def test_a_failure_shows_in_the_timeline():
    tag = new_tag()
    code = "import os, sys, time\nif os.environ['RANK'] == '1': sys.exit(3)\ntime.sleep(60)\n"
    p = start("-n", "2", "--enable-recovery", PY, "-c", code, env=clean_env(MSL_TEST_TAG=tag))
    try:
        def failed():
            text = snapshot(p.pid).stdout.decode()
            return "rank 1 on " in text and "exited with code 3" in text and "exit 3" in text
        assert wait_for(failed, 30, 0.5)
    finally:
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=30)
        kill_tagged(tag)


def test_the_live_view_in_a_terminal_shows_every_rank_and_quits_on_q():
    require(shutil.which("tmux") is not None, "tmux (apt-get install tmux)")
    tag = new_tag()
    sock = f"msl-top-{tag[:12]}"
    p = start("-n", "4", PY, "-c", TICKER, env=clean_env(MSL_TEST_TAG=tag))
    tmux = ["tmux", "-L", sock, "-f", "/dev/null"]
    try:
        assert wait_for(lambda: snapshot(p.pid).returncode == 0, 30, 0.3)   # it listens
        env = clean_env()
        env.pop("TMUX", None)
        subprocess.run(tmux + ["new-session", "-d", "-x", "150", "-y", "30", "-s", "top",
                               f"{PY} {TOP} {p.pid} --interval 0.5 2>&1; sleep 30"],
                       check=True, env=env, timeout=30)

        def screen() -> str:
            return subprocess.run(tmux + ["capture-pane", "-p", "-t", "top"], capture_output=True,
                                  timeout=30).stdout.decode()
        assert wait_for(lambda: all(f"of rank {i}" in screen() for i in range(4)), 30, 0.3), \
            screen()
        first = screen()
        assert "mslaunch-top: job kvs_" in first and "4 rank(s) on 1 host(s)" in first
        # redrawn in place: one header on the screen, and the ticks move on
        assert first.count("mslaunch-top: job") == 1
        assert wait_for(lambda: screen() != first, 10, 0.2)
        subprocess.run(tmux + ["send-keys", "-t", "top", "q"], check=True, timeout=30)
        assert wait_for(lambda: "mslaunch-top: job" not in screen(), 10, 0.2), screen()
        assert p.poll() is None                  # the job goes on
    finally:
        subprocess.run(tmux + ["kill-server"], capture_output=True, timeout=30)
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=30)
        kill_tagged(tag)


@pytest.mark.parametrize("script", ["mslaunch-top", "mslaunch-stacks"])
def test_the_inspection_commands_say_their_version(script):
    import mslaunch
    r = subprocess.run([PY, os.path.join(REPO, "scripts", script), "--version"],
                       capture_output=True, timeout=30, env=clean_env())
    assert (r.returncode, r.stdout, r.stderr) == (0, f"{script} {mslaunch.__version__}\n"
                                                   .encode(), b"")


def test_verbose_says_how_to_attach():
    from helpers import run
    r = run("-v", "-n", "1", "true")
    assert r.returncode == 0, r.stderr
    line = [x for x in r.stderr.decode().splitlines() if "mslaunch-top" in x]
    assert len(line) == 1 and "mslaunch-stacks " in line[0], r.stderr


@pytest.mark.remote
def test_a_snapshot_shows_the_ranks_of_every_host(sshbed, tmp_path):
    home = sshbed.make_home(tmp_path / "home")
    tag = new_tag()
    p = start("-n", "4", "-H", "h1:2,h2:2", "-x", "MSL_TEST_TAG", PY, "-c", TICKER,
              env=clean_env(HOME=home, MSL_TEST_TAG=tag))
    try:
        def rows():
            r = snapshot(p.pid)
            lines = r.stdout.decode().splitlines()
            return [x.split() for x in lines[2:6]] if r.returncode == 0 else []
        assert wait_for(lambda: len(rows()) == 4 and all(
            row[3] in ("S", "R") and row[5] != "-" for row in rows()), 60, 0.5), rows()
        got = rows()
        assert [(row[0], row[1]) for row in got] == [("0", "h1"), ("1", "h1"), ("2", "h2"),
                                                     ("3", "h2")]
    finally:
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=60)
        kill_tagged(tag)


def test_the_live_view_is_redrawn_at_once_for_a_new_terminal_size():
    """Every line is cut at the terminal's width (a wrapped header would push the
    rows down), and a wider terminal gets its view at once, not at the next
    refresh (here a minute away)."""
    require(shutil.which("tmux") is not None, "tmux (apt-get install tmux)")
    tag = new_tag()
    sock = f"msl-top-{tag[:12]}"
    p = start("-n", "3", PY, "-c", TICKER, env=clean_env(MSL_TEST_TAG=tag))
    tmux = ["tmux", "-L", sock, "-f", "/dev/null"]
    try:
        assert wait_for(lambda: snapshot(p.pid).returncode == 0, 30, 0.3)
        assert wait_for(lambda: "of rank 2" in snapshot(p.pid).stdout.decode(), 30, 0.3)
        env = clean_env()
        env.pop("TMUX", None)
        subprocess.run(tmux + ["new-session", "-d", "-x", "50", "-y", "20", "-s", "top",
                               f"{PY} {TOP} {p.pid} --interval 60 2>&1; sleep 30"],
                       check=True, env=env, timeout=30)

        def screen() -> str:
            return subprocess.run(tmux + ["capture-pane", "-p", "-t", "top"], capture_output=True,
                                  timeout=30).stdout.decode()
        assert wait_for(lambda: "mslaunch-top: job" in screen(), 30, 0.3), screen()
        lines = screen().splitlines()
        assert lines[1].lstrip().startswith("RANK"), lines       # the header did not wrap
        assert "of rank" not in screen()                          # cut at 50 columns
        subprocess.run(tmux + ["resize-window", "-t", "top", "-x", "150", "-y", "30"],
                       check=True, timeout=30)
        assert wait_for(lambda: "of rank 2" in screen(), 10, 0.2), screen()
    finally:
        subprocess.run(tmux + ["kill-server"], capture_output=True, timeout=30)
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=30)
        kill_tagged(tag)
