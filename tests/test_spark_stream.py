"""``spark.readStream.format("bookfs")`` over a live log: a read-only mount follows a log
that a read-write mount of the same log appends to, and a streaming query (Parquet file
sink + checkpoint) in a separate driver process is SIGKILLed in the middle of a batch,
restarted from its checkpoint with ``Trigger.AvailableNow`` (by default in this process's
shared session, whose JVM is up already; ``BOOKFS_SPARK_LONG=1``: in a new driver process,
after longer batches and appends), and must have delivered every event exactly once.  The
Spark session the Spark test modules share (conftest.py) does the checks and the
static-log streams."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

pyspark = pytest.importorskip("pyspark")

from bookfs import spark as bs
from bookfs.formats.book import Book  # noqa: E402
from tests.mounting import mounted, run_bookfs  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.xdist_group("spark-b")]  # one JVM per worker
INITIAL = 1000  # events in the log when the stream starts
TOTAL = 2500  # after the appends (payloads taken from a sample log of TOTAL events)
PER_TRIGGER = 150  # maxEventsPerTrigger of the live run
LONG = bool(os.environ.get("BOOKFS_SPARK_LONG"))
#: Seconds a worker of the live run sleeps after each Arrow batch (time to kill it mid-batch)
SLOW = 1.0 if LONG else 0.5
#: Seconds the appender pauses every 50 events: either way it is still appending when the
#: live run is killed (its ~1,500 appends take seconds), and is waited for after the kill
PAUSE = 0.2 if LONG else 0.05
WT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: The streaming driver, run as its own process.  ``--slow S``: after handing each Arrow
#: batch on, a worker notes the batch's first event in MARKERS and sleeps S seconds, so a
#: micro-batch takes long enough to be killed in the middle (a hook of this test only).
DRIVER = r'''
import argparse, os, time
from bookfs import spark as bs

p = argparse.ArgumentParser()
p.add_argument("mnt"); p.add_argument("out"); p.add_argument("checkpoint")
p.add_argument("--max-events", type=int)
p.add_argument("--available-now", action="store_true")
p.add_argument("--slow", type=float, default=0.0)
p.add_argument("--markers")
a = p.parse_args()
spark = bs.register(bs.session("local[2]", "bookfs stream test"))
reader = spark.readStream.format("bookfs")
if a.max_events:
    reader = reader.option("maxEventsPerTrigger", a.max_events)
df = reader.load(a.mnt)
if a.slow:
    slow, markers = a.slow, a.markers

    def hook(batches):
        for b in batches:
            yield b
            if b.num_rows:
                open(os.path.join(markers, str(b.column(0)[0].as_py())), "w").close()
                time.sleep(slow)

    df = df.mapInArrow(hook, df.schema)
w = (df.writeStream.format("parquet").option("path", a.out)
     .option("checkpointLocation", a.checkpoint))
w = w.trigger(availableNow=True) if a.available_now else w.trigger(processingTime="0.5 seconds")
q = w.start()
q.awaitTermination()
print("done", q.lastProgress["sources"][0]["endOffset"] if q.lastProgress else None,
      flush=True)
'''


@pytest.fixture(scope="module")
def env(tmp_path_factory, spark):
    root = tmp_path_factory.mktemp("spark_stream")
    full, log = root / "full", root / "log"
    for src, n in ((full, TOTAL), (log, INITIAL)):
        run_bookfs("sample", str(src), "--events", str(n))
    driver = root / "driver.py"
    driver.write_text(DRIVER)
    # the log is appended to through `rw` and followed (1 MiB segments) through `ro`;
    # `static` is a log nobody writes
    with mounted(log, root / "rw"), mounted(log, root / "ro", "-o", "ro,segment_mb=1"), \
            mounted(full, root / "static", "-o", "ro,segment_mb=1"):
        yield argparse.Namespace(root=root, full=full, rw=str(root / "rw"),
                                 ro=str(root / "ro"), static=str(root / "static"),
                                 driver=str(driver), spark=spark)


def rows(df) -> list[tuple]:
    return sorted(map(tuple, df.collect()))


def source_offsets(checkpoint) -> dict[int, dict]:
    """batch id -> the source's end offset, from the checkpoint's offset log."""
    d = os.path.join(checkpoint, "offsets")
    out = {}
    for name in os.listdir(d):
        if name.isdigit():
            with open(os.path.join(d, name)) as f:
                out[int(name)] = json.loads(f.read().splitlines()[-1])
    return out


def committed_batches(checkpoint) -> set[int]:
    d = os.path.join(checkpoint, "commits")
    return {int(n) for n in os.listdir(d) if n.isdigit()} if os.path.isdir(d) else set()


def sink_files(out) -> set[str]:
    """The Parquet files the file sink's log lists as committed (basenames)."""
    d = os.path.join(out, "_spark_metadata")
    files = set()
    for name in os.listdir(d):
        if name.split(".")[0].isdigit() and not name.endswith(".crc"):
            with open(os.path.join(d, name)) as f:
                for line in f.read().splitlines()[1:]:
                    files.add(os.path.basename(json.loads(line)["path"]))
    return files


