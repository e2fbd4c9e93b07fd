"""Pure stages: command-line parsing and the planner (tables and properties)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mslaunch.cli.common import Exit as _Exit
from mslaunch.cli.mpirun import parse_args
from mslaunch.core.errors import PlanError, UsageError
from mslaunch.plan import log_paths, make_plan, resolve_hosts, scrub_env
from mslaunch.plan import place
from mslaunch.core.spec import Host, HostEntry


def hosts(*slots, max_slots=None):
    return [Host(name=f"n{i}", slots=s, max_slots=(max_slots[i] if max_slots else None),
                 local=False, node_id=i) for i, s in enumerate(slots)]


def machine(cores=2, sockets=1, threads=1):
    """A topology: ``sockets`` x ``cores`` (per socket) x ``threads``."""
    from mslaunch.core.cputopo import make_topology
    rows = []
    for s in range(sockets):
        for c in range(cores):
            for t in range(threads):
                cpu = (s * cores + c) + t * sockets * cores
                rows.append((cpu, (s, c), s, s, s))
    return make_topology(rows)


def plan_for(argv, entries=None, environ=None, ncores=2, topology=None, remote=None):
    job = parse_args(argv, environ=environ or {}, cwd="/work")
    entries = entries if entries is not None else (list(job.hosts) or
                                                   [HostEntry("localhost", origin="this machine")])
    return make_plan(job, entries, environ or {"PATH": "/bin"},
                     topology=topology or machine(ncores), hostname="vm",
                     kvsname="kvs_1_ab", master_port=29500, remote_topologies=remote,
                     is_local=lambda n: n in ("localhost", "vm"))


# -- command line ------------------------------------------------------------
@pytest.mark.parametrize("argv", [
    ["-n", "4", "prog"], ["-np", "4", "prog"], ["--np", "4", "prog"], ["-c", "4", "prog"],
    ["--n", "4", "prog"], ["-n=4", "prog"], ["--np=4", "prog"],
])
def test_np_spellings(argv):
    assert parse_args(argv, environ={}, cwd="/").apps[0].np == 4


@pytest.mark.parametrize("flag", ["-H", "--host", "-host", "-hosts", "--hosts"])
def test_host_spellings(flag):
    job = parse_args([flag, "a:2,b", "prog"], environ={}, cwd="/")
    assert [(h.name, h.slots) for h in job.hosts] == [("a", 2), ("b", 1)]


@pytest.mark.parametrize("flag", ["--hostfile", "-hostfile", "--machinefile", "-machinefile",
                                  "-f"])
def test_hostfile_spellings(flag, tmp_path):
    (tmp_path / "hf").write_text("a slots=2\nb:3\n")
    job = parse_args([flag, "hf", "prog"], environ={}, cwd=str(tmp_path))
    assert [(h.name, h.slots) for h in job.hosts] == [("a", 2), ("b", 3)]


def test_program_and_its_arguments_are_left_alone():
    job = parse_args(["-n", "2", "python", "-n", "--tag-output", "x"], environ={}, cwd="/")
    assert job.apps[0].argv == ("python", "-n", "--tag-output", "x")
    assert not job.output.tag


def test_one_and_two_dash_long_options():
    for dash in ("-", "--"):
        job = parse_args([f"{dash}bind-to", "core", f"{dash}map-by", "node",
                          f"{dash}oversubscribe", f"{dash}tag-output", "p"],
                         environ={}, cwd="/")
        assert (job.bind_to, job.map_by, job.oversubscribe, job.output.tag) == \
            ("core", "node", True, True)


def test_ppr_npernode_and_ppn():
    assert parse_args(["--map-by", "ppr:2:node", "p"], environ={}, cwd="/").per_node == 2
    for flag in ("-npernode", "--npernode", "-N", "-ppn"):
        assert parse_args([flag, "3", "p"], environ={}, cwd="/").per_node == 3
    assert parse_args(["--map-by", "slot:OVERSUBSCRIBE", "p"], environ={},
                      cwd="/").oversubscribe


def test_output_filename_suffixes_and_relative_directory():
    out = parse_args(["--output-filename", "logs", "p"], environ={}, cwd="/w").output
    assert (out.directory, out.copy_to_terminal, out.jobid_dir) == ("/w/logs", True, True)
    out = parse_args(["--output-filename", "/x/d:nocopy", "p"], environ={}, cwd="/w").output
    assert (out.directory, out.copy_to_terminal, out.jobid_dir) == ("/x/d", False, True)
    out = parse_args(["--output-filename", "d:nojobid,nocopy", "p"], environ={},
                     cwd="/w").output
    assert (out.directory, out.copy_to_terminal, out.jobid_dir) == ("/w/d", False, False)


@pytest.mark.parametrize("words, merged, directory", [
    ("merge-stderr-to-stdout", True, None), ("merge", True, None), ("merge-stderr", True, None),
    ("tag,directory=d", False, "/w/d"), ("dir=d,merge-std", True, "/w/d"),
])
def test_open_mpi_5s_output_words_and_their_starts(words, merged, directory):
    out = parse_args(["--output", words, "p"], environ={}, cwd="/w").output
    assert (out.merge_stderr, out.directory) == (merged, directory)


def test_an_unknown_output_word_is_refused():
    with pytest.raises(UsageError, match="unknown item 'mer'"):
        parse_args(["--output", "mer", "p"], environ={}, cwd="/w")


def test_timeout_from_flag_or_environment():
    job = parse_args(["--timeout", "2.5", "p"], environ={}, cwd="/")
    assert (job.timeout, job.timeout_source) == (2.5, "--timeout")
    job = parse_args(["p"], environ={"MPIEXEC_TIMEOUT": "7"}, cwd="/")
    assert (job.timeout, job.timeout_source) == (7, "MPIEXEC_TIMEOUT")
    with pytest.raises(UsageError, match="MPIEXEC_TIMEOUT"):
        parse_args(["p"], environ={"MPIEXEC_TIMEOUT": "soon"}, cwd="/")
    # Intel MPI's name, before its older spelling
    job = parse_args(["p"], environ={"I_MPI_JOB_TIMEOUT": "5", "MPIEXEC_TIMEOUT": "7"}, cwd="/")
    assert (job.timeout, job.timeout_source) == (5, "I_MPI_JOB_TIMEOUT")


@pytest.mark.parametrize("args, environ", [
    (["--timeout", "0"], {}),                            # Open MPI: no limit
    (["-timeout", "-1"], {}),
    ([], {"MPIEXEC_TIMEOUT": "-1"}),                     # Hydra: -1 means infinite
    ([], {"MPIEXEC_TIMEOUT": "0"}),
])
def test_a_timeout_of_zero_or_below_is_no_limit(args, environ):
    assert parse_args([*args, "p"], environ=environ, cwd="/").timeout is None


def test_the_command_lines_timeout_wins_unless_it_is_zero():
    # Open MPI 4.1.4: --timeout 0 is as if not given, and MPIEXEC_TIMEOUT then counts
    environ = {"MPIEXEC_TIMEOUT": "7"}
    assert parse_args(["--timeout", "3", "p"], environ=environ, cwd="/").timeout == 3
    assert parse_args(["--timeout", "0", "p"], environ=environ, cwd="/").timeout == 7


def test_help_and_version_raise_exit():
    for flag in ("-h", "--help"):
        with pytest.raises(_Exit):
            parse_args([flag], environ={}, cwd="/")


_TOKENS = st.sampled_from(["-n", "-np", "2", "0", "-x", "A=1", "A", "-H", "a:2", "a:x",
                           "--map-by", "node", "ppr:x:node", "--bind-to", "core", ":",
                           "--timeout", "-1", "prog", "--output-filename", "d:nocopy",
                           "--stdin", "all", "-genv", "--mca", "k", "v", "-l", "=",
                           "--bogus", "-", "--", "-wdir", "--grace", "nan", "inf"])


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(_TOKENS, st.text(max_size=6)), max_size=12))
def test_parser_raises_only_usage_errors(argv):
    try:
        parse_args(argv, environ={}, cwd="/")
    except (UsageError, _Exit):
        pass


# -- planner -------------------------------------------------------------------
def test_default_fills_hosts_in_order_and_map_by_node_deals_round_robin():
    assert place(hosts(2, 2), 4) == [0, 0, 1, 1]
    assert place(hosts(2, 2), 4, map_by="node") == [0, 1, 0, 1]
    assert place(hosts(2, 2), None) == [0, 0, 1, 1]
    assert place(hosts(2, 2), 3, map_by="node") == [0, 1, 0]
    assert place(hosts(4, 4), None, per_node=1) == [0, 1]


def test_oversubscription_spills_like_open_mpi():
    with pytest.raises(PlanError, match="not enough slots.*--oversubscribe"):
        place(hosts(2, 2), 5)
    assert place(hosts(2, 2), 5, oversubscribe=True) == [0, 0, 0, 1, 1]


def test_max_slots_as_open_mpi_4_applies_it():
    # Oversubscribing ignores max_slots (Open MPI 4.1.4 runs -n 4 on slots=2 max_slots=3).
    hs = hosts(2, 2, max_slots=[2, 3])
    assert place(hs, 6, oversubscribe=True) == [0, 0, 0, 1, 1, 1]
    with pytest.raises(PlanError, match="not enough slots"):
        place(hs, 5)
    # A host with max_slots and no slots= has max_slots slots.
    resolved = resolve_hosts([HostEntry("n1", None, 3)], ncores=2, hostname="vm",
                             is_local=lambda n: False)
    assert resolved[0].slots == 3


def test_ppr_more_than_slots_needs_oversubscribe():
    with pytest.raises(PlanError, match="oversubscribe"):
        place(hosts(1), 2, per_node=2)
    with pytest.raises(PlanError, match="per host"):
        place(hosts(2, 2), 5, per_node=2)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 6), st.one_of(st.none(), st.integers(1, 8))),
                min_size=1, max_size=6),
       st.one_of(st.none(), st.integers(1, 40)),
       st.sampled_from(["slot", "node"]), st.booleans(),
       st.one_of(st.none(), st.integers(1, 4)))
def test_placement_properties(spec, np, map_by, oversubscribe, per_node):
    hs = [Host(name=f"n{i}", slots=s, max_slots=(max(m, s) if m else None), local=False,
               node_id=i) for i, (s, m) in enumerate(spec)]
    try:
        where = place(hs, np, map_by=map_by, per_node=per_node, oversubscribe=oversubscribe)
    except PlanError:
        return
    if np is not None:
        assert len(where) == np            # every rank placed exactly once
    for i, h in enumerate(hs):
        count = where.count(i)
        if not oversubscribe:
            assert count <= (per_node if per_node is not None else h.slots)
            if h.max_slots is not None:
                assert count <= h.max_slots
    if map_by == "slot":                  # each host's ranks are contiguous
        seen = []
        for i in where:
            if not seen or seen[-1] != i:
                assert i not in seen
                seen.append(i)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=1, max_size=4), st.integers(1, 20),
       st.sampled_from(["slot", "node"]))
def test_local_ranks_are_contiguous_and_zero_based(slots, np, map_by):
    hl = ",".join(f"h{i}:{s}" for i, s in enumerate(slots))
    try:
        plan = plan_for(["-H", hl, "-n", str(np), "--oversubscribe", "--map-by", map_by, "p"])
    except PlanError:
        return
    by_host = {}
    for r in plan.ranks:
        by_host.setdefault(r.host.node_id, []).append(r)
    for ranks in by_host.values():
        assert [r.local_rank for r in ranks] == list(range(len(ranks)))
        assert all(r.local_size == len(ranks) for r in ranks)
        assert [r.rank for r in ranks] == sorted(r.rank for r in ranks)
    assert [r.rank for r in plan.ranks] == list(range(np))


def test_local_names_collapse_into_one_host_with_cores_as_default_slots():
    hs = resolve_hosts([HostEntry("localhost"), HostEntry("vm", 2), HostEntry("n1")],
                       ncores=4, hostname="vm", is_local=lambda n: n in ("localhost", "vm"))
    assert [(h.name, h.slots, h.local) for h in hs] == [("vm", 6, True), ("n1", 1, False)]


def test_log_paths_pad_rank_to_the_digits_of_np_as_open_mpi_4_1_4():
    assert log_paths("/d", True, False, 3, 9) == ("/d/1/rank.3/stdout", "/d/1/rank.3/stderr")
    assert log_paths("/d", True, False, 3, 10) == ("/d/1/rank.03/stdout",
                                                   "/d/1/rank.03/stderr")
    assert log_paths("/d", True, False, 3, 11)[0] == "/d/1/rank.03/stdout"
    assert log_paths("/d", False, True, 7, 100) == ("/d/rank.007/stdout", None)
    assert log_paths("/d", True, True, 7, 101, jobid=2) == ("/d/2/rank.007/stdout", None)


def test_scrub_env_removes_only_the_identity_of_an_outer_launch():
    env = {"PMI_FD": "3", "PMIX_RANK": "0", "OMPI_COMM_WORLD_RANK": "1", "PRTE_LAUNCHED": "1",
           "HYDI_CONTROL_FD": "9", "MPI_LOCALRANKID": "0", "HOME": "/root",
           "OMPI_UNIVERSE_SIZE": "4", "PMIX_NAMESPACE": "x", "PMIX_SERVER_URI2": "y",
           "OMPI_MCA_orte_hnp_uri": "z", "PMI_SIZE": "2", "PMI_PORT": "h:1", "PMI_ID": "7"}
    keep = {"HOME": "/root", "OMPI_MCA_btl": "self", "PMIX_MCA_gds": "hash",
            "PRTE_MCA_plm": "ssh", "PMI_DEBUG": "1", "SLURM_PROCID": "3"}
    assert scrub_env({**env, **keep}) == keep


def test_plan_env_user_master_port_and_mca():
    plan = plan_for(["-n", "2", "-x", "MASTER_PORT=1234", "--mca", "btl", "self", "p"])
    r = plan.ranks[1]
    assert r.env["MASTER_PORT"] == "1234" and r.env["OMPI_MCA_btl"] == "self"
    assert r.env["RANK"] == "1" and r.env["PMI_SIZE"] == "2"
    assert plan.process_mapping == "(vector,(0,1,2))"


def test_remote_plan_uses_rank0_host_as_master():
    plan = plan_for(["-H", "a:1,b:1", "p"])
    assert plan.master_addr == "a"
    assert plan.process_mapping == "(vector,(0,2,1))"


def test_stdin_target_must_exist():
    with pytest.raises(UsageError, match="--stdin 5"):
        plan_for(["-n", "2", "--stdin", "5", "p"])
    with pytest.raises(UsageError, match="--stdin 3"):   # size known only after placement
        plan_for(["-H", "a:2,b:1", "--stdin", "3", "p"])


@pytest.mark.parametrize("argv,launcher", [
    ([], "auto"),
    (["--launcher", "ssh"], "ssh"), (["-launcher", "rsh"], "ssh"), (["-bootstrap", "fork"], "local"),
    (["--mca", "plm", "rsh"], "ssh"), (["-mca", "plm", "isolated"], "local"),
    (["--mca", "plm", "^slurm"], "ssh"), (["--mca", "plm", "^rsh,ssh"], "slurm"),
    (["--mca", "plm", "slurm,rsh"], "auto"), (["--mca", "plm", "^slurm,rsh"], "local"),
    (["--mca", "plm", "rsh,isolated"], "ssh"),
])
def test_launcher_choices(argv, launcher):
    environ = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "h[1-2]"}
    job = parse_args(argv + ["-n", "1", "prog"], environ=environ, cwd="/")
    assert job.ssh.launcher == launcher


@pytest.mark.parametrize("argv", [["--launcher", "pbs"], ["--mca", "plm", "tm"],
                                  ["--mca", "plm", "^"], ["--mca", "plm", "rsh,,slurm"],
                                  ["--launcher", "^slurm"]])
def test_unknown_launchers_are_refused_naming_the_flag(argv):
    with pytest.raises(UsageError, match=argv[0]):
        parse_args(argv + ["-n", "1", "prog"], environ={}, cwd="/")


def test_slurm_outside_an_allocation_is_refused_naming_the_flag_given():
    with pytest.raises(UsageError, match=r"^--mca plm \^rsh: not inside a Slurm allocation"):
        parse_args(["--mca", "plm", "^rsh", "-n", "1", "prog"], environ={}, cwd="/")


def test_an_appfile_line_may_not_choose_the_launcher(tmp_path):
    """It is the whole job's choice; a line alone has no environment to check it in
    (and a bad MPIEXEC_TIMEOUT is not a line's fault either)."""
    app = tmp_path / "app"
    environ = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "h[1-2]", "MPIEXEC_TIMEOUT": "abc"}
    for line in ("--launcher slurm -n 1 prog", "-n 1 --mca plm ^rsh prog", "-bootstrap ssh prog"):
        app.write_text(line + "\n")
        with pytest.raises(UsageError, match=r"appfile .*:1: how agents start"):
            parse_args(["--timeout", "10", "--app", str(app)], environ=environ, cwd="/")
    app.write_text("-n 2 prog\n")
    job = parse_args(["--timeout", "10", "--launcher", "slurm", "--app", str(app)],
                     environ=environ, cwd="/")
    assert job.ssh.launcher == "slurm" and [list(a.argv) for a in job.apps] == [["prog"]]


