"""The Open MPI-backed mode's mpirun command line, in the spellings of the chosen
Open MPI: 4.x's ``orterun`` or 5.x's ``prterun``.

Open MPI 5 renamed some of 4's options and silently ignores the old names;
4 refuses 5's (``unknown option "--prtemca"``).  mslaunch takes either from the
user and writes the chosen mpirun's own:

======================================  ==========================================
Open MPI 5                               Open MPI 4
======================================  ==========================================
``--prtemca prte_tmpdir_base D``        ``--mca orte_tmpdir_base D``
``--prtemca state_base_error_non_zero_  ``--mca orte_abort_on_non_zero_status 0``
exit 0``
``--pmixmca k v``                        ``-x PMIX_MCA_k=v``
``--bind-to package``                   ``--bind-to socket``
``--output tag``                        ``--tag-output``
``--display map``                       ``--display-map``
======================================  ==========================================

Every rank runs under :mod:`mslaunch.rankenv`, told (``MSLAUNCH_WAS_*``) the
``PATH``, ``LD_LIBRARY_PATH`` and ``OPAL_PREFIX`` mslaunch was started with:
both mpiruns put their own installation first in the ranks' ``PATH`` and
``LD_LIBRARY_PATH``, and a program of another Open MPI would load that
mpirun's library in place of its own.  The wrapper puts them back before it
runs the program, on this host (other hosts keep what mpirun gives them), unless
``--prefix`` asks mpirun for exactly that.
"""

from __future__ import annotations

import os
import sys

from ...rankenv import RESTORED

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Mapping, Optional, Sequence, Tuple

    from ...core.spec import JobSpec
    from .ompifind import OpenMPI

#: The parameter naming the base of mpirun's session directory, by major version.
TMPDIR_PARAMS = ("prte_tmpdir_base", "orte_tmpdir_base")


def _flag_env(name: str, value: Optional[str], environ: Mapping[str, str]) -> List[str]:
    if value is None:
        return ["-x", name] if name in environ else []
    return ["-x", f"{name}={value}"]


def rendezvous_env(job: JobSpec, environ: Mapping[str, str], master_port: int, jobid: int,
                   major: int = 5) -> List[str]:
    """``-x`` flags for what frameworks read in the default mode and the mpirun
    does not give: ``MASTER_ADDR``/``MASTER_PORT``, and for Open MPI 5 also 4's
    ``OMPI_MCA_orte_hnp_uri`` (jax; Open MPI 4's mpirun sets its own); rank 0
    runs on the first host of ``--host``, else here.  Set variables of the
    launcher's are kept."""
    from ...hosts import is_local
    from ...plan import hnp_uri
    first = job.hosts[0].name if job.hosts else "localhost"
    addr = environ.get("MASTER_ADDR") or ("127.0.0.1" if is_local(first) else first)
    wanted = [("MASTER_ADDR", addr), ("MASTER_PORT", str(master_port))]
    if major >= 5:
        wanted.append(("OMPI_MCA_orte_hnp_uri", hnp_uri(jobid, addr)))
    flags: List[str] = []
    for name, value in wanted:
        if name not in environ and not any(n == name for n, _ in job.global_env):
            flags += ["-x", f"{name}={value}"]
    return flags


def tmpdir_chosen(job: JobSpec, environ: Mapping[str, str]) -> Optional[str]:
    """The base of mpirun's session directory the user named, in either spelling."""
    for key, value in job.mca:
        if key in TMPDIR_PARAMS:
            return value
    pairs: List[Tuple[str, Optional[str]]] = [*job.global_env, *environ.items()]
    for name, given in pairs:
        if given is not None and any(name.endswith("MCA_" + p) for p in TMPDIR_PARAMS):
            return given
    return None


def restore_flags(job: JobSpec, environ: Mapping[str, str],
                  app_env: Sequence[Tuple[str, Optional[str]]] = ()) -> List[str]:
    """``-x`` flags that tell the rank wrapper what to put back (module docstring):
    the user's own value of each of :data:`RESTORED` (``-x NAME=V`` of the job
    or, later and so winning, of the app context ``app_env``; else mslaunch's
    environment), or that it was unset."""
    given = {name: value for name, value in (*job.global_env, *app_env) if value is not None}
    unset = []
    flags = ["-x", f"MSLAUNCH_WAS_HOST={os.uname().nodename}"]
    for name in RESTORED:
        value = given.get(name, environ.get(name))
        if value is None:
            unset.append(name)
        else:
            flags += ["-x", f"MSLAUNCH_WAS_{name}={value}"]
    if unset:
        flags += ["-x", f"MSLAUNCH_WAS_UNSET={':'.join(unset)}"]
    return flags


