#!/usr/bin/env bash
# Installs everything the test suite needs, then runs it:  bash scripts/test.sh
# System packages come from apt (when run as root); Python packages go into
# .venv.  A piece that cannot be installed fails the run: nothing is skipped
# for lack of it.
set -euo pipefail
cd "$(dirname "$0")/.."

apt_needed=()
command -v gcc >/dev/null 2>&1 || apt_needed+=(gcc libc6-dev)
# building Open MPI 4.1.4 from its source (scripts/build-openmpi4.sh)
{ command -v make && command -v g++ && command -v perl; } >/dev/null 2>&1 || apt_needed+=(make g++ perl)
[ -e /usr/include/slurm/pmi2.h ] || apt_needed+=(libpmi2-0-dev)
command -v ps >/dev/null 2>&1 || apt_needed+=(procps)
python3 -m venv --help >/dev/null 2>&1 || apt_needed+=(python3-venv)
# the multi-host SSH test bed (tests/support/sshbed.py): sshd hosts in network namespaces
[ -x /usr/sbin/sshd ] || apt_needed+=(openssh-server)
{ command -v ssh && command -v ssh-keygen; } >/dev/null 2>&1 || apt_needed+=(openssh-client)
command -v ip >/dev/null 2>&1 || apt_needed+=(iproute2)
{ command -v nsenter && command -v unshare; } >/dev/null 2>&1 || apt_needed+=(util-linux)
# Open MPI 4.1.4, what the mpirun tutorials install: the reference that tests
# compare with side by side; Debian's mpi4py built on it; gdb for stack traces
[ -x /usr/bin/mpirun.openmpi ] || apt_needed+=(openmpi-bin)
[ -e /usr/lib/python3/dist-packages/mpi4py/__init__.py ] || apt_needed+=(python3-mpi4py)
command -v gdb >/dev/null 2>&1 || apt_needed+=(gdb)
# msrun's --bind_numa file binds memory through numactl, as msrun does
command -v numactl >/dev/null 2>&1 || apt_needed+=(numactl)
# native frames of running ranks (mslaunch-stacks), and a real terminal for mslaunch-top's test
command -v eu-stack >/dev/null 2>&1 || apt_needed+=(elfutils)
command -v tmux >/dev/null 2>&1 || apt_needed+=(tmux)
# the man page rendered and checked (groff), and the zsh completion script read by zsh
command -v groff >/dev/null 2>&1 || apt_needed+=(groff-base)
command -v man >/dev/null 2>&1 || apt_needed+=(man-db)
command -v zsh >/dev/null 2>&1 || apt_needed+=(zsh)
# DeepSpeed's pdsh runner, side by side with mslaunch on the SSH test hosts
command -v pdsh >/dev/null 2>&1 || apt_needed+=(pdsh)
# the Slurm test bed (tests/support/slurmbed.py): munged, slurmctld and one slurmd per
# network-namespace node, none of them started as a service
{ [ -x /usr/sbin/slurmctld ] && [ -x /usr/sbin/slurmd ] && command -v srun; } >/dev/null 2>&1 || apt_needed+=(slurm-wlm)
[ -x /usr/sbin/munged ] || apt_needed+=(munge)
# the Grid Engine cell (tests/support/gebed.py): Debian's 8.1.9, no daemon started as a service
{ [ -x /usr/sbin/sge_qmaster ] && [ -x /usr/sbin/sge_execd ] && command -v qsub; } >/dev/null 2>&1 \
    || apt_needed+=(gridengine-master gridengine-exec gridengine-client)
