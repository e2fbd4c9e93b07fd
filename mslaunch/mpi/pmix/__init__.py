"""PMIx: what Open MPI's ranks (4.x and 5.x) need of a process manager, beside PMI.

Open MPI ranks find their process manager through ``PMIX_SERVER_URI*`` and
speak PMIx to it; a rank that finds none starts alone, as a singleton.  So
every launcher and agent that starts ranks of a PMI job also serves PMIx to
them, from the same job: the launcher for its local ranks, each agent for
its host's.  The server is the real one, the PMIx library an Open MPI
installation brings (``libpmix.so.2``), driven through ctypes
(:mod:`.lib`); it is loaded only when a rank first connects (:mod:`.door`,
:mod:`.template`), so that a job whose ranks never speak PMIx pays nothing.

(a) :mod:`.lib` -- finding and loading the library, its types, its calls.
(b) :mod:`.server` -- :class:`~.server.PMIxServer`, one per process: the
    library's server with mslaunch's upcalls, which arrive on the library's
    own thread and are carried into the event loop; a
    :class:`~.server.Namespace` per job registers the job's data and gives
    each rank its variables.
(c) The job-wide part, where ranks of a job run on several hosts: every
    host's server hands its fences' opaque contributions to
    :meth:`~.server.Namespace.relay`, whose owner gathers them from every
    host over the link that carries PMI, concatenates them and hands the
    whole back to each server (see :mod:`mslaunch.serve.mpijobs` and
    :mod:`mslaunch.serve.agentpmi`).

Both ways in and out of MPI end as under PMI: ``MPI_Abort(N)`` ends the job
with N, and a rank whose connection goes while it exits without
``MPI_Finalize`` fails the job, named.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, Iterable, Iterator, Mapping, Optional, Sequence, Tuple

    from ...core.spec import RankSpec

#: Where the library is chosen (see :mod:`.lib`), and the words that turn PMIx
#: off: on the launcher, for every host of the job.
LIBRARY_VARIABLE = "MSLAUNCH_PMIX_LIBRARY"
OFF = ("none", "off", "no", "0")


def turned_off(environ: Mapping[str, str]) -> bool:
    """Whether ``environ`` turns PMIx off."""
    return environ.get(LIBRARY_VARIABLE, "").strip().lower() in OFF


def oversubscribed(specs: Iterable[RankSpec]) -> bool:
    """Whether a host of these ranks has more ranks than slots (the plan says so in
    Open MPI 4's own variable, ``OMPI_MCA_mpi_oversubscribe``)."""
    return any(s.env.get("OMPI_MCA_mpi_oversubscribe") == "1" for s in specs)


def _one_at_a_time(data: bytes, h: int = 0) -> int:
    """The running state of Jenkins' one-at-a-time hash over ``data``."""
    for byte in data:
        h = (h + byte) & 0xFFFFFFFF
        h = (h + (h << 10)) & 0xFFFFFFFF
        h ^= h >> 6
    return h


def _open_mpi_4_family(state: int) -> int:
    h = (state + (state << 3)) & 0xFFFFFFFF
    h ^= h >> 11
    h = (h + (h << 15)) & 0xFFFFFFFF
    return (h & ~0x8000) >> 16


#: Suffixes tried in one go by :func:`sibling_names` (some milliseconds).
SLICE = 2048


def sibling_names(base: str, parent: str, size: int = SLICE) -> Iterator[Optional[str]]:
    """The search for a namespace name for a job spawned by ``parent``'s ranks
    that Open MPI 4 takes for a job of the same ``mpirun``: ``base`` and a
    suffix.  It yields None after every ``size`` suffixes tried, then the name.

    Open MPI 4 makes a job id of a namespace it did not name itself by hashing
    the name (one-at-a-time, bit 15 cleared); a spawned job whose id is of
    another "job family" (the upper 16 bits) is to it another mpirun's, which
    it refuses to connect to without an ``ompi-server``.  About 65536 suffixes
    are tried on average, and several times that now and then: from 0.01 to
    2 s of a busy machine's CPU, which an event loop must not spend in one
    go (its links' heartbeats would stop), hence the slices."""
    want = _open_mpi_4_family(_one_at_a_time(parent.encode()))
    prefix = _one_at_a_time(f"{base}.".encode())
    for n in range(1 << 22):
        salt = format(n, "x").encode()
        if _open_mpi_4_family(_one_at_a_time(salt, prefix)) == want:
            yield f"{base}.{salt.decode()}"
            return
        if n % size == size - 1:
            yield None
    yield base


def spawn_request(commands: Sequence[Tuple[str, Sequence[str], int, Mapping[str, str]]]):
    """The :class:`~mslaunch.core.spec.SpawnRequest` of a ``PMIx_Spawn``'s applications,
    each ``(program, args, processes, info)`` (see :mod:`.dpm`)."""
    from ...core.spec import SpawnCommand, SpawnRequest
    return SpawnRequest(commands=tuple(
        SpawnCommand(program=program, args=tuple(args), nprocs=n, info=tuple(info.items()))
        for program, args, n, info in commands))


def rank_extras(nspace: str, tmpdir: str, own: Mapping[str, str]) -> Dict[str, str]:
    """What a rank of namespace ``nspace`` gets beside the library's variables: the
    hint that makes Open MPI 4 take itself for launched, not for a singleton, its
    session directory in the server's ``tmpdir``, and what spares it probing for
    absent hardware (:mod:`.fabric`)."""
    env = {
        # Open MPI 4's "schizo" reads a direct launch from FLUX_JOB_ID (and from
        # nothing of ours); its value only needs to be an integer.
        "FLUX_JOB_ID": str(int.from_bytes(nspace.encode()[-6:], "big") & 0x7FFFFFFF),
        # Open MPI 4's session directory in this server's, removed with it.
        "OMPI_MCA_orte_tmpdir_base": tmpdir,
        # MPICH, told of both PMI and PMIx, would refuse to choose (MPICH PR #7525);
        # the launcher lets a value of the rank's own win (see machine.local).
        "MPIR_CVAR_PMI_VERSION": "1"}
    # the same for every rank of the same settings: worked out once per process
    # (what skips reads: the names set, the values of the few it looks at)
    names = tuple(sorted(k for k in own if k.startswith("OMPI_MCA_")))
    key = (own.get("MSLAUNCH_OMPI_SKIP"), own.get("HOME"), own.get("OPAL_PREFIX"), names,
           tuple(own.get(k) for k in _SKIPS_READ))
    found = _SKIPS.get(key)
    if found is None:
        from ..pmi.mcaparams import from_files, names_set
        from .fabric import skips
        found = _SKIPS[key] = skips(own, lambda name: from_files(own, name),
                                    lambda: names_set(own))
    env.update(found)
    return env


#: :func:`.fabric.skips` by what it reads of a rank's environment.
_SKIPS: Dict[Tuple[Any, ...], Dict[str, str]] = {}
#: The variables whose values :func:`.fabric.skips` reads (the files'
#: parameters through :mod:`mslaunch.mpi.pmi.mcaparams`, the frameworks it sets).
_SKIPS_READ = ("OMPI_MCA_mtl", "OMPI_MCA_pml", "OMPI_MCA_btl",
               "OMPI_MCA_mca_base_envar_file_prefix", "OMPI_MCA_mca_base_param_files")
