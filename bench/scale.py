"""What the launcher pays per SSH host, up to the largest bed this machine holds.

One SSH test bed per host count (``tests/support/sshbed.py``: a real ``sshd`` per
network namespace, 200 at most), one rank per host.  For each count,
``--runs`` interleaved rounds of:

``pass``
    ``mslaunch -H h1,..,hH -n H python -c pass`` (paramiko, the default
    starter: from 8 hosts on, in helper processes): wall time; the
    launcher's CPU seconds, with its reaped children (``wait4``: the SSH
    helpers) and its own alone (all its threads); its own peak RSS
    (``VmHWM``) and largest count of open descriptors, sampled every 20 ms.
``inside``
    ``pass`` with ``MSLAUNCH_SSH_HELPERS=0``: paramiko inside the launcher.
``fence``
    the same job running ``bench/_fence.py``, a PMI-1 client: every rank puts a
    key and fences twice; rank 0 prints how long the second fence took, when
    every rank is already up (the fence alone, through the agents and the
    launcher, not the ranks' start).
``openssh``
    ``pass`` with the OpenSSH client as the rsh agent (``--mca plm_rsh_agent``):
    the launcher's own CPU then leaves SSH's cryptography to its ``ssh``
    children, which shows what mslaunch itself costs per host.

Then per-host figures: the slope between the two largest counts (what each
added host costs where it matters) and the least-squares fit over all.  The
launcher runs in-process under a small wrapper that prints its own and its
children's CPU after the job (``wait4`` alone gives their sum).

    python bench/scale.py [--hosts 16,64,200] [--runs 3] [--profile N]

The hosts' logins do not read this user's ``~/.bashrc`` (``--login-rc``: they
do).  ``--profile N`` also samples one ``pass`` job at N hosts with py-spy (every
thread) and lists the functions that were running most.  Compile the sources
first (``python -m compileall mslaunch``), or imports dominate the samples.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
import time
from typing import Dict, List, Optional, Sequence, Tuple

import _common as C
import remote as R

FENCE = str(C.BENCH_DIR / "_fence.py")


def _launcher(extra: Sequence[str] = ()) -> List[str]:
    return [sys.executable, *extra, "-m", "mslaunch"]


#: mslaunch run in-process, then its own CPU (all its threads, paramiko's too)
#: and its reaped children's (the OpenSSH clients of the rsh-agent mode) said
#: apart on stderr: ``wait4`` alone gives only their sum.
SELF = ("import os, resource, sys\n"
        "from mslaunch.cli import main\n"
        "sys.argv[0] = 'mslaunch'\n"
        "code = main()\n"
        "own = resource.getrusage(resource.RUSAGE_SELF)\n"
        "kids = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
        "sys.stderr.write(f'\\nbench-cpu {own.ru_utime + own.ru_stime:.4f} '\n"
        "                 f'{kids.ru_utime + kids.ru_stime:.4f}\\n')\n"
        "sys.stderr.flush()\n"
        "os._exit(code)\n")


def _env(bed: R.Bed) -> Dict[str, str]:
    env = C.base_environ()
    env["HOME"] = bed.home
    env["PYTHONPATH"] = str(C.REPO_ROOT)
    return env


def one(bed: R.Bed, n: int, program: Sequence[str], timeout: float,
        openssh: bool = False, helpers: Optional[str] = None
        ) -> Tuple[R.Measured, str, Optional[float]]:
    """A run, its stdout, and the launcher's own CPU seconds (without children);
    ``helpers``: ``MSLAUNCH_SSH_HELPERS``, if given."""
    extra = ["--mca", "plm_rsh_agent", bed.ssh] if openssh else []
    argv = [sys.executable, "-c", SELF, "-H", ",".join(bed.hosts), "-n", str(n), *extra,
            *program]
    env = _env(bed)
    if helpers is not None:
        env["MSLAUNCH_SSH_HELPERS"] = helpers
    m = R.run_measured(argv, env, keep_stdout=True, timeout=timeout, sample="self")
    found = re.search(rb"bench-cpu ([0-9.]+) ([0-9.]+)", m.res.stderr)
    return m, b"".join(m.chunks).decode(errors="replace"), \
        float(found.group(1)) if found else None


def profile(bed: R.Bed, n: int, timeout: float) -> None:
    """One ``pass`` job sampled by py-spy (every thread: paramiko's transports run
    in threads of their own), summed by function: own samples and inclusive."""
    spy = os.path.join(os.path.dirname(sys.executable), "py-spy")
    if not os.access(spy, os.X_OK):
        C.log("bench: --profile needs py-spy (pip install 'mslaunch[stacks]')")
        return
    out = tempfile.mktemp(prefix="mslaunch-scale-", suffix=".txt")
    argv = [spy, "record", "--format", "raw", "--rate", "1000", "--threads",
            "-o", out, "--"] + _launcher() + ["-H", ",".join(bed.hosts), "-n", str(n),
                                             sys.executable, "-c", "pass"]
    m = R.run_measured(argv, _env(bed), timeout=timeout)
    if m.res.failure() or not os.path.exists(out):
        C.log(f"bench: the profiled run failed: {m.res.failure()}")
        return
    own: Dict[str, int] = {}
    inclusive: Dict[str, int] = {}
    total = 0
    with open(out) as f:
        for line in f:
            stack, _, count = line.rstrip().rpartition(" ")
            frames = [fr for fr in stack.split(";")[1:]]     # (the thread first)
            if not frames or not count.isdigit():
                continue
            k = int(count)
            if "(idle)" in frames[-1] or any(w in frames[-1] for w in IDLE):
                continue
            total += k
            own[_short(frames[-1])] = own.get(_short(frames[-1]), 0) + k
            for fr in set(_short(x) for x in frames):
                inclusive[fr] = inclusive.get(fr, 0) + k
    os.unlink(out)
    C.log(f"bench: py-spy of one `-n {n} python -c pass` over {n} hosts: {total} busy "
          f"samples at 1 kHz, all threads (the run took {m.res.seconds * 1000:.0f} ms)")
    for title, table in (("own", own), ("inclusive", inclusive)):
        C.log(f"  top functions, {title} samples:")
        for name, k in sorted(table.items(), key=lambda kv: -kv[1])[:25]:
            C.log(f"    {k:6d}  {100 * k / max(total, 1):5.1f}%  {name}")


#: Leaf frames where a thread waits rather than works.
IDLE = ("wait (threading.py", "select (", "poll (", "acquire", "_wait_for_tstate_lock",
        "recv (", "read (socket", "sleep")


def _short(frame: str) -> str:
    name, _, where = frame.partition(" (")
    where = where.rstrip(")")
    path, _, line = where.rpartition(":")
    parts = path.split("/")
    keep = "/".join(parts[-2:]) if len(parts) > 1 else path
    return f"{name} ({keep})"


def slope(points: Sequence[Tuple[int, Optional[float]]]) -> Optional[float]:
    pts = [(x, y) for x, y in points if y is not None]
    if len(pts) < 2:
        return None
    (x0, y0), (x1, y1) = pts[-2], pts[-1]
    return (y1 - y0) / (x1 - x0)


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", default="16,64,200", help="host counts (default 16,64,200)")
    parser.add_argument("--runs", type=int, default=3, help="rounds (default 3)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per job")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="also profile one job at N hosts (one of --hosts)")
    parser.add_argument("--tmpdir", default=None, help="where the beds' directories go")
    parser.add_argument("--login-rc", action="store_true",
                        help="let the hosts' logins read this user's ~/.bashrc (hidden by "
                             "default)")
    args = parser.parse_args(argv)
    sizes = sorted({int(x) for x in args.hosts.split(",") if x.strip()})
    root = tempfile.mkdtemp(prefix="mslaunch-bench-scale-", dir=args.tmpdir)
    t0 = time.perf_counter()
    # Plain logins (the user's ~/.bashrc hidden on every host): a login killed while
    # it ran `pyenv rehash` would leave pyenv's lock behind, and every later login
    # of this user waits 60 s on it.
    beds = R.start_beds(sizes, root, plain_login=not args.login_rc)
    rows: Dict[Tuple[str, int], List[R.Measured]] = {}
    fences: Dict[int, List[float]] = {}
    own: Dict[Tuple[str, int], List[float]] = {}
    failed: List[str] = []
    try:
        C.log(f"bench: beds of {', '.join(map(str, sizes))} hosts started in "
              f"{time.perf_counter() - t0:.1f} s; load {os.getloadavg()[0]:.2f}")
        for n in sizes:     # a first job builds the agents' package cache: not counted
            one(beds[n], n, [sys.executable, "-c", "pass"], args.timeout)
        for _ in range(args.runs):
            for n in sizes:
                for case, program, openssh, helpers in (
                        ("pass", [sys.executable, "-c", "pass"], False, None),
                        ("inside", [sys.executable, "-c", "pass"], False, "0"),
                        ("fence", [sys.executable, FENCE], False, None),
                        ("openssh", [sys.executable, "-c", "pass"], True, None)):
                    m, out, own_cpu = one(beds[n], n, program, args.timeout, openssh,
                                          helpers)
                    if m.res.failure():
                        failed.append(f"{case} at {n}: {m.res.failure()}")
                        C.log(f"bench: {case} at {n} hosts failed; its stderr's end:\n"
                              + m.res.stderr.decode(errors="replace")[-3000:])
                        continue
                    rows.setdefault((case, n), []).append(m)
                    if own_cpu is not None:
                        own.setdefault((case, n), []).append(own_cpu * 1000)
                    if case == "fence":
                        found = re.search(r"fence_ms ([0-9.]+)", out)
                        if found:
                            fences.setdefault(n, []).append(float(found.group(1)))
        if args.profile in beds:
            profile(beds[args.profile], args.profile, args.timeout)
        left = R.leftovers(beds)
    finally:
        R.stop_beds(beds)

    def med(case: str, n: int, get) -> Optional[float]:
        vals = [get(m) for m in rows.get((case, n), []) if get(m) is not None]
        return statistics.median(vals) if vals else None

    wall = [(n, med("pass", n, lambda m: m.res.seconds * 1000)) for n in sizes]
    cpu = [(n, med("pass", n, lambda m: m.cpu * 1000)) for n in sizes]

    def own_med(case: str, n: int) -> Optional[float]:
        vals = own.get((case, n), [])
        return statistics.median(vals) if vals else None
    own_cpu = [(n, own_med("pass", n)) for n in sizes]
    own_ssh = [(n, own_med("openssh", n)) for n in sizes]
    own_in = [(n, own_med("inside", n)) for n in sizes]
    wall_in = [(n, med("inside", n, lambda m: m.res.seconds * 1000)) for n in sizes]
    cpu_in = [(n, med("inside", n, lambda m: m.cpu * 1000)) for n in sizes]
    wall_ssh = [(n, med("openssh", n, lambda m: m.res.seconds * 1000)) for n in sizes]
    cpu_ssh = [(n, med("openssh", n, lambda m: m.cpu * 1000)) for n in sizes]
    rss = [(n, med("pass", n, lambda m: m.hwm_kib / 1024 if m.hwm_kib else None))
           for n in sizes]
    fds = [(n, med("pass", n, lambda m: m.fds)) for n in sizes]
    fence = [(n, statistics.median(fences[n]) if n in fences else None) for n in sizes]
    table = [("wall ms", wall, "{:.0f}"),
             ("launcher CPU ms, with its SSH helpers", cpu, "{:.0f}"),
             ("launcher's own CPU ms (SSH in helpers from 8 hosts on)", own_cpu, "{:.0f}"),
             ("paramiko in the launcher (MSLAUNCH_SSH_HELPERS=0): wall ms", wall_in, "{:.0f}"),
             ("paramiko in the launcher: CPU ms", cpu_in, "{:.0f}"),
             ("paramiko in the launcher: its own CPU ms", own_in, "{:.0f}"),
             ("OpenSSH client as rsh agent: wall ms", wall_ssh, "{:.0f}"),
             ("OpenSSH client as rsh agent: CPU ms, with its `ssh` children", cpu_ssh,
              "{:.0f}"),
             ("OpenSSH client as rsh agent: the launcher's own CPU ms", own_ssh, "{:.0f}"),
             ("launcher peak RSS MiB", rss, "{:.1f}"), ("launcher open fds", fds, "{:.0f}"),
             ("fence ms (all ranks up)", fence, "{:.2f}")]
    head = ["`-n H python -c pass`, one rank per host"] + [f"{n} hosts" for n in sizes] \
        + [f"per host ({sizes[-2]}-{sizes[-1]})" if len(sizes) > 1 else "per host",
           "fit a + b·H"]
    body = []
    for name, points, fmt in table:
        cells = [fmt.format(v) if v is not None else "-" for _, v in points]
        k = slope(points)
        fit = R.line_fit(points)
        body.append([name] + cells + [f"{k:.3g}" if k is not None else "-",
                                      f"{fit[0]:.3g} + {fit[1]:.3g}·H" if fit else "-"])
    print(C.markdown_table(head, body))
    print(f"\n{args.runs} round(s), medians; load average at the end "
          f"{os.getloadavg()[0]:.2f}; {os.cpu_count()} cores")
    for line in failed:
        print(f"- FAILED {line}")
    for line in left:
        print(f"- left on a host: {line}")
    return 1 if failed or left else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
