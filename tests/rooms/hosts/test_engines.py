"""Grid Engine's and LSF's allocations: PE_HOSTFILE, LSB_DJOB_HOSTFILE, LSB_MCPU_HOSTS.

Property tests: any host list written in each format reads back as the
hosts and slot counts it holds (a host named twice adds up, first place
kept); bad lines are one error naming FILE:LINE or the variable.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from mslaunch.core.errors import HostfileError
from mslaunch.hosts.allocations import allocation_hosts
from mslaunch.hosts.allocations import in_grid_engine, in_lsf

NAMES = st.from_regex(r"[a-z][a-z0-9-]{0,12}(\.[a-z0-9]{1,5})?", fullmatch=True)
ALLOC = st.lists(st.tuples(NAMES, st.integers(1, 64)), min_size=1, max_size=12)
SGE = {"JOB_ID": "17", "SGE_ROOT": "/opt/sge", "ARC": "lx-amd64"}


def merged(pairs):
    out = {}
    for name, n in pairs:
        out[name] = out.get(name, 0) + n
    return list(out.items())


def got(result):
    hosts, _ = result
    return [(h.name, h.slots) for h in hosts]


@settings(max_examples=60, deadline=None)
@given(ALLOC, st.sampled_from(["UNDEFINED", "0,1", "<NULL>"]))
def test_pe_hostfile_gives_hosts_and_slots(tmp_path_factory, pairs, procs):
    path = tmp_path_factory.mktemp("pe") / "pe_hostfile"
    path.write_text("".join(f"{n} {k} all.q@{n} {procs}\n" for n, k in pairs))
    env = dict(SGE, PE_HOSTFILE=str(path))
    assert in_grid_engine(env)
    assert got(allocation_hosts(env)) == merged(pairs)


@settings(max_examples=60, deadline=None)
@given(ALLOC)
def test_lsb_mcpu_hosts_and_djob_hostfile_agree(tmp_path_factory, pairs):
    mcpu = " ".join(f"{n} {k}" for n, k in pairs)
    env = {"LSB_JOBID": "5", "LSB_MCPU_HOSTS": mcpu}
    assert in_lsf(env)
    assert got(allocation_hosts(env)) == merged(pairs)
    path = tmp_path_factory.mktemp("lsf") / "djob"
    path.write_text("".join(f"{n}\n" * k for n, k in pairs))
    env["LSB_DJOB_HOSTFILE"] = str(path)
    assert got(allocation_hosts(env)) == merged(pairs)


def test_grid_engine_needs_the_variables_open_mpi_checks(tmp_path):
    path = tmp_path / "pe"
    path.write_text("localhost 3 all.q@localhost UNDEFINED\n")
    for missing in SGE:
        env = dict(SGE, PE_HOSTFILE=str(path))
        del env[missing]
        assert allocation_hosts(env) is None
    assert allocation_hosts({"LSB_MCPU_HOSTS": "a 2"}) is None       # no LSB_JOBID


@pytest.mark.parametrize("text, said", [
    ("h1 x all.q@h1 UNDEFINED\n", "pe:1: expected 'HOST SLOTS QUEUE PROCESSORS'"),
    ("h1 2 q UNDEFINED\nh2\n", "pe:2: expected"),
    ("\n\n", "lists no hosts"),
])
def test_a_bad_pe_hostfile_is_one_line_naming_the_line(tmp_path, text, said):
    path = tmp_path / "pe"
    path.write_text(text)
    with pytest.raises(HostfileError) as err:
        allocation_hosts(dict(SGE, PE_HOSTFILE=str(path)))
    assert said in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("text", ["a 2 b", "a 0", "a two"])
def test_a_bad_lsb_mcpu_hosts_is_one_line(text):
    with pytest.raises(HostfileError) as err:
        allocation_hosts({"LSB_JOBID": "1", "LSB_MCPU_HOSTS": text})
    assert "LSB_MCPU_HOSTS" in str(err.value)


@pytest.mark.parametrize("shown, said", [
    ("JobState=RUNNING Reason=None", ""),
    ("JobState=COMPLETING Reason=None", ""),
    ("JobState=COMPLETING Reason=NodeDown", "(job 7: NODE_FAIL, NodeDown): a node failed"),
    ("JobState=NODE_FAIL Reason=NodeDown", "(job 7: NODE_FAIL, NodeDown): a node failed"),
    ("JobState=TIMEOUT Reason=TimeLimit", "(job 7: TIMEOUT, TimeLimit): it reached its time"),
    ("JobState=CANCELLED Reason=None", "(job 7: CANCELLED): it was cancelled"),
    ("", ""),
    # the first of a field counts: a later value may hold "=" and spaces
    ("JobState=RUNNING Reason=None Comment=x JobState=CANCELLED", ""),
    ("JobState=RUNNING Reason=None\nJobId=8 JobState=NODE_FAIL Reason=NodeDown", ""),
    ("Terminated\nJobId=7 JobState=CANCELLED Reason=None", "(job 7: CANCELLED): it was cancelled"),
])
def test_the_end_of_a_slurm_allocation_is_read_from_scontrol_s_line(shown, said):
    from mslaunch.hosts.allocations.slurm import ended_because
    got = ended_because("7", f"JobId=7 JobName=x UserId=root(0) {shown} Dependency=(null)")
    if not said:
        assert got == ""
    else:
        assert got.startswith("Slurm ended the job's allocation " + said), got

