"""``~/.ssh/config`` read as OpenSSH reads it, without paramiko.

Reading it here rather than with paramiko's ``SSHConfig`` lets the
connections open while paramiko is still being imported, and avoids what
paramiko's lookup costs on every host: the local user looked up in the
password database for each ``Host`` block, and a reverse DNS lookup of this
machine (its ``%l`` token, computed whether used or not), which a slow
resolver turns into seconds.

What OpenSSH (``ssh_config(5)``) does, and this does too:

- ``keyword value`` or ``keyword=value``, keywords in any case, ``#``
  comments, double-quoted arguments;
- ``Host`` patterns (``*``, ``?``, ``!`` negation) matched against the host
  name as given; ``Match`` with ``all``, ``host`` (the name after
  ``HostName``), ``originalhost``, ``user``, ``localuser``, ``exec`` (run by
  ``/bin/sh``, true on status 0), ``final`` and ``canonical`` (true in the
  second reading of the file that a ``Match final`` asks for, where
  ``Host`` matches the name ``HostName`` gave), each negatable,
  comma-separated pattern lists;
- the first value obtained for a keyword wins, except ``IdentityFile``, of
  which every one is kept, in order, each once;
- tokens: ``%h`` and ``%%`` in ``HostName``; ``%%``, ``%C``, ``%d``,
  ``%h``, ``%i``, ``%k``, ``%L``, ``%l`` (this machine's name as it calls
  itself, no DNS), ``%n``, ``%p``, ``%r``, ``%u`` and a leading ``~`` in
  ``IdentityFile`` and the known-hosts files; ``%%``, ``%h``, ``%n``,
  ``%p``, ``%r`` in ``ProxyCommand`` and ``ProxyJump``.

``Include`` is expanded by the caller (:func:`.files.expand_includes`), in place.
Host names are compared in lower case, as OpenSSH lowers them.
"""

from __future__ import annotations

import fnmatch
import os
import socket

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Optional, Sequence, Tuple

#: Keywords whose every value counts (in order), not only the first.
_MULTIPLE = {"identityfile"}
#: Keywords whose one line holds several values (split on whitespace).
_LISTS = {"identityfile", "userknownhostsfile", "globalknownhostsfile"}
_FILE_TOKENS = "%CdhikLlnpru"
_TOKENS = {"hostname": "%h", "identityfile": _FILE_TOKENS, "userknownhostsfile": _FILE_TOKENS,
           "globalknownhostsfile": _FILE_TOKENS, "proxycommand": "%hnpr",
           "proxyjump": "%hnpr"}
_PROXIES = ("proxyjump", "proxycommand")
_MATCH_WORDS = {"all", "canonical", "final", "exec", "host", "originalhost", "user",
                "localuser"}


class ConfigError(ValueError):
    """A line of the configuration that OpenSSH would refuse too."""


def split_args(text: str) -> List[str]:
    """A line's words: split on whitespace, double quotes group (and are removed)."""
    words: List[str] = []
    word: List[str] = []
    quoted = started = False
    for ch in text:
        if ch == '"':
            quoted = not quoted
            started = True
        elif ch in " \t" and not quoted:
            if started:
                words.append("".join(word))
                word, started = [], False
        else:
            word.append(ch)
            started = True
    if quoted:
        raise ConfigError("unbalanced quote")
    if started:
        words.append("".join(word))
    return words


