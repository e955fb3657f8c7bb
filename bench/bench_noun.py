"""The noun core, pure against compiled (issue 21): cue and the validating scan in MB/s.

Measured on:

* **sample events**: every event of a sample log (``bookfs sample DIR --events N``, made
  in ``--log`` if missing), read through :class:`bookfs.formats.book.Book` in batches of
  ``--batch-mb``; only decoding is timed, never the reads.  The jam is the payload after
  its 4-byte mug.  The pure scan is slow (a few MB/s on small nodes), so it runs on
  about ``--pure-scan-events`` events, every k-th (its MB/s is over those);
* **a 50 MB list**: one event of ``--big-mb`` MB, a list of distinct 49-bit atoms (two
  nodes every 8 bytes: the scanner's worst case in nodes per byte);
* **a 50 MB atom**: one event ``[date /wire %tag atom]`` whose atom is ``--big-mb`` MB of
  random bytes (bulk data, as a large sample event).

``--rounds`` rounds, interleaved: in each round every measure runs once per core, the
order of the cores alternating from round to round.  The pure core's runs on the two
50 MB events are slow (tens of seconds each), so they are limited to ``--big-pure-rounds``
rounds.  Printed: min / median / max MB/s of each core and the ratio of the medians
(compiled / pure), with the targets of issue 21: cue at least 20x the pure cue on the
sample events; the scan at least 200 MB/s.

    python bench/bench_noun.py --log /tmp/sample100k --events 100000 --rounds 5

A smoke run: ``--events 300 --rounds 1 --big-mb 1 --pure-scan-events 50``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from bookfs.noun import _core, codec, scanner  # noqa: E402

PURE = {"cue": codec.cue, "scan": scanner.scan,
        "scan+mug": lambda data: scanner.scan(data, mug=True)}
COMPILED = {"cue": _core.cue, "scan": _core.scan,
            "scan+mug": lambda data: _core.scan(data, mug=True)}


def ensure_sample(log: Path, events: int) -> None:
    if (log / "book.log").exists() or (log / "meta.bin").exists():
        return
    print(f"making the sample log {log} ({events} events) ...", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "bookfs.cli", "sample", str(log), "--events",
                    str(events)], check=True, cwd=HERE.parent)


def sample_batches(log: Path, batch_bytes: int):
    """Lists of jams (payloads without their mug), about ``batch_bytes`` each."""
    from bookfs.formats.book import Book

    book = Book.open(log)
    try:
        first, last = book.gulf()
        batch, size = [], 0
        for event in range(first, last + 1):
            jam = book.read(event)[4:]
            batch.append(jam)
            size += len(jam)
            if size >= batch_bytes:
                yield batch
                batch, size = [], 0
        if batch:
            yield batch
    finally:
        book.close()


def long_list_jam(nbytes: int) -> bytes:
    """The jam of a list of distinct 49-bit atoms, 8 bytes an element (see
    tests/test_noun_core.py), made without building the list."""
    import numpy as np

    n = nbytes // 8
    values = (np.uint64(1) << np.uint64(48)) | np.arange(n, dtype=np.uint64)
    words = np.uint64(1) | np.uint64(1 << 9) | np.uint64(17 << 10) | (values << np.uint64(15))
    return words.astype("<u8").tobytes() + b"\x02"


def atom_event_jam(nbytes: int) -> bytes:
    from bookfs.noun import cord, path

    atom = int.from_bytes(os.urandom(nbytes), "little") | (1 << (8 * nbytes - 1))
    date = 0x8000000D2E6A4D80 << 64
    return _core.jam((date, (path("/bench/noun"), (cord("blob"), atom))))


def timed(f, jams) -> float:
    start = time.perf_counter()
    for jam in jams:
        f(jam)
    return time.perf_counter() - start


def stats(values: list[float]) -> tuple[float, float, float]:
    return min(values), statistics.median(values), max(values)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--log", type=Path, default=Path("/tmp/bookfs-bench-noun-sample"))
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--big-mb", type=float, default=50.0)
    ap.add_argument("--big-pure-rounds", type=int, default=2)
    ap.add_argument("--pure-scan-events", type=int, default=10_000)
    ap.add_argument("--batch-mb", type=float, default=64.0)
    args = ap.parse_args()

    ensure_sample(args.log, args.events)
    big = int(args.big_mb * 1_000_000)
    print(f"making the {args.big_mb:g} MB events ...", file=sys.stderr)
    big_events = {f"{args.big_mb:g} MB list": long_list_jam(big),
                  f"{args.big_mb:g} MB atom": atom_event_jam(big)}
    for name, jam in big_events.items():
        assert _core.scan(jam).ok, name

    # mbps[(measure, input)][core] -> list of MB/s, one per round
    mbps: dict[tuple[str, str], dict[str, list[float]]] = {}
    per_event: dict[str, list[float]] = {"pure": [], "compiled": []}

    def note(measure: str, what: str, core: str, nbytes: int, seconds: float) -> None:
        mbps.setdefault((measure, what), {"pure": [], "compiled": []})[core].append(
            nbytes / seconds / 1e6)

    from bookfs.formats.book import Book

    with Book.open(args.log) as book:
        count = book.count
    stride = max(1, count // max(1, args.pure_scan_events))  # the pure scan's subset
    sample_bytes = 0
    for r in range(args.rounds):
        order = [("pure", PURE), ("compiled", COMPILED)]
        if r % 2:
            order.reverse()
        totals = {(core, m): 0.0 for core, _ in order for m in PURE}
        pure_scan_bytes = events = nbytes = 0
        for batch in sample_batches(args.log, int(args.batch_mb * 1_000_000)):
            head = [jam for k, jam in enumerate(batch, start=events) if k % stride == 0]
            for core, impl in order:
                totals[core, "cue"] += timed(impl["cue"], batch)
                for m in ("scan", "scan+mug"):
                    totals[core, m] += timed(impl[m], head if core == "pure" else batch)
            events += len(batch)
            nbytes += sum(map(len, batch))
            pure_scan_bytes += sum(map(len, head))
        sample_bytes = nbytes
        for core, _ in order:
            note("cue", "sample events", core, nbytes, totals[core, "cue"])
            per_event[core].append(totals[core, "cue"] / events * 1e6)
            for m in ("scan", "scan+mug"):
                note(m, "sample events", core, pure_scan_bytes if core == "pure" else nbytes,
                     totals[core, m])
        for what, jam in big_events.items():
            for core, impl in order:
                if core == "pure" and r >= max(1, args.big_pure_rounds):
                    continue
                for m in ("cue", "scan", "scan+mug"):
                    note(m, what, core, len(jam), timed(impl[m], [jam]))
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)

    print(f"\nsample log {args.log}: {events} events, {sample_bytes:,} bytes of jam; "
          f"pure scans over every {stride}th event; "
          f"{args.rounds} rounds ({args.big_pure_rounds} for the pure core on the big "
          "events)\n")
    print("| measure | input | pure MB/s (min / median / max) | compiled MB/s "
          "(min / median / max) | compiled / pure |")
    print("|---|---|---|---|---|")
    for (measure, what), cores in mbps.items():
        p, c = stats(cores["pure"]), stats(cores["compiled"])
        print(f"| {measure} | {what} | {p[0]:.1f} / {p[1]:.1f} / {p[2]:.1f} | "
              f"{c[0]:.1f} / {c[1]:.1f} / {c[2]:.1f} | {c[1] / p[1]:.1f}x |")
    pe, ce = stats(per_event["pure"]), stats(per_event["compiled"])
    print(f"\ncue per sample event (µs, min / median / max): pure {pe[0]:.2f} / {pe[1]:.2f} / "
          f"{pe[2]:.2f}, compiled {ce[0]:.2f} / {ce[1]:.2f} / {ce[2]:.2f}")
    cue = mbps["cue", "sample events"]
    ratio = statistics.median(cue["compiled"]) / statistics.median(cue["pure"])
    rounds = [c / p for c, p in zip(cue["compiled"], cue["pure"])]  # within one round
    print("cue on the sample events, compiled / pure within each round: "
          + ", ".join(f"{r:.1f}x" for r in rounds)
          + f"; >= 20x in {sum(r >= 20 for r in rounds)} of {len(rounds)} rounds")
    scan_rates = {what: statistics.median(cores["compiled"])
                  for (m, what), cores in mbps.items() if m == "scan"}
    print(f"targets: cue on the sample events {ratio:.1f}x the pure cue (>= 20x: "
          f"{'met' if ratio >= 20 else 'NOT met'}); compiled scan "
          + ", ".join(f"{what} {rate:.0f} MB/s" for what, rate in scan_rates.items())
          + f" (>= 200 MB/s: {'met' if min(scan_rates.values()) >= 200 else 'NOT met'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