# -- mslaunch's own on/off environment variables ---------------------------------

def test_switches_take_every_spelling_of_on_and_off_and_refuse_the_rest():
    from mslaunch.core.switches import SWITCHES, check_switches, switch
    for name, default in SWITCHES.items():
        assert switch(name, {}) is default and switch(name, {name: " "}) is default
        for on in ("1", "yes", "TRUE", " on ", "Y", "t"):
            check_switches({name: on})
            assert switch(name, {name: on}) is True
        for off in ("0", "No", "false", "OFF", "n", "F "):
            check_switches({name: off})
            assert switch(name, {name: off}) is False
        with pytest.raises(UsageError, match=f"^{name}='2': not a switch value"):
            check_switches({name: "2"})


@settings(max_examples=300)
@given(st.sampled_from(["MSLAUNCH_PTY", "MSLAUNCH_CGROUP", "MSLAUNCH_DIRECT_OUTPUT",
                        "MSLAUNCH_OUTPUT_TLS"]),
       st.one_of(st.text(max_size=8), st.sampled_from(["on", " Off", "YES", "0", "1 "])))
def test_a_switch_is_read_as_checked(name, value):
    """Whatever the value: refused naming the variable, or read as what it says."""
    from mslaunch.core.switches import SWITCHES, check_switches, switch
    try:
        check_switches({name: value})
    except UsageError as err:
        assert str(err).startswith(f"{name}=") and "\n" not in str(err)
        assert switch(name, {name: value}) is SWITCHES[name]
        return
    word = value.strip().lower()
    assert switch(name, {name: value}) is (
        SWITCHES[name] if not word else word in ("1", "true", "yes", "on", "t", "y"))


