#!/usr/bin/env python3
"""The deed walk's own cost (``bookfs/formats/deeds.py``), per event, in one process: a
read of a small event (``Book.read``: the deed read and checked whole), its streamed check
(``Book.verify_event``), and the pure-Python walk of a segment's bytes (Spark's fallback
row builder, ``spark/rows.py``'s ``_deeds``).  50,000 random events of ``LOG`` (warm page
cache), the median of 5 passes each.

Compare two commits by running it on each in turn (``git checkout C -- bookfs``), rounds
interleaved.

Usage: python bench/bench_deeds.py LOG_DIR
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("BOOKFS_CACHE_DIR", tempfile.mkdtemp())

from bookfs.formats.book import Book  # noqa: E402
from bookfs.spark import rows as R  # noqa: E402


def median_of_5(fn) -> float:
    times = []
    for _ in range(5):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return sorted(times)[2]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("log", help="a Book directory (e.g. one `bookfs sample` wrote)")
    args = p.parse_args()
    with Book.open(args.log) as b:
        rng = random.Random(7)
        events = [rng.randrange(b.first, b.last + 1) for _ in range(50000)]
        for e in events[:2000]:
            b.read(e)
        read = median_of_5(lambda: [b.read(e) for e in events]) / len(events)
        verify = median_of_5(lambda: [b.verify_event(e) for e in events]) / len(events)
        k = min(20000, b.count - 1)
        start, stop = b.index.offsets[0], b.index.offsets[k]
        seg = memoryview(os.pread(b.fileno(), stop - start, start))
        walk = median_of_5(lambda: sum(1 for _ in R._deeds(seg, b.first, b.last))) / k
    print(f"read {read * 1e6:.2f} us, verify_event {verify * 1e6:.2f} us, "
          f"pure segment walk {walk * 1e6:.2f} us per event")
    return 0


if __name__ == "__main__":
    sys.exit(main())
