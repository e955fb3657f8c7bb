#!/usr/bin/env python3
"""The chain walk: how long a log opened from its persisted index takes to confirm the
chain of deeds up to its last event (``Book.confirm_to``), which a mount's first read of
a late event waits for.

Each round opens ``LOG`` (a Book directory, whose index this run persists first, in
``BOOKFS_CACHE_DIR`` or ``--cache``), makes the log cold (``drop_caches``) or warm (read
through once), and times ``confirm_to(last)``: wall and CPU seconds.  numpy is imported
before the timer.  For a side-by-side run of two trees, run this file from each with
``PYTHONPATH`` naming the tree, in turn.  Needs root for ``--cold``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
if os.path.dirname(HERE) not in sys.path:  # last: a tree on PYTHONPATH comes first
    sys.path.append(os.path.dirname(HERE))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("log", help="a Book directory (bookfs sample makes one)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--cold", action="store_true", help="drop_caches before each walk")
    p.add_argument("--cache", help="the index cache (default: BOOKFS_CACHE_DIR or bookfs's)")
    a = p.parse_args(argv)
    if a.cache:
        os.environ["BOOKFS_CACHE_DIR"] = a.cache
    import numpy  # noqa: F401 - the walk's, imported before the timer

    import bookfs
    from bookfs.formats.book import Book

    Book.open(a.log).close()  # the index persisted
    walls, cpus = [], []
    for _ in range(a.rounds):
        if a.cold:
            os.sync()
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3\n")
        else:
            with open(os.path.join(a.log, "book.log"), "rb") as f:
                while f.read(1 << 24):
                    pass
        with Book.open(a.log) as b:
            t, c = time.perf_counter(), time.process_time()
            b.confirm_to(b.last)
            walls.append(time.perf_counter() - t)
            cpus.append(time.process_time() - c)
            count, size = b.count, b.log_bytes
    print(f"{'cold' if a.cold else 'warm'} walk of {count:,} deeds ({size / 1e6:,.0f} MB), "
          f"{os.path.dirname(bookfs.__file__)}: wall {min(walls):.3f} / "
          f"{statistics.median(walls):.3f} / {max(walls):.3f} s, CPU "
          f"{statistics.median(cpus):.3f} s (min / median / max of {a.rounds})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
