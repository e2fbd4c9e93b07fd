"""Written by mslaunch as the ``sitecustomize`` of its Python ranks: arms
faulthandler so that mslaunch-stacks can read this process's Python stacks
without stopping it, then runs the next sitecustomize (see
:mod:`mslaunch.machine.pydump`).  mslaunch itself never imports this file: it
copies it, with the compiled code its installation made, so that a job's
launch does not compile it."""
def _arm():
    import os
    import sys
    spec = os.environ.pop("MSLAUNCH_STACKS", "").split("|")
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    parts = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if parts and os.path.abspath(parts[0] or ".") == here:
        if len(spec) == 4 and spec[3] == "0":
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = os.pathsep.join(parts[1:])
    if len(spec) != 4:
        return
    try:
        import _signal
        import faulthandler
        fd = os.open(os.path.join(spec[0], "%d.txt" % os.getpid()),
                     os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        every, own = int(spec[1]), int(spec[1]) - 1
        # faulthandler gives its signal back to what it was before at the
        # interpreter's end: ignored, a dump asked for in that instant cannot
        # end the rank (the default action would).
        if _signal.getsignal(own) == _signal.SIG_DFL:
            _signal.signal(own, _signal.SIG_IGN)
        faulthandler.register(own, file=fd, all_threads=False, chain=False)
        # Every thread is dumped by the main thread between two of its Python
        # steps, holding the GIL: no other thread runs Python while their frames
        # are walked (faulthandler's own dump of every thread, from the signal
        # handler, walks them without it and can fault).  ``own`` waits
        # meanwhile, its dump then comes after this one's, not inside it.
        def _mslaunch_dump(signum, frame, fd=fd, own=own, sigmask=_signal.pthread_sigmask,
                           dump=faulthandler.dump_traceback):
            sigmask(_signal.SIG_BLOCK, (own,))
            try:
                dump(fd, all_threads=True)
            finally:
                sigmask(_signal.SIG_UNBLOCK, (own,))
        _signal.signal(every, _mslaunch_dump)
        import atexit
        # (the interpreter's end gives a Python handler's signal its default
        # action, which ends the process: ignored first, it stays ignored)
        atexit.register(_signal.signal, every, _signal.SIG_IGN)
    except (OSError, ValueError, RuntimeError, AttributeError):
        return
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            scope = f.read().strip()
    except OSError:
        scope = "0"
    if scope == "1" and spec[2].isdigit():
        try:
            import ctypes
            ctypes.CDLL(None).prctl(0x59616d61, int(spec[2]), 0, 0, 0)
        except (OSError, AttributeError):
            pass
try:
    _arm()
except Exception:   # an interpreter without faulthandler.register: no dump, no noise
    pass
del _arm
def _exit_on_exception():
    # An uncaught exception in a rank whose MPI is up: after the traceback, the
    # rank ends at once with 1, as under "python -m mpi4py".  Left to the
    # interpreter, its exit would run mpi4py's MPI_Finalize, which waits for
    # ranks that wait for this one: the job would hang.
    import os
    import sys
    if os.environ.get("MSLAUNCH_EXCEPTION_EXIT", "").strip().lower() in (
            "0", "false", "no", "off", "f", "n"):
        return
    previous = sys.excepthook
    def hook(kind, value, tb):
        previous(kind, value, tb)
        mpi = sys.modules.get("mpi4py.MPI")
        try:
            live = mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized()
        except Exception:
            live = False
        if live:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except Exception:
                    pass
            os._exit(1)
    sys.excepthook = hook
try:
    _exit_on_exception()
except Exception:
    pass
del _exit_on_exception
import sys as _sys
_self = _sys.modules.pop("sitecustomize", None)
try:
    import sitecustomize  # type: ignore[import-not-found]  # noqa: F401
except ImportError:
    if _self is not None:
        _sys.modules["sitecustomize"] = _self
