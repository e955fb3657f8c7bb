"""The Spark pipeline on a real Spark standalone cluster: a master and two workers started
from the pyspark distribution (``bin/spark-class ...deploy.master.Master`` and
``...deploy.worker.Worker``) as separate processes on free loopback ports, reading a real
read-only mount.

The daemons get neither ``PYTHONPATH`` nor ``PYSPARK_PYTHON``: that the executors run this
venv's Python and import this ``bookfs`` is what :func:`bookfs.spark.session` arranges
(``spark.executorEnv.*``), and the tests check it from inside the executors.  Each daemon
is its own process group (its executors and their Python workers are in it too), killed
whole at teardown, first politely, then with SIGKILL, whatever the tests did.

Issue 33.5: :mod:`bookfs.spark.master`'s probe is checked against each port of the
cluster (the master's, its web UI's, the workers'), with the master's JVM stopped for a
while too, and the command's run on the cluster has its master stopped (SIGSTOP) while
the driver registers: a slow master is waited for, never refused.

Short by default: a log of :data:`EVENTS` = 600 events, and the local-mode ``bookfs spark``
that the cluster's output is compared with runs in this process (its ``main``: no second
JVM to start).  ``BOOKFS_SPARK_LONG=1``: a log of 2,000 events, and the local-mode command
in a process of its own, as the long version did."""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

pyspark = pytest.importorskip("pyspark")