def run_driver(env, *args, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, env.driver, *map(str, args)],
                            env=dict(os.environ, PYTHONPATH=WT), start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def wait_for_last(mnt: str, last: int, timeout: float = 60.0) -> bool:
    """Wait until the mount's ``info`` says ``last: <last>``."""
    from bookfs.formats.info import parse

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(f"{mnt}/info") as f:
            if parse(f.read()).get("last") == str(last):
                return True
        time.sleep(0.1)
    return False


def append_events(mnt: str, payloads: dict[int, bytes], pause: float) -> None:
    """Append ``payloads`` (event -> bytes, in order) through ``mnt/new/``."""
    for n, data in payloads.items():
        fd = os.open(f"{mnt}/new/{n}", os.O_WRONLY | os.O_CREAT)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)  # the commit: an error here is a refused append
        if n % 50 == 0:
            time.sleep(pause)


def test_killed_stream_restarts_exactly_once(env):
    root = env.root
    out, ck, markers = root / "out", root / "ck", root / "markers"
    markers.mkdir()
    with Book.open(env.full) as book:
        payloads = {n: book.read(n) for n in range(INITIAL + 1, TOTAL + 1)}
    writer = threading.Thread(target=append_events, args=(env.rw, payloads, PAUSE))
    driver = run_driver(env, env.ro, out, ck, "--max-events", PER_TRIGGER, "--slow", SLOW,
                        "--markers", markers)

    def rows_in_flight(batch: int, planned: dict) -> bool:
        start = planned[batch - 1]["event"]
        return any(int(m) > start for m in os.listdir(markers))

    kill_mid_batch(driver, ck, out, writer, rows_in_flight)
    assert wait_for_last(env.ro, TOTAL)  # the read-only mount has seen every append
    # offsets are event numbers: consecutive ranges, at most PER_TRIGGER events each
    offsets = source_offsets(ck)
    ends = [offsets[b]["event"] for b in sorted(offsets)]
    assert all(0 < b - a <= PER_TRIGGER for a, b in zip([0] + ends, ends))
    assert set(offsets[0]) == {"event"}

    if LONG:  # a new driver process
        again = run_driver(env, env.ro, out, ck, "--available-now")
        stdout, stderr = again.communicate(timeout=240)
        assert again.returncode == 0, stderr[-3000:]
    else:  # the DRIVER's query, with --available-now, in this process
        q = (env.spark.readStream.format("bookfs").load(env.ro).writeStream
             .format("parquet").option("path", str(out)).option("checkpointLocation", str(ck))
             .trigger(availableNow=True).start())
        q.awaitTermination()
        stdout = f"done {q.lastProgress['sources'][0]['endOffset'] if q.lastProgress else None}"
    assert f"'event': {TOTAL}" in stdout or f'"event": {TOTAL}' in stdout, stdout
    got = rows(env.spark.read.parquet(str(out)))
    events = [r[0] for r in got]
    assert events == list(range(1, TOTAL + 1))  # each event once, none missing
    assert got == rows(bs.read_events(env.spark, env.ro))  # every column
    # the killed batch was redone with its own bounds (deterministic offsets)
    redone = source_offsets(ck)
    assert all(redone[b] == offsets[b] for b in offsets)
    assert committed_batches(ck) >= set(offsets)


def test_available_now_on_a_static_log(env):
    out, ck = env.root / "static_out", env.root / "static_ck"

    def run():
        q = (env.spark.readStream.format("bookfs").option("maxEventsPerTrigger", 1000)
             .load(env.static).writeStream.format("parquet").option("path", str(out))
             .option("checkpointLocation", str(ck)).trigger(availableNow=True).start())
        q.awaitTermination()
        return q

    q = run()
    progress = [(p["numInputRows"], p["sources"][0]["endOffset"]) for p in q.recentProgress]
    assert [n for n, _ in progress if n] == [1000, 1000, 500]
    assert [json.loads(e) for n, e in progress if n] == [
        {"event": 1000}, {"event": 2000}, {"event": 2500}]
    assert {b: o["event"] for b, o in source_offsets(ck).items()} == {
        0: 1000, 1: 2000, 2: 2500}
    ref = rows(bs.read_events(env.spark, env.static))
    assert rows(env.spark.read.parquet(str(out))) == ref
    # run again on the same checkpoint: nothing new, nothing written twice
    q = run()
    assert sum(p["numInputRows"] for p in q.recentProgress) == 0
    assert rows(env.spark.read.parquet(str(out))) == ref


