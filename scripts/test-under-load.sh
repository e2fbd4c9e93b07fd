#!/usr/bin/env bash
# The test command, run several times beside busy loops, as a reviewer checks that
# no test depends on a quiet machine:
#
#   bash scripts/test-under-load.sh [RUNS [LOOPS]] [-- PYTEST ARGS]
#
#   bash scripts/test-under-load.sh              three runs beside two busy loops
#   bash scripts/test-under-load.sh 1 2 -- -n 4  one run, more pytest workers than cores
#   bash scripts/test-under-load.sh 6 2 -- tests/system/openmpi/test_pmix.py -k remote
#
# Each run's whole output is kept in a directory it names; a line per run says how
# it ended, in how long, at what load, and which tests failed.  Exits 1 if any run
# failed.  The busy loops are this script's own children, ended by their pids.
set -uo pipefail
cd "$(dirname "$0")/.."
runs=3
loops=2
if [ $# -gt 0 ] && [ "$1" != "--" ]; then runs=$1; shift; fi
if [ $# -gt 0 ] && [ "$1" != "--" ]; then loops=$1; shift; fi
[ $# -gt 0 ] && [ "$1" = "--" ] && shift
case "$runs$loops" in
    *[!0-9]*|"") echo "scripts/test-under-load.sh: RUNS and LOOPS are whole numbers" >&2; exit 2;;
esac

busy=()
stop_busy() {
    for pid in "${busy[@]}"; do kill "$pid" 2>/dev/null; done
    for pid in "${busy[@]}"; do wait "$pid" 2>/dev/null; done
}
trap stop_busy EXIT
for _ in $(seq "$loops"); do
    sh -c 'while :; do :; done' &
    busy+=("$!")
done

logs=$(mktemp -d "${TMPDIR:-/tmp}/mslaunch-load-XXXXXX")
echo "scripts/test-under-load.sh: $runs run(s) beside $loops busy loop(s); logs in $logs"
failed=0
for run in $(seq "$runs"); do
    started=$(date +%s)
    bash scripts/test.sh "$@" > "$logs/run-$run.log" 2>&1
    rc=$?
    summary=$(grep -E '^[0-9]+ (passed|failed)|passed|failed' "$logs/run-$run.log" | tail -n 1)
    echo "run $run: exit $rc in $(( $(date +%s) - started )) s, load $(cut -d' ' -f1-3 /proc/loadavg): $summary"
    grep -E '^(FAILED|ERROR) ' "$logs/run-$run.log" | sed 's/^/    /'
    [ "$rc" = 0 ] || failed=1
done
exit "$failed"
