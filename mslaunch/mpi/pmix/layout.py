"""Where a PMIx job's ranks are, and the data the library is given of it (no ctypes
here: a job's layout is made before anything knows whether its ranks speak PMIx)."""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

    from ...core.spec import RankSpec


def app_commands(specs: Iterable[RankSpec]) -> Dict[int, str]:
    """Each application's command line, by appnum (its first rank's of ``specs``,
    its arguments joined by spaces): what Open MPI 5 reports as ``MPI_INFO_ENV``'s
    "command" and "argv"."""
    commands: Dict[int, str] = {}
    for spec in specs:
        commands.setdefault(spec.app, " ".join(spec.argv))
    return commands


class Layout:
    """Where a job's ranks are: host names by node id, each rank's node and appnum,
    and which node is this server's."""

    __slots__ = ("appnums", "commands", "here", "node_of", "nodes", "nspace", "oversubscribed", "parent",
                 "tmpdir", "topology", "universe")

    def __init__(self, nspace: str, nodes: Sequence[str], node_of: Sequence[int],
                 appnums: Sequence[int], universe: int, here: int,
                 oversubscribed: bool = False, parent: Optional[Tuple[str, int]] = None,
                 commands: Optional[Dict[int, str]] = None) -> None:
        self.commands = dict(commands or {})   # of the applications with ranks here
        self.parent = parent                   # the spawning rank: (namespace, rank)
        self.oversubscribed = oversubscribed   # this node: more ranks than slots
        self.tmpdir = ""          # the server's, set as the namespace is registered
        self.topology = ""        # this host's hwloc XML, if the server has it
        self.nspace = nspace
        self.nodes = tuple(nodes)
        self.node_of = tuple(node_of)
        self.appnums = tuple(appnums)
        self.universe = max(universe, len(node_of))
        self.here = here

    def ranks_on(self, node: int) -> List[int]:
        return [r for r, n in enumerate(self.node_of) if n == node]

    def job_info(self) -> List[Tuple[str, int, Any]]:
        """The namespace's data, as the library's ``register_nspace`` takes it."""
        from . import lib as L
        size = len(self.node_of)
        per_node = [self.ranks_on(n) for n in range(len(self.nodes))]
        # here = -1: a job with no process on this host (a guest, see PMIxHost.guest)
        local = per_node[self.here] if 0 <= self.here < len(per_node) else []
        apps = len(set(self.appnums)) or 1
        info: List[Tuple[str, int, Any]] = [
            ("pmix.jobid", L.STRING, self.nspace), ("pmix.univ.size", L.UINT32, self.universe),
            ("pmix.job.size", L.UINT32, size), ("pmix.max.size", L.UINT32, self.universe),
            ("pmix.job.napps", L.UINT32, apps), ("pmix.num.nodes", L.UINT32, len(self.nodes)),
            ("pmix.nmap", L.STRING, ",".join(self.nodes)),
            ("pmix.pmap", L.STRING, ";".join(",".join(map(str, rs)) for rs in per_node)),
            ("pmix.local.size", L.UINT32, len(local)), ("pmix.node.size", L.UINT32, len(local)),
            ("pmix.lpeers", L.STRING, ",".join(map(str, local))),
            ("pmix.lldr", L.PROC_RANK, local[0] if local else 0),
            ("pmix.tdir.rmclean", L.BOOL, True)]
        if self.parent is not None:
            info += [("pmix.parent", L.PROC, self.parent), ("pmix.spawned", L.BOOL, True)]
        if self.oversubscribed:
            # Open MPI 5's ranks then yield the processor while they wait
            info.append(("pmix.ndosub", L.BOOL, True))
        if self.topology:
            # Open MPI asks for it: without, every rank discovers the host itself
            info.append(("pmix.hwlocxml2", L.STRING, self.topology))
        if self.tmpdir:
            # Open MPI 5's session directories (it makes its own elsewhere without)
            info += [("pmix.tmpdir", L.STRING, self.tmpdir),
                     ("pmix.nsdir", L.STRING, os.path.join(self.tmpdir, self.nspace))]
        if apps == 1:
            info.append(("pmix.appnum", L.UINT32, self.appnums[0] if self.appnums else 0))
        for app, command in sorted(self.commands.items()):
            info.append(("pmix.app.arr", L.DATA_ARRAY, [
                ("pmix.appnum", L.UINT32, app), ("pmix.app.argv", L.STRING, command)]))
        for rank, node in enumerate(self.node_of):
            index = per_node[node].index(rank)
            info.append(("pmix.pdata", L.DATA_ARRAY, [
                ("pmix.rank", L.PROC_RANK, rank), ("pmix.lrank", L.UINT16, index),
                ("pmix.nrank", L.UINT16, index), ("pmix.nodeid", L.UINT32, node),
                ("pmix.hname", L.STRING, self.nodes[node]),
                ("pmix.appnum", L.UINT32, self.appnums[rank] if self.appnums else 0)]))
        return info
