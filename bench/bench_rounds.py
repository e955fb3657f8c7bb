"""Run a benchmark that writes ``--json FILE`` several times and report each figure's
spread: min / median / max over the rounds, with the 1-minute load before and after.

The benchmark's own side-by-side comparisons (bookfs against LMDB in ``bench_engine.py``)
happen inside each run, so the runs are interleaved rounds of every source. ``--keys``
picks the figures: dotted paths into the JSON's ``results`` (``append.ratio``,
``open.cold_ro.median_s``); ``*`` in a path matches every key at that level.  Each
figure's row lists its value in each round too; ``--ratio A B`` adds A / B within each
round (exact paths).

Usage::

    PYTHONPATH=. .venv/bin/python bench/bench_rounds.py --rounds 5 \\
        --keys append.ratio 'open.*.median_s' -- .venv/bin/python bench/bench_engine.py
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import statistics
import subprocess
import sys
import tempfile


def leaves(tree, prefix: str = ""):
    """(dotted path, number) for every numeric leaf of a JSON tree."""
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from leaves(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(tree, list):  # a JSON array: its items by index
        for k, v in enumerate(tree):
            yield from leaves(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(tree, (int, float)) and not isinstance(tree, bool):
        yield prefix, float(tree)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--keys", nargs="+", required=True,
                    help="dotted paths into results (fnmatch patterns)")
    ap.add_argument("--ratio", nargs=2, action="append", default=[], metavar=("A", "B"),
                    help="also print figure A / figure B within each round (exact paths)")
    ap.add_argument("command", nargs=argparse.REMAINDER,
                    help="-- then the benchmark command (it is given --json FILE)")
    args = ap.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("give the benchmark command after --")
    values: dict[str, list[float]] = {}
    loads = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            out = os.path.join(tmp, f"round{r}.json")
            loads.append(os.getloadavg()[0])
            print(f"round {r + 1}/{args.rounds}: {' '.join(command)}", file=sys.stderr,
                  flush=True)
            subprocess.run(command + ["--json", out], check=True, stdout=subprocess.DEVNULL)
            with open(out) as f:
                results = json.load(f)["results"]
            for path, value in leaves(results):
                if any(fnmatch.fnmatchcase(path, k) for k in args.keys) or any(
                        path in pair for pair in args.ratio):
                    values.setdefault(path, []).append(value)
    loads.append(os.getloadavg()[0])
    print(f"{args.rounds} rounds of: {' '.join(command)}")
    print(f"1-minute load before each round and at the end: "
          f"{', '.join(f'{x:.2f}' for x in loads)}\n")
    print("| figure | min | median | max | each round |")
    print("|---|---:|---:|---:|---|")
    def fmt(x: float) -> str:
        return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.4g}"

    def row(label: str, vs: list[float]) -> None:
        print(f"| {label} | {fmt(min(vs))} | {fmt(statistics.median(vs))} | {fmt(max(vs))} "
              f"| {', '.join(fmt(v) for v in vs)} |")

    for path, vs in values.items():
        if any(fnmatch.fnmatchcase(path, k) for k in args.keys):
            row(path, vs)
    for a, b in args.ratio:
        if a not in values or b not in values:
            print(f"--ratio {a} {b}: the benchmark reported no such figure", file=sys.stderr)
            return 2
        row(f"{a} / {b} (within each round)",
            [x / y for x, y in zip(values[a], values[b])])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
