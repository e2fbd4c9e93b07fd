"""A real Slurm cluster on this one machine, for tests of ``srun``-based launching.

The bed is built on :mod:`netbed` with prefix ``sl`` and K in 240..254 (the SSH bed
uses 20..219):

* ``ctl`` (``198.18.K.2``): ``slurmctld -D`` and a private ``munged``;
* ``h1`` .. ``hN`` (``198.18.K.(10+i)``): one ``slurmd -D -N hI`` each, with
  hostname ``hI`` and the bed's hosts file as ``/etc/hosts`` (``ctl``, the
  nodes, and the runner's hostname and ``runner`` as ``198.18.K.1``);
* the clients (``salloc``, ``srun``, ``sbatch``, ``scancel``, ``scontrol``
  ...) run in the root namespace with :meth:`SlurmBed.env` (``SLURM_CONF``).
  They reach the nodes through the uplink ``198.18.K.1`` (:attr:`gateway`).

Steps and batch scripts run inside their node's namespaces (slurmd forks
slurmstepd, which forks the tasks) as root, with srun's environment and the
shared filesystem, so ``srun <the test's own python> -c 'import mslaunch'``
works.  A server in the test process must listen on :attr:`gateway` (or the
wildcard) to be reachable from tasks; on the nodes the runner's hostname
resolves to that address, in the root namespace ``h1`` does not resolve.

Nothing under /etc, /run/munge or /var is used: configuration, state, spool
and logs live in the bed's directory, munged's key and socket in
``/run/mslaunch-testbeds/slK.munge`` (munged wants o+x on every directory of
the socket path); the bed's owner record (see :mod:`netbed`) names the
creating process, the bed's namespace inodes, its tag and that directory.
Teardown SIGKILLs everything in the bed's namespaces (munged included), the
clients started with :meth:`SlurmBed.popen` and any process whose environment
carries the bed's tag, with its descendants (:meth:`SlurmBed.env` adds it, so
an ``srun`` started by a launcher under test is found too), then deletes the
namespaces.  A bed left by a crashed run is removed the same way by the next
run.  Always give clients :meth:`SlurmBed.env`: without ``SLURM_CONF`` they
look the controller up in DNS (SRV records of the search domain).  Killed
daemons can stay zombies of init for a few seconds (slurmstepd is double-forked).

Pytest use (``pytest_plugins = ["slurmbed"]``)::

    def test_two_nodes(slurmbed):                 # session bed: 2 nodes, 2 CPUs each
        r = slurmbed.run(["srun", "-N", "2", "hostname"])

    def test_failures(slurmbeds):                 # own bed, SlurmdTimeout=5
        bed = slurmbeds.new(3, extra_conf=["SlurmdTimeout=5"])

Faults (:meth:`SlurmBed.crash`, :meth:`SlurmBed.linkdown`) mark a bed dirty;
after such a test the plugin calls :meth:`SlurmBed.restore`.  A bed that
cannot be built skips the test, or fails it with ``MSLAUNCH_TEST_REQUIRE_ALL=1``.
Needs root, slurm-wlm and munge (Debian 12: Slurm 22.05.8), iproute2, util-linux.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Set, Union

import pytest

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
import netbed  # noqa: E402
from netbed import NetBed, NetBedError, NetHost  # noqa: E402

PREFIX_BASE = "sl"
K_RANGE = range(240, 255)
MUNGED, SLURMCTLD, SLURMD = "/usr/sbin/munged", "/usr/sbin/slurmctld", "/usr/sbin/slurmd"
CLIENTS = ("salloc", "srun", "sbatch", "sinfo", "squeue", "scontrol", "scancel")
REQUIRED_TOOLS = (MUNGED, SLURMCTLD, SLURMD) + CLIENTS + ("ip", "nsenter", "unshare")
SLURMD_PORT = 6818
TAG_VAR = netbed.TAG_VAR  # in the daemons' and clients' environment
# Slurm clients read these as option defaults; a test's environment must not leak them in
_CLIENT_ENV_PREFIXES = ("SLURM_", "SALLOC_", "SBATCH_", "SRUN_", "SQUEUE_", "SINFO_",
                        "SCANCEL_", "SCONTROL_")

HostRef = Union[int, str]


class SlurmBedError(NetBedError):
    """The Slurm bed could not be built or a helper could not do its job."""


def require_all() -> bool:
    return os.environ.get("MSLAUNCH_TEST_REQUIRE_ALL") == "1"


def _tail(path: str, n: int = 25) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return ""


class SlurmBed(netbed.Bed):
    """slurmctld + N slurmd nodes ``h1``..``hN``; see the module docstring.

    ``SlurmBed(directory, nodes=2).start()`` builds it (or ``with SlurmBed(...) as bed:``),
    :meth:`stop` removes it.  ``directory`` (default: a new temporary directory,
    removed by :meth:`stop`) keeps slurm.conf, state, spool and logs.
    ``extra_conf`` lines are appended to slurm.conf (e.g. ``SlurmdTimeout=5``).
    """

    prefix_base = PREFIX_BASE

    def __init__(self, directory: Optional[str] = None, nodes: int = 2, cpus: int = 2,
                 extra_conf: Iterable[str] = (), proctrack: str = "proctrack/linuxproc",
                 task_plugin: str = "task/none", debug: str = "info",
                 ready_timeout: float = 30.0) -> None:
        if not 1 <= nodes <= 200:
            raise SlurmBedError(f"nodes must be in 1..200, not {nodes}")
        super().__init__()
        self._own_dir = directory is None
        self.dir = os.path.abspath(str(directory) if directory else
                                   tempfile.mkdtemp(prefix="slurmbed-"))
        self.nodes = [f"h{i}" for i in range(1, nodes + 1)]
        self.cpus = cpus
        self.extra_conf = list(extra_conf)
        self.proctrack = proctrack
        self.task_plugin = task_plugin
        self.debug = debug
        self.ready_timeout = ready_timeout
        self.conf = os.path.join(self.dir, "slurm.conf")
        self.runner = socket.gethostname().split(".")[0]
        self.net: Optional[NetBed] = None
        self.munge_dir = ""
        self.daemons: Dict[str, subprocess.Popen] = {}  # "munged", "slurmctld", "h1", ...
        self.dirty = False
        self._clients: List[subprocess.Popen] = []
        self._links_down: Set[str] = set()
        self._crashed: Set[str] = set()

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> SlurmBed:
        """Build the bed and wait until every node is idle; clean up and raise on failure."""
        return super().start()

    def _check(self) -> None:
        if self._started or self.net is not None:
            raise SlurmBedError("a bed is started once; make a new SlurmBed")
        missing = netbed.missing_tools(REQUIRED_TOOLS)
        if missing:
            raise SlurmBedError("the Slurm bed needs " + ", ".join(missing)
                                + " (apt-get install slurm-wlm munge iproute2 util-linux)")
        if self.runner in self.nodes + ["ctl"]:
            raise SlurmBedError(f"this machine's hostname {self.runner!r} is a bed node name")

    def _build(self) -> None:
        for sub in ("ctld", "spool"):
            os.makedirs(os.path.join(self.dir, sub), exist_ok=True)
        self.net = NetBed(self.dir, PREFIX_BASE, K_RANGE)
        self.net.create([("ctl", 2)] + self.nodes)
        self._start_munged()
        self._write_conf()
        self.daemons["slurmctld"] = self.net.spawn(
            self._host("ctl"), [SLURMCTLD, "-D", "-i", "-f", self.conf],
            log=os.path.join(self.dir, "slurmctld.out"), env=self._daemon_env())
        # slurmd retries a failed registration only after a pause: start nodes once ctld answers
        self._wait("slurmctld to answer", lambda: "UP" in self.run(
            ["scontrol", "ping"], timeout=10).stdout, self.ready_timeout)
        for name in self.nodes:
            self._spawn_slurmd(name)
        self.wait_idle(timeout=self.ready_timeout)

    def _teardown(self) -> None:
        """Kill clients and daemons, delete namespaces and munge files."""
        for p in self._clients:
            self._kill_tree(p)
        self._clients = []
        if self.net is not None:
            self.net.teardown()  # SIGKILLs every process in the namespaces, munged included
        # clients started by others with env(), e.g. srun under a launcher under test
        self.kill_tagged()
        if self.munge_dir:
            shutil.rmtree(self.munge_dir, ignore_errors=True)
        if self.proctrack == "proctrack/cgroup":
            for name in self.nodes:  # fails (harmlessly) while another bed uses the same name
                top = f"/sys/fs/cgroup/freezer/slurm_{name}"
                for root, _, _ in sorted(os.walk(top), key=lambda w: -len(w[0])):
                    try:
                        os.rmdir(root)
                    except OSError:
                        pass
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    # ----------------------------------------------------------------- building
    def _start_munged(self) -> None:
        assert self.net is not None
        d = os.path.join(netbed.state_dir(), self.net.prefix + ".munge")
        self.record_owner(netns=self.net.namespace_ids(),
                          remove=[d] + ([self.dir] if self._own_dir else []))
        shutil.rmtree(d, ignore_errors=True)  # an empty leftover: the sweep ran before the claim
        os.mkdir(d)
        os.chmod(d, 0o755)  # munged: o+x and no group/other write on the socket's directories
        self.munge_dir = d
        key = os.path.join(d, "munge.key")
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
        with os.fdopen(fd, "wb") as f:
            f.write(os.urandom(1024))
        self.munge_socket = os.path.join(d, "munge.socket.2")
        # in ctl's namespaces, so that the namespace kill ends it; the socket is a path,
        # which every namespace reaches through the shared filesystem (--foreground: logs
        # go to stderr, i.e. munged.out)
        self.daemons["munged"] = self.net.spawn(self._host("ctl"), [
            MUNGED, "--foreground", "-S", self.munge_socket, f"--key-file={key}",
            f"--pid-file={d}/munged.pid", f"--seed-file={d}/munged.seed", "--num-threads=4"],
            log=os.path.join(self.dir, "munged.out"), env=self._daemon_env())

        def ready() -> bool:
            try:
                return stat.S_ISSOCK(os.stat(self.munge_socket).st_mode)
            except FileNotFoundError:
                return False
        self._wait("munged's socket", ready, 10)

    def _write_conf(self) -> None:
        assert self.net is not None
        k, g = self.net.k, self.net.gateway
        lines = [
            f"ClusterName=bed{k}", f"SlurmctldHost=ctl({self.address('ctl')})",
            "SlurmUser=root", "SlurmdUser=root",
            "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={self.munge_socket}",
            f"StateSaveLocation={self.dir}/ctld",
            f"SlurmctldPidFile={self.dir}/slurmctld.pid",
            f"SlurmctldLogFile={self.dir}/slurmctld.log",
            f"SlurmdSpoolDir={self.dir}/spool/%n",
            f"SlurmdPidFile={self.dir}/slurmd-%n.pid",
            f"SlurmdLogFile={self.dir}/slurmd-%n.log",
            f"SlurmctldDebug={self.debug}", f"SlurmdDebug={self.debug}",
            f"ProctrackType={self.proctrack}", f"TaskPlugin={self.task_plugin}",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU",
            "SchedulerType=sched/backfill", "MpiDefault=none", "SwitchType=switch/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none", "MailProg=/bin/true",
            # this machine may lack CAP_SYS_RESOURCE for the limits srun would propagate
            "PropagateResourceLimits=NONE",
            "ReturnToService=2",  # a down node that registers again is idle at once
            "SlurmdParameters=config_overrides",  # CPUs may exceed the real core count
        ]
        if not any(x.lower().startswith("killwait=") for x in self.extra_conf):
            lines.append("KillWait=5")
        if self.proctrack == "proctrack/cgroup":
            # every bed's node hI shares /sys/fs/cgroup/freezer/slurm_hI: keep job ids apart
            lines.append(f"FirstJobId={k * 100000 + 1}")
        if not any(x.lower().startswith("schedulerparameters=") for x in self.extra_conf):
            # batch jobs start within ~1 s of submission instead of ~3 s (the first job
            # after slurmctld starts still waits for its first scheduling pass, ~3 s)
            lines.append("SchedulerParameters=batch_sched_delay=0")
        lines += self.extra_conf
        c = self.cpus
        lines += [f"NodeName={n} NodeAddr={self.address(n)} CPUs={c} Sockets=1 "
                  f"CoresPerSocket={c} ThreadsPerCore=1 RealMemory=1000 State=UNKNOWN"
                  for n in self.nodes]
        # Slurm 22.05.8 finds srun's address only by looking srun's host up in the node table
        # (fixed in 22.05.9); without this never-scheduled node, SRUN_NODE_FAIL and friends go
        # to 0.0.0.0 and srun hangs forever after a node failure.
        lines.append(f"NodeName={self.runner} NodeAddr={g} CPUs=1 State=FUTURE")
        lines.append(f"PartitionName=bed Nodes={','.join(self.nodes)} Default=YES "
                     "MaxTime=INFINITE State=UP")
        with open(self.conf, "w") as f:
            f.write("\n".join(lines) + "\n")
        # read by the cgroup plugins only; slurmd loads one even with proctrack/linuxproc
        with open(os.path.join(self.dir, "cgroup.conf"), "w") as f:
            f.write("CgroupPlugin=cgroup/v1\nCgroupAutomount=no\nCgroupMountpoint=/sys/fs/cgroup\n")

    def _daemon_env(self) -> Dict[str, str]:
        return dict(self.env(), PATH=netbed._SBIN_PATH)

    def _spawn_slurmd(self, name: str) -> None:
        assert self.net is not None
        os.makedirs(os.path.join(self.dir, "spool", name), exist_ok=True)
        self.daemons[name] = self.net.spawn(
            self._host(name), [SLURMD, "-D", "-N", name, "-f", self.conf],
            log=os.path.join(self.dir, f"slurmd-{name}.out"), env=self._daemon_env())

    # ------------------------------------------------------------------ waiting
    def _check_daemons(self, names: Sequence[str]) -> None:
        for name in names:
            p = self.daemons.get(name)
            if p is not None and p.poll() is not None:
                raise SlurmBedError(f"{name} daemon exited with status {p.returncode}\n"
                                    + self.diagnostics())

    def _wait(self, what: str, ready: Callable[[], bool], timeout: float,
              daemons: Sequence[str] = ()) -> None:
        deadline = time.monotonic() + timeout
        names = list(daemons) or [n for n in ("munged", "slurmctld") if n in self.daemons]
        while not ready():
            self._check_daemons(names)
            if time.monotonic() > deadline:
                raise SlurmBedError(f"timed out after {timeout:.0f} s waiting for {what}\n"
                                    + self.diagnostics())
            time.sleep(0.02)

    def node_states(self) -> Dict[str, str]:
        """``{node: state}`` as ``sinfo -N -o '%N %t'`` shows it (``idle``, ``down*`` ...)."""
        r = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], timeout=20)
        return dict(line.split()[:2] for line in r.stdout.splitlines() if len(line.split()) >= 2)

    def wait_idle(self, nodes: Optional[Sequence[HostRef]] = None,
                  timeout: Optional[float] = None) -> None:
        """Wait until ``nodes`` (default: all) are idle; the error shows the daemons' logs."""
        names = [self.name(n) for n in nodes] if nodes is not None else list(self.nodes)

        def ready() -> bool:
            states = self.node_states()
            return all(states.get(n) == "idle" for n in names)
        self._wait("idle nodes " + ",".join(names), ready, timeout or self.ready_timeout,
                   ["munged", "slurmctld"] + names)

    def _slurmd_listening(self, name: str) -> bool:
        p = self.daemons.get(name)
        want = ":%04X" % SLURMD_PORT
        try:  # /proc/PID/net/tcp lists the sockets of PID's network namespace
            with open(f"/proc/{p.pid}/net/tcp") as f:  # type: ignore[union-attr]
                return any(line.split()[1].endswith(want) and line.split()[3] == "0A"
                           for line in list(f)[1:])
        except (OSError, IndexError, AttributeError):
            return False

    def diagnostics(self) -> str:
        """sinfo output and the tails of the daemon logs (for error messages)."""
        parts = []
        try:
            r = self.run(["sinfo", "-N", "-l"], timeout=10)
            parts.append("--- sinfo -N -l\n" + r.stdout + r.stderr)
        except (OSError, subprocess.SubprocessError) as e:
            parts.append(f"--- sinfo: {e}")
        logs = [os.path.join(self.dir, "munged.out"),
                os.path.join(self.dir, "slurmctld.log"), os.path.join(self.dir, "slurmctld.out")]
        for n in self.nodes:
            logs += [os.path.join(self.dir, f"slurmd-{n}.log"),
                     os.path.join(self.dir, f"slurmd-{n}.out")]
        for path in logs:
            text = _tail(path)
            if text.strip():
                parts.append(f"--- {path}\n{text}")
        return "\n".join(parts)

    # ------------------------------------------------------------------ lookups
    def name(self, host: HostRef) -> str:
        """A host's name: ``2`` or ``"h2"`` is ``"h2"``; ``"ctl"`` is the controller."""
        name = f"h{host}" if isinstance(host, int) else host
        if name not in self.nodes + ["ctl"]:
            raise KeyError(host)
        return name

    def _host(self, host: HostRef) -> NetHost:
        if self.net is None:
            raise SlurmBedError("the bed is not started")
        return self.net.host(self.name(host))

    def address(self, host: HostRef) -> str:
        """The host's address on the bed (``198.18.K.(10+i)``; ctl ``198.18.K.2``)."""
        return self._host(host).addr

    @property
    def gateway(self) -> str:
        """The root namespace's address on the bed (``198.18.K.1``): the runner, for the nodes."""
        if self.net is None:
            raise SlurmBedError("the bed is not started")
        return self.net.gateway

    @property
    def k(self) -> Optional[int]:
        return self.net.k if self.net is not None else None

    @property
    def hosts_file(self) -> str:
        return os.path.join(self.dir, "hosts")

    # ------------------------------------------------------------------ clients
    def env(self, base: Optional[Dict[str, str]] = None, **extra: str) -> Dict[str, str]:
        """Environment for Slurm clients in the root namespace: ``base`` (default
        os.environ) without Slurm's input variables, plus ``SLURM_CONF`` and ``extra``."""
        env = {k: v for k, v in (os.environ if base is None else base).items()
               if not k.startswith(_CLIENT_ENV_PREFIXES)}
        env["SLURM_CONF"] = self.conf  # without it clients look for the config in DNS SRV records
        env[TAG_VAR] = self.tag  # how teardown and a later run's cleanup find strays
        env.update(extra)
        return env

    def _client_kw(self, kw: dict) -> dict:
        env = kw.pop("env", None)
        kw["env"] = self.env(base=kw.pop("base_env", None), **(env or {}))
        if "input" not in kw:
            kw.setdefault("stdin", subprocess.DEVNULL)
        return kw

    def run(self, argv: Sequence[str], timeout: Optional[float] = 60,
            **kw) -> subprocess.CompletedProcess:
        """Run a client (``["srun", ...]``) to completion in the root namespace.

        Output is captured as text unless ``stdout``/``stderr`` are given;
        ``env`` adds variables to :meth:`env`, ``base_env`` replaces os.environ as its base.
        """
        kw = self._client_kw(kw)
        if "stdout" not in kw and "stderr" not in kw:
            kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        return subprocess.run(list(argv), timeout=timeout, **kw)

    def popen(self, argv: Sequence[str], **kw) -> subprocess.Popen:
        """Start a client in a session of its own; :meth:`stop` kills it (and its children)."""
        kw = self._client_kw(kw)
        kw.setdefault("start_new_session", True)
        p = subprocess.Popen(list(argv), **kw)
        self._clients = [c for c in self._clients if c.poll() is None] + [p]
        return p

    @staticmethod
    def _kill_tree(p: subprocess.Popen) -> None:
        if p.poll() is None:
            netbed.kill_until_gone(lambda: [x for x in [p.pid] + netbed.descendants(p.pid)
                                            if netbed.process_alive(x)], f"client {p.pid}")
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass

    def cancel_all(self, timeout: float = 30) -> None:
        """Kill the clients started by :meth:`popen`, cancel every job, wait for idle nodes."""
        self._cancel()
        self.wait_idle(timeout=timeout)

    def _cancel(self) -> None:
        for p in self._clients:
            self._kill_tree(p)
        self._clients = []
        if self.run(["squeue", "-h", "-o", "%i"], timeout=20).stdout.strip():
            self.run(["scancel", "--user", str(os.getuid())], timeout=20)

    def job_state(self, job_id: Union[int, str]) -> Dict[str, str]:
        """``scontrol show job -o`` as a dict (``JobState``, ``ExitCode``, ``NodeList`` ...);
        empty once the job is gone (MinJobAge, default 300 s after its end)."""
        r = self.run(["scontrol", "show", "job", "-o", str(job_id)], timeout=20)
        return dict(f.split("=", 1) for f in r.stdout.split() if "=" in f)

    def wait_job(self, job_id: Union[int, str], timeout: float = 60) -> Dict[str, str]:
        """Wait until the job has ended; return :meth:`job_state`.

        Faster than ``sbatch --wait``, which polls after 2 s and then every 8 s.
        """
        ended = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                 "PREEMPTED", "BOOT_FAIL", "DEADLINE")
        deadline = time.monotonic() + timeout
        while True:
            st = self.job_state(job_id)
            if st.get("JobState", "") in ended or not st:
                return st
            if time.monotonic() > deadline:
                raise SlurmBedError(f"job {job_id} still {st.get('JobState')} after {timeout} s")
            time.sleep(0.05)

    # ------------------------------------------------------------ inside hosts
    def exec_in(self, host: HostRef, argv: Sequence[str], timeout: Optional[float] = 60,
                **kw) -> subprocess.CompletedProcess:
        """Run ``argv`` in a host's namespaces (not through Slurm); output captured as text."""
        assert self.net is not None
        return self.net.run(self._host(host), argv, timeout=timeout, **kw)

    def spawn_in(self, host: HostRef, argv: Sequence[str], **popen_kw) -> subprocess.Popen:
        """Start ``argv`` in a host's namespaces, in a session of its own; teardown kills it."""
        assert self.net is not None
        return self.net.spawn(self._host(host), argv, **popen_kw)

    def host_pids(self, host: HostRef) -> List[int]:
        """Live pids in the host's network namespace: slurmd, slurmstepd and the tasks."""
        assert self.net is not None
        return self.net.pids(self._host(host))

    def task_pids(self, host: HostRef) -> List[int]:
        """:meth:`host_pids` without slurmd and slurmstepd (what a job left running)."""
        out = []
        for pid in self.host_pids(host):
            try:
                with open(f"/proc/{pid}/comm") as f:
                    comm = f.read().strip()
            except OSError:
                continue
            if comm not in ("slurmd", "slurmstepd"):
                out.append(pid)
        return out

    # ------------------------------------------------------------------- faults
    def crash(self, host: HostRef) -> List[int]:
        """SIGKILL everything in node ``host`` (slurmd, slurmstepd, tasks); return the pids."""
        assert self.net is not None
        self.dirty = True
        self._crashed.add(self.name(host))
        return self.net.kill_host(self._host(host))

    def restart_slurmd(self, host: HostRef, wait: bool = True,
                       timeout: Optional[float] = None) -> None:
        """Start the node's slurmd again (a running one gets SIGTERM first).

        With ``wait``: until it listens and slurmctld sees the node responding
        (not ``down``, no ``*``); call :meth:`wait_idle` to wait for idle.
        """
        name = self.name(host)
        old = self.daemons.get(name)
        if old is not None and old.poll() is None:
            old.terminate()
            try:
                old.wait(timeout=10)
            except subprocess.TimeoutExpired:
                old.kill()
                old.wait()
        self._spawn_slurmd(name)
        if wait:
            def ready() -> bool:
                if not self._slurmd_listening(name):
                    return False
                st = self.node_states().get(name, "")
                return not st.endswith("*") and not st.startswith(("down", "unk"))
            self._wait(f"slurmd of {name}", ready, timeout or self.ready_timeout,
                       ["munged", "slurmctld", name])

    def linkdown(self, host: HostRef) -> None:
        """Cut the node off the network (its slurmd and tasks keep running)."""
        assert self.net is not None
        self.dirty = True
        self.net.link_down(self._host(host))
        self._links_down.add(self.name(host))

    def linkup(self, host: HostRef) -> None:
        assert self.net is not None
        self.net.link_up(self._host(host))
        self._links_down.discard(self.name(host))

    def restore(self, timeout: float = 60) -> None:
        """Undo faults: links up, slurmd running on every node, no jobs, all nodes idle."""
        if not self._started:
            return
        for name in list(self._links_down):
            self.linkup(name)
        states = self.node_states()
        for name in self.nodes:
            p = self.daemons.get(name)
            st = states.get(name, "")
            # a node marked down re-registers only when its slurmd starts (or at the next ping)
            if p is None or p.poll() is not None or st.endswith("*") or st.startswith("down"):
                self.restart_slurmd(name, wait=name in self._crashed)
        self._cancel()
        # A job that was running or ending on a crashed node stays "completing" until
        # slurmctld asks the node again (minutes): taking the node down and back ends it.
        states = self.node_states()
        for name in sorted(self._crashed):
            if states.get(name) != "idle":
                for state in ("DOWN Reason=bed-restore", "RESUME"):
                    self.run(["scontrol", "update", f"NodeName={name}", *f"State={state}".split()],
                             timeout=20)
        self._crashed.clear()
        self.wait_idle(timeout=timeout)
        self.dirty = False

    def log_files(self) -> List[str]:
        return [os.path.join(self.dir, "slurmctld.log")] + [
            os.path.join(self.dir, f"slurmd-{n}.log") for n in self.nodes]


