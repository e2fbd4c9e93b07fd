"""Looking inside a running job: its control socket and what it answers
(stacks, usage, the start-up's progress), the merged stack tree, stalls.

Here, what both answerers of the control socket share (the supervisor's,
:mod:`.control`, and the one while remote hosts start, :mod:`.startup`): who
may ask, and the answer to ``info``.
"""

from __future__ import annotations

import os
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict

    from ..seams import LookedAt


def admitted(conn: Any) -> bool:
    """Whether the peer of a control connection may ask: the job's own user, and
    root (who may trace any process anyway); a root job lets in root alone.  A
    refused peer is told why in one line (never waited for), and closed."""
    from ..machine.peers import judge
    if judge(conn) == "ours":
        return True
    try:
        conn.setblocking(False)
        conn.send(b'{"error": "it is another user\'s job"}\n')
    except OSError:
        pass
    conn.close()
    return False


def job_info(view: LookedAt) -> Dict[str, Any]:
    """The answer to ``info``."""
    from ..mpi.pmi.files import public_id
    return {"kvsname": public_id(view.plan.kvsname), "pid": os.getpid(), "size": len(view.plan.ranks),
            "hosts": list(dict.fromkeys(r.spec.host.name for r in view.ranks)),
            "argv": list(view.plan.ranks[0].argv) if view.plan.ranks else [],
            "uptime": round(time.monotonic() - view.started, 1),
            "ending": view.ending}
