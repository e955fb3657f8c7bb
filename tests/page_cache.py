"""The page cache of a file, as a test sees it: which pages are resident (``mincore(2)``)
and dropping them (``POSIX_FADV_DONTNEED``)."""

from __future__ import annotations

import ctypes
import mmap
import os
from pathlib import Path

PAGE = mmap.PAGESIZE


def resident(path: Path) -> bytearray:
    """``mincore(2)`` of the whole file: one byte a page, bit 0 set when it is resident
    (mapping a file and asking faults nothing in)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert addr not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
        try:
            vec = (ctypes.c_ubyte * ((size + PAGE - 1) // PAGE))()
            assert libc.mincore(addr, size, vec) == 0, os.strerror(ctypes.get_errno())
            return bytearray(vec)
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)


def evict(path: Path) -> None:
    os.sync()
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def pages(off: int, length: int) -> range:
    return range(off // PAGE, (off + length - 1) // PAGE + 1)
