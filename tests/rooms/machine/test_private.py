"""mslaunch/machine/procs.py: this user's private directory (the job's control socket,
its Python ranks' hook) is not taken over by another user in the moment between its
check and its use, and what is removed from it is never reached through a link."""

from __future__ import annotations

import os
import pathlib
import shutil
import tempfile

import pytest

from mslaunch.machine import procs
from mslaunch.machine.pydump import make_dir
from mslaunch.run.attempt import open_control
from requires import require

NOBODY = 65534


class _Told:
    """What the launcher tells its guard's watchdog to remove at the end (the guard
    itself is not what these tests are about).  It is told of an entry before the
    entry is made: ``before`` runs then, once, as another user's move would."""

    def __init__(self, before=None) -> None:
        self.paths: list = []
        self.before = before

    def private(self, path: str) -> None:
        self.paths.append(path)
        if self.before is not None:
            before, self.before = self.before, None
            before(os.path.dirname(path))


@pytest.fixture
def short_path():
    """A directory of a short path (a Unix socket's fits in 108 bytes), removed after."""
    path = tempfile.mkdtemp(prefix="msp-", dir="/tmp")
    yield pathlib.Path(path)
    shutil.rmtree(path)


def _candidates(short_path, monkeypatch):
    """A world-writable, sticky TMPDIR and a HOME of this test's: the private
    directory's first candidate and its fallback."""
    tmp, home = short_path / "tmp", short_path / "home"
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


def _swap(first, inside=()):
    """Another user's directory made under the private directory's name just after its
    check, as if another job of this user had removed it, empty, that moment (with
    ``inside``: names made in it first, as directories)."""
    done = []

    def swap(directory: str) -> None:
        if directory == str(first):
            done.append(True)
            os.rmdir(first)
            os.mkdir(first)
            for name in inside:
                os.mkdir(first / name)
            os.chmod(first, 0o777)
            os.chown(first, NOBODY, NOBODY)
    return swap, done


def test_a_control_socket_made_in_a_directory_taken_over_meanwhile_is_dropped(
        short_path, monkeypatch):
    require(os.geteuid() == 0, "another user's directory is made by root here")
    first, fallback = _candidates(short_path, monkeypatch)
    swap, done = _swap(first)
    told = _Told(swap)
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
        short_path, monkeypatch):
    require(os.geteuid() == 0, "another user's directory is made by root here")
    first, fallback = _candidates(short_path, monkeypatch)
    swap, done = _swap(first)
    told = _Told(swap)
    path = make_dir(told)  # type: ignore[arg-type]
    assert done, "the directory was never swapped: the test tested nothing"
    try:
        assert path is not None and os.path.dirname(path) == str(fallback)
        assert os.listdir(first) == [], "the hook's directory was left in the other user's"
    finally:
        for p in told.paths:
            procs.remove_private(p)


def test_a_socket_that_cannot_be_made_in_a_directory_taken_over_goes_to_the_next_place(
        short_path, monkeypatch):
    require(os.geteuid() == 0, "another user's directory is made by root here")
    first, fallback = _candidates(short_path, monkeypatch)
    swap, done = _swap(first, inside=(f"{os.getpid()}.sock.new",))
    told = _Told(swap)
    made = open_control(told)
    assert done
    assert made is not None, "no control socket: the next place was not tried"
    made[0].close()  # type: ignore[attr-defined]
    assert os.path.dirname(made[1]) == str(fallback)
    for p in told.paths:
        procs.remove_private(p)
    # what the watchdog was told of in the other user's directory is left there
    assert sorted(os.listdir(first)) == [f"{os.getpid()}.sock.new"]


def test_a_place_under_a_directory_another_user_may_rename_is_refused(short_path, monkeypatch):
    require(os.geteuid() == 0, "another user's directory is made by root here")
    first, fallback = _candidates(short_path, monkeypatch)
    # XDG_RUNTIME_DIR kept from another user's session (su without -), and a
    # TMPDIR in a shared directory others may write into, not sticky
    runtime = short_path / "run-nobody"
    runtime.mkdir(mode=0o700)
    os.chown(runtime, NOBODY, NOBODY)
    shared = short_path / "scratch"
    shared.mkdir()
    os.chmod(shared, 0o777)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    monkeypatch.setenv("TMPDIR", str(shared))
    told = _Told()
    made = open_control(told)
    assert made is not None
    made[0].close()  # type: ignore[attr-defined]
    assert os.path.dirname(made[1]) == str(fallback)
    refused = procs.refused_private()
    assert any(f"lies in {runtime}" in why for why in refused), refused
    assert any(f"lies in {shared}," in why for why in refused), refused
    assert os.listdir(runtime) == [] and os.listdir(shared) == [], "made where refused"
    for p in told.paths:
        procs.remove_private(p)


def test_a_place_others_may_enter_is_refused(short_path, monkeypatch):
    first, fallback = _candidates(short_path, monkeypatch)
    first.mkdir(mode=0o755)
    os.chmod(first, 0o755)
    told = _Told()
    made = open_control(told)
    assert made is not None
    made[0].close()  # type: ignore[attr-defined]
    assert os.path.dirname(made[1]) == str(fallback)
    assert any("mode 0755" in why for why in procs.refused_private())
    for p in told.paths:
        procs.remove_private(p)


def test_nothing_is_removed_from_a_directory_that_is_not_this_users_alone(tmp_path):
    require(os.geteuid() == 0, "another user's directory is made by root here")
    theirs = tmp_path / "mslaunch-0"
    theirs.mkdir(mode=0o777)
    os.chmod(theirs, 0o777)
    (theirs / "4194302.sock").write_text("theirs")
    (theirs / "vm.4194303.py").mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    for name in ("4194302.sock", "vm.4194303.py"):
        procs.remove_private(str(theirs / name))
    assert sorted(os.listdir(theirs)) == ["4194302.sock", "vm.4194303.py"]


def test_without_a_swap_the_first_candidate_is_used(short_path, monkeypatch):
    first, _fallback = _candidates(short_path, monkeypatch)
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


def test_the_sweep_takes_odd_names_and_a_full_socket_in_its_stride(short_path):
    from mslaunch.core import socket
    base = short_path / "mslaunch-sweep"
    base.mkdir(mode=0o700)
    for name in ("99999999999999999999.sock", "\u00b2.sock", "-1.sock", ".sock"):
        (base / name).write_text("")
    # a listener whose queue is full: a blocking connect would wait for ever
    full = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    full.bind(str(base / "4194301.sock"))
    full.listen(0)
    queued = []
    try:
        for _ in range(8):
            c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            c.setblocking(False)
            queued.append(c)
            if c.connect_ex(str(base / "4194301.sock")) != 0:
                break
        procs.sweep_private(str(base))
    finally:
        for c in queued:
            c.close()
        full.close()
    assert sorted(os.listdir(base)) == sorted(
        ["99999999999999999999.sock", "\u00b2.sock", "-1.sock", ".sock", "4194301.sock"])
