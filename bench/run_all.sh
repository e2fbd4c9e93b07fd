#!/usr/bin/env bash
# Run every mslaunch benchmark; the markdown tables go to stdout and to
# bench/results/latest.md (gitignored), progress to stderr.
#
#   bench/run_all.sh                      # full settings: run on an idle machine
#   bench/run_all.sh --quick              # tiny settings, a smoke test only
#   bench/run_all.sh --mslaunch-args '--mpi none'   # other options go to every script
#
# PYTHON selects the interpreter (default: python3 on PATH); it also runs
# mslaunch and the ranks' `python -c ...`.
set -u
here=$(cd "$(dirname "$0")" && pwd)
py=${PYTHON:-python3}
quick=0
common=()
for arg in "$@"; do
    if [ "$arg" = "--quick" ]; then quick=1; else common+=("$arg"); fi
done
if [ "$quick" = 1 ]; then
    overhead=(--runs 2 --warmups 1)
    relay=(--runs 1 --warmups 0 --mb 8)
    mpi=(--runs 1 --warmups 0 --sizes 2,4)
    pmi=(--runs 1 --warmups 0 --pmi-ranks 8)
    placement=(--runs 1 --sizes 1000)
    remote=(--runs 1 --warmups 0 --hosts 2,4 --mb 8)
else
    overhead=() relay=() mpi=() pmi=() placement=() remote=()
fi

mkdir -p "$here/results"
out="$here/results/latest.md"
status=0
{
    echo "# mslaunch benchmarks"
    echo
    rev=$(git -C "$here/.." rev-parse --short HEAD 2>/dev/null || echo '?')
    dirty=$(git -C "$here/.." status --porcelain 2>/dev/null | head -c1)
    echo "_commit ${rev}${dirty:+ (+ uncommitted changes)}, $("$py" -V 2>&1), $(uname -srm)$([ "$quick" = 1 ] && echo ', QUICK SMOKE SETTINGS: not for comparison')_"
    echo
    "$py" "$here/launch_overhead.py" ${overhead[@]+"${overhead[@]}"} ${common[@]+"${common[@]}"} || status=1
    "$py" "$here/relay_throughput.py" ${relay[@]+"${relay[@]}"} ${common[@]+"${common[@]}"} || status=1
    "$py" "$here/mpi_startup.py" ${mpi[@]+"${mpi[@]}"} ${common[@]+"${common[@]}"} || status=1
    "$py" "$here/mpi_startup.py" --pmi-stats ${pmi[@]+"${pmi[@]}"} ${common[@]+"${common[@]}"} || status=1
    "$py" "$here/placement.py" ${placement[@]+"${placement[@]}"} || status=1
    "$py" "$here/remote.py" ${remote[@]+"${remote[@]}"} ${common[@]+"${common[@]}"} || status=1
    exit $status
} | tee "$out"
status=${PIPESTATUS[0]}
echo "bench: tables written to $out" >&2
exit "$status"
