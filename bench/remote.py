"""Remote launch over SSH: mslaunch against Hydra ``mpiexec -launcher ssh``
and Open MPI 4's ``mpirun``.

The hosts are the SSH test bed of ``tests/support/sshbed.py``: one real OpenSSH
``sshd`` per network namespace on this machine (``h1`` .. ``hN``, each with its
own address, hostname and ``/etc/hosts``).  The script starts one bed per
host count (2, 4, 8, 16 by default), makes a HOME for each with
``~/.ssh/{config,id_ed25519,known_hosts}`` and ``bin/ssh`` (an OpenSSH
wrapper that passes ``-F HOME/.ssh/config``), and runs every launcher with
``HOME=<that home>``, so paramiko (mslaunch) reads that config through
``$HOME`` and OpenSSH (Hydra) reads it through the wrapper.  The beds are
stopped at the end, also after a failure.

Contenders, each with one rank per host:

- mslaunch ``-H h1,..,hH`` (default ``--mpi pmi`` mode: an agent per host,
  PMI relayed per host);
- the same with the OpenSSH client as the rsh agent (``--mca plm_rsh_agent
  HOME/bin/ssh``): agents started by ``ssh``, dialling back over TCP;
- Hydra ``mpiexec.hydra -launcher ssh -launcher-exec HOME/bin/ssh
  -hosts h1,..,hH``.  Hydra starts ``<its own bin dir>/hydra_pmi_proxy`` by
  absolute path on each host (the hosts share this file system, so no
  ``PATH`` set-up is needed), and the proxy connects back to the runner's
  hostname, which each host's ``/etc/hosts`` maps to the runner's bed
  address;
- Open MPI 4 ``mpirun -H h1,..,hH --mca plm_rsh_agent HOME/bin/ssh``
  (Debian's ``mpirun.openmpi``, 4.1.4, unless ``--ompi`` names another),
  which starts ``orted`` on each host over OpenSSH; its ranks' stdout is a
  pseudo-terminal, as mslaunch's by default.  It runs cases 1 and 3 (its
  MPI is not the MPICH that case 2 measures).

Cases (all in the same interleaved rounds):

1. ``-n H python -c pass`` on H hosts: wall time and how it grows per added
   host; the launcher's CPU time (user+sys of the launcher and the children
   it reaped, from ``wait4``: for Hydra that includes its ``ssh`` clients,
   for mslaunch the SSH client is paramiko inside it); the launcher's own
   peak RSS (``VmHWM``, sampled while it runs); and the CPU time of the
   whole machine (``/proc/stat``: launcher, sshds, agents or proxies,
   ranks).  The peak RSS of the launcher with all its descendants comes
   from the untimed placement-check run (a /proc scan every 10 ms).
2. mpi4py Init + ``allreduce`` + Finalize on H hosts with ``UCX_TLS=tcp``
   exported to the ranks (mslaunch ``-x UCX_TLS``, Hydra ``-genv UCX_TLS
   tcp``, and ``UCX_TLS=tcp`` in both launchers' environment).  The sum counts
   the ranks that saw ``UCX_TLS=tcp`` and must equal H; rank 0's library must
   be MPICH.
3. Output relay: 2 hosts, one rank each writing ``--mb`` MiB of 100-byte lines
   to stdout as fast as it can; MiB/s of the whole command to a pipe, and net
   of the same job writing 0 MiB.  Every byte is checked after the timed
   run (total, ``x`` and newline counts exact), and lines that are not one
   of the two lines the ranks write are counted as spliced (two ranks' lines
   joined: no line atomicity, though no byte is lost).

Before the rounds each launcher runs ``hostname`` once on every bed (not
timed): the output must name every host exactly once.  After the rounds,
processes other than sshd left on the hosts are reported.

With ``--plain-login`` the user's ``~/.bashrc`` is hidden on every host.
sshd runs every command through the login shell, and bash reads
``~/.bashrc`` then; on a machine where that file runs ``pyenv init``, each
session costs some 75 ms of CPU, and sessions that start at the same moment
queue on pyenv's rehash lock in steps of 0.1 s, which weighs on a launcher
that starts every host at once more than on one whose ssh clients start
staggered.  Without the option, the hosts read the file as this machine's
own logins do; the header says which.

    python bench/remote.py [--runs 7] [--hosts 2,4,8,16] [--mb 128] [--plain-login]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import selectors
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import _common as C

sys.path.insert(0, str(C.REPO_ROOT / "tests" / "support"))

MIB = 1 << 20
PASS = [sys.executable, "-c", "pass"]
HOSTNAME = [sys.executable, "-c", "import socket; print(socket.gethostname())"]
MPI_PROGRAM = (
    "import os\n"
    "from mpi4py import MPI\n"
    "comm = MPI.COMM_WORLD\n"
    "total = comm.allreduce(int(os.environ.get('UCX_TLS') == 'tcp'))\n"
    "if comm.rank == 0:\n"
    "    print(total, MPI.Get_library_version().splitlines()[0], flush=True)\n"
    "MPI.Finalize()\n"
)
# the same writer as bench/relay_throughput.py: 1 MiB blocks of 10485 lines of 100 bytes + one of 76
WRITER = C.LINE_WRITER
LONG, SHORT, PER_MIB = b"x" * 99, b"x" * 75, 10485
RELAY_HOSTS = 2
KINDS = ("mslaunch", "hydra", "openmpi")
#: Debian's Open MPI 4 (the 4.1.4 the tutorials install); ``--ompi`` overrides.
OMPI4 = "/usr/bin/mpirun.openmpi"
SELF_EVERY = 0.02     # s between VmHWM reads of the launcher in timed runs
TREE_EVERY = 0.01     # s between /proc scans in the untimed footprint run
RATIOS = [("mslaunch / Hydra", "mslaunch", "hydra"),
          ("mslaunch with the OpenSSH client / Hydra", "mslaunch-openssh", "hydra"),
          ("mslaunch / Open MPI 4", "mslaunch", "openmpi")]


# --------------------------------------------------------------------------- one measured run

@dataclass
class Measured:
    """A run as :class:`_common.RunResult` plus what ``wait4``, /proc/stat and sampling said."""

    res: C.RunResult
    chunks: List[bytes] = field(default_factory=list)
    cpu: float = 0.0            # user+sys of the launcher and the children it reaped
    machine_cpu: float = 0.0    # busy CPU seconds of the whole machine during the run
    hwm_kib: Optional[int] = None    # the launcher process's own peak RSS (VmHWM)
    tree_kib: Optional[int] = None   # largest sampled RSS sum of the launcher and descendants
    fds: Optional[int] = None        # the launcher process's largest sampled count of open fds


def _machine_cpu() -> float:
    """Busy CPU seconds of the machine so far (user+nice+system+irq+softirq of /proc/stat)."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return 0.0
    ticks = sum(int(x) for x in (fields[1:4] + fields[6:8]))
    return ticks / os.sysconf("SC_CLK_TCK")


