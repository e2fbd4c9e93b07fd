"""What the libraries mslaunch uses say: routed by mslaunch, one line each.

paramiko's transport thread logs its own failures through the ``logging``
module ("Exception (client): Error reading SSH protocol banner", then the
traceback, a record per line) and lets Python's last-resort handler print
them to stderr -- before mslaunch's own one-line error says the same thing
better.  :func:`route` gives such a library's loggers a handler of
mslaunch's: nothing is shown by default (the failure reaches the user
through mslaunch's own error line), and with ``-v -v`` each message is one
``mslaunch: debug: LOGGER: ...`` line, never a traceback.  The library's
warnings are silenced too, and a thread of mslaunch's that dies of an
exception is one line, not a traceback.

The ``logging`` and ``warnings`` modules are imported only by :func:`route`,
which runs when a library that needs it is imported.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, List, Sequence

from .errors import one_line

#: Verbosity of the command line (``-v`` counted); library messages show from 2.
_level: List[int] = [0]
#: The names already routed.
_routed: List[str] = []

#: How the lines of a traceback that a library logs line by line begin.
_TRACEBACK = ("Traceback (", "During handling of", "The above exception", " ", "\t")


def set_verbosity(level: int) -> None:
    """The command line's ``-v`` count: 2 and more show the libraries' messages."""
    _level[0] = level


def _write(text: str) -> None:
    try:
        sys.stderr.write(text)
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):
        pass


def _handler() -> Any:
    import logging

    class OneLine(logging.Handler):
        """A library's record as one line of mslaunch's, only with ``-v -v``."""

        def emit(self, record: logging.LogRecord) -> None:
            if _level[0] < 2:
                return
            try:
                text = str(record.getMessage())
            except Exception:          # a library's bad format string: its words only
                text = str(record.msg)
            first = text.strip("\n").split("\n", 1)[0]
            if not first.strip() or first.startswith(_TRACEBACK):
                return
            _write(f"mslaunch: debug: {record.name}: {one_line(first, 300)}\n")

        def handleError(self, record: logging.LogRecord) -> None:
            pass                       # logging's own would print a traceback

    return OneLine()


def _ours(args: Any) -> bool:
    """Whether a thread that died runs mslaunch's code or a routed library's
    (paramiko's transport): the module of a frame of its traceback, or of its class."""
    owners = ("mslaunch", *_routed)
    tb = args.exc_traceback
    while tb is not None:
        if str(tb.tb_frame.f_globals.get("__name__", "")).split(".")[0] in owners:
            return True
        tb = tb.tb_next
    return (type(args.thread).__module__ or "").split(".")[0] in owners


def _thread_hook(before: Any) -> Any:
    """``threading.excepthook``: a thread of mslaunch's that died of an exception is
    one line; any other thread (of a program that calls :func:`mslaunch.run`)
    is left to the hook that was there before."""
    def hook(args: Any) -> None:
        if args.thread is None or not _ours(args):
            before(args)
            return
        if args.exc_type is SystemExit:
            return
        reason = one_line(str(args.exc_value) or args.exc_type.__name__, 300)
        _write(f"mslaunch: internal error in {args.thread.name}: "
               f"{args.exc_type.__name__}: {reason}\n")
    hook.mslaunch = True  # type: ignore[attr-defined]
    return hook


def route(names: Sequence[str]) -> None:
    """Make the loggers and warnings of the libraries ``names`` mslaunch's own."""
    todo = [name for name in names if name not in _routed]
    if not todo:
        return
    import logging
    import threading
    import warnings
    for name in todo:
        logger = logging.getLogger(name)
        logger.addHandler(_handler())
        logger.propagate = False       # never up to the root's or the last resort's
        warnings.filterwarnings("ignore", module=rf"{name}(\.|$)")
        _routed.append(name)
    if not getattr(threading.excepthook, "mslaunch", False):
        threading.excepthook = _thread_hook(threading.excepthook)
