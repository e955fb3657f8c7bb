"""PySpark over a bookfs mount: one table row per event.

``read_events(spark, mountpoint)`` reads the mount's ``events/`` directory with Spark's
``binaryFile`` source (the directory, never a glob naming every file), selects event ranges
with ``_metadata.file_name`` filters (pruned at planning time, so unselected files are
never opened) and decodes each payload in Python with ``mapInArrow``.  Only the head of
each jam is decoded (:func:`bookfs.noun.peek_event`), so a multi-megabyte event costs a
copy, not a cue.

``read_events(..., bulk=True)`` reads ``segments/`` instead: a few large files of whole
on-disk deeds, split in Python (each deed's CRC checked), for logs too large for one file
per event.  It yields the same rows.

``write_parquet(df, path)`` writes such rows as Parquet partitioned by the UTC day of
``date`` and sorted by ``event`` within each file, so that readers filtering on ``day``,
``event`` or ``date`` skip directories and row groups.

Columns (:data:`SCHEMA`):

==============  =========  ======================================================
event           long       the event number (from the file name)
epoch           long       null: plain Book logs have no epoch directories
mug             int        payload bytes 0..4, little-endian (mugs are 31-bit)
size            long       payload bytes (mug + jam)
jam             binary     payload bytes 4..
committed_at    timestamp  the event file's mtime (millisecond precision, as Hadoop
                           reports it); bulk rows get the very same value
date            timestamp  the @da of a ``[date ovum]`` event, truncated to
                           microseconds; null for lifecycle events and anything that
                           does not decode
wire            string     the ovum's wire, e.g. ``/d/term/1`` (null likewise)
card            string     the card's tag, e.g. ``hear`` (null likewise)
==============  =========  ======================================================
"""

from __future__ import annotations

import bisect
import os
import sys
from typing import Iterator

SCHEMA = ("event long, epoch long, mug int, size long, jam binary, committed_at timestamp, "
          "date timestamp, wire string, card string")
COLUMNS = ["event", "epoch", "mug", "size", "jam", "committed_at", "date", "wire", "card"]

DEFAULT_MAX_LENGTH = 2**31 - 1
MAX_LENGTH_KEY = "spark.sql.sources.binaryFile.maxLength"

#: The small-file settings :func:`tune` applies, with why (figures: docs/benchmarks.md).
TUNED: dict[str, tuple[str, str]] = {
    "spark.sql.files.openCostInBytes": (
        "8192", "a file costs length + this when packed into tasks; the 4 MB default "
        "makes ~32 small events a task (3,125 tasks per 100k events), 8 KiB packs "
        "thousands of events per task"),
    "spark.sql.files.maxPartitionBytes": (
        str(64 << 20), "at most 64 MiB of payload per task: enough events per task to "
        "amortise task start-up, small enough that large events spread over cores"),
    "spark.sql.files.minPartitionNum": (
        "4", "at least 2 tasks per core of local[2], so one large event does not leave "
        "a core idle"),
    "spark.hadoop.fs.file.checksum.verify": (
        "false", "Hadoop's local filesystem otherwise looks up .<name>.crc beside every "
        "event: an extra FUSE lookup per file"),
    "spark.sql.files.ignoreCorruptFiles": (
        "false", "an unreadable event (EIO: its CRC failed) must fail the job, never "
        "silently drop a row"),
    "spark.sql.files.ignoreMissingFiles": (
        "false", "events are never deleted; a missing file is an error"),
    "spark.sql.sources.parallelPartitionDiscovery.threshold": (
        "32", "listing is parallelised only across more than this many subdirectories; "
        "events/ is one flat directory, so listing stays on the driver (kept at the "
        "default: a listing job per directory costs more than it saves here)"),
    "spark.sql.execution.arrow.maxRecordsPerBatch": (
        "2000", "events per Arrow batch to the Python decoder: bounds worker memory "
        "when large (multi-MB) events cluster"),
}


