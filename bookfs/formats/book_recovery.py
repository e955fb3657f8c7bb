"""The recovery ladder (``recovery.py``) for the UIP layout: :class:`BookRecovery`.

``check`` reads a UIP ``book.log`` raw (never through the recovering open), ``repair``
cuts only a torn tail and creates a missing ``meta.bin``, ``salvage`` rescans damaged
regions for valid deeds and copies them into a new UIP log.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from bookfs.errors import BadMagic, BookError
from bookfs.formats import deedcheck, recovery, reports
from bookfs.formats.book import Book
from bookfs.formats.deeds import UIP
from bookfs.formats.fileio import open_regular
from bookfs.formats.index import OffsetIndex
from bookfs.formats.layout import (
    HEADER,
    HEADER_SIZE,
    MAGIC,
    META_NAME,
    META_SIZE,
    VERSION,
)
from bookfs.formats.salvage import DAMAGED, LeftOut, SalvageBatch


@dataclass
class UipFindings:
    """What :meth:`BookRecovery.check` found beyond the problem list."""

    #: (offset, bytes) of regions past framing breaks that may hold valid deeds
    damaged: list[tuple[int, int]] = field(default_factory=list)
    torn_tail: tuple[int, int] | None = None
    #: offsets of every framed deed, in log order (across damaged regions)
    offsets: list[int] = field(default_factory=list, repr=False)
    #: how many framed deeds precede the first framing break (their numbers are certain)
    numbered: int = 0
    meta_missing: bool = False


class BookRecovery(recovery.BookDirRecovery):
    """``check``/``repair``/``salvage`` for a UIP-layout Book directory.

    * ``check`` reads the log raw (never the recovering open): the header, ``meta.bin``,
      broken framing, every deed whose CRC fails, a torn tail, bytes past the last deed
      that are not a torn tail; optionally every mug.
    * ``repair`` cuts a torn tail (shown to hold no valid deed) and creates a missing
      ``meta.bin``; nothing else.  It holds ``book.lock`` unless the pier's lock is held.
    * ``salvage`` rescans damaged regions at every byte offset for valid deeds (length
      trailer and CRC agree) and writes every recoverable event, in log order, to a new
      UIP log, numbered from the original first event; the report lists the gaps, and
      the damaged bytes (deeds whose CRC fails, regions that do not frame, a torn tail)
      are kept aside in ``salvage-left-out.bin``, never as events.
    """

    kind = "uip"
    engine = Book

    def size(self) -> int:
        return 2 * os.path.getsize(self.log_path)  # the framing pass, then every CRC

    def check(self, *, mugs: bool = False, progress=None) -> reports.CheckReport:
        P = reports.Problem
        log_path = self.log_path
        rep = reports.CheckReport(log_path, "book-v1 (UIP layout)")
        st = rep.state = UipFindings()
        fd = open_regular(log_path, os.O_RDONLY, follow=True)
        try:
            size = os.fstat(fd).st_size
            if size < HEADER_SIZE:
                rep.problems.append(P("header", 0, f"{size} bytes, under the 16-byte header"))
                return rep
            magic, version, fir = HEADER.unpack(os.pread(fd, HEADER_SIZE, 0))
            if magic != MAGIC or version != VERSION:
                raise BadMagic(f"{log_path}: not a UIP Book log (magic {magic:#010x}, "
                               f"version {version})")
            st.meta_missing = recovery.check_meta_file(self.path, rep)
            index = OffsetIndex(first=fir)
            pos = HEADER_SIZE
            numbered = None
            while True:
                index.end = pos
                stop = UIP.scan(fd, index, size, progress=progress)
                if stop >= size:
                    break
                if numbered is None:
                    numbered = len(index.offsets)
                if deedcheck.is_torn_tail(fd, stop, size):
                    st.torn_tail = (stop, size - stop)
                    rep.problems.append(P("torn-tail", stop, f"{size - stop} bytes at offset "
                                          f"{stop} are an incomplete final deed"))
                    rep.repairs.append(f"cut the torn tail at offset {stop}")
                    break
                nxt = deedcheck.find_valid_deeds(fd, stop + 1, size, limit=1)
                end = nxt[0] if nxt else size
                st.damaged.append((stop, end - stop))
                rep.problems.append(P("framing", stop, f"{end - stop} bytes at offset {stop} "
                                      "do not frame a deed" +
                                      (f"; valid deeds resume at {end}" if nxt else "")))
                if not nxt:
                    break
                pos = end
            # every CRC, continuing past failures (framing holds, so positions are known)
            i = 0
            while True:
                bad = deedcheck.first_bad_deed(fd, index.offsets, i, index.end,
                                              progress=progress)
                if bad is None:
                    break
                off = index.offsets[bad]
                known = numbered is None or bad < numbered
                rep.problems.append(P(
                    "crc", off, f"deed at offset {off} fails its CRC check" +
                    ("" if known else " (its event number is unknown: it follows damage)"),
                    event=fir + bad if known else None))
                i = bad + 1
            st.offsets = list(index.offsets)
            st.numbered = len(st.offsets) if numbered is None else numbered
            rep.events = len(index.offsets)
            rep.first = fir if rep.events else 0
            rep.last = fir + rep.events - 1 if rep.events else 0
        finally:
            os.close(fd)
        return self._finish_check(rep, mugs, progress)

    def repair(self, report: reports.CheckReport) -> list[str]:
        """Cut a torn tail (the only cut that is always safe) and create a missing
        ``meta.bin``; returns what was done."""
        st: UipFindings = report.state
        done = []
        with self._repairing():
            if st.torn_tail is not None:
                fd = open_regular(self.log_path, os.O_RDWR)
                try:
                    off, n = st.torn_tail
                    if os.fstat(fd).st_size != off + n:
                        raise BookError(f"{self.path}: the log changed while being checked")
                    os.ftruncate(fd, off)
                    os.fsync(fd)
                finally:
                    os.close(fd)
                done.append(f"cut the torn tail of {n} bytes at offset {off} of "
                            f"{self.log_path}")
                st.torn_tail = None
            if st.meta_missing:
                made = recovery.create_meta_file(self.path)
                if made:
                    done.append(made)
        return done

    def salvage_into(self, report: reports.CheckReport, out: str, *, progress=None) -> dict:
        """Write every recoverable event of the checked log to a new UIP log in ``out``, in
        log order; each deed is re-checked here and only valid ones are copied.  The bytes
        of every deed that fails its CRC, of every region that does not frame and of a
        torn or garbage tail are copied to ``salvage-left-out.bin`` (``left_out`` in the
        report), never as events."""
        from bookfs.formats.layout import META_FIELDS

        st: UipFindings = report.state
        log_path = self.log_path
        first = report.first or 1
        gaps: list[dict] = []
        fd = open_regular(log_path, os.O_RDONLY, follow=True)
        try:
            size = os.fstat(fd).st_size
            with Book.open(out, writable=True, create=True) as dst, \
                    LeftOut(out) as left:
                meta_src = os.path.join(self.path, META_NAME)
                if os.path.exists(meta_src) and os.path.getsize(meta_src) == META_SIZE:
                    with open(meta_src, "rb") as f:
                        raw = f.read()
                    for key, (o, n) in META_FIELDS.items():
                        dst.save_meta(key, raw[o : o + n])
                batch = SalvageBatch(dst, first, epoch=first - 1, left_out=left, gaps=gaps)
                original_known = True
                prev_end = HEADER_SIZE
                for i, off in enumerate(st.offsets):
                    if off != prev_end:  # bytes lost to broken framing: count unknown
                        gaps.append({"offset": prev_end, "bytes": off - prev_end,
                                     "after_new_event": batch.next_event - 1,
                                     "events_lost": "unknown"})
                        left.copy(fd, prev_end, off - prev_end, kind=DAMAGED,
                                  why="bytes that do not frame a deed")
                        original_known = False
                    n = UIP.length_at(fd, off)
                    prev_end = off + UIP.size(n)
                    original = first + i if original_known else None
                    if not UIP.sound(fd, off, n):
                        gaps.append({"offset": off, "bytes": UIP.size(n),
                                     "after_new_event": batch.next_event - 1,
                                     "events_lost": 1, "original_event": original})
                        left.copy(fd, off, UIP.size(n), kind=DAMAGED,
                                  why="a deed whose CRC fails", deeds=1,
                                  original_event=original)
                        continue  # framing is intact: later original numbers stay known
                    batch.add(UIP.payload_at(fd, off, n), offset=off, original_event=original)
                    if progress is not None:
                        progress(UIP.size(n))
                batch.flush()
                if prev_end < size:
                    torn = st.torn_tail is not None and st.torn_tail[0] == prev_end
                    gaps.append({"offset": prev_end, "bytes": size - prev_end,
                                 "after_new_event": batch.next_event - 1,
                                 "events_lost": 0 if torn else "unknown"})
                    left.copy(fd, prev_end, size - prev_end, kind=DAMAGED,
                              why=("a torn tail: an incomplete final deed" if torn else
                                   "bytes after the last valid deed that do not frame one"))
                result = {
                    "source": log_path, "out": os.path.abspath(out), "layout": "uip",
                    "recovered": dst.count, "first": dst.first, "last": dst.last,
                    "gaps": gaps, "left_out": left.records,
                    "note": ("a Book log is contiguous, so recovered events are numbered in "
                             "log order from the original first event; after the first gap "
                             "their original numbers are higher than their new ones"),
                }
        finally:
            os.close(fd)
        return result
