"""The rows of the event table and where they come from: the columns (:data:`SCHEMA`),
the decoding of event payloads into Arrow batches of those columns (run in the Python
workers, by :mod:`bookfs.spark.pipeline`'s ``mapInArrow`` and by the data source
:mod:`bookfs.spark.source`), the splitting of ``segments/`` files into CRC-checked deeds,
the ``committed_at`` step function of a run of events (:func:`_stamps`) and the planning of
a ``segments/`` read (:func:`plan_segments`).

The pipeline and the data source share all of it, so their rows cannot drift apart; this
module imports neither of them (nor pyspark: only pyarrow, in the workers).

Columns (:data:`SCHEMA`):

==============  =========  ======================================================
event           long       the event number (from the file name)
epoch           long       null: plain Book logs have no epoch directories
mug             int        payload bytes 0..4, little-endian (mugs are 31-bit)
size            long       payload bytes (mug + jam)
jam             binary     payload bytes 4..: a jam, or vere's ram encoding
                           (``RAM\\0``, version 1: :mod:`bookfs.noun.ram`) as stored
committed_at    timestamp  the event file's mtime (millisecond precision, as Hadoop
                           reports it): the event's date where it has one
                           (``date`` truncated to ms), else when the log grew to
                           hold it; bulk rows get the very same value
date            timestamp  the @da of a ``[date ovum]`` event, truncated to
                           microseconds; null for lifecycle events and anything that
                           does not decode
wire            string     the ovum's wire, e.g. ``/d/term/1`` (null likewise)
card            string     the card's tag, e.g. ``hear`` (null likewise)
error           string     null when the payload decodes (a 4-byte mug, then a jam
                           that cues completely and exactly, or a valid ram
                           encoding); else one line, ``byte N: why``, N being the
                           byte of the payload (mug included) where decoding failed
==============  =========  ======================================================

Decoding (:func:`decode_payload`) never raises: an event that is not a noun gets null
``date``/``wire``/``card`` and its ``error``, and the job goes on.  A ram event gives the
columns its jam twin gives (a bob atom, whose file is outside the mount, stays a
reference).  Jams up to :data:`_CUE_BYTES` are validated by the compiled scanner and cued
by the compiled core (``bookfs.noun``: :data:`bookfs.noun.CORE`); larger ones are
validated by the scanner and only their head is read (:func:`bookfs.noun.peek_event`), so
a multi-megabyte event is never built as a noun.
"""

from __future__ import annotations

import bisect
import os
from typing import Iterator

from bookfs.noun import DA_UNIX_EPOCH, cue, event_head, peek_event
from bookfs.noun.payload import MUG_BYTES, check_body
from bookfs.noun.ram import is_ram

SCHEMA = ("event long, epoch long, mug int, size long, jam binary, committed_at timestamp, "
          "date timestamp, wire string, card string, error string")
COLUMNS = ["event", "epoch", "mug", "size", "jam", "committed_at", "date", "wire", "card",
           "error"]


# --- decoding (runs in the Python workers) ------------------------------------------------

#: Jams up to this many bytes are cued whole (compiled: ~1 GB/s) and their head read from
#: the noun; larger ones only have their head read (:func:`bookfs.noun.peek_event`), so a
#: worker never builds a multi-megabyte noun (a 256 KiB jam is at most ~700k nodes).
_CUE_BYTES = 256 << 10
_NO_HEAD = (None, None, None)


def _da_micros(da: int) -> int:
    """An @da as microseconds since the Unix epoch (fraction truncated), as
    :func:`bookfs.noun.da_to_datetime` computes it."""
    return ((da >> 64) - DA_UNIX_EPOCH) * 1_000_000 + (((da & ((1 << 64) - 1)) * 1_000_000) >> 64)


#: Texts of knots and tags already decoded (wires and tags repeat from event to event).
_TEXTS: dict[int, str] = {}


def _head(noun) -> tuple[int | None, str | None, str | None]:
    """``(date, wire, tag)`` of a decoded event (:func:`bookfs.noun.event_head`, compiled
    when the core built)."""
    return event_head(noun, _TEXTS)


def decode_payload(payload) -> tuple[tuple[int | None, str | None, str | None], str | None]:
    """``((date, wire, tag), error)`` of an event payload (bytes-like), never raising.

    ``error`` is None when the payload is a 4-byte mug followed by a jam that cues
    completely and exactly or by a valid ram encoding: the check of ``verify --nouns``
    and ``show``, :mod:`bookfs.noun.payload`.  ``(date, wire, tag)`` is
    then read as :func:`bookfs.noun.peek_event` reads it (three Nones for a noun that is
    not a ``[date [wire [tag data]]]`` event, such as the lifecycle events); a jam of up
    to :data:`_CUE_BYTES` is cued whole by the compiled core instead, which is faster
    than the pure-Python peek.  Otherwise the head is three Nones and ``error`` one line,
    ``byte N: why``, N counting the mug's 4 bytes (the reason as
    :class:`~bookfs.noun.payload.Problem` gives it)."""
    n = len(payload)
    if n < MUG_BYTES:
        return _NO_HEAD, (f"byte {n}: the payload ends after {n} bytes, inside its "
                          f"{MUG_BYTES}-byte mug (no jam)")
    return _decode_body(bytes(payload[MUG_BYTES:]))


