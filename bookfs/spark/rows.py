"""The rows of the event table and where they come from: Arrow batches of the columns
(:data:`SCHEMA`, described with the decoding of one payload in
:mod:`bookfs.spark.decoding`) made in the Python workers, by
:mod:`bookfs.spark.pipeline`'s ``mapInArrow`` and by the data source
:mod:`bookfs.spark.source`; the splitting of ``segments/`` files into CRC-checked deeds;
``committed_at`` of the events without a date (:class:`EventMtime`) and the planning of a
``segments/`` read (:func:`plan_segments`).

The pipeline and the data source share all of it, so their rows cannot drift apart; this
module imports neither of them (nor pyspark: only pyarrow, in the workers).

**Two builders, one table.**  The per-event loop (walk a segment's deeds, check each
length and CRC, decode the payload, fill the columns) is compiled when
``bookfs/spark/_rows.pyx`` built (an optional extension, like the noun core): it writes
the columns straight into Arrow buffers, reads an event's date, wire and tag from the jam's
bits once the scanner has validated it, and hands every other payload (ram, a jam over
:data:`~bookfs.spark.decoding.CUE_BYTES`, one the scanner refuses, a payload shorter than
its mug) to :func:`~bookfs.spark.decoding.decode_body`.  The pure builder here
(:class:`_Rows`, :func:`_deeds`) is the reference and the fallback; ``tests/test_rows.py``
holds the two to the same batches and the same errors.  :data:`ROWS` says which is in
use (``"compiled"`` or ``"pure"``; ``BOOKFS_PURE_ROWS=1`` keeps the pure one),
:data:`ROWS_REASON` why not compiled, and :func:`rows_description` puts it in one line
for ``bookfs info`` (``rows:``).
"""

from __future__ import annotations

import os
from typing import Iterator

from bookfs.compiled import choose
from bookfs.noun.payload import MUG_BYTES
from bookfs.spark import decoding as _decoding
from bookfs.spark.decoding import (BATCH_BYTES, BATCH_ROWS, COLUMNS, DECODED, SCHEMA,
                                   da_micros, decode_payload, out_schema)

__all__ = ["COLUMNS", "DECODED", "ROWS", "ROWS_REASON", "SCHEMA", "EventMtime",
           "decode_payload", "plan_segments", "rows_description"]

# The compiled builder (bookfs/spark/_rows.pyx), chosen when it built and imports;
# BOOKFS_PURE_ROWS=1 in the environment keeps the pure one.
_choice = choose("bookfs.spark._rows", "BOOKFS_PURE_ROWS", "bookfs/spark/_rows.pyx")
ROWS = _choice.name
#: why the pure builder is in use (None when the compiled one is)
ROWS_REASON: str | None = _choice.reason
_impl = _choice.module


def rows_description() -> str:
    """Which row builder is in use, for ``info``: compiled, or pure and why."""
    return _choice.describe()


def info_fields() -> dict:
    """What ``bookfs info`` says of Spark (``cli/commands.py`` asks this module by name):
    which row builder the Spark workers use, as ``nouns:`` says which noun core (a key no
    longer than the others, so the columns of its text stay aligned)."""
    return {"rows": rows_description()}


# --- the pure builder (the reference; runs in the Python workers) --------------------------


