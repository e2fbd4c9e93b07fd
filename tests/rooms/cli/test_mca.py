"""Open MPI's MCA parameters and Hydra's variables: where deployments configure mpirun.

The observed cases run the real mslaunch command; the table is held against
Open MPI 4.1.4's ``ompi_info``; the parser and the environment reading have
property tests.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import PY, REPO, clean_env, run
from requires import require
from mslaunch.cli import mpirun
from mslaunch.cli.mca import FAMILIES, PARAMS, lookup, markdown_table
from mslaunch.core.errors import UsageError
from mslaunch.mpi.mcafile import boolean, environment_params, parse_param_file

#: More slots than this machine has cores: the count cannot come from the cores.
SLOTS = len(os.sched_getaffinity(0)) + 1


def env_in(home, **extra):
    """A clean environment whose $HOME (and so ~/.openmpi) is the test's own."""
    return clean_env(HOME=str(home), **extra)


def ranks(result) -> int:
    assert result.returncode == 0, result.stderr
    return len(result.stdout.splitlines())


@pytest.fixture
def hostfile(tmp_path):
    path = tmp_path / "hf"
    path.write_text(f"localhost slots={SLOTS}\n")
    return path


# -- the observed cases ------------------------------------------------------------

def test_default_hostfile_from_the_environment(tmp_path, hostfile):
    # The MPI Operator's launcher pods set exactly this variable.
    r = run("hostname", env=env_in(tmp_path, OMPI_MCA_orte_default_hostfile=str(hostfile)))
    assert ranks(r) == SLOTS


def test_default_hostfile_from_mca_flag_and_tune_files(tmp_path, hostfile):
    env = env_in(tmp_path)
    assert ranks(run("--mca", "orte_default_hostfile", str(hostfile), "hostname", env=env)) == SLOTS
    for line in (f"orte_default_hostfile = {hostfile}", f"--mca orte_default_hostfile {hostfile}"):
        tune = tmp_path / "tune"
        tune.write_text(f"# a comment\n\n{line}\n")
        assert ranks(run("--tune", str(tune), "hostname", env=env)) == SLOTS


def test_default_hostfile_from_the_users_parameter_file(tmp_path, hostfile):
    conf = tmp_path / ".openmpi" / "mca-params.conf"
    conf.parent.mkdir()
    conf.write_text(f"orte_default_hostfile = {hostfile}\n")
    assert ranks(run("hostname", env=env_in(tmp_path))) == SLOTS
    # the environment beats the file, the command line beats both, as in Open MPI
    one = tmp_path / "one"
    one.write_text("localhost slots=1\n")
    env = env_in(tmp_path, OMPI_MCA_orte_default_hostfile=str(one))
    assert ranks(run("hostname", env=env)) == 1
    assert ranks(run("--mca", "orte_default_hostfile", str(hostfile), "hostname", env=env)) == SLOTS
    assert ranks(run("--hostfile", str(one), "hostname", env=env_in(tmp_path))) == 1


def test_oversubscribe_through_mca(tmp_path):
    env = env_in(tmp_path)
    assert run("-H", "localhost:1", "-n", "2", "true", env=env).returncode == 1
    r = run("--mca", "rmaps_base_oversubscribe", "1", "-H", "localhost:1", "-n", "2", "true",
            env=env)
    assert r.returncode == 0, r.stderr
    r = run("-H", "localhost:1", "-n", "2", "true",
            env=env_in(tmp_path, OMPI_MCA_rmaps_base_oversubscribe="true"))
    assert r.returncode == 0, r.stderr


def test_hydra_host_file(tmp_path):
    hf = tmp_path / "hf2"
    hf.write_text(f"localhost:{SLOTS}\n")
    for var in ("HYDRA_HOST_FILE", "I_MPI_HYDRA_HOST_FILE"):
        assert ranks(run("hostname", env=env_in(tmp_path, **{var: str(hf)}))) == SLOTS


def test_hydra_ppn_wraps_and_open_mpi_npernode_refuses(tmp_path):
    env = env_in(tmp_path)
    assert ranks(run("-n", "2", "-ppn", "1", "-hosts", "localhost", "hostname", env=env)) == 2
    assert run("-n", "2", "-npernode", "1", "-H", "localhost", "true", env=env).returncode == 1


