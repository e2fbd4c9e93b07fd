"""Another user of a host trying to join a running job as one of its ranks
(tests/system/remote/test_intruder.py).  Run as that user, with tests/programs/uid_shim.c
preloaded so that every uid this process asks the kernel for is root's.

``pmix LIBPMIX PORT [NAME...]``
    What an intruder can do against a PMIx server: take every name it can list
    where a launcher leaves names (``/tmp``, ``$TMPDIR``, ``/dev/shm``, the
    cgroup root), and their parts, plus the NAMEs given (a test's control: the
    job's real namespace), as the namespace to claim at the server's loopback
    PORT (which ``ss -tln`` shows anyone).  For each, a forked child claiming
    rank 0 or 1 calls ``PMIx_Init``; one that gets in calls ``PMIx_Abort(77)``.
``tool LIBPMIX PORT``
    Connects to the PMIx server as a tool, with a name of its own (libpmix lets
    in such a tool without asking the launcher, on the uid it claims), then
    sends every error event to every range and calls ``PMIx_Abort(77)``.
    Prints ``{"name": "tool", "rank": 0, "rc": RC}`` (RC of ``PMIx_tool_init``).
``pmi PORT [ID...]``
    The same against a PMI server's TCP door (``PMI_PORT``): ``initack`` with
    each of a few guessed ``PMI_ID``s, plus the IDs given (the control).
``scan``
    Reads a secret from stdin and looks for it where this user can look: names
    and small files under /tmp, $TMPDIR, /dev/shm, /run; every process's
    command line and environment; /proc/net/unix; the cgroup tree.

Prints one JSON line per attempt (``{"name", "rank", "rc"}``, rc 0 a join) or,
for ``scan``, one JSON list of what was found.
"""

import ctypes as C
import json
import os
import re
import select
import socket
import stat
import sys


class Proc(C.Structure):
    _fields_ = [("nspace", C.c_char * 256), ("rank", C.c_uint32)]


class Data(C.Union):
    _fields_ = [("string", C.c_char_p), ("u32", C.c_uint32), ("pad", C.c_char * 24)]


class Value(C.Structure):
    _fields_ = [("type", C.c_uint16), ("data", Data)]


class Info(C.Structure):
    _fields_ = [("key", C.c_char * 512), ("flags", C.c_uint32), ("value", Value)]


def visible_names():
    """Every name this user can list where a launcher leaves names, and its parts."""
    names = set()
    for d in {"/tmp", os.environ.get("TMPDIR") or "/tmp", "/dev/shm", "/sys/fs/cgroup"}:
        try:
            entries = os.listdir(d)
        except OSError:
            continue
        for e in entries:
            if "mslaunch" not in e and not e.startswith(("kvs_", "mpich_shm")):
                continue
            names.add(e)
            names.update(re.split(r"[-.]", e))
            m = re.search(r"kvs_[0-9A-Za-z_]+", e)
            if m:
                parts = m.group(0).split("_")
                names.update("_".join(parts[:n]) for n in range(2, len(parts) + 1))
    return sorted(n for n in names if len(n) >= 3)