from bookfs import spark as bs
from bookfs.cli.commands import main  # noqa: E402
from bookfs.formats.book import Book  # noqa: E402
from tests.mounting import BOOKFS, mounted, run_bookfs  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.xdist_group("spark-b")]  # one JVM per worker
#: Events in the sample log: enough for several tasks on each worker (4+ partitions).
LONG = bool(os.environ.get("BOOKFS_SPARK_LONG"))
EVENTS = 2000 if LONG else 600
WORKERS = 2
SPARK_HOME = os.path.dirname(pyspark.__file__)
#: Small daemons: the machine has 2 cores; each worker offers 1 core and 1 GiB.
DAEMON_ENV = {"SPARK_DAEMON_MEMORY": "256m", "SPARK_LOCAL_IP": "127.0.0.1",
              "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def master_json(cluster) -> dict:
    with urllib.request.urlopen(f"{cluster.ui}/json/", timeout=10) as r:
        return json.load(r)


def wait_for(what: str, test, timeout: float = 90):
    deadline = time.monotonic() + timeout
    while True:
        try:
            got = test()
        except (OSError, ValueError):  # the web UI is not up yet, or (a master still
            got = None  # starting, on a loaded machine) answered /json/ with no JSON
        if got:
            return got
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up waiting for {what} after {timeout:.0f} s")
        time.sleep(0.1)


def _pgid_alive(pgid: int, deadline: float = 5.0) -> bool:
    """Whether a live (not zombie) process of group ``pgid`` is left.  The kernel answers
    first (``killpg`` with signal 0: no such group, none left), with no ``/proc`` read.
    Only when the group exists are its members' ``/proc/<pid>/stat`` read, to tell a
    zombie (which still counts as a member) from a live one, and that scan runs in a
    thread with a ``deadline``: a read of another process's ``/proc`` can wait behind that
    process, and past the deadline the group counts as alive."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    answer: list[bool] = []

    def scan() -> None:
        for stat in glob.glob("/proc/[0-9]*/stat"):
            try:
                with open(stat) as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                answer.append(True)
                return
        answer.append(False)

    t = threading.Thread(target=scan, name=f"pgid-{pgid}-scan", daemon=True)
    t.start()
    t.join(deadline)
    return answer[0] if answer else True


def stop_daemons(procs: list[subprocess.Popen]) -> None:
    """SIGTERM each daemon's process group (the JVM, its executors, their Python workers),
    then SIGKILL what is left after 10 s, and reap."""
    for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        for p in procs:
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(_pgid_alive(p.pid) for p in procs):
            time.sleep(0.2)
    for p in procs:
        p.wait(timeout=10)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("standalone")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYSPARK_PYTHON")}
    conf = root / "conf"  # an empty SPARK_CONF_DIR: nothing from the host's configuration
    conf.mkdir()
    env.update(DAEMON_ENV, SPARK_HOME=SPARK_HOME, SPARK_CONF_DIR=str(conf))
    port, ui_port = free_port(), free_port()
    procs: list[subprocess.Popen] = []

    def daemon(name: str, *args: str) -> None:
        log = open(root / f"{name}.log", "w")
        procs.append(subprocess.Popen(
            [os.path.join(SPARK_HOME, "bin", "spark-class"), *args], env=env, cwd=root,
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True))
        log.close()

    url = f"spark://127.0.0.1:{port}"
    c = argparse.Namespace(root=root, url=url, port=port, ui=f"http://127.0.0.1:{ui_port}",
                           work=[root / f"worker{i}" for i in range(WORKERS)],
                           worker_ports=[(free_port(), free_port()) for _ in range(WORKERS)])
    try:
        daemon("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
               "--port", str(port), "--webui-port", str(ui_port))
        c.master_pid = procs[0].pid  # spark-class execs the JVM: this is the master's
        wait_for("the master", lambda: master_json(c)["status"] == "ALIVE")
        for i, work in enumerate(c.work):
            rpc, ui = c.worker_ports[i]
            daemon(f"worker{i}", "org.apache.spark.deploy.worker.Worker", url,
                   "--host", "127.0.0.1", "--port", str(rpc), "--webui-port", str(ui),
                   "--cores", "1", "--memory", "1g", "--work-dir", str(work))
        wait_for(f"{WORKERS} workers",
                 lambda: master_json(c)["aliveworkers"] == WORKERS)
        yield c
    except BaseException:
        for log in sorted(root.glob("*.log")):  # what the daemons said, for the report
            print(f"--- {log.name}\n{log.read_text()[-2000:]}")
        raise
    finally:
        stop_daemons(procs)
        assert not any(_pgid_alive(p.pid) for p in procs), "a Spark daemon survived"


@pytest.fixture(scope="module")
def mount(tmp_path_factory):
    root = tmp_path_factory.mktemp("standalone_log")
    src, mnt = root / "log", root / "mnt"
    run_bookfs("sample", str(src), "--events", str(EVENTS))
    with mounted(src, mnt, "-o", "ro"):
        yield argparse.Namespace(root=root, src=str(src), mnt=str(mnt))


def engine_digest(src: str) -> tuple[int, int, int, str]:
    """(count, first, last, sha256 over every event number and payload) by the engine."""
    h = hashlib.sha256()
    with Book.open(src) as book:
        for e in range(1, book.count + 1):
            h.update(e.to_bytes(8, "little") + book.read(e))
        return book.count, 1, book.count, h.hexdigest()


def test_read_events_on_two_workers(cluster, mount, no_shared_spark):
    """A session on the standalone master reads the mount: every event, checksum equal to
    the engine's; both workers run an executor, and the Python workers are this venv's
    interpreter importing this bookfs."""
    import bookfs

    spark = bs.session(cluster.url, "bookfs standalone test",
                       conf={"spark.executor.memory": "512m", "spark.cores.max": "2"})
    try:
        tracker = spark.sparkContext._jsc.sc().statusTracker()
        wait_for("two executors", lambda: len(tracker.getExecutorInfos()) == WORKERS + 1)
        state = master_json(cluster)
        (app,) = state["activeapps"]
        assert app["id"] == spark.sparkContext.applicationId and app["cores"] == WORKERS
        assert [w["coresused"] for w in state["workers"]] == [1] * WORKERS

        df = bs.read_events(spark, mount.mnt)
        assert df.rdd.getNumPartitions() >= WORKERS

        def where(rows):  # runs in the executors' Python workers
            import os
            import sys

            import bookfs as b

            events = [r["event"] for r in rows]
            yield (os.getcwd(), sys.executable, b.__file__, len(events), events)

        parts = df.select("event").rdd.mapPartitions(where).collect()
        rows = {r["event"]: bytes(r["mug"].to_bytes(4, "little", signed=True)) + r["jam"]
                for r in df.select("event", "mug", "jam").collect()}
    finally:
        spark.stop()
    h = hashlib.sha256()
    for e in sorted(rows):
        h.update(e.to_bytes(8, "little") + rows[e])
    assert (len(rows), min(rows), max(rows), h.hexdigest()) == engine_digest(mount.src)
    assert sorted(e for p in parts for e in p[4]) == list(range(1, EVENTS + 1))
    assert {p[1] for p in parts} == {sys.executable}
    assert {p[2] for p in parts} == {bookfs.__file__}
    used = {str(w) for w in cluster.work for p in parts
            if p[0].startswith(str(w) + os.sep) and p[3]}
    assert used == {str(w) for w in cluster.work}, [p[:4] for p in parts]


def accept_queue(port: int) -> int:
    """How many connections wait to be accepted by the socket listening on ``port``: a
    LISTEN socket's ``rx_queue`` in ``/proc/net/tcp`` or ``tcp6`` (the kernel's
    ``get_tcp4_sock``/``get_tcp6_sock`` print its ``sk_ack_backlog`` there)."""
    waiting = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in list(f)[1:]:
                fields = line.split()
                if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                    waiting = max(waiting, int(fields[4].split(":")[1], 16))
    return waiting


def run_while_the_master_stops(cluster, cmd: list[str], hold: float = 5.0):
    """Run ``cmd``, a ``bookfs spark`` on the cluster, and stop the master's JVM
    (SIGSTOP) as soon as the command says "starting Spark" (its probe was answered):
    from then on the master answers nothing.  It stays stopped until the driver's
    connection waits in its accept queue (the driver is registering the run) and
    ``hold`` seconds more, or until the command exits; then SIGCONT, whatever happens.
    Returns (exit status, stdout, stderr, whether the driver was seen waiting)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    said: list[str] = []
    starting = threading.Event()
    stdout: list[str] = []

    def read_stderr():
        for line in proc.stderr:
            said.append(line)
            if "starting Spark" in line:
                starting.set()

    readers = [threading.Thread(target=read_stderr, daemon=True),
               threading.Thread(target=lambda: stdout.append(proc.stdout.read()),
                                daemon=True)]
    for t in readers:
        t.start()
    queued = False
    try:
        assert starting.wait(120), "".join(said)
        os.kill(cluster.master_pid, signal.SIGSTOP)
        deadline = time.monotonic() + 240
        while proc.poll() is None and time.monotonic() < deadline and not queued:
            queued = accept_queue(cluster.port) > 0
            time.sleep(0.1)
        end = time.monotonic() + hold
        while queued and proc.poll() is None and time.monotonic() < end:
            time.sleep(0.1)
    finally:
        os.kill(cluster.master_pid, signal.SIGCONT)
        try:
            proc.wait(300)
        finally:
            proc.kill()
            for t in readers:
                t.join(10)
    return proc.returncode, "".join(stdout), "".join(said), queued


