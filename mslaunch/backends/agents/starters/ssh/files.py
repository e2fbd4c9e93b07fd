"""The user's OpenSSH files, as the SSH starter reads them.

``~/.ssh/config`` found through ``$HOME`` (or ``--ssh-config``), with its
``Include`` lines expanded here (see :mod:`.config` for the parser); the
known host keys (``~/.ssh/known_hosts``, ``/etc/ssh/ssh_known_hosts`` and the
config's ``UserKnownHostsFile``/``GlobalKnownHostsFile``, hashed entries
too), and adding new ones as OpenSSH's ``accept-new`` does; and the keys to
log in with: the ssh-agent's, then the identity files (a key with a
passphrase is used only through the agent: nothing ever prompts).
"""

from __future__ import annotations

import errno
import glob
import os
import threading

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Sequence, Tuple

from ... import bootstrap

DEFAULT_KEYS = ("id_ed25519", "id_ecdsa", "id_rsa", "id_dsa")


class HostFailure(Exception):
    """One host could not be set up; ``stage`` says where it failed."""

    def __init__(self, stage: str, reason: str, unknown_key: Optional[Tuple[str, str]] = None
                 ) -> None:
        super().__init__(f"{stage}: {reason}")
        self.stage = stage
        self.reason = reason
        #: A host key not in known_hosts: (the ssh-keyscan command, the fingerprint),
        #: so that hosts refused alike are told once (see ssh.describe_failures).
        self.unknown_key = unknown_key


def short_reason(err: BaseException) -> str:
    """An error in a few words, for a host's failure."""
    text = str(err) or type(err).__name__
    if isinstance(err, OSError) and err.errno == errno.ECONNREFUSED:
        return "connection refused"
    return text.strip().splitlines()[0][:200] if text.strip() else type(err).__name__


# ---------------------------------------------------------------------------
# ~/.ssh/config

def home() -> str:
    """The home directory whose ``.ssh`` is read: ``$HOME``, else the user's entry."""
    return os.environ.get("HOME") or os.path.expanduser("~")


def expand_includes(path: str, depth: int = 0) -> str:
    """The config text with ``Include`` lines replaced by the files they name."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().split("\n")
    except OSError:
        return ""
    out = []
    ssh_dir = os.path.join(home(), ".ssh")
    for line in lines:
        words = line.strip().split(None, 1)
        if words and words[0].lower() == "include" and len(words) == 2 and depth < 8:
            for pattern in words[1].split():
                pattern = os.path.expanduser(pattern.replace("~", home(), 1)
                                             if pattern.startswith("~") else pattern)
                if not os.path.isabs(pattern):
                    pattern = os.path.join(ssh_dir, pattern)
                for included in sorted(glob.glob(pattern)):
                    out.append(expand_includes(included, depth + 1))
        else:
            out.append(line)
    return "\n".join(out)


class Config:
    """``~/.ssh/config`` (or ``--ssh-config``), Include expanded (see :mod:`.config`)."""

    def __init__(self, path: Optional[str]) -> None:
        from .config import ConfigError, SSHConfig, login_name
        path = path or os.path.join(home(), ".ssh", "config")
        self.local_user = login_name()
        self.config: Optional[SSHConfig] = None
        self.error = ""
        try:
            self.config = SSHConfig(expand_includes(path) if os.path.exists(path) else "",
                                    origin=path, local_user=self.local_user)
        except ConfigError as err:    # said for every host, which all use the file
            self.error = str(err)

    def lookup(self, name: str, user: Optional[str] = None,
               port: Optional[int] = None) -> Dict[str, Any]:
        from .config import ConfigError
        if self.config is None:
            raise HostFailure("resolve", self.error)
        try:
            return self.config.lookup(name, user, port)
        except ConfigError as err:
            raise HostFailure("resolve", str(err)) from None


# ---------------------------------------------------------------------------
# known hosts

#: OpenSSH's known-hosts files when the config names none (ssh_config(5)).
USER_FILES = ("~/.ssh/known_hosts", "~/.ssh/known_hosts2")
GLOBAL_FILES = ("/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2")


class KnownHosts:
    """The known host keys, read as OpenSSH reads them: from the files a host's
    ``UserKnownHostsFile`` and ``GlobalKnownHostsFile`` name (``none``: none),
    else OpenSSH's defaults; a new key (``accept-new``) goes into the first of
    the user's files."""

    def __init__(self, paramiko) -> None:
        self.paramiko = paramiko
        self._read: Dict[str, Any] = {}         # path -> its HostKeys
        self.lock = threading.Lock()

    def _keys(self, path: str):
        with self.lock:
            keys = self._read.get(path)
            if keys is None:
                keys = self._read[path] = self.paramiko.HostKeys()
                try:
                    keys.load(path)
                except OSError:
                    pass
                except Exception:   # a line paramiko cannot read (e.g. @cert-authority)
                    pass
            return keys

    @staticmethod
    def files(user: Optional[Sequence[str]], system: Optional[Sequence[str]]
              ) -> Tuple[List[str], List[str]]:
        """The user's and the system's files of a host: those its config named, else
        OpenSSH's; ``none`` names none."""
        def chosen(named: Optional[Sequence[str]], default: Sequence[str]) -> List[str]:
            given = list(named) if named else list(default)
            if [p.lower() for p in given] == ["none"]:
                return []
            return [home() + p[1:] if p.startswith("~/") else p for p in given]
        return chosen(user, USER_FILES), chosen(system, GLOBAL_FILES)

    def check(self, lookup: str, key, accept_new: bool, shown: str, port: int,
              user: Sequence[str], system: Sequence[str]) -> None:
        known: Optional[Dict[str, Any]] = None
        for path in (*user, *system):
            found = self._keys(path).lookup(lookup)
            if found is not None:
                known = dict(found) if known is None else {**found, **known}
        named = user[0] if user else "known_hosts"
        if known is not None and key.get_name() in known:
            if known[key.get_name()] == key:
                return
            raise HostFailure("host key", f"the host key of {shown} has CHANGED since it was "
                              f"recorded in {named} (possibly someone in the middle); if the "
                              f"change is expected, remove the old key with: ssh-keygen -R "
                              f"{bootstrap.shell_quote(lookup)}")
        if known is not None and not accept_new:
            raise HostFailure("host key", f"{shown} offered a {key.get_name()} key, but "
                              f"{named} holds only {', '.join(known.keys())} for it")
        if not accept_new or not user:
            scan = f"ssh-keyscan {'-p ' + str(port) + ' ' if port != 22 else ''}" \
                   f"-t {key.get_name()} {lookup.strip('[]').rsplit(']:', 1)[0]}"
            raise HostFailure("host key", f"{shown} is not in {named}; after checking its "
                              f"fingerprint ({fingerprint(key)}), trust it with: {scan} >> "
                              f"{named}, or run with --ssh-accept-new",
                              unknown_key=(scan, fingerprint(key)))
        with self.lock:
            self._read[user[0]].add(lookup, key.get_name(), key)
            os.makedirs(os.path.dirname(user[0]), mode=0o700, exist_ok=True)
            with open(user[0], "a") as f:
                f.write(f"{lookup} {key.get_name()} {key.get_base64()}\n")