class EventTooLarge(ValueError):
    """A file is over ``spark.sql.sources.binaryFile.maxLength``: Spark cannot read it."""


# --- sessions ------------------------------------------------------------------------------


def tune(builder_or_session):
    """Apply :data:`TUNED` to a ``SparkSession.Builder`` (before ``getOrCreate``) or to a
    live ``SparkSession`` (SQL settings take effect at once; the Hadoop setting is also set
    under its bare name so new Hadoop configurations pick it up).  Returns its argument."""
    target = builder_or_session
    if hasattr(target, "getOrCreate"):  # a builder
        for key, (value, _) in TUNED.items():
            target = target.config(key, value)
        return target
    for key, (value, _) in TUNED.items():
        target.conf.set(key, value)
        if key.startswith("spark.hadoop."):
            target.conf.set(key[len("spark.hadoop."):], value)
    return target


def session(master: str = "local[2]", app: str = "bookfs", *, tuned: bool = True,
            progress: bool = False, conf: dict[str, str] | None = None):
    """A SparkSession with the configuration that works here (spark-notes.md): workers
    run this interpreter (``PYSPARK_PYTHON=sys.executable``), UI off, driver on
    ``$SPARK_LOCAL_IP`` (default 127.0.0.1: set it to an address the executors reach
    when they run on other hosts), session time zone UTC, small-file settings from
    :func:`tune` unless ``tuned=False``.  ``master`` may be ``local[N]``,
    ``local-cluster[W,C,MB]`` or a ``spark://`` URL; with a master other than
    ``local[N]`` the executors also get the directory this ``bookfs`` package is imported
    from on their ``PYTHONPATH`` (so, like the mount, it must be at the same path on every
    worker: docs/cluster.md)."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    driver = os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    if master.startswith("local-cluster"):
        # executors are launched with SPARK_HOME's scripts: pyspark's bundled tree has them
        import pyspark

        os.environ.setdefault("SPARK_HOME", os.path.dirname(pyspark.__file__))
    from pyspark.sql import SparkSession

    b = (SparkSession.builder.master(master).appName(app)
         .config("spark.ui.enabled", "false")
         .config("spark.ui.showConsoleProgress", "true" if progress else "false")
         .config("spark.sql.shuffle.partitions", "2")
         .config("spark.driver.bindAddress", driver)
         .config("spark.driver.host", driver)
         .config("spark.sql.session.timeZone", "UTC")
         # binaryFile holds each file whole in a row: room for a few segments/ files
         .config("spark.driver.memory", os.environ.get("BOOKFS_SPARK_MEMORY", "3g"))
         .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable))
    if not (master == "local" or master.startswith("local[")):
        # executors decode in Python workers that import bookfs.spark (mapInArrow)
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        b = b.config("spark.executorEnv.PYTHONPATH", os.pathsep.join(
            [here] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    if tuned:
        b = tune(b)
    for key, value in (conf or {}).items():
        b = b.config(key, value)
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def register(spark):
    """Make ``spark.read.format("bookfs").load(MOUNTPOINT)`` available in ``spark``
    (:mod:`bookfs.spark.source`), with Python data source filter pushdown on so that
    ``event`` comparisons narrow what is read, where that is safe
    (:data:`bookfs.spark.source.PUSHDOWN_SAFE`; not on Spark 4.3).  Returns ``spark``."""
    from bookfs.spark.source import PUSHDOWN_KEY, BookfsDataSource

    # on even where the reader pushes nothing: Spark refuses a reader with pushFilters
    # while it is off
    spark.conf.set(PUSHDOWN_KEY, "true")
    spark.dataSource.register(BookfsDataSource)
    return spark


# --- decoding (runs in the Python workers) ------------------------------------------------

_SECONDS_MIN, _SECONDS_MAX = -62135596800, 253402300799  # years 1..9999


def _da_micros(da: int) -> int:
    """An @da as microseconds since the Unix epoch (fraction truncated), as
    :func:`bookfs.noun.da_to_datetime` computes it."""
    from bookfs.noun import DA_UNIX_EPOCH

    return ((da >> 64) - DA_UNIX_EPOCH) * 1_000_000 + (((da & ((1 << 64) - 1)) * 1_000_000) >> 64)


def _out_schema():
    import pyarrow as pa

    ts = pa.timestamp("us", tz="UTC")
    return pa.schema([("event", pa.int64()), ("epoch", pa.int64()), ("mug", pa.int32()),
                      ("size", pa.int64()), ("jam", pa.binary()), ("committed_at", ts),
                      ("date", ts), ("wire", pa.string()), ("card", pa.string())])


class _Rows:
    """Column lists for one output batch."""

    def __init__(self):
        self.event, self.mug, self.size, self.jam = [], [], [], []
        self.committed, self.date, self.wire, self.card = [], [], [], []
        self.bytes = 0

    def add(self, event: int, payload, committed_us) -> None:
        from bookfs.noun import peek_event

        n = len(payload)
        self.event.append(event)
        self.size.append(n)
        self.committed.append(committed_us)
        if n >= 4:
            self.mug.append(int.from_bytes(payload[:4], "little", signed=True))
            jam = payload[4:]
        else:
            self.mug.append(None)
            jam = payload
        self.jam.append(bytes(jam))
        self.bytes += n
        da, wire, tag = peek_event(jam)
        if da is None:
            self.date.append(None)
            self.wire.append(None)
            self.card.append(None)
        else:
            self.date.append(_da_micros(da))
            self.wire.append(wire)
            self.card.append(tag)

    def __len__(self):
        return len(self.event)

    def batch(self):
        import pyarrow as pa

        schema = _out_schema()
        n = len(self.event)
        cols = [pa.array(self.event, pa.int64()), pa.nulls(n, pa.int64()),
                pa.array(self.mug, pa.int32()), pa.array(self.size, pa.int64()),
                pa.array(self.jam, pa.binary()),
                pa.array(self.committed, pa.int64()).cast(schema.field("committed_at").type),
                pa.array(self.date, pa.int64()).cast(schema.field("date").type),
                pa.array(self.wire, pa.string()), pa.array(self.card, pa.string())]
        return pa.RecordBatch.from_arrays(cols, schema=schema)


_BATCH_BYTES = 64 << 20
_BATCH_ROWS = 2000


def _binary_views(arr) -> Iterator[memoryview | None]:
    """Zero-copy views of the values of a pyarrow binary array."""
    import numpy as np

    arr = arr.combine_chunks() if hasattr(arr, "combine_chunks") else arr
    validity, offsets, data = arr.buffers()
    import pyarrow as pa

    width = 8 if pa.types.is_large_binary(arr.type) else 4
    offs = np.frombuffer(offsets, dtype=np.int64 if width == 8 else np.int32,
                         count=len(arr) + 1, offset=arr.offset * width)
    mv = memoryview(data) if data is not None else memoryview(b"")
    valid = arr.is_valid().to_pylist() if validity is not None else None
    for i in range(len(arr)):
        yield mv[offs[i]:offs[i + 1]] if valid is None or valid[i] else None


def _micros(col) -> list:
    """A pyarrow timestamp column as integer microseconds (None kept)."""
    import pyarrow as pa

    return col.cast(pa.timestamp("us", tz="UTC")).cast(pa.int64()).to_pylist()


def _batches(items) -> Iterator:
    """Arrow batches (:data:`SCHEMA`) of ``(event, payload, committed_us)`` items, at most
    :data:`_BATCH_ROWS` rows or about :data:`_BATCH_BYTES` payload bytes each."""
    rows = _Rows()
    for event, payload, when in items:
        rows.add(event, payload, when)
        if len(rows) >= _BATCH_ROWS or rows.bytes >= _BATCH_BYTES:
            yield rows.batch()
            rows = _Rows()
    if len(rows):
        yield rows.batch()


def _decode_files(batches):
    """mapInArrow: (event, committed_at, content) rows from events/ → :data:`SCHEMA`."""

    def items():
        for b in batches:
            events = b.column("event").to_pylist()
            committed = _micros(b.column("committed_at"))
            yield from zip(events, _binary_views(b.column("content")), committed)

    return _batches(items())


def _deeds(seg, first: int, until: int, name: int | None = None
           ) -> Iterator[tuple[int, memoryview]]:
    """The deeds of the segment bytes ``seg`` (a memoryview; its first deed is event
    ``first``) as ``(event, payload)`` pairs, up to event ``until``, each deed's length and
    CRC checked (ValueError naming the segment, event and byte otherwise).  ``name``: the
    segment's name when ``seg`` is a part of it starting at a later event (byte positions
    in errors are then relative to that part)."""
    from bookfs.formats.layout import DEED_LEN, DEED_OVERHEAD, DEED_TAIL, crc32

    name = first if name is None else name
    pos, event, end = 0, first, len(seg)
    while pos < end and event <= until:
        if pos + DEED_OVERHEAD > end:
            raise ValueError(f"segments/{name:012d}: truncated deed for event "
                             f"{event} at byte {pos}")
        (n,) = DEED_LEN.unpack_from(seg, pos)
        stop = pos + 8 + n
        if stop + 12 > end:
            raise ValueError(f"segments/{name:012d}: event {event} at byte {pos} "
                             f"claims {n} bytes, past the segment's end")
        crc, let = DEED_TAIL.unpack_from(seg, stop)
        if let != n or crc32(seg[pos:stop]) != crc:
            raise ValueError(f"segments/{name:012d}: event {event} at byte {pos} "
                             "fails its CRC check")
        yield event, seg[pos + 8:stop]
        pos, event = stop + 12, event + 1


def _segment_batches(segments, since: int, until: int, starts: list[int],
                     stamps: list[int]):
    """Arrow batches (:data:`SCHEMA`) of events ``since..until`` from ``segments``, an
    iterable of ``(first, bytes)`` pairs (or ``(first, bytes, name)`` for the part of
    segment ``name`` that starts at event ``first``); ``starts``/``stamps`` is the committed_at step
    function (event ``e`` has ``stamps[bisect_right(starts, e) - 1]`` microseconds)."""

    def items():
        for first, seg, *name in segments:
            for event, payload in _deeds(seg, first, until, *name):
                if event >= since:
                    yield event, payload, stamps[bisect.bisect_right(starts, event) - 1]

    return _batches(items())


def _split_segments(since: int, until: int, starts: list[int], stamps: list[int]):
    """mapInArrow factory: (first, content) rows from segments/ → :data:`SCHEMA`, each
    deed's CRC checked (:func:`_segment_batches`)."""

    def split(batches):
        def segments():
            for b in batches:
                firsts = b.column("first").to_pylist()
                yield from zip(firsts, _binary_views(b.column("content")))

        return _segment_batches(segments(), since, until, starts, stamps)

    return split


