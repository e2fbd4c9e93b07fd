"""paramiko, imported once and in a background thread.

paramiko is imported only when a plan has remote hosts to reach over SSH,
and in a thread while the TCP connections are being opened, so that its
import (about half a second with ``invoke`` installed, which is kept out)
overlaps with the network.
"""

from __future__ import annotations

import os
import sys
import threading
import types

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, Optional

from .....core.errors import LaunchError
from .....core.liblogs import route
from ... import bootstrap

_paramiko: Dict[str, Any] = {}
_import_done = threading.Event()


def _paramiko_version() -> Optional[str]:
    """paramiko's version from its ``dist-info`` directory, without importlib.metadata."""
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for name in names:
            if name.startswith("paramiko-") and name.endswith(".dist-info"):
                return name[len("paramiko-"):-len(".dist-info")]
    return None


class _Metadata(types.ModuleType):
    """Stands in for :mod:`importlib.metadata` while paramiko is imported.

    paramiko's ``__init__`` asks it for its own version only, and the module
    (with :mod:`email` and :mod:`zipfile` behind it) costs about 15 ms, on
    the path of every remote launch.  Anything else is the real module's.
    """

    def __init__(self, version: str) -> None:
        super().__init__("importlib.metadata")
        self._version = version

    def version(self, name: str) -> str:
        return self._version if name == "paramiko" else self.__getattr__("version")(name)

    def __getattr__(self, name: str):
        if name.startswith("__"):     # the import system's look-ups (__spec__...)
            raise AttributeError(name)
        if sys.modules.get("importlib.metadata") is self:
            del sys.modules["importlib.metadata"]
        import importlib.metadata
        return getattr(importlib.metadata, name)


#: glibc's ``M_ARENA_MAX`` (mallopt), and the arenas the launcher keeps.
_M_ARENA_MAX = -8
ARENAS = 2


def _few_arenas() -> None:
    """Cap glibc's malloc arenas: each SSH connection has threads (paramiko's
    and the channel's), and glibc gives threads that allocate at once arenas
    of their own, up to eight per core, each keeping its own free memory --
    several MiB of the launcher's resident size at a dozen hosts, for
    threads that mostly wait."""
    try:
        import ctypes
        libc = ctypes.CDLL(None)
        if hasattr(libc, "gnu_get_libc_version"):
            libc.mallopt(_M_ARENA_MAX, ARENAS)
    except (ImportError, OSError, AttributeError):
        pass    # another C library, or no ctypes: nothing to tune


def _import_paramiko() -> None:
    try:
        # Its transport thread logs failures with their tracebacks, and
        # cryptography warns about algorithms: mslaunch's to route (one line).
        route(("paramiko", "cryptography", "nacl", "bcrypt"))
        # paramiko.config imports invoke when it is installed (for Match
        # exec); that costs a tenth of a second and is not needed here.
        blocked = "invoke" not in sys.modules
        if blocked:
            sys.modules["invoke"] = None  # type: ignore[assignment]
        stand_in: Optional[_Metadata] = None
        if "importlib.metadata" not in sys.modules:
            version = _paramiko_version()
            if version is not None:
                stand_in = sys.modules["importlib.metadata"] = _Metadata(version)
        try:
            import paramiko
        finally:
            if blocked:
                sys.modules.pop("invoke", None)
            if stand_in is not None and sys.modules.get("importlib.metadata") is stand_in:
                del sys.modules["importlib.metadata"]
        _paramiko["module"] = paramiko
    except Exception as err:  # ImportError, or a broken install
        _paramiko["error"] = err
    finally:
        _import_done.set()


def start_import() -> None:
    """Begin importing paramiko in a thread (once)."""
    if not _paramiko and not _import_done.is_set() and "thread" not in _paramiko:
        _few_arenas()     # before the first thread
        thread = threading.Thread(target=_import_paramiko, name="import-paramiko", daemon=True)
        _paramiko["thread"] = thread
        bootstrap.finish_before_exit(thread)


def import_finished() -> None:
    """Wait until paramiko's import, once started, has succeeded or failed."""
    if "thread" in _paramiko or _import_done.is_set():
        _import_done.wait()


def paramiko_module():
    """The paramiko module, once imported; LaunchError when it cannot be."""
    start_import()
    _import_done.wait()
    if "error" in _paramiko:
        import sys
        raise LaunchError(f"remote hosts need paramiko, which mslaunch depends on, and this "
                          f"Python cannot import it ({_paramiko['error']}): "
                          f"{sys.executable} -m pip install paramiko")
    return _paramiko["module"]
