"""Open MPI ranks on a host without a fabric skip the components that cannot work there.

mslaunch/mpi/pmix/fabric.py: ranks served PMIx on a host with no InfiniBand, RoCE,
Omni-Path, EFA, Slingshot or GPU device are told to leave out Open MPI's
``cm`` PML and ``ofi`` BTL, which cost 4.1.4 about 200 ms and 5.0.11 about
a second of ``MPI_Init`` to rule out; the components Open MPI selects stay
the same, and a choice of the user's or the site's wins.  Unit tests of the
rules and of the parameter-file reading (mslaunch/mpi/pmi/mcaparams.py), then
real Open MPI 4.1.4 and 5 ranks, here and on the SSH test hosts.
"""

from __future__ import annotations

import os
import re

import pytest
from helpers import clean_env, kill_tagged, new_tag, program, run
from hypothesis import given, settings
from hypothesis import strategies as st

from mslaunch.mpi.pmi import mcaparams
from mslaunch.mpi.pmix import fabric

SKIPS = program("ompi_skips.py")


def _skips(env, files=None, plain=True):
    files = files or {}
    names = [k[len("OMPI_MCA_"):] for k in env if k.startswith("OMPI_MCA_")] + list(files)
    return fabric.skips(env, files.get, lambda: names, plain=plain)


# -- the rules --------------------------------------------------------------------------

def test_a_plain_host_with_nothing_set_skips_cm_and_the_ofi_btl():
    assert _skips({}) == {"OMPI_MCA_pml": "^cm", "OMPI_MCA_btl": "^ofi"}


def test_a_host_with_a_fabric_or_a_gpu_is_left_alone():
    assert _skips({}, plain=False) == {}


def test_exclusion_lists_are_extended_and_inclusion_lists_kept():
    assert _skips({"OMPI_MCA_pml": "^ucx", "OMPI_MCA_btl": "self,vader"}) == \
        {"OMPI_MCA_pml": "^ucx,cm"}
    assert _skips({"OMPI_MCA_btl": "^tcp"}) == {"OMPI_MCA_pml": "^cm", "OMPI_MCA_btl": "^tcp,ofi"}
    assert _skips({"OMPI_MCA_pml": "^cm", "OMPI_MCA_btl": " ^ ofi , tcp"}) == {}


def test_debians_site_file_is_extended():
    # /etc/openmpi/openmpi-mca-params.conf of Debian 12's Open MPI 4.1.4
    files = {"mtl": "^ofi", "btl": "^uct,openib,ofi", "pml": "^ucx", "osc": "^ucx,pt2pt"}
    assert _skips({}, files) == {"OMPI_MCA_pml": "^ucx,cm", "OMPI_MCA_btl": "^uct,openib,ofi"}


def test_a_files_list_that_leaves_out_working_components_is_not_carried_over():
    # the file may be another installation's: excluding tcp there must not reach this rank
    assert _skips({}, {"btl": "^tcp"}) == {"OMPI_MCA_pml": "^cm"}


def test_the_users_mtl_or_component_parameters_leave_a_framework_alone():
    assert _skips({"OMPI_MCA_mtl": "psm2"}) == {"OMPI_MCA_btl": "^ofi"}
    assert _skips({}, {"mtl_ofi_provider_include": "tcp"}) == {"OMPI_MCA_btl": "^ofi"}
    assert _skips({"OMPI_MCA_btl_ofi_provider_include": "tcp"}) == {"OMPI_MCA_pml": "^cm"}
    assert _skips({"OMPI_MCA_mtl": "^ofi"}) == {"OMPI_MCA_pml": "^cm", "OMPI_MCA_btl": "^ofi"}


def test_mslaunch_ompi_skip_0_turns_it_off():
    assert _skips({"MSLAUNCH_OMPI_SKIP": "0"}) == {}


_COMPONENTS = st.sampled_from(["cm", "ucx", "ofi", "tcp", "vader", "sm", "self", "uct", "ob1"])


