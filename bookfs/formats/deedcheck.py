"""The checks of a damaged UIP log's deeds (``len_d | payload | crc | let_d``), apart from
any recovery (one deed's checks are ``deeds.py``'s :data:`~bookfs.formats.deeds.UIP`): the
first bad CRC over a range of indexed deeds, in several processes when the range is large (:func:`first_bad_deed`, with
:func:`in_workers`), where valid deeds start in a damaged region
(:func:`find_valid_deeds`) and whether a bad region is only a torn tail
(:func:`is_torn_tail`).  ``recovery.py`` states the rules these serve, and re-exports
them.  Reads with ``pread`` (no mmap), in chunks: memory stays bounded whatever the
deeds' sizes."""

from __future__ import annotations

import os
import pickle

from bookfs.formats.deeds import UIP, BadDeed
from bookfs.formats.fileio import pread_into
from bookfs.formats.layout import DEED_LEN, DEED_OVERHEAD, MAX_PAYLOAD, MIN_PAYLOAD, crc32
from bookfs.formats.seals import SEALED_FROM, seal_deed

_CRC_CHUNK = 8 << 20  # bytes per pread when checking large deeds / ranges
_SALVAGE_WINDOW = 64 << 20  # bytes examined at a time by find_valid_deeds


_PARALLEL_BYTES = 256 << 20  # ranges larger than this are checked by several processes


