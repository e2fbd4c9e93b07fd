"""This process's PMIx: the server, started for the first job that needs it, and its directory.

The launcher and every agent have one :class:`PMIxHost`.  The library is
loaded and its server started when a job of two ranks or more starts ranks
here; where that cannot be done (no library, say), the reason is kept, the
ranks get no PMIx, and an Open MPI program among them is noticed as a
singleton (:mod:`mslaunch.pmi.singletons`), with :data:`~.lib.FIX` in the
message.  Everything the server and the ranks' Open MPI keep on disk is in
one directory of this process's guard (:func:`mslaunch.pmi.files.pmix_dir`),
removed at the end -- and by the watchdog, should this process be killed.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Optional

    from ..machine.loop import Loop
    from ..pmi.job import PMIJob
    from .server import Layout, PMIxServer, Relay

#: The smallest job served PMIx: one rank of Open MPI alone is a correct singleton.
MIN_SIZE = 2


class PMIxHost:
    """See the module docstring; ``directory`` is where the server keeps its files,
    ``log`` takes one line for ``-v``."""

    def __init__(self, loop: Loop, directory: str, log: Callable[[str], None],
                 fetch: Callable[[str, int, Callable[[Optional[bytes]], None]], None]) -> None:
        self.loop = loop
        self.directory = directory
        self.log = log
        #: ``fetch(nspace, rank, done)``: a process's data from the host that has it,
        #: for the library's direct modex.
        self.fetch = fetch
        self.server: Optional[PMIxServer] = None
        self.problem: Optional[str] = None      # why no server runs here

    def _start(self) -> Optional[PMIxServer]:
        if self.server is not None or self.problem is not None:
            return self.server
        from . import lib
        from .dpm import DPMCalls
        from .server import PMIxServer
        try:
            library = lib.load()
        except lib.Unavailable as err:
            self.problem = str(err)
            return None
        from ..machine.trees import hold, private_dir
        try:
            private_dir(self.directory)
            hold(self.directory)
        except OSError as err:
            self.problem = f"cannot make {self.directory}: {err.strerror or err}"
            return None
        from ..pmi.files import xml_path
        topology = xml_path()
        try:
            self.server = PMIxServer(self.loop, library, self.directory,
                                     topology if topology and os.path.isfile(topology) else None,
                                     more_calls=DPMCalls)
        except OSError as err:
            self.problem = f"{library.path}: {err}"
            return None
        self.server.fetch = self.fetch
        self.log(f"PMIx server of {library.version.split(' (')[0]} ({library.path})")
        return self.server

    def serve(self, pj: PMIJob, layout: Layout, relay: Relay, min_size: int = MIN_SIZE) -> bool:
        """Serve PMIx to ``pj``'s ranks here (their variables then come with
        ``pj.env``); False if there is no server here."""
        if len(layout.node_of) < min_size:
            return False
        server = self._start()
        if server is None:
            return False
        try:
            pj.pmix = server.namespace(layout, pj, relay, pj.pid_of)
        except OSError as err:
            self.problem = str(err)
            return False
        return True

    def guest(self, layout: Layout) -> None:
        """Make a job with no process here known to the server (``layout.here`` -1):
        the library then asks for its processes' data (direct modex) instead of
        waiting for it, when a process here connects to them (a spawn's parent
        and children on other hosts)."""
        server = self._start()
        if server is None or layout.nspace in server.namespaces:
            return
        try:
            server.namespace(layout, None, _no_relay, lambda rank: None)
        except OSError as err:
            self.log(f"PMIx: job {layout.nspace[:40]} not made known here: {err}")

    def local_modex(self, nspace: str, rank: int,
                    done: Callable[[Optional[bytes]], None]) -> None:
        """What one of this host's processes put, or None (see :mod:`.dpm`)."""
        more = self.server.more if self.server is not None else None
        if more is None:
            done(None)
        else:
            more.local_modex(nspace, rank, done)

    def adopt(self, loop: Loop, log: Callable[[str], None],
              fetch: Callable[[str, int, Callable[[Optional[bytes]], None]], None]) -> None:
        """Serve the next attempt of a job run with ``--max-restarts``, in ``loop``
        (see :meth:`~.server.PMIxServer.move_to`)."""
        self.loop, self.log, self.fetch = loop, log, fetch
        if self.server is not None:
            self.server.move_to(loop)
            self.server.fetch = fetch

    def retire(self) -> None:
        """The attempt's ranks are gone: forget its jobs, keep the server and its
        directory (see :meth:`adopt`)."""
        if self.server is not None:
            self.server.retire()

    def close(self) -> None:
        """Stop the server and remove its directory (once the ranks are gone)."""
        if self.server is not None:
            if not self.server.close():
                self.log("the PMIx library did not stop: its thread is stuck (left to end "
                         "with this process)")
            self.server = None
        from ..machine.trees import remove_tree
        remove_tree(self.directory)


def _no_relay(signature: str, sequence: int, blob: bytes, done: Callable[[bytes], None]) -> None:
    """A guest job's fences: it has no process here to take part in one."""
