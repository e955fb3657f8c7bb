"""``spark.read.format("bookfs")`` (bookfs.spark.source) over real read-only mounts, checked
against ``read_events`` (the binaryFile reference path) on the same mount, with the Spark
session the Spark test modules share (conftest.py; start-up costs 10-20 s)."""

from __future__ import annotations

import argparse
import os

import pytest

pyspark = pytest.importorskip("pyspark")

from bookfs import spark as bs
from bookfs.spark.source import PUSHDOWN_SAFE  # noqa: E402
from tests.lmdb_fixtures import make_pier, meta_values  # noqa: E402
from tests.mounting import mounted, run_bookfs  # noqa: E402
from tests.test_formats_matrix import payloads  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.xdist_group("spark-b")]  # one JVM per worker
EVENTS = 3000


@pytest.fixture(scope="module")
def env(tmp_path_factory, spark):
    root = tmp_path_factory.mktemp("spark_source")
    src, mnt = root / "log", root / "mnt"
    run_bookfs("sample", str(src), "--events", str(EVENTS))
    # 1 MiB segments: the ~11 MB sample makes several, so partition pruning shows
    with mounted(src, mnt, "-o", "ro,segment_mb=1"):
        ref = sorted(map(tuple, bs.read_events(spark, str(mnt)).collect()))
        yield argparse.Namespace(root=root, mnt=str(mnt), spark=spark, ref=ref)


def rows(df) -> list[tuple]:
    return sorted(map(tuple, df.collect()))


def segment_firsts(mnt: str) -> list[int]:
    return sorted(int(n) for n in os.listdir(os.path.join(mnt, "segments")))


def test_rows_and_schema_equal_read_events(env):
    df = env.spark.read.format("bookfs").load(env.mnt)
    assert df.schema == bs.read_events(env.spark, env.mnt).schema
    assert [r[0] for r in env.ref] == list(range(1, EVENTS + 1))
    assert rows(df) == env.ref  # every column, committed_at included
    firsts = segment_firsts(env.mnt)
    assert len(firsts) > 3
    # consecutive segments packed into tasks of about maxPartitionBytes (512 MiB: the
    # whole ~11 MB log is one task, below MIN_TASK_BYTES for a second); at 1 byte, one
    # segment a task
    assert df.rdd.getNumPartitions() == 1
    each = env.spark.read.format("bookfs").option("maxPartitionBytes", 1).load(env.mnt)
    assert each.rdd.getNumPartitions() == len(firsts)
    assert rows(each) == env.ref
    sizes = [os.stat(os.path.join(env.mnt, "segments", f"{f:012d}")).st_size for f in firsts]
    most = sum(sorted(sizes)[-2:])  # room for any two segments, maybe more small ones
    # balanced runs (bookfs.spark.partitions.balanced): ceil(total / most) of them
    packed = env.spark.read.format("bookfs").option("maxPartitionBytes", most).load(env.mnt)
    assert packed.rdd.getNumPartitions() == -(-sum(sizes) // most) < len(firsts)
    assert rows(packed) == env.ref


def test_since_until_options(env):
    df = (env.spark.read.format("bookfs").option("since", 100).option("until", 150)
          .load(env.mnt))
    assert rows(df) == [r for r in env.ref if 100 <= r[0] <= 150]
    tail = env.spark.read.format("bookfs").option("since", EVENTS - 2).load(env.mnt)
    assert [r[0] for r in rows(tail)] == [EVENTS - 2, EVENTS - 1, EVENTS]
    beyond = env.spark.read.format("bookfs").option("since", EVENTS + 1).load(env.mnt)
    assert beyond.count() == 0


def test_event_filters_read_only_their_segments(env):
    firsts = segment_firsts(env.mnt)
    # a range inside one segment: one partition, and the filter is gone from the plan
    a = firsts[len(firsts) // 2] + 1
    b = a + 10
    df = (env.spark.read.format("bookfs").option("maxPartitionBytes", 1).load(env.mnt)
          .where(f"event between {a} and {b}"))
    plan = df._jdf.queryExecution().executedPlan().toString()
    if PUSHDOWN_SAFE:
        assert df.rdd.getNumPartitions() == 1
        assert f">= {a}" not in plan and f"<= {b}" not in plan  # pushed, not re-applied
    else:  # Spark 4.3: a pushed filter would outlive its query (issue 19): none is
        assert df.rdd.getNumPartitions() == len(firsts)
        assert f">= {a}" in plan and f"<= {b}" in plan
    assert rows(df) == [r for r in env.ref if a <= r[0] <= b]
    # strict bounds, equality and `in` (which Spark re-checks), with the options
    base = env.spark.read.format("bookfs").option("until", 2000).load(env.mnt)
    got = rows(base.where(f"event > {a} and event < {b}"))
    assert got == [r for r in env.ref if a < r[0] < b]
    assert rows(base.where(f"event = {a}")) == [r for r in env.ref if r[0] == a]
    got = rows(base.where(f"event in ({a}, {b}, 2500)"))
    assert [r[0] for r in got] == [a, b]  # 2500 is past the option's until
    # a filter on another column is left to Spark, and still correct
    got = rows(base.where(f"event <= {a} and card = 'hear'"))
    assert got == [r for r in env.ref if r[0] <= a and r[8] == "hear"]


def test_pier_mount_reads_events_files(env):
    pier = make_pier(env.root / "pier", [("lmdb", payloads(1, 30)), ("vere", payloads(31, 20))],
                     meta=meta_values(who=0x100, fake=1, life=3))
    with mounted(pier, env.root / "pmnt", "-o", "ro") as pmnt:
        assert not os.path.exists(os.path.join(pmnt, "segments"))
        df = (env.spark.read.format("bookfs").option("eventsPerPartition", 20)
              .load(pmnt))
        ref = rows(bs.read_events(env.spark, pmnt))
        assert [r[0] for r in ref] == list(range(1, 51))
        assert rows(df) == ref
        assert df.rdd.getNumPartitions() == 3  # 50 events, 20 a partition
        got = rows(df.where("event between 25 and 35"))
        assert got == [r for r in ref if 25 <= r[0] <= 35]
        assert df.where("event between 25 and 35").rdd.getNumPartitions() == (
            1 if PUSHDOWN_SAFE else 3)


def rchar() -> int:
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))