def test_tag_output_and_bad_values_name_their_source(tmp_path):
    r = run("-n", "1", "echo", "hi", env=env_in(tmp_path, OMPI_MCA_orte_tag_output="1"))
    assert r.stdout == b"[1,0]<stdout>:hi\n"
    r = run("-n", "1", "true", env=env_in(tmp_path, OMPI_MCA_orte_tag_output="abc"))
    assert r.returncode == 2
    assert r.stderr.decode().splitlines() == [
        "mslaunch: error: OMPI_MCA_orte_tag_output (environment): expected a boolean "
        "(1, 0, true, false, yes, no), got 'abc'"]
    tune = tmp_path / "tune"
    tune.write_text("orte_tag_output = 1\nrmaps_base_n_pernode = x\n")
    r = run("-tune", str(tune), "-n", "1", "true", env=env_in(tmp_path))
    assert r.returncode == 2
    assert r.stderr.decode() == (f"mslaunch: error: -tune {tune}:2: rmaps_base_n_pernode: "
                                 f"expected a whole number, got 'x'\n")
    r = run("--mca", "rmaps_base_oversubscribe", "maybe", "-n", "1", "true", env=env_in(tmp_path))
    assert r.returncode == 2 and b"--mca rmaps_base_oversubscribe: expected a boolean" in r.stderr
    r = run("-n", "1", "true", env=env_in(tmp_path, OMPI_MCA_rmaps_base_mapping_policy="bogus"))
    assert r.returncode == 2 and r.stderr.startswith(
        b"mslaunch: error: OMPI_MCA_rmaps_base_mapping_policy (environment): --map-by bogus: ")


def test_accepted_parameters_are_noted_with_v(tmp_path):
    env = env_in(tmp_path, OMPI_MCA_orte_keep_fqdn_hostnames="true")
    r = run("-v", "-n", "1", "true", env=env)
    assert r.returncode == 0
    assert (b"note: OMPI_MCA_orte_keep_fqdn_hostnames (environment) has no effect here"
            in r.stderr)
    assert b"keep_fqdn" not in run("-n", "1", "true", env=env).stderr
    # the parameters of Open MPI's other runtime frameworks, which its daemons read
    r = run("-v", "-n", "1", "true", env=env_in(tmp_path, OMPI_MCA_oob_tcp_if_include="lo"))
    assert (b"note: OMPI_MCA_oob_tcp_if_include (environment) has no effect here: a parameter "
            b"of Open MPI's own runtime" in r.stderr), r.stderr
    r = run("--mca", "orte_fork_agent", "valgrind", "-n", "1", "true", env=env)
    assert r.returncode == 2 and b"orte_fork_agent: not supported" in r.stderr


def test_rsh_agent_and_args_reach_the_ssh_settings(tmp_path):
    env = {"HOME": str(tmp_path), "OMPI_MCA_plm_rsh_args": "-o ConnectionAttempts=10"}
    job = mpirun.parse_args(["--mca", "plm_rsh_agent", "ssh : rsh", "prog"], environ=env,
                            cwd=str(tmp_path))
    assert (job.ssh.rsh_agent, job.ssh.rsh_args) == ("ssh : rsh", "-o ConnectionAttempts=10")
    # and, like every parameter, they still reach the ranks
    assert ("plm_rsh_agent", "ssh : rsh") in job.mca


def test_param_files_variable_replaces_the_default_files(tmp_path, hostfile):
    conf = tmp_path / ".openmpi" / "mca-params.conf"
    conf.parent.mkdir()
    conf.write_text("orte_tag_output = 1\n")
    other = tmp_path / "other.conf"
    other.write_text(f"orte_default_hostfile = {hostfile}\n")
    r = run("hostname", env=env_in(tmp_path, OMPI_MCA_mca_base_param_files=str(other)))
    assert ranks(r) == SLOTS and not r.stdout.startswith(b"[1,")


# -- the table against Open MPI 4.1.4 -------------------------------------------------

def _ompi_info_names():
    require(shutil.which("ompi_info") is not None, "Open MPI 4.1.4's ompi_info (apt: openmpi-bin)")
    out = subprocess.run(["ompi_info", "--all", "--parsable"], capture_output=True, text=True,
                         check=True).stdout
    assert "ompi:version:full:4.1.4" in out
    names = set()
    for line in out.splitlines():
        parts = line.split(":")
        if (len(parts) > 5 and parts[0] == "mca" and parts[3] == "param"
                and parts[1] in ("orte", "rmaps", "hwloc", "plm", "ras")):
            names.add(parts[4])
    return names


