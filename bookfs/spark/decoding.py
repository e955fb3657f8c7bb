"""The columns of the event table and what one event payload gives them: the pure
reference both row builders follow (:class:`bookfs.spark.rows._Rows` in Python, and the
compiled ``bookfs/spark/_rows.pyx``, which calls :func:`decode_body` itself for every
payload it does not decode in C).  Imports neither builder, nor pyspark.

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
reference).  Jams up to :data:`CUE_BYTES` are validated by the scanner and cued (both
compiled when ``bookfs.noun``'s core built: :data:`bookfs.noun.CORE`); larger ones are
validated by the scanner and only their head is read (:func:`bookfs.noun.peek_event`), so
a multi-megabyte event is never built as a noun.
"""

from __future__ import annotations

from bookfs.noun import DA_UNIX_EPOCH, cue, event_head, peek_event, scan, scan_ok
from bookfs.noun.payload import MUG_BYTES, check_body
from bookfs.noun.ram import is_ram

SCHEMA = ("event long, epoch long, mug int, size long, jam binary, committed_at timestamp, "
          "date timestamp, wire string, card string, error string")
COLUMNS = ["event", "epoch", "mug", "size", "jam", "committed_at", "date", "wire", "card",
           "error"]
#: The columns read from the payload's bytes after the mug by decoding the noun: a
#: projection without them decodes nothing.
DECODED = ("date", "wire", "card", "error")

#: Jams up to this many bytes are cued whole (compiled: ~1 GB/s) and their head read from
#: the noun; larger ones only have their head read (:func:`bookfs.noun.peek_event`), so a
#: worker never builds a multi-megabyte noun (a 256 KiB jam is at most ~700k nodes).
CUE_BYTES = 256 << 10
#: A batch of rows ends at this many rows, or once its payloads reach this many bytes.
BATCH_ROWS = 2000
BATCH_BYTES = 64 << 20

NO_HEAD = (None, None, None)
#: Texts of knots and tags already decoded (wires and tags repeat from event to event).
_TEXTS: dict[int, str] = {}

__all__ = ["BATCH_BYTES", "BATCH_ROWS", "COLUMNS", "CUE_BYTES", "DECODED", "NO_HEAD",
           "SCHEMA", "da_micros", "decode_body", "decode_payload", "out_schema", "scan",
           "scan_ok"]


def da_micros(da: int) -> int:
    """An @da as microseconds since the Unix epoch (fraction truncated), as
    :func:`bookfs.noun.da_to_datetime` computes it."""
    return ((da >> 64) - DA_UNIX_EPOCH) * 1_000_000 + (((da & ((1 << 64) - 1)) * 1_000_000) >> 64)


def decode_payload(payload) -> tuple[tuple[int | None, str | None, str | None], str | None]:
    """``((date, wire, tag), error)`` of an event payload (bytes-like), never raising.

    ``error`` is None when the payload is a 4-byte mug followed by a jam that cues
    completely and exactly or by a valid ram encoding: the check of ``verify --nouns``
    and ``show``, :mod:`bookfs.noun.payload`.  ``(date, wire, tag)`` is
    then read as :func:`bookfs.noun.peek_event` reads it (three Nones for a noun that is
    not a ``[date [wire [tag data]]]`` event, such as the lifecycle events); a jam of up
    to :data:`CUE_BYTES` is cued whole by the compiled core instead, which is faster
    than the pure-Python peek, and its head read by :func:`bookfs.noun.event_head`.
    Otherwise the head is three Nones and ``error`` one line, ``byte N: why``, N counting
    the mug's 4 bytes (the reason as :class:`~bookfs.noun.payload.Problem` gives it)."""
    n = len(payload)
    if n < MUG_BYTES:
        return NO_HEAD, (f"byte {n}: the payload ends after {n} bytes, inside its "
                         f"{MUG_BYTES}-byte mug (no jam)")
    return decode_body(bytes(payload[MUG_BYTES:]))


def decode_body(body: bytes) -> tuple[tuple[int | None, str | None, str | None], str | None]:
    """:func:`decode_payload` of a payload whose bytes after the mug are ``body``."""
    try:
        # the check verify --nouns, show and pretty/ make: a jam that cues exactly (the
        # compiled scanner when it built), or a ram encoding (decoded whole); no bob
        # directory, as the mount serves no .urb/bob: a bob atom stays a reference
        problem = check_body(body)
        if problem is not None:
            where = f"byte {problem.offset}" if problem.offset is not None else "a bob file"
            return NO_HEAD, f"{where}: {problem.why}"
        if len(body) <= CUE_BYTES and not is_ram(body):
            return event_head(cue(body), _TEXTS), None
        # a large jam, or ram: only the head is read
        return peek_event(body), None
    except Exception as e:  # never kill the job: say why instead
        return NO_HEAD, (f"byte {MUG_BYTES}: cannot decode: {type(e).__name__}: "
                         f"{' '.join(str(e).split())}")


def out_schema(columns=COLUMNS):
    """The Arrow schema of ``columns`` (names of :data:`SCHEMA`, in its order)."""
    import pyarrow as pa

    ts = pa.timestamp("us", tz="UTC")
    types = {"event": pa.int64(), "epoch": pa.int64(), "mug": pa.int32(), "size": pa.int64(),
             "jam": pa.binary(), "committed_at": ts, "date": ts, "wire": pa.string(),
             "card": pa.string(), "error": pa.string()}
    return pa.schema([(c, types[c]) for c in columns])
