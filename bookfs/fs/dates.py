"""An event file's mtime is the event's own date (issue 23.4), read from the index.

An Urbit event is ``[date ovum]``: Arvo's ``now`` when it ran, an @da.  That is when the
ship processed it, which is what a person running ``ls -l events/``, ``find -newermt`` or
``rsync -t`` over a mount wants to see, so an event file's mtime is that date (to the
nanosecond the @da carries, truncated).  An event without one (the rule of
:mod:`bookfs.noun.eventdate`: the boot's lifecycle events, a payload that is not a noun,
a date outside years 1..9999, a payload whose read fails its check) keeps the time the log
grew to hold it (:meth:`EventLog.mtime_ns`).

**Where a date comes from.**  A log with a date column (a Book: ``formats/datecolumn.py``,
kept and persisted with the offset index, filled by its writer and by the mount's date
pass, :func:`date_pass`) answers from it: a listing costs one ``pread`` per batch of
entries (``LISTED``, ``fs/nodes/dirs.py``), never a decode.  An event past the column's
end is decoded when its attributes are first asked for (one read of the payload or of
its head, a few µs for a typical event); at the column's end it is added to the column
(a listing extends it in order), so the next mount need not decode it.  A follower's
date pass saves the index by share, not at every catch-up (:func:`worth_saving`).  A
log without a column (LMDB, vere's layout, a pier) keeps the decoded dates in one array
indexed by event number, 8 bytes an event, dropped when the log is replaced under a
follower (``fs/watch.py``).

**Errors.**  A read that fails gives the log's time, never an error: ``stat`` must not
fail where ``read`` would say EIO with its own message.
"""

from __future__ import annotations

import logging
from array import array

from bookfs.formats.datecolumn import NO_DATE, event_date

__all__ = ["BATCH", "SAVE_SHARE", "EventDates", "date_pass", "worth_saving"]

BATCH = 4096  #: dates the date pass decodes in one hand-off to its worker thread
#: The date pass saves the index once the dates it added since its last save reach
#: ``1 / SAVE_SHARE`` of the log's events (:func:`worth_saving`).
SAVE_SHARE = 8
_UNKNOWN = -(1 << 63)  # not read yet (no real mtime is this)


class EventDates:
    """The mtime of each event of ``log`` (an :class:`~bookfs.formats.eventlog.EventLog`
    numbered from ``log.first``), from its date column or decoded once and kept (module
    docstring)."""

    def __init__(self, log) -> None:
        self.log = log
        self._base = 0
        self._ns = array("q")

    def drop(self) -> None:
        """Forget every decoded date: the log changed under the mount (a column belongs
        to its log's index, which a rebuild replaces)."""
        self._ns = array("q")

    def mtime_ns(self, event: int) -> int:
        """The mtime of ``event`` (one event: a lookup or a ``stat``)."""
        return self.mtimes(event, 1)[0]

    def mtimes(self, event: int, n: int) -> array:
        """The mtimes of ``event .. event + n - 1`` (a listing's batch)."""
        log = self.log
        column = getattr(log, "dates", None)
        if column is None:
            return array("q", (self._kept(e) for e in range(event, event + n)))
        first = log.first
        out = column.values(event - first, n)
        for k, ns in enumerate(out):
            if ns == NO_DATE:
                out[k] = log.mtime_ns(event + k)
        for e in range(event + len(out), event + n):  # past the column's end
            ns = event_date(log, e)
            column.add(e - first, (ns,))  # kept only at the column's end (a prefix)
            out.append(log.mtime_ns(e) if ns == NO_DATE else ns)
        return out

    def _kept(self, event: int) -> int:
        log = self.log
        first = log.first
        if first != self._base:
            self._base, self._ns = first, array("q")
        i = event - first
        ns = self._ns
        if 0 <= i < len(ns) and ns[i] != _UNKNOWN:
            return ns[i]
        value = event_date(log, event)
        value = log.mtime_ns(event) if value == NO_DATE else value
        if i >= 0:
            if i >= len(ns):
                ns.extend([_UNKNOWN] * (i + 1 - len(ns)))
            ns[i] = value
        return value


def worth_saving(added: int, count: int) -> bool:
    """Whether the date pass saves the index now, having added ``added`` dates since its
    last save to the column of a log of ``count`` events: once they reach ``1 /``
    :data:`SAVE_SHARE` of the events.  A save rewrites the whole index file (16 bytes an
    event: the offsets and the dates) and, beside a writer, reads the saved one first, so
    a follower of a growing log of N events saves about ``SAVE_SHARE`` times while the log
    doubles: O(1) bytes an added event, never O(N) a second (it saved at every catch-up:
    a follower of a 10-million-event log growing 20 events a second wrote 105 MB and read
    210 MB a second).  A date left unsaved costs one decode (a few µs) at the next mount;
    ``close`` saves what is left."""
    return added > 0 and added >= count // SAVE_SHARE


async def date_pass(log, *, idle: float = 1.0, rest: bool = False) -> None:
    """The mount's date pass: while ``log`` (a Book: ``fill_dates``, ``persist_dates``)
    has published events past its date column's end, decode them in a worker thread,
    :data:`BATCH` at a time (the mount's requests go on between batches), and persist the
    index once caught up, when :func:`worth_saving` says so; then look again every
    ``idle`` seconds.  Runs until cancelled (the unmount).  A log without a column has no
    pass.  A failure is logged and the pass ends: the dates are then decoded on demand.

    ``rest`` (a read-write mount's companion): decode only while the log rests, that is
    when it has not grown since the pass last looked, ``idle`` seconds before, nor during
    the last batch.  The companion's log is the one its own read-write daemon appends to,
    on the CPUs the writers share, and that daemon has each event's date already (its
    writer records them, ``Book._save``): decoding each event a second time as it was
    committed was most of what the companion cost the writers (8 writers append 5 % more
    a second without it: docs/benchmarks.md).  While
    the appends go on, a listing of the new events decodes their dates itself, and adds
    them to the column (:meth:`EventDates.mtimes`); once the appends pause for ``idle``
    seconds, the pass dates the rest."""
    import trio

    fill = getattr(log, "fill_dates", None)
    if fill is None:
        return
    pending = 0
    seen = log.count
    try:
        while True:
            if rest and log.count != seen:  # it grew: wait until it rests
                seen = log.count
                await trio.sleep(idle)
                continue
            added = await trio.to_thread.run_sync(fill, BATCH)
            pending += added
            if added and not (rest and log.count != seen):
                continue
            if worth_saving(pending, log.count):
                await trio.to_thread.run_sync(log.persist_dates)
                pending = 0
            await trio.sleep(idle)
    except Exception as e:  # trio.Cancelled is a BaseException: the unmount passes  # noqa: BLE001 - the pass is an optimisation: never the mount's end
        log_name = getattr(log, "log_path", log)
        logging.getLogger(__name__).warning("%s: the date pass stopped: %s", log_name, e)
