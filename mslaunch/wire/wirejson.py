"""JSON for the link, from the interpreter's C accelerator without the ``json`` package.

Every agent encodes and decodes JSON frames from its first message on, and
``import json`` costs an agent more than the rest of its link: the package
compiles regular expressions at import (so ``re`` and ``enum`` come too),
10 to 13 ms of CPU per host on a small machine.  The C module ``_json``
that the package itself uses for the same work loads in a fraction of a
millisecond.  :func:`dumps` and :func:`loads` drive it as ``json.dumps(obj,
ensure_ascii=True, separators=(",", ":"))`` and ``json.loads`` do, and fall
back to the package where the interpreter has no such module (PyPy) or
its accelerator is not the one checked here (a self-test at import).  A
property test holds both against the package.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Optional, Tuple

_SPACE = " \t\n\r"


def _constant(name: str) -> float:
    return {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}[name]


class _Context:
    """The attributes ``_json.make_scanner`` reads from a ``JSONDecoder``."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = staticmethod(_constant)


def _accelerated() -> Optional[Tuple[Callable[[Any], str], Callable[[str], Any]]]:
    try:
        import _json
        scan = _json.make_scanner(_Context())  # type: ignore[arg-type]  # any decoder-like object
    except (ImportError, AttributeError, TypeError):
        return None

    def dumps(obj: Any) -> str:
        # A fresh encoder per call: its markers (circular references) start empty.
        return "".join(_json.make_encoder({}, _fail, _json.encode_basestring_ascii, None,
                                          ":", ",", False, False, True)(obj, 0))

    def loads(text: str) -> Any:
        start = len(text) - len(text.lstrip(_SPACE))
        try:
            value, end = scan(text, start)
        except StopIteration:
            raise ValueError("Expecting value") from None
        except SystemError:
            # The accelerator reports most errors with the json package's own
            # exception class, looked up among the loaded modules: without the
            # package (the point here) some versions return no exception at all.
            raise ValueError("not JSON") from None
        if text[end:].strip(_SPACE):
            raise ValueError("Extra data")
        return value

    sample = {"a": [1, -2.5, None, True, False, "\u00e9\x00\"\\"], "b": {}, "c": 1e300}
    text = '{"a":[1,-2.5,null,true,false,"\\u00e9\\u0000\\"\\\\"],"b":{},"c":1e+300}'
    try:
        if dumps(sample) != text or loads(" " + text + "\n") != sample:
            return None
    except (TypeError, ValueError):
        return None
    return dumps, loads


def _fail(obj: Any) -> Any:
    raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")


_fast = _accelerated()
if _fast is not None:
    dumps, loads = _fast
else:
    def dumps(obj: Any) -> str:
        """``obj`` as compact JSON, non-ASCII characters escaped."""
        import json
        return json.dumps(obj, ensure_ascii=True, separators=(",", ":"))

    def loads(text: str) -> Any:
        """The value of the JSON document ``text``; ValueError if it is not one."""
        import json
        return json.loads(text)