@pytest.mark.parametrize("source", ["mapped", "read"])
def test_part_of_a_segment_reads_only_its_deeds(env, monkeypatch, source):
    """A range inside a segment reads the length words of the deeds before it and its own
    deeds, nothing else: counted by the kernel (/proc/self/io rchar) when the bytes are
    read, and as the range faulted in when they are mapped (page faults are not in
    rchar; bookfs.spark.partitions.SegmentBytes)."""
    from bookfs.spark import partitions as P
    from bookfs.spark.source import BookfsReader

    if source == "read":
        monkeypatch.setattr(P.SegmentBytes, "_mapped", staticmethod(lambda *a: None))
    populated = []
    real_populate = P.populate

    def populate(m, start, end, path):
        populated.append(end - start)
        return real_populate(m, start, end, path)

    monkeypatch.setattr(P, "populate", populate)
    firsts = segment_firsts(env.mnt)
    first, nxt = max(zip(firsts, firsts[1:]),
                     key=lambda fn: os.stat(os.path.join(env.mnt, "segments",
                                                         f"{fn[0]:012d}")).st_size)
    lo, hi = (first + nxt) // 2, (first + nxt) // 2 + 2
    reader = BookfsReader(env.mnt, lo, hi, 1)
    (run,) = reader.partitions()
    (part,) = run.ranges
    assert (part.first, part.last, part.lo, part.hi) == (first, nxt - 1, lo, hi)
    list(reader.read(run))  # imports and the stats of committed_at, once
    populated.clear()
    before = rchar()
    own = rchar() - before  # reading /proc/self/io counts too
    batches = list(reader.read(run))
    used = rchar() - before - 2 * own
    want = [r for r in env.ref if lo <= r[0] <= hi]
    got = sorted((r["event"], r["mug"], r["size"], r["jam"], r["wire"], r["card"])
                 for b in batches for r in b.to_pylist())
    assert [g[0] for g in got] == [lo, lo + 1, hi]
    assert got == [(w[0], w[2], w[3], w[4], w[7], w[8]) for w in want]
    # 8-byte length words of the skipped deeds, one more at the end, then the three deeds
    words, deeds = 8 * (lo - first) + 8 * 3, sum(w[3] + 20 for w in want)
    if source == "mapped":
        assert populated == [deeds]
        assert words <= used <= words + 8  # + a digit more in a /proc/self/io read
    else:
        assert populated == []
        assert words + deeds <= used <= words + deeds + 8
    seg_size = os.stat(os.path.join(env.mnt, "segments", f"{first:012d}")).st_size
    assert used < seg_size // 4