# ------------------------------------------------------------------ pytest part


def unavailable_reason() -> Optional[str]:
    """Why no bed can be built here (None if it may work)."""
    missing = netbed.missing_tools(REQUIRED_TOOLS)
    if missing:
        return ("missing " + ", ".join(missing)
                + " (apt-get install slurm-wlm munge iproute2 util-linux; scripts/test.sh does)")
    ok, reason = netbed.namespaces_permitted()
    return None if ok else f"network namespaces not permitted: {reason}"


def _unavailable(reason: str) -> None:
    msg = f"Slurm test bed unavailable: {reason}"
    if require_all():
        pytest.fail(msg, pytrace=False)
    pytest.skip(msg)


class SlurmBedPool(netbed.BedPool):
    """Session-wide beds: :meth:`get` shares one bed per configuration, :meth:`new` is yours."""

    def __init__(self, base_dir: str) -> None:
        self.base_dir = base_dir
        self._count = 0
        super().__init__(self._make)

    def _make(self, nodes: int, **kw) -> SlurmBed:
        reason = unavailable_reason()
        if reason:
            _unavailable(reason)
        self._count += 1
        bed = SlurmBed(os.path.join(self.base_dir, f"bed{self._count}-{nodes}nodes"),
                       nodes=nodes, **kw)
        try:
            bed.start()
        except (NetBedError, OSError, subprocess.SubprocessError) as e:
            _unavailable(f"{type(e).__name__}: {e}")
        return bed

    def get(self, nodes: int = 2, cpus: int = 2,  # type: ignore[override]
            extra_conf: Sequence[str] = (), **kw) -> SlurmBed:
        """The session's shared bed of this configuration (built on first use)."""
        key = (nodes, cpus, tuple(extra_conf), tuple(sorted(kw.items())))
        return super().get(key, nodes, cpus=cpus, extra_conf=extra_conf,  # type: ignore[return-value]
                           **kw)

    def new(self, nodes: int = 2, cpus: int = 2,  # type: ignore[override]
            extra_conf: Sequence[str] = (), **kw) -> SlurmBed:
        """A bed of the caller's own, stopped at session end (or earlier by its ``stop()``)."""
        return super().new(nodes, cpus=cpus, extra_conf=extra_conf, **kw)  # type: ignore[return-value]


