#!/usr/bin/env python3
"""Benchmark the real-pier work (issue 5), in one run:

1. ``bookfs migrate`` of an LMDB epoch of 1 KB events into a Book log: MB/s and events/s
   (every event is verified after writing, as the command does).
2. ``bookfs fsck --salvage`` of a ~1 GB log (1 KB events) damaged in the middle (1 MiB
   overwritten): the check, and the salvage into a new log, timed separately.
3. Opening a pier of three epochs (LMDB, LMDB, Book) vs opening each epoch alone (cold
   index for the Book epoch is excluded: it is opened once first); and ``bookfs mount``
   to first event readable, for the pier vs for each epoch.

Usage: python bench/bench_pier.py [--events N] [--dir DIR] [--keep] [--json FILE]

``--json FILE`` also writes the figures (``{"results": {"migrate": ..., "salvage": ...,
"pier": ...}}``), so ``bench/bench_rounds.py`` can run it in rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

from bookfs.cli import fsck
from bookfs.formats.book import Book  # noqa: E402
from bookfs.cli.migrate import migrate  # noqa: E402
from bookfs.formats.pier import open_source  # noqa: E402
from lmdb_fixtures import make_lmdb_epoch, make_pier  # noqa: E402

BOOKFS = [sys.executable, "-m", "bookfs.cli"]


def payloads(first: int, count: int, size: int = 1024) -> list[bytes]:
    rng = random.Random(first)
    blob = rng.randbytes(size * 64)
    return [(e & 0x7FFFFFFF).to_bytes(4, "little") + blob[(e % 64) * size:][: size - 4]
            for e in range(first, first + count)]


def timed(fn, *args, **kw) -> tuple[float, object]:
    t = time.perf_counter()
    out = fn(*args, **kw)
    return time.perf_counter() - t, out


def bench_migrate(work: str, n: int) -> dict:
    src = os.path.join(work, "lmdb", "0i0")
    make_lmdb_epoch(src, 0, payloads(1, n))
    dest = os.path.join(work, "migrated")
    dt, _ = timed(migrate, src, dest)
    nbytes = n * 1024
    return {"events": n, "seconds": dt, "MB/s": nbytes / dt / 1e6, "events/s": n / dt}


def bench_salvage(work: str, n: int) -> dict:
    d = os.path.join(work, "damaged")
    with Book.open(d, writable=True, create=True) as b:
        for k in range(0, n, 10_000):
            b.save(k + 1, payloads(k + 1, min(10_000, n - k)))
        size = b.log_bytes
    with open(os.path.join(d, "book.log"), "r+b") as f:
        f.seek(size // 2)
        f.write(os.urandom(1 << 20))
    dt_check, rep = timed(fsck.check, d)
    out = os.path.join(work, "salvaged")
    dt_salvage, res = timed(fsck.salvage, d, rep, out)
    return {"log_bytes": size, "check_s": dt_check, "salvage_s": dt_salvage,
            "recovered": res["recovered"], "events": n, "gaps": len(res["gaps"])}


def _mount_time(source: str, mnt: str, first_event: int) -> float:
    os.makedirs(mnt, exist_ok=True)
    t = time.perf_counter()
    subprocess.run([*BOOKFS, "mount", source, mnt, "-o", "ro"], check=True,
                   capture_output=True)
    with open(os.path.join(mnt, "events", str(first_event)), "rb") as f:
        f.read()
    dt = time.perf_counter() - t
    subprocess.run([*BOOKFS, "umount", mnt], check=True, capture_output=True)
    return dt


def bench_pier(work: str, per_epoch: int) -> dict:
    a = payloads(1, per_epoch)
    b = payloads(per_epoch + 1, per_epoch)
    c = payloads(2 * per_epoch + 1, per_epoch)
    root = make_pier(os.path.join(work, "pier"), [("lmdb", a), ("lmdb", b), ("book", c)])
    epochs = [os.path.join(root, ".urb", "log", f"0i{base}")
              for base in (0, per_epoch, 2 * per_epoch)]
    open_source(root).close()  # persist the Book epoch's index: warm opens below

    def open_close(path):
        log = open_source(path)
        log.close()

    # sub-millisecond opens: many runs, the pier and each epoch in turn within each run, so
    # that a slow stretch of the machine falls on all four alike
    runs = 201
    times: list[list[float]] = [[] for _ in range(1 + len(epochs))]
    for _ in range(runs):
        for k, path in enumerate([root, *epochs]):
            times[k].append(timed(open_close, path)[0])
    pier_open = statistics.median(times[0])
    each = [statistics.median(t) for t in times[1:]]
    mnt = os.path.join(work, "mnt")
    pier_mount = statistics.median(_mount_time(root, mnt, 1) for _ in range(3))
    each_mount = [statistics.median(_mount_time(p, mnt, base + 1) for _ in range(3))
                  for p, base in zip(epochs, (0, per_epoch, 2 * per_epoch))]
    return {"events_per_epoch": per_epoch, "pier_open_s": pier_open, "epoch_open_s": each,
            "pier_mount_s": pier_mount, "epoch_mount_s": each_mount}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--events", type=int, default=1_000_000,
                   help="1 KB events in the salvage log (default 1,000,000 ≈ 1 GB)")
    p.add_argument("--migrate-events", type=int, default=200_000,
                   help="1 KB events in the migrated LMDB epoch (default 200,000)")
    p.add_argument("--pier-events", type=int, default=100_000,
                   help="events in each of the pier's three epochs (default 100,000)")
    p.add_argument("--dir", help="work directory (default: a new one under /var/tmp)")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    p.add_argument("--json", metavar="FILE", help="also write the figures as JSON to FILE")
    a = p.parse_args(argv)
    work = a.dir or tempfile.mkdtemp(prefix="bookfs-bench-pier-", dir="/var/tmp")
    os.makedirs(work, exist_ok=True)
    os.environ.setdefault("BOOKFS_CACHE_DIR", os.path.join(work, "cache"))
    print(f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}; work dir {work}")
    try:
        m = bench_migrate(work, a.migrate_events)
        print(f"migrate LMDB -> Book, {m['events']:,} x 1 KB: {m['seconds']:.2f} s, "
              f"{m['MB/s']:.0f} MB/s, {m['events/s']:,.0f} events/s (target >= 100 MB/s)")
        s = bench_salvage(work, a.events)
        print(f"salvage, {s['log_bytes'] / 1e9:.2f} GB log with 1 MiB destroyed mid-way: "
              f"check {s['check_s']:.2f} s, salvage {s['salvage_s']:.2f} s; "
              f"{s['recovered']:,} of {s['events']:,} events recovered, {s['gaps']} gap(s)")
        r = bench_pier(work, a.pier_events)
        print(f"pier of 3 epochs x {r['events_per_epoch']:,} events: open "
              f"{r['pier_open_s'] * 1e3:.1f} ms vs epochs alone "
              + " + ".join(f"{x * 1e3:.1f}" for x in r["epoch_open_s"])
              + f" = {sum(r['epoch_open_s']) * 1e3:.1f} ms")
        print(f"  mount -> events/1 read: pier {r['pier_mount_s']:.3f} s vs epochs alone "
              + ", ".join(f"{x:.3f}" for x in r["epoch_mount_s"]) + " s (each a full mount)")
        if a.json:
            r = dict(r, epochs_open_sum_s=sum(r["epoch_open_s"]),
                     epoch_open_s=dict(enumerate(r["epoch_open_s"])),
                     epoch_mount_s=dict(enumerate(r["epoch_mount_s"])))
            with open(a.json, "w") as f:
                json.dump({"results": {"migrate": m, "salvage": s, "pier": r}}, f, indent=2)
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
