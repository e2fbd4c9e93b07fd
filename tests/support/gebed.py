"""A real Grid Engine cell on the SSH test bed's namespace hosts (Debian's 8.1.9).

The cell is private to the bed: its own ``SGE_ROOT`` (links to the
installation's ``bin``, ``lib``, ``util``, ``utilbin``), cell and Berkeley DB
spool in a temporary directory, ``min_uid 0`` (the tests run as root), and
its own ports.  ``sge_qmaster`` runs in the first host, one ``sge_execd`` in
each host; the queue ``all.q`` spans them with 2 slots each and the
parallel environment ``mpi`` (``control_slaves TRUE``, ``$round_robin``), so
``qrsh -inherit`` works inside its jobs.  Nothing is installed system-wide
and nothing runs after :meth:`GridEngine.stop`.  A few seconds to start.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from typing import Dict, List, Optional

GE_LIB = "/usr/lib/gridengine"
GE_SHARE = "/usr/share/gridengine"
GE_ROOT = "/var/lib/gridengine"
CELL = "mslaunch"

_PE = ("pe_name {name}\nslots 64\nuser_lists NONE\nxuser_lists NONE\nstart_proc_args NONE\n"
       "stop_proc_args NONE\nallocation_rule $round_robin\ncontrol_slaves TRUE\n"
       "job_is_first_task FALSE\nurgency_slots min\naccounting_summary FALSE\nqsort_args NONE\n")


def missing() -> List[str]:
    """What this bed needs and does not find."""
    need = [f"{GE_LIB}/spoolinit", "/usr/sbin/sge_qmaster", "/usr/sbin/sge_execd",
            f"{GE_ROOT}/bin", "/usr/bin/qsub"]
    return [p for p in need if not os.path.exists(p)]


class GridEngineError(RuntimeError):
    pass


class GridEngine:
    """The cell; :attr:`env` is what its clients need (``SGE_ROOT``, ports...)."""

    def __init__(self, bed, directory: str, port: int = 16444) -> None:
        self.bed = bed
        self.dir = directory
        self.root = os.path.join(directory, "sge")
        self.hosts = [h.name for h in bed.hosts]
        self.env: Dict[str, str] = dict(os.environ, SGE_ROOT=self.root, SGE_CELL=CELL,
                                        SGE_QMASTER_PORT=str(port),
                                        SGE_EXECD_PORT=str(port + 1))

    # -- start and stop ---------------------------------------------------------
    def start(self) -> GridEngine:
        try:
            self._make_cell()
            self._run(self.hosts[0], ["/usr/sbin/sge_qmaster"])
            self._wait(lambda: self._ok(["qconf", "-sh"]), "sge_qmaster to answer")
            self._run(self.hosts[0], ["qconf", "-ah", ",".join(self.hosts)], check=False)
            self._run(self.hosts[0], ["qconf", "-as", self.hosts[0]])
            for name in ("mpi", "smp", "make"):   # the default queue names smp and make
                path = os.path.join(self.dir, f"pe-{name}")
                with open(path, "w") as f:
                    f.write(_PE.format(name=name))
                self._run(self.hosts[0], ["qconf", "-Ap", path])
            for host in self.hosts:
                self._run(host, ["/usr/sbin/sge_execd"])
            self._run(self.hosts[0], ["qconf", "-aq", "all.q"], EDITOR="true")
            self._run(self.hosts[0], ["qconf", "-mattr", "queue", "hostlist",
                                      " ".join(self.hosts), "all.q"])
            self._run(self.hosts[0], ["qconf", "-mattr", "queue", "slots", "2", "all.q"])
            # A loaded machine (the hosts share its cores and its load average)
            # would put the queue in alarm at the default np_load_avg=1.75 and
            # nothing would be dispatched.
            self._run(self.hosts[0], ["qconf", "-rattr", "queue", "load_thresholds",
                                      "NONE", "all.q"])
            self._schedule_every_second()
            self._wait(self._all_up, "every sge_execd to report")
        except BaseException:
            self.stop()
            raise
        return self

    def _make_cell(self) -> None:
        common = os.path.join(self.root, CELL, "common")
        os.makedirs(common)
        for name in ("bin", "lib", "util", "utilbin"):
            os.symlink(os.path.join(GE_ROOT, name), os.path.join(self.root, name))
        spool = os.path.join(self.dir, "spooldb")
        os.makedirs(spool)
        os.makedirs(os.path.join(self.dir, "qmaster"))
        with open(os.path.join(common, "bootstrap"), "w") as f:
            f.write(f"admin_user none\ndefault_domain none\nignore_fqdn true\n"
                    f"spooling_method berkeleydb\nspooling_lib libspoolb\n"
                    f"spooling_params {spool}\nbinary_path /usr/sbin\n"
                    f"qmaster_spool_dir {self.dir}/qmaster\nsecurity_mode none\n"
                    f"listener_threads 2\nworker_threads 2\nscheduler_threads 1\n")
        with open(os.path.join(common, "act_qmaster"), "w") as f:
            f.write(self.hosts[0] + "\n")
        with open(f"{GE_SHARE}/default-configuration") as f:
            conf = f.read()
        for key, value in (("min_uid", "0"), ("min_gid", "0"),
                           ("execd_spool_dir", os.path.join(self.dir, "execd"))):
            conf = re.sub(rf"(?m)^{key}\s.*$", f"{key} {value}", conf)
        global_conf = os.path.join(self.dir, "global")
        with open(global_conf, "w") as f:
            f.write(conf)
        res = f"{GE_SHARE}/util/resources"
        for argv in ([f"{GE_LIB}/spoolinit", "berkeleydb", "libspoolb", spool, "init"],
                     [f"{GE_LIB}/spooldefaults", "configuration", global_conf],
                     [f"{GE_LIB}/spooldefaults", "complexes", f"{res}/centry"],
                     [f"{GE_LIB}/spooldefaults", "usersets", f"{res}/usersets"],
                     [f"{GE_LIB}/spooldefaults", "managers", "root"]):
            r = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=60)
            if r.returncode != 0:
                raise GridEngineError(f"{' '.join(argv[:2])}: {r.stderr.strip()[-300:]}")

    def _schedule_every_second(self) -> None:
        # The default interval (15 s) would be most of a test's time.
        conf = self._run(self.hosts[0], ["qconf", "-ssconf"]).stdout
        path = os.path.join(self.dir, "sched")
        with open(path, "w") as f:
            conf = re.sub(r"(?m)^schedule_interval\s.*$", "schedule_interval 0:0:1", conf)
            f.write(re.sub(r"(?m)^job_load_adjustments\s.*$", "job_load_adjustments NONE", conf))
        self._run(self.hosts[0], ["qconf", "-Msconf", path])

    def stop(self) -> None:
        """Stop the daemons, by pid (they detach): SIGTERM, then SIGKILL."""
        for sig, wait in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 0.0)):
            for pid in self._daemons():
                try:
                    os.kill(pid, sig)
                except OSError:
                    pass
            deadline = time.monotonic() + wait
            while self._daemons() and time.monotonic() < deadline:
                time.sleep(0.1)

    def _daemons(self) -> List[int]:
        found = []
        for host in self.hosts:
            for pid in self.bed.host_pids(host):
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        if os.path.basename(f.read().split(b"\0")[0]).startswith(b"sge_"):
                            found.append(pid)
                except OSError:
                    pass
        return found

    # -- running things -----------------------------------------------------------
    def _run(self, host: str, argv: List[str], check: bool = True, timeout: float = 60,
             **extra: str) -> subprocess.CompletedProcess:
        r = self.bed.run_in(host, argv, env=dict(self.env, **extra), timeout=timeout)
        if check and r.returncode != 0:
            raise GridEngineError(f"{' '.join(argv)} on {host}: "
                                  f"{(r.stderr or r.stdout).strip()[-300:]}")
        return r

    def _ok(self, argv: List[str]) -> bool:
        return self._run(self.hosts[0], argv, check=False, timeout=15).returncode == 0

    def _all_up(self) -> bool:
        r = self._run(self.hosts[0], ["qhost"], check=False, timeout=15)
        lines = {ln.split()[0]: ln.split() for ln in r.stdout.splitlines()[2:] if ln.split()}
        return all(h in lines and lines[h][2] != "-" for h in self.hosts)

    @staticmethod
    def _wait(predicate, what: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise GridEngineError(f"waited {timeout:g} s for {what}")
            time.sleep(0.3)

    def qsub(self, script: str, slots: int, out: str, err: str,
             timeout: float = 120, env: Optional[Dict[str, str]] = None
             ) -> subprocess.CompletedProcess:
        """Submit ``script`` to the ``mpi`` PE with ``slots`` and wait for it (``-sync y``)."""
        return self.bed.run_in(self.hosts[0], ["qsub", "-sync", "y", "-pe", "mpi", str(slots),
                                               "-b", "y", "-o", out, "-e", err,
                                               "-wd", self.dir, script],
                               env=dict(self.env, **(env or {})), timeout=timeout)
