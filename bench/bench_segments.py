"""Warm ``segments/`` reads against the same bytes of the raw ``book.log`` (issue 22.4).

Mounts the sample log twice, read-only and read-write, reads every segment file whole with
1 MiB ``pread`` calls (what ``dd bs=1M`` does) and the same byte ranges of the log file on
the local disk, all warm (one read of each first), in interleaved rounds, and prints GB/s
min / median / max and the ratio within each round.

Usage: python bench/bench_segments.py [--events 100000] [--dir /tmp/bench-segments]
       [--rounds 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.mounting import mounted, sample_log  # noqa: E402

MIB = 1 << 20


def read_range(path: str, off: int, size: int) -> float:
    """Seconds to read ``size`` bytes of ``path`` from ``off`` in 1 MiB preads."""
    fd = os.open(path, os.O_RDONLY)
    try:
        t = time.perf_counter()
        got = 0
        while got < size:
            b = os.pread(fd, min(MIB, size - got), off + got)
            if not b:
                raise OSError(f"{path}: short read at {off + got}")
            got += len(b)
        return time.perf_counter() - t
    finally:
        os.close(fd)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--dir", default="/tmp/bench-segments")
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    src = sample_log(args.dir, args.events)
    log = os.path.join(src, "book.log")
    load = os.getloadavg()[0]
    kinds = {"ro": ("-o", "ro"), "rw": ()}
    secs: dict[str, list[float]] = {k: [] for k in ("raw", *kinds)}
    ratios: dict[str, list[float]] = {k: [] for k in kinds}
    total = 0
    for kind, opts in kinds.items():
        mnt = os.path.join(args.dir, f"mnt-{kind}")
        with mounted(src, mnt, *opts):
            seg_dir = os.path.join(mnt, "segments")
            segs = [os.path.join(seg_dir, n) for n in sorted(os.listdir(seg_dir))]
            sizes = [os.path.getsize(s) for s in segs]
            offs = [sum(sizes[:i]) for i in range(len(sizes))]  # segments tile the log
            total = sum(sizes)
            for s, size in zip(segs, sizes):  # warm: every page cached once
                read_range(s, 0, size)
            read_range(log, 0, os.path.getsize(log))
            for r in range(args.rounds):
                order = ("seg", "raw") if r % 2 == 0 else ("raw", "seg")
                t = {}
                for which in order:
                    if which == "seg":
                        t[which] = sum(read_range(s, 0, n) for s, n in zip(segs, sizes))
                    else:
                        t[which] = sum(read_range(log, o, n) for o, n in zip(offs, sizes))
                secs[kind].append(t["seg"])
                secs["raw"].append(t["raw"])
                ratios[kind].append(t["raw"] / t["seg"])
    print(f"{len(sizes)} segments, {total:,} bytes; {args.rounds} interleaved rounds per "
          f"mount; 1-minute load {load:.2f} before, {os.getloadavg()[0]:.2f} after\n")
    print("| read | GB/s (min / median / max) |\n|---|---|")
    for k, v in secs.items():
        gbs = sorted(total / x / 1e9 for x in v)
        print(f"| {k} | {gbs[0]:.2f} / {statistics.median(gbs):.2f} / {gbs[-1]:.2f} |")
    print()
    for k, v in ratios.items():
        held = sum(x >= 0.8 for x in v)
        print(f"segments/ on a {k} mount / raw log, within each round: min {min(v):.2f}, "
              f"median {statistics.median(v):.2f}, max {max(v):.2f}; >= 0.8x in {held} of "
              f"{len(v)} rounds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
