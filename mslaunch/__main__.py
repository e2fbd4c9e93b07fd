"""The ``mslaunch`` command, also run as ``python -m mslaunch``."""

from .core import signal
import sys


def main() -> int:
    # Until the supervisor installs its handlers, Ctrl-C simply ends mslaunch
    # (nothing has started yet) rather than raising KeyboardInterrupt in the
    # middle of an import, with a traceback.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    from .machine.loop import hold_collector
    hold_collector()
    from .cli import main as run
    code = run()
    # Tearing the interpreter down (every module, every object) costs more
    # than a small job's whole run, and nothing is left for it to do.
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass
    import os
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
