"""The framing scan of both Book layouts: one forward pass over a log's deeds (``len_d``
at each deed's start, ``let_d`` at its end), extending an
:class:`~bookfs.formats.index.OffsetIndex` with the offset of each deed whose framing is
sound.  CRCs are checked when a deed is read, not here.  Reads in chunks of
:data:`_CHUNK` bytes with ``pread`` (no mmap, so a concurrent truncation cannot crash a
reader) into one reusable buffer: memory stays constant whatever the deed sizes.  Knows
nothing of persistence (``index.py``) or of FUSE.

The walk of each chunk's deeds has a compiled twin (``bookfs/formats/_framing.pyx``),
used when it built and imports and ``BOOKFS_PURE_FRAMING`` is not set (:data:`FRAMING`
says which); the pure loop here is the reference, held equal to it by
``tests/test_framing_compiled.py``.
"""

from __future__ import annotations

import bisect
import os
import sys
import threading
from array import array
from contextlib import contextmanager
from collections.abc import Iterator
from typing import Any, Protocol

from bookfs.compiled import choose
from bookfs.formats.fileio import pread_into
from bookfs.formats.layout import DEED_LEN, MAX_PAYLOAD, MIN_PAYLOAD


class OffsetIndex(Protocol):
    """What a framing scan extends (``index.py``'s :class:`~bookfs.formats.index.OffsetIndex`,
    declared here so that this module, which ``index.py`` imports, imports nothing back):
    the offsets so far, a growable array, and ``end``, where the next deed starts."""

    offsets: Any
    end: int


#: bytes read at a time while scanning framing: a buffer that stays in a core's L2 cache
#: (2 MiB here), so the walk reads back what the kernel just copied from there.  4 MiB
#: chunks made a fleet builder's scan of an 8 MB log 315 µs, 256 KiB ones 233 µs; a
#: 6.4 GB log scans at the same 17 GB/s either way (``docs/benchmarks.md``).
_CHUNK = 256 << 10

_choice = choose("bookfs.formats._framing", "BOOKFS_PURE_FRAMING",
                 "bookfs/formats/_framing.pyx")
#: ``"compiled"`` or ``"pure"``: which walk of a chunk's deeds the scan uses
FRAMING = _choice.name
_compiled = _choice.module


def framing_description() -> str:
    """Which walk of a chunk's deeds the scan uses, for ``info``: compiled, or pure and
    why."""
    return _choice.describe()


def u64_views(mv: memoryview) -> list[memoryview]:
    """Eight zero-copy views of ``mv`` as little-endian u64 arrays, one per alignment:
    the u64 at byte ``r`` is ``views[r & 7][r >> 3]``."""
    views = []
    for a in range(8):
        k = (len(mv) - a) // 8
        views.append(mv[a : a + 8 * k].cast("Q") if k > 0 else mv[0:0].cast("Q"))
    return views


def scan_deeds(fd: int, index: OffsetIndex, size: int, *, trailer: int,
               min_len: int = MIN_PAYLOAD, limit: int | None = None, progress=None) -> int:
    """The framing scan of either Book layout: deeds ``u64 len_d | payload | trailer bytes
    | u64 let_d`` (``trailer``: 4 for the UIP layout's CRC, 0 for vere's), from
    ``index.end`` up to ``size`` and at most ``limit`` deeds in all; each needs
    ``min_len <= len_d <= MAX_PAYLOAD``, to fit in the file, and ``let_d == len_d``.
    Returns where the scan stopped (== ``index.end``); below ``size`` means the bytes from
    there on do not frame a deed.  Constant memory.  Its callers reach it through their
    layout's :meth:`~bookfs.formats.deeds.Deeds.scan`."""
    if sys.byteorder != "little":  # pragma: no cover - the views below assume LE
        raise NotImplementedError("bookfs indexes logs on little-endian machines only")
    limit = 1 << 62 if limit is None else limit
    lo, hi = min_len, MAX_PAYLOAD
    gap = 8 + trailer  # from the payload's start to let_d, less the payload
    with _scan_buffers(min(_CHUNK, max(size - index.end, 0))) as (scratch, out):
        return _scan(fd, index, size, scratch, out if _compiled else None, limit=limit,
                     lo=lo, hi=hi, gap=gap, progress=progress)


