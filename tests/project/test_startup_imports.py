"""What ``mslaunch -n 1 true`` imports: a budget of the package's own modules,
and nothing of what only other jobs need (SSH, the PMIx server's library,
agents, frameworks), nor the Python modules whose C modules the package uses
(``mslaunch.core``).  Start-up speed is bought by this one mechanism --
a module imported where it is needed, held here -- not by hand at each site
(what is imported then runs from the code cache: test_codecache.py; under
``-X importtime``, as here, the cache stays out of the way).
"""

from __future__ import annotations

import subprocess
from typing import List

import pytest

from helpers import PY, clean_env

#: The package's modules a job of one local rank imports.  A new one on that
#: way is a cost for every job: import it where it is needed, or raise this
#: (with what ``python -X importtime`` says it costs) in the same change.
BUDGET = 53
#: What a local job must not import: the SSH starter and paramiko, the agents'
#: backend, the MPI services (the job's PMI, the PMI server, the PMIx host, its
#: door and the server's library, made when a rank speaks PMI or PMIx: see
#: mslaunch.mpi.early), the frameworks, the Python modules the package uses
#: the C modules of (``operator``'s among them), and ``resource`` (the soft limit
#: of open files is read with ``os.sysconf``; the module is loaded only to raise it).
FORBIDDEN = ("paramiko", "cryptography", "mslaunch.backends.agents", "mslaunch.agent",
             "mslaunch.wire", "mslaunch.mpi.pmi.server", "mslaunch.mpi.pmi.state",
             "mslaunch.mpi.pmi.wire", "mslaunch.mpi.pmix.lib", "mslaunch.mpi.pmix.server",
             "mslaunch.serve", "mslaunch.mpi.pmi.job", "mslaunch.mpi.pmi.singletons",
             "mslaunch.mpi.pmix.host", "mslaunch.mpi.pmix.door", "torch",
             "jax", "mindspore", "socket", "signal", "subprocess", "selectors", "ssl",
             "asyncio", "logging", "json", "ctypes", "resource", "operator")


#: The command's own start: Python without ``site`` (as the installed command
#: runs it), and without ``runpy`` (``-m``), which imports some of what is
#: forbidden (``operator``) before mslaunch does.
_COMMAND = "from mslaunch.__main__ import main; main()"


def _imported(env) -> List[str]:
    r = subprocess.run([PY, "-S", "-X", "importtime", "-c", _COMMAND, "-n", "1", "true"],
                       capture_output=True, env=env, timeout=120, cwd="/")
    assert r.returncode == 0, r.stderr
    return [line.rsplit("|", 1)[1].strip() for line in r.stderr.decode().splitlines()
            if line.startswith("import time:") and "|" in line]


def test_a_local_job_imports_its_budget_and_nothing_of_other_jobs(tmp_path):
    env = clean_env(XDG_CACHE_HOME=str(tmp_path / "cache"))
    _imported(env)     # the first job on a machine builds its caches (PMIx's template)
    names = _imported(env)
    ours = [n for n in names if n.startswith("mslaunch")]
    assert ours and len(ours) <= BUDGET, (len(ours), ours)
    found = [n for n in names if n.split(".")[0] in FORBIDDEN or n.startswith(FORBIDDEN)]
    assert found == [], found


#: Runs mslaunch with the words ``argv[2:]`` in this interpreter, noting in the
#: file ``argv[1]`` the launcher's forks and its import of the dialect ``argv[2]``
#: (the module that reads the line).
_ORDER = r"""
import os, sys
me, out, dialect = os.getpid(), open(sys.argv[1], "w"), sys.argv[2]
def note(event, args):
    if os.getpid() == me and (event == "os.fork" or event == "import" and
                              args[0] in (dialect, "mslaunch.plan")):
        out.write(f"{event} {args[0] if event == 'import' else ''}\n")
        out.flush()
sys.addaudithook(note)
sys.argv = ["mslaunch", *sys.argv[3:]]
from mslaunch.__main__ import main
main()
"""


@pytest.mark.parametrize("dialect, words", [
    ("mslaunch.cli.mpirun", ["-n", "1", "true"]),
    ("mslaunch.cli.deepspeed", ["--num_gpus", "1", "--no_python", "true"]),
])
def test_the_orphan_guard_is_forked_before_the_command_line_is_read(tmp_path, dialect, words):
    # Its watchdog moves the launcher into the job's cgroup, which waits for the
    # kernel: that wait overlaps the reading of the line and the planning.
    notes = tmp_path / "notes"
    r = subprocess.run([PY, "-c", _ORDER, str(notes), dialect, *words], capture_output=True,
                       env=clean_env(), timeout=120, cwd="/")
    assert r.returncode == 0, r.stderr
    events = notes.read_text().split()
    assert events[:3] == ["os.fork", "import", dialect], events
    assert "mslaunch.plan" in events, events