# --- the driver side -----------------------------------------------------------------------


def _max_length(spark) -> int:
    try:
        return int(spark.conf.get(MAX_LENGTH_KEY, str(DEFAULT_MAX_LENGTH)))
    except Exception:  # an unparsable setting: Spark would refuse it too
        return DEFAULT_MAX_LENGTH


def _name_num():
    from pyspark.sql import functions as F

    return F.col("_metadata.file_name").try_cast("long")


def _check_lengths(spark, df, what: str) -> None:
    """Raise :class:`EventTooLarge` (one clear line) if a selected file is over the
    binaryFile limit, before any content is read (a stat-only job: no file is opened)."""
    from pyspark.sql import functions as F

    limit = _max_length(spark)
    # No filter on ``length``: binaryFile would push it into its reader, and a task whose
    # files all fail it recurses once per empty file in FileScanRDD (StackOverflowError at
    # ~10k files).  A conditional aggregate over the stat-only columns is not pushed down.
    # (The second query filters on the name, which prunes files at planning instead.)
    over = F.col("length") > limit
    row = df.agg(F.min(F.when(over, F.col("num"))).alias("num"),
                 F.count(F.when(over, 1)).alias("n")).first()
    if row is not None and row["n"]:
        num = row["num"]
        length = df.where(F.col("num") == num).select("length").first()[0]
        raise EventTooLarge(
            f"{what} {num} is {length:,} bytes, over Spark's binaryFile limit "
            f"{MAX_LENGTH_KEY} = {limit:,} bytes; raise that setting (at most 2 GiB - 1)"
            + ("" if what == "segment" else " or read this log with bulk=True (--bulk)"))