def _scan(fd: int, index: OffsetIndex, size: int, scratch: bytearray, out: array | None,
          *, limit: int, lo: int, hi: int, gap: int, progress) -> int:
    """:func:`scan_deeds` with its buffers."""
    offsets = index.offsets
    append = offsets.append
    off = index.end
    reported = off
    stopped = False
    while not stopped and len(offsets) < limit and off + gap + 8 + lo <= size:
        buf = pread_into(fd, scratch, min(_CHUNK, size - off), off)
        if len(buf) < 8:
            break
        base = off
        if out is not None:
            rel, stopped = _walk_compiled(fd, buf, base, size, lo, hi, gap, out, offsets)
        else:
            rel, stopped = _walk_pure(fd, buf, base, size, lo, hi, gap, append)
        off = base + rel
        if len(offsets) > limit:  # the chunk held more deeds than wanted: keep ``limit``
            off = offsets[limit]
            del offsets[limit:]
            stopped = True
        index.end = off
        if progress is not None and off - reported >= 64 << 20:
            progress(off - reported)
            reported = off
    if progress is not None and off > reported:
        progress(off - reported)
    index.end = off
    return off


_OUT_ROOM = 1 << 14  # offsets the compiled walk hands back per call (it resumes when full)
_SMALL_SCAN = 64 << 10  # a scan of fewer bytes than this allocates its own small buffer
_scan_local = threading.local()
_LENT = object()  # a thread's pair while a scan has it


@contextmanager
def _scan_buffers(nbytes: int) -> Iterator[tuple[bytearray, array]]:
    """The read buffer (at least ``nbytes``, at most :data:`_CHUNK`) and the compiled
    walk's output of one scan.  A scan of :data:`_SMALL_SCAN` bytes or more (a log's
    first scan) borrows its thread's pair, made once: a fresh ``bytearray`` is zeroed
    (and its pages faulted in) before the read overwrites it, which a fleet's first
    ``find``, a thousand first scans, paid a thousand times.  A scan that finds the pair
    lent (one inside another, in the same thread) makes its own.  Memory: at most 256
    KiB and 128 KiB a thread that ever scanned a log that large, freed with the
    thread."""
    pair = getattr(_scan_local, "pair", None) if nbytes >= _SMALL_SCAN else _LENT
    if pair is _LENT:
        yield bytearray(nbytes), array("Q", bytes(8 * _OUT_ROOM))
        return
    if pair is None or len(pair[0]) < nbytes or len(pair[1]) != _OUT_ROOM:
        pair = (bytearray(max(_CHUNK, nbytes)), array("Q", bytes(8 * _OUT_ROOM)))
    _scan_local.pair = _LENT
    try:
        yield pair
    finally:
        _scan_local.pair = pair


def _walk_pure(fd: int, buf: memoryview, base: int, size: int, lo: int, hi: int, gap: int,
               append) -> tuple[int, bool]:
    """The deeds of one chunk (``buf``, the log's bytes from ``base``), walked in
    Python: each sound deed's offset appended; ``(rel, stopped)``: where the walk ended
    in ``buf``, and whether the bytes there frame no deed."""
    views = u64_views(buf)
    last_len = len(buf) - 8  # relative position of the last whole u64 in buf
    rel = 0
    while rel <= last_len:
        n = views[rel & 7][rel >> 3]
        t = rel + n + gap  # relative position of let_d
        if n < lo or n > hi or base + t + 8 > size:
            return rel, True  # the bytes at base + rel frame no deed
        if t <= last_len:
            let = views[t & 7][t >> 3]
        else:
            (let,) = DEED_LEN.unpack(os.pread(fd, 8, base + t))
        if let != n:
            return rel, True
        append(base + rel)
        rel = t + 8
    return rel, False


