"""vere's deeds when a log is damaged: batch CRCs, finding framed deeds at any offset, the
torn tail.

A vere deed is ``u64 len_d | payload | u64 let_d`` (no CRC of its own: a batch's CRC is in
the header slot that commits it).  Its walks, checks and writer are ``deeds.py``'s
:data:`~bookfs.formats.deeds.VERE`; the engine (``vere.py``) and its ``fsck``
(``vere_recovery.py``) recover with these.
"""

from __future__ import annotations

import os

from bookfs.formats.fileio import pread_into
from bookfs.formats.layout import (
    DEED_LEN,
    MAX_PAYLOAD,
    VERE_DEED_OVERHEAD,
    VERE_MIN_LEN,
    crc32,
)

_CRC_CHUNK = 8 << 20  # bytes per pread when computing a batch CRC
_SALVAGE_WINDOW = 64 << 20  # bytes examined at a time when looking for framed deeds


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
