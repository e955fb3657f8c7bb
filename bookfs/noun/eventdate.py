"""An event's date: Arvo's ``now`` when it ran, the head of ``[date ovum]``.

The one rule every reader of dates shares (the mount's mtimes, ``fs/dates.py``; the dates
kept with the persisted index, ``formats/datecolumn.py``; the writer that records them as
it appends).  It is the rule of the Spark ``date`` column (:func:`bookfs.noun.peek_event`):
a payload that is not a noun, a lifecycle event of the boot, or one whose date falls
outside years 1..9999 has no date.

A payload up to :data:`WHOLE` bytes is checked whole (the validating scanner) and its head
read from the cued noun (compiled: about 2 µs for a typical event); of a larger one only
the first :data:`PREFIX` bytes are read and its head decoded from them, never the whole
event (so a large event that is not a noun past its head still has its head's date here,
where the Spark rows, which check it whole, say it has none).
"""

from __future__ import annotations

from bookfs.noun import DA_UNIX_EPOCH, cue, event_head, peek_event  # compiled where built
from bookfs.noun.payload import check_body
from bookfs.noun.ram import is_ram

__all__ = ["MUG", "PREFIX", "WHOLE", "da_ns", "date_of", "payload_date_ns"]

WHOLE = 64 << 10  #: payloads up to this many bytes are read and cued whole
PREFIX = 1 << 20  #: of larger ones, only this many bytes are read for the head
MUG = 4  #: the payload's leading mug, not part of the noun
_M64 = (1 << 64) - 1
_TEXTS: dict[int, str] = {}  # event_head's cache of decoded knots (they repeat)


def da_ns(da: int) -> int:
    """An @da as nanoseconds since the Unix epoch (the fraction truncated)."""
    return ((da >> 64) - DA_UNIX_EPOCH) * 1_000_000_000 + (((da & _M64) * 1_000_000_000) >> 64)


def date_of(body) -> int | None:
    """The @da of an event whose payload after the mug is ``body`` (all of it, or a prefix
    of a large one), or None when it has none (module docstring)."""
    try:
        if len(body) > WHOLE:  # a prefix: its head only, the rest unchecked
            return peek_event(body)[0]
        if check_body(body) is not None:  # not a noun: no date (as the Spark rows say)
            return None
        if is_ram(body):
            return peek_event(body)[0]
        return event_head(cue(body), _TEXTS)[0]
    except Exception:  # a prefix that ends inside the head: no date
        return None


def payload_date_ns(payload) -> int | None:
    """:func:`date_of` of a whole payload (mug included) as Unix nanoseconds, or None."""
    body = memoryview(payload)[MUG:]
    if len(body) > WHOLE:
        body = body[:PREFIX]
    date = date_of(body)
    if date is None:
        return None
    ns = da_ns(date)
    # an mtime is a signed 64-bit count of ns: years 1678..2262; a date outside has none
    return ns if -(1 << 63) + 2 <= ns < (1 << 63) else None