def _walk_compiled(fd: int, buf: memoryview, base: int, size: int, lo: int, hi: int,
                   gap: int, out: array, offsets) -> tuple[int, bool]:
    """:func:`_walk_pure`, by the compiled loop (``_framing.pyx``, ``scan_chunk``); a
    ``let_d`` past the chunk is read here, as the pure walk reads it."""
    rel = 0
    while True:
        rel, found, how = _compiled.scan_chunk(buf, rel, base, size, lo, hi, gap, out)
        if found:
            offsets.extend(out[:found])
        if how == 0:
            if found < len(out):
                return rel, False
            continue  # (``out`` was full)
        if how == 1:
            return rel, True
        (n,) = DEED_LEN.unpack_from(buf, rel)  # how == 2: its let_d lies past the chunk
        (let,) = DEED_LEN.unpack(os.pread(fd, 8, base + rel + n + gap))
        if let != n:
            return rel, True
        offsets.append(base + rel)
        rel += n + gap + 8


#: deeds confirmed per vectorised step of confirm_chain, and at most this many bytes read
#: per step (a larger deed: its len_d alone).  A step's numpy temporaries (offsets, their
#: gather, the comparison) then stay in a core's caches: the 10-million-event ship's
#: chain of 6.4 GB was walked in 1.05-1.64 s with steps of 65,536 deeds and 64 MiB, in
#: 0.42-0.44 s with these; logs of 10 KB to 1 MB deeds twice as fast (``docs/benchmarks.md``).
_WALK_DEEDS = 1 << 13
_WALK_BYTES = 8 << 20
_WALK_ALONE = 256  # walks of fewer deeds than this: one pread a deed
_WALK_FIRST = 1 << 20  # the walk's buffer at first; a larger step grows it (to _WALK_BYTES)


def walk_ahead(offsets, i: int, count: int) -> int:
    """How far a walk asked to confirm deed ``i`` goes: on past it by one step of
    :func:`confirm_chain` at most (:data:`_WALK_DEEDS` deeds, the last starting within
    :data:`_WALK_BYTES` of deed ``i + 1``; ``count`` deeds in all), so that a reader going
    forward through a log (a listing stat'ed in order, ``cat events/*``) is handed one
    walk a step, not one a deed; ``i`` itself for deeds larger than that, whose
    ``len_d`` are read one ``pread`` each (from the disk, one seek each)."""
    hi = min(count, i + 1 + _WALK_DEEDS)
    if i + 1 >= hi:
        return i
    return max(i, bisect.bisect_right(offsets, offsets[i + 1] + _WALK_BYTES, i + 1, hi) - 2)