@pytest.mark.parametrize("argv, cpus", [
    (["-n", "1", "--cpu-list", "99", "--bind-to", "cpu-list", "p"], "99"),
    (["-n", "1", "--cpu-list", "0,5", "p"], "5"),
    (["-n", "1", "--cpu-set", "0", "--cpu-list", "1", "p"], "1"),   # left out by --cpu-set
])
def test_a_cpu_list_cpu_this_machine_lacks_is_refused_by_name(argv, cpus):
    with pytest.raises(PlanError, match=rf"--cpu-list .*: cpu\(s\) {cpus} not usable here"):
        plan_for(argv)


def test_a_cpu_list_is_not_checked_against_this_machine_for_remote_ranks():
    plan = plan_for(["-n", "1", "--cpu-list", "7", "--bind-to", "cpu-list", "p"],
                    entries=[HostEntry("h1", slots=1)], remote={"h1": machine(8)})
    assert plan.ranks[0].cpus == (7,)


@pytest.mark.parametrize("argv, said", [
    (["-n", "1", "--map-by", "slot:PE=3", "p"], "PE=3: a rank would need 3 cores, and vm has 2"),
    (["-n", "1", "--cpus-per-proc", "3", "p"], "PE=3: a rank would need 3 cores"),
    (["-n", "2", "--nooversubscribe", "--map-by", "slot:PE=2", "p"],
     "PE=2: 2 ranks on vm would need 4 cores, and it has 2; give fewer ranks"),
    (["-H", "vm:2", "-n", "2", "--map-by", "slot:PE=2", "p"], "PE=2: 2 ranks on vm would need"),
])
def test_more_cpus_per_rank_than_this_machine_has_is_refused_as_by_open_mpi(argv, said):
    with pytest.raises(PlanError, match=re.escape(said)):
        plan_for(argv)


def test_cpus_per_rank_shared_when_overload_is_allowed_or_on_another_host():
    for allowed in (["--bind-to", "core:overload-allowed"], ["--oversubscribe"], []):
        # (without a host list this machine runs what -n asks: it oversubscribes)
        plan = plan_for(["-n", "2", "--map-by", "slot:PE=2", *allowed, "p"])
        assert [r.cpus for r in plan.ranks] == [(0, 1), (0, 1)]
    assert plan_for(["-n", "1", "--map-by", "slot:PE=1", "p"]).ranks[0].cpus == (0,)
    plan = plan_for(["-n", "2", "--map-by", "slot:PE=4", "p"],
                    entries=[HostEntry("h1", slots=2)], remote={"h1": machine(8)})
    assert [r.cpus for r in plan.ranks] == [(0, 1, 2, 3), (4, 5, 6, 7)]
