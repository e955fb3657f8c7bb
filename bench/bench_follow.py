"""Commit-to-reader latency: how soon a committed event reaches a reader (issue 32.4).

Three followers, each timed in every round (rounds interleave them):

* ``companion``: a read-write mount.  After each close of ``new/N`` returned (the event is
  committed), the time until ``stat(events/N)`` on the same mount answers: that lookup is
  served by the read-only companion daemon, which must have seen the writer's mark;
* ``ro``: a separate ``-o ro`` mount of the same log.  A reader process waits on
  ``follow/N`` for each next event; the latency is when its lookup returned minus when the
  writer's close returned (``CLOCK_MONOTONIC``: one clock for every process);
* ``lmdb``: a live LMDB ship: a writer process commits one transaction per event into
  the newest LMDB epoch of a pier, as vere does, and a reader process waits on
  ``follow/N`` of a read-only mount of the pier; latency = lookup returned minus
  ``mdb_txn_commit`` returned.

Events are appended every ``--every`` seconds, ``--events`` per follower per round.  A
negative latency is a reader that saw the event before the writer's call returned (the
mark is published before the close's FLUSH is answered).  Prints p50/p99/max per
follower; ``--json FILE`` writes them for ``bench_rounds.py``::

    .venv/bin/python bench/bench_rounds.py --rounds 5 --keys '*.p50_ms' '*.p99_ms' \\
        -- .venv/bin/python bench/bench_follow.py
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
BOOKFS = [sys.executable, "-m", "bookfs.cli"]

READER = r"""
import os, sys, time
mnt, first, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
n = first
while n < first + count:
    try:
        os.stat(f"{mnt}/follow/{n}")
    except OSError as e:
        if e.errno == 110:  # ETIMEDOUT: ask again
            continue
        raise
    print(n, time.monotonic_ns(), flush=True)
    n += 1
"""

LMDB_WRITER = r"""
import lmdb, struct, sys, time
path, first, count, every = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
env = lmdb.open(path, map_size=1 << 30, max_dbs=2, subdir=True)
db = env.open_db(b"EVENTS", integerkey=True, create=True)
payload = bytes.fromhex(sys.argv[5])
sys.stdin.readline()  # go
for n in range(first, first + count):
    with env.begin(write=True, db=db) as txn:
        txn.put(struct.pack("<Q", n), payload, overwrite=False)
    print(n, time.monotonic_ns(), flush=True)
    time.sleep(every)
env.close()
"""


def stats(lat_ns: list[int]) -> dict:
    if not lat_ns:
        return {"n": 0}
    xs = sorted(x / 1e6 for x in lat_ns)

    def q(p: float) -> float:
        return xs[min(len(xs) - 1, int(p * len(xs)))]

    return {"n": len(xs), "p50_ms": q(0.5), "p99_ms": q(0.99), "max_ms": xs[-1],
            "min_ms": xs[0]}


def mount(src: Path, mnt: Path, *opts: str) -> None:
    mnt.mkdir(parents=True, exist_ok=True)
    subprocess.run(BOOKFS + ["mount", str(src), str(mnt), *opts], check=True,
                   stdout=subprocess.DEVNULL)


def umount(mnt: Path) -> None:
    subprocess.run(BOOKFS + ["umount", str(mnt)], check=False, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)


def start_reader(mnt: Path, first: int, count: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", READER, str(mnt), str(first),
                             str(count)], stdout=subprocess.PIPE, text=True)


def reader_times(proc: subprocess.Popen) -> dict[int, int]:
    out, _ = proc.communicate(timeout=120)
    got = {}
    for line in out.splitlines():
        n, t = line.split()
        got[int(n)] = int(t)
    return got


def book_followers(work: Path, events: int, every: float) -> dict:
    """The companion and the separate read-only mount, over one UIP log."""
    from bookfs.formats.book import Book
    from mount_fixtures import payload

    src = work / "log"
    with Book.open(src, writable=True, create=True) as b:
        b.save(1, [payload(n, 200) for n in range(1, 101)])
    rw, ro = work / "rw", work / "ro"
    mount(src, rw)
    mount(src, ro, "-o", "ro")
    try:
        first = 101
        reader = start_reader(ro, first, events)
        time.sleep(0.5)
        closed, companion = {}, []
        for n in range(first, first + events):
            with open(rw / "new" / str(n), "wb") as f:
                f.write(payload(n, 200))
            t_close = time.monotonic_ns()
            closed[n] = t_close
            while True:  # the companion answers events/N: it has seen the mark
                try:
                    os.stat(rw / "events" / str(n))
                    break
                except FileNotFoundError:
                    pass
            companion.append(time.monotonic_ns() - t_close)
            time.sleep(every)
        seen = reader_times(reader)
        ro_lat = [seen[n] - closed[n] for n in closed if n in seen]
        return {"companion": stats(companion), "ro": stats(ro_lat)}
    finally:
        umount(ro)
        umount(rw)


def lmdb_follower(work: Path, events: int, every: float) -> dict:
    """A read-only mount of a pier whose newest LMDB epoch a writer process extends."""
    from lmdb_fixtures import make_pier, payloads

    pier = make_pier(work / "pier", [("lmdb", payloads(1, 100))])
    epoch = pier / ".urb" / "log" / "0i0"
    mnt = work / "lmdb-ro"
    mount(pier, mnt, "-o", "ro")
    try:
        first = 101
        writer = subprocess.Popen(
            [sys.executable, "-c", LMDB_WRITER, str(epoch), str(first), str(events),
             str(every), (b"\0\0\0\0" + os.urandom(196)).hex()],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        reader = start_reader(mnt, first, events)
        time.sleep(0.5)
        out, _ = writer.communicate("go\n", timeout=120)
        committed = {int(a): int(b) for a, b in (line.split() for line in out.splitlines())}
        seen = reader_times(reader)
        return {"lmdb": stats([seen[n] - committed[n] for n in committed if n in seen])}
    finally:
        umount(mnt)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--events", type=int, default=200, help="events per follower")
    p.add_argument("--every", type=float, default=0.02, help="seconds between appends")
    p.add_argument("--json", help="write the figures here")
    a = p.parse_args()
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="bench-follow-") as tmp:
        work = Path(tmp)
        results.update(book_followers(work, a.events, a.every))
        results.update(lmdb_follower(work, a.events, a.every))
    results["load"] = os.getloadavg()[0]
    for name in ("companion", "ro", "lmdb"):
        r = results[name]
        print(f"{name:10s} n={r['n']:4d}  p50 {r['p50_ms']:7.3f} ms  p99 {r['p99_ms']:7.3f} ms"
              f"  max {r['max_ms']:7.3f} ms  min {r['min_ms']:7.3f} ms")
    if a.json:
        Path(a.json).write_text(json.dumps({"results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
