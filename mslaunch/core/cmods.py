"""The C modules under :mod:`signal` and :mod:`socket`, which the package uses
in their place.

``import signal`` builds enums of every signal and handler, ``import socket``
enums and classes of its own: together some milliseconds of every launch,
for names mslaunch does not use.  ``_signal`` and ``_socket`` make the same
calls (``signal.signal``, ``signal.SIGTERM``, ``socket.socketpair``,
``socket.socket(fileno=fd)``), with plain ints and the C socket type.  Every
module takes them from here, so that why is said once; one that needs what
only the Python modules have (``socket.create_connection``,
``signal.Signals``) imports those itself, where the cost is paid anyway.
"""

import _signal as signal
import _socket as socket

__all__ = ["signal", "socket"]
