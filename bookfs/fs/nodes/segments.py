"""``segments/<K>``: the log's bytes in fixed spans, for bulk readers (Spark's ``--bulk``);
``segments/<K>.sizes``: the payload sizes of its events.

Shown for a plain UIP-layout log only (a :class:`~bookfs.formats.book.Book`); a segment is
named by the first event it holds.  ``<K>.sizes`` is reached by name only (a listing of
``segments/`` shows the segments alone, so that a bulk reader of the directory reads only
them): a little-endian u64 an event, ``formats/segments.py``'s ``Segments.sizes``, what
``ls -l events/`` shows, from the offset index: no payload byte is read to serve it, and
so no CRC is checked (Spark's ``event``/``size`` projections read it instead of the
segment).  Its caching, generations and errors are its segment's.

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


#: the name of a segment's sizes file is its segment's and this
SIZES_SUFFIX = b".sizes"


class SegmentHandle:
    """An open segment (or its sizes file) and the log generation it was opened in."""

    __slots__ = ("seg", "generation", "sizes")

    def __init__(self, seg: Segment, generation: int, sizes: bool = False):
        self.seg, self.generation, self.sizes = seg, generation, sizes


class SegmentFiles(Kind):
    """``segments/<K>`` (routed here only when the log has segments: ``fs.segments``)."""

    def __init__(self, fs):
        super().__init__(fs)
        #: (segment index, sizes file or not) -> the name the kernel may hold
        self.names: dict[tuple[int, bool], bytes] = {}
        self.checked: dict[int, int] = {}  # segment index -> size whose deeds passed

    def seg_attrs(self, seg: Segment, sizes: bool = False) -> pyfuse3.EntryAttributes:
        """A segment's attributes, or its sizes file's; its name is noted as one the
        kernel may cache."""
        fs = self.fs
        name = I.event_name(seg.first)
        self.names[seg.index, sizes] = name + SIZES_SUFFIX if sizes else name
        return fs.entry_attrs(I.segment_inode(seg.index, fs.generations.slot_now(), sizes),
                              stat.S_IFREG | fs.modes.read,
                              seg.sizes_size if sizes else seg.size,
                              self.log.mtime_ns(seg.last),
                              FOREVER if seg.complete else GROWING, entry_timeout=FOREVER)

    async def confirmed(self, k: int) -> Segment | None:
        """Segment ``k`` (None if no deed starts in it), once the log's index is
        confirmed through its last event: its name, size, sizes and the numbers of its
        deeds come from the index, a hint until the chain of deeds proves it
        (``EventFiles.confirmed``: the walk runs in a worker thread; an index that lied
        is rebuilt, and the segment is taken from the new one)."""
        seg = self.fs.segments.get(k)
        if seg is not None and not self.log.chain_confirmed(seg.last):
            await self.fs.event_files.confirmed(seg.last)
            seg = self.fs.segments.get(k)
        return seg

    async def attrs(self, ino: int) -> pyfuse3.EntryAttributes:
        watch = self.fs.watch
        seg = await self.confirmed(I.inode_segment(ino))
        if seg is None or not seg.complete:  # it may have grown: look at the log
            watch.look()
            self.fs.generations.current(ino, f"segment {I.inode_segment(ino)}")
            seg = await self.confirmed(I.inode_segment(ino))
        if seg is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self.seg_attrs(seg, I.is_sizes(ino))

    async def lookup(self, name: bytes) -> pyfuse3.EntryAttributes:
        """``segments/<name>``: the segment whose first event is ``name``, or its sizes
        (``<name>.sizes``)."""
        sizes = name.endswith(SIZES_SUFFIX)
        event = I.parse_number(name[:-len(SIZES_SUFFIX)] if sizes else name)
        self.fs.watch.look()
        if event is not None:  # the name is an event number: by the proved index
            await self.fs.event_files.confirmed(event)
        seg = self.fs.segments.containing_first(event) if event is not None else None
        if seg is not None:
            seg = await self.confirmed(seg.index)
        if seg is None or seg.first != event:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self.seg_attrs(seg, sizes)

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
        seg = await self.confirmed(I.inode_segment(ino))
        if seg is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        generation = fs.generations.generation
        sizes = I.is_sizes(ino)
        if not sizes:
            await self.check(seg)
        return fs.file_info(fs.new_fh(SegmentHandle(seg, generation, sizes)),
                            keep_cache=seg.complete)

    async def read_inode(self, ino: int, off: int, size: int) -> bytes:
        segments, watch = self.fs.segments, self.fs.watch
        sizes = I.is_sizes(ino)
        what = f"segment {I.inode_segment(ino)}{' sizes' if sizes else ''}"
        self.fs.generations.current(ino, what)
        seg = await self.confirmed(I.inode_segment(ino))
        if seg is None:
            raise refuse(errno.ESTALE, f"{what}: no longer in the log")
        if not sizes:
            await self.check(seg)
        self.fs.generations.current(ino, what)
        return watch.read_then_recheck(ino, what, segments.sizes if sizes else segments.read,
                                       seg, off, size)

    def read_handle(self, h: SegmentHandle, off: int, size: int) -> bytes:
        """A read through a handle ``open`` made."""
        segments, watch = self.fs.segments, self.fs.watch
        if h.generation != self.fs.generations.generation:
            raise refuse(errno.ESTALE, f"segment {h.seg.index}: the log was recovered or "
                                       "replaced since this file was opened; reopen it")
        if not h.seg.complete and off + size > (h.seg.sizes_size if h.sizes else h.seg.size):
            # the last segment grows with the log: read up to its current end (the
            # new deeds' CRCs were checked by the save or by Book.refresh)
            seg = segments.get(h.seg.index)
            if seg is not None and seg.first == h.seg.first:
                h.seg = seg
        return watch.read_then_recheck(None, f"segment {h.seg.index}",
                                       segments.sizes if h.sizes else segments.read,
                                       h.seg, off, size)
