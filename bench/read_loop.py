"""Read one byte range of a file again and again in 1 MiB ``preadv`` calls into one
buffer: a loop to run under ``perf record`` (docs/benchmarks.md, "segments/ at
page-cache speed"), so the kernel's page-cache path is all there is to see.

Usage: python bench/read_loop.py PATH OFFSET SIZE TIMES
"""

import os
import sys

MIB = 1 << 20


def main() -> int:
    if len(sys.argv) != 5 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        return 0 if len(sys.argv) > 1 and sys.argv[1] in ("-h", "--help") else 2
    path, off, size, times = sys.argv[1], *map(int, sys.argv[2:])
    fd = os.open(path, os.O_RDONLY)
    buf = memoryview(bytearray(MIB))
    try:
        for _ in range(times):
            got = 0
            while got < size:
                n = os.preadv(fd, [buf[:min(MIB, size - got)]], off + got)
                if not n:
                    raise SystemExit(f"{path}: short read at {off + got}")
                got += n
    finally:
        os.close(fd)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
