"""``segments/<K>``: the log's bytes in fixed spans, for bulk readers (Spark's ``--bulk``).

Shown for a plain UIP-layout log only (a :class:`~bookfs.formats.book.Book`); a segment is
named by the first event it holds.

Caching: a segment that is complete (the log grew past its byte range) never changes:
entry and attributes cached for a day (``FOREVER``), pages kept across opens.  The last,
incomplete segment grows with the log: attribute timeout ``GROWING`` (0), so every
``stat`` asks and the kernel drops its cached pages when it sees the size change; a
handle opened while it was the last one reads up to the log's current end, not the end
when it was opened.  The names the kernel may hold are noted (``names``), so that a new
generation of the log drops them (:mod:`bookfs.fs.watch`).

Checking: a segment's deeds are checked before its bytes are served, once at each size
(a failed check is EIO).  Bytes are served only if the log is still the same generation
after they were read (``LogWatch.read_then_recheck``); a segment of an older generation,
or a handle opened before the log was recovered or replaced, answers ESTALE.  Writes are
EROFS.
"""

from __future__ import annotations

import errno
import stat

import pyfuse3
import trio

from bookfs.errors import refuse
from bookfs.formats.segments import Segment
from bookfs.fs import inodes as I
from bookfs.fs.nodes.base import FOREVER, GROWING, Kind


class SegmentHandle:
    """An open segment and the log generation it was opened in."""

    __slots__ = ("seg", "generation")

    def __init__(self, seg: Segment, generation: int):
        self.seg, self.generation = seg, generation


class SegmentFiles(Kind):
    """``segments/<K>`` (routed here only when the log has segments: ``fs.segments``)."""

    def __init__(self, fs):
        super().__init__(fs)
        self.names: dict[int, bytes] = {}  # segment index -> name the kernel holds
        self.checked: dict[int, int] = {}  # segment index -> size whose deeds passed

    def seg_attrs(self, seg: Segment) -> pyfuse3.EntryAttributes:
        """A segment's attributes; its name is noted as one the kernel may cache."""
        fs = self.fs
        self.names[seg.index] = I.event_name(seg.first)
        return fs.entry_attrs(I.segment_inode(seg.index, fs.generations.slot_now()),
                              stat.S_IFREG | fs.modes.read, seg.size,
                              self.log.mtime_ns(seg.last),
                              FOREVER if seg.complete else GROWING, entry_timeout=FOREVER)

    async def attrs(self, ino: int) -> pyfuse3.EntryAttributes:
        segments, watch = self.fs.segments, self.fs.watch
        seg = segments.get(I.inode_segment(ino))
        if seg is None or not seg.complete:  # it may have grown: look at the log
            watch.look()
            self.fs.generations.current(ino, f"segment {I.inode_segment(ino)}")
            seg = segments.get(I.inode_segment(ino))
        if seg is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self.seg_attrs(seg)

    async def lookup(self, name: bytes) -> pyfuse3.EntryAttributes:
        """``segments/<name>``: the segment whose first event is ``name``."""
        event = I.parse_number(name)
        self.fs.watch.look()
        seg = self.fs.segments.containing_first(event) if event is not None else None
        if seg is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self.seg_attrs(seg)

    async def check(self, seg: Segment) -> None:
        """Check ``seg``'s deeds before its bytes are served: once at each size (a complete
        segment's never changes; the growing last one is checked again when it grew)."""
        if self.checked.get(seg.index) == seg.size:
            return
        await trio.to_thread.run_sync(self.fs.segments.verify, seg)
        self.checked[seg.index] = seg.size

    async def open(self, ino: int, flags: int, writing: int, ctx) -> pyfuse3.FileInfo:
        fs = self.fs
        if writing:
            raise refuse(errno.EROFS, "segments are read-only")
        seg = fs.segments.get(I.inode_segment(ino))
        if seg is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        generation = fs.generations.generation
        await self.check(seg)
        return fs.file_info(fs.new_fh(SegmentHandle(seg, generation)),
                            keep_cache=seg.complete)

    async def read_inode(self, ino: int, off: int, size: int) -> bytes:
        segments, watch = self.fs.segments, self.fs.watch
        what = f"segment {I.inode_segment(ino)}"
        self.fs.generations.current(ino, what)
        seg = segments.get(I.inode_segment(ino))
        if seg is None:
            raise refuse(errno.ESTALE, f"{what}: no longer in the log")
        await self.check(seg)
        self.fs.generations.current(ino, what)
        return watch.read_then_recheck(ino, what, segments.read, seg, off, size)

    def read_handle(self, h: SegmentHandle, off: int, size: int) -> bytes:
        """A read through a handle ``open`` made."""
        segments, watch = self.fs.segments, self.fs.watch
        if h.generation != self.fs.generations.generation:
            raise refuse(errno.ESTALE, f"segment {h.seg.index}: the log was recovered or "
                                       "replaced since this file was opened; reopen it")
        if not h.seg.complete and off + size > h.seg.size:
            # the last segment grows with the log: read up to its current end (the
            # new deeds' CRCs were checked by the save or by Book.refresh)
            seg = segments.get(h.seg.index)
            if seg is not None and seg.first == h.seg.first:
                h.seg = seg
        return watch.read_then_recheck(None, f"segment {h.seg.index}", segments.read,
                                          h.seg, off, size)
