"""mslaunch/machine/trees.py: a directory tree removed without following links."""

from __future__ import annotations

import os

from mslaunch.machine.trees import remove_tree


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