def pmix_attempt(lib, nspace, port, rank):
    """PMIx_Init in a child claiming ``nspace``/``rank`` at ``port``: its rc (None: no answer)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        uri = f"pmix-server.1;tcp4://127.0.0.1:{port}"
        for name in ("PMIX_SERVER_URI41", "PMIX_SERVER_URI4", "PMIX_SERVER_URI3",
                     "PMIX_SERVER_URI21", "PMIX_SERVER_URI2"):
            os.environ[name] = uri
        os.environ.update({"PMIX_NAMESPACE": nspace, "PMIX_RANK": str(rank),
                           "PMIX_SECURITY_MODE": "native", "PMIX_PTL_MODULE": "tcp,usock",
                           "PMIX_GDS_MODULE": "hash"})
        rc = lib.PMIx_Init(C.byref(Proc()), None, 0)
        os.write(w, str(rc).encode())
        if rc == 0:
            lib.PMIx_Abort(77, b"an intruder ended the job", None, 0)
        os._exit(0)
    os.close(w)
    ready, _, _ = select.select([r], [], [], 10.0)
    out = os.read(r, 64) if ready else b""
    os.close(r)
    if not out:
        os.kill(pid, 9)
    os.waitpid(pid, 0)
    return int(out) if out else None


def tool(lib, port):
    """A tool of its own name at ``port``: events to every range, then an abort."""
    info = (Info * 3)()
    uri = f"pmix-server.1;tcp4://127.0.0.1:{port}".encode()
    for i, (key, kind, value) in enumerate([("pmix.srvr.uri", 3, uri),
                                            ("pmix.tool.nspace", 3, b"intruder"),
                                            ("pmix.tool.rank", 14, 0)]):
        info[i].key = key.encode()
        info[i].value.type = kind
        if kind == 3:
            info[i].value.data.string = value
        else:
            info[i].value.data.u32 = value
    rc = lib.PMIx_tool_init(C.byref(Proc()), info, 3)
    if rc == 0:
        lib.PMIx_Notify_event.argtypes = [C.c_int, C.c_void_p, C.c_int, C.c_void_p,
                                          C.c_size_t, C.c_void_p, C.c_void_p]
        # aborted, terminated, lost connection, job terminated..., to every range
        for status in (-61, -62, -63, -64, -85, -33, -14, -1):
            for scope in range(7):
                lib.PMIx_Notify_event(status, None, scope, None, 0, None, None)
        lib.PMIx_Abort(77, b"an intruder ended the job", None, 0)
    return rc


def pmi_attempts(port, pmi_ids):
    """``initack`` with each of ``pmi_ids``, all at once (as a guesser would: a
    wrong ID is answered late): for each, 0 when let in, 1 when cut off."""
    socks = []
    for pmi_id in pmi_ids:
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        try:
            s.sendall(f"cmd=initack pmiid={pmi_id}\n".encode())
        except OSError:
            pass
        socks.append((pmi_id, s))
    results = []
    for pmi_id, s in socks:
        try:
            answer = s.recv(4096)
        except OSError:
            answer = b""
        s.close()
        results.append((pmi_id, 0 if answer.startswith(b"cmd=initack rc=0") else 1))
    return results


def scan(secret):
    hits = []
    needle = secret.encode()

    def walk(top):
        for root, dirs, files in os.walk(top):
            if root.count("/") - top.count("/") >= 4:
                dirs[:] = []
            # (os.fsencode: a name of any bytes, as another user may leave in /tmp)
            hits.extend(["name", os.path.join(root, n)] for n in dirs + files
                        if needle in os.fsencode(n))
            for n in files:
                path = os.path.join(root, n)
                try:
                    # (not blocking: a FIFO that someone left there is no file to read)
                    with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as f:
                        st = os.fstat(f.fileno())
                        if stat.S_ISREG(st.st_mode) and st.st_size < (1 << 20) \
                                and needle in f.read():
                            hits.append(["content", path])
                except OSError:
                    pass

    for top in sorted({"/tmp", os.environ.get("TMPDIR") or "/tmp", "/dev/shm", "/run"}):
        walk(top)
    for pid in os.listdir("/proc"):
        for what in ("cmdline", "environ") if pid.isdigit() and int(pid) != os.getpid() else ():
            try:
                with open(f"/proc/{pid}/{what}", "rb") as f:
                    if needle in f.read():
                        hits.append([what, pid])
            except OSError:
                pass
    with open("/proc/net/unix", "rb") as f:
        if needle in f.read():
            hits.append(["unix socket", "/proc/net/unix"])
    for root, dirs, _ in os.walk("/sys/fs/cgroup"):
        hits.extend(["cgroup", os.path.join(root, n)] for n in dirs if needle in os.fsencode(n))
    return hits


def main():
    what, args = sys.argv[1], sys.argv[2:]
    if what == "scan":
        print(json.dumps(scan(sys.stdin.read().strip())), flush=True)
    elif what == "pmix":
        lib = C.CDLL(args[0], mode=C.RTLD_GLOBAL)
        lib.PMIx_Init.argtypes = [C.POINTER(Proc), C.c_void_p, C.c_size_t]
        lib.PMIx_Abort.argtypes = [C.c_int, C.c_char_p, C.c_void_p, C.c_size_t]
        port, given = int(args[1]), args[2:]
        for name in given + [n for n in visible_names() if n not in given]:
            for rank in (0, 1):
                rc = pmix_attempt(lib, name, port, rank)
                print(json.dumps({"name": name, "rank": rank, "rc": rc}), flush=True)
    elif what == "tool":
        lib = C.CDLL(args[0], mode=C.RTLD_GLOBAL)
        lib.PMIx_Abort.argtypes = [C.c_int, C.c_char_p, C.c_void_p, C.c_size_t]
        print(json.dumps({"name": "tool", "rank": 0, "rc": tool(lib, int(args[1]))}),
              flush=True)
    elif what == "pmi":
        port, given = int(args[0]), args[1:]
        for pmi_id, rc in pmi_attempts(port, given + [str(n) for n in range(1, 33)]
                                       + [str(2**31 - 1)]):
            print(json.dumps({"name": pmi_id, "rank": None, "rc": rc}), flush=True)


main()
