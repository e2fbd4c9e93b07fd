"""Looking inside the ranks of a ``--launcher srun`` job (see :mod:`.srunranks`).

There is no agent on the nodes to ask: each look (``mslaunch-stacks``,
``mslaunch-top``, ``--stall-report``) starts one more srun step
(``--overlap``, one task per node with running ranks) that runs
:mod:`mslaunch.backends.srunsteps.steplook` with the launcher's Python and answers on a
connection of its own to the job's listener, presenting the look's token
and its node's name.  A node speaks for its own ranks only.
"""

from __future__ import annotations

import os
from ...core import signal
import sys

from ...machine.output import RankPipe

TYPE_CHECKING = False
if TYPE_CHECKING:
    import subprocess
    from typing import Any, Callable, Dict, List, Optional

    from ...wire.dialback import Listener
    from ...machine.loop import Loop


def start_look(loop: Loop, listener: Listener, op: str,
               by_node: Dict[str, Dict[int, int]], timeout: float,
               done: Callable[[Optional[Dict]], None]) -> Optional[Look]:
    """Start a look at the ranks ``by_node`` (``{node: {key: pid}}``): ``op`` is
    ``stacks``, ``top`` or ``singletons`` (end refused Open MPI singletons and
    what they leave, :mod:`mslaunch.backends.srunsteps.steplook`); None if the step could
    not start (``done`` is then not called)."""
    import subprocess

    from . import steplook
    # (the singletons' step ends them, SIGKILL at ``timeout``, then 2 s for their files)
    look = Look(loop, listener, by_node, done, timeout + 7.0)
    env = dict(os.environ)
    env[steplook.LOOK_VARIABLE] = steplook.request(
        op, by_node, look.token,
        listener.socks[0].getsockname()[1], timeout)
    nodes = list(by_node)
    try:
        look.proc = subprocess.Popen(
            ["srun", "--quiet", f"--nodelist={','.join(nodes)}", f"--nodes={len(nodes)}",
             f"--ntasks={len(nodes)}", "--ntasks-per-node=1", "--overlap", "--mpi=none",
             "--cpu-bind=none", "--input=none", "--kill-on-bad-exit=0",
             sys.executable, "-S", "-c", steplook.program(package_dir())],
            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True)
    except OSError:
        look.timer.cancel()
        look.forget_tokens()
        return None
    return look


def package_dir() -> str:
    """Where this mslaunch is imported from (the directory holding ``mslaunch``)."""
    import mslaunch
    return os.path.dirname(os.path.dirname(os.path.abspath(mslaunch.__file__)))


class _Answer:
    """One node's answer to a look, as a :class:`RankPipe`'s sink: JSON, read whole."""

    tail = b""
    wanted = True
    congested = False
    pending = b""
    LIMIT = 64 << 20

    def __init__(self, finished: Callable[[bytes], None]) -> None:
        self.parts: List[bytes] = []
        self.size = 0
        self.finished = finished

    def wait_for_room(self, source) -> None:
        source.resume()

    def feed(self, data) -> None:
        if self.size < self.LIMIT:
            self.parts.append(bytes(data))
            self.size += len(data)

    def finish(self) -> None:
        self.finished(b"".join(self.parts))


class Look:
    """One look at the ranks of a job (see :func:`start_look`)."""

    def __init__(self, loop: Loop, listener: Listener, by_node: Dict[str, Dict[int, int]],
                 done: Callable[[Optional[Dict]], None], timeout: float) -> None:
        self.loop = loop
        self.listener = listener
        self.by_node = by_node
        self.done: Optional[Callable[[Optional[Dict]], None]] = done
        self.got: Dict[str, Any] = {}
        self.waiting = set(by_node)
        self.proc: Optional[subprocess.Popen] = None
        self.pipes: List[RankPipe] = []
        self.token = os.urandom(12).hex()
        for node in by_node:
            listener.expect(f"{self.token}-{node}", self._connected(node), plain=True)
        self.timer = loop.call_later(timeout, self.finish)

    def _connected(self, node: str):
        def answer(sock, rest: bytes, about: str) -> None:
            sink = _Answer(lambda data: self._answered(node, data))
            if rest:
                sink.feed(rest)
            self.pipes.append(RankPipe(self.loop, sock.detach(), sink))
        return answer

    def _answered(self, node: str, data: bytes) -> None:
        import json
        try:
            rows = json.loads(data)
        except ValueError:
            rows = {}
        mine = self.by_node[node]        # a node speaks for its own ranks only
        if isinstance(rows, dict):
            self.got.update({k: v for k, v in rows.items()
                             if k.isdigit() and int(k) in mine and isinstance(v, dict)})
        self.waiting.discard(node)
        if not self.waiting:
            self.finish()

    def forget_tokens(self) -> None:
        for node in self.by_node:
            self.listener.expected.pop(f"{self.token}-{node}", None)

    def finish(self) -> None:
        done, self.done = self.done, None
        if done is None:
            return
        self.timer.cancel()
        self.forget_tokens()      # a node that has not answered is not heard any more
        done(self.got)

    @property
    def over(self) -> bool:
        return self.done is None and (self.proc is None or self.proc.poll() is not None)

    def close(self) -> None:
        self.finish()
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                pass
            self.proc.wait()
        for pipe in self.pipes:
            if not pipe.closed:
                pipe.close()