def fingerprint(key) -> str:
    import base64
    import hashlib
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


# ---------------------------------------------------------------------------
# logging in

def authenticate(paramiko, transport, s: Dict[str, Any]) -> None:
    """Log in as ``s["user"]`` with the agent's keys, then the key files (never a prompt)."""
    user = s["user"]
    tried: List[str] = []
    keys = []
    explicit = [os.path.expanduser(p) for p in s["identities"]]
    files = explicit or [os.path.join(home(), ".ssh", k) for k in DEFAULT_KEYS]
    wanted_blobs = set()
    for path in files:
        if os.path.exists(path + ".pub"):
            try:
                with open(path + ".pub") as f:
                    wanted_blobs.add(f.read().split()[1])
            except (OSError, IndexError):
                pass
    if os.environ.get("SSH_AUTH_SOCK"):
        try:
            for key in paramiko.Agent().get_keys():
                if not s["identities_only"] or key.get_base64() in wanted_blobs:
                    keys.append(("ssh-agent key", key))
        except Exception:
            pass
    for path in files:
        if not os.path.exists(path):
            if path in explicit:
                tried.append(f"{path} (missing)")
            continue
        try:
            keys.append((path, paramiko.PKey.from_path(path)))
        except paramiko.PasswordRequiredException:
            tried.append(f"{path} (has a passphrase; add it to ssh-agent)")
        except Exception as err:
            tried.append(f"{path} (unreadable: {short_reason(err)})")
    for label, key in keys:
        try:
            transport.auth_publickey(user, key)
        except paramiko.AuthenticationException:
            tried.append(label)
            continue
        except Exception as err:
            raise HostFailure("authentication", f"{user}@{s['hostname']}: "
                                                f"{short_reason(err)}") from None
        if transport.is_authenticated():
            return
    raise HostFailure("authentication", f"{user}@{s['hostname']} accepted none of the keys "
                      f"({', '.join(tried) or 'no keys found'}); put your public key on the "
                      f"host with: ssh-copy-id {user}@{s['hostname']} (a key with a passphrase: "
                      f"ssh-add it first), or name another with --ssh-identity FILE")
