"""Which rsh agent the command line and the environment choose (Open MPI's and
Hydra's spellings), and which starter a job gets from it."""

from __future__ import annotations

import pytest

from helpers import run
from mslaunch.cli.mpirun import parse_args
from mslaunch.core.errors import LaunchError, UsageError
from mslaunch.backends.agents.starters.starter import starter_for

CFG = "-F /etc/cfg"


@pytest.mark.parametrize("argv, environ, agent, args", [
    ([], {}, "", ""),
    (["--mca", "plm_rsh_agent", "ssh : rsh"], {}, "ssh : rsh", ""),
    (["--mca", "plm_rsh_args", CFG], {}, "", CFG),
    ([], {"OMPI_MCA_plm_rsh_agent": "/etc/mpi/kubexec.sh"}, "/etc/mpi/kubexec.sh", ""),
    (["-launcher", "rsh"], {}, "rsh", ""),
    (["-launcher", "ssh"], {}, "", ""),
    (["-launcher", "rsh", "-launcher-exec", "/k.sh"], {}, "/k.sh", ""),
    (["-bootstrap-exec", "/k.sh", "-bootstrap-exec-args", CFG], {}, "/k.sh", CFG),
    ([], {"HYDRA_LAUNCHER_EXEC": "/a", "HYDRA_BOOTSTRAP_EXEC": "/b"}, "/a", ""),
    ([], {"I_MPI_HYDRA_BOOTSTRAP_EXEC": "/i", "I_MPI_HYDRA_BOOTSTRAP_EXEC_EXTRA_ARGS": CFG},
     "/i", CFG),
    ([], {"HYDRA_LAUNCH_EXTRA_ARGS": CFG}, "", CFG),
    ([], {"HYDRA_LAUNCHER_EXTRA_ARGS": CFG}, "", CFG),
    ([], {"HYDRA_LAUNCHER": "rsh"}, "rsh", ""),
    (["-launcher-exec", "/flag"], {"HYDRA_LAUNCHER_EXEC": "/env"}, "/flag", ""),
])
def test_rsh_agent_settings(argv, environ, agent, args):
    job = parse_args(argv + ["-n", "1", "prog"], environ=environ, cwd="/")
    assert (job.ssh.rsh_agent, job.ssh.rsh_args) == (agent, args)


def test_hydra_launcher_variables_choose_the_launcher_and_the_flag_wins():
    job = parse_args(["-n", "1", "prog"], environ={"HYDRA_BOOTSTRAP": "fork"}, cwd="/")
    assert job.ssh.launcher == "local"
    job = parse_args(["-launcher", "ssh", "-n", "1", "prog"],
                     environ={"I_MPI_HYDRA_BOOTSTRAP": "fork"}, cwd="/")
    assert job.ssh.launcher == "ssh"
    with pytest.raises(UsageError, match="^HYDRA_LAUNCHER pbs: expected"):
        parse_args(["-n", "1", "prog"], environ={"HYDRA_LAUNCHER": "pbs"}, cwd="/")


def test_the_starter_follows_the_settings():
    def kind(environ, **spec):
        job = parse_args(["-n", "1", "prog"], environ=environ, cwd="/")
        from mslaunch.core.spec import replace
        return type(starter_for(replace(job.ssh, **spec), environ)).__name__
    path = {"PATH": "/usr/bin:/bin"}
    assert kind(path) == "SSHStarter"
    assert kind(path, rsh_agent="sh") == "RshStarter"
    assert kind(path, rsh_args=CFG) == "RshStarter"           # the OpenSSH client
    assert kind(dict(path, LSB_JOBID="1", LSB_MCPU_HOSTS="a 1", LSF_BINDIR="/bin"),
                rsh_agent="sh") == "RshStarter"
    with pytest.raises(LaunchError, match="^inside an LSF job: blaunch is not on PATH"):
        kind(dict(path, LSB_JOBID="1", LSB_MCPU_HOSTS="a 1"))
    assert kind(dict(path, LSB_JOBID="1", LSB_MCPU_HOSTS="a 1"), launcher="ssh") == "SSHStarter"


def test_an_appfile_line_may_not_choose_the_rsh_agent(tmp_path):
    app = tmp_path / "app"
    app.write_text("-launcher-exec /k.sh -n 1 prog\n")
    with pytest.raises(UsageError, match=r"appfile .*:1: how agents start"):
        parse_args(["--app", str(app)], environ={}, cwd="/")


@pytest.mark.parametrize("flags", [["--ssh-user", "bob"], ["--ssh-port", "2222"],
                                   ["--ssh-identity", "/dev/null"], ["--ssh-accept-new"]])
def test_mslaunchs_own_ssh_flags_with_an_rsh_agent_are_one_error_line(flags):
    # The agent is 'true' (it reaches nothing): were the flags let through, the
    # job would fail later, saying that the agent never dialled back.
    r = run("--mca", "plm_rsh_agent", "true", *flags, "-H", "192.0.2.7", "-n", "1", "true")
    err = r.stderr.decode()
    assert r.returncode == 2, err
    assert err.count("\n") == 1 and err.startswith(f"mslaunch: error: {flags[0]}: "), err
    assert "plm_rsh_args" in err