def read_events(spark, mountpoint: str | os.PathLike, since: int | None = None,
                until: int | None = None, bulk: bool = False, *, check_limit: bool = True):
    """The events of the bookfs mount at ``mountpoint`` as a DataFrame (:data:`SCHEMA`),
    events ``since..until`` inclusive (either bound may be None).

    ``bulk=False`` reads ``events/`` (one file per event); ``bulk=True`` reads
    ``segments/`` and splits the deeds in Python, checking every CRC, with the same rows.
    With ``check_limit`` (the default) a file over ``spark.sql.sources.binaryFile.maxLength``
    raises :class:`EventTooLarge` here, naming the event and the limit, instead of a task
    failure later.
    """
    mnt = os.fspath(mountpoint)
    if not os.path.isdir(os.path.join(mnt, "events")):
        raise FileNotFoundError(f"{mnt} is not a bookfs mount (no events/ directory)")
    if bulk:
        return _read_bulk(spark, mnt, since, until, check_limit)
    from pyspark.sql import functions as F

    num = _name_num()
    df = spark.read.format("binaryFile").load(os.path.join(mnt, "events"))
    if since is not None:
        df = df.filter(num >= since)
    if until is not None:
        df = df.filter(num <= until)
    df = df.filter(num.isNotNull()).withColumn("num", num)
    if check_limit:
        _check_lengths(spark, df, "event")
    files = df.select(F.col("num").alias("event"),
                      F.col("modificationTime").alias("committed_at"), "content")
    return files.mapInArrow(_decode_files, SCHEMA)


