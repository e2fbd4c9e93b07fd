"""The Python API's two calls, both ends: :func:`run` (a command line) and
:func:`launch` (a function on every rank, its return values back).

Either runs the ``mslaunch`` command in a child process (:func:`start`), so
nothing of the job stays in the caller.  :func:`launch` runs, on every rank,
``python -c`` of :data:`RANK_START`, which calls :func:`rank_main`: the
function, found by its module and name (a script's own by running the
script as ``__mp_main__``, as ``multiprocessing``'s spawn does; a
notebook's pickled by value with cloudpickle), is called with the
arguments, and its return value, or its exception, is written to the rank's
stdout as frame lines (:func:`frame_lines`).  Frames ride the ranks' own
output, so they come back from every host the way output does, whole lines
each (the launcher passes on a rank's output line by line).  The caller
takes them out of the stream (:class:`Frames`) and passes every other byte
on to its own ``sys.stdout``.  A frame line starts with a byte no text has
(``\\x1e``) and the job's random token, so no output is taken for one.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    import subprocess
    from typing import IO, Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

#: What each rank of :func:`launch` runs after ``python -u -c``; its one
#: argument is the directory this package was found in.
RANK_START = ("import sys; sys.path.append(sys.argv.pop(1)); "
              "from mslaunch.api import rank_main; rank_main()")
#: The frame lines' mark; the token follows it.
MARK = b"\x1emslaunch-call:"
#: Base64 characters per frame line (the launcher passes lines whole up to 1 MiB).
PIECE = 48 * 1024
#: The environment variable that carries the call (base64), in pieces of this many
#: characters (the kernel takes at most 128 KiB per variable) and at most this many.
CALL_PIECE, CALL_TOTAL = 96 * 1024, 1024 * 1024


def start(words: Sequence[str], **popen: Any) -> subprocess.Popen[bytes]:
    """The ``mslaunch`` command with ``words`` (after its name), started from this
    very package and interpreter, whatever the caller's ``PYTHONPATH``."""
    import subprocess
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass
    begin = ("import sys; sys.argv[0] = 'mslaunch'; sys.path.insert(0, sys.argv.pop(1)); "
             "from mslaunch.__main__ import main; main()")
    # (the command ends its job when this process dies: see mslaunch.__main__)
    env = dict(popen.pop("env", None) or os.environ, MSLAUNCH_CALLER=str(os.getpid()))
    return subprocess.Popen([sys.executable, "-c", begin, _where(), *words], close_fds=True,
                            env=env, **popen)


def _where() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(argv: Sequence[str]) -> int:
    """See :func:`mslaunch.run`."""
    if isinstance(argv, (str, bytes)):
        raise TypeError("mslaunch.run() takes a list of words, e.g. ['-n', '2', 'prog'], "
                        "not a string")
    return wait(start([str(word) for word in argv]))


def wait(child: subprocess.Popen[bytes]) -> int:
    """The job's exit status, passing on SIGTERM and SIGHUP meanwhile (main thread
    only: elsewhere handlers cannot be set); KeyboardInterrupt once the job
    stopped, if SIGINT came meanwhile."""
    import signal
    import threading
    previous = {}
    interrupted = []
    if threading.current_thread() is threading.main_thread():
        def forward(signum: int, frame: object) -> None:
            if signum != signal.SIGINT:     # Ctrl-C reached the job's process group too
                child.send_signal(signum)
            else:
                interrupted.append(signum)
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            previous[signum] = signal.signal(signum, forward)
    try:
        code = child.wait()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if interrupted:
        raise KeyboardInterrupt
    return 128 - code if code < 0 else code


class RankFailed(Exception):
    """The first failure of a :func:`launch` job: its rank, host, exit status
    (the job's, as the command's) and the rank's traceback, if it raised.
    Raised itself when the rank raised nothing (killed, exited, lost), else
    the cause (``__cause__``) of the rank's own exception, raised here."""

    def __init__(self, message: str, *, rank: Optional[int], host: Optional[str],
                 status: int, traceback: str = "") -> None:
        super().__init__(message)
        self.rank, self.host, self.status, self.traceback = rank, host, status, traceback

    def __reduce__(self) -> Tuple[Any, Tuple[Any, ...]]:
        # (keyword-only fields: a nested launch's failure pickles whole)
        return _rank_failed, (str(self), self.rank, self.host, self.status, self.traceback)


