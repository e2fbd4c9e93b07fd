"""A MindSpore-free task script for msrun-mode tests.

Prints its msrun environment as one JSON line on stdout and one line on
stderr, then, steered by its environment:
  FAIL_RANK=N [FAIL_CODE=C FAIL_AFTER=S]  the worker with RANK_ID N exits C
  FAIL_ONCE=DIR   ... only the first time (a marker file in DIR), for recovery
  SLEEP=S         seconds to sleep before exiting 0 (default 0.2)
  SCHED_SLEEP=S   the scheduler's own sleep (default SLEEP)
"""
import json
import os
import sys
import time

KEYS = ("MS_ROLE", "MS_SCHED_HOST", "MS_SCHED_PORT", "MS_TOPO_TIMEOUT", "MS_WORKER_NUM",
        "RANK_ID", "RANK_SIZE", "DEVICE_ID", "MS_NODE_ID", "MS_SIMULATION_LEVEL",
        "RANK_TABLE_FILE", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
        "MASTER_ADDR", "MASTER_PORT", "MSRUN_CPU_LIST", "MSRUN_BIND_FILE", "OMP_NUM_THREADS",
        "HCCL_CONNECT_TIMEOUT", "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION", "LD_LIBRARY_PATH")
env = os.environ
row = {k: env[k] for k in KEYS if k in env}
row["ms_env"] = sorted(k for k in env if k.startswith(("MS_", "RANK_", "DEVICE_")))
row["affinity"] = sorted(os.sched_getaffinity(0))
row["argv"] = sys.argv[1:]
row["isatty"] = [sys.stdout.isatty(), sys.stderr.isatty()]
row["session_leader"] = os.getsid(0) == os.getpid()
print(json.dumps(row), flush=True)
print(f"stderr of {env.get('MS_ROLE')} {env.get('RANK_ID')}", file=sys.stderr, flush=True)
worker = env.get("MS_ROLE") != "MS_SCHED"
if worker and env.get("FAIL_RANK") is not None and env.get("RANK_ID") == env["FAIL_RANK"]:
    once = env.get("FAIL_ONCE")
    marker = os.path.join(once, f"failed.{env['RANK_ID']}") if once else None
    if marker is None or not os.path.exists(marker):
        if marker:
            open(marker, "w").close()
        time.sleep(float(env.get("FAIL_AFTER", "0.3")))
        sys.exit(int(env.get("FAIL_CODE", "3")))
time.sleep(float(env.get("SLEEP", "0.2") if worker else env.get("SCHED_SLEEP", env.get("SLEEP", "0.2"))))
