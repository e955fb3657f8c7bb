"""``spark.read.format("bookfs").load(MOUNTPOINT)``: a Spark 4 Python Data Source over a
bookfs mount, with the rows and schema of :func:`bookfs.spark.read_events`.

Register it once per session with :func:`bookfs.spark.register`.  It reads **through the
mount**: from ``segments/`` (one partition per segment file, split into deeds in the
Python worker, every returned deed's CRC checked; a partition covering only part of its
segment skips the other deeds by their length words and reads only its own bytes), or, when the mount has no
``segments/`` (a pier or LMDB mount), from ``events/`` files (partitions of
:data:`EVENTS_PER_PARTITION` events).  The decoding is :mod:`bookfs.spark`'s own
(:func:`bookfs.spark._segment_batches`, :func:`bookfs.spark._batches`), so the two paths
cannot drift apart.

Options: ``since`` and ``until`` (inclusive event bounds), ``eventsPerPartition`` (the
``events/`` fallback).  Comparisons of ``event`` with an integer (``=``, ``<``, ``<=``,
``>``, ``>=``, ``between``, ``in``) are pushed down (``pushFilters``, which needs
``spark.sql.python.filterPushdown.enabled``; :func:`bookfs.spark.register` sets it): they
narrow the planned event range, so segments outside it are never opened.  ``in`` is also
re-checked by Spark (the range covers more than its values); the others are exact.
Spark 4.3's Python data source API has no column pruning: every column is decoded.
"""

from __future__ import annotations

import os

from pyspark.sql.datasource import (DataSource, DataSourceReader, EqualTo, GreaterThan,
                                    GreaterThanOrEqual, In, InputPartition, LessThan,
                                    LessThanOrEqual)

from . import spark as bs

NAME = "bookfs"
#: Events per partition when reading ``events/`` (no ``segments/`` on the mount).
EVENTS_PER_PARTITION = 5000
#: Spark's setting that lets a Python data source take filters (off by default).
PUSHDOWN_KEY = "spark.sql.python.filterPushdown.enabled"


def _int_option(options, key: str) -> int | None:
    value = options.get(key)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"option {key} must be an event number, not {value!r}") from None


class SegmentRange(InputPartition):
    """Events ``lo..hi`` of the segment file holding events ``first..last``."""

    def __init__(self, first: int, last: int, lo: int, hi: int):
        super().__init__((first, lo, hi))
        self.first, self.last, self.lo, self.hi = first, last, lo, hi


def _skip_deeds(fd: int, pos: int, count: int, size: int, path: str) -> int:
    """The byte offset ``count`` deeds after offset ``pos`` of the open segment ``fd``
    (``size`` bytes), reading only each deed's length word."""
    from .layout import DEED_LEN, DEED_OVERHEAD

    for _ in range(count):
        head = os.pread(fd, DEED_LEN.size, pos)
        if len(head) < DEED_LEN.size:
            raise ValueError(f"{path}: truncated deed at byte {pos}")
        nxt = pos + DEED_LEN.unpack(head)[0] + DEED_OVERHEAD
        if nxt > size:
            raise ValueError(f"{path}: the deed at byte {pos} runs past the segment's end")
        pos = nxt
    return pos


class EventFiles(InputPartition):
    """The ``events/`` files of the events listed (ascending)."""

    def __init__(self, events: list[int]):
        super().__init__((events[0], events[-1]))
        self.events = events