def test_every_mpirun_parameter_of_ompi_info_has_a_disposition():
    names = _ompi_info_names()
    assert len(names) > 100
    missing = sorted(n for n in names if lookup(n) is None or lookup(n)[0] == "unknown")
    assert missing == []
    # and the table names no parameter that Open MPI 4.1.4 does not have
    assert sorted(n for n in PARAMS if n.startswith(FAMILIES) and n not in names) == []
    assert all(n in names or not n.startswith(FAMILIES) for n in PARAMS)


def test_docs_mca_table_is_the_codes():
    with open(os.path.join(REPO, "docs", "reference", "mca.md")) as f:
        readme = f.read()
    begin = readme.index("<!-- MCA table: generated by mslaunch.cli.mca.markdown_table() -->")
    shown = readme[readme.index("\n", begin) + 1:readme.index("<!-- end of MCA table -->")]
    assert shown == markdown_table(), "run: python scripts/options_table.py"


# -- properties of the parser and the environment reading ------------------------------

NAME = st.from_regex(r"[a-z][a-z0-9_]{0,20}", fullmatch=True)
VALUE = st.text(st.characters(blacklist_categories=("Cs", "Cc", "Zl", "Zp")), max_size=20).map(
    str.strip)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["eq", "flag", "x", "comment", "blank"]), NAME, VALUE),
                max_size=12), st.sampled_from([" ", "\t", "  "]))
def test_param_file_lines_read_back(lines, space):
    text, expect = [], []
    for number, (form, name, value) in enumerate(lines, 1):
        if form == "eq":
            text.append(f"{space}{name}{space}={space}{value}{space}")
            expect.append(("mca", name, value, number))
        elif form == "flag" and value:
            text.append(f"--mca {name}{space}{value}")
            expect.append(("mca", name, value, number))
        elif form == "x":
            text.append(f"-x {name.upper()}=1")
            expect.append(("x", name.upper(), "1", number))
        elif form == "comment":
            text.append(f"{space}# {name} = {value}")
        else:
            text.append(space)
    assert [tuple(s) for s in parse_param_file("\n".join(text), "f")] == expect


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_param_file_text_is_read_or_refused_in_one_line(text):
    try:
        settings_ = parse_param_file(text, "FILE")
    except UsageError as err:
        assert str(err).startswith("FILE:") and "\n" not in str(err)
        return
    for s in settings_:
        assert s.kind in ("mca", "x") and s.name and "=" not in s.name


@given(st.dictionaries(st.text(min_size=1, max_size=20), st.text(max_size=10), max_size=10))
def test_environment_params_are_the_ompi_mca_variables(environ):
    got = dict(environment_params(environ))
    assert got == {k[9:]: v for k, v in environ.items() if k.startswith("OMPI_MCA_") and k[9:]}


@given(st.text(max_size=8))
def test_boolean_is_open_mpis(word):
    b = boolean(word)
    w = word.strip().lower()
    if w in ("t", "true", "enabled", "yes", "y"):
        assert b is True
    elif w in ("f", "false", "disabled", "no", "n"):
        assert b is False
    elif b is not None:
        assert b == (int(w) != 0)


# -- side by side with Open MPI 4.1.4 ----------------------------------------------------

OMPIRUN = "/usr/bin/mpirun.openmpi"


def _side_by_side(tmp_path, args, env):
    require(os.access(OMPIRUN, os.X_OK), f"{OMPIRUN} (Debian's openmpi-bin 4.1.4)")
    full = env_in(tmp_path, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                  **env)
    got = []
    for argv in ([OMPIRUN, *args], [PY, "-m", "mslaunch", *args]):
        r = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, env=full,
                           cwd=str(tmp_path), timeout=60)
        assert r.returncode == 0 or argv[0] != OMPIRUN, r.stderr      # Open MPI's own failure
        got.append((r.returncode, sorted(r.stdout.splitlines())))
    return got


@pytest.mark.parametrize("case", [
    "env-hostfile", "user-file", "env-over-user-file", "tune-oversubscribe", "env-tag",
    "flag-over-tune", "env-over-tune", "env-over-tune-ranks", "gmca", "tune-in-env",
    "tune-flag-over-tune-in-env", "tune-word-of-the-program", "tune-by-mca", "empty-env",
    "empty-env-over-user-file", "default-slots",
    "param-files", "user-file-x", "dash-host", "n-pernode", "tune-on-the-search-path"])