def _rank_failed(message: str, rank: Optional[int], host: Optional[str], status: int,
                 traceback: str) -> RankFailed:
    return RankFailed(message, rank=rank, host=host, status=status, traceback=traceback)


# --- the caller's end ---------------------------------------------------------------

def launch(fn: Callable[..., Any], args: Tuple[Any, ...], *, nprocs: int = 1,
           hosts: Union[None, str, Sequence[str]] = None, max_restarts: int = 0,
           options: Sequence[str] = ()) -> List[Any]:
    """See :func:`mslaunch.launch`."""
    import secrets
    import tempfile
    _whole("nprocs", nprocs, 1)
    _whole("max_restarts", max_restarts, 0)
    if isinstance(options, (str, bytes)):
        raise TypeError("options: a list of words, e.g. ['--bind-to', 'core'], not a string")
    env = dict(os.environ)
    names = _put_call(env, _call(fn, args))
    token = secrets.token_hex(8)
    env["MSLAUNCH_CALL_TOKEN"] = token
    words = [str(w) for w in options]
    if hosts is not None:
        words += ["-H", hosts if isinstance(hosts, str) else ",".join(hosts)]
    if max_restarts:
        words += ["--max-restarts", str(max_restarts)]
    for name in names + ["MSLAUNCH_CALL_TOKEN"]:
        words += ["-x", name]
    with tempfile.TemporaryDirectory(prefix="mslaunch-call-") as tmp:
        report = os.path.join(tmp, "report.json")
        words += ["--report-json", report, "-n", str(nprocs), sys.executable, "-u", "-c",
                  RANK_START, _where()]
        status, frames = _run_framed(words, env, token)
        ranks = _read_report(report)
    return outcome(status, frames, ranks, nprocs)


def _whole(name: str, value: object, low: int) -> None:
    if type(value) is not int or value < low:
        raise ValueError(f"{name}={value!r}: expected a whole number from {low}")


def _call(fn: Callable[..., Any], args: Tuple[Any, ...]) -> bytes:
    """The pickled call: the function (by reference, or by value where it has no
    name to be found by), the arguments, the caller's path and main script."""
    import pickle
    if not callable(fn):
        raise TypeError(f"mslaunch.launch: {fn!r} is not callable")
    main = sys.modules.get("__main__")
    main_file = getattr(main, "__file__", None)
    by_value = getattr(fn, "__module__", None) == "__main__" and not main_file
    qualname = getattr(fn, "__qualname__", "")
    if by_value or "<locals>" in qualname or "<lambda>" in qualname:
        try:
            import cloudpickle  # type: ignore[import-not-found]
        except ImportError:
            raise TypeError(
                f"mslaunch.launch: {qualname or fn!r} has no name the ranks can find it by "
                f"(defined in a notebook, at the prompt or inside a function): define it at "
                f"the top of a module, or install cloudpickle to send it by value") from None
        function = cloudpickle.dumps(fn)
    else:
        try:
            function = pickle.dumps(fn, protocol=4)
        except (pickle.PicklingError, TypeError, AttributeError) as err:
            raise TypeError(f"mslaunch.launch: {fn!r} cannot be sent to the ranks: "
                            f"{err}") from None
    try:
        arguments = pickle.dumps(args, protocol=4)
    except Exception as err:
        raise TypeError(f"mslaunch.launch: the arguments cannot be pickled: {err}") from None
    # The caller's script runs on every rank, as multiprocessing's spawn runs it:
    # what the function, its arguments (a partial, an instance) or a nested
    # launch take from it is found there.  A package's __main__ (python -m pkg,
    # pytest's) only when the function is its own, as spawn leaves it out.
    spec = getattr(getattr(main, "__spec__", None), "name", None)
    package_main = isinstance(spec, str) and spec.endswith("__main__")
    in_main = bool(main_file) and not by_value and (
        not package_main or getattr(fn, "__module__", None) == "__main__")
    # python -m pkg.mod (or pkg): found again by that name (its relative imports need it)
    main_name = spec if in_main and spec and spec != "__main__" else None
    main_path = os.path.abspath(str(main_file)) if in_main and main_name is None else None
    return pickle.dumps({"function": function, "args": arguments, "main": main_path,
                         "main_module": main_name,
                         "argv": list(sys.argv),
                         "path": [os.path.abspath(p) if p else "" for p in sys.path]},
                        protocol=4)


