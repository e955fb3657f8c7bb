#!/usr/bin/env python3
"""A ship of millions of events (issue 34.6): every figure the issue asks for, on one log
made by ``bench/make_ship.py``.  Steps, in order, each timed (wall clock):

 1. the first index build: ``bookfs info SHIP`` with an empty index cache (a framing scan
    of the whole log, with its progress bar on stderr), as MB/s of the log;
 2. ``bookfs info SHIP`` again (its index persisted), ``--rounds`` times;
 3. ``bookfs mount SHIP MNT -o ro`` until it returns (the daemon answers ready only once it
    serves requests), ``--rounds`` fresh mounts; the daemon's RSS after each;
 4. the date pass: a mount whose index (built by step 1's scan) has no dates decodes
    them in the background and saves them; timed until the index file holds them all;
 5. on fresh mounts after ``drop_caches``: ``find MNT/events -type f | wc -l``, then
    ``ls -l MNT/events > /dev/null``, the daemon's RSS after each; the same ``find`` with
    ``-o ro,readdirplus=auto``;
 5b. with ``--local DIR``: local disk's side of that ``find``, in ``--rounds``
    interleaved rounds with the ``readdirplus=auto`` mount's (each after
    ``drop_caches``): ``DIR`` holds one empty file per event, named as ``events/`` names
    them (made there first if ``DIR`` does not exist, with a progress bar).  ``find
    -type f`` reads a directory's names and types, never an inode, so the files' sizes
    change nothing it does; ``--local-only`` runs this step after steps 1, 2 and 4;
 6. ``bookfs verify --nouns SHIP``: every CRC and every payload decoded, as MB/s;
 7. Spark over the mount: ``spark.read.format("bookfs").load(MNT).count()``, a full
    scan of every column into Spark's ``noop`` sink, and ``event`` and ``size`` alone
    (``segments/K.sizes``, issue 34.5) counted and summed (``--no-spark`` leaves it out;
    ``--spark-only`` runs only this step, ``--rounds`` interleaved rounds of the three).

Prints a Markdown table.  MB = 10^6 bytes.  Needs root (drop_caches) and /dev/fuse.

    python bench/bench_bigship.py SHIP [--rounds 5] [--no-spark | --spark-only]
                                      [--local DIR [--local-only]]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
for p in (REPO, HERE):
    if p not in sys.path:
        sys.path.insert(0, p)

import psutil  # noqa: E402

from bench_mount import drop_caches  # noqa: E402
from tests.mounting import daemon_pid, mounted  # noqa: E402

BOOKFS = [sys.executable, "-m", "bookfs.cli"]


def timed(cmd: list[str] | str, **kw) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, shell=isinstance(cmd, str),
                   **kw)
    return time.perf_counter() - t


def rss_mb(mnt: str) -> float:
    return psutil.Process(daemon_pid(mnt)).memory_info().rss / 1e6


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("ship", help="a Book directory (bench/make_ship.py)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--no-spark", action="store_true")
    p.add_argument("--spark-only", action="store_true",
                   help="only step 7, in --rounds interleaved rounds")
    p.add_argument("--local", metavar="DIR",
                   help="step 5b: local disk's find over DIR (one empty file per event, "
                        "made first if DIR does not exist)")
    p.add_argument("--local-only", action="store_true",
                   help="only step 5b (and the index build and date pass it needs)")
    a = p.parse_args(argv)
    if a.local_only and not a.local:
        p.error("--local-only needs --local DIR")
    ship = os.path.abspath(a.ship)
    size = os.path.getsize(os.path.join(ship, "book.log"))
    work = tempfile.mkdtemp(prefix="bench_bigship.")
    cache = os.path.join(work, "cache")
    env = dict(os.environ, BOOKFS_CACHE_DIR=cache, BOOKFS_PROGRESS="1",
               PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    os.environ.update(BOOKFS_CACHE_DIR=cache, PYTHONPATH=env["PYTHONPATH"])
    mnt = os.path.join(work, "mnt")
    os.makedirs(mnt)
    rows = []

    def row(what, values, unit, target=""):
        v = sorted(values)
        rows.append((what, v[0], statistics.median(v), v[-1], unit, target, len(v)))
        print(f"{what}: {statistics.median(v):.3f} {unit} ({v[0]:.3f}..{v[-1]:.3f})",
              file=sys.stderr, flush=True)

    load0 = os.getloadavg()[0]
    if a.spark_only:
        spark_step(ship, mnt, a.rounds, row)
        return report(ship, size, load0, rows, work)
    drop_caches()
    t = timed(BOOKFS + ["info", ship], env=env)  # progress bar on stderr
    row("first index build (bookfs info, empty cache), MB/s", [size / 1e6 / t], "MB/s",
        "≥ 200")
    row("bookfs info, index persisted", [timed(BOOKFS + ["info", ship], env=env)
                                         for _ in range(a.rounds)], "s", "≤ 1")
    # the index a scan builds has no dates: the first mount's date pass decodes them (a
    # log bookfs wrote has them from its writer); timed until the index file holds all
    from bookfs.formats.book import Book
    t = time.perf_counter()
    with mounted(ship, mnt, "-o", "ro"):
        while True:
            with Book.open(ship) as book:
                if len(book.dates) >= book.count:
                    break
            time.sleep(2)
        count = book.count
    row("date pass (first mount, in the background), events/s",
        [count / (time.perf_counter() - t)], "ev/s")
    if a.local:
        local_step(os.path.abspath(a.local), count, mnt, ship, a.rounds, row)
        if a.local_only:
            return report(ship, size, load0, rows, work)
    ready, rss_ready = [], []
    for _ in range(a.rounds):
        t = time.perf_counter()
        with mounted(ship, mnt, "-o", "ro"):
            ready.append(time.perf_counter() - t)
            rss_ready.append(rss_mb(mnt))
    row("mount ready (-o ro), index persisted", ready, "s", "≤ 1")
    row("daemon RSS after mount", rss_ready, "MB", "≤ 150")
    finds, lss, rss_after = [], [], []
    for _ in range(max(1, a.rounds // 2)):
        with mounted(ship, mnt, "-o", "ro"):
            drop_caches()
            finds.append(timed(f"find {mnt}/events -type f | wc -l"))
            rss_after.append(rss_mb(mnt))
        with mounted(ship, mnt, "-o", "ro"):
            drop_caches()
            lss.append(timed(f"ls -l {mnt}/events > /dev/null"))
            rss_after.append(rss_mb(mnt))
    row("find MNT/events -type f, fresh mount", finds, "s")
    row("ls -l MNT/events, fresh mount", lss, "s")
    row("daemon RSS after find / ls -l", rss_after, "MB", "≤ 150")
    auto = []
    for _ in range(max(1, a.rounds // 2)):
        with mounted(ship, mnt, "-o", "ro,readdirplus=auto"):
            drop_caches()
            auto.append(timed(f"find {mnt}/events -type f | wc -l"))
    row("find, -o readdirplus=auto, fresh mount", auto, "s")
    drop_caches()
    t = timed(BOOKFS + ["verify", "--nouns", ship], env=env)
    row("bookfs verify --nouns (cold), MB/s", [size / 1e6 / t], "MB/s", "≥ 200")
    if not a.no_spark:
        spark_step(ship, mnt, 1, row)
    return report(ship, size, load0, rows, work)


def local_step(local: str, count: int, mnt: str, ship: str, rounds: int, row) -> None:
    """Step 5b: ``find -type f | wc -l`` of ``local`` (``count`` empty files named as
    ``events/`` names them, made now if ``local`` does not exist) and of a fresh
    ``-o ro,readdirplus=auto`` mount's ``events/``, each after ``drop_caches``, in
    ``rounds`` interleaved rounds (the order swapped every round)."""
    from tqdm import tqdm

    from bookfs.fs.inodes import event_name

    if not os.path.exists(local):
        os.makedirs(local)
        for n in tqdm(range(1, count + 1), desc="local files", unit="file", unit_scale=True,
                      mininterval=1.0):
            os.close(os.open(os.path.join(local, event_name(n).decode()),
                             os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    have = sum(1 for _ in os.scandir(local))
    if have != count:
        raise SystemExit(f"{local}: {have:,} files, expected {count:,} (one per event)")
    times: dict[str, list[float]] = {"local": [], "bookfs": []}

    def bookfs_find():
        with mounted(ship, mnt, "-o", "ro,readdirplus=auto"):
            drop_caches()
            times["bookfs"].append(timed(f"find {mnt}/events -type f | wc -l"))

    def local_find():
        drop_caches()
        times["local"].append(timed(f"find {local} -type f | wc -l"))

    for k in range(rounds):
        for step in ((local_find, bookfs_find) if k % 2 == 0 else (bookfs_find, local_find)):
            step()
    row("find, local disk (one empty file per event), after drop_caches", times["local"],
        "s")
    row("find, -o readdirplus=auto, fresh mount (interleaved with local disk)",
        times["bookfs"], "s", "≤ local")
    row("local disk / bookfs, within each round",
        [lo / b for lo, b in zip(times["local"], times["bookfs"])], "×", "≥ 1")


def spark_step(ship: str, mnt: str, rounds: int, row) -> None:
    """Step 7: ``rounds`` interleaved rounds of a count (every column: Spark 4.3's Python
    sources prune none), a full scan of every column, and ``event,size`` counted and
    summed (read from ``segments/K.sizes``)."""
    from pyspark.sql import functions as F

    from bookfs.spark import register, session

    spark = session()
    register(spark)
    times: dict[str, list[float]] = {"count": [], "scan": [], "sizes": []}
    try:
        with mounted(ship, mnt, "-o", "ro"):
            for r in range(rounds):
                for job in (("count", "scan", "sizes") if r % 2 == 0
                            else ("sizes", "scan", "count")):
                    t = time.perf_counter()
                    if job == "count":
                        n = spark.read.format("bookfs").load(mnt).count()
                    elif job == "scan":
                        (spark.read.format("bookfs").load(mnt).write.format("noop")
                         .mode("overwrite").save())
                    else:
                        got = (spark.read.format("bookfs").option("columns", "event,size")
                               .load(mnt).agg(F.count("*"), F.sum("size")).first())
                    times[job].append(time.perf_counter() - t)
    finally:
        spark.stop()
    if got[0] != n:
        raise SystemExit(f"event,size counted {got[0]:,} rows, the full count {n:,}")
    row(f"Spark count ({n:,} rows; every column)", times["count"], "s")
    row("Spark full scan, every column, noop sink", times["scan"], "s")
    row(f"Spark event,size: count and sum of sizes ({got[0]:,} rows, {got[1]:,} bytes)",
        times["sizes"], "s")


def report(ship: str, size: int, load0: float, rows: list, work: str) -> int:
    shutil.rmtree(work, ignore_errors=True)
    print(f"ship {ship}: {size / 1e6:,.0f} MB of log; 1-minute load {load0:.2f} at the "
          f"start, {os.getloadavg()[0]:.2f} at the end\n")
    print("| measure | min | median | max | unit | target | runs |")
    print("|---|---:|---:|---:|---|---|---:|")
    for what, lo, med, hi, unit, target, k in rows:
        print(f"| {what} | {lo:.3f} | {med:.3f} | {hi:.3f} | {unit} | {target} | {k} |")
    return 0

if __name__ == "__main__":
    sys.exit(main())
