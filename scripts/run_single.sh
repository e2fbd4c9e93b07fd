#!/usr/bin/env bash
# One machine, DEVICE_NUM ranks (default 8), as in the mpirun tutorials:
# logs in log_output/1/rank.N/stdout, stderr merged into it.
# --oversubscribe lets 8 ranks run on a machine with fewer cores.
set -e
cd "$(dirname "$0")"
mslaunch -n "${DEVICE_NUM:-8}" --oversubscribe --output-filename log_output \
    --merge-stderr-to-stdout python net.py