def _put_call(env: Dict[str, str], call: bytes) -> List[str]:
    """Put the call into ``env`` in pieces; their names."""
    import base64
    text = base64.b64encode(call).decode()
    if len(text) > CALL_TOTAL:
        raise ValueError(f"mslaunch.launch: the function and its arguments pickle to "
                         f"{len(call)} bytes; they travel in the ranks' environment, "
                         f"{CALL_TOTAL * 3 // 4 // 1024} KiB at most: pass a path to the "
                         f"data instead")
    names = []
    for n, at in enumerate(range(0, len(text), CALL_PIECE)):
        names.append(f"MSLAUNCH_CALL_{n}")
        env[names[-1]] = text[at:at + CALL_PIECE]
    return names


def _run_framed(words: Sequence[str], env: Dict[str, str], token: str
                ) -> Tuple[int, Frames]:
    """Run the job with its output passed on, frames taken out of its stdout."""
    import subprocess
    import threading
    frames = Frames(token)
    child = start(words, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                  stderr=subprocess.PIPE)
    pumps = [threading.Thread(target=frames.pump, args=(child.stdout, _sink(sys.stdout))),
             threading.Thread(target=_pump, args=(child.stderr, _sink(sys.stderr)))]
    for pump in pumps:
        pump.daemon = True
        pump.start()
    try:
        status = wait(child)
    finally:
        for pump in pumps:
            pump.join()
    return status, frames


def _sink(stream: Any) -> Callable[[bytes], None]:
    """Write bytes to a text stream (its buffer when it has one: a notebook's has
    none, and the ranks' output then shows in the cell)."""
    import codecs
    if stream is None:          # (no stdout here, as under pythonw or with it closed)
        return lambda data: None
    buffer = getattr(stream, "buffer", None)
    # (a character cut between two reads is decoded whole)
    decode = codecs.getincrementaldecoder("utf-8")(errors="replace").decode

    def write(data: bytes) -> None:
        try:
            if buffer is not None:
                buffer.write(data)
                buffer.flush()
            else:
                stream.write(decode(data))
                stream.flush()
        except (OSError, ValueError):
            pass
    return write


def _pump(pipe: IO[bytes], write: Callable[[bytes], None]) -> None:
    with pipe:
        while True:
            data = pipe.read1(1 << 16)  # type: ignore[attr-defined]
            if not data:
                return
            write(data)


