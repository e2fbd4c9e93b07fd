"""``mslaunch-top [JOB] [--once] [--interval S]``: a live view of a running job.

One row per rank: host, pid, state (the kernel's letter, or how it ended),
CPU %, resident memory, seconds since it last wrote output and its last
line; under the rows, the job's timeline (ranks started, failures) as it
happens.  On a terminal the view is redrawn in place every ``--interval``
seconds until the job ends or ``q`` (or Ctrl-C) is pressed; piped, or with
``--once``, it is printed once.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Dict, List, Optional

from ..core.errors import LaunchError

USAGE = """\
usage: mslaunch-top [JOB] [--once] [--interval SECONDS]

A live view of a running mslaunch job: per rank host, pid, state, CPU %, RSS,
seconds since its last output and that line; the job's timeline below.
  JOB                the launcher's pid (mslaunch -v prints it) or the job id;
                     default: this user's only job on this machine
  --once             print one snapshot (the default when not on a terminal)
  --interval SECONDS seconds between refreshes (default 1)
  --version          mslaunch's version
Press q or Ctrl-C to leave; the job goes on.
"""


def _size(n: Optional[int]) -> str:
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "K", "M", "G"):
        if value < 1024 or unit == "G":
            return f"{value:.0f}{unit}" if unit == "B" else f"{value:.1f}{unit}"
        value /= 1024
    return "-"


def render(answer: Dict[str, Any], width: int = 120) -> List[str]:
    """The view's lines for one ``top`` answer."""
    job = answer.get("job") or {}
    rows = answer.get("rows") or []
    hosts = len({r.get("host") for r in rows})
    lines = [f"mslaunch-top: job {job.get('kvsname')} (launcher pid {job.get('pid')}), "
             f"{len(rows)} rank(s) on {hosts} host(s), up {answer.get('now', 0):.1f} s"
             + ("" if not job.get("ending") else f", ending ({job.get('ending')})"),
             f"{'RANK':>5} {'HOST':<12} {'PID':>8} {'STATE':<10} {'CPU%':>6} {'RSS':>7} "
             f"{'QUIET':>7}  LAST OUTPUT"]
    for r in rows:
        cpu = r.get("cpu")
        quiet = r.get("quiet")
        name = str(r.get("rank")) if r.get("job", 1) == 1 else f"{r.get('rank')}/{r.get('job')}"
        line = (f"{name:>5} {str(r.get('host'))[:12]:<12} {r.get('pid') or '-':>8} "
                f"{str(r.get('state'))[:10]:<10} "
                f"{'-' if cpu is None else f'{cpu:.1f}':>6} {_size(r.get('rss')):>7} "
                f"{'-' if quiet is None else f'{quiet:.0f}s':>7}  {r.get('line') or ''}")
        lines.append("".join(c if c.isprintable() else "?" for c in line)[:width])
    events = answer.get("events") or []
    if events:
        lines.append("timeline (seconds since the job started):")
        for when, text in events[-10:]:
            lines.append(f"  {when:+9.3f}  {text}")
    return [line[:width] for line in lines]   # a wrapped line would push the rest down


def _parse(args: List[str]):
    once = "--once" in args
    args = [a for a in args if a != "--once"]
    interval = 1.0
    if "--interval" in args:
        at = args.index("--interval")
        try:
            interval = float(args[at + 1])
        except (IndexError, ValueError):
            raise LaunchError("--interval needs a number of seconds") from None
        if not 0.1 <= interval <= 3600:
            raise LaunchError("--interval: between 0.1 and 3600 seconds")
        del args[at:at + 2]
    if len(args) > 1 or (args and args[0].startswith("-")):
        raise LaunchError(f"unexpected {args[-1]!r} (see mslaunch-top --help)")
    return (args[0] if args else None), once, interval


def main(argv: Optional[List[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if "-h" in args or "--help" in args:
        sys.stdout.write(USAGE)
        return 0
    if "-V" in args or "--version" in args:
        from .. import __version__
        sys.stdout.write(f"mslaunch-top {__version__}\n")
        return 0
    try:
        name, once, interval = _parse(args)
        from .attach import ask, find_job
        path, _ = find_job(name)
        if once or not sys.stdout.isatty():
            sys.stdout.write("\n".join(render(ask(path, {"op": "top"}, 10.0))) + "\n")
            return 0
        return _live(path, interval, ask)
    except LaunchError as err:
        sys.stderr.write(f"mslaunch-top: {err}\n")
        return 1
    except KeyboardInterrupt:
        return 0


def _live(path: str, interval: float, ask) -> int:
    """Redraw in place until the job ends or q is pressed."""
    import signal
    import termios
    import tty
    fd = sys.stdin.fileno() if sys.stdin.isatty() else None
    saved = termios.tcgetattr(fd) if fd is not None else None
    out = sys.stdout
    # a new terminal size wakes the wait below (SIGWINCH's byte on a pipe): the
    # last answer is drawn again at once, at the new size
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    old_wake = signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    old_winch = signal.signal(signal.SIGWINCH, lambda *_: None)
    out.write("\x1b[?1049h\x1b[?25l")          # the alternate screen, no cursor
    try:
        if fd is not None:
            tty.setcbreak(fd)
        while True:
            try:
                answer = ask(path, {"op": "top"}, 10.0)
            except LaunchError as err:
                if "ended" in str(err):
                    out.write("\x1b[?1049l\x1b[?25h")
                    out.write("mslaunch-top: the job has ended\n")
                    return 0
                raise
            deadline = time.monotonic() + interval
            resized: Optional[bool] = True
            while resized:
                size = os.get_terminal_size(out.fileno())
                lines = render(answer, size.columns)[:size.lines - 1]
                out.write("\x1b[H\x1b[2J" + "\n".join(lines) + "\n")
                out.flush()
                resized = _wait(fd, wake_r, deadline)
                if resized is None:
                    return 0
    finally:
        signal.signal(signal.SIGWINCH, old_winch)
        signal.set_wakeup_fd(old_wake)
        os.close(wake_r)
        os.close(wake_w)
        if saved is not None:
            termios.tcsetattr(fd, termios.TCSADRAIN, saved)  # type: ignore[arg-type]
        out.write("\x1b[?1049l\x1b[?25h")
        out.flush()


def _wait(fd: Optional[int], wake: int, deadline: float) -> Optional[bool]:
    """Until ``deadline``: True when the terminal was resized meanwhile, False at
    the deadline, None when q (or Ctrl-C) was pressed."""
    import select
    while (left := deadline - time.monotonic()) > 0:
        ready = select.select([wake] + ([fd] if fd is not None else []), [], [], left)[0]
        if wake in ready:
            try:
                os.read(wake, 64)
            except BlockingIOError:
                pass
            return True
        if fd is not None and fd in ready and os.read(fd, 1) in (b"q", b"Q", b"\x03"):
            return None
    return False


if __name__ == "__main__":
    sys.exit(main())
