"""Small file-I/O helpers shared by the format modules."""

from __future__ import annotations

import os


def pread_into(fd: int, buf: bytearray, size: int, offset: int) -> memoryview:
    """Read up to ``size`` bytes at ``offset`` into the reusable ``buf`` (no allocation, no
    fresh page faults per chunk); returns a view of the bytes read."""
    view = memoryview(buf)
    got = os.preadv(fd, [view[:size]], offset)
    return view[:got]


def fsync_dir(path: str) -> None:
    """Make a directory's entries (a create, rename or unlink in it) durable."""
    dfd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
