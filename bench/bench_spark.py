"""Benchmark the Spark pipeline (bookfs.spark.read_events, every column decoded, written to
Spark's ``noop`` sink) on one sample log:

* per-event files through the mount vs the same files copied to local disk;
* tuned small-file settings vs Spark's defaults, through the mount;
* the bulk view (segments/) vs per-event files, through the mount.

Usage: python bench/bench_spark.py --events 100000 [--dir /tmp/bench-spark] [--skip-defaults]

``--sources R`` instead compares, over one read-only mount, R interleaved rounds of: the
per-event ``binaryFile`` pipeline, the bulk view (``bulk=True``) and the Python data
source ``spark.read.format("bookfs")`` (issue 13).

``--columns R`` instead compares, over one read-only mount, R interleaved rounds of
``format("bookfs")`` with every column and with ``event`` and ``size`` only (issue 22.3:
nothing decoded), against local Parquet of the same table read the same two ways, and
prints min / median / max of each and the ratios taken within each round.

``--floor R`` instead measures, over one read-only mount, R interleaved rounds of what
bounds a Python data source: a no-op source that yields Arrow batches read by pyarrow
from the Parquet copy of the table (no decoding, no mount), against Spark's Parquet
reader, with every column and without ``jam``; ``format("bookfs")`` without ``jam``
and with only ``event`` and ``jam`` (issue 22.3: where the Spark-side time goes); and a
source of two one-row tasks (Spark's fixed cost of a Python source's job) against
``event,size`` from Parquet and from bookfs (issue 34.5).

``--compare R`` instead runs the per-event pipeline R times over each of: local files, a
read-only mount on the patched pyfuse3 (no-open reads), and the same mount with
``BOOKFS_STOCK_PYFUSE3=1`` (stock pyfuse3's path), interleaved, and prints the medians and
ratios (issue 12).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bookfs import spark as bs
from tests.mounting import mounted, sample_log  # noqa: E402


def timed(label: str, fn, events: int, out=sys.stdout) -> float:
    """Seconds ``fn()`` took, printed with its event rate."""
    t = time.monotonic()
    fn()
    secs = time.monotonic() - t
    print(f"{label:<40} {secs:8.2f} s  {events / secs:10,.0f} events/s", file=out,
          flush=True)
    return secs


def interleaved(jobs: dict, rounds: int, events: int, out=sys.stdout) -> dict[str, float]:
    """A warm-up run of every job, then ``rounds`` rounds alternating their order; the
    median seconds of each job."""
    secs: dict[str, list[float]] = {k: [] for k in jobs}
    for k, job in jobs.items():
        timed(f"warm-up: {k}", job, events, out)
    for r in range(rounds):
        for k in (list(jobs) if r % 2 == 0 else list(reversed(jobs))):
            secs[k].append(timed(f"round {r + 1}: {k}", jobs[k], events, out))
    return {k: statistics.median(v) for k, v in secs.items()}


def pipeline(spark, root, bulk=False):
    def go():
        bs.read_events(spark, root, bulk=bulk).write.format("noop").mode("overwrite").save()
    return go


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--events", type=int, default=100_000, help="sample log size")
    p.add_argument("--dir", default="/tmp/bench-spark", help="scratch directory")
    p.add_argument("--master", default="local[2]")
    p.add_argument("--skip-defaults", action="store_true",
                   help="skip the (slow) Spark-defaults run")
    p.add_argument("--compare", type=int, metavar="ROUNDS",
                   help="interleaved per-event runs: local, ro mount, ro mount on stock path")
    p.add_argument("--columns", type=int, metavar="ROUNDS",
                   help="interleaved rounds: format('bookfs') and local Parquet, every "
                        "column and event+size")
    p.add_argument("--floor", type=int, metavar="ROUNDS",
                   help="interleaved rounds: a no-op Python source of the table's Arrow "
                        "batches, Parquet, and format('bookfs') with and without jam")
    p.add_argument("--sources", type=int, metavar="ROUNDS",
                   help="interleaved rounds: per-event binaryFile, bulk view, format('bookfs')")
    args = p.parse_args()

    src = sample_log(args.dir, args.events)
    print(f"machine: {platform.node()} {platform.machine()} {os.cpu_count()} cores, "
          f"Python {platform.python_version()}, events {args.events:,}, "
          f"log {os.path.getsize(os.path.join(src, 'book.log')):,} bytes", flush=True)
    mnt = os.path.join(args.dir, "mnt")
    local = os.path.join(args.dir, f"local{args.events}")
    spark = bs.session(args.master)
    if args.compare or args.sources or args.columns or args.floor:
        try:
            if args.columns:
                return columns(spark, src, mnt, args)
            if args.floor:
                return floor(spark, src, mnt, args)
            if args.sources:
                return sources(spark, src, mnt, args)
            return compare(spark, src, mnt, local, args)
        finally:
            spark.stop()
    try:
        with mounted(src, mnt, "-o", "ro"):
            if not os.path.isdir(os.path.join(local, "events")):
                shutil.copytree(os.path.join(mnt, "events"), os.path.join(local, "events"))
            n = args.events
            timed("warm-up (bulk, mount)", pipeline(spark, mnt, bulk=True), n)
            mount = timed("per-event, mount, tuned", pipeline(spark, mnt), n)
            disk = timed("per-event, local disk, tuned", pipeline(spark, local), n)
            bulk = timed("bulk segments/, mount, tuned", pipeline(spark, mnt, bulk=True), n)
            results = {"mount/local speed": disk / mount, "bulk vs per-event": mount / bulk}
            if not args.skip_defaults:
                for key in bs.TUNED:
                    spark.conf.unset(key)
                spark.conf.set("spark.hadoop.fs.file.checksum.verify", "true")
                default = timed("per-event, mount, Spark defaults", pipeline(spark, mnt), n)
                bs.tune(spark)
                results["tuned vs defaults"] = default / mount
            for k, v in results.items():
                print(f"{k:<40} {v:8.2f}x")
    finally:
        spark.stop()
    return 0


def compare(spark, src, mnt, local, args) -> int:
    """Per-event pipeline over local files and two read-only mounts (patched path and
    stock path), each mounted once: the first job on each fresh mount (its page cache
    cold, the log itself in the page cache), then ``--compare`` interleaved rounds of
    warm jobs."""
    import statistics

    n = args.events
    if not os.path.isdir(os.path.join(local, "events")):
        with mounted(src, mnt, "-o", "ro"):
            shutil.copytree(os.path.join(mnt, "events"), os.path.join(local, "events"))
    roots = {"local": local, "ro": mnt + "-ro", "ro-stock": mnt + "-stock"}
    mounts = []
    try:
        for kind in ("ro", "ro-stock"):
            if kind == "ro-stock":
                os.environ["BOOKFS_STOCK_PYFUSE3"] = "1"  # the daemon inherits it
            try:
                ctx = mounted(src, roots[kind], "-o", "ro")
                ctx.__enter__()
                mounts.append(ctx)
            finally:
                os.environ.pop("BOOKFS_STOCK_PYFUSE3", None)
        first = {k: timed(f"first job: {k}", pipeline(spark, root), n)
                 for k, root in roots.items()}
        secs = {k: [] for k in roots}
        for r in range(args.compare):
            for kind in (list(roots) if r % 2 == 0 else list(reversed(roots))):
                secs[kind].append(timed(f"round {r + 1}: {kind}", pipeline(spark, roots[kind]), n))
    finally:
        for ctx in mounts:
            ctx.__exit__(None, None, None)
    med = {k: statistics.median(v) for k, v in secs.items()}
    print("| per-event files | first job s | × local | warm jobs, median s | events/s | × local |")
    print("|---|---:|---:|---:|---:|---:|")
    for k in roots:
        print(f"| {k} | {first[k]:.2f} | {first['local'] / first[k]:.2f} | {med[k]:.2f} | "
              f"{n / med[k]:,.0f} | {med['local'] / med[k]:.2f} |")
    return 0


def sources(spark, src, mnt, args) -> int:
    """binaryFile per-event files, the bulk view and format("bookfs"), one ro mount."""
    bs.register(spark)
    n = args.events

    def source_job():
        spark.read.format("bookfs").load(mnt).write.format("noop").mode("overwrite").save()

    jobs = {"per-event binaryFile": pipeline(spark, mnt), "bulk view (segments/)":
            pipeline(spark, mnt, bulk=True), 'format("bookfs")': source_job}
    with mounted(src, mnt, "-o", "ro"):
        med = interleaved(jobs, args.sources, n)
    base = med["per-event binaryFile"]
    print("| reader | median s | events/s | × per-event | × bulk |\n|---|---:|---:|---:|---:|")
    for k in jobs:
        print(f"| {k} | {med[k]:.2f} | {n / med[k]:,.0f} | {base / med[k]:.2f} | "
              f"{med['bulk view (segments/)'] / med[k]:.2f} |")
    return 0


def columns(spark, src, mnt, args) -> int:
    """format("bookfs") against local Parquet of the same table, every column and
    event+size, ``--columns`` interleaved rounds (issue 22.3)."""
    bs.register(spark)
    n = args.events
    pq = os.path.join(args.dir, f"parquet{n}")
    load = os.getloadavg()[0]

    def noop(df):
        df.write.format("noop").mode("overwrite").save()

    def bookfs_job(cols=None):
        def go():
            r = spark.read.format("bookfs")
            if cols:
                r = r.option("columns", ",".join(cols))
            noop(r.load(mnt))
        return go

    def parquet_job(cols=None):
        def go():
            df = spark.read.parquet(pq)
            noop(df.select(*cols) if cols else df)
        return go

    two = ["event", "size"]
    jobs = {"bookfs, every column": bookfs_job(), "bookfs, event+size": bookfs_job(two),
            "Parquet, every column": parquet_job(), "Parquet, event+size": parquet_job(two)}
    with mounted(src, mnt, "-o", "ro"):
        if not os.path.isdir(pq):
            spark.read.format("bookfs").load(mnt).write.parquet(pq)
        secs: dict[str, list[float]] = {k: [] for k in jobs}
        for k, job in jobs.items():
            timed(f"warm-up: {k}", job, n)
        for r in range(args.columns):
            for k in (list(jobs) if r % 2 == 0 else list(reversed(jobs))):
                secs[k].append(timed(f"round {r + 1}: {k}", jobs[k], n))
    print(f"\n1-minute load {load:.2f} before, {os.getloadavg()[0]:.2f} after; "
          f"{args.columns} interleaved rounds; master {args.master}\n")
    print("| job | s (min / median / max) | events/s (median) |\n|---|---|---:|")
    for k, v in secs.items():
        print(f"| {k} | {min(v):.2f} / {statistics.median(v):.2f} / {max(v):.2f} | "
              f"{n / statistics.median(v):,.0f} |")

    def ratio(a: str, b: str, target: float) -> None:
        per = [sb / sa for sa, sb in zip(secs[a], secs[b])]  # speed of a over b, per round
        held = sum(x >= target for x in per)
        print(f"{a} / {b} (speed, within each round): min {min(per):.2f}, median "
              f"{statistics.median(per):.2f}, max {max(per):.2f}; >= {target}x in {held} "
              f"of {len(per)} rounds")

    print()
    ratio("bookfs, every column", "Parquet, every column", 0.5)
    ratio("bookfs, event+size", "bookfs, every column", 3.0)
    ratio("bookfs, event+size", "Parquet, event+size", 0.0)
    return 0


def floor(spark, src, mnt, args) -> int:
    """A no-op Python data source of the table's Arrow batches (read by pyarrow from the
    Parquet copy ``--columns`` writes) against Parquet, every column and without ``jam``,
    and ``format("bookfs")`` without ``jam`` and with ``event`` and ``jam`` only."""
    import glob

    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    bs.register(spark)
    pq = os.path.join(args.dir, f"parquet{args.events}")
    if not os.path.isdir(pq):
        print(f"{pq} is missing: run --columns first (it writes it)", file=sys.stderr)
        return 1
    files = sorted(glob.glob(os.path.join(pq, "part-*.parquet")))
    no_jam = [c for c in bs.COLUMNS if c != "jam"]

    class Reader(DataSourceReader):
        def __init__(self, cols):
            self.cols = cols

        def partitions(self):
            return [InputPartition(f) for f in files]

        def read(self, part):
            import pyarrow.parquet as papq

            from bookfs.spark.decoding import out_schema

            schema = out_schema(self.cols)
            for b in papq.ParquetFile(part.value).iter_batches(batch_size=2000,
                                                               columns=self.cols):
                yield b.cast(schema)

    class Floor(DataSource):
        @classmethod
        def name(cls):
            return "bookfs-floor"

        def schema(self):
            cols = (self.options.get("columns") or ",".join(bs.COLUMNS)).split(",")
            return ", ".join(f for f in bs.SCHEMA.split(", ") if f.split()[0] in cols)

        def reader(self, schema):
            return Reader([f.name for f in schema.fields])

    class TwoRows(DataSourceReader):
        def partitions(self):
            return [InputPartition(0), InputPartition(1)]

        def read(self, part):
            yield (part.value, 0)

    class Empty(DataSource):
        """Spark's fixed cost of a Python source's job: two tasks of one row each."""

        @classmethod
        def name(cls):
            return "bookfs-two-rows"

        def schema(self):
            return "event long, size long"

        def reader(self, schema):
            return TwoRows()

    spark.dataSource.register(Floor)
    spark.dataSource.register(Empty)

    def noop(df):
        df.write.format("noop").mode("overwrite").save()

    def job(fmt, cols=None):
        def go():
            if fmt == "parquet":
                df = spark.read.parquet(pq)
                noop(df.select(*cols) if cols else df)
                return
            r = spark.read.format(fmt)
            if cols:
                r = r.option("columns", ",".join(cols))
            noop(r.load(mnt) if fmt == "bookfs" else r.load())
        return go

    jobs = {"no-op source, every column": job("bookfs-floor"),
            "Parquet, every column": job("parquet"),
            "no-op source, every column but jam": job("bookfs-floor", no_jam),
            "Parquet, every column but jam": job("parquet", no_jam),
            "bookfs, every column but jam": job("bookfs", no_jam),
            "bookfs, event+jam": job("bookfs", ["event", "jam"]),
            "no-op source, two one-row tasks": job("bookfs-two-rows"),
            "Parquet, event+size": job("parquet", ["event", "size"]),
            "bookfs, event+size": job("bookfs", ["event", "size"])}
    load = os.getloadavg()[0]
    with mounted(src, mnt, "-o", "ro"):
        med = interleaved(jobs, args.floor, args.events)
    print(f"\n1-minute load {load:.2f} before, {os.getloadavg()[0]:.2f} after; "
          f"{args.floor} interleaved rounds; master {args.master}\n")
    print("| job | median s |\n|---|---:|")
    for k, v in med.items():
        print(f"| {k} | {v:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
