#!/usr/bin/env python3
"""What a writable open of a large log costs with a persisted index (issue 19 #6).

A writable open trusts its persisted index's "verified to here" mark only while the log's
``(dev, ino, size, mtime_ns, ctime_ns)`` equal the stamp saved with it
(``bookfs.formats.index.FileStamp``); this times that open, old code against new, on the same
log.  Three steps, each its own process, so a whole-process timer can time the last:

    python bench/bench_open.py build DIR [--events 1000000] [--size 100]
        a log of N events of SIZE-byte payloads in DIR/log (once; any bookfs version)
    PYTHONPATH=REPO python bench/bench_open.py warm DIR --cache CACHE
        one writable open and close with REPO's code: its index (and stamp) in CACHE
    PYTHONPATH=REPO python bench/bench_open.py open DIR --cache CACHE [--cold]
        the step to time: one writable open and close (``--cold``: no persisted index,
        every deed's framing and CRC checked, which is what a stale stamp costs)

Give each version its own CACHE (their index files differ).  Each ``open`` prints its own
wall time and the events it found, e.g.::

    python bench/bench_open.py build /tmp/bo
    PYTHONPATH=/path/to/old python bench/bench_open.py warm /tmp/bo --cache /tmp/bo/c-old
    PYTHONPATH=.            python bench/bench_open.py warm /tmp/bo --cache /tmp/bo/c-new
    /usr/bin/time -v env PYTHONPATH=. python bench/bench_open.py open /tmp/bo --cache /tmp/bo/c-new
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def _book():
    from bookfs.formats import index
    from bookfs.formats.book import Book

    return Book, index


def build(args) -> None:
    Book, _ = _book()
    path = os.path.join(args.dir, "log")
    if os.path.exists(os.path.join(path, "book.log")):
        sys.exit(f"{path}/book.log exists; build once, or remove it first")
    _, index = _book()
    index.configure_cache(enabled=False)
    body = bytes(range(256)) * (args.size // 256 + 1)
    t = time.perf_counter()
    with Book.open(path, writable=True, create=True) as book:
        batch = 10_000
        for first in range(1, args.events + 1, batch):
            n = min(batch, args.events - first + 1)
            book.save(first, [e.to_bytes(4, "little") + body[: args.size - 4]
                              for e in range(first, first + n)])
    print(f"built {args.events} events in {time.perf_counter() - t:.1f} s: "
          f"{os.path.getsize(os.path.join(path, 'book.log')) / 1e6:.0f} MB")


def _open(args, cold: bool) -> None:
    Book, index = _book()
    index.configure_cache(args.cache)
    path = os.path.join(args.dir, "log")
    t = time.perf_counter()
    book = Book.open(path, writable=True, use_index_cache=not cold)
    opened = time.perf_counter() - t
    count = book.count
    book.close(save=not cold)
    print(f"writable open of {count} events: {opened:.3f} s (bookfs from "
          f"{os.path.dirname(os.path.dirname(index.__file__))})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("dir")
    b.add_argument("--events", type=int, default=1_000_000)
    b.add_argument("--size", type=int, default=100, help="payload bytes (at least 4)")
    for name in ("warm", "open"):
        s = sub.add_parser(name)
        s.add_argument("dir")
        s.add_argument("--cache", required=True, help="this version's index directory")
        if name == "open":
            s.add_argument("--cold", action="store_true",
                           help="ignore the persisted index (a first open)")
    args = ap.parse_args()
    if args.cmd == "build":
        build(args)
    else:
        _open(args, cold=args.cmd == "open" and args.cold)


if __name__ == "__main__":
    main()
