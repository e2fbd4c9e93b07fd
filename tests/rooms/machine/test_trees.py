"""mslaunch/machine/trees.py: a directory tree removed without following links, only
this user's, and not sent elsewhere by a directory swapped during the walk."""

from __future__ import annotations

import os
import threading

from mslaunch.machine.trees import remove_tree
from requires import require


def test_a_tree_goes_and_what_its_links_point_to_stays(tmp_path):
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "precious").write_text("x")
    tree = tmp_path / "tree"
    (tree / "a" / "b" / "c").mkdir(parents=True)
    (tree / "a" / "b" / "c" / "f").write_text("y")
    (tree / "a" / "f").write_text("z")
    os.symlink(keep, tree / "a" / "link-to-dir")
    os.symlink(keep / "precious", tree / "link-to-file")
    os.mkfifo(tree / "a" / "fifo")
    remove_tree(str(tree))
    assert not tree.exists()
    assert (keep / "precious").read_text() == "x"


def test_a_link_or_a_missing_path_given_is_left_alone(tmp_path):
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "f").write_text("x")
    os.symlink(keep, tmp_path / "link")
    remove_tree(str(tmp_path / "link"))
    remove_tree(str(tmp_path / "missing"))
    assert (tmp_path / "link").is_symlink() and (keep / "f").exists()


NOBODY = 65534


def test_a_directory_of_another_users_is_left_as_it_is(tmp_path):
    # Its name may be one of the job's (another user made it first): the job
    # removes only what is its user's, also deeper in its own tree.
    require(os.geteuid() == 0, "root, to give a directory to another user")
    theirs = tmp_path / "theirs"
    (theirs / "inner").mkdir(parents=True)
    (theirs / "inner" / "f").write_text("x")
    os.chown(theirs, NOBODY, NOBODY)
    remove_tree(str(theirs))
    assert (theirs / "inner" / "f").read_text() == "x"
    mine = tmp_path / "mine"
    (mine / "a").mkdir(parents=True)
    (mine / "a" / "f").write_text("y")
    (mine / "theirs").mkdir()
    (mine / "theirs" / "g").write_text("z")
    os.chown(mine / "theirs", NOBODY, NOBODY)
    remove_tree(str(mine))
    assert sorted(os.listdir(mine)) == ["theirs"] and (mine / "theirs" / "g").exists()


def test_a_directory_swapped_for_a_link_during_the_walk_sends_it_nowhere(tmp_path):
    # Whoever may write a directory being removed renames one inside it and puts a
    # link to elsewhere in its place once its removal has begun: what the walk
    # still had to remove must not be looked up through the link.  (A walk done
    # before the swapper looked proves nothing: it is tried again.)
    count = 3000
    names = [f"f{i}" for i in range(count)]
    victim = tmp_path / "victim"
    victim.mkdir()
    for name in names:
        (victim / name).write_bytes(b"")
    for attempt in range(5):
        tree = tmp_path / f"tree{attempt}"
        (tree / "sub").mkdir(parents=True)
        for name in names:
            (tree / "sub" / name).write_bytes(b"")
        swapped = threading.Event()

        def swap() -> None:
            try:
                while len(os.listdir(tree / "sub")) == count:
                    pass
                os.rename(tree / "sub", tree / "old")
            except OSError:
                return                  # the walk was over first
            os.symlink(victim, tree / "sub")
            swapped.set()

        swapper = threading.Thread(target=swap, daemon=True)
        swapper.start()
        remove_tree(str(tree))
        swapper.join(30)
        assert sorted(os.listdir(victim)) == sorted(names)
        if swapped.is_set():
            break
    assert swapped.is_set()
