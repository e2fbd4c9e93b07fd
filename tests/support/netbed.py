"""Network-namespace plumbing for multi-host test beds on one Linux machine.

A bed is a set of Linux network namespaces that look like separate hosts:

* a "switch" namespace ``{prefix}sw`` holding a bridge ``br0``;
* an uplink veth ``{prefix}up`` in the root namespace with address
  ``198.18.K.1/24``, whose peer ``up0`` is a port of the bridge, so the test
  process (in the root namespace) reaches every host;
* one namespace ``{prefix}{name}`` per host (``h1``, ``h2``, ... or any other
  name such as ``ctl``) with ``eth0`` on the bridge, address ``198.18.K.(10+i)``
  for ``hI`` and ``lo`` up.  Hosts have no default route: they reach only
  ``198.18.K.0/24``;
* per host, a UTS namespace (hostname = the host's name) and a private mount
  namespace in which the bed's hosts file is bind-mounted over ``/etc/hosts``.
  The root namespace's ``/etc/hosts`` is never modified.

``prefix`` is ``{prefix_base}{K}`` (``mt20``...).  K is chosen so that several
test runs (and other beds, e.g. a Slurm bed using another ``prefix_base`` and
K range) can share the machine: a K is claimed with a state file created
atomically under ``/run/mslaunch-testbeds``, and only when its uplink link does
not exist, none of its namespaces exist and ``198.18.K.0/24`` has no route.
The state file names the creating process; :func:`preclean_stale` removes beds
whose creator is dead (crashed runs) and never touches a live run's bed.

Every :class:`Bed` (SSH, Slurm) also has a tag, put in the environment of its
daemons and clients (``MSLAUNCH_TESTBED_TAG``), and an owner record
(``{prefix_base}-{tag}.owner.json`` in the same directory) naming the creating
process, the tag, the inodes of the bed's network namespaces and the paths to
delete with it.  :func:`sweep_stale`, run before a bed is built, removes what a
dead run's bed left: its tagged processes and their descendants, everything in
a recorded namespace that holds a tagged process, the recorded paths.  It finds
namespaces by inode, not by /run/netns: a bed built in a private mount
namespace has its /run/netns mounts there only, and they vanish with it while
its daemons live on.

Daemons and commands enter a host with ``nsenter``, not ``ip netns exec``: the
latter remounts ``/sys`` and hides ``/sys/fs/cgroup``.  The bed creates each
host's UTS and mount namespaces once with
``nsenter --net=/run/netns/NS unshare --uts --mount sh -c "hostname NAME &&
mount --bind HOSTSFILE /etc/hosts && ..."`` and keeps file descriptors on
them, so every later daemon (including a restarted one) and every command run
in the host shares exactly the same namespaces, even when no process is left
in the host.  Inside a host's mount namespace ``/run/netns`` is unmounted:
otherwise its private copy of the nsfs mounts would keep the network
namespaces of every bed on the machine alive after ``ip netns del``.

Everything here needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN), iproute2 and
util-linux (``nsenter``, ``unshare``).
"""

from __future__ import annotations

import atexit
import copy
import ipaddress
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

NETNS_DIR = "/run/netns"
SUBNET_BASE = "198.18"
DEFAULT_K_RANGE = range(20, 220)  # 240 and up belong to the Slurm bed
_SBIN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
TAG_VAR = "MSLAUNCH_TESTBED_TAG"  # in the environment of a bed's daemons and clients
_ROUTE_TYPES = {"unicast", "local", "broadcast", "multicast", "throw", "unreachable",
                "prohibit", "blackhole", "nat", "anycast"}


class NetBedError(RuntimeError):
    """A bed could not be built or used; the message says why."""


# --------------------------------------------------------------------------- tools


def find_tool(name: str) -> Optional[str]:
    """Absolute path of ``name`` (absolute names are checked as they are), or None."""
    if os.path.isabs(name):
        return name if os.access(name, os.X_OK) else None
    path = os.environ.get("PATH", "") + os.pathsep + _SBIN_PATH
    return shutil.which(name, path=path)


def missing_tools(names: Iterable[str]) -> List[str]:
    """The names among ``names`` that are not installed."""
    return [n for n in names if find_tool(n) is None]


def _tool(name: str) -> str:
    path = find_tool(name)
    if path is None:
        raise NetBedError(f"{name} is not installed")
    return path


