"""Many ships, one table (issue 13.5): ``spark.read.format("bookfs").load([...])`` over
many read-only mounts, one per ship, against one mount of a single log holding as many
events, in one run; then how the cost grows with the number of mounts.

The data: one ``bookfs sample`` log of ``--events`` events is generated once; each of
the ``--piers`` logs is a copy of it (``cp --reflink=auto``) with its own ship
(``meta.bin``'s ``who`` rewritten through :meth:`bookfs.formats.book.Book.save_meta`), and the
big log is the same deeds repeated ``--piers`` times (a valid Book log of piers × events
events, whose bytes are exactly the many logs' bytes).  So both sides read the same bytes
through the same reader; only the number of mounts differs.

Each job decodes every column (the ``ship`` column too: the big log is loaded as a
one-element list) into Spark's ``noop`` sink.  A warm-up run of each side, then
``--rounds`` interleaved rounds; medians.  Then ``--scale`` (e.g. 1,10,100) mounts of
``--events`` events each, ``--rounds`` runs each.  Prints progress on stderr and a
Markdown table on stdout.

Usage: python bench/bench_ships.py [--piers 100] [--events 10000] [--dir /var/tmp/bench-ships]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bookfs import spark as bs
from bookfs.formats.book import Book  # noqa: E402
from bookfs.formats.layout import HEADER_SIZE, LOG_NAME, META_NAME  # noqa: E402
from tests.mounting import BOOKFS, mounted  # noqa: E402

import bench_spark  # noqa: E402


def say(msg: str) -> None:
    print(f"bench_ships: {msg}", file=sys.stderr, flush=True)


def make_base(directory: str, events: int) -> str:
    """``DIR/base<events>``: one ``bookfs sample`` log of ``events`` events, made once."""
    os.makedirs(directory, exist_ok=True)
    base = os.path.join(directory, f"base{events}")
    if not os.path.exists(os.path.join(base, ".done")):
        say(f"generating a {events:,}-event sample log")
        subprocess.run([*BOOKFS, "sample", base, "--events", str(events), "--force"],
                       check=True, stdout=subprocess.DEVNULL)
        open(os.path.join(base, ".done"), "w").close()
    return base


def make_logs(args) -> tuple[str, list[str], str]:
    """The base sample log, the ``--piers`` copies (distinct ships) and the big log;
    made once, reused by later runs."""
    base = make_base(args.dir, args.events)
    with Book.open(base) as book:
        who = int.from_bytes(book.read_meta("who"), "little")
    piers = []
    for i in range(args.piers):
        d = os.path.join(args.dir, "piers", f"p{i:03d}")
        piers.append(d)
        if os.path.exists(os.path.join(d, ".done")):
            continue
        if i % 10 == 0:
            say(f"copying pier {i + 1}/{args.piers}")
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        for name in (LOG_NAME, META_NAME):
            subprocess.run(["cp", "--reflink=auto", os.path.join(base, name), d], check=True)
        with Book.open(d, writable=True) as book:  # a ship of its own
            book.save_meta("who", (who + 1 + i).to_bytes(16, "little"))
        open(os.path.join(d, ".done"), "w").close()
    big = os.path.join(args.dir, f"big{args.piers}x{args.events}")
    if not os.path.exists(os.path.join(big, ".done")):
        say(f"writing one log of {args.piers} x {args.events:,} events")
        shutil.rmtree(big, ignore_errors=True)
        os.makedirs(big)
        src_log = os.path.join(base, LOG_NAME)
        size = os.path.getsize(src_log)
        with open(src_log, "rb") as src, open(os.path.join(big, LOG_NAME), "wb") as dst:
            dst.write(src.read(HEADER_SIZE))
            dst.flush()
            for _ in range(args.piers):  # the deeds again: events numbered on
                off = HEADER_SIZE
                while off < size:
                    off += os.copy_file_range(src.fileno(), dst.fileno(), size - off, off)
        shutil.copy(os.path.join(base, META_NAME), big)
        open(os.path.join(big, ".done"), "w").close()
    return base, piers, big


def timed(label: str, fn, events: int) -> float:
    return bench_spark.timed(f"bench_ships: {label}", fn, events, sys.stderr)


def job(spark, mnts: list[str]):
    def go():
        spark.read.format("bookfs").load(mnts).write.format("noop").mode("overwrite").save()
    return go


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--piers", type=int, default=100, help="how many ships (mounts)")
    p.add_argument("--events", type=int, default=10_000, help="events per ship")
    p.add_argument("--dir", default="/var/tmp/bench-ships", help="scratch directory")
    p.add_argument("--rounds", type=int, default=3, help="timed rounds of each job")
    p.add_argument("--scale", default="1,10,100",
                   help="mount counts for the growth table (each at most --piers)")
    p.add_argument("--master", default="local[2]")
    args = p.parse_args()
    scale = [int(x) for x in args.scale.split(",") if x]
    if not scale or max(scale) > args.piers or min(scale) < 1:
        p.error(f"--scale {args.scale}: expected counts between 1 and --piers {args.piers}")

    base, piers, big = make_logs(args)
    n = args.piers * args.events
    print(f"machine: {platform.node()} {platform.machine()} {os.cpu_count()} cores, "
          f"Python {platform.python_version()}; {args.piers} ships x {args.events:,} events "
          f"({os.path.getsize(os.path.join(base, LOG_NAME)):,} bytes each) vs one log of "
          f"{n:,} events ({os.path.getsize(os.path.join(big, LOG_NAME)):,} bytes)",
          flush=True)
    with contextlib.ExitStack() as stack:
        t = time.monotonic()
        mnts = []
        for i, d in enumerate(piers):
            if i % 20 == 0:
                say(f"mounting ship {i + 1}/{len(piers)}")
            mnts.append(stack.enter_context(
                mounted(d, os.path.join(args.dir, "mnt", os.path.basename(d)), "-o", "ro")))
        say(f"mounted {len(mnts)} ships in {time.monotonic() - t:.1f} s")
        t = time.monotonic()
        big_mnt = stack.enter_context(mounted(big, os.path.join(args.dir, "mnt_big"),
                                              "-o", "ro"))
        say(f"mounted the big log in {time.monotonic() - t:.1f} s")
        spark = bs.register(bs.session(args.master, "bench_ships"))
        stack.callback(spark.stop)
        many, one = f"{args.piers} ships x {args.events:,}", f"1 log x {n:,}"
        jobs = {many: job(spark, mnts), one: job(spark, [big_mnt])}
        parts = {k: spark.read.format("bookfs").load(m).rdd.getNumPartitions()
                 for k, m in ((many, mnts), (one, [big_mnt]))}
        med = bench_spark.interleaved(jobs, args.rounds, n, sys.stderr)
        print("\n| read | partitions | median s | events/s | × one log |\n"
              "|---|---:|---:|---:|---:|")
        for k in jobs:
            print(f"| {k} | {parts[k]} | {med[k]:.2f} | {n / med[k]:,.0f} | "
                  f"{med[one] / med[k]:.2f} |")

        growth = {}
        for count in scale:
            fn = job(spark, mnts[:count])
            events = count * args.events
            timed(f"warm-up: {count} ships", fn, events)
            growth[count] = statistics.median(
                timed(f"{count} ships", fn, events) for _ in range(args.rounds))
        print("\n| ships | events | median s | events/s | s per ship |\n"
              "|---:|---:|---:|---:|---:|")
        for count, s in growth.items():
            print(f"| {count} | {count * args.events:,} | {s:.2f} | "
                  f"{count * args.events / s:,.0f} | {s / count:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