def test_not_a_mount_and_bad_options_are_named(env, tmp_path):
    with pytest.raises(Exception, match="is not a bookfs mount"):
        env.spark.read.format("bookfs").load(str(tmp_path)).collect()
    with pytest.raises(Exception, match="option since must be an event number"):
        env.spark.read.format("bookfs").option("since", "soon").load(env.mnt).collect()


def test_pushdown_never_changes_a_later_query_of_the_same_dataframe(env, tmp_path):
    """Issue 19 item 5: a filter pushed down for one query narrowed the reader that later
    queries of the same DataFrame reused (``count()`` after a filtered count gave the
    filtered count).  Every query shape in one session on one DataFrame: no filter,
    filter, no filter, another filter, a different shape of filter, no filter again,
    then a stream of the same mount."""
    df = env.spark.read.format("bookfs").load(env.mnt)
    every = [r[0] for r in env.ref]
    assert df.count() == EVENTS
    assert df.where("event between 100 and 199").count() == 100
    assert df.count() == EVENTS  # was 100
    assert [r[0] for r in rows(df.select("event"))] == every
    assert df.where(f"event > {EVENTS - 10}").count() == 10
    assert df.count() == EVENTS
    assert rows(df.where("event in (5, 7, 2999)").select("event")) == [(5,), (7,), (2999,)]
    assert df.where("event = 42").count() == 1
    assert rows(df) == env.ref
    # an options-bounded DataFrame keeps its own bounds, and no more
    base = env.spark.read.format("bookfs").option("until", 2000).load(env.mnt)
    assert base.where("event >= 1990").count() == 11
    assert base.count() == 2000
    assert base.where("event < 10").count() == 9
    assert base.count() == 2000
    # a stream of the same mount after all of that: every event, once
    out, ck = tmp_path / "out", tmp_path / "ck"
    q = (env.spark.readStream.format("bookfs").option("maxEventsPerTrigger", 1000)
         .load(env.mnt).writeStream.format("parquet").option("path", str(out))
         .option("checkpointLocation", str(ck)).trigger(availableNow=True).start())
    q.awaitTermination()
    got = [r[0] for r in env.spark.read.parquet(str(out)).select("event").collect()]
    assert sorted(got) == every
    assert df.count() == EVENTS


# --- projections (issue 22.3): decode only what the query uses ------------------------------

UNDECODED = ["event", "epoch", "mug", "size", "jam", "committed_at"]


def test_a_projection_reads_its_columns_and_decodes_nothing_it_does_not_need(env,
                                                                             monkeypatch):
    """The reader given a schema of some columns produces those, in that order, equal to
    the whole table's; without date/wire/card/error it never decodes a payload, and
    without committed_at it never stats an event (both are made to fail here, in the
    reader's own process)."""
    from bookfs.spark import decoding as D
    from bookfs.spark import rows as R
    from bookfs.spark.source import BookfsReader

    full = BookfsReader(env.mnt, 1, 400, 1)
    parts = full.partitions()

    def table(reader):
        return sorted(tuple(r.values()) for p in parts for b in reader.read(p)
                      for r in b.to_pylist())

    ref = table(full)
    names = bs.COLUMNS

    def boom(*a, **k):
        raise AssertionError("decoded or stat'ed though the projection does not need it")

    # both row builders decode through bookfs.spark.decoding (the compiled one scans
    # with its scan_ok, then reads the head itself)
    monkeypatch.setattr(D, "decode_body", boom)
    monkeypatch.setattr(D, "decode_payload", boom)
    monkeypatch.setattr(D, "scan", boom)
    monkeypatch.setattr(D, "scan_ok", boom)
    monkeypatch.setattr(R, "_mtime_us", boom)
    for cols in (["event", "size"], ["size", "event"], ["jam", "mug", "event"], ["size"],
                 [c for c in UNDECODED if c != "committed_at"]):
        got = table(BookfsReader(env.mnt, 1, 400, 1, cols))
        assert got == sorted(tuple(r[names.index(c)] for c in cols) for r in ref), cols
    with pytest.raises(AssertionError, match="decoded"):
        table(BookfsReader(env.mnt, 1, 400, 1, ["event", "card"]))
    with pytest.raises(AssertionError, match="stat"):
        table(BookfsReader(env.mnt, 1, 400, 1, ["event", "committed_at"]))


