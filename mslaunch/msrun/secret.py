"""The job's shared secret, and the challenge-response that proves it.

Every node of an msrun-mode job proves to the node service, and the service
to every node, that it knows the same secret -- without the secret ever
crossing the network or appearing in argv.  Each side sends a random
nonce; each answers with an HMAC-SHA256 of both nonces under the secret,
labelled by role so that one side's answer cannot be played back as the
other's.

The secret comes from ``MSLAUNCH_SECRET``, else ``--secret_file``, else a
per-user file, ``~/.mslaunch/secret``, created (mode 0600, 32 random bytes)
on first use: on a cluster whose home directory is shared, every node of a
user's jobs then knows the same secret with no set-up at all.
"""

from __future__ import annotations

import hashlib
import hmac
import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Optional

from ..core.errors import LaunchError

NONCE_BYTES = 32


def default_path() -> str:
    return os.path.join(os.path.expanduser("~"), ".mslaunch", "secret")


def load_secret(secret_file: Optional[str]) -> bytes:
    """The job's secret (see the module docstring); LaunchError if it cannot be had."""
    text = os.environ.get("MSLAUNCH_SECRET")
    if text:
        return text.encode("utf-8", "surrogateescape")
    path = secret_file or default_path()
    try:
        with open(path, "rb") as f:
            data = f.read(4096).strip()
        if not data:
            raise LaunchError(f"the secret file {path} is empty")
        return data
    except FileNotFoundError:
        if secret_file:
            raise LaunchError(f"--secret_file {path}: no such file") from None
    except OSError as err:
        raise LaunchError(f"cannot read the secret file {path}: {err.strerror}") from None
    # First use: a new secret only this user can read.
    data = os.urandom(32).hex().encode()
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with open(fd, "wb") as f:
            f.write(data + b"\n")
    except FileExistsError:
        return load_secret(secret_file)     # another node of the job made it first
    except OSError as err:
        raise LaunchError(f"cannot create the secret file {path}: {err.strerror}; set "
                          f"MSLAUNCH_SECRET instead") from None
    return data


def new_nonce() -> str:
    return os.urandom(NONCE_BYTES).hex()


def valid_nonce(value: object) -> bool:
    """Whether a peer's nonce has the shape :func:`new_nonce` gives."""
    return isinstance(value, str) and len(value) == 2 * NONCE_BYTES and \
        all(c in "0123456789abcdef" for c in value)


def proof(secret: bytes, role: str, mine: str, theirs: str) -> str:
    """What ``role`` ("node" or "service") answers: HMAC of both nonces."""
    return hmac.new(secret, f"mslaunch-{role}|{mine}|{theirs}".encode(),
                    hashlib.sha256).hexdigest()


def check(secret: bytes, role: str, mine: str, theirs: str, answer: object) -> bool:
    """Whether ``answer`` is the proof ``role`` should have given (constant time)."""
    return isinstance(answer, str) and hmac.compare_digest(
        answer.encode("ascii", "replace"), proof(secret, role, mine, theirs).encode())


def mismatch_hint() -> str:
    return ("the nodes of a job must share one secret: set the same MSLAUNCH_SECRET on "
            "every node, give --secret_file FILE with the same content, or share "
            f"{default_path()} (a shared home directory does that)")
