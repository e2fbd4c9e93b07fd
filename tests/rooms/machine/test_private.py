"""mslaunch/machine/procs.py: this user's private directory (the job's control socket,
its Python ranks' hook) is not taken over by another user in the moment between its
check and its use, and what is removed from it is never reached through a link."""

from __future__ import annotations

import os

from mslaunch.machine import procs
from mslaunch.machine.pydump import make_dir
from mslaunch.run.attempt import open_control
from requires import require

NOBODY = 65534


class _Told:
    """What the launcher tells its guard's watchdog to remove at the end (the
    guard itself is not what these tests are about)."""

    def __init__(self) -> None:
        self.paths: list = []

    def private(self, path: str) -> None:
        self.paths.append(path)


def _candidates(tmp_path, monkeypatch):
    """A world-writable, sticky TMPDIR and a HOME of this test's: the private
    directory's first candidate and its fallback."""
    tmp, home = tmp_path / "tmp", tmp_path / "home"
    tmp.mkdir()
    home.mkdir()
    os.chmod(tmp, 0o1777)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setenv("HOME", str(home))
    procs.refused_private()             # (what earlier tests' jobs refused)
    first = tmp / f"mslaunch-{os.getuid()}"
    fallback = home / ".cache" / "mslaunch" / os.uname().nodename
    return first, fallback


def _taken_over(first, monkeypatch):
    """Another user's directory made under the private directory's name just after its
    check, as if another job of this user had removed it, empty, that moment: the
    first thing the callers do in the checked directory is to sweep it."""
    sweep = procs.sweep_private
    done = []

    def sweep_after_the_swap(directory: str) -> None:
        if not done and directory == str(first):
            done.append(True)
            os.rmdir(first)
            os.mkdir(first)
            os.chmod(first, 0o777)
            os.chown(first, NOBODY, NOBODY)
        sweep(directory)

    monkeypatch.setattr(procs, "sweep_private", sweep_after_the_swap)
    return done


def test_a_control_socket_made_in_a_directory_taken_over_meanwhile_is_dropped(
        tmp_path, monkeypatch):
    require(os.geteuid() == 0, "another user's directory is made by root here")
    first, fallback = _candidates(tmp_path, monkeypatch)
    done = _taken_over(first, monkeypatch)
    told = _Told()
    made = open_control(told)
    assert done, "the directory was never swapped: the test tested nothing"
    assert made is not None
    sock, path = made
    try:
        assert os.path.dirname(path) == str(fallback)
        assert os.listdir(first) == [], "the socket was left in the other user's directory"
        assert [why for why in procs.refused_private() if str(first) in why]
    finally:
        sock.close()  # type: ignore[attr-defined]
        for p in told.paths:
            procs.remove_private(p)


def test_a_dump_directory_made_in_a_directory_taken_over_meanwhile_is_dropped(
        tmp_path, monkeypatch):
    require(os.geteuid() == 0, "another user's directory is made by root here")
    first, fallback = _candidates(tmp_path, monkeypatch)
    done = _taken_over(first, monkeypatch)
    told = _Told()
    path = make_dir(told)  # type: ignore[arg-type]
    assert done, "the directory was never swapped: the test tested nothing"
    try:
        assert path is not None and os.path.dirname(path) == str(fallback)
        assert os.listdir(first) == [], "the hook's directory was left in the other user's"
    finally:
        for p in told.paths:
            procs.remove_private(p)


def test_without_a_swap_the_first_candidate_is_used(tmp_path, monkeypatch):
    first, _fallback = _candidates(tmp_path, monkeypatch)
    told = _Told()
    made = open_control(told)
    assert made is not None
    sock, path = made
    sock.close()  # type: ignore[attr-defined]
    assert os.path.dirname(path) == str(first)
    for p in told.paths:
        procs.remove_private(p)
    assert not first.exists(), "the private directory, left empty, is removed"


def test_what_is_removed_from_the_private_directory_is_never_reached_through_a_link(
        tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious").write_text("x")
    base = tmp_path / "mslaunch-test"
    base.mkdir(mode=0o700)
    host = os.uname().nodename
    # a dead process's dump directory, and a control socket's name, each a link to
    # the victim; and a dump directory that holds one
    os.symlink(victim, base / f"{host}.4194301.py")
    os.symlink(victim, base / "4194302.sock")
    (base / f"{host}.4194303.py").mkdir()
    os.symlink(victim, base / f"{host}.4194303.py" / "__pycache__")
    removed = (f"{host}.4194304.py", "4194305.sock")
    for name in removed:
        os.symlink(victim, base / name)
    for name in removed:
        procs.remove_private(str(base / name))
    procs.sweep_private(str(base))
    assert (victim / "precious").read_text() == "x"
    assert not base.exists(), "everything in it went, and then the directory, empty"
