"""``--launcher srun`` inside a real Slurm allocation: srun starts the ranks themselves.

The cluster is the Slurm test bed (:mod:`slurmbed`), as in ``test_slurm``:
mslaunch runs in the root namespace under ``salloc``, every rank on a node
(h1, h2), with no agent of mslaunch's there.  The same jobs run with
``--launcher slurm`` (agents) are the reference for what a rank sees.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from helpers import PROGRAMS, PY, comm, kill_tagged, new_tag, tagged_pids, wait_for
from netbed import parent_pid
from slurm import cmdline, finish, left_on_nodes, salloc

from mslaunch.backends.srunsteps.srunranks import OUTPUT_AFTER_END

pytestmark = pytest.mark.remote

#: The rank variables of every ecosystem a rank reads (see mslaunch.rankenv).
RANK_VARS = ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
             "OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_NODE_RANK", "PMI_RANK", "PMI_SIZE",
             "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "RANK_ID", "RANK_SIZE",
             "MPI_LOCALRANKID", "MPI_LOCALNRANKS", "GROUP_RANK", "MASTER_ADDR", "DEVICE_ID")
SHOW_VARS = ("import json, os, socket; print(json.dumps([socket.gethostname(), "
             "{k: os.environ.get(k) for k in %r}]), flush=True)" % (RANK_VARS,))


def srun_job(bed, tag, *args, **kw):
    return salloc(bed, tag, "--launcher", "srun", *args, **kw)


def _rows(out: str):
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("[")]
    return sorted(rows, key=lambda r: (r[0], r[1]["RANK"] or ""))


def test_ranks_see_what_they_see_under_agents_and_no_agent_runs(slurmbed, tmp_path):
    tag = new_tag()
    rc, out, err = finish(srun_job(slurmbed, tag, "-n", "4", PY, "-c", SHOW_VARS, cwd=tmp_path))
    assert rc == 0, err
    rc2, out2, err2 = finish(salloc(slurmbed, tag, "--launcher", "slurm", "-n", "4", PY, "-c",
                                    SHOW_VARS, cwd=tmp_path))
    assert rc2 == 0, err2
    got, want = _rows(out), _rows(out2)
    assert [r[0] for r in got] == ["h1", "h1", "h2", "h2"], out
    assert got == want
    assert err == "", err


def test_output_arrives_byte_for_byte_in_files_and_with_tags(slurmbed, tmp_path):
    tag = new_tag()
    blob = bytes(range(256)) * 400
    (tmp_path / "blob").write_bytes(blob)
    code = ("import os, sys; r = os.environ['RANK']; o = sys.stdout.buffer; "
            "o.write(open('blob', 'rb').read()); o.write(b'no newline ' + r.encode()); "
            "o.flush(); sys.stderr.write('e' + r); sys.exit(0)")
    rc, out, err = finish(srun_job(slurmbed, tag, "-n", "2", "--output-filename",
                                   str(tmp_path / "log"), PY, "-c", code, cwd=tmp_path))
    assert rc == 0, err
    for rank in (0, 1):
        d = tmp_path / "log" / "1" / f"rank.{rank}"
        assert (d / "stdout").read_bytes() == blob + b"no newline %d" % rank
        assert (d / "stderr").read_bytes() == b"e%d" % rank
    p = srun_job(slurmbed, tag, "-n", "2", "--tag-output", "sh", "-c",
                 "printf 'a\\nb'; printf x >&2", cwd=tmp_path)
    rc, out, err = finish(p)
    assert rc == 0, err
    assert sorted(out.splitlines()) == ["[1,0]<stdout>:a", "[1,0]<stdout>:b",
                                        "[1,1]<stdout>:a", "[1,1]<stdout>:b"], out
    assert sorted(err.splitlines()) == ["[1,0]<stderr>:x", "[1,1]<stderr>:x"], err


def test_a_failing_rank_ends_the_job_with_its_code_and_leaves_nothing(slurmbed, tmp_path):
    tag = new_tag()
    code = ("import os, sys, time; r = int(os.environ['RANK']); "
            "time.sleep(0.5) if r == 3 else time.sleep(60); sys.exit(7)")
    t0 = time.monotonic()
    rc, out, err = finish(srun_job(slurmbed, tag, "-n", "4", "--grace", "1", PY, "-c", code,
                                   cwd=tmp_path))
    assert rc == 7, err
    assert time.monotonic() - t0 < 30
    assert "rank 3 (pid" in err and "on h2) exited with code 7" in err, err
    assert "CANCELLED" not in err and "srun:" not in err, err
    assert wait_for(lambda: not left_on_nodes(slurmbed, tag), 10), left_on_nodes(slurmbed, tag)


def test_a_rank_killed_by_a_signal_is_reported_so(slurmbed, tmp_path):
    tag = new_tag()
    rc, out, err = finish(srun_job(slurmbed, tag, "-n", "2", "sh", "-c",
                                   'test "$RANK" = 1 && kill -SEGV $$; sleep 60', cwd=tmp_path))
    assert rc == 139, err
    assert "rank 1" in err and "signal 11 (SIGSEGV)" in err, err
    assert wait_for(lambda: not left_on_nodes(slurmbed, tag), 10), left_on_nodes(slurmbed, tag)


def test_mpi_over_mslaunch_s_pmi_and_abort(slurmbed, mpich, tmp_path):
    tag = new_tag()
    code = ("from mpi4py import MPI; import socket; c = MPI.COMM_WORLD; "
            "print(c.rank, socket.gethostname(), c.allreduce(1), flush=True)")
    rc, out, err = finish(srun_job(slurmbed, tag, "-n", "4", "-x", "UCX_TLS", PY, "-c", code,
                                   cwd=tmp_path), 120)
    assert rc == 0, err
    rows = sorted(line.split() for line in out.splitlines())
    assert rows == [["0", "h1", "4"], ["1", "h1", "4"], ["2", "h2", "4"], ["3", "h2", "4"]]
    code = ("from mpi4py import MPI; c = MPI.COMM_WORLD; "
            "c.Abort(9) if c.rank == 2 else c.barrier()")
    rc, out, err = finish(srun_job(slurmbed, tag, "-n", "4", "--grace", "1", "-x", "UCX_TLS",
                                   PY, "-c", code, cwd=tmp_path), 120)
    assert rc == 9, err
    assert "rank 2" in err and "called MPI_Abort with exit code 9" in err, err
    assert wait_for(lambda: not left_on_nodes(slurmbed, tag), 10), left_on_nodes(slurmbed, tag)


def test_mpmd_directories_and_stdin_to_rank_0(slurmbed, tmp_path):
    tag = new_tag()
    (tmp_path / "a").mkdir()
    p = srun_job(slurmbed, tag, "-n", "1", "-wdir", str(tmp_path / "a"), "sh", "-c",
                 'echo "A $RANK $(pwd)"; cat', ":", "-n", "1", "-wdir", "/", "sh", "-c",
                 'echo "B $RANK $(pwd) $0"; cat', "x y'z", cwd=tmp_path, stdin=-1)
    out, err = p.communicate(b"to rank 0\n", timeout=60)
    assert p.returncode == 0, err
    assert sorted(out.decode().splitlines()) == [f"A 0 {tmp_path / 'a'}", "B 1 / x y'z",
                                                 "to rank 0"], out


@pytest.mark.parametrize("how", ["SIGINT", "SIGKILL"])
def test_a_stopped_or_killed_launcher_leaves_nothing_on_the_nodes(slurmbed, tmp_path, how):
    tag = new_tag()
    p = srun_job(slurmbed, tag, "-n", "4", "--grace", "1", PY, "-c",
                 "import time; print('up', flush=True); time.sleep(120)", cwd=tmp_path)
    try:
        assert wait_for(lambda: len([pid for h in (1, 2) for pid in slurmbed.task_pids(h)
                                     if pid in set(tagged_pids(tag))
                                     and b"time.sleep" in cmdline(pid)]) == 4, 30), \
            slurmbed.diagnostics()
        ours = [pid for pid in tagged_pids(tag)
                if b"mslaunch" in cmdline(pid) and pid != p.pid]
        launcher = [pid for pid in ours if parent_pid(pid) not in ours]   # not its guard
        assert len(launcher) == 1, ours
        os.kill(launcher[0], getattr(signal, how))
        rc, out, err = finish(p)
        if how == "SIGINT":
            assert rc == 130, err
        assert wait_for(lambda: not left_on_nodes(slurmbed, tag), 15), \
            left_on_nodes(slurmbed, tag)
    finally:
        kill_tagged(tag)


def test_what_needs_agents_is_refused_in_one_line(slurmbed, tmp_path):
    tag = new_tag()
    for args, what in ((("--bind-to", "core"), "binding"),
                       (("--max-restarts", "1"), "--max-restarts")):
        rc, out, err = finish(srun_job(slurmbed, tag, *args, "-n", "2", "true", cwd=tmp_path))
        assert rc != 0 and err.count("\n") == 1 and what in err, err
        assert "--launcher srun" in err and "--launcher slurm" in err, err
    r = slurmbed.run([PY, "-m", "mslaunch", "--launcher", "srun", "-n", "1", "true"],
                     cwd=str(tmp_path))
    assert r.returncode != 0 and "not inside a Slurm allocation" in r.stderr, r.stderr


def test_stacks_and_top_of_a_running_job_come_from_a_step_of_their_own(slurmbed, tmp_path):
    import subprocess
    from helpers import REPO, clean_env
    tag = new_tag()
    # 600 frames deep: py-spy reads them all, more than a report's merge could follow
    code = ("import time\ndef waiting_here():\n    time.sleep(120)\n"
            "def deep(n):\n    return deep(n - 1) if n else waiting_here()\n"
            "print('up', flush=True)\ndeep(600)\n")
    p = srun_job(slurmbed, tag, "-n", "4", "--grace", "1", PY, "-c", code, cwd=tmp_path)
    try:
        assert wait_for(lambda: len([pid for h in (1, 2) for pid in slurmbed.task_pids(h)
                                     if pid in set(tagged_pids(tag))
                                     and b"time.sleep" in cmdline(pid)]) == 4, 30), \
            slurmbed.diagnostics()
        ours = [pid for pid in tagged_pids(tag) if b"mslaunch" in cmdline(pid) and pid != p.pid]
        launcher = [pid for pid in ours if parent_pid(pid) not in ours]
        assert len(launcher) == 1, ours

        def ask(script: str, *args: str) -> str:
            r = subprocess.run([PY, os.path.join(REPO, "scripts", script), str(launcher[0]),
                                *args], capture_output=True, timeout=60, env=clean_env())
            assert r.returncode == 0, r.stderr
            return r.stdout.decode()
        text = ""
        deadline = time.monotonic() + 60
        while "waiting_here" not in text and time.monotonic() < deadline:
            text = ask("mslaunch-stacks")    # until every rank is in its function
        assert "ranks 0-3 (4) on h1,h2" in text and "waiting_here (<string>:3)" in text, text
        assert "frames left out ..." in text, text
        top = ask("mslaunch-top", "--once")
        rows = [line.split() for line in top.splitlines() if line.split()[:1] in
                (["0"], ["1"], ["2"], ["3"])]
        assert [r[1] for r in rows] == ["h1", "h1", "h2", "h2"], top
        # Each look's step is over once it has answered: nothing is left of it.
        assert wait_for(lambda: not [pid for pid in tagged_pids(tag)
                                     if b"steplook" in cmdline(pid)], 10)
        os.kill(launcher[0], signal.SIGINT)
        rc, out, err = finish(p)
        assert rc == 130, err
        assert wait_for(lambda: not left_on_nodes(slurmbed, tag), 15), \
            left_on_nodes(slurmbed, tag)
    finally:
        kill_tagged(tag)




def test_a_spawn_fails_in_the_rank_that_asks_for_it(slurmbed, mpich, tmp_path):
    tag = new_tag()
    rc, out, err = finish(srun_job(slurmbed, tag, "--oversubscribe", "-n", "2", "-x", "UCX_TLS",
                                   PY, os.path.join(PROGRAMS, "spawn_job.py"), "info",
                                   "wdir=/tmp", cwd=tmp_path), 120)
    assert rc == 0, err
    assert sorted(json.loads(line)["parent"] for line in out.splitlines()
                  if "error" in json.loads(line)) == [0, 1], out
    assert "no agent of mslaunch's runs on h" in err, err
    assert wait_for(lambda: not left_on_nodes(slurmbed, tag), 10), left_on_nodes(slurmbed, tag)


def test_an_open_mpi_4_program_fails_with_open_mpi_s_own_reason(slurmbed, ompi4, tmp_path):
    python = ompi4
    tag = new_tag()
    rc, out, err = finish(srun_job(slurmbed, tag, "-n", "2", python,
                                   os.path.join(PROGRAMS, "pmix_ranks.py"), "show",
                                   cwd=tmp_path), 120)
    assert rc != 0 and "direct launched" in err and "exited with code" in err, err
    assert wait_for(lambda: not left_on_nodes(slurmbed, tag), 10), left_on_nodes(slurmbed, tag)


def test_an_sbatch_job_on_a_node_of_its_own_serves_pmi_only_from_the_step(slurmbed, mpich,
                                                                          tmp_path):
    # mslaunch runs on h1, which holds ranks too: they are srun's tasks like h2's,
    # served the step's PMI and no PMIx of a local server.
    code = ("from mpi4py import MPI; import os, socket; c = MPI.COMM_WORLD; "
            "print(c.rank, socket.gethostname(), c.allreduce(1), "
            "'PMIX_SERVER_URI41' in os.environ, 'PMI_FD' in os.environ, flush=True)")
    from slurm import sbatch_lines
    rows = sbatch_lines(slurmbed, tmp_path, "--launcher srun -n 4 -x UCX_TLS", code)
    assert rows == [[str(i), h, "4", "False", "False"]
                    for i, h in enumerate(["h1", "h1", "h2", "h2"])], rows


def test_refused_in_one_line_and_stdin_to_every_rank(slurmbed, tmp_path):
    tag = new_tag()
    for args, what in ((("-n", "1", "-env", "X.Y", "a", "hostname", ":", "-n", "1", "hostname"),
                        "'X.Y' is not a name"),
                       (("--index-argv-by-rank", "-n", "2", "echo"), "--index-argv-by-rank"),
                       (("-H", "h1,h7", "-n", "2", "hostname"), "h7 is not a node of Slurm job")):
        rc, out, err = finish(srun_job(slurmbed, tag, *args, cwd=tmp_path))
        assert rc != 0 and err.count("\n") == 1 and what in err, err
    p = srun_job(slurmbed, tag, "--stdin", "all", "-n", "2", "sh", "-c", 'echo "$RANK $(cat)"',
                 cwd=tmp_path, stdin=-1)
    out, err = p.communicate(b"hello", timeout=60)
    assert p.returncode == 0, err
    assert sorted(out.decode().splitlines()) == ["0 hello", "1 hello"], out


def test_a_missing_directory_is_said_and_leftovers_do_not_hold_the_job(slurmbed, tmp_path):
    tag = new_tag()
    rc, out, err = finish(srun_job(slurmbed, tag, "--wdir", str(tmp_path / "gone"), "-n", "2",
                                   "pwd", cwd=tmp_path))
    assert rc == 127 and f"working directory {tmp_path / 'gone'} does not exist on h" in err, err
    assert out == "", out
    # A process a rank leaves behind holds the rank's output connection; Slurm's
    # proctrack/linuxproc (the bed's) does not end it with the step.
    t0 = time.monotonic()
    try:
        rc, out, err = finish(srun_job(slurmbed, tag, "-n", "2", "sh", "-c",
                                       "sleep 60 & echo hi", cwd=tmp_path))
        assert rc == 0 and out.splitlines() == ["hi", "hi"], (out, err)
        assert time.monotonic() - t0 < 30
        assert "output of rank(s) 0, 1 stayed open after srun's end, held by processes " \
            "they left behind" in err, err
    finally:
        kill_tagged(tag)


def test_output_held_back_by_a_slow_reader_is_all_read_after_the_ranks_end(slurmbed, tmp_path):
    # The rank writes more than mslaunch holds for its stdout and exits: the rest
    # waits in the sockets' buffers while nobody reads mslaunch, after srun's end.
    tag = new_tag()
    size = 24 << 20
    # (a send buffer as large as the output, as root may force: the rank ends at once)
    written = tmp_path / "written"
    code = ("import socket, sys; s = socket.socket(fileno=1); "
            f"s.setsockopt(socket.SOL_SOCKET, 32, {2 * size}); s.detach(); "  # SO_SNDBUFFORCE
            f"sys.stdout.buffer.write(b'x' * {size}); sys.stdout.flush(); "
            f"open({str(written)!r}, 'w').close()")
    # h1's link throttled to 80 Mbit/s: the bytes arrive for seconds after the end
    tc = ["tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", "80mbit", "burst",
          "32kbit", "latency", "400ms"]
    r = slurmbed.exec_in("h1", tc)
    assert r.returncode == 0, r.stderr
    try:
        p = srun_job(slurmbed, tag, "-n", "1", "-H", "h1", PY, "-c", code, cwd=tmp_path)
        # srun ends (it outlives its task, which has written everything), the rank's
        # bytes unread ...
        assert wait_for(written.exists, 60)
        assert wait_for(lambda: "srun" not in [comm(pid) for pid in tagged_pids(tag)], 60)
        # ... and nobody reads them for a while: the fault, long enough for mslaunch
        # to look at the connections open after srun's end three times
        time.sleep(3 * OUTPUT_AFTER_END)
        rc, out, err = finish(p, 120)
        assert rc == 0, err
        assert len(out) == size and "stayed open" not in err, (len(out), err)
    finally:
        slurmbed.exec_in("h1", ["tc", "qdisc", "del", "dev", "eth0", "root"])
        kill_tagged(tag)


def test_refused_open_mpi_5_singletons_leave_nothing_on_the_nodes(slurmbed, ompi5, tmp_path,
                                                                  own_tmpdir):
    """As under agents (tests/system/openmpi/test_singletons.py): their segments in /dev/shm and
    their session directories in TMPDIR go, removed by a step on their nodes.
    (Refused at all only because the nodes see the launcher's probe directory.)"""
    from ompi import check_refused, held_files, still_there
    from helpers import program
    lib = ompi5
    files: dict = {}
    for attempt in range(3):     # until a rank recorded its segment before the refusal
        out = tmp_path / f"run{attempt}"
        out.mkdir()
        tag = new_tag()
        try:
            p = srun_job(slurmbed, tag, "-n", "2", "--grace", "2", PY,
                         program("singleton_shm.py"), str(out), "30", cwd=tmp_path,
                         extra_env={"MPI4PY_LIBMPI": lib})
            rc, stdout, err = finish(p, 120)
            check_refused(type("R", (), {"returncode": rc, "stderr": err.encode()}))
            assert wait_for(lambda: not left_on_nodes(slurmbed, tag), 15)
            files = held_files(out)
            assert still_there(files) == []
            # (the job's folders in TMPDIR its watchdog removes, once mslaunch is gone)
            assert wait_for(lambda: tagged_pids(tag) == [], 30), tagged_pids(tag)
            assert [str(q) for q in own_tmpdir.rglob("*")] == []
        finally:
            kill_tagged(tag)
        if files:
            break
    assert files, "in three runs no rank recorded its segment before the refusal"


def test_merged_stderr_takes_one_connection_per_rank(slurmbed, tmp_path):
    tag = new_tag()
    rc, out, err = finish(srun_job(slurmbed, tag, "-n", "2", "--merge-stderr-to-stdout",
                                   "--output-filename", str(tmp_path / "log"), "sh", "-c",
                                   'echo "o$RANK"; echo "e$RANK" >&2', cwd=tmp_path))
    assert rc == 0, err
    assert sorted(out.split()) == ["e0", "e1", "o0", "o1"] and err == "", (out, err)
    for rank in (0, 1):
        d = tmp_path / "log" / "1" / f"rank.{rank}"
        assert (d / "stdout").read_text() == f"o{rank}\ne{rank}\n"
        assert not (d / "stderr").exists()