def _decode_body(body: bytes) -> tuple[tuple[int | None, str | None, str | None], str | None]:
    """:func:`decode_payload` of a payload whose bytes after the mug are ``body``."""
    try:
        # the check verify --nouns, show and pretty/ make: a jam that cues exactly (the
        # compiled scanner when it built), or a ram encoding (decoded whole); no bob
        # directory, as the mount serves no .urb/bob: a bob atom stays a reference
        problem = check_body(body)
        if problem is not None:
            where = f"byte {problem.offset}" if problem.offset is not None else "a bob file"
            return _NO_HEAD, f"{where}: {problem.why}"
        if len(body) <= _CUE_BYTES and not is_ram(body):
            return _head(cue(body)), None
        # a large jam, or ram: only the head is read
        return peek_event(body), None
    except Exception as e:  # never kill the job: say why instead
        return _NO_HEAD, (f"byte {MUG_BYTES}: cannot decode: {type(e).__name__}: "
                          f"{' '.join(str(e).split())}")


#: The columns read from the payload's bytes after the mug by decoding the noun: a
#: projection without them decodes nothing.
DECODED = ("date", "wire", "card", "error")


def _out_schema(columns=COLUMNS):
    """The Arrow schema of ``columns`` (names of :data:`SCHEMA`, in its order)."""
    import pyarrow as pa

    ts = pa.timestamp("us", tz="UTC")
    types = {"event": pa.int64(), "epoch": pa.int64(), "mug": pa.int32(), "size": pa.int64(),
             "jam": pa.binary(), "committed_at": ts, "date": ts, "wire": pa.string(),
             "card": pa.string(), "error": pa.string()}
    return pa.schema([(c, types[c]) for c in columns])


class _Rows:
    """Column lists for one output batch, of the columns ``want`` (a set of names of
    :data:`SCHEMA`; ``event`` always): a payload is decoded only when one of
    :data:`DECODED` is wanted, and its jam copied only when ``jam`` is.  ``stamps``: the
    ``committed_us`` given are when the log grew (the segments path), not the event
    files' mtimes, so an event's date replaces them, and ``committed_at`` needs the
    payload decoded; an event file's mtime already is its date (``bookfs/fs/dates.py``)."""

    def __init__(self, want=None, stamps: bool = False):
        self.columns = COLUMNS if want is None else [c for c in COLUMNS
                                                     if c in want or c == "event"]
        names = set(self.columns)
        self.stamps = stamps
        # from stamps, committed_at is the event's date where it has one: decoded too
        self.decode = (any(c in names for c in DECODED)
                       or (stamps and "committed_at" in names))
        self.want_mug, self.want_jam = "mug" in names, "jam" in names
        self.event, self.mug, self.size, self.jam = [], [], [], []
        self.committed, self.date, self.wire, self.card, self.error = [], [], [], [], []
        self.bytes = 0

    def add(self, event: int, payload, committed_us) -> None:
        n = len(payload)
        self.event.append(event)
        self.size.append(n)
        self.bytes += n
        if self.want_mug:
            self.mug.append(int.from_bytes(payload[:MUG_BYTES], "little", signed=True)
                            if n >= MUG_BYTES else None)
        if not (self.want_jam or self.decode):
            self.committed.append(committed_us)
            return
        jam = bytes(payload[MUG_BYTES:]) if n >= MUG_BYTES else bytes(payload)
        if self.want_jam:
            self.jam.append(jam)
        if not self.decode:
            self.committed.append(committed_us)
            return
        (da, wire, tag), error = _decode_body(jam) if n >= MUG_BYTES else decode_payload(jam)
        self.error.append(error)
        if da is None:
            self.committed.append(committed_us)
            self.date.append(None)
            self.wire.append(None)
            self.card.append(None)
        else:
            micros = _da_micros(da)
            # the event file's mtime is its date (bookfs/fs/dates.py), to the millisecond
            # as Hadoop reports it: the same value whichever way the row was read
            self.committed.append(micros - micros % 1000 if self.stamps else committed_us)
            self.date.append(micros)
            self.wire.append(wire)
            self.card.append(tag)

    def __len__(self):
        return len(self.event)

    def batch(self):
        import pyarrow as pa

        schema = _out_schema(self.columns)
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


_BATCH_BYTES = 64 << 20
_BATCH_ROWS = 2000


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