def test_same_as_open_mpi_4(tmp_path, hostfile, case):
    one = tmp_path / "one"
    one.write_text("localhost slots=1\n")
    conf = tmp_path / ".openmpi" / "mca-params.conf"
    conf.parent.mkdir()
    tune = tmp_path / "tune"
    tune.write_text("orte_tag_output = 1\n--mca rmaps_base_oversubscribe 1\n")
    bare = tmp_path / "bare"
    bare.write_text("localhost\n")
    env = {}
    args = ["hostname"]
    if case == "env-hostfile":
        env = {"OMPI_MCA_orte_default_hostfile": str(hostfile)}
    elif case in ("user-file", "env-over-user-file"):
        conf.write_text(f"# the user's\norte_default_hostfile = {hostfile}\n")
        if case == "env-over-user-file":
            env = {"OMPI_MCA_orte_default_hostfile": str(one)}
    elif case == "tune-oversubscribe":
        args = ["--tune", str(tune), "-H", "localhost:1", "-n", "2", "echo", "x"]
    elif case == "env-tag":
        env = {"OMPI_MCA_orte_tag_output": "1"}
        args = ["-n", "1", "echo", "hi"]
    elif case == "flag-over-tune":
        args = ["--mca", "orte_tag_output", "0", "--tune", str(tune), "-H", "localhost:2",
                "-n", "2", "echo", "hi"]
    elif case == "env-over-tune":
        # an OMPI_MCA_* variable wins over a -tune file's setting of the same name
        env = {"OMPI_MCA_orte_tag_output": "0"}
        args = ["--tune", str(tune), "-H", "localhost:2", "-n", "2", "echo", "hi"]
    elif case == "env-over-tune-ranks":
        # ... for the ranks' parameters too
        tune.write_text("--mca btl_tcp_if_include eth9\n")
        env = {"OMPI_MCA_btl_tcp_if_include": "lo"}
        args = ["--tune", str(tune), "-n", "1", "printenv", "OMPI_MCA_btl_tcp_if_include"]
    elif case in ("tune-in-env", "tune-flag-over-tune-in-env"):
        # -tune's own parameter in the environment; a -tune flag replaces it
        env = {"OMPI_MCA_mca_base_envar_file_prefix": str(tune)}
        other = tmp_path / "other"
        other.write_text("-x FROM_TUNE=7\n")
        args = ["-n", "1", "sh", "-c", "echo hi $FROM_TUNE"]
        if case == "tune-flag-over-tune-in-env":
            args = ["--tune", str(other), *args]
    elif case == "tune-word-of-the-program":
        # a -tune among the program's own words replaces nothing
        (tmp_path / "x.tune").write_text("-x FROM_TUNE=7\n")
        env = {"OMPI_MCA_mca_base_envar_file_prefix": str(tmp_path / "x.tune")}
        args = ["-n", "1", "sh", "-c", "echo $FROM_TUNE", "sh", "--tune"]
    elif case == "tune-by-mca":
        args = ["--mca", "mca_base_envar_file_prefix", str(tune), "-n", "1", "echo", "hi"]
    elif case in ("empty-env", "empty-env-over-user-file"):
        # empty: the default, over what the files say
        if case == "empty-env-over-user-file":
            conf.write_text("orte_tag_output = 1\n")
        env = {"OMPI_MCA_orte_tag_output": ""}
        args = ["-n", "1", "echo", "hi"]
    elif case == "gmca":
        args = ["--gmca", "orte_tag_output", "1", "-n", "1", "echo", "hi"]
    elif case == "default-slots":
        env = {"OMPI_MCA_orte_set_default_slots": str(SLOTS)}
        args = ["--hostfile", str(bare), "hostname"]
    elif case == "dash-host":
        env = {"OMPI_MCA_orte_default_dash_host": f"localhost:{SLOTS}"}
    elif case == "n-pernode":
        env = {"OMPI_MCA_rmaps_base_n_pernode": "1"}
        args = ["-H", "localhost:2", "hostname"]
    elif case == "tune-on-the-search-path":
        # a bare name is looked for along mca_base_param_file_path, as Open MPI does
        sets = tmp_path / "sets"
        sets.mkdir()
        (sets / "ovs").write_text("rmaps_base_oversubscribe = 1\n")
        env = {"OMPI_MCA_mca_base_param_file_path": str(sets)}
        args = ["--tune", "ovs", "-H", "localhost:1", "-n", "2", "echo", "x"]
    elif case == "user-file-x":
        conf.write_text("-x FROM_CONF=5\n--mca orte_tag_output 1\n")
        args = ["-n", "1", "printenv", "FROM_CONF"]
    else:
        env = {"OMPI_MCA_mca_base_param_files": str(tune)}
        args = ["-H", "localhost:1", "-n", "2", "echo", "hi"]
    ompi_result, ours = _side_by_side(tmp_path, args, env)
    assert ompi_result[0] == 0 and ours == ompi_result