def first_bad_deed(fd: int, offsets, start_i: int, end: int, *, progress=None,
                   workers: int | None = None, seals: list | None = None) -> int | None:
    """Index (into ``offsets``) of the first deed from ``start_i`` on whose CRC fails, or
    ``None``.  A range of more than 256 MiB is split between ``workers`` processes (one
    per CPU by default; forked, so the offsets are shared copy-on-write), each checking a
    contiguous part; the smallest failing index wins.  ``seals``: a list that gets
    ``(index, Seal)`` of each deed checked that is large enough to seal
    (``seals.py``), made in the same pass."""
    count = len(offsets)
    if start_i >= count:
        return None
    workers = workers or os.cpu_count() or 1
    if workers < 2 or end - offsets[start_i] < _PARALLEL_BYTES:
        return _first_bad_serial(fd, offsets, start_i, end, progress=progress, seals=seals)
    bounds = [start_i + (count - start_i) * k // workers for k in range(workers + 1)]

    def part(k: int, progress=None):  # deeds bounds[k] .. bounds[k + 1] - 1
        lo, hi = bounds[k], bounds[k + 1]
        stop = offsets[hi] if hi < count else end
        made = None if seals is None else []
        bad = _first_bad_serial(fd, offsets[lo:hi], 0, stop, progress=progress, seals=made)
        return None if bad is None else lo + bad, [(lo + j, s) for j, s in made or ()]

    def done(k: int, _) -> None:
        if progress is not None:
            hi = bounds[k + 1]
            progress((offsets[hi] if hi < count else end) - offsets[bounds[k]])

    found = in_workers(workers, part, progress, done, "the CRC check")
    first = next((b for b, _ in found if b is not None), None)
    if seals is not None:
        seals += [m for _, made in found for m in made if first is None or m[0] < first]
    return first


def in_workers(parts: int, work, progress, done, what: str) -> list:
    """``[work(0, progress), work(1), ..., work(parts - 1)]``: part 0 in this process, each
    other in a forked child (touching nothing else; its result pickled back through a
    pipe), ``done(k, result)`` called as each child's result comes in.  OSError if a child
    fails (``what`` names the work)."""
    children = []
    for k in range(1, parts):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # child: part k, reported, nothing else
            code = 1
            try:
                os.close(r)
                with os.fdopen(w, "wb") as f:
                    pickle.dump(work(k), f)
                code = 0
            finally:
                os._exit(code)
        os.close(w)
        children.append((k, pid, r))
    results = [None] * parts
    try:
        results[0] = work(0, progress)
    finally:
        for k, pid, r in children:
            with os.fdopen(r, "rb") as f:
                data = f.read()
            _, status = os.waitpid(pid, 0)
            if status != 0 or not data:
                raise OSError(f"{what} failed in a worker (part {k + 1} of {parts})")
            results[k] = pickle.loads(data)
            done(k, results[k])
    return results


def _first_bad_serial(fd: int, offsets, start_i: int, end: int, *,
                      progress=None, seals: list | None = None) -> int | None:
    """``first_bad_deed`` in this process: big sequential chunks, each deed checked in
    place; a deed larger than a chunk streamed alone (and sealed, into ``seals``)."""
    count = len(offsets)
    i = start_i
    if i >= count:
        return None
    scratch = bytearray(min(_CRC_CHUNK, end - offsets[i]))  # no 8 MiB to check one small deed
    while i < count:
        base = offsets[i]
        nxt0 = offsets[i + 1] if i + 1 < count else end
        if nxt0 - base > _CRC_CHUNK:  # one big deed: stream it
            n = nxt0 - base - DEED_OVERHEAD
            if seals is not None and n >= SEALED_FROM:
                try:
                    seals.append((i, seal_deed(fd, base, n, UIP)))
                except BadDeed:
                    return i
            elif not UIP.sound(fd, base, n):
                return i
            if progress is not None:
                progress(nxt0 - base)
            i += 1
            continue
        # read as many whole deeds as fit in one chunk
        j = i
        while j < count:
            nxt = offsets[j + 1] if j + 1 < count else end
            if nxt - base > _CRC_CHUNK:
                break
            j += 1
        stop = offsets[j] if j < count else end
        mv = pread_into(fd, scratch, stop - base, base)
        if len(mv) != stop - base:
            return i  # the file is shorter than the index says
        u32 = [mv[a : a + (len(mv) - a) // 4 * 4].cast("I") for a in range(4)]
        rel = [o - base for o in offsets[i:j]]
        rel.append(stop - base)
        for a, b in zip(rel, rel[1:]):
            t = b - 12  # where the stored CRC sits
            if crc32(mv[a:t]) != u32[t & 3][t >> 2]:
                return i + rel.index(a)
        if progress is not None:
            progress(stop - base)
        i = j
    return None


def find_valid_deeds(fd: int, start: int, stop: int, *, limit: int | None = None) -> list[int]:
    """Offsets in ``[start, stop)`` where a valid deed (framing and CRC) begins, trying every
    byte offset.  A candidate is accepted only when its length trailer and CRC agree.  Deeds
    must end by ``stop``.  Stops after ``limit`` finds.  Vectorised with numpy, so scanning a
    region of hundreds of MB takes seconds, not hours."""
    import numpy as np

    found: list[int] = []
    pos = start
    buf = bytearray(max(0, min(_SALVAGE_WINDOW, stop - start)) + 7)  # reused: one allocation
    while pos < stop - (MIN_PAYLOAD + DEED_OVERHEAD) + 1:
        win = min(_SALVAGE_WINDOW, stop - pos)
        arr = np.frombuffer(pread_into(fd, buf, win + 7, pos), dtype=np.uint8)
        cands = []
        for a in range(8):
            usable = (len(arr) - a) // 8 * 8
            if usable <= 0:
                continue
            lens = arr[a : a + usable].view("<u8")
            starts = pos + a + 8 * np.arange(len(lens), dtype=np.int64)
            ok = (lens >= MIN_PAYLOAD) & (lens <= MAX_PAYLOAD)
            ok &= starts < pos + win
            room = (stop - starts - DEED_OVERHEAD).astype(np.int64)
            ok &= lens.astype(np.int64) <= room
            cands.extend(starts[ok].tolist())
        cands.sort()
        for off in cands:
            (n,) = DEED_LEN.unpack(os.pread(fd, 8, off))
            if UIP.sound(fd, off, n):
                found.append(off)
                if limit is not None and len(found) >= limit:
                    return found
        pos += win
    return found


def is_torn_tail(fd: int, off: int, size: int) -> bool:
    """True when ``[off, size)`` can only be an incomplete final deed (rule 3)."""
    region = size - off
    if region >= 8:
        (n,) = DEED_LEN.unpack(os.pread(fd, 8, off))
        if not (MIN_PAYLOAD <= n <= MAX_PAYLOAD) or off + n + DEED_OVERHEAD <= size:
            return False  # announces no deed, or a complete one that failed its checks
        if region >= MIN_PAYLOAD + DEED_OVERHEAD:
            (let,) = DEED_LEN.unpack(os.pread(fd, 8, size - 8))
            if let + DEED_OVERHEAD == region:
                return False  # a whole deed whose len_d was damaged, not an incomplete one
    return not find_valid_deeds(fd, off + 1, size, limit=1)
