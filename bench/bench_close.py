"""Appends through new/: this checkout against another commit, side by side in one run.

Measures what a change to the commit path costs an append (issue 9 used it for the last-close
check, issue 18 for the commit rule of ``bookfs/fs/append/rule.py``): 1 KB events,
one writer and then 8 writers, each run alternating between a mount served by the code of
``--base`` (a git ref, checked out into a temporary worktree) and one served by this
checkout, ``--rounds`` times; medians and the ratio are printed as a Markdown table.

    python bench/bench_close.py --base bd83a21 --seconds 3 --rounds 3

Needs root and /dev/fuse.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

from bench_mount import appends  # noqa: E402

from bookfs.formats.book import Book  # noqa: E402
from bookfs.noun import jam  # noqa: E402


def mount(code: Path, src: Path, mnt: Path) -> None:
    subprocess.run([sys.executable, "-m", "bookfs.cli", "mount", str(src), str(mnt)],
                   cwd=code, check=True, capture_output=True,
                   env=dict(os.environ, PYTHONPATH=str(code)))


def umount(code: Path, mnt: Path) -> None:
    subprocess.run([sys.executable, "-m", "bookfs.cli", "umount", str(mnt)], cwd=code,
                   check=True, capture_output=True, env=dict(os.environ, PYTHONPATH=str(code)))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", default="bd83a21", help="git ref to compare against")
    p.add_argument("--seconds", type=float, default=3.0, help="seconds per run")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds")
    a = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bookfs-bench-close-"))
    base = work / "base"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(base),
                    a.base], check=True)
    payload = b"\0\0\0\0" + jam(int.from_bytes(os.urandom(1019), "little") | 1 << 8151)  # a noun (issue 21)
    rates: dict[tuple[str, int], list[float]] = {}
    try:
        for name, code in (("base", base), ("this", ROOT)):
            with Book.open(work / f"log-{name}", writable=True, create=True) as b:
                b.save(1, [payload])
            (work / f"mnt-{name}").mkdir()
        for _ in range(a.rounds):
            for threads in (1, 8):
                for name, code in (("base", base), ("this", ROOT)):
                    src, mnt = work / f"log-{name}", work / f"mnt-{name}"
                    mount(code, src, mnt)
                    try:
                        with Book.open(src) as b:
                            first = b.last + 1
                        done, t = appends(f"{mnt}/new", first, a.seconds, threads, payload)
                    finally:
                        umount(code, mnt)
                    rates.setdefault((name, threads), []).append(done / t)
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)])
    print(f"| appends of 1 KB through new/ (events/s, median of {a.rounds}) "
          f"| {a.base} | this | ratio |")
    print("|---|---|---|---|")
    for threads in (1, 8):
        b = statistics.median(rates[("base", threads)])
        t = statistics.median(rates[("this", threads)])
        print(f"| {threads} writer{'s' if threads > 1 else ''} | {b:,.0f} | {t:,.0f} "
              f"| {t / b:.2f}× |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
