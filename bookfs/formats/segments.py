"""The bulk view: a log cut into segments of whole deeds, for readers that want few large
files instead of one file per event (Spark over a big log).

Segment ``k`` holds, byte for byte as on disk, every deed that *starts* in the byte range
``[16 + k*span, 16 + (k+1)*span)`` of ``book.log`` (the parallel-reader rule of the
word-stuffed log: a record belongs to the range its first byte is in).  So segments are cut
on deed boundaries, never overlap, cover the whole log in order, and a segment's size is at
most ``span`` plus its last deed.  A segment is *complete*, and immutable, once the log
has grown past its range; the last segment may still grow.  A segment is named after its
first event; its deeds are that event and the ones after it, in order.

A segment's *sizes* (:meth:`Segments.sizes`, served as ``segments/<first>.sizes``) are its
events' payload sizes, one unsigned 64-bit little-endian word an event, in order: what
``ls -l events/`` shows of them, taken from the log's offset index, so no payload byte is
read and no CRC checked to give them.
"""

from __future__ import annotations

import bisect
import os
import sys
from array import array
from dataclasses import dataclass

from bookfs.errors import CorruptDeed
from bookfs.formats.book import Book
from bookfs.formats.deedcheck import first_bad_deed
from bookfs.formats.deeds import UIP
from bookfs.formats.layout import HEADER_SIZE

#: Spark holds a whole file (one row) per task in memory: 16 MiB keeps that small.
DEFAULT_SPAN = 16 << 20
#: bytes a segment's sizes give each event: one little-endian u64 (``Segments.sizes``)
SIZE_WORD = 8


@dataclass(frozen=True)
class Segment:
    index: int
    first: int  # first event
    last: int  # last event
    start: int  # byte offset in book.log
    end: int  # byte offset just past its last deed
    complete: bool

    @property
    def size(self) -> int:
        return self.end - self.start

    @property
    def sizes_size(self) -> int:
        """Bytes of its sizes (:meth:`Segments.sizes`): a word an event."""
        return SIZE_WORD * (self.last - self.first + 1)


class Segments:
    """Segments of one open :class:`Book` (``span`` bytes of log each)."""

    def __init__(self, book: Book, span: int = DEFAULT_SPAN):
        if span < 1:
            raise ValueError("segment span must be positive")
        self.book = book
        self.span = span

    def slots(self) -> int:
        """How many segment indexes the log spans now (some may hold no deed start)."""
        return max(0, -(-(self.book.log_bytes - HEADER_SIZE) // self.span))

    def get(self, k: int) -> Segment | None:
        """Segment ``k``, or None if no deed starts in its range."""
        book = self.book
        first, count, end = book._view
        if k < 0 or not count:
            return None
        offsets = book.index.offsets
        lo = HEADER_SIZE + k * self.span
        hi = lo + self.span
        i = bisect.bisect_left(offsets, lo, 0, count)
        j = bisect.bisect_left(offsets, hi, 0, count)
        if i >= j:
            return None
        stop = offsets[j] if j < count else end
        return Segment(k, first + i, first + j - 1, offsets[i], stop, complete=end >= hi)

    def containing_first(self, event: int) -> Segment | None:
        """The segment whose first event is ``event``, or None."""
        if event not in self.book:
            return None
        off = self.book.index.offsets[event - self.book.first]
        seg = self.get((off - HEADER_SIZE) // self.span)
        return seg if seg is not None and seg.first == event else None

    def __iter__(self):
        for k in range(self.slots()):
            seg = self.get(k)
            if seg is not None:
                yield seg

    def verify(self, seg: Segment) -> None:
        """Check the CRC of every deed in ``seg`` or raise :class:`CorruptDeed`."""
        book = self.book
        i0 = seg.first - book.first
        offsets = book.index.offsets[i0 : seg.last - book.first + 1]
        bad = first_bad_deed(book.fileno(), offsets, 0, seg.end)
        if bad is not None:
            event = seg.first + bad
            raise CorruptDeed(f"{book.log_path}: event {event} at offset {offsets[bad]} "
                              f"(segment {seg.first}) fails its CRC check",
                              event=event, offset=offsets[bad])

    def read(self, seg: Segment, offset: int, size: int) -> bytes:
        """Up to ``size`` raw bytes of ``seg`` from ``offset`` (unchecked: verify first)."""
        if offset >= seg.size:
            return b""
        return os.pread(self.book.fileno(), min(size, seg.size - offset), seg.start + offset)

    def sizes(self, seg: Segment, offset: int, size: int) -> bytes:
        """Up to ``size`` bytes from ``offset`` of ``seg``'s sizes: the payload size of each
        of its events, a little-endian u64 each, from the offset index (module
        docstring); only the words asked for are made."""
        total = seg.sizes_size
        if offset >= total or size <= 0:
            return b""
        stop = min(total, offset + size)
        i, j = offset // SIZE_WORD, -(-stop // SIZE_WORD)  # events seg.first + i .. + j - 1
        offsets = self.book.index.offsets
        base = seg.first - self.book.first
        starts = offsets[base + i: base + j]
        ends = offsets[base + i + 1: base + j]
        ends.append(offsets[base + j] if seg.first + j <= seg.last else seg.end)
        words = array("Q", [UIP.payload_size(a, b) for a, b in zip(starts, ends)])
        if sys.byteorder != "little":
            words.byteswap()
        skip = offset - i * SIZE_WORD
        return words.tobytes()[skip: skip + stop - offset]