def _mtime_us(path: str) -> int:
    """A file's mtime as Spark's binaryFile reports it (Hadoop: whole milliseconds)."""
    return os.stat(path).st_mtime_ns // 1_000_000 * 1000


def _stamps(mnt: str, ranges: list[tuple[int, int]]) -> tuple[list[int], list[int]]:
    """The committed_at step function over ``ranges`` ((first, last) event pairs, in
    order): ``(starts, stamps)``, event ``e`` having ``stamps[bisect_right(starts, e)-1]``.

    Event mtimes never decrease along the log, so when the first and last event of a
    range share an mtime every event between has it; otherwise bisect with ``stat`` of
    events/<N> (a few stats per change of mtime, never a read)."""
    starts: list[int] = []
    stamps: list[int] = []

    def ev(n: int) -> int:
        return _mtime_us(os.path.join(mnt, "events", f"{n:012d}"))

    def put(event: int, stamp: int) -> None:
        if not stamps or stamps[-1] != stamp:
            starts.append(event)
            stamps.append(stamp)

    def fill(lo: int, hi: int, mlo: int, mhi: int) -> None:
        # events lo..hi; lo has mlo, hi has mhi
        while True:
            put(lo, mlo)
            if mlo == mhi:
                return
            if hi - lo <= 1:
                put(hi, mhi)
                return
            mid = (lo + hi) // 2
            mm = ev(mid)
            fill(lo, mid, mlo, mm)
            lo, mlo = mid, mm

    for first, last in ranges:
        fill(first, last, ev(first), ev(last))
    return starts, stamps