class _Rows:
    """Column lists for one output batch, of the columns ``want`` (a set of names of
    :data:`SCHEMA`; ``event`` always): a payload is decoded only when one of
    :data:`DECODED` is wanted, and its jam copied only when ``jam`` is.

    ``stamp``: None when each row's ``committed_us`` is given (the event file's mtime,
    which already is its date: ``bookfs/fs/dates.py``); else the rows come from
    ``segments/``, ``committed_at`` is the event's date (to the millisecond) where it has
    one, so ``committed_at`` needs the payload decoded, and ``stamp(event)`` (microseconds,
    e.g. :class:`EventMtime`) for an event without one, called only then and only when
    ``committed_at`` is wanted."""

    def __init__(self, want=None, stamp=None):
        self.columns = COLUMNS if want is None else [c for c in COLUMNS
                                                     if c in want or c == "event"]
        names = set(self.columns)
        self.stamp = stamp
        self.want_committed = "committed_at" in names
        # from stamps, committed_at is the event's date where it has one: decoded too
        self.decode = (any(c in names for c in DECODED)
                       or (stamp is not None and self.want_committed))
        self.want_mug, self.want_jam = "mug" in names, "jam" in names
        self.event, self.mug, self.size, self.jam = [], [], [], []
        self.committed, self.date, self.wire, self.card, self.error = [], [], [], [], []
        self.bytes = 0

    def _undated(self, event: int, committed_us):
        if self.stamp is None:
            return committed_us
        return self.stamp(event) if self.want_committed else None

    def add(self, event: int, payload, committed_us=None) -> None:
        n = len(payload)
        self.event.append(event)
        self.size.append(n)
        self.bytes += n
        if self.want_mug:
            self.mug.append(int.from_bytes(payload[:MUG_BYTES], "little", signed=True)
                            if n >= MUG_BYTES else None)
        if not (self.want_jam or self.decode):
            self.committed.append(self._undated(event, committed_us))
            return
        jam = bytes(payload[MUG_BYTES:]) if n >= MUG_BYTES else bytes(payload)
        if self.want_jam:
            self.jam.append(jam)
        if not self.decode:
            self.committed.append(self._undated(event, committed_us))
            return
        # looked up in bookfs.spark.decoding at each call, as the compiled builder looks
        # them up when it is made (tests replace them there)
        (da, wire, tag), error = (_decoding.decode_body(jam) if n >= MUG_BYTES
                                  else _decoding.decode_payload(jam))
        self.error.append(error)
        if da is None:
            self.committed.append(self._undated(event, committed_us))
            self.date.append(None)
            self.wire.append(None)
            self.card.append(None)
        else:
            micros = da_micros(da)
            # the event file's mtime is its date (bookfs/fs/dates.py), to the millisecond
            # as Hadoop reports it: the same value whichever way the row was read
            self.committed.append(micros - micros % 1000 if self.stamp is not None
                                  else committed_us)
            self.date.append(micros)
            self.wire.append(wire)
            self.card.append(tag)

    def __len__(self):
        return len(self.event)

    def batch(self):
        import pyarrow as pa

        schema = out_schema(self.columns)
        n = len(self.event)
        make = {"event": lambda: pa.array(self.event, pa.int64()),
                "epoch": lambda: pa.nulls(n, pa.int64()),
                "mug": lambda: pa.array(self.mug, pa.int32()),
                "size": lambda: pa.array(self.size, pa.int64()),
                "jam": lambda: pa.array(self.jam, pa.binary()),
                "committed_at": lambda: pa.array(self.committed, pa.int64()).cast(
                    schema.field("committed_at").type),
                "date": lambda: pa.array(self.date, pa.int64()).cast(schema.field("date").type),
                "wire": lambda: pa.array(self.wire, pa.string()),
                "card": lambda: pa.array(self.card, pa.string()),
                "error": lambda: pa.array(self.error, pa.string())}
        return pa.RecordBatch.from_arrays([make[c]() for c in self.columns], schema=schema)


def _pure_batches(items, want=None, stamp=None, batch_rows: int = BATCH_ROWS,
                  batch_bytes: int = BATCH_BYTES) -> Iterator:
    """:func:`_batches` by the pure builder."""
    rows = _Rows(want, stamp)
    for event, payload, when in items:
        rows.add(event, payload, when)
        if len(rows) >= batch_rows or rows.bytes >= batch_bytes:
            yield rows.batch()
            rows = _Rows(want, stamp)
    if len(rows):
        yield rows.batch()


def _batches(items, want=None, stamp=None) -> Iterator:
    """Arrow batches (:data:`SCHEMA`, or the columns in ``want`` and ``event``: see
    :class:`_Rows`, whose ``stamp`` this is) of ``(event, payload, committed_us)`` items,
    at most :data:`~bookfs.spark.decoding.BATCH_ROWS` rows or about
    :data:`~bookfs.spark.decoding.BATCH_BYTES` payload bytes each; by the compiled
    builder when it built (:data:`ROWS`)."""
    if _impl is None:
        return _pure_batches(items, want, stamp)
    return _impl.batches(items, want, stamp)


def _binary_views(arr) -> Iterator[memoryview | None]:
    """Zero-copy views of the values of a pyarrow binary array."""
    import numpy as np

    arr = arr.combine_chunks() if hasattr(arr, "combine_chunks") else arr
    validity, offsets, data = arr.buffers()
    import pyarrow as pa

    width = 8 if pa.types.is_large_binary(arr.type) else 4
    offs = np.frombuffer(offsets, dtype=np.int64 if width == 8 else np.int32,
                         count=len(arr) + 1, offset=arr.offset * width)
    mv = memoryview(data) if data is not None else memoryview(b"")
    valid = arr.is_valid().to_pylist() if validity is not None else None
    for i in range(len(arr)):
        yield mv[offs[i]:offs[i + 1]] if valid is None or valid[i] else None


def _micros(col) -> list:
    """A pyarrow timestamp column as integer microseconds (None kept)."""
    import pyarrow as pa

    return col.cast(pa.timestamp("us", tz="UTC")).cast(pa.int64()).to_pylist()


def _decode_files(batches):
    """mapInArrow: (event, committed_at, content) rows from events/ → :data:`SCHEMA`."""

    def items():
        for b in batches:
            events = b.column("event").to_pylist()
            committed = _micros(b.column("committed_at"))
            yield from zip(events, _binary_views(b.column("content")), committed)

    return _batches(items())