if [ ${#apt_needed[@]} -gt 0 ]; then
    if [ "$(id -u)" != 0 ]; then
        echo "scripts/test.sh: need root to apt-get install ${apt_needed[*]}" >&2
        exit 1
    fi
    # install services (openssh-server, munge, slurm) without starting them: no
    # system sshd on :22, no system munged or Slurm daemons
    made_policy=
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
        chmod 755 /usr/sbin/policy-rc.d
        made_policy=1
        trap 'rm -f /usr/sbin/policy-rc.d' EXIT
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${apt_needed[@]}" >/dev/null
    if [ -n "$made_policy" ]; then
        rm -f /usr/sbin/policy-rc.d
        trap - EXIT
    fi
fi
# sshd's privilege separation directory (the test bed creates it too)
if [ "$(id -u)" = 0 ]; then
    install -d -m 0755 /run/sshd
fi

# Open MPI 4.1.4 built from source as the MindSpore tutorials build it, for
# tests/system/openmpi/test_ompi_source.py: once per machine (about 8 minutes on 2 cores,
# more on a slow one, into ~/.cache/mslaunch-tests), in the background from here on, at a
# lower priority than the tests beside it; the suite starts without waiting for it, and that
# test module waits for it and fails, showing its log, when it failed.
MSLAUNCH_TEST_OMPI4_BUILD_LOG=$(mktemp)
export MSLAUNCH_TEST_OMPI4_BUILD_LOG
( status=0
  nice -n 10 bash scripts/build-openmpi4.sh > "$MSLAUNCH_TEST_OMPI4_BUILD_LOG" 2>&1 || status=$?
  echo "$status" > "$MSLAUNCH_TEST_OMPI4_BUILD_LOG.rc" ) &

python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
# (editable as a plain path in a .pth file where setuptools still offers it: its default
# import hook costs every Python started in .venv, each mslaunch and each rank, about
# 0.07 s more on a slow machine)
.venv/bin/python -m pip install -q -e '.[test]' --config-settings editable_mode=compat \
    2>/dev/null || .venv/bin/python -m pip install -q -e '.[test]'
# The package's bytecode, once: where PYTHONDONTWRITEBYTECODE is set (as on
# these machines), every mslaunch the tests start would compile it anew.
.venv/bin/python -m compileall -q mslaunch
# Real MindSpore (CPU wheel, about 800 MB) for msrun mode's real jobs; numpy<2 as its
# workers need it (with numpy 2 a PYNATIVE worker never unregisters).
# Frameworks that find their job in mpirun's environment
# (tests/system/local/test_frameworks.py): jax's CPU wheel (0.6, which runs on numpy 1;
# jax 0.10 needs numpy 2), torch's CPU build only (the plain torch==2.13.0 pulls CUDA
# packages; +cpu fails rather than fetching them when no CPU wheel is reachable); DeepSpeed's
# launcher, side by side with mslaunch's DeepSpeed dialect.  One resolve, so that numpy
# stays below 2.
.venv/bin/python -m pip install -q 'mindspore==2.10.0' 'numpy<2' 'jax<0.7' 'jaxlib<0.7' \
    'torch==2.13.0+cpu' 'deepspeed==0.19.8'
export MSLAUNCH_TEST_REQUIRE_ALL=1   # tests fail instead of skipping when a piece is missing

# The Python versions the package promises (tests/support/pythons.py reads them from
# setup.cfg and the agent's bootstrap): each interpreter must be found here, or
# installed from Debian's packages, or the run fails.
need_python() {
    local found
    if found=$(python3 tests/support/pythons.py "$1"); then
        echo "$found"
        return 0
    fi
    if [ "$(id -u)" = 0 ]; then
        apt-get update -qq >&2
        if apt-cache show "python$1-venv" >/dev/null 2>&1; then
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
                "python$1" "python$1-venv" >/dev/null
            if found=$(python3 tests/support/pythons.py "$1"); then
                echo "$found"
                return 0
            fi
        fi
    fi
    echo "scripts/test.sh: no Python $1 found (looked on PATH, in /usr/bin, /usr/local/bin" \
         "and pyenv's versions) and none installable from Debian's packages; install" \
         "one (pyenv install $1) and run again" >&2
    return 1
}
claims=$(python3 tests/support/pythons.py claims)
read -r oldest newest host_floor <<< "$claims"
# (found one after the other: apt-get installs one at a time)
python_oldest=$(need_python "$oldest")
python_newest=$(need_python "$newest")

# The checks before the suite: the linter and the type checker with the
# project's settings (pyproject.toml), and the docs, in which a broken link or
# anchor fails the build (not with --quiet, which hides the warnings that
# --strict counts).
checks() {
    .venv/bin/ruff check mslaunch tests scripts
    .venv/bin/mypy
    local site
    site=$(mktemp -d)
    .venv/bin/mkdocs build --strict -d "$site" || { rm -rf "$site"; return 1; }
    rm -rf "$site"
}
# A smoke subset of the suite on the oldest and the newest Python, with the package
# installed from its wheel (built once, here) in a virtual environment of each.
wheel=$(mktemp -d)
.venv/bin/python -m pip wheel -q --no-deps -w "$wheel" . >/dev/null
smoke() {
    local venv=".venv-py$1"
    [ -x "$venv/bin/python" ] || "$2" -m venv "$venv"
    "$venv/bin/python" -m pip install -q 'pytest>=7' pytest-timeout 'hypothesis>=6' >/dev/null
    "$venv/bin/python" -m pip install -q --force-reinstall --no-deps "$wheel"/*.whl >/dev/null
    "$venv/bin/python" -m pytest -q -p no:cacheprovider -m 'not remote' \
        tests/project/test_pythons.py::test_every_place_names_the_same_pythons \
        tests/rooms/hosts/test_hostfile.py tests/rooms/cli/test_options_table.py \
        tests/rooms/machine/test_loop.py tests/rooms/run/test_supervise.py \
        tests/system/local/test_local_jobs.py
}
# The three side by side (each keeps about one core busy), their outputs shown in turn.
echo "scripts/test.sh: the checks, and smoke tests on Python $oldest and $newest (at ${SECONDS} s)"
# (A part that fails ends its subshell through set -e before it writes its status.)
side=$(mktemp -d)
( checks > "$side/1" 2>&1; echo $? > "$side/1.rc" ) &
parts=($!)
( smoke "$oldest" "$python_oldest" > "$side/2" 2>&1; echo $? > "$side/2.rc" ) &
parts+=($!)
( smoke "$newest" "$python_newest" > "$side/3" 2>&1; echo $? > "$side/3.rc" ) &
parts+=($!)
for pid in "${parts[@]}"; do
    wait "$pid" || true     # (not the Open MPI build's, still going)
done
rm -rf "$wheel"
failed=
for part in "1:the checks" "2:smoke tests on Python $oldest" "3:smoke tests on Python $newest"; do
    echo "scripts/test.sh: ${part#*:}:"
    cat "$side/${part%%:*}"
    [ "$(cat "$side/${part%%:*}.rc" 2>/dev/null)" = 0 ] || failed="$failed, ${part#*:}"
done
rm -rf "$side"
if [ -n "$failed" ]; then
    echo "scripts/test.sh: failed: ${failed#, }" >&2
    exit 1
fi
# ... and the oldest Python a remote host may have, for tests/project/test_pythons.py's agents
MSLAUNCH_TEST_HOST_PYTHON=$(need_python "$host_floor")
export MSLAUNCH_TEST_HOST_PYTHON
# The wheels the README's install command brings (tests/system/remote/test_first_install.py
# installs from them: the suite itself looks nothing up beyond this machine)
MSLAUNCH_TEST_WHEELS="${XDG_CACHE_HOME:-$HOME/.cache}/mslaunch-tests/wheels"
mkdir -p "$MSLAUNCH_TEST_WHEELS"
# (and what building mslaunch from its source needs: pyproject.toml's build-system)
.venv/bin/python -m pip download -q -d "$MSLAUNCH_TEST_WHEELS" '.[mpi]' 'setuptools>=61' wheel
export MSLAUNCH_TEST_WHEELS
echo "scripts/test.sh: the suite (at ${SECONDS} s)"
# Three pytest workers, each module whole on one of them (see tests/conftest.py): most
# of the suite waits on children, daemons and timeouts, not on the CPU.
parallel="-n 3 --dist loadgroup --no-loadscope-reorder"
# A run that goes on too long is stopped as Ctrl-C stops it (SIGINT), in time for
# pytest to print what failed so far and the slowest tests: 85 minutes after this
# script began, by default.
budget=$(( ${MSLAUNCH_TEST_MINUTES:-85} * 60 - SECONDS ))
[ "$budget" -gt 60 ] || budget=60
stop="timeout --foreground --signal=INT --kill-after=120 $budget"
report="--durations=30"
# Tests make up host names; none may ever be looked up beyond this machine.
# As root, the suite runs in a mount namespace of its own whose resolver is
# loopback only (nothing listens there: lookups fail at once), and whose
# /dev/shm is an empty tmpfs of its own: whatever is left there at the end is
# the suite's, and fails it (tests/support/shmcheck.py).
if [ "$(id -u)" = 0 ] && unshare --mount true 2>/dev/null; then
    exec unshare --mount --propagation private sh -c '
        conf=$(mktemp) && printf "nameserver 127.0.0.1\noptions attempts:1 timeout:1\n" > "$conf" &&
        mount --bind "$conf" /etc/resolv.conf && rm -f "$conf" &&
        mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /dev/shm &&
        MSL_TEST_OWN_SHM=1 exec "$@"' sh $stop .venv/bin/python -m pytest -q $report $parallel "$@"
fi
exec $stop .venv/bin/python -m pytest -q $report $parallel "$@"
