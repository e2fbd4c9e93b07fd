"""PMI wire codecs: PMI-1 text lines and PMI-2 length-prefixed frames.

Pure functions: :func:`parse_v1`/:func:`format_v1` for ``cmd=x key=value ...\\n``
lines, :func:`parse_v2`/:func:`format_v2` for ``%6u`` length + ``cmd=x;k=v;...;``
frames, and :func:`take_line`/:func:`take_frame` to cut them out of a byte
stream.  The limits the server announces (``vallen_max`` and friends) live
here too.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Mapping, Optional, Tuple

    Fields = Dict[str, str]

KVSNAME_MAX = 256
KEYLEN_MAX = 64
VALLEN_MAX = 32768
MAX_MESSAGE = 65536 + VALLEN_MAX
MAX_PREAUTH_MESSAGE = 1024
MAX_OUTPUT = 1 << 20
MAX_ERRORS = 16


class WireError(ValueError):
    """Bytes that do not follow the PMI wire grammar."""


# The grammar is checked by hand, not with ``re``: importing it costs every
# agent and the launcher 5 to 10 ms at a rank's first PMI message, in the
# middle of ``MPI_Init``.  A property test holds each check to the regular
# expression noted beside it.
_CONTROL = frozenset(chr(c) for c in range(0x20)) | {"\x7f"}
_KEY_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_/-")
_DIGITS = frozenset("0123456789")


def has_control(text: str) -> bool:
    """``[\\x00-\\x1f\\x7f]`` found in ``text``."""
    return not _CONTROL.isdisjoint(text)


def is_key(text: str) -> bool:
    """``[A-Za-z0-9_/\\-]+``."""
    return bool(text) and _KEY_CHARS.issuperset(text)


def is_pmi_id(text: str) -> bool:
    """``[1-9][0-9]{0,9}``."""
    return 0 < len(text) <= 10 and text[0] != "0" and _DIGITS.issuperset(text)


def _v2_header(header: bytes) -> bool:
    """``rb" *[0-9]+ *"``."""
    return header.strip(b" ").isdigit()


def v1_token(line: str, pos: int) -> Optional[Tuple[str, str, int]]:
    """One PMI-1 token at ``pos`` (``r" *([A-Za-z0-9_/\\-]+)=((?:\\\\.|\\\\$|[^ \\\\])+)"``):
    its key, its value with the escapes undone (a backslash makes the next
    character literal, a lone trailing one is itself), and where it ends;
    None if there is no token there.  ``line`` holds no control character."""
    end = len(line)
    while pos < end and line[pos] == " ":
        pos += 1
    start = pos
    while pos < end and line[pos] in _KEY_CHARS:
        pos += 1
    if pos == start or pos == end or line[pos] != "=":
        return None
    key = line[start:pos]
    pos += 1
    stop = line.find(" ", pos)
    stop = end if stop < 0 else stop
    if "\\" not in line[pos:stop]:          # no escape: the value runs to the space
        return (key, line[pos:stop], stop) if stop > pos else None
    value: List[str] = []
    while pos < end:
        ch = line[pos]
        if ch == " ":
            break
        if ch == "\\" and pos + 1 < end:
            pos += 1
            ch = line[pos]
        value.append(ch)
        pos += 1
    if not value:
        return None
    return key, "".join(value), pos


def _decode(data: bytes) -> str:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise WireError("binary data") from None
    if has_control(text):
        raise WireError("control character in message")
    return text


def parse_v1(line: str) -> Tuple[str, Fields]:
    """Parse one PMI-1 line (without or with its ``\\n``) into (cmd, fields).

    Follows MPICH's parser: the line starts with ``cmd=``, tokens are
    space-separated ``key=value``, an empty value is an error, and the first
    occurrence of a repeated key wins.
    """
    if line.endswith("\n"):
        line = line[:-1]
    if has_control(line):
        raise WireError("control character in message")
    if not line.startswith("cmd="):
        raise WireError("message does not start with cmd=")
    cmd: Optional[str] = None
    fields: Fields = {}
    pos, end = 0, len(line)
    while pos < end:
        token = v1_token(line, pos)
        if token is None:
            if line[pos:].strip(" "):
                raise WireError(f"bad token at column {pos}")
            break
        key, value, pos = token
        if key == "cmd":
            if cmd is not None:
                raise WireError("two cmd= tokens")
            cmd = value
        else:
            fields.setdefault(key, value)
        if pos < end and line[pos] != " ":
            raise WireError(f"bad token at column {pos}")
    assert cmd is not None
    return cmd, fields


def _v1_value(value: object) -> str:
    text = str(value)
    if not text:
        raise WireError("empty value")  # the client rejects `key=` outright
    if has_control(text):
        raise WireError("control character in value")
    return text.replace("\\", "\\\\").replace(" ", "\\ ")


def _check_key(key: str) -> None:
    if not is_key(key):
        raise WireError(f"invalid key {key!r}")


def format_v1(cmd: str, fields: Mapping[str, object] = {}) -> bytes:
    """Format one PMI-1 line; values are escaped so they parse back unchanged."""
    parts = ["cmd=" + _v1_value(cmd)]
    for key, value in fields.items():
        _check_key(key)
        if key == "cmd":
            raise WireError("cmd is not a field")
        parts.append(f"{key}={_v1_value(value)}")
    return (" ".join(parts) + "\n").encode("utf-8")


def parse_v2(body: str) -> Tuple[str, Fields]:
    """Parse the body of one PMI-2 frame (``cmd=x;k=v;...;``) into (cmd, fields).

    PMI-2 has no escaping: a value runs to the next ``;`` and may hold spaces.
    """
    if has_control(body):
        raise WireError("control character in message")
    if not body.startswith("cmd="):
        raise WireError("frame does not start with cmd=")
    tokens = body.split(";")
    if tokens[-1] == "":
        tokens.pop()
    cmd: Optional[str] = None
    fields: Fields = {}
    for token in tokens:
        key, sep, value = token.lstrip(" ").partition("=")
        if not sep or not is_key(key):
            raise WireError(f"bad token {token[:40]!r}")
        if not value:
            raise WireError(f"empty value for {key}")
        if key == "cmd":
            if cmd is not None:
                raise WireError("two cmd= tokens")
            cmd = value
        else:
            fields.setdefault(key, value)
    assert cmd is not None
    return cmd, fields


def format_v2(cmd: str, fields: Mapping[str, object] = {}) -> bytes:
    """Format one PMI-2 frame: 6-character space-padded length, then the body."""
    parts = [f"cmd={cmd}"]
    for key, value in fields.items():
        _check_key(key)
        parts.append(f"{key}={value}")
    for part in parts:
        value = part.partition("=")[2]
        if not value or ";" in value or has_control(value):
            raise WireError(f"value not representable in PMI-2: {value[:40]!r}")
    body = (";".join(parts) + ";").encode("utf-8")
    if len(body) > 999999:
        raise WireError("frame too long")
    return b"%6d" % len(body) + body


def take_line(buf: bytearray, limit: int) -> Optional[bytes]:
    """Remove and return one ``\\n``-terminated line (without it) from ``buf``.

    Returns None when the line is still incomplete; raises WireError when no
    newline appears within ``limit`` bytes.
    """
    idx = buf.find(b"\n", 0, limit + 1)
    if idx < 0:
        if len(buf) > limit:
            raise WireError(f"line longer than {limit} bytes")
        return None
    line = bytes(buf[:idx])
    del buf[: idx + 1]
    return line


def take_frame(buf: bytearray, limit: int) -> Optional[bytes]:
    """Remove and return the body of one PMI-2 frame from ``buf``, or None."""
    header = bytes(buf[:6])
    if header.strip(b" 0123456789"):
        raise WireError("bad PMI-2 length header")
    if len(buf) < 6:
        return None
    if not _v2_header(header):
        raise WireError("bad PMI-2 length header")
    length = int(header)
    if length <= 0 or length > limit:
        raise WireError(f"PMI-2 frame of {length} bytes (limit {limit})")
    if len(buf) < 6 + length:
        return None
    body = bytes(buf[6 : 6 + length])
    del buf[: 6 + length]
    return body