def _deeds(seg, first: int, until: int, name: int | None = None
           ) -> Iterator[tuple[int, memoryview]]:
    """The deeds of the segment bytes ``seg`` (a memoryview; its first deed is event
    ``first``) as ``(event, payload)`` pairs, up to event ``until``, each one sound: the
    UIP layout's walk (:meth:`~bookfs.formats.deeds.Deeds.walk`), its
    :class:`~bookfs.formats.deeds.BadDeed` a ValueError naming the segment.  ``name``:
    the segment's name when ``seg`` is a part of it starting at a later event (byte
    positions in errors are then relative to that part)."""
    from bookfs.formats.deeds import UIP, BadDeed

    name = first if name is None else name
    try:
        for event, _, payload in UIP.walk(seg, first, until):
            yield event, payload
    except BadDeed as e:
        raise ValueError(f"segments/{name:012d}: {e}") from None


def _pure_segment_batches(segments, since: int, until: int, stamp, want=None,
                          batch_rows: int = BATCH_ROWS, batch_bytes: int = BATCH_BYTES):
    """:func:`_segment_batches` by the pure builder (``batch_rows``/``batch_bytes``: where
    a batch ends, :func:`_batches`)."""

    def items():
        for first, seg, *name in segments:
            for event, payload in _deeds(seg, first, until, *name):
                if event >= since:
                    yield event, payload, None

    return _pure_batches(items(), want, stamp, batch_rows, batch_bytes)


def _segment_batches(segments, since: int, until: int, stamp, want=None):
    """Arrow batches (:data:`SCHEMA`, or the columns in ``want``: :class:`_Rows`) of
    events ``since..until`` from ``segments``, an iterable of ``(first, bytes)`` pairs (or
    ``(first, bytes, name)`` for the part of segment ``name`` that starts at event
    ``first``), every deed up to ``until`` checked (:func:`_deeds`: a ValueError after the
    batches before the bad deed); ``stamp(event)``: ``committed_at`` of an event without
    a date (:class:`_Rows`).  By the compiled builder when it built (:data:`ROWS`)."""
    if _impl is None:
        return _pure_segment_batches(segments, since, until, stamp, want)
    return _impl.segment_batches(segments, since, until, stamp, want)


def _split_segments(since: int, until: int, stamp):
    """mapInArrow factory: (first, content) rows from segments/ → :data:`SCHEMA`, each
    deed's CRC checked (:func:`_segment_batches`)."""

    def split(batches):
        def segments():
            for b in batches:
                firsts = b.column("first").to_pylist()
                yield from zip(firsts, _binary_views(b.column("content")))

        return _segment_batches(segments(), since, until, stamp)

    return split


# --- committed_at and segment planning (stat and listdir only, never a read) -------------


def _mtime_us(path: str) -> int:
    """A file's mtime as Spark's binaryFile reports it (Hadoop: whole milliseconds)."""
    return os.stat(path).st_mtime_ns // 1_000_000 * 1000


class EventMtime:
    """``committed_at`` of an event of the mount at ``mnt`` read from ``segments/``, for
    the events that have no date (a row with one takes its date: :class:`_Rows`): its
    ``events/<N>`` file's mtime, one ``stat`` (never a read), the value the ``events/``
    path reads.  An event file's mtime is its date where it has one
    (``bookfs/fs/dates.py``), so mtimes follow the events' dates and no run of events can
    be assumed to share one: each undated event is looked up alone.  Picklable."""

    def __init__(self, mnt: str):
        self.mnt = mnt

    def __call__(self, event: int) -> int:
        return _mtime_us(os.path.join(self.mnt, "events", f"{event:012d}"))


def plan_segments(mnt: str, since: int | None, until: int | None
                  ) -> tuple[int, int, list[tuple[int, int, int]]]:
    """The segments of the mount at ``mnt`` that hold events ``since..until``:
    ``(lo, hi, [(first, last, range_lo, range_hi), ...])``, ``lo..hi`` being the events this
    read returns (``hi`` < ``lo`` if none) and each tuple a segment holding events
    ``first..last`` (named ``first``) with the part of ``lo..hi`` it holds.  The event count is read once, so ``hi`` is this read's
    snapshot: events appended later are not included."""
    seg_dir = os.path.join(mnt, "segments")
    firsts = sorted(int(n) for n in os.listdir(seg_dir) if n.isdigit())
    count = os.stat(os.path.join(mnt, "events")).st_size  # the mount reports its count
    lo = since if since is not None else (firsts[0] if firsts else 1)
    if not firsts or not count:
        hi = -1
    else:
        hi = firsts[0] + count - 1
        if until is not None:
            hi = min(hi, until)
    chosen = []
    for i, first in enumerate(firsts):
        last = firsts[i + 1] - 1 if i + 1 < len(firsts) else firsts[0] + count - 1
        if last < lo or first > hi:
            continue
        chosen.append((first, last, max(first, lo), min(last, hi)))
    return lo, hi, chosen