class Frames:
    """The frame lines of one job's stdout, taken out as it is passed on:
    ``(attempt, rank) -> (kind, pickled value)`` once all of a frame's pieces came."""

    def __init__(self, token: str) -> None:
        self.mark = MARK + token.encode() + b":"
        self.done: Dict[Tuple[int, int], Tuple[str, bytes]] = {}
        self._pieces: Dict[Tuple[int, int], List[bytes]] = {}
        self._open = False        # whether the output passed on ends inside a line

    def pump(self, pipe: IO[bytes], write: Callable[[bytes], None]) -> None:
        held = [b""]

        def take(data: bytes) -> None:
            held[0] = self.feed(held[0] + data, write)
        _pump(pipe, take)
        if held[0]:
            write(held[0])

    def feed(self, data: bytes, write: Callable[[bytes], None]) -> bytes:
        """Pass on ``data`` but its frame lines; what is held back (the start of
        what may still be one of this job's frame lines)."""
        out: List[bytes] = []
        while data:
            at = data.find(b"\x1e")
            if at < 0:
                out.append(data)
                data = b""
                break
            out.append(data[:at])
            end = data.find(b"\n", at)
            if end < 0:
                rest = data[at:]
                if self.mark.startswith(rest[:len(self.mark)]) and len(rest) < 2 * PIECE:
                    data = rest
                    break
                stop = data.find(b"\x1e", at + 1)      # (not a frame: on to the next)
                stop = len(data) if stop < 0 else stop
                out.append(data[at:stop])
                data = data[stop:]
                continue
            line, data = data[at:end + 1], data[end + 1:]
            begin = line.find(self.mark)       # (after stray \x1e bytes of the rank's own)
            if begin < 0 or not self._take(line[begin + len(self.mark):-1]):
                out.append(line)
                continue
            out.append(line[:begin])
            if self._ends_open(out):
                out.append(b"\n")     # (the rank's partial line ends where its frame was)
        text = b"".join(out)
        if text:
            self._open = not text.endswith(b"\n")
            write(text)
        return data

    def _ends_open(self, out: List[bytes]) -> bool:
        last = next((part for part in reversed(out) if part), None)
        return self._open if last is None else not last.endswith(b"\n")

    def _take(self, body: bytes) -> bool:
        import base64
        try:
            attempt, rank, kind, index, count, piece = body.split(b":", 5)
            key, n, total = (int(attempt), int(rank)), int(index), int(count)
            chunk = base64.b64decode(piece, validate=True)
        except ValueError:
            return False
        got = self._pieces.setdefault(key, [])
        if n != len(got) or not 0 <= n < total:
            return False
        got.append(chunk)
        if len(got) == total:
            self.done[key] = (kind.decode(), b"".join(self._pieces.pop(key)))
        return True


def _read_report(path: str) -> Dict[str, Any]:
    import json
    try:
        with open(path) as f:
            return dict(json.load(f))
    except (OSError, ValueError):
        return {}


def outcome(status: int, frames: Frames, report: Dict[str, Any], nprocs: int) -> List[Any]:
    """The ranks' return values in rank order, or the first failure raised."""
    # (a rank ran the caller's script as __mp_main__: its classes are found in
    # __main__ here, while the values are unpickled)
    alias = "__main__" in sys.modules and "__mp_main__" not in sys.modules
    if alias:
        sys.modules["__mp_main__"] = sys.modules["__main__"]
    try:
        return _outcome(status, frames, report, nprocs)
    finally:
        if alias:
            sys.modules.pop("__mp_main__", None)


def _outcome(status: int, frames: Frames, report: Dict[str, Any], nprocs: int) -> List[Any]:
    import pickle
    attempts = report.get("attempts") or [{"attempt": 0}]
    last = int(attempts[-1].get("attempt", len(attempts) - 1))
    if status == 0:
        values = []
        for n in range(nprocs):
            kind, body = frames.done.get((last, n), ("", b""))
            if kind != "ok":
                raise RankFailed(f"rank {n} ended with 0 but returned nothing (was its "
                                 f"output sent elsewhere, by --output-filename?)",
                                 rank=n, host=None, status=0)
            try:
                values.append(pickle.loads(body))
            except Exception as err:
                raise RankFailed(f"rank {n}'s return value cannot be unpickled here: "
                                 f"{type(err).__name__}: {err}", rank=n, host=None,
                                 status=0) from None
        return values
    first = report.get("first_failure") or {}
    rank, host = first.get("rank"), first.get("host")
    kind, body = frames.done.get((last, rank), ("", b"")) if rank is not None else ("", b"")
    if kind == "err":
        error, text = _exception(body)
        failed = RankFailed(f"rank {rank} on {host} raised {_first_line(text)}", rank=rank,
                            host=host, status=status, traceback=text)
        if error is not None:
            if hasattr(error, "add_note"):
                error.add_note(f"(raised by rank {rank} on {host}, in mslaunch.launch)")
            raise error from failed
        raise failed
    signal, code = first.get("signal"), first.get("exit_code")
    reason = first.get("reason") or (
        f"was killed by signal {signal} ({first.get('signal_name')})" if signal else
        f"exited with code {code}" if code else f"the job ended with {status}")
    where = f"rank {rank} on {host}: " if rank is not None else ""
    raise RankFailed(f"{where}{reason} (exit status {status})", rank=rank, host=host,
                     status=status)


