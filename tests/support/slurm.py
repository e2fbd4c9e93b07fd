"""Jobs on the Slurm test bed (:mod:`slurmbed`): under ``salloc`` (mslaunch in the
root namespace, which is not a node) and as ``sbatch`` scripts (mslaunch on h1)."""

from __future__ import annotations

import os
from typing import Dict, Optional, Sequence

from helpers import PY, clean_env, cmd, new_tag, tagged_pids


def cmdline(pid: int) -> bytes:
    """A process's command line; b"" for one that has gone meanwhile."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def benv(bed, tag: str, **extra: str):
    """The environment of a job on the bed, tagged ``tag``, plus ``extra``."""
    return bed.env(base=clean_env(MSL_TEST_TAG=tag, UCX_TLS="tcp",
                                  MSLAUNCH_HEARTBEAT="0.3,5", **extra))


def salloc(bed, tag: str, *args: str, nodes: int = 2, per_node: int = 2,
           extra_env: Optional[Dict[str, str]] = None, nodelist: Optional[str] = None,
           options: Sequence[str] = (), **kw):
    """``salloc -N nodes --ntasks-per-node=per_node [-w nodelist] [OPTIONS] mslaunch ARGS``
    (running)."""
    where = ["-w", nodelist] if nodelist else []
    return bed.popen(["salloc", "-N", str(nodes), f"--ntasks-per-node={per_node}", *where,
                      *options, "-Q",
                      *cmd(*args)], env=None, base_env=benv(bed, tag, **(extra_env or {})),
                     stdout=-1, stderr=-1, **kw)


def finish(p, timeout: float = 60):
    """(exit status, stdout, stderr) of a job started by :func:`salloc`."""
    out, err = p.communicate(timeout=timeout)
    return p.returncode, out.decode(errors="replace"), err.decode(errors="replace")


def finish_read(p, lines, timeout: float = 60):
    """(exit status, stdout, stderr) of a job started by :func:`salloc` whose
    stderr ``lines`` (a :class:`helpers.StderrLines`) reads as it comes:
    ``communicate`` would read stderr too, and take some of its lines."""
    import threading
    out: list = []
    reader = threading.Thread(target=lambda: out.append(p.stdout.read()), daemon=True)
    reader.start()
    code = p.wait(timeout=timeout)
    reader.join(60)
    return code, (out[0] if out else b"").decode(errors="replace"), lines.text()


def left_on_nodes(bed, tag: str) -> list:
    """The processes of the job tagged ``tag`` still alive (on any node)."""
    return [pid for pid in tagged_pids(tag) if os.path.exists(f"/proc/{pid}")]


def wrapper_script(tmp_path) -> str:
    """A launch agent's wrapper (a container's runner, say) that notes where it ran,
    and passes on none of its environment but PATH (as some runners do not)."""
    path = tmp_path / "wrap.sh"
    path.write_text(f'#!/bin/sh\necho "$(hostname) $1" >> {tmp_path / "wrapped"}\n'
                    f'exec env -i PATH="$PATH" "$@"\n')
    path.chmod(0o755)
    return str(path)


def sbatch_lines(bed, tmp_path, launch: str, code: str) -> list:
    """Run ``exec python -m mslaunch LAUNCH python -c CODE`` as an sbatch script on
    both nodes (2 tasks each), which must complete; its output's rows that start
    with a digit, split."""
    tag = new_tag()
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\n"
                      f"exec {PY} -m mslaunch {launch} {PY} -c \"{code}\"\n")
    script.chmod(0o755)
    out_file = tmp_path / "out.txt"
    r = bed.run(["sbatch", "-N", "2", "--ntasks-per-node=2", "-o", str(out_file),
                 "--parsable", str(script)], base_env=benv(bed, tag), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    state = bed.wait_job(r.stdout.strip().split(";")[0], timeout=90)
    text = out_file.read_text()
    assert state.get("JobState") == "COMPLETED", (state, text)
    return sorted(line.split() for line in text.splitlines() if line[:1].isdigit())