def test_since_until_bound_the_stream(env):
    out, ck = env.root / "range_out", env.root / "range_ck"
    q = (env.spark.readStream.format("bookfs").option("since", 2001).option("until", 2300)
         .load(env.static).writeStream.format("parquet").option("path", str(out))
         .option("checkpointLocation", str(ck)).trigger(availableNow=True).start())
    q.awaitTermination()
    got = rows(env.spark.read.parquet(str(out)))
    assert [r[0] for r in got] == list(range(2001, 2301))
    assert {o["event"] for o in source_offsets(ck).values()} == {2300}


def test_stream_refuses_what_is_no_mount_and_bad_options(env, tmp_path):
    # many mounts stream with one offset per ship (issue 24: tests/test_spark_fleet.py);
    # a glob that matches a directory that is no mount is refused in one line
    with pytest.raises(Exception, match="is not a bookfs mount"):
        env.spark.readStream.format("bookfs").load(f"{env.root}/*").writeStream \
            .format("noop").start().awaitTermination(10)
    with pytest.raises(Exception, match="is not a bookfs mount"):
        env.spark.readStream.format("bookfs").load(str(tmp_path)).writeStream \
            .format("noop").start().awaitTermination(10)
    with pytest.raises(Exception, match="maxEventsPerTrigger must be at least 1"):
        env.spark.readStream.format("bookfs").option("maxEventsPerTrigger", 0) \
            .load(env.static).writeStream.format("noop").start().awaitTermination(10)


def test_stream_goes_on_across_a_roll(spark, tmp_path):
    """A read-only mount of a pier whose ship rolls to a new epoch mid-stream: the stream
    delivers the events of both epochs, each once (issue 23.5)."""
    from bookfs.formats.pier import Pier
    from tests.lmdb_fixtures import make_pier, make_vere_epoch, meta_values, payloads

    before, after = payloads(1, 12), payloads(13, 9)
    root = make_pier(tmp_path / "pier", [("lmdb", before[:6]), ("vere", before[6:])])
    with mounted(root, tmp_path / "mnt", "-o", "ro") as mnt:
        q = (spark.readStream.format("bookfs").load(mnt).writeStream.format("memory")
             .queryName("bookfs_roll").trigger(processingTime="0.5 seconds").start())
        try:
            def delivered() -> list[int]:
                return sorted(r[0] for r in spark.sql("select event from bookfs_roll")
                              .collect())

            deadline = time.monotonic() + 60
            while delivered() != list(range(1, 13)) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert delivered() == list(range(1, 13))
            new = root / ".urb" / "log" / "0i12"  # the roll
            make_vere_epoch(new, 12, [], meta=meta_values())
            (new / "epoc.txt").write_text("3")
            with Pier.open(root, writable=True) as pier:
                pier.save(13, after[:4])
                pier.save(17, after[4:])
            deadline = time.monotonic() + 60
            while len(delivered()) < 21 and time.monotonic() < deadline:
                time.sleep(0.2)
            assert delivered() == list(range(1, 22))
            assert q.exception() is None
            rows = {r["event"]: r for r in
                    spark.sql("select event, jam from bookfs_roll").collect()}
            assert [bytes(rows[n]["jam"]) for n in range(1, 22)] == [
                p[4:] for p in before + after]
        finally:
            q.stop()


def kill_mid_batch(driver, ck, out, writer: threading.Thread, rows_in_flight) -> int:
    """Start ``writer`` once the stream driver has committed a batch (the log grows under
    the live stream), then SIGKILL the driver while a later batch is planned and
    ``rows_in_flight(batch, planned_offsets)`` says rows of it were written; check that
    the kill left that batch planned, not committed, with a part file of it on disk.
    Returns the killed batch.  The writer is joined and the driver killed whatever
    happens."""
    killed = None
    try:
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline and driver.poll() is None:
            done = committed_batches(ck)
            if done and not writer.is_alive() and writer.ident is None:
                writer.start()  # the stream is live: the log grows under it from now
            planned = source_offsets(ck) if os.path.isdir(ck / "offsets") else {}
            running = [b for b in planned if b not in done and b >= 2]
            if running and rows_in_flight(running[0], planned):
                killed = running[0]
                os.killpg(driver.pid, signal.SIGKILL)
                break
            time.sleep(0.05)
        assert killed is not None, driver.communicate(timeout=5)
        driver.wait(timeout=30)
        # the kill left the batch planned but not committed, with rows written for it
        assert killed not in committed_batches(ck)
        on_disk = {f for f in os.listdir(out) if f.endswith(".parquet")}
        assert on_disk - sink_files(out), "no part file of the killed batch"
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
        if writer.ident is not None:
            writer.join()
    return killed
