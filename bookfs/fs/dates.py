"""An event file's mtime is the event's own date (issue 23.4).

An Urbit event is ``[date ovum]``: Arvo's ``now`` when it ran, an @da.  That is when the
ship processed it, which is what a person running ``ls -l events/``, ``find -newermt`` or
``rsync -t`` over a mount wants to see, so an event file's mtime is that date (to the
nanosecond the @da carries, truncated).  An event without one (the boot's lifecycle
events, a payload that is not a noun, one whose date is outside years 1..9999: the rule
of the Spark ``date`` column, :func:`bookfs.noun.peek_event`) keeps the time the log grew
to hold it (:meth:`EventLog.mtime_ns`), as before.

**Cost and memory.**  A date is read the first time an event's attributes are asked for
(a lookup, or the ``ls -l events/`` listing), then kept: 8 bytes per event, in one array
indexed by event number, whatever the event's size.  Reading it costs one read of the
payload, the payload check and a compiled ``cue`` for a payload up to :data:`WHOLE` bytes
(about 2 µs an event: the first ``ls -l`` of 100,000 sample events took 1.55 s against
1.37 s before), or the head of the noun from its first :data:`PREFIX` bytes for a larger
one, never the whole event (so a large event that is not a noun past its head still gets
its head's date there, where the Spark rows, which check it whole, say it has none).  The array is dropped when
the log is replaced under a follower (a new generation: ``fs/follow.py``).

**Errors.**  A read that fails (a bad CRC, I/O) gives the log's time, never an error:
``stat`` must not fail where ``read`` would say EIO with its own message.
"""

from __future__ import annotations

from array import array

from bookfs.noun import DA_UNIX_EPOCH, cue, event_head, peek_event
from bookfs.noun.payload import check_body
from bookfs.noun.ram import is_ram

__all__ = ["EventDates", "da_ns", "date_of"]

WHOLE = 64 << 10  #: payloads up to this many bytes are read and cued whole
PREFIX = 1 << 20  #: of larger ones, only this many bytes are read for the head
_MUG = 4
_UNKNOWN = -(1 << 63)  # not read yet (no real mtime is this)
_M64 = (1 << 64) - 1
_TEXTS: dict[int, str] = {}  # event_head's cache of decoded knots (they repeat)


def da_ns(da: int) -> int:
    """An @da as nanoseconds since the Unix epoch (the fraction truncated)."""
    return ((da >> 64) - DA_UNIX_EPOCH) * 1_000_000_000 + (((da & _M64) * 1_000_000_000) >> 64)


def date_of(body) -> int | None:
    """The @da of an event whose payload after the mug is ``body`` (all of it, or a prefix
    of a large one), or None when it has none (see the module docstring)."""
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


class EventDates:
    """The mtime of each event of ``log`` (an :class:`~bookfs.formats.eventlog.EventLog`
    numbered from ``log.first``), read once and kept (module docstring)."""

    def __init__(self, log) -> None:
        self.log = log
        self._base = 0
        self._ns = array("q")

    def drop(self) -> None:
        """Forget every date: the log changed under the mount."""
        self._ns = array("q")

    def mtime_ns(self, event: int) -> int:
        log = self.log
        first = log.first
        if first != self._base:
            self._base, self._ns = first, array("q")
        i = event - first
        ns = self._ns
        if 0 <= i < len(ns) and ns[i] != _UNKNOWN:
            return ns[i]
        value = self._read(event)
        if i >= 0:
            if i >= len(ns):
                ns.extend([_UNKNOWN] * (i + 1 - len(ns)))
            ns[i] = value
        return value

    def _read(self, event: int) -> int:
        log = self.log
        try:
            size = log.payload_size(event)
            if size <= WHOLE:
                body = memoryview(log.read(event))[_MUG:]
            else:
                body = log.read_slice(event, _MUG, min(PREFIX, size - _MUG))
            date = date_of(body)
        except Exception:  # a bad CRC, I/O: stat gives the log's time, read gives EIO
            date = None
        return da_ns(date) if date is not None else log.mtime_ns(event)
