#!/usr/bin/env python3
"""Listings on a fresh mount (issue 34.1), side by side in interleaved rounds.

For each log size (``--events``, default 100000; the ``bookfs sample`` log), each round
times, in turn, on a fresh mount (mounted for that one command) after ``drop_caches``:

  bookfs       ``bookfs mount -o ro`` of the sample log, its index persisted (warm index)
  bookfs-auto  the same with ``-o ro,readdirplus=auto``
  local        the same events extracted as files in one directory on the local disk
  constfs      ``bench/constfs.py``: pyfuse3 serving files of the same sizes (the floor)

the commands ``find DIR/events -type f | wc -l``, ``ls -l DIR/events > /dev/null`` and
``liststat``: every name listed first, then each one stat'ed (what Hadoop's, and so
Spark's, ``listStatus`` does on a local path; ``tar`` and ``cp -r`` too).
Prints, per command and target, min / median / max seconds over the rounds and the
per-round ratio local / bookfs (above 1: bookfs is faster), plus the 1-minute load at the
start and end.  ``--json FILE`` writes every figure.  Needs root (drop_caches) and
/dev/fuse.  MB = 10^6 bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
for p in (REPO, HERE):
    if p not in sys.path:
        sys.path.insert(0, p)

from bench_mount import Proc, drop_caches, extract, make_sample, say, shell_time  # noqa: E402
from tests.mounting import mounted  # noqa: E402

COMMANDS = {"find": "find {root}/events -type f | wc -l",
            "ls": "ls -l {root}/events > /dev/null",
            "liststat": sys.executable + " -c 'import os, sys; d = sys.argv[1]; "
                        "[os.stat(os.path.join(d, n)) for n in os.listdir(d)]' {root}/events"}


def load() -> float:
    return os.getloadavg()[0]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--events", type=int, nargs="+", default=[100_000],
                   help="sample log sizes (default 100000)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds (5)")
    p.add_argument("--dir", help="work directory (default: a new one under /tmp)")
    p.add_argument("--no-constfs", action="store_true", help="leave the pyfuse3 floor out")
    p.add_argument("--commands", nargs="+", choices=list(COMMANDS), default=list(COMMANDS),
                   help="which listings to time (default: all)")
    p.add_argument("--json", metavar="FILE", help="write every figure here")
    a = p.parse_args(argv)
    work = a.dir or tempfile.mkdtemp(prefix="bench_listing.")
    os.makedirs(work, exist_ok=True)
    os.environ["BOOKFS_CACHE_DIR"] = os.path.join(work, "cache")
    os.environ["PYTHONPATH"] = REPO + os.pathsep + os.environ.get("PYTHONPATH", "")
    out = {"load_start": load(), "sizes": {}}
    for n in a.events:
        sub = os.path.join(work, f"n{n}")
        os.makedirs(sub, exist_ok=True)
        src = os.path.join(sub, "sample")
        if not os.path.exists(src):
            src = make_sample(sub, n)
        local = os.path.join(sub, "local")
        sizes_path = os.path.join(sub, "sizes.u64")
        if not os.path.exists(local):
            extract(src, sub)
        mnt = os.path.join(sub, "mnt")
        os.makedirs(mnt, exist_ok=True)
        with mounted(src, mnt, "-o", "ro"):  # the index (and its dates) persisted
            subprocess.run(["ls", "-l", f"{mnt}/events"], capture_output=True, check=True)
        targets = {"bookfs": lambda: mounted(src, mnt, "-o", "ro"),
                   "bookfs-auto": lambda: mounted(src, mnt, "-o", "ro,readdirplus=auto"),
                   "local": None}
        if not a.no_constfs:
            targets["constfs"] = lambda: Proc(
                [sys.executable, os.path.join(HERE, "constfs.py"), mnt, "--sizes", sizes_path],
                mnt, os.path.join(sub, "constfs.log"))
        times = {c: {t: [] for t in targets} for c in a.commands}
        counts = {}
        for r in range(a.rounds):
            for cmd in a.commands:
                text = COMMANDS[cmd]
                for t, ctx in targets.items():
                    root = local if ctx is None else mnt
                    if ctx is None:
                        drop_caches()
                        s, said = shell_time(text.format(root=root))
                    else:
                        with ctx():
                            drop_caches()
                            s, said = shell_time(text.format(root=root))
                    times[cmd][t].append(s)
                    if cmd == "find":
                        counts[t] = said
            say(f"{n} events, round {r + 1}: " + ", ".join(
                f"{c} {t} {times[c][t][-1]:.3f}s" for c in a.commands for t in targets))
        res = {}
        for cmd in a.commands:
            res[cmd] = {t: {"min": min(v), "median": statistics.median(v), "max": max(v),
                            "all": v} for t, v in times[cmd].items()}
            for t in ("bookfs", "bookfs-auto"):
                ratios = [lo / b for lo, b in zip(times[cmd]["local"], times[cmd][t])]
                res[cmd][f"local/{t}"] = {"min": min(ratios),
                                          "median": statistics.median(ratios),
                                          "max": max(ratios), "all": ratios}
        res["find_counts"] = counts
        out["sizes"][str(n)] = res
    out["load_end"] = load()
    print(f"1-minute load: {out['load_start']:.2f} at the start, {out['load_end']:.2f} "
          "at the end")
    for n, res in out["sizes"].items():
        for cmd in a.commands:
            print(f"{n} events, {cmd}:")
            for t, f in res[cmd].items():
                if t.startswith("local/"):
                    print(f"  {t + ' ratio':22} {f['min']:.2f} / {f['median']:.2f} / "
                          f"{f['max']:.2f}  (min / median / max of rounds)")
                else:
                    print(f"  {t:22} {f['min']:.3f} / {f['median']:.3f} / {f['max']:.3f} s")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
