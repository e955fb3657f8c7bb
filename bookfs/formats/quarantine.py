"""Bytes that may hold events, kept aside before a log is cut back (``recovery.py``'s rule
4): a quarantine file beside the log, written and ``fsync``'d before the cut, which
``bookfs fsck --salvage`` can recover events from."""

from __future__ import annotations

import os
import time

from bookfs.formats.deedcheck import _CRC_CHUNK
from bookfs.formats.fileio import fsync_dir
from bookfs.formats.layout import FILE_MODE, QUARANTINE_PREFIX


def quarantine(dir_fd_path: str, fd: int, off: int, size: int) -> str:
    """Copy ``[off, size)`` of the log to a new quarantine file beside it, durably.
    Returns its path.  The file name says what it is and where the bytes came from."""
    name = f"{QUARANTINE_PREFIX}{off}-{int(time.time())}"
    path = os.path.join(dir_fd_path, name)
    k = 0
    while os.path.exists(path):
        k += 1
        path = os.path.join(dir_fd_path, f"{name}.{k}")
    out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE)
    try:
        os.fchmod(out, FILE_MODE)  # regardless of umask, like the log itself
        pos = off
        while pos < size:
            chunk = os.pread(fd, min(_CRC_CHUNK, size - pos), pos)
            if not chunk:
                break
            os.write(out, chunk)
            pos += len(chunk)
        os.fsync(out)
    finally:
        os.close(out)
    fsync_dir(dir_fd_path)
    return path
