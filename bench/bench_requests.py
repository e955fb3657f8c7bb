#!/usr/bin/env python3
"""Issue 12: FUSE requests per operation, and what they cost, side by side in one run.

The same small events (``bookfs sample``), served six ways:

  local       the events as files on the local disk (ext4)
  ro          ``bookfs mount -o ro`` with the patched pyfuse3 (no-open reads by inode)
  ro-stock    the same with ``BOOKFS_STOCK_PYFUSE3=1`` (today's path on stock pyfuse3)
  rw          ``bookfs mount`` (read-write) with the patched pyfuse3: events/ is its
              read-only companion's (issue 22.1, ``bookfs/fs/daemon/companion.py``)
  rw-single   the same with ``-o single_connection``: events read through the
              read-write connection (noflush), the path before issue 22.1
  rw-stock    ``bookfs mount`` (read-write) with ``BOOKFS_STOCK_PYFUSE3=1``

Measured, rounds interleaved across the six (medians; then the warm reads' min / median
/ max, the ratio rw / ro within each round and the load average):

1. warm small reads: open + read + close of R random events (<= 16 KiB) with os calls,
   after one pass that brings them into the caches;
2. fresh small reads: the same on a new mount whose log is in the page cache, so only the
   kernel's FUSE caches are cold and the figure is the requests' cost (for ``local``: the
   files in the page cache, i.e. its warm figure);
3. cold small reads: the same after ``echo 3 > /proc/sys/vm/drop_caches`` (every source's
   page and dentry caches dropped the same way: disk reads included);
4. requests per operation, counted from a separate ``--debug`` mount of each kind (so the
   timed mounts log nothing): a warm read, a cold read, ``ls -l events/`` twice.

Needs root (drop_caches) and /dev/fuse.  Prints a Markdown table; ``--json F`` saves all.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import platform
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
for path in (REPO, HERE):
    if path not in sys.path:
        sys.path.insert(0, path)

from bench_mount import drop_caches, read_files  # noqa: E402

from bookfs.formats.book import Book  # noqa: E402
from tests.mounting import mounted  # noqa: E402

SMALL = 16 << 10
KINDS = ("local", "ro", "ro-stock", "rw", "rw-single", "rw-stock")
_REQUEST = re.compile(r"DEBUG bookfs\.fs\.ops: (\w+)\(")


def say(*a):
    print(*a, file=sys.stderr, flush=True)


@contextlib.contextmanager
def source(kind: str, log: str, local: str, work: str, debug: bool = False):
    """The events/ directory of ``kind``, mounted for the ``with`` block."""
    if kind == "local":
        yield os.path.join(local, "events")
        return
    opts = (["-o", "ro"] if kind.startswith("ro") else
            ["-o", "single_connection"] if kind == "rw-single" else [])
    extra = ["--debug"] if debug else []
    log_file = os.path.join(work, f"{kind}{'-debug' if debug else ''}.log")
    saved = os.environ.get("BOOKFS_STOCK_PYFUSE3")
    if kind.endswith("-stock"):
        os.environ["BOOKFS_STOCK_PYFUSE3"] = "1"  # the daemon inherits it
    else:
        os.environ.pop("BOOKFS_STOCK_PYFUSE3", None)
    try:
        cm = mounted(log, os.path.join(work, "mnt-" + kind), *opts, *extra,
                     log_file=log_file)
        mnt = cm.__enter__()
    finally:
        if saved is None:
            os.environ.pop("BOOKFS_STOCK_PYFUSE3", None)
        else:
            os.environ["BOOKFS_STOCK_PYFUSE3"] = saved
    try:
        with open(os.path.join(mnt, "info")) as f:
            path = re.search(r"^fuse: *(.*)$", f.read(), re.M)
        say(f"  {kind}: {path[1] if path else '?'}")
        yield os.path.join(mnt, "events")
    finally:
        cm.__exit__(None, None, None)


def count_requests(kind: str, log: str, local: str, work: str, picks: list[int]):
    """Requests a ``--debug`` mount of ``kind`` logged for each operation."""
    out = {}
    with source(kind, log, local, work, debug=True) as ev:
        log_file = os.path.join(work, f"{kind}-debug.log")
        mark = [os.path.getsize(log_file)]

        def take():
            time.sleep(0.3)
            with open(log_file) as f:
                f.seek(mark[0])
                text = f.read()
                mark[0] = f.tell()
            return collections.Counter(_REQUEST.findall(text))

        def cat(k):
            with open(os.path.join(ev, f"{k:012d}"), "rb") as f:
                f.read()

        cat(picks[0])  # the first open of the mount (ENOSYS turns opens off)
        take()
        cat(picks[1])
        out["cold read"] = take()
        cat(picks[1])
        out["warm read"] = take()
        subprocess.run(["ls", "-l", ev], capture_output=True, check=True)
        out["ls -l events/ (first)"] = take()
        subprocess.run(["ls", "-l", ev], capture_output=True, check=True)
        out["ls -l events/ (again)"] = take()
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--events", type=int, default=20_000, help="sample events (20000)")
    p.add_argument("--reads", type=int, default=5_000, help="small events read per pass (5000)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (3)")
    p.add_argument("--json", help="save every figure as JSON here")
    p.add_argument("--dir", help="work directory (default: a new one under /var/tmp)")
    a = p.parse_args(argv)
    work = a.dir or tempfile.mkdtemp(prefix="bookfs-bench-req-", dir="/var/tmp")
    os.makedirs(work, exist_ok=True)
    try:
        log = os.path.join(work, "sample")
        if not os.path.exists(os.path.join(log, "book.log")):
            subprocess.run([sys.executable, "-m", "bookfs.cli", "sample", log, "--events",
                            str(a.events)], check=True, capture_output=True)
        local = os.path.join(work, "local")
        sizes = {}
        with Book.open(log) as book:
            for e in range(book.first, book.last + 1):
                n = book.payload_size(e)
                if n <= SMALL:
                    sizes[e] = n
            if not os.path.isdir(local):
                os.makedirs(os.path.join(local, "events"))
                for e in range(book.first, book.last + 1):
                    with open(os.path.join(local, "events", f"{e:012d}"), "wb") as f:
                        f.write(book.read(e))
        rnd = random.Random(7)
        picks = rnd.sample(sorted(sizes), min(a.reads, len(sizes)))
        want = [sizes[e] for e in picks]
        say(f"{len(picks)} random small events of {a.events}; {a.rounds} rounds")
        load_before = os.getloadavg()[0]

        warm = {k: [] for k in KINDS}
        cold = {k: [] for k in KINDS}
        fresh = {k: [] for k in KINDS}
        for r in range(a.rounds):
            order = list(KINDS) if r % 2 == 0 else list(reversed(KINDS))
            say(f"round {r + 1}: {' '.join(order)}")
            for kind in order:
                subprocess.run(["cat", os.path.join(log, "book.log")], check=True,
                               stdout=subprocess.DEVNULL)  # the log in the page cache
                if kind == "local":
                    read_files([os.path.join(local, "events", f"{e:012d}") for e in picks],
                               want)
                with source(kind, log, local, work) as ev:
                    paths = [os.path.join(ev, f"{e:012d}") for e in picks]
                    fresh[kind].append(len(paths) / read_files(paths, want))
                    drop_caches()
                    cold[kind].append(len(paths) / read_files(paths, want))
                    read_files(paths, want)  # every one cached now
                    warm[kind].append(len(paths) / read_files(paths, want))
        load_after = os.getloadavg()[0]
        requests = {k: count_requests(k, log, local, work, picks)
                    for k in KINDS if k != "local"}
    finally:
        if not a.dir:
            shutil.rmtree(work, ignore_errors=True)

    med = {k: (statistics.median(warm[k]), statistics.median(fresh[k]),
               statistics.median(cold[k])) for k in KINDS}
    lines = ["| source | warm reads/s | × local | × ro-stock | fresh mount reads/s | "
             "× ro-stock | × rw-stock | cold reads/s | × local | × ro-stock |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for k in KINDS:
        w, f, c = med[k]
        lines.append(f"| {k} | {w:,.0f} | {w / med['local'][0]:.2f} | "
                     f"{w / med['ro-stock'][0]:.2f} | {f:,.0f} | {f / med['ro-stock'][1]:.2f} | "
                     f"{f / med['rw-stock'][1]:.2f} | {c:,.0f} | {c / med['local'][2]:.2f} | "
                     f"{c / med['ro-stock'][2]:.2f} |")
    lines += ["", f"1-minute load {load_before:.2f} before, {load_after:.2f} after", "",
              "| warm reads/s | min | median | max |", "|---|---|---|---|"]
    for k in KINDS:
        lines.append(f"| {k} | {min(warm[k]):,.0f} | {statistics.median(warm[k]):,.0f} | "
                     f"{max(warm[k]):,.0f} |")
    for top, base in (("rw", "ro"), ("rw-single", "ro")):
        ratios = [t / b for t, b in zip(warm[top], warm[base])]
        lines.append(f"\nwarm reads {top} / {base} within each round: "
                     + ", ".join(f"{x:.2f}" for x in ratios)
                     + f" (median {statistics.median(ratios):.2f}; >= 0.9 in "
                     f"{sum(x >= 0.9 for x in ratios)} of {len(ratios)})")
    ops = list(next(iter(requests.values())))
    lines += ["", "| operation | " + " | ".join(requests) + " |",
              "|---|" + "---|" * len(requests)]
    for op in ops:
        cells = []
        for k in requests:
            c = requests[k][op]
            cells.append(f"{sum(c.values())} ({', '.join(f'{n} {v}' for n, v in sorted(c.items()))})"
                         if c else "0")
        lines.append(f"| {op} | " + " | ".join(cells) + " |")
    print("\n".join(lines))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"warm": warm, "fresh": fresh, "cold": cold, "requests": requests,
                       "events": a.events, "reads": len(picks), "rounds": a.rounds,
                       "machine": platform.platform(), "load": os.getloadavg()}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