def _vm_hwm_kib(pid: int) -> Optional[int]:
    """``VmHWM`` of a live process (its peak RSS since its last exec), in KiB."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def _open_fds(pid: int) -> Optional[int]:
    """How many descriptors a live process has open now (its ``/proc/PID/fd``)."""
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024


def _tree_rss_kib(root: int) -> int:
    """Sum of the RSS of ``root`` and all its descendants now (one scan of /proc)."""
    kids: Dict[int, List[int]] = {}
    rss: Dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                data = f.read()
        except OSError:
            continue
        rest = data[data.rfind(b")") + 2:].split()
        pid = int(name)
        kids.setdefault(int(rest[1]), []).append(pid)   # field 4: ppid
        rss[pid] = int(rest[21])                         # field 24: rss in pages
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += rss.get(pid, 0)
        todo += kids.get(pid, [])
    return total * PAGE_KIB


def run_measured(argv: Sequence[str], env: Dict[str, str], *, keep_stdout: bool = False,
                 timeout: float = 600.0, sample: str = "") -> Measured:
    """``_common.run_once``, reaping with ``wait4`` (CPU time) and sampling memory.

    Same pipes (1 MiB, drained here), same clock: from just before ``Popen``
    until the launcher has exited and both pipes are at EOF.  The exit is seen
    through a pidfd in the same ``select`` as the pipes, so no polling delay
    is added.  ``sample="self"`` reads the launcher's ``VmHWM`` every
    ``SELF_EVERY`` s (one small file; ``wait4``'s ``ru_maxrss`` cannot be used:
    Linux carries the peak RSS of the process image before ``exec`` over,
    here the harness's own); ``sample="tree"`` also sums the RSS of the
    launcher and all its descendants every ``TREE_EVERY`` s (a /proc scan,
    too costly for timed runs).
    """
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    for fd in (out_r, err_r):
        C._grow_pipe(fd)
    kept: List[bytes] = []
    tail = b""
    count = 0
    timed_out = False
    every = TREE_EVERY if sample == "tree" else SELF_EVERY
    hwm: Optional[int] = None
    tree: Optional[int] = None
    fds: Optional[int] = None
    cpu0 = _machine_cpu()
    start = time.perf_counter()
    try:
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=out_w,
                                stderr=err_w, start_new_session=True)
    finally:
        os.close(out_w)
        os.close(err_w)
    try:
        pidfd: Optional[int] = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        pidfd = None
    status: Optional[int] = None
    usage = None
    deadline = start + timeout
    next_sample = start
    with selectors.DefaultSelector() as sel:
        sel.register(out_r, selectors.EVENT_READ)
        sel.register(err_r, selectors.EVENT_READ)
        if pidfd is not None:
            sel.register(pidfd, selectors.EVENT_READ)
        pipes = 2
        while pipes or status is None:
            now = time.perf_counter()
            left = deadline - now
            if left <= 0:
                if timed_out:
                    break
                timed_out = True
                C._kill_group(proc.pid)
                deadline = time.perf_counter() + 10.0
                continue
            if sample and status is None and now >= next_sample:
                hwm = _vm_hwm_kib(proc.pid) or hwm
                fds = max(fds or 0, _open_fds(proc.pid) or 0) or fds
                if sample == "tree":
                    tree = max(tree or 0, _tree_rss_kib(proc.pid))
                next_sample = now + every
            wait = left
            if sample and status is None:
                wait = min(wait, max(0.0, next_sample - now))
            if pidfd is None and status is None:
                wait = min(wait, 0.001 if not pipes else 0.05)
            for key, _ in sel.select(wait):
                if key.fd == pidfd:
                    sel.unregister(pidfd)
                    _, status, usage = os.wait4(proc.pid, 0)
                    continue
                data = os.read(key.fd, C.READ_SIZE)
                if not data:
                    sel.unregister(key.fd)
                    pipes -= 1
                elif key.fd == out_r:
                    count += len(data)
                    if keep_stdout:
                        kept.append(data)
                else:
                    tail = (tail + data)[-C.STDERR_TAIL:]
            if status is None and pidfd is None:
                pid, st, ru = os.wait4(proc.pid, os.WNOHANG)
                if pid:
                    status, usage = st, ru
    if status is None:              # still running after the kill's grace: make sure
        C._kill_group(proc.pid)
        _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    machine = _machine_cpu() - cpu0
    for fd in (out_r, err_r) + ((pidfd,) if pidfd is not None else ()):
        os.close(fd)
    code = os.waitstatus_to_exitcode(status)
    proc.returncode = code          # reaped here, not by Popen
    if timed_out:
        C._kill_group(proc.pid)
    res = C.RunResult(seconds, code, count, b"", tail, timed_out)
    cpu = usage.ru_utime + usage.ru_stime if usage is not None else 0.0
    return Measured(res, kept, cpu, machine, hwm, tree, fds)


def check_relay(chunks: Sequence[bytes], ranks: int, mb: int) -> Tuple[Optional[str], int]:
    """Check the relayed stream against what ``ranks`` WRITERs of ``mb`` MiB wrote.

    Returns (why the bytes are wrong, or None; lines that are not one of the
    two lines the ranks write).  The bytes are right when the total, the
    number of ``x`` and the number of newlines are exactly what was written
    (nothing lost, added or changed).  A line of the wrong length with right
    bytes means two ranks' lines were spliced together (no line atomicity).
    """
    total = sum(len(c) for c in chunks)
    want_lines = ranks * mb * (PER_MIB + 1)
    if total != ranks * mb * MIB:
        return f"{total} bytes, want {ranks * mb * MIB}", 0
    newlines = sum(c.count(b"\n") for c in chunks)
    xs = sum(c.count(b"x") for c in chunks)
    if newlines != want_lines or xs + newlines != total:
        return (f"{newlines} newlines and {total - xs - newlines} bytes other than 'x' or "
                f"newline, want {want_lines} and 0"), 0
    good = lines = 0
    carry = b""
    for chunk in chunks:
        parts = (carry + chunk).split(b"\n")
        carry = parts.pop()
        good += parts.count(LONG) + parts.count(SHORT)
        lines += len(parts)
    return None, lines - good + (1 if carry else 0)


# --------------------------------------------------------------------------- beds

@dataclass
class Bed:
    """A started SSH bed and the HOME that reaches it."""

    bed: Any        # sshbed.SSHBed
    home: str

    @property
    def hosts(self) -> List[str]:
        return list(self.bed.names)

    @property
    def ssh(self) -> str:
        return os.path.join(self.home, "bin", "ssh")


def start_beds(sizes: Sequence[int], root: str, plain_login: bool = False) -> Dict[int, Bed]:
    try:
        from sshbed import SSHBed  # type: ignore[import-not-found]  # tests/, imports pytest
    except ImportError as err:
        raise SystemExit(f"bench/remote.py needs tests/support/sshbed.py and pytest: {err}")
    beds: Dict[int, Bed] = {}
    try:
        for n in sizes:
            bed = SSHBed(os.path.join(root, f"bed{n}"), login_rc=not plain_login)
            beds[n] = Bed(bed, "")   # registered first: stopped even if start fails
            bed.start(n)
            beds[n].home = bed.make_home(os.path.join(root, f"home{n}"))
    except BaseException:
        stop_beds(beds)
        raise
    return beds


def stop_beds(beds: Dict[int, Bed]) -> None:
    for b in beds.values():
        try:
            b.bed.stop()
        except Exception as err:  # keep stopping the others
            C.log(f"bench: stopping a bed failed: {err}")


def leftovers(beds: Dict[int, Bed]) -> List[str]:
    """Processes other than sshd still alive on the hosts (after a short settle)."""
    time.sleep(1.0)
    notes = []
    for n, b in sorted(beds.items()):
        bed = b.bed
        for h in bed.hosts:
            try:
                pids = bed.host_pids(h)
            except Exception:
                continue
            others = []
            for pid in pids:
                try:
                    exe = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
                except OSError:
                    continue
                if exe == "sshd" or exe.startswith("sshd-"):
                    continue
                others.append(f"{pid} {cmd[:60]}")
            if others:
                notes.append(f"{n}-host bed, {h.name}: " + "; ".join(others))
    return notes


# --------------------------------------------------------------------------- helpers

def line_fit(points: Sequence[Tuple[int, Optional[float]]]) -> Optional[Tuple[float, float]]:
    """Least-squares (intercept, slope) of y over x, ignoring missing ys."""
    pts = [(float(x), y) for x, y in points if y is not None]
    if len(pts) < 2:
        return None
    mx = statistics.mean(x for x, _ in pts)
    my = statistics.mean(y for _, y in pts)
    den = sum((x - mx) ** 2 for x, _ in pts)
    if den == 0:
        return None
    k = sum((x - mx) * (y - my) for x, y in pts) / den
    return my - k * mx, k


def median_info(s: C.Samples, name: str) -> Optional[float]:
    vals = [float(v) for v in (i.get(name) for i in s.infos) if isinstance(v, (int, float))]
    return statistics.median(vals) if vals and s.error is None else None


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    C.add_launcher_args(parser, runs=7)
    parser.set_defaults(launchers="mslaunch,hydra,openmpi",
                        ompi=OMPI4 if os.path.exists(OMPI4) else None)
    parser.add_argument("--hosts", default="2,4,8,16",
                        help="host counts of cases 1 and 2 (default 2,4,8,16)")
    parser.add_argument("--mb", type=int, default=128,
                        help="MiB written by each of the 2 relay ranks (default 128)")
    parser.add_argument("--cases", default="launch,mpi,relay",
                        help="subset of launch,mpi,relay (default all)")
    parser.add_argument("--tmpdir", default=None, help="where the beds' directories go")
    parser.add_argument("--plain-login", action="store_true",
                        help="hide the user's ~/.bashrc on every host (a bind mount in the "
                             "host's namespace), so that remote commands start with a plain "
                             "shell rather than this machine's start-up files")
    args = parser.parse_args(argv)
    warmups = 1 if args.warmups is None else args.warmups
    wanted = [k.strip() for k in args.launchers.split(",") if k.strip()]
    skipped = [k for k in wanted if k not in KINDS]
    if skipped:
        C.log(f"bench: remote.py compares {', '.join(KINDS)} only; skipped {','.join(skipped)}")
    args.launchers = ",".join(k for k in wanted if k in KINDS)
    launchers = [dataclasses.replace(l, label="Open MPI 4 mpirun") if l.kind == "openmpi"
                 and " 4." in l.version else l for l in C.launchers_from_args(args)]
    if not launchers:
        C.log("bench: no launcher to run")
        return 2
    if "mslaunch" in {l.key for l in launchers}:
        # The OpenSSH client as the rsh agent (``--mca plm_rsh_agent``), beside paramiko.
        ms = next(l for l in launchers if l.key == "mslaunch")
        launchers.insert(launchers.index(ms) + 1, ms.variant(
            "mslaunch-openssh", "mslaunch, OpenSSH client as rsh agent", []))
    by_key: Dict[str, C.Launcher] = {l.key: l for l in launchers}
    # The relay is also run as Hydra runs it (ranks on pipes), and with output in TLS.
    relay_launchers = list(launchers)
    if "mslaunch" in by_key:
        ms = by_key["mslaunch"]
        at = relay_launchers.index(ms) + 1
        relay_launchers[at:at] = [
            ms.variant("mslaunch-pipes", "mslaunch --no-pty", ["--no-pty"]),
            ms.variant("mslaunch-tls", "mslaunch --no-pty, output in TLS", ["--no-pty"],
                       {"MSLAUNCH_OUTPUT_TLS": "1"})]
    # The local pty floor (bench/pty_floor.py): the same writers on this machine, each on
    # a pseudo-terminal copied by a bare loop, in the same rounds as the remote relay.
    relay_launchers.append(C.Launcher("pty-floor", "local pty floor", "floor",
                                      (sys.executable, str(C.BENCH_DIR / "pty_floor.py"))))
    relay_only = {l.key for l in relay_launchers} - set(by_key)
    by_key.update({l.key: l for l in relay_launchers})
    sizes = sorted({int(x) for x in args.hosts.split(",") if x.strip()})
    which = {c.strip() for c in args.cases.split(",") if c.strip()}
    if which - {"launch", "mpi", "relay"}:
        raise SystemExit(f"--cases: unknown {','.join(sorted(which - {'launch', 'mpi', 'relay'}))}")

    # case key -> (kind, hosts, MiB)
    cases: Dict[str, Tuple[str, int, int]] = {}
    for n in sizes if "launch" in which else ():
        cases[f"launch {n}"] = ("launch", n, 0)
    for n in sizes if "mpi" in which else ():
        cases[f"mpi {n}"] = ("mpi", n, 0)
    if "relay" in which:
        cases["relay"] = ("relay", RELAY_HOSTS, args.mb)
        cases["relay 0"] = ("relay", RELAY_HOSTS, 0)
    bed_sizes = sorted({n for _, n, _ in cases.values()})
    base = C.base_environ()

    def command(l: C.Launcher, b: Bed, n: int, program: Sequence[str], mpi: bool) -> List[str]:
        hosts = ",".join(b.hosts)
        if l.kind == "floor":
            return l.argv(n, program)
        if l.kind == "mslaunch":
            extra = ["-H", hosts] + (["-x", "UCX_TLS"] if mpi else [])
            if l.key == "mslaunch-openssh":
                extra += ["--mca", "plm_rsh_agent", b.ssh]
        elif l.kind == "openmpi":
            extra = ["-H", hosts, "--mca", "plm_rsh_agent", b.ssh]
        else:
            extra = ["-launcher", "ssh", "-launcher-exec", b.ssh, "-hosts", hosts]
            extra += ["-genv", "UCX_TLS", "tcp"] if mpi else []
        return l.argv(n, program, extra)

    def environ(l: C.Launcher, b: Bed, mpi: bool) -> Dict[str, str]:
        extra = {"HOME": b.home}
        if mpi:
            extra["UCX_TLS"] = "tcp"
        return l.environ(base, extra)

    root = tempfile.mkdtemp(prefix="mslaunch-bench-remote-", dir=args.tmpdir)
    previous_term = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    beds: Dict[int, Bed] = {}
    try:
        load = " ".join(f"{x:.2f}" for x in os.getloadavg())
        t0 = time.perf_counter()
        beds = start_beds(bed_sizes, root, args.plain_login)
        from sshbed import login_rc_files  # type: ignore[import-not-found]
        login = ("plain login shell (" + ", ".join(login_rc_files()) + " hidden)"
                 if args.plain_login else "login shell as this machine's ("
                 + (", ".join(login_rc_files()) or "no ~/.bashrc") + " read)")
        bed_note = (f"SSH beds: mode {beds[bed_sizes[0]].bed.mode}, {login}, "
                    f"{', '.join(str(n) for n in bed_sizes)} hosts, started in "
                    f"{time.perf_counter() - t0:.2f} s; load avg at start {load}")
        if not args.quiet:
            C.log(f"bench: {bed_note}")
        if beds[bed_sizes[0]].bed.mode != "netns":
            C.log("bench: without network namespaces the hosts share this machine's hostname "
                  "and addresses; the placement check will fail (mslaunch may run them locally)")

        # placement check and memory footprint, not timed: every host runs exactly one rank
        preflight: Dict[Tuple[str, int], str] = {}
        footprint: Dict[Tuple[str, int], Optional[int]] = {}
        received: Dict[Tuple[str, int], Tuple[int, int]] = {}
        for n in bed_sizes:
            for l in launchers:
                runs: List[Measured] = []
                received[(l.label, n)] = C.bytes_per_host(
                    beds[n].bed.net, beds[n].hosts, lambda: runs.append(run_measured(
                        command(l, beds[n], n, HOSTNAME, False), environ(l, beds[n], False),
                        keep_stdout=True, timeout=args.timeout, sample="tree")))
                m = runs[0]
                if l.kind == "mslaunch":      # and with the package sent to every host
                    received[(l.label + ", package sent", n)] = C.bytes_per_host(
                        beds[n].bed.net, beds[n].hosts, lambda: run_measured(
                            command(l, beds[n], n, HOSTNAME, False),
                            dict(environ(l, beds[n], False), MSLAUNCH_HOST_PACKAGE="0"),
                            timeout=args.timeout))
                footprint[(l.key, n)] = m.tree_kib
                # The names, not the lines: Hydra may splice two ranks' lines
                # ("h3h8\n"), which loses no name.
                seen = sorted(re.findall(r"h[0-9]+",
                                         b"".join(m.chunks).decode(errors="replace")))
                err = m.res.failure()
                if err is None and seen != sorted(beds[n].hosts):
                    err = f"ranks ran on {' '.join(seen)[:100]!r}, want one on each of {n} hosts"
                if err is not None:
                    preflight[(l.key, n)] = "placement check: " + err
                    C.log(f"bench: {l.label} on {n} hosts: {preflight[(l.key, n)]}")

        def execute(case: str, key: str) -> C.Outcome:
            kind, n, mb = cases[case]
            l, b = by_key[key], beds[n]
            if key in relay_only and kind != "relay" or l.kind == "openmpi" and kind == "mpi":
                return C.Outcome()
            if (key, n) in preflight:
                return C.Outcome(error=preflight[(key, n)])
            if kind == "launch":
                program: List[str] = PASS
            elif kind == "mpi":
                program = [sys.executable, "-c", MPI_PROGRAM]
            else:
                program = [sys.executable, "-c", WRITER, str(mb)]
            m = run_measured(command(l, b, n, program, kind == "mpi"), environ(l, b, kind == "mpi"),
                             keep_stdout=kind != "launch", timeout=args.timeout,
                             sample="self" if kind == "launch" else "")
            err = m.res.failure()
            spliced = 0
            if err is None and kind == "mpi":
                text = b"".join(m.chunks).decode("utf-8", "replace").strip()
                first = text.splitlines()[0] if text else ""
                if not first.startswith(f"{n} "):
                    err = (f"rank 0 printed {first[:80]!r}, want {n} (ranks that saw "
                           f"UCX_TLS=tcp)")
                elif "MPICH" not in first:
                    err = f"wrong MPI library: {first[:80]!r}, want MPICH"
            if err is None and kind == "relay":
                err, spliced = check_relay(m.chunks, n, mb)
            m.chunks = []
            info: Dict[str, object] = {"cpu": m.cpu, "rss": m.hwm_kib, "fds": m.fds,
                                       "machine": m.machine_cpu, "spliced": spliced}
            return C.Outcome(m.res.seconds, err, info)

        results = C.run_rounds(list(cases), list(by_key), args.runs, warmups, execute,
                               quiet=args.quiet)
        left = leftovers(beds)
    finally:
        stop_beds(beds)
        signal.signal(signal.SIGTERM, previous_term)
        shutil.rmtree(root, ignore_errors=True)

    labels = {l.key: l.label for l in launchers}
    header = C.environment_note(launchers, args.runs, warmups) + f"  \n_{bed_note}._\n"
    launch = [c for c, v in cases.items() if v[0] == "launch"]
    mpi = [c for c, v in cases.items() if v[0] == "mpi"]

    if launch:
        print("### Remote launch over SSH: `-n H python -c pass`, one rank per host "
              "(wall ms, median (min))\n")
        print(header)
        print(C.time_table([(c, f"{cases[c][1]} hosts") for c in launch], launchers, results,
                           RATIOS))
        # growth with H
        headers = ["hosts"]
        for l in launchers:
            headers += [f"{l.label} ms", f"{l.label} ms per added host"]
        rows = []
        prev: Dict[str, Tuple[int, float]] = {}
        for c in launch:
            n = cases[c][1]
            row = [str(n)]
            for l in launchers:
                med = results[(c, l.key)].median()
                row.append(C.ms(med))
                p = prev.get(l.key)
                row.append(f"{(med - p[1]) * 1e3 / (n - p[0]):.0f}" if med is not None and p else "–")
                if med is not None:
                    prev[l.key] = (n, med)
            rows.append(row)
        fit = ["least-squares fit"]
        for l in launchers:
            line = line_fit([(cases[c][1], results[(c, l.key)].median()) for c in launch])
            if line is None:
                fit += ["–", "–"]
            else:
                fit += [f"{C.ms(line[0])} + H × {line[1] * 1e3:.0f}", f"{line[1] * 1e3:.0f}"]
        rows.append(fit)
        print("\nGrowth with the number of hosts (medians; per added host = difference to the "
              "previous row / hosts added):\n")
        print(C.markdown_table(headers, rows))

        # CPU and memory
        def fitted(values: Sequence[Tuple[int, Optional[float]]], scale: float, fmt: str) -> str:
            line = line_fit(values)
            return "–" if line is None else format(line[1] * scale, fmt)

        headers = ["hosts"]
        for l in launchers:
            headers += [f"{l.label} CPU ms", "CPU ms / host", "own peak RSS MiB",
                        "RSS with children MiB", "open fds"]
        headers += [f"machine CPU ms, {l.label}" for l in launchers]
        rows = []
        series: Dict[Tuple[str, str], List[Tuple[int, Optional[float]]]] = {}
        for c in launch:
            n = cases[c][1]
            row = [str(n)]
            for l in launchers:
                s = results[(c, l.key)]
                cpu, rss = median_info(s, "cpu"), median_info(s, "rss")
                fds = median_info(s, "fds")
                tree = footprint.get((l.key, n))
                row += ["FAIL" if s.error else C.ms(cpu) if cpu is not None else "–",
                        f"{cpu * 1e3 / n:.0f}" if cpu is not None else "–",
                        f"{rss / 1024:.1f}" if rss is not None else "–",
                        f"{tree / 1024:.0f}" if tree else "–",
                        f"{fds:.0f}" if fds is not None else "–"]
                series.setdefault((l.key, "cpu"), []).append((n, cpu))
                series.setdefault((l.key, "rss"), []).append((n, rss))
                series.setdefault((l.key, "tree"), []).append((n, float(tree) if tree else None))
                series.setdefault((l.key, "fds"), []).append((n, fds))
            for l in launchers:
                mc = median_info(results[(c, l.key)], "machine")
                row.append(C.ms(mc) if mc is not None else "–")
                series.setdefault((l.key, "machine"), []).append((n, mc))
            rows.append(row)
        growth = ["per added host (fit)"]
        for l in launchers:
            growth += [fitted(series[(l.key, "cpu")], 1e3, ".0f"), "",
                       fitted(series[(l.key, "rss")], 1 / 1024, ".2f"),
                       fitted(series[(l.key, "tree")], 1 / 1024, ".1f"),
                       fitted(series[(l.key, "fds")], 1, ".1f")]
        growth += [fitted(series[(l.key, "machine")], 1e3, ".0f") for l in launchers]
        rows.append(growth)
        print("\nLauncher CPU and memory (medians of the same runs, except the RSS with "
              "children):\n\n"
              "- CPU: user+sys of the launcher and the children it reaped (`wait4`). Hydra's "
              "include its `ssh` client processes; mslaunch's SSH client (paramiko) runs "
              "inside it.\n"
              "- Own peak RSS: the launcher process's `VmHWM`, read every "
              f"{SELF_EVERY * 1e3:.0f} ms while it runs.\n"
              "- RSS with children: the largest sum of the RSS of the launcher and all its "
              f"descendants (Hydra's `ssh` clients, mslaunch's watchdog), scanned every "
              f"{TREE_EVERY * 1e3:.0f} ms during the untimed placement-check run; shared pages "
              "count once per process.\n"
              "- Open fds: the most descriptors the launcher process held at once "
              f"(`/proc/PID/fd`, read with `VmHWM`); Hydra's pipes to its `ssh` clients count, "
              "mslaunch's SSH sockets count.\n"
              "- Machine CPU: busy time of the whole machine (`/proc/stat`) during the run: "
              "launcher, sshd, agents or proxies, ranks (and anything else running).\n")
        print(C.markdown_table(headers, rows))
        print()

    if mpi:
        print("### Remote MPI start-up: mpi4py Init + allreduce + Finalize, one rank per host, "
              "`UCX_TLS=tcp` (wall ms, median (min))\n")
        print(header)
        print(C.time_table([(c, f"{cases[c][1]} hosts") for c in mpi], launchers, results, RATIOS))
        print()

    if "relay" in cases:
        total = RELAY_HOSTS * args.mb * MIB

        def rate(seconds: Optional[float]) -> Optional[float]:
            return None if not seconds else total / MIB / seconds

        rows = []
        for l in relay_launchers:
            s, z = results[("relay", l.key)], results[("relay 0", l.key)]
            wall, zero = s.median(), z.median()
            med, best = rate(wall), rate(s.minimum())
            net = rate(wall - zero) if wall is not None and zero is not None and wall > zero else None
            cpu = median_info(s, "cpu")
            spliced = [int(v) for v in (i.get("spliced") for i in s.infos) if isinstance(v, int)]
            rows.append([l.label, "FAIL" if s.error else (f"{med:.0f}" if med else "–"),
                         f"{best:.0f}" if best else "–", f"{net:.0f}" if net else "–",
                         f"{wall:.2f}" if wall is not None else "–",
                         "FAIL" if z.error else (f"{zero * 1e3:.0f}" if zero is not None else "–"),
                         f"{cpu:.2f}" if cpu is not None else "–",
                         "FAIL" if s.error else f"ok ({len(s.seconds)}/{len(s.seconds)})",
                         "–" if s.error or not spliced else
                         f"{statistics.median(spliced):.0f} (max {max(spliced)})"])
        print(f"### Remote output relay: {RELAY_HOSTS} hosts, one rank each writing {args.mb} MiB "
              f"of 100-byte lines, to a pipe ({total // MIB} MiB total)\n")
        print(header)
        print(C.markdown_table(["launcher", "MiB/s median", "MiB/s best", "net MiB/s",
                                "wall s median", "0 MiB wall ms", "launcher CPU s",
                                "bytes check", "spliced lines, median (max)"], rows))
        print()
        for other in (l for l in relay_launchers if l.kind != "mslaunch"):
            theirs = rate(results[("relay", other.key)].median())
            for l in (l for l in relay_launchers if l.kind == "mslaunch"):
                r = C.ratio(rate(results[("relay", l.key)].median()), theirs)
                print(f"- {l.label} / {other.label} throughput: {r} (higher is better for "
                      f"mslaunch)")
        print("\nmslaunch gives remote ranks a pseudo-terminal by default, as Open MPI does "
              "(output line-buffered as on a terminal); Hydra's ranks write to pipes. "
              "Hydra's proxies and Open MPI's daemons send output in plain TCP, as mslaunch's "
              "agents do unless `MSLAUNCH_OUTPUT_TLS=1`.")
        print("\nBytes check: total bytes, the number of `x` and of newlines are exactly what the "
              "ranks wrote. Spliced lines: lines of the relayed stream that are not one of the two "
              "lines the ranks write, i.e. pieces of two ranks' lines joined (no line "
              "atomicity); the bytes are still all there.")
        print()

    print("**Bytes received per host** (one untimed `hostname` job, every byte the host's "
          "network port delivered: SSH, TCP/IP headers, output connections; least and most "
          "over the hosts)\n")
    labels_sent = sorted({label for label, _ in received},
                         key=lambda x: (not x.startswith("mslaunch"), x))
    print(C.markdown_table(["launcher"] + [f"{n} hosts" for n in bed_sizes],
                           [[label] + [f"{received[(label, n)][0]}–{received[(label, n)][1]}"
                                       if (label, n) in received else "" for n in bed_sizes]
                            for label in labels_sent]))
    print()
    notes = C.failures(results, labels)
    if notes:
        print(notes + "\n")
    if left:
        print("Processes other than sshd left on the hosts after the rounds:\n"
              + "\n".join(f"- {x}" for x in left) + "\n")
    return 1 if notes or left else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
