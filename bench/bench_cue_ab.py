"""Two builds of the compiled noun core, A/B: cue's µs per event on the sample payloads.

Each argument is ``NAME=PATH`` to a built ``_core`` extension (for instance the one in
``bookfs/noun/`` and one built from a changed ``_core.pyx`` elsewhere). The sample log's
payloads are read once; then every build cues all of them, and separately the events of
up to 2 kB, in ``--rounds`` rounds whose order alternates. Prints min and median per
build (the figures of docs/benchmarks.md, "The noun core, compiled against pure")::

    PYTHONPATH=. .venv/bin/python bench/bench_cue_ab.py --log /tmp/r20/noun-log \\
        old=/tmp/old/_core.cpython-311-x86_64-linux-gnu.so \\
        new=bookfs/noun/_core.cpython-311-x86_64-linux-gnu.so
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time
from pathlib import Path

from bookfs.noun import codec  # noqa: F401  (imports the package before the builds)

SMALL = 2000


def load(path: str):
    spec = importlib.util.spec_from_file_location("_core", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("builds", nargs="+", help="NAME=PATH of a built _core extension")
    ap.add_argument("--log", type=Path, default=Path("/tmp/bookfs-bench-noun-sample"))
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    from bookfs.formats.book import Book

    builds = {name: load(path).cue for name, path in (b.split("=", 1) for b in args.builds)}
    with Book.open(args.log) as book:
        first, last = book.gulf()
        jams = [book.read(e)[4:] for e in range(first, last + 1)]
    small = [j for j in jams if len(j) <= SMALL]

    def timed(cue, items) -> float:
        start = time.perf_counter()
        for jam in items:
            cue(jam)
        return (time.perf_counter() - start) / len(items) * 1e6

    times = {name: ([], []) for name in builds}
    for r in range(args.rounds):
        order = list(builds.items())
        for name, cue in (order if r % 2 == 0 else order[::-1]):
            times[name][0].append(timed(cue, jams))
            times[name][1].append(timed(cue, small))
    print(f"{len(jams)} events, {len(small)} of up to {SMALL} bytes; {args.rounds} rounds; "
          "µs an event, min / median")
    for name, (every, smalls) in times.items():
        print(f"{name}: all {min(every):.3f} / {statistics.median(every):.3f}   "
              f"small {min(smalls):.3f} / {statistics.median(smalls):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