def namespaces_permitted() -> Tuple[bool, str]:
    """Whether this process may create network, UTS and mount namespaces.

    Returns ``(ok, reason)``; ``reason`` is unshare's message when not permitted.
    """
    unshare = find_tool("unshare")
    if unshare is None:
        return False, "unshare is not installed"
    try:
        r = subprocess.run([unshare, "--net", "--uts", "--mount", "true"],
                           stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"unshare --net --uts --mount true: {e}"
    if r.returncode == 0:
        return True, ""
    msg = (r.stderr or r.stdout).strip() or f"exit status {r.returncode}"
    return False, f"unshare --net --uts --mount true: {msg}"


def ip_cmd(args: Sequence[str], netns: Optional[str] = None, check: bool = True,
           timeout: float = 30) -> subprocess.CompletedProcess:
    """Run ``ip [-n NETNS] ARGS``; raise NetBedError on failure when ``check``."""
    argv = [_tool("ip")] + (["-n", netns] if netns else []) + list(args)
    r = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                       timeout=timeout)
    if check and r.returncode != 0:
        raise NetBedError(f"{' '.join(argv)}: {r.stderr.strip() or r.returncode}")
    return r


def _ip_batch(lines: Sequence[str], netns: Optional[str] = None,
              force: bool = False) -> subprocess.Popen:
    """Start ``ip [-n NETNS] [-force] -batch -`` fed with ``lines``; see :func:`_wait_batch`."""
    argv = [_tool("ip")] + (["-n", netns] if netns else []) + (["-force"] if force else [])
    p = subprocess.Popen(argv + ["-batch", "-"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    p._batch_input = "".join(line + "\n" for line in lines)  # type: ignore[attr-defined]
    return p


def _wait_batch(p: subprocess.Popen, check: bool = True, timeout: float = 30) -> str:
    out, err = p.communicate(p._batch_input, timeout=timeout)  # type: ignore[attr-defined]
    if check and p.returncode != 0:
        raise NetBedError(f"ip -batch failed: {err.strip() or out.strip()}")
    return err


# ---------------------------------------------------------------- process helpers


def process_start_time(pid: int) -> Optional[int]:
    """Start time of ``pid`` in clock ticks since boot, or None if it does not exist."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        if fields[0] == b"Z":
            return None
        return int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def process_alive(pid: int, start_time: Optional[int] = None) -> bool:
    """True if ``pid`` runs (not a zombie) and, when given, started at ``start_time``."""
    st = process_start_time(pid)
    return st is not None and (start_time is None or st == start_time)


def _all_pids() -> List[int]:
    return [int(e) for e in os.listdir("/proc") if e.isdigit()]


def parent_pid(pid: int) -> Optional[int]:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def children_map() -> Dict[int, List[int]]:
    """``{ppid: [child pids]}`` for every live process."""
    kids: Dict[int, List[int]] = {}
    for pid in _all_pids():
        pp = parent_pid(pid)
        if pp is not None:
            kids.setdefault(pp, []).append(pid)
    return kids


def descendants(pid: int) -> List[int]:
    """Live descendants of ``pid`` (not ``pid`` itself), parents before children."""
    kids = children_map()
    out: List[int] = []
    todo = list(kids.get(pid, []))
    while todo:
        p = todo.pop(0)
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def kill_pids(pids: Iterable[int], sig: int = signal.SIGKILL) -> List[int]:
    """Send ``sig`` to each pid (never to our own process); return those signalled."""
    done = []
    me = os.getpid()
    for pid in pids:
        if pid <= 1 or pid == me:
            continue
        try:
            os.kill(pid, sig)
            done.append(pid)
        except (ProcessLookupError, PermissionError):
            pass
    return done


def list_netns() -> List[str]:
    """Names of the named network namespaces (what ``ip netns list`` shows)."""
    try:
        return sorted(os.listdir(NETNS_DIR))
    except FileNotFoundError:
        return []


def netns_pids(names: Iterable[str]) -> Dict[str, List[int]]:
    """``{name: [pids]}`` of the live processes in each named network namespace.

    The same test as ``ip netns pids NAME`` (compare /proc/PID/ns/net with the
    namespace file), done for several namespaces with one scan of /proc.
    """
    want: Dict[Tuple[int, int], str] = {}
    out: Dict[str, List[int]] = {}
    for name in names:
        out[name] = []
        try:
            st = os.stat(os.path.join(NETNS_DIR, name))
        except OSError:
            continue
        want[(st.st_dev, st.st_ino)] = name
    if not want:
        return out
    for pid in _all_pids():
        try:
            st = os.stat(f"/proc/{pid}/ns/net")
        except OSError:
            continue
        name = want.get((st.st_dev, st.st_ino))
        if name is not None:
            out[name].append(pid)
    return out


def kill_until_gone(list_pids: Callable[[], List[int]], what: str,
                    timeout: float = 5.0) -> List[int]:
    """SIGKILL the processes ``list_pids()`` returns until it returns none.

    Leaves first: a process is killed only once it has no child left (not even
    an unreaped zombie), so every parent reaps its children before it dies.
    Killing a whole tree at once would hand zombies to init, which some inits
    reap only much later.  After 0.2 s without progress the rest is killed at
    once.
    """
    killed: List[int] = []
    deadline = time.monotonic() + timeout
    stalled_since: Optional[float] = None
    while True:
        pids = list_pids()
        if not pids:
            return killed
        now = time.monotonic()
        if now > deadline:
            raise NetBedError(f"processes survive SIGKILL in {what}: {pids}")
        kids = children_map()
        ready = [p for p in pids if not kids.get(p)]  # no child at all, not even an exiting one
        if ready:
            stalled_since = None
            killed.extend(kill_pids(ready))
        elif stalled_since is None:
            stalled_since = now
        elif now - stalled_since > 0.2:
            killed.extend(kill_pids(pids))
        time.sleep(0.002)


def kill_netns_processes(names: Sequence[str], keep: Optional[Callable[[int], bool]] = None,
                         timeout: float = 5.0) -> List[int]:
    """SIGKILL every process in the named namespaces until none is left.

    Processes for which ``keep(pid)`` is true are spared (checked on every round,
    so processes forked meanwhile are judged too).
    """
    def targets() -> List[int]:
        return [p for lst in netns_pids(names).values() for p in lst
                if keep is None or not keep(p)]
    return kill_until_gone(targets, ", ".join(names), timeout)


# ------------------------------------------------------------------- state files


def state_dir() -> str:
    """Directory of the beds' state files (created on demand)."""
    for d in ("/run/mslaunch-testbeds",
              os.path.join(tempfile.gettempdir(), f"mslaunch-testbeds-{os.getuid()}")):
        try:
            os.makedirs(d, mode=0o755, exist_ok=True)
            if os.access(d, os.W_OK):
                return d
        except OSError:
            continue
    raise NetBedError("no writable directory for test bed state files")


def _record_path(prefix: str) -> str:
    return os.path.join(state_dir(), prefix + ".json")


def _write_json(path: str, data: dict, exclusive: bool) -> None:
    """Write ``data`` to ``path`` atomically; with ``exclusive``, fail if it exists."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f)
        if exclusive:
            os.link(tmp, path)  # FileExistsError if taken: the atomic claim
        else:
            os.replace(tmp, path)
            tmp = ""
    finally:
        if tmp:
            os.unlink(tmp)


def read_record(path: str) -> Optional[dict]:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def belongs_to(netns_name: str, prefix: str) -> bool:
    """Whether a namespace name belongs to the bed ``prefix`` (``mt20h1`` yes, ``mt201sw`` no)."""
    rest = netns_name[len(prefix):]
    return netns_name.startswith(prefix) and bool(rest) and not rest[0].isdigit()


def record_is_stale(rec: dict) -> bool:
    """A bed is stale when the process that created it is gone (or its pid was reused)."""
    return not process_alive(int(rec.get("pid", 0)), rec.get("pid_start"))


def destroy_resources(prefix: str, uplink: Optional[str] = None,
                      pids: Iterable[Sequence[int]] = ()) -> None:
    """Remove everything of bed ``prefix``: processes in its namespaces, the
    recorded ``(pid, start_time)`` processes, the uplink link and the namespaces."""
    names = [n for n in list_netns() if belongs_to(n, prefix)]
    kill_pids(p for p, st in pids if process_alive(p, st))
    if names:
        kill_netns_processes(names)
    lines = []
    if uplink and os.path.exists(f"/sys/class/net/{uplink}"):
        lines.append(f"link del {uplink}")
    lines.extend(f"netns del {n}" for n in names)
    if lines:
        _wait_batch(_ip_batch(lines, force=True), check=False)


def preclean_stale(prefix_base: str) -> List[str]:
    """Remove the beds of ``prefix_base`` whose creator process is dead; return their prefixes."""
    cleaned = []
    d = state_dir()
    pat = re.compile(re.escape(prefix_base) + r"\d+\.json$")
    for entry in sorted(os.listdir(d)):
        if not pat.match(entry):
            continue
        path = os.path.join(d, entry)
        rec = read_record(path)
        if rec is None:
            # being written right now, or garbage: only old garbage is removed
            try:
                if time.time() - os.stat(path).st_mtime < 60:
                    continue
            except OSError:
                continue
            rec = {"prefix": entry[:-5]}
        elif not record_is_stale(rec):
            continue
        destroy_resources(rec["prefix"], rec.get("uplink"), rec.get("pids", []))
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        cleaned.append(rec["prefix"])
    return cleaned


def tagged_pids(tag: str, netns: Iterable[Sequence[int]] = ()) -> List[int]:
    """Live processes of the bed tagged ``tag``: those carrying ``TAG_VAR=tag`` in
    their environment or their command line (a daemon that sets its process title,
    as sshd does, writes it over its environment) and their descendants, and
    everything in a namespace of ``netns`` (``[dev, inode]`` pairs) that holds a
    tagged process (the tag check guards against an inode reused by a newer
    namespace)."""
    if not tag:
        return []
    needle = f"{TAG_VAR}={tag}".encode()
    ids = {tuple(x) for x in netns}
    tagged: set = set()
    tagged_ns: set = set()
    by_ns: Dict[Tuple[int, int], List[int]] = {}
    for pid in _all_pids():
        try:
            st = os.stat(f"/proc/{pid}/ns/net")
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read()
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                env += b"\0" + f.read()
        except OSError:
            continue
        ns = (st.st_dev, st.st_ino)
        if ns in ids:
            by_ns.setdefault(ns, []).append(pid)
        if needle in env:
            tagged.add(pid)
            tagged_ns.add(ns)
    for ns in ids & tagged_ns:
        tagged.update(by_ns[ns])
    kids = children_map()
    todo = list(tagged)
    while todo:
        for kid in kids.get(todo.pop(), []):
            if kid not in tagged:
                tagged.add(kid)
                todo.append(kid)
    return [p for p in tagged if p != os.getpid() and process_alive(p)]


def sweep_stale(prefix_base: str) -> List[str]:
    """Remove what the beds of ``prefix_base`` left whose creator is dead (see the
    module docstring), then their namespaces and links (:func:`preclean_stale`);
    return the owner records removed."""
    d = state_dir()
    removed = []
    for entry in sorted(os.listdir(d)):
        if not (entry.startswith(prefix_base + "-") and entry.endswith(".owner.json")):
            continue
        path = os.path.join(d, entry)
        rec = read_record(path)
        if rec is None:  # being written right now, or garbage: only old garbage goes
            try:
                if time.time() - os.stat(path).st_mtime < 60:
                    continue
            except OSError:
                continue
        elif not record_is_stale(rec):
            continue
        else:
            kill_until_gone(lambda: tagged_pids(rec.get("tag", ""), rec.get("netns", [])),
                            f"stale bed {entry}")
            for gone in rec.get("remove", []):
                shutil.rmtree(gone, ignore_errors=True)
        remove_record(path)
        removed.append(entry)
    preclean_stale(prefix_base)
    return removed


def _used_networks() -> List[ipaddress.IPv4Network]:
    """IPv4 networks that have a route (any table) in the root namespace, default excluded."""
    r = ip_cmd(["-4", "-o", "route", "show", "table", "all"], check=False)
    nets = []
    for line in r.stdout.splitlines():
        toks = line.split()
        if not toks:
            continue
        dest = toks[1] if toks[0] in _ROUTE_TYPES and len(toks) > 1 else toks[0]
        if dest == "default":
            continue
        try:
            net = ipaddress.ip_network(dest, strict=False)
        except ValueError:
            continue
        if isinstance(net, ipaddress.IPv4Network) and net.prefixlen > 0:
            nets.append(net)
    return nets


def _links() -> List[str]:
    r = ip_cmd(["-o", "link", "show"], check=False)
    return [line.split(":")[1].strip().split("@")[0]
            for line in r.stdout.splitlines() if line.count(":") >= 2]


def claim_k(prefix_base: str = "mt", k_range: Iterable[int] = DEFAULT_K_RANGE,
            network: bool = True, info: Optional[dict] = None) -> Tuple[int, str]:
    """Pick and claim a free K; return ``(K, state file path)``.

    Stale beds of ``prefix_base`` are removed first.  With ``network``, a K is
    free only if ``{prefix}up`` does not exist, no namespace of the prefix
    exists and no route covers ``198.18.K.0/24``.  The claim itself is the
    exclusive creation of the state file, so concurrent runs never share a K.
    """
    preclean_stale(prefix_base)
    ks = list(k_range)
    if not ks:
        raise NetBedError("empty K range")
    start = os.getpid() % len(ks)
    ks = ks[start:] + ks[:start]
    routes = _used_networks() if network else []
    links = set(_links()) if network else set()
    spaces = list_netns() if network else []
    me = os.getpid()
    for k in ks:
        prefix = f"{prefix_base}{k}"
        if network:
            subnet = ipaddress.ip_network(f"{SUBNET_BASE}.{k}.0/24")
            if (prefix + "up" in links or any(belongs_to(n, prefix) for n in spaces)
                    or any(subnet.overlaps(r) for r in routes)):
                continue
        rec = dict(info or {}, pid=me, pid_start=process_start_time(me), prefix=prefix,
                   uplink=prefix + "up" if network else None, pids=[], created=time.time())
        path = _record_path(prefix)
        try:
            _write_json(path, rec, exclusive=True)
        except FileExistsError:
            continue
        return k, path
    raise NetBedError(f"no free K for prefix {prefix_base!r} in {ks[0]}..{ks[-1]}")


# ------------------------------------------------------------------------- the bed


@dataclass
class NetHost:
    """One host of a :class:`NetBed`."""

    name: str
    addr: str
    netns: str
    uts_fd: Optional[int] = field(default=None, repr=False)
    mnt_fd: Optional[int] = field(default=None, repr=False)


def _default_octet(name: str) -> int:
    m = re.fullmatch(r"h(\d+)", name)
    if not m or not 1 <= int(m.group(1)) <= 240:
        raise NetBedError(f"give an address octet for host {name!r}")
    return 10 + int(m.group(1))


class NetBed:
    """A switch, an uplink and named host namespaces; see the module docstring.

    Typical use::

        bed = NetBed(workdir)
        try:
            bed.create(["h1", "h2"])            # or [("ctl", 2), "h1", ...]
            proc = bed.spawn(bed.hosts[0], ["/usr/sbin/sshd", "-D", ...], log)
            ...
        finally:
            bed.teardown()
    """

    def __init__(self, workdir: str, prefix_base: str = "mt",
                 k_range: Iterable[int] = DEFAULT_K_RANGE,
                 runner_aliases: Sequence[str] = ("runner",)) -> None:
        self.workdir = os.path.abspath(workdir)
        self.prefix_base = prefix_base
        self.k_range = k_range
        self.runner_aliases = list(runner_aliases)
        #: More names of a host, by its name, in the hosts file (a pod's DNS name, say).
        self.aliases: Dict[str, List[str]] = {}
        self.k: Optional[int] = None
        self.prefix = ""
        self.hosts: List[NetHost] = []
        self.hosts_file = os.path.join(self.workdir, "hosts")
        self._record: Optional[str] = None
        self._procs: List[subprocess.Popen] = []
        self._created: List[str] = []

    # -- addresses and names
    @property
    def subnet(self) -> str:
        return f"{SUBNET_BASE}.{self.k}.0/24"

    @property
    def gateway(self) -> str:
        """The root namespace's address on the bed (the runner, as seen from the hosts)."""
        return f"{SUBNET_BASE}.{self.k}.1"

    @property
    def switch_ns(self) -> str:
        return self.prefix + "sw"

    @property
    def uplink(self) -> str:
        return self.prefix + "up"

    @property
    def namespaces(self) -> List[str]:
        """Every namespace this bed created."""
        return list(self._created)

    def namespace_ids(self) -> List[List[int]]:
        """``[dev, inode]`` of each host's network namespace (for an owner record)."""
        ids = []
        for h in self.hosts:
            st = os.stat(os.path.join(NETNS_DIR, h.netns))
            ids.append([st.st_dev, st.st_ino])
        return ids

    def host(self, name: str) -> NetHost:
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError(name)

    # -- building
    def create(self, hosts: Sequence[Union[str, Tuple[str, int]]]) -> List[NetHost]:
        """Claim a K (unless claimed already), build the switch and uplink, add ``hosts``.

        A host is a name ``hI`` (address ``198.18.K.(10+I)``) or ``(name, octet)``.
        On failure, everything built so far is removed before the error propagates.
        """
        try:
            if self.k is None:
                os.makedirs(self.workdir, exist_ok=True)
                self.k, self._record = claim_k(self.prefix_base, self.k_range,
                                               info={"dir": self.workdir})
                self.prefix = f"{self.prefix_base}{self.k}"
                self._build_switch()
            return self.add_hosts(hosts)
        except BaseException:
            self.teardown()
            raise

    def _build_switch(self) -> None:
        self._created.append(self.switch_ns)
        _wait_batch(_ip_batch([
            f"netns add {self.switch_ns}",
            f"link add {self.uplink} type veth peer name up0 netns {self.switch_ns}",
            f"addr add {self.gateway}/24 dev {self.uplink}",
            f"link set {self.uplink} up",
        ]))
        _wait_batch(_ip_batch([
            "link set lo up",
            "link add br0 type bridge",
            "link set br0 up",
            "link set up0 master br0 up",
        ], netns=self.switch_ns))

    def add_hosts(self, hosts: Sequence[Union[str, Tuple[str, int]]]) -> List[NetHost]:
        """Add host namespaces to a created bed; returns the new hosts."""
        if self.k is None:
            raise NetBedError("create() the bed first")
        new: List[NetHost] = []
        for spec in hosts:
            name, octet = (spec, _default_octet(spec)) if isinstance(spec, str) else spec
            if name == "sw" or not re.fullmatch(r"[a-z][a-z0-9]{0,9}", name):
                raise NetBedError(f"bad host name {name!r}")
            if any(h.name == name for h in self.hosts + new):
                raise NetBedError(f"host {name!r} exists")
            new.append(NetHost(name, f"{SUBNET_BASE}.{self.k}.{octet}", self.prefix + name))
        self.hosts.extend(new)
        self.write_hosts_file()
        self._created.extend(h.netns for h in new)
        _wait_batch(_ip_batch([f"netns add {h.netns}" for h in new]))
        sw = [f"link add p{h.name} type veth peer name eth0 netns {h.netns}" for h in new]
        sw += [f"link set p{h.name} master br0 up" for h in new]
        _wait_batch(_ip_batch(sw, netns=self.switch_ns))
        batches = [_ip_batch([f"addr add {h.addr}/24 dev eth0", "link set eth0 up",
                              "link set lo up"], netns=h.netns) for h in new]
        for p in batches:
            _wait_batch(p)
        self._make_host_namespaces(new)
        return new

    def write_hosts_file(self) -> None:
        """(Re)write the hosts file in place; every host sees it as /etc/hosts."""
        runner = socket.gethostname()
        names = [runner] + ([runner.split(".")[0]] if "." in runner else []) + self.runner_aliases
        lines = ["127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback",
                 f"{self.gateway} {' '.join(dict.fromkeys(names))}"]
        lines += [" ".join([h.addr, h.name, *self.aliases.get(h.name, ())]) for h in self.hosts]
        with open(self.hosts_file, "w") as f:  # same inode: the bind mounts follow
            f.write("\n".join(lines) + "\n")

    def _make_host_namespaces(self, hosts: Sequence[NetHost]) -> None:
        script = ('hostname "$1" && mount --bind "$2" /etc/hosts && '
                  '{ umount -l /run/netns 2>/dev/null; true; } && '
                  'echo ready && exec cat >/dev/null')
        procs = []
        for h in hosts:
            argv = [_tool("nsenter"), f"--net={NETNS_DIR}/{h.netns}", "--",
                    _tool("unshare"), "--uts", "--mount", "--propagation", "private", "--",
                    "/bin/sh", "-c", script, "sh", h.name, self.hosts_file]
            procs.append(subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True,
                                          start_new_session=True))
        errors = []
        for h, p in zip(hosts, procs):
            try:
                line = p.stdout.readline() if p.stdout else ""
                if line.strip() == "ready":
                    h.uts_fd = os.open(f"/proc/{p.pid}/ns/uts", os.O_RDONLY | os.O_CLOEXEC)
                    h.mnt_fd = os.open(f"/proc/{p.pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
            finally:
                err = ""
                try:
                    _, err = p.communicate("", timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
            if h.mnt_fd is None:
                errors.append(f"{h.name}: {err.strip() or 'namespace setup failed'}")
        if errors:
            raise NetBedError("cannot set up host namespaces: " + "; ".join(errors))

    # -- running things in a host
    def nsenter_argv(self, host: NetHost,
                     cwd: Optional[str] = None) -> Tuple[List[str], Tuple[int, int]]:
        """``(argv prefix, fds to pass)`` that enter ``host``'s net, UTS and mount namespaces."""
        if host.uts_fd is None or host.mnt_fd is None:
            raise NetBedError(f"host {host.name} has no namespaces (bed torn down?)")
        argv = [_tool("nsenter"), f"--net={NETNS_DIR}/{host.netns}",
                f"--uts=/proc/self/fd/{host.uts_fd}", f"--mount=/proc/self/fd/{host.mnt_fd}"]
        if cwd:
            argv.append(f"--wd={cwd}")
        return argv + ["--"], (host.uts_fd, host.mnt_fd)

    def spawn(self, host: NetHost, argv: Sequence[str], log: Optional[str] = None,
              env: Optional[Dict[str, str]] = None, cwd: Optional[str] = None,
              **popen_kw) -> subprocess.Popen:
        """Start a daemon in ``host`` (own session, stdin /dev/null, output appended to ``log``).

        The returned process is the daemon itself (nsenter execs it).  The bed
        kills it at teardown like anything else in the host.
        """
        pre, fds = self.nsenter_argv(host, cwd)
        out = open(log, "ab") if log else subprocess.DEVNULL
        try:
            kw = dict(stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                      start_new_session=True, env=env)
            kw.update(popen_kw)
            p = subprocess.Popen(pre + list(argv), pass_fds=fds, **kw)
        finally:
            if log:
                out.close()  # type: ignore[union-attr]
        self._procs.append(p)
        return p

    def run(self, host: NetHost, argv: Sequence[str], timeout: Optional[float] = 60,
            check: bool = False, cwd: Optional[str] = None,
            **run_kw) -> subprocess.CompletedProcess:
        """Run a command in ``host``'s namespaces; output captured as text unless overridden."""
        pre, fds = self.nsenter_argv(host, cwd)
        kw = dict(capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if "input" in run_kw:
            kw.pop("stdin")
        kw.update(run_kw)
        return subprocess.run(pre + list(argv), pass_fds=fds, timeout=timeout, check=check, **kw)

    # -- faults
    def link_down(self, host: NetHost) -> None:
        """Cut ``host`` off the network (its eth0 goes down; addresses stay)."""
        ip_cmd(["link", "set", "eth0", "down"], netns=host.netns)

    def link_up(self, host: NetHost) -> None:
        ip_cmd(["link", "set", "eth0", "up"], netns=host.netns)

    def refuse_own(self, host: NetHost, port: int, refused: bool) -> None:
        """While ``refused``, TCP connections that ``host`` opens to a ``port`` of
        its own fail at once (EACCES); connections from other hosts still come.
        (The rule must come before the lookup of the local routes, rule 0: that
        one moves after it, and back.)"""
        rule = ["pref", "10", "iif", "lo", "ipproto", "tcp", "dport", str(port), "prohibit"]
        if refused:
            try:
                ip_cmd(["rule", "add", *rule], netns=host.netns)
                ip_cmd(["rule", "add", "pref", "100", "lookup", "local"], netns=host.netns)
                ip_cmd(["rule", "del", "pref", "0"], netns=host.netns)
            except BaseException:
                self.refuse_own(host, port, False)
                raise
            return
        # (each step whatever became of the others: the rules end as they began)
        ip_cmd(["rule", "add", "pref", "0", "lookup", "local"], netns=host.netns, check=False)
        ip_cmd(["rule", "del", "pref", "100"], netns=host.netns, check=False)
        ip_cmd(["rule", "del", *rule], netns=host.netns, check=False)
        shown = ip_cmd(["rule", "show"], netns=host.netns).stdout
        if "0:\tfrom all lookup local" not in shown or "prohibit" in shown or \
                "100:" in shown:
            raise NetBedError(f"{host.netns}: its routing rules not restored: {shown}")

    def pids(self, host: NetHost) -> List[int]:
        """Live processes in ``host``'s network namespace (as ``ip netns pids``)."""
        return netns_pids([host.netns])[host.netns]

    def kill_host(self, host: NetHost,
                  keep: Optional[Callable[[int], bool]] = None) -> List[int]:
        """SIGKILL every process in ``host`` but those ``keep`` accepts; return the pids killed."""
        killed = kill_netns_processes([host.netns], keep)
        self._reap()
        return killed

    # -- teardown
    def _reap(self) -> None:
        for p in list(self._procs):
            if p.poll() is not None:
                self._procs.remove(p)

    def teardown(self) -> None:
        """Kill every process in the bed's namespaces, delete them and the uplink.

        Safe to call more than once and after a partial build.
        """
        if self.k is None:
            return
        try:
            names = [n for n in list_netns() if belongs_to(n, self.prefix)]
            kill_netns_processes(names)
            for p in self._procs:
                try:
                    p.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
            self._procs = []
            for h in self.hosts:
                for fd in (h.uts_fd, h.mnt_fd):
                    if fd is not None:
                        os.close(fd)
                h.uts_fd = h.mnt_fd = None
            destroy_resources(self.prefix, self.uplink)
        finally:
            remove_record(self._record)
            self._record = None


def remove_record(path: Optional[str]) -> None:
    """Delete a bed's state file (see :func:`claim_k`), if it has one."""
    if path:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


# --------------------------------------------------------------------------- beds

_LIVE: List[Bed] = []
_LIVE_LOCK = threading.Lock()


def stop_live(beds: Iterable[Bed]) -> None:
    """Stop those of ``beds`` still up, the last started first (it may use an earlier
    one's hosts).  (A test of this must name its own beds: the process's others are
    the session's shared beds.)"""
    chosen = set(map(id, beds))
    for bed in reversed([b for b in list(_LIVE) if id(b) in chosen]):
        try:
            bed.stop()
        except Exception as e:  # pragma: no cover - last resort at exit
            print(f"{type(bed).__name__}: cleanup of {bed.dir} failed: {e}", file=sys.stderr)


@atexit.register
def _stop_all_live() -> None:
    stop_live(list(_LIVE))


class Bed:
    """What every test bed shares: :meth:`start` removes the beds of dead runs
    (:func:`sweep_stale`) and builds this one once (cleaning up and raising on
    failure), :meth:`stop` removes it (idempotent, and at the interpreter's exit
    for a bed still up): its own teardown, then every process carrying its tag
    and their descendants, then its owner record.  ``with`` does both, and each
    records how long it took.  A bed says what it needs in :meth:`_check`
    (raising before anything is made), builds in :meth:`_build`, giving its
    daemons :meth:`tag_env` and writing :meth:`record_owner` once its namespaces
    exist, and removes in :meth:`_teardown`."""

    dir: str
    prefix_base = ""

    def __init__(self) -> None:
        self.setup_seconds = 0.0
        self.teardown_seconds = 0.0
        self._started = False
        self.tag = f"{os.getpid()}-{uuid.uuid4().hex}"
        self._owner: Optional[str] = None

    def tag_env(self, base: Optional[Dict[str, str]] = None) -> Dict[str, str]:
        """``base`` (default: os.environ) with the bed's tag."""
        return dict(os.environ if base is None else base, **{TAG_VAR: self.tag})

    def record_owner(self, netns: Iterable[Sequence[int]] = (),
                     remove: Iterable[str] = ()) -> None:
        """Write the owner record, by which a later run removes what a crash of
        this one left: the namespaces ``netns`` hold, the paths ``remove``."""
        me = os.getpid()
        path = os.path.join(state_dir(), f"{self.prefix_base}-{self.tag}.owner.json")
        _write_json(path, {"pid": me, "pid_start": process_start_time(me), "tag": self.tag,
                           "netns": [list(x) for x in netns], "remove": list(remove)},
                    exclusive=False)
        self._owner = path

    def kill_tagged(self) -> None:
        """SIGKILL every process carrying the bed's tag, and their descendants."""
        kill_until_gone(lambda: tagged_pids(self.tag), f"the processes of {self.dir}")

    def __enter__(self):
        if not self._started:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self._started

    def start(self, *args, **kw):
        self._check(*args, **kw)
        t0 = time.monotonic()
        self._started = True
        with _LIVE_LOCK:
            _LIVE.append(self)
        try:
            if self.prefix_base:
                sweep_stale(self.prefix_base)
            self._build(*args, **kw)
        except BaseException:
            self.stop()
            raise
        self.setup_seconds = time.monotonic() - t0
        return self

    def stop(self) -> None:
        if not self._started:
            return
        t0 = time.monotonic()
        try:
            try:
                self._teardown()
            finally:
                if self.prefix_base:
                    self.kill_tagged()
                remove_record(self._owner)
                self._owner = None
        finally:
            self._started = False
            with _LIVE_LOCK:
                if self in _LIVE:
                    _LIVE.remove(self)
            self.teardown_seconds = time.monotonic() - t0

    def _check(self, *args, **kw) -> None:
        raise NotImplementedError

    def _build(self, *args, **kw) -> None:
        raise NotImplementedError

    def _teardown(self) -> None:
        raise NotImplementedError


class BedPool:
    """A test session's beds: :meth:`get` shares one per configuration (built on
    first use; a failure to build is remembered and raised again), :meth:`new`
    gives the caller one of its own; :meth:`close` stops them all.  ``build``
    makes and starts a bed, raising the test's outcome when it cannot."""

    def __init__(self, build: Callable[..., Bed]) -> None:
        self.build = build
        self._shared: Dict[object, Bed] = {}
        self._errors: Dict[object, BaseException] = {}
        self._private: List[Bed] = []

    @property
    def beds(self) -> List[Bed]:
        return [b for b in list(self._shared.values()) + self._private if b.running]

    def shared_beds(self) -> List[Bed]:
        """The beds :meth:`get` shares, stopped ones too (none should be before
        :meth:`close`)."""
        return list(self._shared.values())

    def get(self, key: object, *args, **kw) -> Bed:
        if key in self._errors:
            # a copy without the first failure's frames (they would pile up)
            error = copy.copy(self._errors[key])
            raise error.with_traceback(None)
        bed = self._shared.get(key)
        if bed is None:
            try:
                bed = self.build(*args, **kw)
            except (KeyboardInterrupt, SystemExit):
                raise
            except BaseException as e:   # pytest's fail and skip outcomes too
                self._errors[key] = e
                raise
            self._shared[key] = bed
        return bed

    def new(self, *args, **kw) -> Bed:
        bed = self.build(*args, **kw)
        self._private.append(bed)
        return bed

    def close(self) -> None:
        for bed in list(self._shared.values()) + self._private:
            bed.stop()
        self._shared.clear()
        self._private.clear()


def _pool_beds(pools: Iterable[BedPool]) -> List[Bed]:
    return [b for pool in pools for b in pool.beds]


def log_offsets(pools: Iterable[BedPool]) -> Dict[str, int]:
    """The sizes of every running bed's log files now (see :func:`log_tails`)."""
    sizes = {}
    for b in _pool_beds(pools):
        for path in b.log_files():  # type: ignore[attr-defined]
            try:
                sizes[path] = os.path.getsize(path)
            except OSError:
                sizes[path] = 0
    return sizes


def restore_dirty(pools: Iterable[BedPool]) -> None:
    """Undo the faults a test left on the beds it shares with others."""
    for b in _pool_beds(pools):
        if b.dirty:  # type: ignore[attr-defined]
            b.restore()  # type: ignore[attr-defined]


def log_tails(pools: Iterable[BedPool], offsets: Dict[str, int]) -> str:
    """What the beds' daemons logged since ``offsets`` (4000 bytes a file at most)."""
    parts = []
    for b in _pool_beds(pools):
        for path in b.log_files():  # type: ignore[attr-defined]
            try:
                with open(path, "rb") as f:
                    f.seek(offsets.get(path, 0))
                    new = f.read()[-4000:].decode(errors="replace")
            except OSError:
                continue
            if new.strip():
                parts.append(f"--- {path}\n{new}")
    return "\n".join(parts)
