"""msrun mode on several nodes: the test bed's namespace hosts, each running the
same command line (no SSH), forming one job through the node service.

Every node is started in its host's network and UTS namespaces; they share
this machine's file system, so each node gets its own ``--log_dir``.  The
processes of a test carry its tag, so a test checks that none of them is
left anywhere, whatever happened to the job.
"""

from __future__ import annotations

import datetime
import json
import os
import random
import signal
import socket
import subprocess
import time

import pytest

from helpers import all_gone, clean_env, cmd, kill_tagged, new_tag, program, wait_for
from ports import spare_port

pytestmark = pytest.mark.remote

TASK = program("ms_task.py")


@pytest.fixture
def bed(sshbed):
    sshbed.require_netns("msrun nodes")
    return sshbed


class Node:
    def __init__(self, host, proc, log_dir) -> None:
        self.host = host
        self.proc = proc
        self.log_dir = log_dir
        self.out = ""
        self.fails = 0           # failed TCP connects in its host's namespace before it

    def wait(self, timeout: float = 60) -> int:
        try:
            out, _ = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
            self.out = out.decode(errors="replace")
            raise AssertionError(f"node {self.host.name} hangs:\n{self.out}") from None
        self.out = out.decode(errors="replace")
        return self.proc.returncode

    def logs(self) -> dict:
        if not self.log_dir.is_dir():
            return {}
        return {p.name: p.read_text() for p in sorted(self.log_dir.iterdir())
                if p.suffix == ".log"}