@given(pml=st.none() | st.lists(_COMPONENTS, max_size=4), excl=st.booleans(),
       in_env=st.booleans())
def test_a_value_is_only_ever_extended(pml, excl, in_env):
    value = None if pml is None else ("^" if excl else "") + ",".join(pml)
    where = {"OMPI_MCA_pml": value} if in_env and value is not None else {}
    files = {"pml": value} if not in_env and value is not None else {}
    out = _skips(where, files).get("OMPI_MCA_pml")
    if out is None:
        return
    listed = out[1:].split(",")
    assert out.startswith("^") and "cm" in listed
    if value:   # what was there stays, in its order, and cm is added at most once
        assert excl and listed[:len(pml)] == pml and listed.count("cm") == max(1, pml.count("cm"))


def test_fabric_devices_are_found_where_their_drivers_put_them(tmp_path):
    assert fabric.fabric_devices(str(tmp_path)) == []
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "null").touch()
    (tmp_path / "dev" / "infiniband").mkdir()
    (tmp_path / "dev" / "infiniband" / "rdma_cm").touch()     # the module alone: no device
    assert fabric.fabric_devices(str(tmp_path)) == []
    (tmp_path / "dev" / "hfi1_0").touch()
    (tmp_path / "sys" / "class" / "infiniband" / "mlx5_0").mkdir(parents=True)
    assert fabric.fabric_devices(str(tmp_path)) == ["/sys/class/infiniband/mlx5_0",
                                                    "/dev/hfi1_0"]


# -- which files a rank reads ---------------------------------------------------------------

def test_the_users_file_wins_over_the_installations_and_bad_lines_hide_nothing(tmp_path):
    home = tmp_path / "home"
    (home / ".openmpi").mkdir(parents=True)
    (home / ".openmpi" / "mca-params.conf").write_text(
        "# mine\nbtl = self,tcp\nthis line is not a setting\n-mca pml ob1\n")
    prefix = tmp_path / "prefix"
    (prefix / "etc").mkdir(parents=True)
    (prefix / "etc" / "openmpi-mca-params.conf").write_text("btl = ^tcp\ncoll_tuned_priority = 7\n")
    env = {"HOME": str(home), "OPAL_PREFIX": str(prefix)}
    assert mcaparams.from_files(env, "btl") == "self,tcp"
    assert mcaparams.from_files(env, "pml") == "ob1"
    assert mcaparams.from_files(env, "coll_tuned_priority") == "7"
    assert {"btl", "pml", "coll_tuned_priority"} <= set(mcaparams.names_set(env))
    # mca_base_param_files replaces the list; a tune file comes before it
    tune = tmp_path / "tune.conf"
    tune.write_text("pml = cm\n")
    env2 = dict(env, OMPI_MCA_mca_base_param_files=str(prefix / "etc" /
                                                        "openmpi-mca-params.conf"),
                OMPI_MCA_mca_base_envar_file_prefix=str(tune))
    assert mcaparams.from_files(env2, "btl") == "^tcp"
    assert mcaparams.from_files(env2, "pml") == "cm"


# -- real Open MPI ----------------------------------------------------------------------------

def _job(ompi, *args, **extra):
    python, env, _ = ompi
    tag = new_tag()
    try:
        return run(*args, python, SKIPS, timeout=120,
                   env=clean_env(MSL_TEST_TAG=tag, **env, **extra))
    finally:
        kill_tagged(tag)


def _lines(r):
    assert r.returncode == 0, r.stderr
    return sorted(x for x in r.stdout.decode().splitlines() if x.startswith("rank "))


def _expected_pml():
    value = mcaparams.from_files(dict(os.environ), "pml")
    return "^cm" if not value else value + ",cm"


def test_ranks_here_get_the_skips_and_run_on_their_library(ompi):
    lines = _lines(_job(ompi, "-n", "2"))
    assert len(lines) == 2 and all(ompi[2] in x for x in lines), lines
    want = "pml=None" if fabric.fabric_devices() else f"pml={_expected_pml()}"
    assert all(want in x for x in lines), (want, lines)


