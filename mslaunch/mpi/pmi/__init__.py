"""PMI: the process-manager side of MPICH's "simple PMI" (PMI-1 and PMI-2).

MPICH-ABI ranks (e.g. mpi4py on the PyPI ``mpich`` wheel) need a process
manager to tell them their rank, size, kvsname and node map, to exchange
business cards through a key-value space, and to run barriers.  This package
is that process manager; it runs inside the launcher's :class:`~mslaunch.machine.loop.Loop`.

Layers (kept apart so that a later per-host agent can sit between the ranks
and the launcher):

(a) **Wire codecs** (:mod:`.wire`) -- pure functions: :func:`parse_v1`/:func:`format_v1` for the
    PMI-1 text lines (``cmd=x key=value ...\\n``), :func:`parse_v2`/:func:`format_v2`
    for the PMI-2 frames (``%6u`` length + ``cmd=x;key=value;...;``) and
    :func:`take_line`/:func:`take_frame` to cut them out of a byte stream.
(b) **Connections and the server** (:mod:`.server`) -- ``_Conn`` owns one
    rank's socket, the input/output buffers and the framing, and the phase
    of the connection (named at the end of this module);
    :class:`~.server.PMIServer` hands out inherited sockets (``PMI_FD``) or
    listens on TCP (``PMI_PORT``/``PMI_ID``) and authenticates its peers.
(c) **Command handlers** (:mod:`.commands`) -- ``V1Handler`` and ``V2Handler``
    turn one parsed request into job-state calls and replies, enforcing the
    order init -> ... -> finalize, and read the spawn request's own forms
    (decoded by :mod:`.spawn`).  They see their connection only through the
    small ``Conn`` protocol named there.  A connection imports the module when
    its first message arrives, so a job whose ranks never speak PMI does not
    load it.
(d) **Job state** (:mod:`.state`) -- :class:`JobState` is all the handlers know of the job:
    KVS, barrier/fence counting, node attributes, published names.  Every call
    that might need the launcher answers through a callback, so an agent can
    substitute a state that relays puts/gets to the launcher and aggregates its
    local ranks' barrier entries into one.  :class:`LocalJobState` is the
    in-process implementation used by the launcher.

Decisions:

* ``vallen_max`` is 32768 (Hydra and gforker say 1024).  MPICH splits a binary
  put into segments of ``(vallen_max-2)/2`` raw bytes, so with 1024 each node
  root sends ~10 puts for its UCX address and every other root gets all of
  them; with 32768 it is one put per root.  It also bounds the
  ``PMI_process_mapping`` value a rank can read (a longer mapping is served as
  a miss: MPICH then falls back to its hostname exchange, which is correct,
  just slower).  Messages are capped at 64 KiB + ``vallen_max``.
* PMI-2 ``kvs-fence``: the reply is held until every rank has fenced (the
  barrier is shared with PMI-1 ``barrier_in``); gets are then answered at once,
  a miss being ``found=FALSE``.  Holding the fence is simpler than holding gets
  and equally correct, because a PMI-2 client cannot issue a get while its
  fence is outstanding.
* TCP (``PMI_PORT``/``PMI_ID``): MPICH reads ``PMI_ID`` with ``atoi`` and sends
  it back as ``%d``, so each rank's secret is a distinct random integer in
  ``[1, 2**31-1]`` (31 bits).  A connection must present a valid, unused id
  (``initack pmiid=``, or ``fullinit pmirank=`` for PMI-2) within
  ``auth_timeout`` seconds; before that it may send at most 1 KiB, and the
  number of such pending connections is bounded.
* The real MPICH 5.0.2 wheel speaks PMI-1 only; the PMI-2 wire here is tested
  with a protocol-level client (see tests/rooms/mpi/test_pmi.py).

A peer that breaks the grammar, floods, or never reads its replies is cut off
and reported with one :meth:`PMIListener.pmi_log` line; a parseable but
misplaced request gets an ``rc=1`` reply.  No exception leaves a loop callback.

:mod:`mslaunch.core.procmap` writes and parses ``PMI_process_mapping``; :mod:`.files`
holds what PMI jobs keep on a host's file systems (MPICH's shared-memory
segments, the hwloc topology file, the Open MPI singleton probe) and the
orphan guard's hooks that remove it.
"""

# The phases of a connection, shared by the server and the command handlers.
NEW = "new"            # TCP, not yet authenticated; rank unknown
READY = "ready"        # rank known, no init yet
V2_PRE = "v2-pre"      # PMI-2 init done, waiting for fullinit
ACTIVE = "active"      # initialized
DONE = "done"          # finalized
ABORTED = "aborted"