def _mpi4py_flags(job: JobSpec, environ: Mapping[str, str], ompi: OpenMPI,
                  app_env: Sequence[Tuple[str, Optional[str]]]) -> List[str]:
    """``-x`` for the MPI library mpi4py 4 loads, unless the user names one (in
    mslaunch's environment or with ``-x``): mpi4py 4 picks it when it starts,
    MPICH's ``libmpi.so.12`` first when both wheels are installed, so it is
    pointed at the mpirun's own, or at least at Open MPI's ABI (never both
    names).  mpi4py 3 and compiled programs ignore both."""
    said = {name for name, value in (*job.global_env, *app_env) if value is not None}
    if {"MPI4PY_MPIABI", "MPI4PY_LIBMPI"} & (said | set(environ)):
        return []
    return ["-x", f"MPI4PY_LIBMPI={ompi.libmpi}" if ompi.libmpi else "MPI4PY_MPIABI=openmpi"]


#: Open MPI 5 says package where 4 says socket (and 4 knows no package).
_RENAME = ({"package": "socket"}, {"socket": "package"})


def _placement(job: JobSpec, major: int) -> List[str]:
    """Where the ranks go and what they are bound to, in the version's spelling."""
    cmd: List[str] = []
    if job.hosts:
        entries = job.hosts
        if job.host_filter:
            from ...hosts import filter_hosts
            entries = tuple(filter_hosts(entries, job.host_filter))
        cmd += ["--host", ",".join(e.name if e.slots is None else f"{e.name}:{e.slots}"
                                   for e in entries)]
    cmd += _mapping(job, major)
    if job.rank_by:
        cmd += ["--rank-by", job.rank_by]
    if job.use_hwthreads and major < 5:
        cmd.append("--use-hwthread-cpus")
    if job.nolocal and major < 5:
        cmd.append("-nolocal")
    bind = _RENAME[major >= 5].get(job.bind_to, job.bind_to)
    bind += ":overload-allowed" if job.bind_overload else ""
    bind += ":ordered" if job.bind_ordered else ""
    if bind != "none" or not (job.rankfile or job.cpu_set or job.cpu_list):
        cmd += ["--bind-to", bind]          # (a rankfile's or a CPU list's bind the ranks)
    if job.report_bindings:
        cmd.append("--report-bindings")
    if job.display_map:
        cmd += ["--display-map"] if major < 5 else ["--display", "map"]
    return cmd


def _mapping(job: JobSpec, major: int) -> List[str]:
    """``--map-by`` for the job's mapping and its modifiers; Open MPI 4's ``-rf``,
    ``--cpu-set`` or ``--cpu-list`` instead (4 takes them as a mapping of their
    own, which a ``--map-by`` beside them contradicts)."""
    if job.rankfile:
        return ["-rf", job.rankfile] if major < 5 else \
            ["--map-by", f"rankfile:file={job.rankfile}"]
    cpus = job.cpu_list or job.cpu_set
    if cpus and major < 5:
        return ["--cpu-list" if job.cpu_list else "--cpu-set", ",".join(map(str, cpus)),
                *(["--oversubscribe"] if job.oversubscribe else [])]
    if job.cpu_list:
        from ...core.errors import UsageError
        raise UsageError("--cpu-list: Open MPI 5's mpirun has no such option; give "
                         "--cpu-set (or use Open MPI 4's mpirun)")
    rename = _RENAME[major >= 5]
    if cpus:
        mapping = "pe-list=" + ",".join(map(str, cpus))
    elif job.per_node:
        mapping = "ppr:%d:node" % job.per_node
    elif job.ppr:
        mapping = "ppr:%d:%s" % (job.ppr[0], rename.get(job.ppr[1], job.ppr[1]))
    else:
        mapping = rename.get(job.map_by, job.map_by)
    if job.pe:
        mapping += ":PE=%d" % job.pe
    if job.oversubscribe:
        mapping += ":OVERSUBSCRIBE"
    if job.nolocal and major >= 5:
        mapping += ":NOLOCAL"
    if job.use_hwthreads and major >= 5:
        mapping += ":HWTCPUS"
    return ["--map-by", mapping]