class BookfsReader(DataSourceReader):
    """Plans partitions from the event range (options and pushed filters) and reads them
    through the mount.  Picklable: it carries only the mount path and the bounds."""

    def __init__(self, mnt: str, since: int | None, until: int | None, per_partition: int):
        self.mnt, self.since, self.until = mnt, since, until
        self.per_partition = per_partition

    def _narrow(self, lo: int | None = None, hi: int | None = None) -> None:
        if lo is not None:
            self.since = lo if self.since is None else max(self.since, lo)
        if hi is not None:
            self.until = hi if self.until is None else min(self.until, hi)

    def pushFilters(self, filters):
        """Take comparisons of ``event`` with integers into the planned range; return the
        rest (and ``in``, whose values the range only bounds) for Spark to apply."""
        for f in filters:
            value = getattr(f, "value", None)
            if f.attribute != ("event",):
                yield f
            elif isinstance(f, In):
                values = list(value)
                if values and all(type(v) is int for v in values):
                    self._narrow(min(values), max(values))
                yield f
            elif type(value) is not int:
                yield f
            elif isinstance(f, EqualTo):
                self._narrow(value, value)
            elif isinstance(f, GreaterThan):
                self._narrow(lo=value + 1)
            elif isinstance(f, GreaterThanOrEqual):
                self._narrow(lo=value)
            elif isinstance(f, LessThan):
                self._narrow(hi=value - 1)
            elif isinstance(f, LessThanOrEqual):
                self._narrow(hi=value)
            else:
                yield f

    def partitions(self):
        if self.since is not None and self.until is not None and self.since > self.until:
            return []
        if os.path.isdir(os.path.join(self.mnt, "segments")):
            _, _, plan = bs.plan_segments(self.mnt, self.since, self.until)
            return [SegmentRange(*t) for t in plan]
        events = sorted(n for n in (int(name) for name in os.listdir(
            os.path.join(self.mnt, "events")) if name.isdigit())
            if (self.since is None or n >= self.since)
            and (self.until is None or n <= self.until))
        k = self.per_partition
        return [EventFiles(events[i:i + k]) for i in range(0, len(events), k)]

    def read(self, partition):
        """Arrow batches of one planned partition.  With nothing planned Spark still runs
        one task, on a bare ``InputPartition``: it yields no rows."""
        if isinstance(partition, SegmentRange):
            return self._read_segment(partition)
        if isinstance(partition, EventFiles):
            return bs._batches(self._event_files(partition.events))
        return iter(())

    def _read_segment(self, p: SegmentRange):
        """Events ``p.lo..p.hi`` of one segment: only their bytes are read when the range
        is a part of the segment (the deeds before and after are skipped by their length
        words), the whole file in one read otherwise."""
        path = os.path.join(self.mnt, "segments", f"{p.first:012d}")
        fd = os.open(path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            start = _skip_deeds(fd, 0, p.lo - p.first, size, path)
            end = size
            if p.hi < p.last:
                end = _skip_deeds(fd, start, p.hi - p.lo + 1, size, path)
            buf = bytearray(end - start)
            view = memoryview(buf)
            got = 0
            while got < len(buf):
                n = os.preadv(fd, [view[got:]], start + got)
                if not n:
                    break
                got += n
        finally:
            os.close(fd)
        starts, stamps = bs._stamps(self.mnt, [(p.lo, p.hi)])
        yield from bs._segment_batches([(p.lo, view[:got], p.first)], p.lo, p.hi, starts,
                                       stamps)

    def _event_files(self, events: list[int]):
        for event in events:
            with open(os.path.join(self.mnt, "events", f"{event:012d}"), "rb") as f:
                st = os.fstat(f.fileno())
                yield event, f.read(), st.st_mtime_ns // 1_000_000 * 1000


class BookfsDataSource(DataSource):
    """``format("bookfs")``: the events of the bookfs mount given to ``load()``."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self):
        return bs.SCHEMA

    def reader(self, schema):
        mnt = self.options.get("path")
        if not mnt:
            raise ValueError('format("bookfs") needs a mount point: .load(MOUNTPOINT)')
        if not os.path.isdir(os.path.join(mnt, "events")):
            raise FileNotFoundError(f"{mnt} is not a bookfs mount (no events/ directory)")
        per = _int_option(self.options, "eventsPerPartition") or EVENTS_PER_PARTITION
        return BookfsReader(mnt, _int_option(self.options, "since"),
                            _int_option(self.options, "until"), per)
