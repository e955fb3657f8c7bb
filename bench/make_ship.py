#!/usr/bin/env python3
"""Write a large ship's log fast (issue 34.6): ``--events`` events (default 10,000,000)
into a new UIP Book directory, in minutes.

How: every event is a real one, ``[date [wire [tag data]]]`` jammed by the compiled noun
core behind its true mug, dates rising by 1 to 2,000 ms, drawn (seeded, so a rerun writes
the same bytes) from a small mix of what an idle ship logs: ames ``%hear`` packets of 60
to 600 bytes, behn ``%wake``, gall pokes and eyre requests of a few KB, and one event in
20,000 of 64 KB to 1 MB (a clay commit, say).  The bytes of the data are drawn once, up
front, so the cost per event is the jam, the mug and the save: ``Book.save`` of 20,000
events per batch, one ``fdatasync`` each, which also records each event's date
(``formats/datecolumn.py``).  Progress on stderr (tqdm).  MB = 10^6 bytes.

    python bench/make_ship.py DIR [--events N] [--seed S]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from tqdm import tqdm  # noqa: E402

from bookfs.formats.book import Book  # noqa: E402
from bookfs.noun import DA_UNIX_EPOCH, cord, jam, mug  # noqa: E402
from bookfs.noun.codec import from_list  # noqa: E402

BATCH = 20_000
START = 1_735_689_600  # 2025-01-01 UTC


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("dir", help="the Book directory to create (must not exist)")
    p.add_argument("--events", type=int, default=10_000_000, help="events (10000000)")
    p.add_argument("--seed", type=int, default=34, help="random seed (34)")
    a = p.parse_args(argv)
    if os.path.exists(a.dir):
        p.error(f"{a.dir}: exists; expected a new directory")
    rng = random.Random(a.seed)
    pool = rng.randbytes(2 << 20)
    kinds = [  # (weight, wire, tag, data size range)
        (70, ("a", "bone"), "hear", (60, 600)),
        (15, ("b", "timer"), "wake", (0, 0)),
        (10, ("g", "use", "hark"), "poke", (200, 3000)),
        (5, ("e", "http-server"), "request", (300, 6000)),
    ]
    wires = {k[1]: from_list([cord(s) for s in k[1]]) for k in kinds}
    tags = {k[2]: cord(k[2]) for k in kinds}
    choose = [k for k in kinds for _ in range(k[0])]
    ms = START * 1000
    t0 = time.perf_counter()
    written = 0
    with Book.open(a.dir, writable=True, create=True) as book, \
            tqdm(total=a.events, unit="ev", unit_scale=True, desc="make_ship",
                 mininterval=1.0) as bar:
        nxt = 1
        while nxt <= a.events:
            n = min(BATCH, a.events - nxt + 1)
            batch = []
            for _ in range(n):
                ms += rng.randint(1, 2000)
                date = ((ms // 1000 + DA_UNIX_EPOCH) << 64) | (((ms % 1000) << 64) // 1000)
                if rng.randrange(20_000) == 0:
                    _, wire, tag, _ = kinds[2]
                    size = rng.randint(64 << 10, 1 << 20)
                else:
                    _, wire, tag, (lo, hi) = rng.choice(choose)
                    size = rng.randint(lo, hi)
                off = rng.randrange(len(pool) - size) if size else 0
                data = int.from_bytes(pool[off:off + size], "little") if size else 0
                noun = (date, (wires[wire], (tags[tag], data)))
                body = jam(noun)
                batch.append(mug(noun).to_bytes(4, "little") + body)
                written += 4 + len(body)
            book.save(nxt, batch)
            nxt += n
            bar.update(n)
    took = time.perf_counter() - t0
    print(f"make_ship: wrote {a.events:,} events ({written / 1e6:,.0f} MB of payloads) to "
          f"{a.dir} in {took:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
