"""A real MindSpore task for msrun-mode tests: one all-reduce on the CPU backend.

Prints one JSON line: what the process found at exec (before MindSpore is
imported), whether its stdout is a terminal, MindSpore's own reading of
``MSRUN_CPU_LIST`` (when set), its rank and the all-reduce's result.
The scheduler (``MS_ROLE=MS_SCHED``) never returns from ``init()``.
"""
import json
import os
import sys

KEYS = ("OMP_NUM_THREADS", "MSRUN_CPU_LIST", "MASTER_ADDR", "MASTER_PORT", "MS_SCHED_HOST",
        "MS_SCHED_PORT", "HCCL_CONNECT_TIMEOUT", "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION")
row = {"at_exec": {k: os.environ.get(k) for k in KEYS}, "isatty": sys.stdout.isatty()}

import numpy as np                                  # noqa: E402
import mindspore as ms                              # noqa: E402
from mindspore import ops                           # noqa: E402
from mindspore.communication import get_group_size, get_rank, init  # noqa: E402

ms.set_context(mode=ms.PYNATIVE_MODE)
ms.set_device("CPU")
if os.environ.get("MSRUN_CPU_LIST"):
    from mindspore.runtime.thread_bind_core import _get_cpu_affinity_strategy
    row["cpu_strategy"] = _get_cpu_affinity_strategy()
init()
rank, size = get_rank(), get_group_size()
total = ops.AllReduce()(ms.Tensor(np.array([rank + 1.0], dtype=np.float32)))
row.update(rank=rank, size=size, sum=float(total.asnumpy()[0]))
print(json.dumps(row), flush=True)