@pytest.mark.parametrize("value, python, wrapper", [
    ("orted", None, ()),
    ("/opt/ompi/bin/orted", None, ()),
    ("prted", None, ()),
    ("enroot start IMAGE orted", None, ("enroot", "start", "IMAGE")),
    ("singularity exec 'my image.sif' orted", None, ("singularity", "exec", "my image.sif")),
    ("orted --mca foo bar", None, ()),                   # the daemon's arguments: dropped
    ("wrap orted -d", None, ("wrap",)),
    # the last word naming the daemon is the program, as Open MPI finds it
    ("singularity exec -B /opt/ompi/bin/orted:/usr/bin/orted img.sif orted", None,
     ("singularity", "exec", "-B", "/opt/ompi/bin/orted:/usr/bin/orted", "img.sif")),
    ("/opt/py/bin/python3", "/opt/py/bin/python3", ()),
    ("env A=1 /opt/py/bin/python3", "/opt/py/bin/python3", ("env", "A=1")),
])
def test_launch_agent_is_read_as_open_mpi_reads_it(value, python, wrapper):
    for argv, environ in ((["--launch-agent", value], {}),
                          (["--mca", "orte_launch_agent", value], {}),
                          ([], {"OMPI_MCA_orte_launch_agent": value})):
        job = parse_args([*argv, "-H", "h1", "true"], environ={"HOME": "/", **environ},
                         cwd=".")
        assert (job.ssh.remote_python, job.ssh.agent_wrapper) == (python, wrapper), argv
    # the last setting wins, the default included
    job = parse_args(["--launch-agent", "orted", "-H", "h1", "true"], cwd=".",
                     environ={"HOME": "/", "OMPI_MCA_orte_launch_agent": "/opt/py/bin/python3"})
    assert job.ssh.remote_python is None
    # --remote-python is mslaunch's own: an orted launch agent leaves it
    job = parse_args(["--remote-python", "/p/python3", "--launch-agent", "wrap orted", "-H", "h1",
                      "true"], environ={"HOME": "/"}, cwd=".")
    assert (job.ssh.remote_python, job.ssh.agent_wrapper) == ("/p/python3", ("wrap",))


def test_a_launch_agent_that_is_not_words_is_one_line():
    r = run("--launch-agent", "wrap 'orted", "-H", "h1", "true")
    assert r.returncode == 2 and r.stderr.count(b"\n") == 1, r.stderr
    assert b"--launch-agent: cannot read" in r.stderr and b"no closing quotation" in r.stderr


def test_mslaunch_s_own_double_dash_launcher_is_not_hydra_s_spelling():
    # Hydra's -launcher makes a command line Hydra's, whose remote ranks get the
    # whole environment; mslaunch's --launcher (also --launcher srun) does not.
    for flag, whole in (("-launcher", True), ("--launcher", False)):
        job = parse_args([flag, "ssh", "-H", "h1,h2", "-n", "2", "prog"], environ={}, cwd="/")
        assert job.forward_env is whole, flag


def _literal_words(name: str) -> set:
    """The words of ``name``'s ``Literal`` in mslaunch/core/states.py."""
    import ast
    import mslaunch.core.states as states
    with open(states.__file__) as f:
        tree = ast.parse(f.read())
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and [t.id for t in node.targets
                                             if isinstance(t, ast.Name)] == [name]:
            return {e.value for e in node.value.slice.elts}
    raise AssertionError(f"{name} not found")


def test_launcher_words_come_from_the_starters_and_backends_tables():
    from mslaunch.cli.draft import launcher_words
    words = launcher_words()
    # every launcher a table names is one of LauncherName's words, and each of those is named
    assert set(words.values()) == _literal_words("LauncherName")
    assert words == {"auto": "auto", "slurm": "slurm", "local": "local", "fork": "local",
                     "isolated": "local", "ssh": "ssh", "rsh": "ssh", "srun": "srun",
                     "sge": "auto", "lsf": "auto"}
    assert "srun" not in launcher_words(starters_only=True)     # not an Open MPI plm
    for word, name in words.items():
        if name not in ("slurm", "srun"):            # (they need an allocation)
            job = parse_args(["--launcher", word, "-n", "1", "prog"], environ={})
            assert job.ssh.launcher == name


@pytest.mark.parametrize("argv", [["--launcher", "bogus"], ["--mca", "plm", "rsh,bogus"],
                                  ["--mca", "plm", "srun"]])
def test_a_launcher_word_of_no_table_is_refused_with_the_words_of_the_tables(argv):
    with pytest.raises(UsageError) as err:
        parse_args([*argv, "-n", "1", "prog"], environ={})
    assert "expected slurm, local, ssh" in str(err.value)
    assert ("srun or auto" in str(err.value)) == (argv[0] == "--launcher")
    assert "also fork, isolated, lsf, rsh, sge)" in str(err.value)
