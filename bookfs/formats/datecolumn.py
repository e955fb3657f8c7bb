"""Each event's date, kept beside the offset index: 8 bytes per event on disk, none in memory.

A *date column* holds, for the events of an :class:`~bookfs.formats.index.OffsetIndex` by
position (``index.first + i``), the event's date as Unix nanoseconds
(:func:`bookfs.noun.eventdate.payload_date_ns`, the rule of the Spark ``date`` column), or
:data:`NO_DATE` when the event has none (its file's mtime is then the log's time).  It
covers a *prefix* of the index: positions ``0 .. len - 1``; later events are not known
yet, and whoever needs one decodes it (``fs/dates.py``).

Who fills it.  The writer, as it appends (it has the payload in hand: ``Book.save``); the
mount's date pass (:func:`fill`) for what no writer recorded (a log written by vere, an
older bookfs, a salvage); nothing else.  A log's first listing therefore never decodes an
event once the pass has run, and the column is persisted with the index (``index.py``: in
the same file, under the same CRC, validated and rebuilt with it), so a fresh mount's
listing does not either.

Storage and memory.  The persisted column is read in place from the index file it was
loaded from (an open descriptor: a later save replaces the file by rename, never the
bytes under this descriptor); dates added since go to a private unlinked spill file in
batches of :data:`SPILL` (the newest, fewer than that, are in memory).  Reads are
``pread`` calls, so the dates live in the kernel's page cache, never in the daemon's heap:
a 10-million-event log keeps 80 MB of dates on disk and 64 KB in memory.

Thread safety: every call takes the column's lock (the mount's date pass runs in a worker
thread while the writer appends).  Errors: a failed spill write keeps the dates in memory
(logged); a failed read of a persisted date answers "not known" (the caller decodes).
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import threading
import weakref
from array import array
from collections.abc import Iterator

from bookfs.noun.eventdate import PREFIX, WHOLE, payload_date_ns

log = logging.getLogger(__name__)

__all__ = ["NO_DATE", "SPILL", "DateColumn", "event_date", "fill"]

NO_DATE = -(1 << 63) + 1  #: the event has no date (the log's time applies)
SPILL = 8192  #: dates kept in memory before they are written to the spill file
_CHUNK = 1 << 16  # dates per read when streaming the column out


class DateColumn:
    """The dates of a prefix of a log's events (module docstring).  ``base``: the
    persisted column, ``(fd, offset, count)`` in an index file this column now owns (it
    closes the descriptor)."""

    def __init__(self, base: tuple[int, int, int] | None = None) -> None:
        self._lock = threading.Lock()
        self._base_fd, self._base_off, self._base_n = base or (-1, 0, 0)
        self._spill = None  # a TemporaryFile, made at the first spill
        self._spilled = 0
        self._tail = array("q")
        self._broken = False  # a spill write failed: keep the rest in memory
        # closes the descriptor once: at close() or when the column is dropped unclosed
        self._release = weakref.finalize(self, _close_quietly, self._base_fd)

    def __len__(self) -> int:
        return self._base_n + self._spilled + len(self._tail)

    # --- adding --------------------------------------------------------------------------

    def add(self, position: int, dates) -> None:
        """Record ``dates`` (Unix ns or :data:`NO_DATE`) of the events at ``position``,
        ``position + 1``, ...  Dates already known are skipped; dates past a gap (the
        column does not reach ``position``) are dropped: the column stays a prefix."""
        with self._lock:
            have = len(self)
            if position > have:
                return
            skip = have - position
            if skip >= len(dates):
                return
            self._tail.extend(dates[skip:] if skip else dates)
            if len(self._tail) >= SPILL and not self._broken:
                self._spill_tail()

    def record(self, position: int, payloads) -> None:
        """The writer's dates of the payloads it saved as the events at ``position``, ...:
        it has them in hand.  Only where the column reaches (it stays a prefix), and up to
        the first payload streamed from a file (the date pass reads that one's head)."""
        if len(self) != position:
            return
        dates = array("q")
        try:
            for p in payloads:
                if not isinstance(p, (bytes, bytearray, memoryview)):
                    break
                ns = payload_date_ns(p)
                dates.append(NO_DATE if ns is None else ns)
        except Exception as e:  # noqa: BLE001 - a saved event's date never fails its save
            log.warning("dates not recorded past position %d: %s", position + len(dates), e)
        self.add(position, dates)

    def _spill_tail(self) -> None:
        try:
            if self._spill is None:
                self._spill = tempfile.TemporaryFile(prefix="bookfs-dates-")
            fd = self._spill.fileno()
            data = self._tail.tobytes()
            at = 8 * self._spilled
            while data:
                n = os.pwrite(fd, data, at)
                data, at = data[n:], at + n
        except OSError as e:
            log.warning("dates kept in memory: the spill file failed (%s)", e)
            self._broken = True
            return
        self._spilled += len(self._tail)
        self._tail = array("q")

    def truncate(self, count: int) -> None:
        """Keep the dates of the first ``count`` events only."""
        with self._lock:
            if count >= len(self):
                return
            if count <= self._base_n:
                self._base_n = count
                self._spilled = 0
                self._tail = array("q")
            elif count <= self._base_n + self._spilled:
                self._spilled = count - self._base_n
                self._tail = array("q")
            else:
                del self._tail[count - self._base_n - self._spilled:]

    # --- reading -------------------------------------------------------------------------

    def get(self, i: int) -> int | None:
        """The date of position ``i``, or None when it is not known."""
        got = self.values(i, 1)
        return got[0] if got else None

    def values(self, i: int, n: int) -> array:
        """The known dates of positions ``i .. i + n - 1``: as many as the column holds
        from ``i`` (fewer than ``n``, or none, past its end)."""
        with self._lock:
            out = array("q")
            if i < 0:
                return out
            n = max(0, min(n, len(self) - i))
            for fd, off, lo, hi in self._parts():
                if n == 0:
                    break
                if i >= hi:
                    continue
                if fd is None:  # the tail, in memory
                    take = min(n, hi - i)
                    out.extend(self._tail[i - lo : i - lo + take])
                else:
                    take = min(n, hi - i)
                    raw = _pread_all(fd, 8 * take, off + 8 * (i - lo))
                    if len(raw) != 8 * take:
                        return out  # a short read: the rest is not known
                    out.frombytes(raw)
                i += take
                n -= take
            return out

    def _parts(self):
        """``(fd or None, byte offset, first position, end position)`` of each store."""
        b, s = self._base_n, self._base_n + self._spilled
        if b:
            yield self._base_fd, self._base_off, 0, b
        if self._spilled:
            yield self._spill.fileno(), 0, b, s
        yield None, 0, s, s + len(self._tail)

    def chunks(self, count: int | None = None) -> Iterator[bytes]:
        """The first ``count`` dates (all by default) as little-endian bytes, in chunks:
        what ``index.save_index`` writes.  Bounded memory whatever the column's length."""
        count = len(self) if count is None else min(count, len(self))
        i = 0
        while i < count:
            got = self.values(i, min(_CHUNK, count - i))
            if not got:
                return
            yield got.tobytes()
            i += len(got)

    def close(self) -> None:
        """Release the index file and the spill file (idempotent)."""
        with self._lock:
            self._release()
            self._base_fd, self._base_n = -1, 0
            if self._spill is not None:
                self._spill.close()
                self._spill = None
            self._spilled = 0
            self._tail = array("q")


def _close_quietly(fd: int) -> None:
    if fd < 0:
        return
    with contextlib.suppress(OSError):
        os.close(fd)


def _pread_all(fd: int, n: int, off: int) -> bytes:
    try:
        data = os.pread(fd, n, off)
        while len(data) < n:
            more = os.pread(fd, n - len(data), off + len(data))
            if not more:
                break
            data += more
        return data
    except OSError:
        return b""


# --- the date pass ---------------------------------------------------------------------------


def event_date(log, event: int) -> int:
    """The date of ``event`` of ``log`` (an EventLog) as the column stores it: Unix ns, or
    :data:`NO_DATE`.  Reads the payload whole (its CRC checked) up to
    :data:`~bookfs.noun.eventdate.WHOLE` bytes, else only its first
    :data:`~bookfs.noun.eventdate.PREFIX` bytes.  A read that fails (a bad CRC, I/O) is
    :data:`NO_DATE` too: a date is never taken from bytes that fail their check."""
    try:
        size = log.payload_size(event)
        if size <= WHOLE:
            ns = payload_date_ns(log.read(event))
        else:
            ns = payload_date_ns(b"\0\0\0\0" + log.read_slice(event, 4, min(PREFIX, size - 4)))
    except Exception:  # noqa: BLE001 - any failure: no date, never an error (stat must not fail)
        return NO_DATE
    return NO_DATE if ns is None else ns


def fill(log, column: DateColumn, first: int, last: int, *, stop=None,
         batch: int = 1024) -> int:
    """Decode the dates of ``log``'s events from the column's end up to ``last`` and add
    them (``first``: the event at position 0).  ``stop()`` is asked between batches (True:
    return now).  Returns how many dates were added."""
    added = 0
    while True:
        start = first + len(column)
        if start > last or (stop is not None and stop()):
            return added
        end = min(last, start + batch - 1)
        dates = array("q", (event_date(log, e) for e in range(start, end + 1)))
        column.add(start - first, dates)
        added += len(dates)
