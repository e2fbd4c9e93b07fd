#!/usr/bin/env bash
# Several machines from a hostfile ('host slots=N' lines), as in the mpirun
# tutorials: bash run_cluster.sh HOSTFILE [NUM_RANKS]
# hostfiles/local.txt describes this machine alone, for a try-out.
set -e
HOSTFILE=$(realpath "${1:?usage: run_cluster.sh HOSTFILE [NUM_RANKS]}")
cd "$(dirname "$0")"
mslaunch -n "${2:-4}" --hostfile "$HOSTFILE" --output-filename log_output \
    --merge-stderr-to-stdout python net.py
