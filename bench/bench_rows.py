"""Where a Spark worker's time per event goes: the row builders (issue 22.3) over one
sample log's deeds in memory, no Spark, no mount.

Usage: python bench/bench_rows.py [--events 100000] [--dir /tmp/bench-spark] [--passes 3]

Reads ``DIR/log<events>/book.log`` (``bookfs sample`` writes it if missing) and times the
pure builder (``bookfs.spark.rows._pure_segment_batches``) and the compiled one
(``bookfs/spark/_rows.pyx``, when it built) making the Arrow batches of a growing set of
columns: what each step adds is what it costs.  Prints microseconds per event, the
smallest of ``--passes`` passes.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bookfs.formats.layout import HEADER_SIZE  # noqa: E402
from bookfs.spark import rows as R  # noqa: E402
from tests.mounting import sample_log  # noqa: E402

STEPS = [("deed walk, length and CRC, event/size", {"event", "size"}),
         ("+ jam", {"event", "size", "jam"}),
         ("event, error (the jam validated)", {"event", "error"}),
         ("event, card (validated, head read)", {"event", "card"}),
         ("every column but jam", {c for c in R.COLUMNS if c != "jam"}),
         ("every column", None)]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--events", type=int, default=100_000)
    p.add_argument("--dir", default="/tmp/bench-spark")
    p.add_argument("--passes", type=int, default=3)
    args = p.parse_args()
    src = sample_log(args.dir, args.events)
    with open(os.path.join(src, "book.log"), "rb") as f:
        seg = memoryview(f.read())[HEADER_SIZE:]
    builders = {"pure": R._pure_segment_batches}
    if R._impl is not None:
        builders["compiled"] = R._impl.segment_batches
    print(f"events {args.events:,}, row builder in use: {R.rows_description()}; "
          f"load {os.getloadavg()[0]:.2f}")
    print("| µs per event | " + " | ".join(builders) + " |")
    print("|---|" + "---:|" * len(builders))
    for label, want in STEPS:
        cells = []
        for make in builders.values():
            best = float("inf")
            for _ in range(args.passes):
                t = time.perf_counter()
                n = sum(b.num_rows for b in make([(1, seg)], 1, args.events,
                                                 lambda e: e * 1000, want))
                best = min(best, time.perf_counter() - t)
            cells.append(f"{best / n * 1e6:.2f}")
        print(f"| {label} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
