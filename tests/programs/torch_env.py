"""A torchrun worker that writes its whole environment and arguments as JSON to
``$TORCH_ENV_DIR/<local rank>.json`` (when set), a line to each stream, and, with
the arguments ``--fail RANK``, raises under torchrun's ``@record`` in that rank.
(torch is imported for ``@record`` only: on a slow machine its import costs seconds
of CPU in every worker, and a worker that only shows its environment needs none.)"""

import json
import os
import sys


def main() -> None:
    args = sys.argv[1:]
    local = os.environ["LOCAL_RANK"]
    where = os.environ.get("TORCH_ENV_DIR")
    if where:
        with open(os.path.join(where, f"{local}.json"), "w") as f:
            json.dump({"env": dict(os.environ), "argv": args}, f)
    print(f"out {local}", flush=True)
    print(f"err {local}", file=sys.stderr, flush=True)
    if "--fail" in args and args[args.index("--fail") + 1] == os.environ["RANK"]:
        raise ValueError(f"boom from rank {os.environ['RANK']}")


if "--fail" in sys.argv[1:]:
    from torch.distributed.elastic.multiprocessing.errors import record
    main = record(main)
main()