def parse(text: str, origin: str = "config") -> List[Tuple[int, str, List[str]]]:
    """(line number, lower-case keyword, arguments) of every setting in ``text``."""
    lines = []
    for number, raw in enumerate(text.split("\n"), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        head, sep, rest = line.partition("=") if _equals_first(line) else (line, "", "")
        if sep:
            keyword, args_text = head.strip(), rest
        else:
            parts = line.split(None, 1)
            keyword, args_text = parts[0], parts[1] if len(parts) > 1 else ""
        try:
            args = split_args(args_text.strip())
        except ConfigError as err:
            raise ConfigError(f"{origin} line {number}: {err}") from None
        keyword = keyword.lower()
        if keyword in ("host", "match") and not args:
            raise ConfigError(f"{origin} line {number}: {keyword} without an argument")
        lines.append((number, keyword, args))
    return lines


def _equals_first(line: str) -> bool:
    """Whether the keyword ends at an ``=`` (``Port=22``, ``Port = 22``)."""
    eq = line.find("=")
    if eq < 0:
        return False
    space = min((i for i in (line.find(" "), line.find("\t")) if i >= 0), default=len(line))
    return eq < space or not line[space:eq].strip()


def match_list(name: str, patterns: str) -> bool:
    """OpenSSH's pattern lists: comma-separated, ``!`` negates and vetoes."""
    return match_patterns(name, patterns.split(","))


def match_patterns(name: str, patterns: Sequence[str]) -> bool:
    """Whether ``name`` matches one of ``patterns`` and no negated one (``!``)."""
    matched = False
    for pattern in patterns:
        pattern = pattern.strip().lower()
        negated = pattern.startswith("!")
        if negated:
            pattern = pattern[1:]
        if pattern and fnmatch.fnmatchcase(name, pattern):
            if negated:
                return False
            matched = True
    return matched


class SSHConfig:
    """One configuration file's settings, looked up per host."""

    def __init__(self, text: str = "", origin: str = "config",
                 local_user: Optional[str] = None) -> None:
        self.lines = parse(text, origin)
        self.origin = origin
        self.local_user = local_user or login_name()

    def lookup(self, host: str, user: Optional[str] = None,
               port: Optional[int] = None) -> Dict[str, object]:
        """The settings that apply to ``host``: keyword (lower case) -> value
        (a list for ``IdentityFile`` and the known-hosts files).

        ``user`` and ``port`` are the command line's (``ssh -l``/``-p``): as
        in OpenSSH they are set before the file is read, so they win over
        its ``User``/``Port``, and ``Match user`` and ``%r``/``%p`` see them.
        """
        original = host.lower()
        found: Dict[str, object] = {}
        if user:
            found["user"] = user
        if port:
            found["port"] = str(port)
        self._pass(original, original, found, final=False)
        if self.final_pass:
            # As OpenSSH: the final reading matches Host against the name
            # HostName gave, and a HostName first found in it is not used.
            had_name = "hostname" in found
            self._pass(self._hostname(original, found).lower(), original, found, final=True)
            if not had_name:
                found.pop("hostname", None)
        return self._expand(original, found)

    @property
    def final_pass(self) -> bool:
        """Whether a ``Match final`` asks for the second, final reading."""
        return any(keyword == "match" and any(a.lower().lstrip("!") == "final" for a in args)
                   for _, keyword, args in self.lines)

    def _pass(self, host: str, original: str, found: Dict[str, object], final: bool) -> None:
        active = True
        for number, keyword, args in self.lines:
            if keyword == "host":
                active = match_patterns(host, args)
            elif keyword == "match":
                active = self._match(number, original, args, found, final)
            elif active and keyword != "include":
                if keyword in _MULTIPLE:
                    values: List[str] = found.setdefault(keyword, [])  # type: ignore[assignment]
                    values.extend(a for a in args if a not in values)
                elif keyword not in found and not (keyword in _PROXIES
                                                   and any(p in found for p in _PROXIES)):
                    # (ProxyJump and ProxyCommand: the first of either wins)
                    found[keyword] = list(args) if keyword in _LISTS else " ".join(args)

    def _match(self, number: int, original: str, args: List[str],
               found: Dict[str, object], final: bool) -> bool:
        where = f"{self.origin} line {number}"
        result = True
        i = 0
        while i < len(args):
            word = args[i].lower()
            negated = word.startswith("!")
            word = word.lstrip("!")
            if word not in _MATCH_WORDS:
                raise ConfigError(f"{where}: unsupported Match criterion {args[i]!r}")
            if word in ("all", "canonical", "final"):
                hit = word == "all" or final      # canonical too: no other canonical pass
                i += 1
            else:
                if i + 1 >= len(args):
                    raise ConfigError(f"{where}: Match {word} needs an argument")
                arg = args[i + 1]
                i += 2
                if word == "host":
                    hit = match_list(self._hostname(original, found).lower(), arg)
                elif word == "originalhost":
                    hit = match_list(original, arg)
                elif word == "user":
                    hit = match_list(str(found.get("user", self.local_user)).lower(), arg)
                elif word == "localuser":
                    hit = match_list(self.local_user.lower(), arg)
                else:
                    hit = self._exec(self._tokens(arg, _FILE_TOKENS, original, found, where),
                                     where)
            if hit == negated:
                result = False
        return result

    @staticmethod
    def _exec(command: str, where: str) -> bool:
        import subprocess

        from .....machine.cgroups import starting
        try:
            with starting():
                return subprocess.run(["/bin/sh", "-c", command], stdin=subprocess.DEVNULL,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                      timeout=30).returncode == 0
        except subprocess.TimeoutExpired:
            raise ConfigError(f"{where}: Match exec {command!r} did not end "
                              f"within 30 s") from None
        except OSError as err:
            raise ConfigError(f"{where}: Match exec {command!r}: {err.strerror}") from None

    def _hostname(self, original: str, found: Dict[str, object]) -> str:
        """The ``HostName`` found so far, its tokens expanded; else the name given."""
        if "hostname" not in found:
            return original
        return self._tokens(str(found["hostname"]), "%h", original, {}, self.origin)

    def _expand(self, original: str, found: Dict[str, object]) -> Dict[str, object]:
        where = self.origin
        if "hostname" in found:       # lower case, as ssh connects and looks up keys
            found["hostname"] = self._hostname(original, found).lower()
        for key, allowed in _TOKENS.items():
            if key == "hostname" or key not in found:
                continue
            value = found[key]
            if isinstance(value, list):
                found[key] = [self._path(self._tokens(v, allowed, original, found, where))
                              for v in value]
            else:
                found[key] = self._tokens(str(value), allowed, original, found, where)
        return found

    @staticmethod
    def _path(value: str) -> str:
        if value.startswith("~"):
            return os.path.expanduser(value) if value[1:2] in ("", "/") else value
        return value

    def _tokens(self, value: str, allowed: str, original: str, found: Dict[str, object],
                where: str) -> str:
        if "%" not in value:
            return value
        host = str(found.get("hostname", original))
        port = str(found.get("port", "22"))
        user = str(found.get("user", self.local_user))
        local = socket.gethostname()
        out = []
        i = 0
        while i < len(value):
            ch = value[i]
            if ch != "%":
                out.append(ch)
                i += 1
                continue
            token = value[i + 1:i + 2]
            i += 2
            if token == "%":
                out.append("%")
                continue
            if not token or token not in allowed:
                raise ConfigError(f"{where}: the token %{token} is not allowed in {value!r}")
            if token == "h":
                out.append(host)
            elif token == "n":
                out.append(original)
            elif token == "p":
                out.append(port)
            elif token == "r":
                out.append(user)
            elif token == "u":
                out.append(self.local_user)
            elif token == "d":
                out.append(os.path.expanduser("~"))
            elif token == "i":
                out.append(str(os.getuid()))
            elif token == "k":
                out.append(str(found.get("hostkeyalias", original)))
            elif token == "L":
                out.append(local.split(".")[0])
            elif token == "l":
                out.append(local)
            elif token == "C":
                import hashlib
                out.append(hashlib.sha1(f"{local}{host}{port}{user}".encode()).hexdigest())
        return "".join(out)


def login_name() -> str:
    """This process's user name, from the password database, as OpenSSH takes it."""
    import pwd
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())