_POOLS: List[SlurmBedPool] = []


@pytest.fixture(scope="session")
def slurmbeds(tmp_path_factory) -> Iterator[SlurmBedPool]:
    """Factory of Slurm beds: ``slurmbeds.get(n, cpus=2)`` (shared) or ``slurmbeds.new(n)``."""
    pool = SlurmBedPool(str(tmp_path_factory.mktemp("slurmbed")))
    _POOLS.append(pool)
    try:
        yield pool
    finally:
        _POOLS.remove(pool)
        pool.close()


@pytest.fixture(scope="session")
def slurmbed(slurmbeds: SlurmBedPool) -> SlurmBed:
    """The session's shared bed: nodes h1, h2 with 2 CPUs each."""
    return slurmbeds.get(2, cpus=2)


@pytest.fixture(autouse=True)
def _slurmbed_restore(request):
    """Remember the log sizes before each test; afterwards undo faults left on shared beds."""
    request.node._slurmbed_log_sizes = netbed.log_offsets(_POOLS)
    yield
    netbed.restore_dirty(_POOLS)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    sizes = getattr(item, "_slurmbed_log_sizes", None)
    if rep.when == "call" and rep.failed and sizes is not None:
        tails = netbed.log_tails(_POOLS, sizes)
        if tails:
            rep.sections.append(("slurm logs", tails))