def test_probe_tells_the_master_from_its_other_ports(cluster):
    """Issue 33.5: the probe (:mod:`bookfs.spark.master`: one ``RpcRequest`` in Spark's
    transport protocol) answers, against a real standalone cluster: the master's RPC port
    is a master, at once and even when its JVM is stopped for a while (SIGSTOP, then
    SIGCONT 1.5 s later: the answer comes when it resumes); the master's and the workers'
    web UIs are HTTP servers; a worker's RPC port is a worker's; an HA list passes when
    one address is a master.  The master logs no error for it."""
    from bookfs.errors import UsageError
    from bookfs.spark.master import check_master, probe

    t0 = time.monotonic()
    assert probe("127.0.0.1", cluster.port) is None
    assert time.monotonic() - t0 < 5
    http = "an HTTP server answered (a web UI or REST port?), not Spark's RPC"
    assert probe("127.0.0.1", int(cluster.ui.rsplit(":", 1)[1])) == http
    for rpc, ui in cluster.worker_ports:
        assert probe("127.0.0.1", rpc) == "a Spark worker's RPC port, not a master's"
        assert probe("127.0.0.1", ui) == http
    check_master(f"spark://127.0.0.1:{free_port()},127.0.0.1:{cluster.port}")
    with pytest.raises(UsageError, match="a Spark worker's RPC port, not a master's"):
        check_master(f"spark://127.0.0.1:{cluster.worker_ports[0][0]}")

    os.kill(cluster.master_pid, signal.SIGSTOP)
    resume = threading.Timer(1.5, os.kill, (cluster.master_pid, signal.SIGCONT))
    resume.start()
    try:
        t0 = time.monotonic()
        assert probe("127.0.0.1", cluster.port, timeout=60) is None
        assert time.monotonic() - t0 >= 1.0  # it was answered only once resumed
    finally:
        resume.join()
        os.kill(cluster.master_pid, signal.SIGCONT)
    log = (cluster.root / "master.log").read_text()
    assert "Unsupported message" not in log and "Error while invoking" not in log, log[-3000:]


