"""What every backend and rank handle owes the supervisor, as checks that a test
runs on each line of the tables (tests/rooms/backends/test_conformance.py) and
on a new one (the worked example: tests/project/test_backend_example.py)."""

from __future__ import annotations

import inspect

from mslaunch.backends.backend import Backend
from mslaunch.seams import RankHandle

#: The flags a backend declares (see docs/design.md, "The backend seam").
FLAGS = ("serves_pmi", "this_machine", "pmi_early", "reports_itself")


def _verbs(cls) -> dict:
    return {name: member for name, member in vars(cls).items()
            if not name.startswith("_") and (callable(member) or isinstance(member, property))}


def _parameters(member):
    function = member.fget if isinstance(member, property) else member
    return list(inspect.signature(function).parameters)


def check_backend(backend, name: str) -> None:
    """Fail unless ``backend`` is a ``Backend`` named ``name`` that overrides only
    the base's verbs, with their parameters, and declares its flags."""
    assert issubclass(backend, Backend) and backend.name == name
    base = _verbs(Backend)
    for verb, member in _verbs(backend).items():
        assert verb in base, f"{backend.__name__}.{verb} is no verb of Backend's"
        assert _parameters(member) == _parameters(base[verb]), f"{backend.__name__}.{verb}"
    for flag in FLAGS:
        assert isinstance(getattr(backend, flag), bool), f"{backend.__name__}.{flag}"


def check_handle(handle) -> None:
    """Fail unless the class ``handle`` has every member of ``seams.RankHandle``
    (its methods with their parameters; ``ranks`` an attribute or a property)."""
    for member, spec in vars(RankHandle).items():
        if member.startswith("_") or not (callable(spec) or isinstance(spec, property)):
            continue
        if member == "ranks":
            # a class attribute or property, or an attribute every object is given
            source = inspect.getsource(handle)
            assert inspect.getattr_static(handle, "ranks", None) is not None or any(
                f"self.ranks{how}" in source for how in (" =", ": ")), \
                f"{handle.__name__} has no ranks"
            continue
        own = inspect.getattr_static(handle, member, None)
        assert own is not None, f"{handle.__name__} has no {member}"
        if isinstance(spec, property):
            assert isinstance(own, property), f"{handle.__name__}.{member} is no property"
        else:
            wanted = _parameters(spec)
            assert _parameters(own)[:len(wanted)] == wanted, f"{handle.__name__}.{member}"