def confirm_chain(fd: int, offsets, k: int, i: int, count: int, end: int,
                  overhead: int) -> int:
    """Check that deeds ``k .. i`` of an index chain: each deed's ``len_d`` (at
    ``offsets[j]``) plus ``overhead`` spans exactly to the next offset (the last deed's,
    to ``end``; ``count`` deeds in all).  Returns the first ``j`` that breaks the chain,
    or ``i + 1``.  Reads the deeds' bytes in steps of up to :data:`_WALK_DEEDS` deeds and
    :data:`_WALK_BYTES` bytes (fewer deeds when they are larger) and compares every
    ``len_d`` of a step at once (numpy); a deed larger than :data:`_WALK_BYTES` has its
    ``len_d`` read alone.  So a persisted index of 10
    million small deeds is confirmed at the speed of reading the log, not of 10 million
    ``pread`` calls; a walk of at most :data:`_WALK_ALONE` deeds reads each ``len_d``
    alone (no numpy to load for a small log)."""
    if i - k < _WALK_ALONE:
        return _walk_alone(fd, offsets, k, i + 1, count, end, overhead)
    import numpy as np

    lens = np.arange(8, dtype=np.int64)
    buf = None  # one step's bytes, reused: no fresh allocation and page faults a step
    while k <= i:
        j = min(i + 1, k + _WALK_DEEDS)  # deeds k .. j-1 in this step
        # a copy of this step's offsets (an array slice): a buffer exported from the live
        # array would make a writer's append to it fail (BufferError)
        offs = np.frombuffer(offsets[k:min(j + 1, count)], dtype=np.uint64).astype(np.int64)
        stop = int(offs[j - k]) if j < count else end
        start = int(offs[0])
        if stop - start > _WALK_BYTES and j - k > 1:
            # fewer deeds: as many as fit in _WALK_BYTES (deeds k .. m-1 span
            # offs[m - k] - start bytes); a lie that unorders the offsets is found below
            m = k + int(np.searchsorted(offs[:j - k], start + _WALK_BYTES, side="right")) - 1
            if m > k:
                j, stop = m, int(offs[m - k])
        alone = stop - start > _WALK_BYTES
        if alone:
            j = k + 1  # a big deed (or a lie): alone, by one pread
        else:
            want = max(stop - start, 0)
            if buf is None or len(buf) < want:
                buf = bytearray(max(want, min(_WALK_BYTES, _WALK_FIRST)))
            data = np.frombuffer(pread_into(fd, buf, want, start), dtype=np.uint8)
            rel = offs[:j - k] - start
            # a short read (the file was cut) or offsets out of order (a lie)
            alone = len(data) < stop - start or (rel < 0).any() \
                or int(rel.max()) + 8 > len(data)
        if alone:  # this step one deed at a time
            m = _walk_alone(fd, offsets, k, j, count, end, overhead)
            if m < j:
                return m
            k = j
            continue
        nxt = np.empty(j - k, dtype=np.int64)
        nxt[:-1] = offs[1:j - k]
        nxt[-1] = stop
        got = data[(rel[:, None] + lens).astype(np.intp)].copy().view("<u8").ravel()
        ok = got.astype(np.int64) + overhead == nxt - offs[:j - k]
        if not ok.all():
            return k + int(np.argmin(ok))
        k = j
    return k


def _walk_alone(fd: int, offsets, k: int, j: int, count: int, end: int,
                overhead: int) -> int:
    """:func:`confirm_chain`'s rule for deeds ``k .. j - 1``, one ``pread`` of ``len_d``
    a deed: the first that breaks the chain, or ``j``."""
    for m in range(k, j):
        nxt = offsets[m + 1] if m + 1 < count else end
        head = os.pread(fd, 8, offsets[m])
        if len(head) != 8 or DEED_LEN.unpack(head)[0] + overhead != nxt - offsets[m]:
            return m
    return j


def newest_deeds(fd: int, floor: int, end: int, most: int, *,
                 overhead: int) -> Iterator[tuple[int, int]]:
    """``(offset, payload size)`` of up to ``most`` deeds walked back from ``end``, newest
    first: each found by its trailing ``let_d`` (the deed before ``pos`` starts at ``pos -
    let_d - overhead``), which must match its ``len_d`` and keep the deed at or after
    ``floor`` (the first deed's offset).  Stops at the first that does not.  Framing
    only: the caller checks each CRC.  Without an index, so a log's newest deeds cost a
    few reads whatever its size; with ``let_d`` at each deed's end, the walk from the end
    meets the same deeds a walk from the header does.  Lazy: each deed is read as the
    caller asks for it, so one that stops at the newest reads two ``u64`` s."""
    found = 0
    pos = end
    while found < most and pos > floor:
        tail = os.pread(fd, 8, pos - 8)
        if len(tail) != 8:
            break
        (n,) = DEED_LEN.unpack(tail)
        start = pos - n - overhead
        if n > pos or start < floor or os.pread(fd, 8, start) != tail:
            break
        yield start, n
        found += 1
        pos = start
