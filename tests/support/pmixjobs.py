"""Open MPI programs served PMIx by mslaunch itself: the rank program of these
tests (tests/programs/pmix_ranks.py) and what its spawning parents print."""

from __future__ import annotations

from helpers import program

RANKS = program("pmix_ranks.py")


def check_spawned(r, hosts) -> None:
    """A ``pmix_ranks.py spawn`` job ``r`` succeeded, its two children ran, and on
    ``hosts`` (sorted [rank, host] pairs)."""
    assert r.returncode == 0, r.stderr
    out = r.stdout.decode().splitlines()
    assert sorted(x for x in out if x.startswith("child ")) == ["child 0 of 2", "child 1 of 2"]
    assert [x for x in out if x.startswith("children")] == ["children [0, 1]"], out
    assert sorted(x.split()[1:] for x in out if x.startswith("childhost ")) == hosts, out
