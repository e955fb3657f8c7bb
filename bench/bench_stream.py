"""Stream reads through a fresh read-only mount: one large event and every segment
(issue 19: each read straight from the log is checked against the log's generation).

    python bench/bench_stream.py build DIR           # a log: 2,000 small events + 256 MiB
    python bench/bench_stream.py read DIR            # mount -o ro, cat events/ and segments/

Run ``read`` under ``farm-bench`` against another checkout with ``PYTHONPATH``; the log's
bytes stay in the page cache, the mount is new each run (no FUSE pages cached)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile


def build(d: str) -> None:
    from bookfs.formats.book import Book
    os.makedirs(d, exist_ok=True)
    with Book.open(os.path.join(d, "log"), writable=True, create=True) as book:
        book.save(1, [b"\0\0\0\0" + os.urandom(200) for _ in range(2000)])
        book.save(2001, [b"\0\0\0\0" + os.urandom((256 << 20) - 4)])


def read(d: str) -> None:
    import bookfs
    print(f"bookfs from {os.path.dirname(bookfs.__file__)}", file=sys.stderr)
    bookfs_cmd = [sys.executable, "-m", "bookfs.cli"]
    with tempfile.TemporaryDirectory() as mnt:
        subprocess.run(bookfs_cmd + ["mount", os.path.join(d, "log"), mnt, "-o", "ro"],
                       check=True, stdout=subprocess.DEVNULL)
        try:
            subprocess.run(f"cat {mnt}/events/000000002001 > /dev/null && "
                           f"cat {mnt}/segments/* > /dev/null", shell=True, check=True)
        finally:
            subprocess.run(bookfs_cmd + ["umount", mnt], check=True,
                           stdout=subprocess.DEVNULL)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=["build", "read"])
    p.add_argument("dir")
    a = p.parse_args()
    (build if a.what == "build" else read)(a.dir)


if __name__ == "__main__":
    main()