def test_a_users_choice_wins(ompi):
    lines = _lines(_job(ompi, "-n", "2", "--mca", "btl", "self,tcp",
                        OMPI_MCA_mtl="^psm2"))
    assert all("btl=self,tcp" in x for x in lines), lines
    lines = _lines(_job(ompi, "-n", "2", MSLAUNCH_OMPI_SKIP="0"))
    assert all("pml=None btl=None" in x for x in lines), lines


_SELECTED = re.compile(rb"(select: component \w+ selected|Using \w+ btl for send to)")


def _selection(ompi, **extra):
    r = _job(ompi, "-n", "2", OMPI_MCA_pml_base_verbose="10", OMPI_MCA_btl_base_verbose="10",
             **extra)
    assert r.returncode == 0, r.stderr
    return sorted(set(_SELECTED.findall(r.stdout + r.stderr)))


def test_open_mpi_selects_the_same_components_with_and_without_the_skips(ompi):
    skipped, probed = _selection(ompi), _selection(ompi, MSLAUNCH_OMPI_SKIP="0")
    assert skipped and skipped == probed, (skipped, probed)


@pytest.mark.remote
def test_ranks_on_remote_hosts_get_their_hosts_skips(sshbed, ompi, tmp_path):
    from remote import renv, run_remote, settle
    python, env, _ = ompi
    home = sshbed.make_home(tmp_path / "home")
    tag = new_tag()
    try:
        r = run_remote(home, "-H", "h1:1,h2:1", "-n", "2", "-x", "MSL_TEST_TAG",
                       *[a for k in env for a in ("-x", k)], python, SKIPS,
                       env=renv(home, MSL_TEST_TAG=tag, **env), timeout=180)
        settle(tag, sshbed)
    finally:
        kill_tagged(tag)
    lines = _lines(r)
    assert len(lines) == 2 and all(f"pml={_expected_pml()}" in x for x in lines), lines


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(
    st.text(st.sampled_from(list("ab_=- \t#\"'x0")), max_size=20),
    st.builds(lambda n, v: f"{n} = {v}", st.from_regex(r"[a-z_]{1,8}", fullmatch=True),
              st.text(st.sampled_from(list("ab ^,=")), max_size=8)),
    st.builds(lambda n, v: f"--mca {n} {v}", st.from_regex(r"[a-z_]{1,8}", fullmatch=True),
              st.from_regex(r"[a-z^,]{1,8}", fullmatch=True))), max_size=8))
def test_a_parameter_files_plain_lines_are_read_as_the_full_parser_reads_them(lines):
    # mcaparams reads 'name = value' itself, without importing mcafile
    from mslaunch.core.errors import UsageError
    from mslaunch.mpi.mcafile import parse_param_file
    want: dict = {}
    for line in lines:
        try:
            settings = parse_param_file(line, "f")
        except UsageError:
            continue
        for s in settings:
            if s.kind == "mca" and s.value is not None:
                want.setdefault(s.name, s.value)
    assert mcaparams._parse("\n".join(lines), "f") == want


def test_the_skips_worked_out_once_per_process_are_keyed_by_all_they_read():
    from mslaunch.mpi import pmix
    assert {"OMPI_MCA_" + f for f, _, _ in fabric.SKIPS} | {"OMPI_MCA_mtl"} \
        <= set(pmix._SKIPS_READ)
    base = {"HOME": "/nonexistent", "OMPI_MCA_mpi_show_mca_params_file": "/x/1"}
    first = pmix.rank_extras("ns", "/d", base)
    # another rank's own file: the same answer; a user's pml: not taken from the first
    assert pmix.rank_extras("ns", "/d", dict(base, OMPI_MCA_mpi_show_mca_params_file="/x/2")) \
        == first
    chosen = pmix.rank_extras("ns", "/d", dict(base, OMPI_MCA_pml="ob1"))
    assert "OMPI_MCA_pml" not in chosen or chosen["OMPI_MCA_pml"] != first.get("OMPI_MCA_pml")