class Job:
    """One multi-node job on the bed: the same flags on every node, plus each node's own."""

    def __init__(self, bed, tmp_path, bin_dir, workers: int, time_out: int = 30,
                 **extra_env: str) -> None:
        self.bed = bed
        self.tmp = tmp_path
        self.tag = new_tag()
        self.port = spare_port(2)
        self.master = bed.hosts[0]
        self.workers = workers
        self.time_out = time_out
        self.env = clean_env(MSL_TEST_TAG=self.tag, MSLAUNCH_SECRET="job-secret",
                             MSLAUNCH_HEARTBEAT="0.3,5", **extra_env)
        self.env["PATH"] = f"{bin_dir}:{self.env['PATH']}"
        self.nodes: list = []

    def two_nodes_running(self) -> None:
        """Two workers on each of h1 and h2 (node ranks 0 and 1), all started."""
        h1, h2 = self.bed.hosts[:2]
        self.start(h1, 2, "--node_rank=0")
        self.start(h2, 2, "--node_rank=1")
        assert wait_for(lambda: len(self.envs()) == 4, 30), transcript(self)

    def start(self, host, local: int, *flags: str, env=None, task=TASK,
              master_addr: str = "") -> Node:
        log_dir = self.tmp / f"log_{host.name}_{len(self.nodes)}"
        argv = cmd(f"--worker_num={self.workers}", f"--local_worker_num={local}",
                   f"--master_addr={master_addr or self.master.addr}",
                   f"--master_port={self.port}",
                   f"--log_dir={log_dir}", "--join=True",
                   f"--cluster_time_out={self.time_out}", *flags, task)
        fails = _tcp(host, "AttemptFails")
        proc = self.bed.spawn_in(host, argv, env=env or self.env, cwd=str(self.tmp),
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        node = Node(host, proc, log_dir)
        node.fails = fails
        self.nodes.append(node)
        return node

    def wait(self, timeout: float = 60) -> list:
        return [n.wait(timeout) for n in self.nodes]

    def registered(self, ranks, timeout: float = 30) -> None:
        """Wait until the workers of ``ranks`` run: their node has registered (a node
        starts its workers once the service has given it their ranks)."""
        assert wait_for(lambda: set(ranks) <= set(self.envs()), timeout), transcript(self)

    def waiting(self, node: Node, timeout: float = 30) -> None:
        """Wait until ``node`` has found no service at the master's address, at least
        once (a connection refused: the attempt's failure counted in its host's
        network namespace, where nothing else connects)."""
        assert wait_for(lambda: _tcp(node.host, "AttemptFails") > node.fails, timeout), \
            transcript(self)

    def envs(self) -> dict:
        """RANK_ID -> (host, env) of every worker, from the worker logs."""
        out = {}
        for n in self.nodes:
            for name, text in n.logs().items():
                if name.startswith("worker_") and "\n" in text:   # written so far
                    row = json.loads(text.splitlines()[0])
                    out[int(row["RANK_ID"])] = (n.host.name, row)
        return out

    def settle(self) -> None:
        assert all_gone(self.tag, 15), f"processes left: {self.tag}"

    def cleanup(self) -> None:
        for n in self.nodes:
            if n.proc.poll() is None:
                n.proc.kill()
                n.proc.wait()
        kill_tagged(self.tag)


def _tcp(host, counter: str) -> int:
    """A TCP counter of ``host``'s network namespace (/proc/net/snmp)."""
    with open(f"/proc/{host.pid}/net/snmp") as f:
        names, values = [line.split() for line in f if line.startswith("Tcp:")][:2]
    return int(values[names.index(counter)])


@pytest.fixture
def job(bed, tmp_path, bin_dir):
    jobs = []

    def make(workers: int, **kw) -> Job:
        j = Job(bed, tmp_path, bin_dir, workers, **kw)
        jobs.append(j)
        return j

    yield make
    for j in jobs:
        j.cleanup()


def transcript(j: Job) -> str:
    return "\n".join(f"--- {n.host.name} rc={n.proc.returncode}\n{n.out}" for n in j.nodes)


# -- forming a job ------------------------------------------------------------------

def test_two_nodes_form_one_job_in_the_order_they_register(job):
    j = job(4)
    h1, h2 = j.bed.hosts[:2]
    j.start(h1, 2)
    j.registered([0, 1])         # h1 registers first: ranks 0 and 1
    j.start(h2, 2)
    assert j.wait() == [0, 0], transcript(j)
    envs = j.envs()
    assert sorted(envs) == [0, 1, 2, 3]
    assert [envs[r][0] for r in range(4)] == ["h1", "h1", "h2", "h2"]
    for rank, (_host, env) in envs.items():
        assert env["MS_ROLE"] == "MS_WORKER" and env["RANK_SIZE"] == "4"
        assert env["MS_WORKER_NUM"] == "4" and env["MS_SCHED_HOST"] == j.master.addr
        assert env["MS_SCHED_PORT"] == str(j.port) and env["MS_NODE_ID"] == str(rank)
        assert env["DEVICE_ID"] == str(rank % 2)
    # Only the master node runs the scheduler.
    assert "scheduler.log" in j.nodes[0].logs() and "scheduler.log" not in j.nodes[1].logs()
    assert sorted(j.nodes[1].logs()) == ["worker_2.log", "worker_3.log"]
    assert "Start worker process with rank id:2" in j.nodes[1].out
    j.settle()


def test_three_nodes_with_node_rank_and_the_master_last(job):
    j = job(6)
    h1, h2, h3 = j.bed.hosts[:3]
    # The non-master nodes wait for the master's service to appear.
    for node in (j.start(h3, 2, "--node_rank=2"), j.start(h2, 2, "--node_rank=1")):
        j.waiting(node)
    j.start(h1, 2, "--node_rank=0")
    assert j.wait() == [0, 0, 0], transcript(j)
    envs = j.envs()
    assert {r: envs[r][0] for r in envs} == {0: "h1", 1: "h1", 2: "h2", 3: "h2",
                                             4: "h3", 5: "h3"}
    j.settle()


def test_nodes_with_different_worker_counts(job):
    j = job(6)
    h1, h2, h3 = j.bed.hosts[:3]
    j.start(h1, 3)
    j.registered([0, 1, 2])
    j.start(h2, 1)
    j.registered([3])
    j.start(h3, 2)
    assert j.wait() == [0, 0, 0], transcript(j)
    assert {r: h for r, (h, _e) in j.envs().items()} == {0: "h1", 1: "h1", 2: "h1",
                                                         3: "h2", 4: "h3", 5: "h3"}
    j.settle()


# -- failures end the job everywhere ---------------------------------------------------

def test_a_failing_worker_on_one_node_ends_every_node_with_its_code(job):
    j = job(4, FAIL_RANK="3", FAIL_CODE="7", SLEEP="60")
    h1, h2 = j.bed.hosts[:2]
    j.start(h1, 2, "--node_rank=0")
    j.start(h2, 2, "--node_rank=1")
    t0 = time.monotonic()
    assert j.wait() == [7, 7], transcript(j)
    assert time.monotonic() - t0 < 30
    master_out = j.nodes[0].out
    assert "worker 3" in master_out and "h2" in master_out, master_out
    assert "exited with code 7" in master_out
    j.settle()


@pytest.mark.parametrize("recovery", ["0", "1"])
def test_a_node_whose_launcher_is_killed_ends_the_others_with_255_naming_it(job, recovery):
    j = job(4, SLEEP="60", MS_ENABLE_RECOVERY=recovery)
    j.two_nodes_running()
    j.nodes[1].proc.kill()                 # its watchdog ends its workers
    assert j.nodes[0].wait() == 255, transcript(j)
    assert "lost node h2" in j.nodes[0].out, j.nodes[0].out
    # With recovery on, what recovery cannot do, and what can.
    assert ("restarts failed workers in place, not a lost node" in j.nodes[0].out and
            "--max-restarts N and a spare host" in j.nodes[0].out) == (recovery == "1"), \
        j.nodes[0].out
    j.nodes[1].wait()
    j.settle()


def test_a_node_cut_off_the_network_is_lost_on_both_sides(job, bed):
    j = job(4, SLEEP="60")
    j.two_nodes_running()
    h2 = j.bed.hosts[1]
    bed.link_down(h2)
    try:
        # Heartbeats every 0.3 s, lost after 5 misses: each side stops on its own.
        assert j.wait(timeout=30) == [255, 255], transcript(j)
    finally:
        bed.link_up(h2)
    assert "lost node h2" in j.nodes[0].out, j.nodes[0].out
    assert "lost the node service" in j.nodes[1].out, j.nodes[1].out
    j.settle()


def test_ctrl_c_on_one_node_stops_the_whole_job(job):
    j = job(4, SLEEP="60")
    j.two_nodes_running()
    j.nodes[1].proc.send_signal(signal.SIGINT)
    codes = j.wait()
    assert codes == [130, 130], transcript(j)
    assert "stopped by SIGINT on h2" in j.nodes[0].out, j.nodes[0].out
    j.settle()


def test_too_few_nodes_time_out_with_one_line_and_nothing_left(job):
    j = job(4, time_out=3, SLEEP="60")
    j.start(j.bed.hosts[0], 2)
    assert j.wait() == [1], transcript(j)
    out = j.nodes[0].out
    assert "cluster time out: only 2 of 4 workers joined" in out and "2 missing" in out, out
    assert "Traceback" not in out
    j.settle()


def test_a_node_too_many_is_refused_and_the_job_goes_on(job):
    j = job(4, SLEEP="2")
    h1, h2, h3 = j.bed.hosts[:3]
    j.start(h1, 2)
    j.start(h2, 2)
    assert wait_for(lambda: len(j.envs()) == 4, 30), transcript(j)
    extra = j.start(h3, 2)
    assert extra.wait() == 1
    assert "refused this node" in extra.out and "too many" in extra.out, extra.out
    assert [n.wait() for n in j.nodes[:2]] == [0, 0], transcript(j)
    j.settle()


def test_a_node_rank_clash_is_refused_naming_the_holder(job):
    j = job(4, SLEEP="2")
    h1, h2, h3 = j.bed.hosts[:3]
    j.start(h1, 2, "--node_rank=0")
    j.registered([0, 1])
    clash = j.start(h2, 2, "--node_rank=0")
    assert clash.wait() == 1, transcript(j)
    assert "--node_rank=0: rank 0 belongs to node h1" in clash.out, clash.out
    j.start(h3, 2, "--node_rank=1")
    assert [j.nodes[0].wait(), j.nodes[2].wait()] == [0, 0], transcript(j)
    j.settle()


def test_the_service_s_own_node_refused_keeps_the_service_for_the_nodes_it_took(job):
    # The master's own node is refused when another node came first with its
    # node rank.  Forced here: h1's connections to its own node service fail
    # until h2 has taken rank 0; then h1's node joins, and is refused.
    # The service stays up on h1 for the nodes it took, which finish the job.
    j = job(4, SLEEP="2")
    h1, h2, h3 = j.bed.hosts[:3]
    with j.bed.refusing_own(h1, j.port + 1):      # (the node service's port)
        j.start(h1, 2, "--node_rank=0")
        j.start(h2, 2, "--node_rank=0")
        j.registered([0, 1])
        assert {host for host, _ in j.envs().values()} == {"h2"}, transcript(j)
    j.start(h3, 2, "--node_rank=1")
    codes = j.wait()
    assert codes == [1, 0, 0], transcript(j)
    master = j.nodes[0].out
    errors = [x for x in master.splitlines() if x.startswith("mslaunch: error:")]
    assert len(errors) == 1 and "--node_rank=0: rank 0 belongs to node h2" in errors[0], master
    envs = j.envs()
    assert {r: envs[r][0] for r in envs} == {0: "h2", 1: "h2", 2: "h3", 3: "h3"}
    j.settle()


def test_a_node_with_another_secret_is_refused_with_a_hint(job):
    j = job(4, time_out=4, SLEEP="60")
    h1, h2 = j.bed.hosts[:2]
    j.start(h1, 2)
    # (another home: the hint names the refused node's own secret file, and never
    # the service owner's, which the service does not tell a node it refused)
    owners = os.path.join(j.env.get("HOME") or os.environ["HOME"], ".mslaunch", "secret")
    home = j.tmp / "another_home"
    home.mkdir()
    other = dict(j.env, MSLAUNCH_SECRET="not-the-job-secret", HOME=str(home))
    intruder = j.start(h2, 2, env=other)
    assert intruder.wait() == 1, transcript(j)
    assert "secret is not the job's" in intruder.out, intruder.out
    assert "MSLAUNCH_SECRET" in intruder.out
    assert str(home / ".mslaunch" / "secret") in intruder.out, intruder.out
    assert owners not in intruder.out, intruder.out
    assert j.nodes[0].wait() == 1          # the job never formed: cluster time out
    # the master says so too, without -v, and names the refused node at the time out
    master = j.nodes[0].out
    assert f"node service: refused node {h2.addr}: this node's secret is not the job's" \
        in master, master
    assert "cluster time out" in master and f"refused: {h2.addr} (this node's secret" in master
    j.settle()


# -- recovery -------------------------------------------------------------------------

def test_a_failed_worker_on_another_node_is_started_again(job, tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    j = job(4, FAIL_RANK="3", FAIL_ONCE=str(marks), FAIL_AFTER="0.2", SLEEP="1.5",
            MS_ENABLE_RECOVERY="1")
    h1, h2 = j.bed.hosts[:2]
    j.start(h1, 2, "--node_rank=0")
    j.start(h2, 2, "--node_rank=1", "--max_restarts=2")
    assert j.wait() == [0, 0], transcript(j)
    log = j.nodes[1].logs()["worker_3.log"]
    assert "mslaunch: restart 1 of 2 of worker 3 (the previous run exited with code 3)\n" in log, log
    assert log.count('"RANK_ID": "3"') == 2
    j.settle()


# -- TLS ----------------------------------------------------------------------------

def _tls_files(d, name_prefix: str = "", ca=None):
    """A CA (unless given), a server and a client identity as PKCS#12 files."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import pkcs12
    from cryptography.x509.oid import NameOID
    now = datetime.datetime.now(datetime.timezone.utc)

    def name(cn):
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def cert(subject, key, issuer, issuer_key, is_ca):
        return (x509.CertificateBuilder().subject_name(name(subject)).issuer_name(name(issuer))
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(days=1))
                .not_valid_after(now + datetime.timedelta(days=365))
                .add_extension(x509.BasicConstraints(ca=is_ca, path_length=None), True)
                .sign(issuer_key, hashes.SHA256()))

    if ca is None:
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca = (ca_key, cert(f"{name_prefix}test CA", ca_key, f"{name_prefix}test CA", ca_key,
                           True))
    ca_key, ca_cert = ca
    (d / f"{name_prefix}ca.pem").write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    for role in ("server", "client"):
        key = ec.generate_private_key(ec.SECP256R1())
        c = cert(f"{name_prefix}{role}", key, f"{name_prefix}test CA", ca_key, False)
        blob = pkcs12.serialize_key_and_certificates(
            role.encode(), key, c, [ca_cert],
            serialization.BestAvailableEncryption(b"pw-" + role.encode()))
        (d / f"{name_prefix}{role}.p12").write_bytes(blob)
    return ca


def _tls_config(d, name: str, prefix: str, ca_prefix: str = "") -> str:
    path = d / name
    path.write_text(json.dumps({
        "server_cert_path": f"{prefix}server.p12", "client_cert_path": f"{prefix}client.p12",
        "ca_cert_path": f"{ca_prefix or prefix}ca.pem", "crl_path": "",
        "cipher_list": "ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-ECDSA-AES128-GCM-SHA256",
        "cert_expire_warning_time_in_day": 30}))
    return str(path)


@pytest.fixture
def tls_dir(tmp_path):
    pytest.importorskip("cryptography")
    d = tmp_path / "tls"
    d.mkdir()
    _tls_files(d)
    _tls_files(d, "rogue-")
    return d


TLS_PASSWORDS = {"MSLAUNCH_TLS_SERVER_PASSWORD": "pw-server",
                 "MSLAUNCH_TLS_CLIENT_PASSWORD": "pw-client"}


def test_nodes_over_tls_form_the_job(job, tls_dir):
    j = job(4, **TLS_PASSWORDS)
    config = _tls_config(tls_dir, "config.json", "")
    h1, h2 = j.bed.hosts[:2]
    j.start(h1, 2, f"--tls_config={config}")
    j.start(h2, 2, f"--tls_config={config}")
    assert j.wait() == [0, 0], transcript(j)
    assert sorted(j.envs()) == [0, 1, 2, 3]
    j.settle()


def test_a_node_whose_certificate_is_not_from_the_ca_is_refused(job, tls_dir):
    j = job(4, time_out=4, SLEEP="60", **TLS_PASSWORDS)
    good = _tls_config(tls_dir, "config.json", "")
    # Its own certificate is from another CA; it trusts the job's CA.
    rogue = _tls_config(tls_dir, "rogue.json", "rogue-", ca_prefix="")
    h1, h2 = j.bed.hosts[:2]
    j.start(h1, 2, f"--tls_config={good}")
    intruder = j.start(h2, 2, f"--tls_config={rogue}")
    assert intruder.wait() == 1, transcript(j)
    assert "certificate" in intruder.out and "Traceback" not in intruder.out, intruder.out
    assert j.nodes[0].wait() == 1, transcript(j)
    j.settle()


def test_a_node_without_tls_is_refused_by_a_tls_service(job, tls_dir):
    j = job(4, time_out=4, SLEEP="60", **TLS_PASSWORDS)
    config = _tls_config(tls_dir, "config.json", "")
    h1, h2 = j.bed.hosts[:2]
    j.start(h1, 2, f"--tls_config={config}")
    plain = j.start(h2, 2)
    assert plain.wait() == 1, transcript(j)
    assert "TLS" in plain.out and "Traceback" not in plain.out, plain.out
    assert j.nodes[0].wait() == 1
    j.settle()


# -- hostile peers on the service port ---------------------------------------------------

def _poke(addr: str, port: int, data: bytes) -> None:
    try:
        with socket.create_connection((addr, port), timeout=2) as s:
            if data:
                s.sendall(data)
    except OSError:
        pass


def test_hostile_peers_on_the_service_port_do_not_harm_the_job(job):
    j = job(4, SLEEP="3")
    h1, h2 = j.bed.hosts[:2]
    j.start(h1, 2, "--verbose")
    service = (j.master.addr, j.port + 1)
    assert wait_for(lambda: _connects(*service), 20)
    rng = random.Random(7)
    garbage = [b"", b"GET / HTTP/1.1\r\n\r\n", b"\x00" * 64, b"\xff" * 70000,
               bytes(rng.randrange(256) for _ in range(3000)),
               b"\x16\x03\x01\x02\x00" + b"\x01" * 512]
    for data in garbage:
        _poke(*service, data)
    # A slow peer that never speaks, held open while the real node joins.
    idle = socket.create_connection(service, timeout=2)
    try:
        j.start(h2, 2)
        assert j.wait() == [0, 0], transcript(j)
    finally:
        idle.close()
    assert sorted(j.envs()) == [0, 1, 2, 3]
    assert "Traceback" not in transcript(j)
    j.settle()


def _connects(addr: str, port: int) -> bool:
    try:
        socket.create_connection((addr, port), timeout=1).close()
        return True
    except OSError:
        return False


# -- real MindSpore ---------------------------------------------------------------

def test_real_mindspore_across_two_nodes_with_the_master_named_by_host_name(job):
    """One all-reduce over MindSpore's CPU collectives, one worker on each of two
    nodes, ``--master_addr`` the master's name from the hosts' /etc/hosts."""
    import os
    from helpers import PY
    from mindspore_runs import mindspore_flake, need_mindspore
    need_mindspore()
    for attempt in range(2):
        j = job(2, time_out=60)
        j.tmp = j.tmp / f"attempt{attempt}"
        j.tmp.mkdir()
        j.env["PATH"] = f"{os.path.dirname(PY)}:{j.env['PATH']}"    # the venv's python
        h1, h2 = j.bed.hosts[:2]
        for host in (h1, h2):
            j.start(host, 1, task=program("ms_real.py"), master_addr=h1.name)
        codes = j.wait(110)
        logs = {name: text for n in j.nodes for name, text in n.logs().items()}
        if codes == [0, 0] or not mindspore_flake(transcript(j), logs):
            break
        print(f"attempt {attempt}: MindSpore's own failure, not mslaunch's; again")
        j.cleanup()
    assert codes == [0, 0], transcript(j)
    ports = set()
    for n in j.nodes:
        (text,) = [t for name, t in n.logs().items() if name.startswith("worker_")]
        (row,) = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
        assert (row["size"], row["sum"]) == (2, 3.0), text[-2000:]
        assert row["at_exec"]["MS_SCHED_HOST"] == h1.addr       # the name, resolved
        ports.add(row["at_exec"]["MASTER_PORT"])
    assert len(ports) == 1 and str(j.port) not in ports        # one free port for all
    j.settle()
