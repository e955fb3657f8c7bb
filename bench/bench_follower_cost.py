#!/usr/bin/env python3
"""What following a growing log costs a read-only mount: its daemon's CPU, and the bytes
it reads and writes (``/proc/<pid>/io``: ``rchar``, ``wchar``), per second, while a writer
in this process appends ``--rate`` events a second to the log for ``--seconds``.

A follower's work should grow with the events appended, not with the log: a mount that
rewrote its whole persisted index (16 bytes an event) at every round of its date pass
wrote 105 MB a second following a 10-million-event log that grew 20 events a second
(``fs/dates.py``, ``worth_saving``).  Run it on a big log (``bench/make_ship.py``) to see
that; each round appends ``rate * seconds`` events to it (small 1 KB events, the date of
each a noun the date pass decodes).

``--vs TREE`` runs, in interleaved rounds, a second daemon from another checkout of
bookfs (``PYTHONPATH=TREE``: its compiled extensions built, e.g. a ``git worktree`` of an
older commit), so the two can be compared side by side.  Each tree keeps its own index
cache directory under ``--cache`` for the whole run.  Needs /dev/fuse.

    python bench/bench_follower_cost.py SHIP [--rate 20] [--seconds 10] [--rounds 5]
                                              [--vs TREE]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

from bench_append import cpu_seconds  # noqa: E402

from bookfs.formats.book import Book  # noqa: E402
from bookfs.noun import DA_UNIX_EPOCH, jam  # noqa: E402
from bookfs.noun.codec import cord, from_list  # noqa: E402


def event(k: int) -> bytes:
    """A dated event ``[date [wire [%hear data]]]`` behind a mug (the date pass decodes
    its date), about 1 KB."""
    wire = from_list([cord("a"), cord("b")])
    date = (1_800_000_000 + k + DA_UNIX_EPOCH) << 64
    return b"\0\0\0\0" + jam((date, (wire, (cord("hear"), 1 << 8000 | k))))


def usage(pid: int) -> tuple[float, int, int]:
    """CPU seconds (every thread), bytes read and bytes written by process ``pid``."""
    with open(f"/proc/{pid}/io") as f:
        io = dict(line.split(": ") for line in f.read().splitlines() if line)
    return cpu_seconds(pid), int(io["rchar"]), int(io["wchar"])


def one(ship: str, tree: Path, cache: Path, rate: float, seconds: float) -> tuple:
    """(CPU ms/s, MB read/s, MB written/s) of one read-only mount of ``ship`` run from
    ``tree`` while this process appends to the log."""
    env = dict(os.environ, PYTHONPATH=str(tree), BOOKFS_CACHE_DIR=str(cache))
    bookfs = [sys.executable, "-m", "bookfs.cli"]
    with tempfile.TemporaryDirectory(prefix="bookfs-follow-") as mnt:
        out = subprocess.run([*bookfs, "mount", "-o", "ro", ship, mnt], cwd=tree, env=env,
                             check=True, capture_output=True, text=True)
        pid = int(re.search(r"daemon pid (\d+)", out.stdout + out.stderr).group(1))
        try:
            os.stat(f"{mnt}/events")
            time.sleep(3)  # the mount's first date pass and saves settle
            before, t0 = usage(pid), time.monotonic()
            with Book.open(ship, writable=True) as w:
                n = w.last + 1
                while time.monotonic() - t0 < seconds:
                    w.save(n, [event(n)])
                    n += 1
                    time.sleep(1 / rate)
            time.sleep(2)  # the follower's last rounds
            after, dt = usage(pid), time.monotonic() - t0
        finally:
            subprocess.run([*bookfs, "umount", mnt], cwd=tree, env=env, capture_output=True)
    return ((after[0] - before[0]) / dt * 1e3, (after[1] - before[1]) / dt / 1e6,
            (after[2] - before[2]) / dt / 1e6)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("ship", help="a Book directory (it grows by rate * seconds a round)")
    p.add_argument("--rate", type=float, default=20.0, help="events a second (default 20)")
    p.add_argument("--seconds", type=float, default=10.0, help="seconds a run (default 10)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    p.add_argument("--vs", metavar="TREE", help="another bookfs checkout to compare with")
    p.add_argument("--cache", help="where the index cache directories go (default: a new "
                   "one under $TMPDIR)")
    a = p.parse_args()
    trees = {"this": ROOT}
    if a.vs:
        trees["vs"] = Path(a.vs).resolve()
    cache = Path(a.cache or tempfile.mkdtemp(prefix="bookfs-follow-cache-"))
    load = os.getloadavg()[0]
    got: dict[str, list[tuple]] = {}
    for r in range(a.rounds):
        for name in (list(trees) if r % 2 == 0 else list(reversed(trees))):
            got.setdefault(name, []).append(
                one(a.ship, trees[name], cache / name, a.rate, a.seconds))
            cpu, rd, wr = got[name][-1]
            print(f"round {r + 1}: {name}: CPU {cpu:.0f} ms/s, read {rd:.1f} MB/s, "
                  f"written {wr:.1f} MB/s", file=sys.stderr)
    with Book.open(a.ship) as b:
        events = b.count
    print(f"| follower of a log of {events:,} events growing {a.rate:g}/s "
          f"(min / median / max of {a.rounds}) | CPU, ms a second | read, MB/s | "
          "written, MB/s |\n|---|---|---|---|")
    for name, rows in got.items():
        cols = []
        for i in range(3):
            v = [row[i] for row in rows]
            cols.append(f"{min(v):.1f} / {statistics.median(v):.1f} / {max(v):.1f}")
        print(f"| {name} ({trees[name]}) | " + " | ".join(cols) + " |")
    print(f"\n1-minute load {load:.2f} before, {os.getloadavg()[0]:.2f} after")
    return 0


if __name__ == "__main__":
    sys.exit(main())
