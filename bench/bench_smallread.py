#!/usr/bin/env python3
"""Small events read cold and warm (issue 34.3), side by side in interleaved rounds.

The events: ``--reads`` random events of at most 16 KiB of a ``bookfs sample`` log of
``--events`` events.  Each round reads them (open, one ``os.read``, close, from this
process), in turn, from:

  bookfs         a fresh ``bookfs mount -o ro``: no OPEN, FLUSH or RELEASE (patched
                 pyfuse3's no-open path), a LOOKUP and a READ per event
  local          the same events as files on the local disk
  constfs        ``bench/constfs.py --sizes``: pyfuse3 serving files of the same sizes from
                 memory with bookfs's caching choices (the floor: LOOKUP, OPEN, READ)

``--poll`` adds ``bookfs-nopoll`` (``-o ro,busy_poll=0``: the daemon sleeps as soon as
no request is queued) and ``constfs-poll`` (constfs with bookfs's default poll window),
so that what the busy poll gives is measured apart from the rest.

cold (a fresh mount, then ``drop_caches``) and then warm (the same list again).  Prints
min / median / max reads per second and the ratios within each round, and the 1-minute
load.  ``--variants`` instead times bookfs alone with different things cold when the
reads start (:data:`VARIANTS`): whether the chain walk or the page cache holds a cold
round.  Needs root and /dev/fuse.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
from array import array

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
for p in (REPO, HERE):
    if p not in sys.path:
        sys.path.insert(0, p)

from bench_mount import (SMALL, At, Proc, drop_caches, make_sample, name,  # noqa: E402
                         read_files)
from tests.mounting import mounted  # noqa: E402

from bookfs.formats.book import Book  # noqa: E402
from bookfs.fs.daemon.options import DEFAULT_BUSY_POLL_US  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--events", type=int, default=100_000, help="sample events (100000)")
    p.add_argument("--reads", type=int, default=20_000, help="random small events (20000)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--dir", help="work directory (default: a new one under /tmp)")
    p.add_argument("--poll", action="store_true",
                   help="also bookfs-nopoll (-o busy_poll=0) and constfs-poll")
    p.add_argument("--variants", action="store_true",
                   help="instead: bookfs alone, in the cold variants of VARIANTS")
    a = p.parse_args(argv)
    work = a.dir or tempfile.mkdtemp(prefix="bench_smallread.")
    os.makedirs(work, exist_ok=True)
    os.environ["BOOKFS_CACHE_DIR"] = os.path.join(work, "cache")
    os.environ["PYTHONPATH"] = REPO + os.pathsep + os.environ.get("PYTHONPATH", "")
    src = os.path.join(work, "sample")
    if not os.path.exists(src):
        make_sample(work, a.events)
    with Book.open(src) as book:
        sizes = [book.payload_size(e) for e in range(1, book.count + 1)]
        rnd = random.Random(3)
        pick = rnd.sample([e for e, n in enumerate(sizes, 1) if n <= SMALL], a.reads)
        local = os.path.join(work, "local")
        os.makedirs(os.path.join(local, "events"), exist_ok=True)
        for e in pick:
            with open(os.path.join(local, "events", name(e)), "wb") as f:
                f.write(book.read(e))
    sizes_path = os.path.join(work, "sizes.u64")
    with open(sizes_path, "wb") as f:
        array("Q", sizes).tofile(f)
    psz = [sizes[e - 1] for e in pick]
    mnt = os.path.join(work, "mnt")
    os.makedirs(mnt, exist_ok=True)
    log = os.path.join(work, "bookfs.log")
    targets = {
        "bookfs": lambda: At(mnt, mounted(src, mnt, "-o", "ro", log_file=log)),
        "local": lambda: At(local),
        "constfs": lambda: At(mnt, Proc([sys.executable, os.path.join(HERE, "constfs.py"),
                                          mnt, "--sizes", sizes_path], mnt,
                                         os.path.join(work, "constfs.log"))),
    }
    if a.poll:
        targets["bookfs-nopoll"] = lambda: At(mnt, mounted(src, mnt, "-o", "ro,busy_poll=0",
                                                           log_file=log))
        targets["constfs-poll"] = lambda: At(mnt, Proc(
            [sys.executable, os.path.join(HERE, "constfs.py"), mnt, "--sizes", sizes_path,
             "--busy-poll", str(DEFAULT_BUSY_POLL_US)], mnt, os.path.join(work, "constfs.log")))
    if a.variants:
        return variants(a, src, mnt, log, pick, psz)
    got = {w: {k: [] for k in targets} for w in ("cold", "warm")}
    load0 = os.getloadavg()[0]
    for r in range(a.rounds):
        for key, make in targets.items():
            with make() as root:
                paths = [f"{root}/events/{name(e)}" for e in pick]
                drop_caches()
                got["cold"][key].append(len(paths) / read_files(paths, psz))
                got["warm"][key].append(len(paths) / read_files(paths, psz))
        print(f"round {r + 1}: " + ", ".join(f"{w} {k} {got[w][k][-1]:,.0f}/s"
                                             for w in got for k in targets),
              file=sys.stderr, flush=True)
    print(f"{a.reads} random small events of a {a.events}-event sample log, {a.rounds} "
          f"rounds; 1-minute load {load0:.2f} at the start, {os.getloadavg()[0]:.2f} at "
          "the end")
    for w, per in got.items():
        print(f"{w} (reads/s, min / median / max):")
        for k, v in per.items():
            print(f"  {k:14} {min(v):,.0f} / {statistics.median(v):,.0f} / {max(v):,.0f}")
        pairs = [("bookfs", "constfs"), ("bookfs", "local")]
        if a.poll:
            pairs += [("bookfs", "bookfs-nopoll"), ("bookfs-nopoll", "constfs"),
                      ("bookfs", "constfs-poll"), ("constfs-poll", "constfs")]
        for top, ref in pairs:
            q = [x / b for x, b in zip(per[top], per[ref])]
            print(f"  {top} / {ref:13} {min(q):.2f} / {statistics.median(q):.2f} / "
                  f"{max(q):.2f}")
    return 0


#: ``--variants``: what is cold when the reads start, each from a fresh read-only mount
VARIANTS = {
    "A": "drop_caches, then read (the cold above: the chain walk runs during the reads)",
    "B": "walk first (stat of the last event), then drop_caches, then read",
    "D": "as B, then book.log read back into the page cache, then read",
    "C": "walk first, no drop_caches (steady)",
}


def variants(a, src: str, mnt: str, log: str, pick: list[int], psz: list[int]) -> int:
    """Where a cold round's time goes: bookfs alone, each variant of :data:`VARIANTS` in
    turn, ``--rounds`` interleaved rounds."""
    with Book.open(src) as book:
        last = book.last
    got = {v: [] for v in VARIANTS}
    load0 = os.getloadavg()[0]
    for r in range(a.rounds):
        for v in VARIANTS:
            with At(mnt, mounted(src, mnt, "-o", "ro", log_file=log)) as root:
                paths = [f"{root}/events/{name(e)}" for e in pick]
                if v != "A":
                    os.stat(f"{root}/events/{name(last)}")
                if v != "C":
                    drop_caches()
                if v == "D":
                    with open(os.path.join(src, "book.log"), "rb") as f:
                        while f.read(1 << 24):
                            pass
                got[v].append(len(paths) / read_files(paths, psz))
        print(f"round {r + 1}: " + ", ".join(f"{v} {got[v][-1]:,.0f}/s" for v in got),
              file=sys.stderr, flush=True)
    print(f"{a.reads} random small events of a {a.events}-event sample log through bookfs, "
          f"{a.rounds} rounds; 1-minute load {load0:.2f} at the start, "
          f"{os.getloadavg()[0]:.2f} at the end")
    for v, x in got.items():
        print(f"  {v} {min(x):,.0f} / {statistics.median(x):,.0f} / {max(x):,.0f} reads/s "
              f"(min / median / max): {VARIANTS[v]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
