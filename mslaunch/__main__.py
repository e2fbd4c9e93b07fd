"""The ``mslaunch`` command, also run as ``python -m mslaunch``."""

from .core import signal
import sys


def _bytecode_cache() -> None:
    """Under ``PYTHONDONTWRITEBYTECODE`` (or ``-B``), a package installed without
    its compiled files (``pip install --no-compile``, as images often are) would
    be compiled again at every launch, a quarter of a second of CPU: this
    process keeps the bytecode of what it imports in the user's cache instead
    (its ranks' environment is left as it is), where no folder on the way is
    another user's to rename or replace."""
    if not sys.dont_write_bytecode or sys.pycache_prefix is not None:
        return
    import os
    cached = globals().get("__cached__")
    if not cached or os.path.exists(cached):
        return                          # compiled files came with the package
    from .machine.topology import cache_folder
    folder = cache_folder()
    if folder is None:
        return      # (another user could put bytecode there: root with a user's HOME, say)
    sys.pycache_prefix = os.path.join(folder, "bytecode")
    sys.dont_write_bytecode = False


class _SiteLater:
    """Started without ``site`` (the installed command runs Python with ``-S``), the
    first import of a module outside the standard library that nothing on the
    path finds does the site set-up then, as a plain start would have (the site
    directories, their ``.pth`` files), and is looked for again: a module
    installed apart from mslaunch is still found."""

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if path is not None or name in getattr(sys, "stdlib_module_names", ()):
            # a submodule (its package was found), or the standard library's own
            # try of a module of another platform (msvcrt, _winapi)
            return None
        sys.meta_path.remove(cls)
        # The set-up reads the prefixes as the interpreter started with them
        # (it puts a virtual environment's back, and keeps the base's where the
        # environment includes the system's site-packages).
        sys.prefix, sys.exec_prefix = sys.base_prefix, sys.base_exec_prefix
        import site
        site.PREFIXES = [sys.prefix, sys.exec_prefix]
        site.main()
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find is not None else None
            if spec is not None:
                return spec
        return None


def _without_site() -> None:
    """Started without ``site``: a virtual environment's prefix in ``sys.prefix``,
    as the site set-up would have put it (the MPI wheels' launchers and
    libraries are found there), and the set-up itself left to the first import
    that nothing else finds (:class:`_SiteLater`)."""
    import os
    bin_dir = os.path.dirname(os.path.abspath(sys.executable))
    prefix = os.path.dirname(bin_dir)
    if any(os.path.isfile(os.path.join(d, "pyvenv.cfg")) for d in (bin_dir, prefix)):
        sys.prefix = sys.exec_prefix = prefix
    sys.meta_path.append(_SiteLater)


def main() -> int:
    if sys.flags.no_site and "site" not in sys.modules:
        _without_site()
    _bytecode_cache()
    # Until the supervisor installs its handlers, Ctrl-C simply ends mslaunch
    # (nothing has started yet) rather than raising KeyboardInterrupt in the
    # middle of an import, with a traceback.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    import os
    caller = os.environ.pop("MSLAUNCH_CALLER", "")
    if caller.isdigit():            # started by mslaunch.run() or launch(): ends with it
        from .machine.guard import end_with
        end_with(int(caller))
    from .machine import codecache
    codecache.start()
    from .machine.loop import at_first_wait, hold_collector
    hold_collector()
    at_first_wait(codecache.stop)
    from .cli import main as run
    code = run(command=True)
    # Tearing the interpreter down (every module, every object) costs more
    # than a small job's whole run, and nothing is left for it to do.
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass
    codecache.save()
    import os
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