# -- Hydra's -ppn: blocks that wrap around the hosts ------------------------------------

def test_hydra_ppn_places_blocks_in_turn_as_hydra():
    # Hydra 5.0.2, -n 5 -ppn 2 -hosts localhost,127.0.0.1: PMI_HOSTNAME of ranks 0..4 is
    # localhost localhost 127.0.0.1 127.0.0.1 localhost.
    from mslaunch.plan import place
    from mslaunch.core.spec import Host
    two = [Host(name=n, slots=1, max_slots=None, local=False, node_id=i)
           for i, n in enumerate(("a", "b"))]
    assert place(two, 5, per_node=2, wrap=True) == [0, 0, 1, 1, 0]
    assert place(two, None, per_node=2, wrap=True) == [0, 0, 1, 1]
    job = mpirun.parse_args(["-ppn", "2", "prog"], environ={}, cwd="/")
    assert (job.per_node, job.per_node_wrap) == (2, True)
    job = mpirun.parse_args(["-npernode", "2", "prog"], environ={}, cwd="/")
    assert (job.per_node, job.per_node_wrap) == (2, False)
    job = mpirun.parse_args(["prog"], environ={"I_MPI_PERHOST": "3"}, cwd="/")
    assert (job.per_node, job.per_node_wrap) == (3, True)
    job = mpirun.parse_args(["-npernode", "1", "prog"], environ={"I_MPI_PERHOST": "3"}, cwd="/")
    assert (job.per_node, job.per_node_wrap) == (1, False)


HYDRA = os.path.join(os.path.dirname(PY), "mpiexec.hydra")


@pytest.mark.parametrize("args, env", [
    (["hostname"], {"HYDRA_HOST_FILE": "hf2"}),
    (["-n", "3", "-ppn", "1", "-hosts", "localhost", "hostname"], {}),
    (["-n", "2", "hostname"], {"MPIEXEC_PORT_RANGE": "20000:20100", "HYDRA_RMK": "user"}),
    (["-rmk", "user", "-ppn", "1", "-n", "2", "-hosts", "localhost", "hostname"], {}),
    (["-n", "2", "printenv", "MSL_TEST_SEEN"], {"HYDRA_ENV": "all", "MSL_TEST_SEEN": "1"}),
    (["-n", "2", "hostname"], {"HYDRA_DEBUG": "0", "HYDRA_LAUNCHER": "ssh"}),
])
def test_same_as_hydra(tmp_path, args, env):
    require(os.access(HYDRA, os.X_OK), "Hydra 5.0.2 of the mpich wheel (pip install '.[mpi]')")
    (tmp_path / "hf2").write_text(f"localhost:{SLOTS}\n")
    full = env_in(tmp_path, **env)
    got, said = [], []
    for argv in ([HYDRA, *args], [PY, "-m", "mslaunch", *args]):
        # A stdin that stays open, never at its end: Hydra's mpiexec forwards the end
        # of its stdin to its proxy and, when the proxy has already exited (a fast
        # job, mpiexec descheduled), dies of SIGPIPE in that write (it does not
        # ignore the signal).  With /dev/null: 2 of 100 runs beside one busy loop, and
        # every run with its reads slowed (strace -e inject=read:delay_enter=50000), rc
        # 141; with an open pipe, none.
        read_end, write_end = os.pipe()
        try:
            r = subprocess.run(argv, stdin=read_end, capture_output=True, env=full,
                               cwd=str(tmp_path), timeout=60)
        finally:
            os.close(read_end)
            os.close(write_end)
        got.append((r.returncode, len(r.stdout.splitlines())))
        said.append(r.stderr.decode(errors="replace")[-2000:])
    assert got[0][0] == 0 and got[1] == got[0], (got, said)