def test_schema_and_columns_option_through_spark(env):
    """``.schema("event long, size long")`` and ``.option("columns", "event,size")`` give
    that table through Spark; a column that is not the table's, or of the wrong type,
    is refused in one line naming it."""
    want = [(r[0], r[3]) for r in env.ref]
    by_schema = env.spark.read.format("bookfs").schema("event long, size long").load(env.mnt)
    assert by_schema.columns == ["event", "size"] and rows(by_schema) == want
    by_option = env.spark.read.format("bookfs").option("columns", "size,event").load(env.mnt)
    assert by_option.columns == ["size", "event"]
    assert rows(by_option.select("event", "size")) == want
    decoded = (env.spark.read.format("bookfs").schema("event long, card string, error string")
               .load(env.mnt))
    assert rows(decoded) == [(r[0], r[8], r[9]) for r in env.ref]
    for bad, says in (("event long, colour string", "'colour' is not a column"),
                      ("event int", "'event' is int")):
        with pytest.raises(Exception, match=says):
            env.spark.read.format("bookfs").schema(bad).load(env.mnt).collect()
    with pytest.raises(Exception, match="option columns: no column 'colour'"):
        env.spark.read.format("bookfs").option("columns", "event,colour").load(env.mnt)


def test_a_projection_of_a_pier_mount_reads_no_event_file_it_does_not_need(env):
    """On the ``events/`` path (no ``segments/``) a projection of event/size/committed_at
    reads no payload byte (sizes come from ``stat``); with ``jam`` it reads them."""
    from bookfs.spark.source import BookfsReader

    pier = make_pier(env.root / "pier2", [("lmdb", payloads(1, 30))],
                     meta=meta_values(who=0x100, fake=1, life=3))
    with mounted(pier, env.root / "pmnt2", "-o", "ro") as pmnt:
        full = sorted(tuple(r.values()) for p in BookfsReader(pmnt, None, None, 10).partitions()
                      for b in BookfsReader(pmnt, None, None, 10).read(p) for r in b.to_pylist())
        reader = BookfsReader(pmnt, None, None, 10, ["event", "size", "committed_at"])
        (part, *rest) = reader.partitions()
        list(reader.read(part))
        before = rchar()
        own = rchar() - before
        got = [tuple(r.values()) for b in reader.read(part) for r in b.to_pylist()]
        used = rchar() - before - 2 * own
        assert got == [(r[0], r[3], r[5]) for r in full[:10]]
        assert used < 8 * 10  # no payload read (each is over 8 bytes); stats only


def test_event_and_size_come_from_the_sizes_files(env, tmp_path):
    """``event`` and ``size`` alone are read from ``segments/<K>.sizes`` (issue 34.5): 8
    bytes an event and no payload byte, what ``ls -l events/`` shows.  So a log with one
    payload byte flipped still gives every event's size, as its listing does, while a
    read of any payload column fails on that deed's CRC."""
    from bookfs.formats.book import Book
    from bookfs.spark.source import BookfsReader

    src = tmp_path / "log"
    run_bookfs("sample", str(src), "--events", "400")
    with Book.open(src) as book:
        offset = book.index.offsets[250 - book.first] + 8 + 10
    with open(src / "book.log", "r+b") as f:
        os.pwrite(f.fileno(), bytes([os.pread(f.fileno(), 1, offset)[0] ^ 0xFF]), offset)
    with mounted(src, tmp_path / "mnt", "-o", "ro,segment_mb=0.1") as m:
        want = [(e, os.stat(f"{m}/events/{e:012d}").st_size) for e in range(1, 401)]
        df = env.spark.read.format("bookfs").option("columns", "event,size").load(str(m))
        assert rows(df) == want
        reader = BookfsReader(str(m), None, None, 10, ["event", "size"])
        (part,) = reader.partitions()
        list(reader.read(part))  # imports, once
        before = rchar()
        own = rchar() - before
        got = [tuple(r.values()) for b in reader.read(part) for r in b.to_pylist()]
        used = rchar() - before - 2 * own
        assert got == want and 8 * 400 <= used <= 8 * 400 + 8
        with pytest.raises(Exception, match="cannot be read|CRC"):
            env.spark.read.format("bookfs").option("columns", "event,jam").load(
                str(m)).collect()