def plan_segments(mnt: str, since: int | None, until: int | None
                  ) -> tuple[int, int, list[tuple[int, int, int]]]:
    """The segments of the mount at ``mnt`` that hold events ``since..until``:
    ``(lo, hi, [(first, last, range_lo, range_hi), ...])``, ``lo..hi`` being the events this
    read returns (``hi`` < ``lo`` if none) and each tuple a segment holding events
    ``first..last`` (named ``first``) with the part of ``lo..hi`` it holds.  The event count is read once, so ``hi`` is this read's
    snapshot: events appended later are not included."""
    seg_dir = os.path.join(mnt, "segments")
    firsts = sorted(int(n) for n in os.listdir(seg_dir) if n.isdigit())
    count = os.stat(os.path.join(mnt, "events")).st_size  # the mount reports its count
    lo = since if since is not None else (firsts[0] if firsts else 1)
    if not firsts or not count:
        hi = -1
    else:
        hi = firsts[0] + count - 1
        if until is not None:
            hi = min(hi, until)
    chosen = []
    for i, first in enumerate(firsts):
        last = firsts[i + 1] - 1 if i + 1 < len(firsts) else firsts[0] + count - 1
        if last < lo or first > hi:
            continue
        chosen.append((first, last, max(first, lo), min(last, hi)))
    return lo, hi, chosen


def _read_bulk(spark, mnt: str, since, until, check_limit: bool):
    from pyspark.sql import functions as F

    lo, hi, plan = plan_segments(mnt, since, until)
    chosen = [first for first, _, _, _ in plan]
    starts, stamps = _stamps(mnt, [(a, b) for _, _, a, b in plan])
    num = _name_num()
    df = (spark.read.format("binaryFile").load(os.path.join(mnt, "segments"))
          .filter(num.isin(chosen or [-1])).withColumn("num", num))
    if check_limit:
        _check_lengths(spark, df, "segment")
    segs = df.select(F.col("num").alias("first"), "content")
    return segs.mapInArrow(_split_segments(lo, hi, starts or [0], stamps or [None]), SCHEMA)


# --- writing -------------------------------------------------------------------------------

#: The partition column :func:`write_parquet` adds: the UTC calendar day of ``date``.
DAY = "day"
#: The directory Spark names a partition whose value is null (``day`` of the lifecycle
#: events, which have no ``date``); it reads back as a null ``day``.
NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"
#: Parquet's row-group size setting (bytes), a DataFrameWriter option.
ROW_GROUP_KEY = "parquet.block.size"


def day_column():
    """``date``'s UTC calendar day as a DATE column (null where ``date`` is null).  Computed
    from the microseconds since the epoch, so it does not depend on the session time zone."""
    from pyspark.sql import functions as F

    return F.expr("date_from_unix_date(CAST(floor(unix_micros(date) / 86400000000) AS INT))")


def write_parquet(df, path: str, *, row_group_bytes: int | None = None) -> None:
    """Write ``df`` (rows of :data:`SCHEMA`) as Parquet at ``path``, which must not exist,
    laid out for readers that filter:

    * partitioned by :data:`DAY` (``path/day=YYYY-MM-DD/``; events without a ``date``, the
      lifecycle events, go to ``day=__HIVE_DEFAULT_PARTITION__``, which Spark reads back
      as a null ``day``), so a filter on ``day`` prunes whole directories
      (``PartitionFilters`` in the plan);
    * one shuffle puts each day in one task (``repartition(day)``), which writes it as one
      file sorted by ``event`` (``sortWithinPartitions(day, event)``: ``day`` leads because
      the writer needs its input grouped by the partition column and would otherwise add a
      sort of its own), so row groups hold disjoint, increasing ``event`` ranges and their
      min/max statistics let a filter on ``event`` (or on ``date``, which grows with it)
      skip row groups.

    ``row_group_bytes`` sets Parquet's row-group size (default: Parquet's 128 MiB)."""
    from pyspark.sql import functions as F

    writer = (df.withColumn(DAY, day_column())
              .repartition(F.col(DAY))
              .sortWithinPartitions(DAY, "event")
              .write.mode("error").partitionBy(DAY))
    if row_group_bytes is not None:
        writer = writer.option(ROW_GROUP_KEY, str(row_group_bytes))
    writer.parquet(path)