def test_hydra_variables_without_effect_are_noted_with_v(tmp_path):
    env = env_in(tmp_path, HYDRA_RMK="user", MPIEXEC_PREFIX_STDOUT="[%r]",
                 MPIEXEC_PREFIX_STDERR="[%r]")
    r = run("-v", "-n", "1", "true", env=env)
    assert r.returncode == 0, r.stderr
    notes = [line for line in r.stderr.decode().splitlines() if line.startswith("mslaunch: note:")]
    for name in ("HYDRA_RMK", "MPIEXEC_PREFIX_STDOUT", "MPIEXEC_PREFIX_STDERR"):
        assert any(f"note: {name} (environment) has no effect here" in n for n in notes), notes
    assert run("-n", "1", "true", env=env).stderr == b""      # only with -v


def test_hydra_variables_map_onto_options(tmp_path):
    def job(**env):
        return mpirun.parse_args(["prog"], environ=dict(env), cwd=str(tmp_path))
    assert job(HYDRA_ENV="all").forward_env and not job().forward_env
    assert job(HYDRA_DEBUG="1").verbose == 1 and job(HYDRA_DEBUG="0").verbose == 0
    assert job(MPIEXEC_TIMEOUT="7").timeout == 7.0
    assert not job(HYDRA_ENV="none").forward_env      # Hydra 5.0.2 ignores it too
    with pytest.raises(UsageError, match=r"^I_MPI_PERHOST \(environment\): expected a whole"):
        job(I_MPI_PERHOST="x")
    assert job(I_MPI_PERHOST="all").per_node is None
    # the command line wins: -f over HYDRA_HOST_FILE
    (tmp_path / "a").write_text("localhost:3\n")
    (tmp_path / "b").write_text("localhost:1\n")
    assert [h.slots for h in job(HYDRA_HOST_FILE="a").hosts] == [3]
    assert [h.slots for h in mpirun.parse_args(["-f", "b", "prog"], environ={
        "HYDRA_HOST_FILE": "a"}, cwd=str(tmp_path)).hosts] == [1]


def test_a_default_hostfile_that_fails_names_who_named_it(tmp_path):
    missing = str(tmp_path / "missing")
    r = run("-n", "1", "true", env=env_in(tmp_path, OMPI_MCA_orte_default_hostfile=missing))
    assert r.returncode == 2 and r.stderr.decode() == (
        f"mslaunch: error: OMPI_MCA_orte_default_hostfile (environment): hostfile {missing}: "
        f"cannot read: No such file or directory\n")
    r = run("-n", "1", "true", env=env_in(tmp_path, HYDRA_HOST_FILE=missing))
    assert r.returncode == 2 and r.stderr.startswith(
        b"mslaunch: error: HYDRA_HOST_FILE (environment): hostfile ")


@settings(max_examples=60, deadline=None)
@given(st.fixed_dictionaries({}, optional={
    "system": st.from_regex(r"[a-z0-9]{1,8}", fullmatch=True),
    "user": st.from_regex(r"[a-z0-9]{1,8}", fullmatch=True),
    "env": st.from_regex(r"[a-z0-9]{1,8}", fullmatch=True),
    "flag": st.from_regex(r"[a-z0-9]{1,8}", fullmatch=True)}))
def test_the_strongest_source_wins(tmp_path_factory, where):
    # system file < user file < OMPI_MCA_* < --mca (which the command line applies itself)
    from mslaunch.cli.mca import settings_below_command_line
    home = tmp_path_factory.mktemp("home")
    (home / ".openmpi").mkdir()
    system = home / "system.conf"
    if "system" in where:
        system.write_text(f"orte_xml_file = {where['system']}\n")
    if "user" in where:
        (home / ".openmpi" / "mca-params.conf").write_text(f"orte_xml_file={where['user']}\n")
    environ = {"HOME": str(home)}
    if "env" in where:
        environ["OMPI_MCA_orte_xml_file"] = where["env"]
    argv = ["--mca", "orte_xml_file", where["flag"], "prog"] if "flag" in where else ["prog"]
    params, _ = settings_below_command_line(environ, argv, sysconf=str(system))
    expect = [where[k] for k in ("system", "user", "env") if k in where]
    if "flag" in where or not expect:
        assert params == []
    else:
        assert [(n, v) for n, v, _ in params] == [("orte_xml_file", expect[-1])]