def _exception(body: bytes) -> Tuple[Optional[BaseException], str]:
    import pickle
    try:
        text, pickled = pickle.loads(body)
    except Exception:
        return None, ""
    try:
        error = pickle.loads(pickled) if pickled else None
    except Exception:
        error = None
    return (error if isinstance(error, BaseException) else None), str(text)


def _first_line(text: str) -> str:
    """The exception's own line of a traceback's text (``ValueError: ...``): the
    first line at the margin after the last block of frames (its notes follow)."""
    said, frames = "", False
    for line in text.splitlines():
        if line.startswith("Traceback ("):
            frames = True
        elif frames and line[:1] not in (" ", "\t"):
            said, frames = line.strip(), False
    return said or "an exception"


# --- the rank's end -----------------------------------------------------------------

def frame_lines(token: str, attempt: int, rank: int, kind: str, value: bytes) -> bytes:
    """``value`` as frame lines: the mark and token, then
    ``ATTEMPT:RANK:KIND:INDEX:COUNT:BASE64``, one piece a line."""
    import base64
    text = base64.b64encode(value)
    pieces = [text[at:at + PIECE] for at in range(0, len(text), PIECE)] or [b""]
    head = MARK + f"{token}:{attempt}:{rank}:{kind}:".encode()
    return b"".join(head + f"{n}:{len(pieces)}:".encode() + piece + b"\n"
                    for n, piece in enumerate(pieces))


def rank_main() -> None:
    """One rank of :func:`launch`: call the function, write its frames, exit."""
    import base64
    import pickle
    env = os.environ
    token = env.pop("MSLAUNCH_CALL_TOKEN", "")
    parts, n = [], 0
    while f"MSLAUNCH_CALL_{n}" in env:
        parts.append(env.pop(f"MSLAUNCH_CALL_{n}"))
        n += 1
    if not token or not parts:
        sys.exit("mslaunch: this program is run by mslaunch.launch() on its ranks")
    call = pickle.loads(base64.b64decode("".join(parts)))
    rank, attempt = int(env.get("RANK", "0")), int(env.get("MSLAUNCH_RESTART_COUNT", "0"))
    # The frames' own copy of stdout: the function may point descriptor 1 elsewhere.
    frames_fd = os.dup(1)
    sys.path[:] = [p for p in call["path"] if not p or os.path.exists(p)] + \
        [p for p in sys.path if p not in call["path"]]
    sys.argv = list(call["argv"])
    try:
        if call["main"] or call.get("main_module"):
            _main_as_spawn_does(call["main"], call.get("main_module"))
        value = pickle.loads(call["function"])(*pickle.loads(call["args"]))
        kind, body = "ok", pickle.dumps(value, protocol=4)
    except Exception as error:
        import traceback
        # (from the function's own frame down: this one is the launcher's)
        below = error.__traceback__.tb_next if error.__traceback__ is not None else None
        text = "".join(traceback.format_exception(type(error), error, below))
        sys.stderr.write(text)
        try:
            pickled = pickle.dumps(error, protocol=4)
        except Exception:
            pickled = b""
        kind, body = "err", pickle.dumps((text, pickled), protocol=4)
    sys.stdout.flush()
    sys.stderr.flush()
    frames = memoryview(frame_lines(token, attempt, rank, kind, body))
    while frames:
        frames = frames[os.write(frames_fd, frames):]
    sys.exit(0 if kind == "ok" else 1)


def _main_as_spawn_does(path: Optional[str], name: Optional[str]) -> None:
    """The caller's script (or ``python -m`` module) as ``__mp_main__`` (its ``if
    __name__ == "__main__"`` part not run), also known as ``__main__`` so that its
    functions are found."""
    import runpy
    import types
    module = types.ModuleType("__mp_main__")
    sys.modules["__main__"] = sys.modules["__mp_main__"] = module
    if name:
        module.__dict__.update(runpy.run_module(name, run_name="__mp_main__",
                                                alter_sys=True))
    else:
        module.__dict__.update(runpy.run_path(str(path), run_name="__mp_main__"))