def _settings(job: JobSpec, environ: Mapping[str, str], major: int,
              session_base: Optional[str]) -> List[str]:
    """mpirun's own parameters: the session base, keep-going, ``--mca``, and the
    ``PRTE_MCA_``/``PMIX_MCA_`` variables of ``-x`` in the version's spelling."""
    cmd: List[str] = []
    chosen = tmpdir_chosen(job, environ)
    base = chosen if chosen is not None else session_base
    if base:
        cmd += ["--mca", "orte_tmpdir_base", base] if major < 5 else \
            ["--prtemca", "prte_tmpdir_base", base]
    if job.keep_going:
        cmd += ["--mca", "orte_abort_on_non_zero_status", "0"] if major < 5 else \
            ["--prtemca", "state_base_error_non_zero_exit", "0"]
    for key, value in job.mca:
        if key != "orte_abort_on_non_zero_status" and key not in TMPDIR_PARAMS:
            cmd += ["--mca", key, value]
    if major >= 5:
        # --prtemca and --pmixmca are mpirun's own settings: pass them as such
        # (Open MPI 4 reads PMIX_MCA_ from the -x variables; PRTE_MCA_ is 5's).
        skipped = (*TMPDIR_PARAMS, *(("state_base_error_non_zero_exit",)
                                     if job.keep_going else ()))
        for name, setting in job.global_env:
            for prefix, flag in (("PRTE_MCA_", "--prtemca"), ("PMIX_MCA_", "--pmixmca")):
                param = name[len(prefix):]
                if name.startswith(prefix) and setting is not None and param not in skipped:
                    cmd += [flag, param, setting]
    return cmd


def build_command(job: JobSpec, environ: Mapping[str, str], ompi: OpenMPI, marker: str,
                  tagged: bool, rendezvous: Sequence[str] = (),
                  session_base: Optional[str] = None,
                  stdin: bool = False) -> Tuple[List[str], Dict[str, str]]:
    """Translate ``job`` to ``ompi``'s mpirun command line and its environment
    (``rendezvous``: the flags of :func:`rendezvous_env`; ``session_base``: where
    mpirun keeps its session directory, unless the user chose a place; ``stdin``:
    mpirun forwards its stdin to the ranks ``--stdin`` names, else they get none)."""
    major = ompi.major
    cmd = list(ompi.argv)
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    if job.prefix:                 # Open MPI's own: its installation on the other hosts
        cmd += ["--prefix", job.prefix]
    cmd += _settings(job, environ, major, session_base)
    cmd += _placement(job, major)
    cmd += ["--stdin", job.stdin if stdin else "none"]
    if job.output.merge_stderr:
        cmd.append("--merge-stderr-to-stdout")
    if tagged:
        cmd += ["--tag-output"] if major < 5 else ["--output", "tag"]
    common = ["-x", f"MSLAUNCH_JOB={marker}", "-x", f"MSLAUNCH_GUARD={marker}", *rendezvous]
    for name, value in job.global_env:
        common += _flag_env(name, value, environ)
    for index, app in enumerate(job.apps):
        if index:
            cmd.append(":")
        if app.np is not None:
            cmd += ["-n", str(app.np)]
        if app.wdir or job.launch_dir:
            cmd += ["--wdir", app.wdir or job.launch_dir]
        cmd += common
        if not job.prefix:     # --prefix asks mpirun to put that installation first
            cmd += restore_flags(job, environ, app.env)
        cmd += _mpi4py_flags(job, environ, ompi, app.env)
        for name, value in app.env:
            cmd += _flag_env(name, value, environ)
        cmd += [sys.executable, "-m", "mslaunch.rankenv", *app.argv]
    return cmd, dict(ompi.env)


__all__ = ["build_command", "rendezvous_env", "restore_flags", "tmpdir_chosen"]