def _batches(items, want=None, stamps: bool = False) -> Iterator:
    """Arrow batches (:data:`SCHEMA`, or the columns in ``want`` and ``event``: see
    :class:`_Rows`) of ``(event, payload, committed_us)`` items, at most
    :data:`_BATCH_ROWS` rows or about :data:`_BATCH_BYTES` payload bytes each."""
    rows = _Rows(want, stamps)
    for event, payload, when in items:
        rows.add(event, payload, when)
        if len(rows) >= _BATCH_ROWS or rows.bytes >= _BATCH_BYTES:
            yield rows.batch()
            rows = _Rows(want, stamps)
    if len(rows):
        yield rows.batch()


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
    ``first``) as ``(event, payload)`` pairs, up to event ``until``, each deed's length and
    CRC checked (ValueError naming the segment, event and byte otherwise).  ``name``: the
    segment's name when ``seg`` is a part of it starting at a later event (byte positions
    in errors are then relative to that part)."""
    from bookfs.formats.layout import DEED_LEN, DEED_OVERHEAD, DEED_TAIL, crc32

    name = first if name is None else name
    pos, event, end = 0, first, len(seg)
    while pos < end and event <= until:
        if pos + DEED_OVERHEAD > end:
            raise ValueError(f"segments/{name:012d}: truncated deed for event "
                             f"{event} at byte {pos}")
        (n,) = DEED_LEN.unpack_from(seg, pos)
        stop = pos + 8 + n
        if stop + 12 > end:
            raise ValueError(f"segments/{name:012d}: event {event} at byte {pos} "
                             f"claims {n} bytes, past the segment's end")
        crc, let = DEED_TAIL.unpack_from(seg, stop)
        if let != n or crc32(seg[pos:stop]) != crc:
            raise ValueError(f"segments/{name:012d}: event {event} at byte {pos} "
                             "fails its CRC check")
        yield event, seg[pos + 8:stop]
        pos, event = stop + 12, event + 1


def _segment_batches(segments, since: int, until: int, starts: list[int],
                     stamps: list[int], want=None):
    """Arrow batches (:data:`SCHEMA`, or the columns in ``want``: :class:`_Rows`) of
    events ``since..until`` from ``segments``, an
    iterable of ``(first, bytes)`` pairs (or ``(first, bytes, name)`` for the part of
    segment ``name`` that starts at event ``first``); ``starts``/``stamps`` is the committed_at step
    function (event ``e`` has ``stamps[bisect_right(starts, e) - 1]`` microseconds)."""

    def items():
        for first, seg, *name in segments:
            for event, payload in _deeds(seg, first, until, *name):
                if event >= since:
                    yield event, payload, stamps[bisect.bisect_right(starts, event) - 1]

    return _batches(items(), want, stamps=True)


def _split_segments(since: int, until: int, starts: list[int], stamps: list[int]):
    """mapInArrow factory: (first, content) rows from segments/ → :data:`SCHEMA`, each
    deed's CRC checked (:func:`_segment_batches`)."""

    def split(batches):
        def segments():
            for b in batches:
                firsts = b.column("first").to_pylist()
                yield from zip(firsts, _binary_views(b.column("content")))

        return _segment_batches(segments(), since, until, starts, stamps)

    return split


# --- committed_at and segment planning (stat and listdir only, never a read) -------------


def _mtime_us(path: str) -> int:
    """A file's mtime as Spark's binaryFile reports it (Hadoop: whole milliseconds)."""
    return os.stat(path).st_mtime_ns // 1_000_000 * 1000


def _stamps(mnt: str, ranges: list[tuple[int, int]]) -> tuple[list[int], list[int]]:
    """The committed_at step function over ``ranges`` ((first, last) event pairs, in
    order): ``(starts, stamps)``, event ``e`` having ``stamps[bisect_right(starts, e)-1]``.

    Event mtimes never decrease along the log, so when the first and last event of a
    range share an mtime every event between has it; otherwise bisect with ``stat`` of
    events/<N> (a few stats per change of mtime, never a read)."""
    starts: list[int] = []
    stamps: list[int] = []

    def ev(n: int) -> int:
        return _mtime_us(os.path.join(mnt, "events", f"{n:012d}"))

    def put(event: int, stamp: int) -> None:
        if not stamps or stamps[-1] != stamp:
            starts.append(event)
            stamps.append(stamp)

    def fill(lo: int, hi: int, mlo: int, mhi: int) -> None:
        # events lo..hi; lo has mlo, hi has mhi
        while True:
            put(lo, mlo)
            if mlo == mhi:
                return
            if hi - lo <= 1:
                put(hi, mhi)
                return
            mid = (lo + hi) // 2
            mm = ev(mid)
            fill(lo, mid, mlo, mm)
            lo, mlo = mid, mm

    for first, last in ranges:
        fill(first, last, ev(first), ev(last))
    return starts, stamps


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
