"""What every layer stands on: the job's records (:mod:`.spec`), the one
exception tree (:mod:`.errors`), the named states (:mod:`.states`), the
switches read from the environment (:mod:`.switches`), small pure modules
(the CPU topology, the process map, the MCA log lines) -- and here, the C
modules under :mod:`signal` and :mod:`socket`, which the package uses in their
place.

``import signal`` builds enums of every signal and handler, ``import socket``
enums and classes of its own: together some milliseconds of every launch, for
names mslaunch does not use.  ``_signal`` and ``_socket`` make the same calls
(``signal.signal``, ``signal.SIGTERM``, ``socket.socketpair``,
``socket.socket(fileno=fd)``) with plain ints and the C socket type.  Every
module takes them from here (``from ..core import signal``), so that why is
said once, and at no cost of a module of its own: this package is imported
anyway, and hands each out on first use (a module that imports only
records, such as the host's topology, loads neither).  One that needs what only the Python modules have
(``socket.create_connection``, ``signal.Signals``) imports those itself, where
the cost is paid anyway.
"""

TYPE_CHECKING = False
if TYPE_CHECKING:
    import _signal as signal
    import _socket as socket


def __getattr__(name: str):
    if name == "signal":
        import _signal
        return _signal
    if name == "socket":
        import _socket
        return _socket
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["signal", "socket"]