def test_cli_on_the_cluster_equals_local_mode(cluster, mount, capsys):
    """``bookfs spark MNT --out DIR --master spark://...`` writes the same table as the
    same command in local mode, with executors on both workers.

    Issue 33.5: a real master slower than any timer is never refused.  The cluster run
    is given ``--master-timeout 2``, and its master's JVM is stopped (SIGSTOP) from just
    after the probe until the driver has waited 5 s on it to register the run; the run
    waits (it refused it after 2 s, "no Spark master registered this run", as it did
    under the test suite's load after its 20 s default) and completes once the master
    resumes."""
    import pyarrow.parquet as pq

    before = {str(w): set(os.listdir(w)) if w.exists() else set() for w in cluster.work}
    outs = {}
    for name, master in (("cluster", cluster.url), ("local", "local[2]")):
        out = mount.root / name
        argv = ["spark", mount.mnt, "--out", str(out), "--master", master]
        if name == "cluster":
            code, stdout, stderr, queued = run_while_the_master_stops(
                cluster, [*BOOKFS, *argv, "--master-timeout", "2"])
            assert code == 0, stderr[-3000:]
            assert queued, "the driver never reached the stopped master:\n" + stderr[-3000:]
        elif LONG:
            res = subprocess.run([*BOOKFS, *argv], capture_output=True, text=True,
                                 timeout=300)
            code, stdout, stderr = res.returncode, res.stdout, res.stderr
        else:  # the same command line, in this process
            capsys.readouterr()
            code = main(argv)
            stdout, stderr = capsys.readouterr()
        assert code == 0, stderr[-3000:]
        assert f"events:  {EVENTS:,}" in stdout, stdout
        outs[name] = out
    apps = {w: set(os.listdir(w)) - before[w] for w in before}
    assert all(len(a) == 1 for a in apps.values()), apps  # one new app on each worker
    assert len(set.union(*apps.values())) == 1  # the same app: the CLI's

    def table(out):
        t = pq.read_table(str(out / "data")).select(bs.COLUMNS + ["run", bs.DAY])
        return sorted(t.to_pylist(), key=lambda r: r["event"])

    got, want = table(outs["cluster"]), table(outs["local"])
    assert len(got) == EVENTS and got == want
    days = {name: sorted(os.path.relpath(os.path.dirname(f), out) for f in glob.glob(
        f"{out}/data/run=*/{bs.DAY}=*/*.parquet")) for name, out in outs.items()}
    assert days["cluster"] == days["local"]  # the same files: one per day and run
