"""A DeepSpeed worker that writes its environment and arguments as JSON to
``$DS_ENV_DIR/<RANK>.json`` and a line to stdout (it declares ``--local_rank``,
as DeepSpeed's examples do)."""

import argparse
import json
import os
import sys

parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", type=int, default=-1)
parser.add_argument("--deepspeed_config")
parser.parse_known_args()
with open(os.path.join(os.environ["DS_ENV_DIR"], os.environ["RANK"] + ".json"), "w") as f:
    json.dump({"env": dict(os.environ), "argv": sys.argv[1:], "cwd": os.getcwd(),
               "isatty": sys.stdout.isatty()}, f)
print(f"worker {os.environ['RANK']} on node {os.environ['CROSS_RANK']}", flush=True)
