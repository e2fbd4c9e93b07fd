"""What every way ranks start owes the supervisor, checked for each line of the
tables, so that a new backend, handle or starter is checked by adding its line:

- a backend (``BACKENDS``) is a ``Backend`` named as its line, which overrides
  only the base's verbs, with their parameters, and declares its PMI, its
  machine and its PMI's timing as flags;
- a rank handle that stands for processes of the launcher's own has every
  member of ``seams.RankHandle``, with its parameters;
- a starter (``STARTERS``) names a module that imports, with a ``make``;
- every verb of the base is every backend's business: none is overridden by
  one backend alone (what one way alone needs is its own object, a flag or
  its planning).

The handles' behaviour is the system tests' (a real mpirun, a real srun step:
``tests/system/openmpi``, ``tests/system/slurm``); the process plumbing they
share is ``tests/rooms/machine/test_child.py``'s."""

from __future__ import annotations

import importlib

import pytest

from conformance import check_backend, check_handle
from mslaunch.backends.agents.starters.starter import STARTERS
from mslaunch.backends.backend import BACKENDS, Backend

#: The handles of the ranks a backend starts (module, class).
HANDLES = (
    ("mslaunch.machine.local", "LocalRanks"),
    ("mslaunch.backends.mpirun.openmpi", "MpirunHandle"),
    ("mslaunch.backends.srunsteps.srunranks", "SrunRanks"),
    ("mslaunch.backends.agents.host", "RemoteHost"),
)


@pytest.mark.parametrize("name, words, wanted, module, cls", BACKENDS,
                         ids=[row[0] for row in BACKENDS])
def test_a_backend_overrides_only_the_verbs_of_the_base(name, words, wanted, module, cls):
    check_backend(getattr(importlib.import_module(module), cls), name)


@pytest.mark.parametrize("module, cls", HANDLES, ids=[row[1] for row in HANDLES])
def test_a_rank_handle_has_every_member_of_the_seam(module, cls):
    check_handle(getattr(importlib.import_module(module), cls))


@pytest.mark.parametrize("name, words, wanted, module", STARTERS,
                         ids=[row[0] for row in STARTERS])
def test_a_starter_line_names_a_module_that_makes_one(name, words, wanted, module):
    assert callable(getattr(importlib.import_module(module), "make", None)), module


def _overriders(backends) -> dict:
    """For each verb of the base, the backends of ``backends`` that override it."""
    verbs = [v for v, m in vars(Backend).items() if not v.startswith("_") and callable(m)]
    return {verb: [cls.__name__ for cls in backends if verb in vars(cls)] for verb in verbs}


def test_no_verb_of_the_base_is_one_backends_alone():
    backends = [getattr(importlib.import_module(module), cls)
                for _, _, _, module, cls in BACKENDS]
    found = _overriders(backends)
    assert found and all(len(owners) != 1 for owners in found.values()), found


def test_the_count_of_overriders_sees_a_hook_of_one_backend():
    class Lonely(Backend):
        def started(self, view) -> None:
            pass
    assert _overriders([Lonely, Backend])["started"] == ["Lonely", "Backend"]
    assert _overriders([Lonely])["started"] == ["Lonely"]


def test_the_check_refuses_a_handle_without_a_member_of_the_seam():
    class NoRanks:
        busy = property(lambda self: False)

        def start(self) -> None: ...

        def signal(self, sig, ranks=None) -> None: ...

        def release(self) -> None: ...

        def close(self, deadline) -> None: ...

    class NoClose(NoRanks):
        ranks = (0,)
        close = None          # type: ignore[assignment]

    with pytest.raises(AssertionError, match="NoRanks has no ranks"):
        check_handle(NoRanks)
    with pytest.raises(AssertionError, match="NoClose has no close"):
        check_handle(NoClose)


def test_the_check_refuses_a_backend_with_a_hook_of_its_own_or_another_signature():
    class Odd(Backend):
        def reconnect(self) -> None:
            pass

    class Other(Backend):
        def check(self) -> None:        # type: ignore[override]
            pass

    with pytest.raises(AssertionError, match="no verb"):
        check_backend(Odd, "local")
    with pytest.raises(AssertionError, match="Other.check"):
        check_backend(Other, "local")
