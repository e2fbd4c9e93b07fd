"""Run mslaunch from a given source tree: ``python bench/_tree.py TREE ARGS...``.

For ``--ab``: the tree of another commit, and this one's, are each run through
this same wrapper, so that both pay the same start-up.  An editable install's
import hook (which would bring in this checkout whatever the path says) is
taken out first.
"""

import sys

tree = sys.argv.pop(1)
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
sys.path.insert(0, tree)
sys.argv[0] = "mslaunch"

from mslaunch.__main__ import main  # noqa: E402 -- after the path is set

sys.exit(main())
