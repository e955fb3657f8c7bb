"""vere's deeds: the framing scan, batch CRCs, and finding framed deeds at any offset.

A vere deed is ``u64 len_d | payload | u64 let_d`` (no CRC of its own: a batch's CRC is in
the header slot that commits it).  The engine (``vere.py``) indexes and recovers with
these; its ``fsck`` (``vere_recovery.py``) too.
"""

from __future__ import annotations

import errno
import os

from bookfs.formats.fileio import pread_into
from bookfs.formats.framing import scan_deeds
from bookfs.formats.index import OffsetIndex
from bookfs.formats.logbase import pwritev_all
from bookfs.formats.layout import (
    DEED_LEN,
    MAX_PAYLOAD,
    VERE_DEED_OVERHEAD,
    VERE_MIN_LEN,
    crc32,
)
from bookfs.types import Progress

_CRC_CHUNK = 8 << 20  # bytes per pread when computing a batch CRC
_SALVAGE_WINDOW = 64 << 20  # bytes examined at a time when looking for framed deeds


def scan_vere_framing(fd: int, index: OffsetIndex, size: int, limit: int, *,
                      progress: Progress | None = None, min_len: int = VERE_MIN_LEN) -> int:
    """Extend ``index`` with deeds whose framing is sound, from ``index.end`` up to ``size``
    and at most ``limit`` deeds in all: ``min_len <= len_d <= 2^32`` (``min_len`` 1, or 0
    where a batch CRC is to decide: 16 zero bytes frame a 0-byte deed), the deed
    (``len_d + 16`` bytes) fits in the file, and ``let_d == len_d``.  Returns where the
    scan stopped (== ``index.end``).  Reads in large chunks with ``pread``; constant
    memory (:func:`bookfs.formats.framing.scan_deeds`)."""
    return scan_deeds(fd, index, size, trailer=0, min_len=min_len, limit=limit,
                      progress=progress)


def crc_range(fd: int, start: int, stop: int) -> int | None:
    """crc32 of the file's bytes ``[start, stop)``, streamed; ``None`` if the file is
    shorter than ``stop``."""
    crc = 0
    pos = start
    scratch = bytearray(min(_CRC_CHUNK, max(stop - start, 1)))
    while pos < stop:
        mv = pread_into(fd, scratch, min(len(scratch), stop - pos), pos)
        if not len(mv):
            return None
        crc = crc32(mv, crc)
        pos += len(mv)
    return crc


def find_framed_deed(fd: int, start: int, stop: int) -> int | None:
    """The first offset in ``[start, stop)`` where a deed with sound framing (vere's only
    check) begins and ends by ``stop``, trying every byte offset; ``None`` if there is
    none.  Vectorised with numpy."""
    import numpy as np

    pos = start
    while pos + VERE_DEED_OVERHEAD + VERE_MIN_LEN <= stop:
        win = min(_SALVAGE_WINDOW, stop - pos)
        arr = np.frombuffer(os.pread(fd, win + 7, pos), dtype=np.uint8)
        cands = []
        for a in range(8):
            usable = (len(arr) - a) // 8 * 8
            if usable <= 0:
                continue
            lens = arr[a : a + usable].view("<u8").astype(np.int64, copy=False)
            starts = pos + a + 8 * np.arange(len(lens), dtype=np.int64)
            ok = (lens >= VERE_MIN_LEN) & (starts < pos + win)
            ok &= lens <= (stop - starts - VERE_DEED_OVERHEAD)
            cands.extend(starts[ok].tolist())
        for off in sorted(cands):
            (n,) = DEED_LEN.unpack(os.pread(fd, 8, off))
            tail = os.pread(fd, 8, off + 8 + n)
            if len(tail) == 8 and DEED_LEN.unpack(tail)[0] == n:
                return off
        pos += win
    return None


def is_torn_vere_tail(fd: int, off: int, size: int) -> bool:
    """True when ``[off, size)`` can only be an incomplete final deed: it is shorter than
    the deed its first 8 bytes announce (or too short to announce one), and no framed deed
    starts anywhere inside it.  Anything else may hold events and must be quarantined."""
    if size - off >= 8:
        (n,) = DEED_LEN.unpack(os.pread(fd, 8, off))
        if not (VERE_MIN_LEN <= n <= MAX_PAYLOAD) or off + n + VERE_DEED_OVERHEAD <= size:
            return False  # announces no deed, or a whole deed that was never committed
    return find_framed_deed(fd, off + 1, size) is None


def write_vere_deeds(fd: int, payloads: list, start: int) -> tuple[list[int], int]:
    """Write the deeds for ``payloads`` at ``start`` of the log ``fd`` (a save of
    ``vere.py``): one ``pwritev`` for a batch of
    in-memory payloads; a ``Blob`` (``book.py``) is streamed once, in bounded chunks.  Returns
    the payload sizes and the crc32 of all deed bytes written (the batch ``sum``)."""
    bufs: list = []
    sizes = []
    crc = 0
    off = start
    for p in payloads:
        n = len(p)
        sizes.append(n)
        frame = DEED_LEN.pack(n)
        if isinstance(p, (bytes, bytearray, memoryview)):
            bufs += (frame, p, frame)
            crc = crc32(frame, crc32(p, crc32(frame, crc)))
            continue
        off = pwritev_all(fd, bufs, off)
        bufs = []
        crc = crc32(frame, crc)
        off = pwritev_all(fd, [frame], off)
        got = 0
        for chunk in p.chunks():
            crc = crc32(chunk, crc)
            got += len(chunk)
            off = pwritev_all(fd, [chunk], off)
        if got != n:
            raise OSError(errno.EIO, f"payload changed size while written ({n} -> {got})")
        crc = crc32(frame, crc)
        off = pwritev_all(fd, [frame], off)
    pwritev_all(fd, bufs, off)
    return sizes, crc
