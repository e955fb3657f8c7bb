"""PySpark over a bookfs mount: one table row per event.

``read_events(spark, mountpoint)`` reads the mount's ``events/`` directory with Spark's
``binaryFile`` source (the directory, never a glob naming every file), selects event ranges
with ``_metadata.file_name`` filters (pruned at planning time, so unselected files are
never opened) and decodes each payload in Python with ``mapInArrow``
(:func:`bookfs.spark.decoding.decode_payload`): every payload is validated (a jam that cues
exactly, or vere's ram encoding) by the compiled noun core when it built, small jams are
cued whole and a multi-megabyte one only has its head read (:func:`bookfs.noun.peek_event`).
An event that does not decode gets null ``date``/``wire``/``card`` and an ``error``
saying why; it never fails the job.

``read_events(..., bulk=True)`` reads ``segments/`` instead: a few large files of whole
on-disk deeds, split in Python (each deed's CRC checked), for logs too large for one file
per event.  It yields the same rows.

``write_parquet(df, path)`` writes such rows as Parquet partitioned by the UTC day of
``date`` and sorted by ``event`` within each file, so that readers filtering on ``day``,
``event`` or ``date`` skip directories and row groups.

Columns: :data:`SCHEMA`, described in :mod:`bookfs.spark.rows` (which also holds the
decoding this module and :mod:`bookfs.spark.source` share).
"""

from __future__ import annotations

import os
import sys

from bookfs.spark.rows import SCHEMA, EventMtime, _decode_files, _split_segments, plan_segments

DEFAULT_MAX_LENGTH = 2**31 - 1
MAX_LENGTH_KEY = "spark.sql.sources.binaryFile.maxLength"

#: The small-file settings :func:`tune` applies, with why (figures: docs/benchmarks-history.md,
#: "Spark pipeline").
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
        import bookfs

        here = os.path.dirname(os.path.dirname(os.path.abspath(bookfs.__file__)))
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
        raise _too_large(what, num, length, limit)


def _too_large(what: str, num: int, length: int, limit: int) -> EventTooLarge:
    """The one line for a file over the binaryFile limit."""
    return EventTooLarge(
        f"{what} {num} is {length:,} bytes, over Spark's binaryFile limit "
        f"{MAX_LENGTH_KEY} = {limit:,} bytes; raise that setting (at most 2 GiB - 1)"
        + ("" if what == "segment" else " or read this log with bulk=True (--bulk)"))


#: A run of at most this many events, both ends known, is read by naming its files
#: (``events/<N>``) instead of listing ``events/`` and filtering: an ``--incremental`` run
#: after a few appends no longer lists (and stats) a million files, nor runs a Spark job
#: to check their lengths (the driver stats the few it names).
NAMED_RANGE = 4096


def _named_range(spark, mnt: str, since: int | None, until: int | None,
                 check_limit: bool) -> list[str] | None:
    """The paths of events ``since..until`` when that is a short range (at most
    :data:`NAMED_RANGE`), each checked against the binaryFile limit with a ``stat`` (a
    missing one ends the range: it is past the last committed event); else None."""
    if since is None or until is None or not 0 <= until - since < NAMED_RANGE:
        return None
    limit = _max_length(spark) if check_limit else None
    paths = []
    for event in range(since, until + 1):
        path = os.path.join(mnt, "events", str(event))
        try:
            length = os.stat(path).st_size
        except FileNotFoundError:
            break
        if limit is not None and length > limit:
            raise _too_large("event", event, length, limit)
        paths.append(os.path.join(mnt, "events", f"{event:012d}"))
    return paths or None


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
    named = _named_range(spark, mnt, since, until, check_limit)
    df = spark.read.format("binaryFile").load(
        named if named is not None else os.path.join(mnt, "events"))
    if since is not None:
        df = df.filter(num >= since)
    if until is not None:
        df = df.filter(num <= until)
    df = df.filter(num.isNotNull()).withColumn("num", num)
    if check_limit and named is None:
        _check_lengths(spark, df, "event")
    files = df.select(F.col("num").alias("event"),
                      F.col("modificationTime").alias("committed_at"), "content")
    return files.mapInArrow(_decode_files, SCHEMA)




def _read_bulk(spark, mnt: str, since, until, check_limit: bool):
    from pyspark.sql import functions as F

    lo, hi, plan = plan_segments(mnt, since, until)
    chosen = [first for first, _, _, _ in plan]
    num = _name_num()
    df = (spark.read.format("binaryFile").load(os.path.join(mnt, "segments"))
          .filter(num.isin(chosen or [-1])).withColumn("num", num))
    if check_limit:
        _check_lengths(spark, df, "segment")
    segs = df.select(F.col("num").alias("first"), "content")
    return segs.mapInArrow(_split_segments(lo, hi, EventMtime(mnt)), SCHEMA)


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
