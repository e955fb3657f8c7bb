"""``spark.read.format("bookfs").load(MOUNTPOINT)``: a Spark 4 Python Data Source over
bookfs mounts, with the rows and schema of :func:`bookfs.spark.read_events`; and
``spark.readStream.format("bookfs").load(MOUNTPOINT)``, the same rows as a stream that
follows a live log.

Register it once per session with :func:`bookfs.spark.register`.  It reads **through the
mount**: from ``segments/`` (consecutive segment files packed into balanced partitions of
about ``maxPartitionBytes``, mapped or read and split into deeds in the Python worker,
every returned deed's CRC checked; a partition covering only part of its segment skips
the other deeds by their length words and takes only its own bytes:
:mod:`bookfs.spark.partitions`), or, when the mount has no
``segments/`` (a pier or LMDB mount), from ``events/`` files (partitions of
:data:`EVENTS_PER_PARTITION` events).  The decoding is that of
:func:`bookfs.spark.read_events` (:mod:`bookfs.spark.rows`:
:func:`~bookfs.spark.rows._segment_batches`, :func:`~bookfs.spark.rows._batches`), so the
two paths cannot drift apart: an event that does not decode has null ``date``/``wire``/
``card`` and an ``error`` here too, in a batch read and in a stream alike.  Every partition checks that it returned exactly the events
it was planned for (a stale view of the mount fails the task, never drops a row).

**Batch** options: ``since`` and ``until`` (inclusive event bounds), ``maxPartitionBytes``
(a read is cut into tasks of consecutive segments of about this many bytes at most, 512
MiB by default: :data:`MAX_PARTITION_BYTES`, :func:`~bookfs.spark.partitions.task_count`),
``eventsPerPartition`` (the ``events/`` fallback).  Comparisons of ``event`` with an
integer (``=``, ``<``,
``<=``, ``>``, ``>=``, ``between``, ``in``) are pushed down (``pushFilters``, which needs
``spark.sql.python.filterPushdown.enabled``; :func:`bookfs.spark.register` sets it) where
that is safe, :data:`PUSHDOWN_SAFE`: they narrow the planned event range, so segments
outside it are never opened.  ``in`` is also re-checked by Spark (the range covers more
than its values); the others are exact.  A pushed filter must never change what a later
query of the same DataFrame sees, and Spark 4.3 keeps the read planned by the last
pushdown (partitions and reader) on the DataFrame's data source and reuses it for every
later query that pushes nothing (``df.count()`` after ``df.where("event < 100").count()``
counted 99, issue 19).  So on a Spark whose readers have no ``pushLimit`` (the release that
scopes a pushdown's read to its own scan) nothing is pushed: Spark applies every filter,
every segment is read, and the ``since``/``until`` options are the way to read a part.

**Columns**: Spark 4.3's Python data source API prunes no column by itself (a ``select``
after ``load`` still has every column made), so a query names the columns it needs up
front: ``.schema("event long, size long")`` or ``.option("columns", "event,size")``.
Only those are made (:func:`bookfs.spark.columns.projection`, :func:`read_partition`): without ``date``,
``wire``, ``card`` or ``error`` no payload is decoded, without ``jam`` none is copied,
without ``committed_at`` no event is ``stat``-ed, and on the ``events/`` path a
projection of ``event``/``size``/``committed_at`` reads no payload byte.  On the
``segments/`` path ``event``, ``size`` and ``epoch`` alone (with ``ship``) read each
segment's ``.sizes`` file, 8 bytes an event, instead of its deeds (issue 34.5).  Those
projections give what ``ls -l events/`` shows, from the mount's index, so no CRC is
checked for them; every other read checks the CRC of every deed it reads.  A column that
is not the table's, or has another type, is refused in one line.  The rows are made by the compiled row builder
(``bookfs/spark/_rows.pyx``, :data:`bookfs.spark.ROWS`) and the compiled noun core
(:data:`bookfs.noun.CORE`) when they built, by their pure references otherwise: the same
rows either way.

**Many ships**: ``load("/srv/ships/*")`` (a glob) or ``load([MNT1, MNT2, ...])`` reads
every mount named, one mount per pier, into one table with one more column, ``ship``
(string, last): the ship's @p, from the mount's ``meta/who``.  The column is there
whenever the load names mounts by a glob or a list (even if the glob matches one mount),
so a table's schema does not change as piers come and go; ``load(MNT)`` keeps exactly
``read_events``' schema.  Each mount must be a bookfs mount with a ship in its meta, and no
ship may be named twice; a glob matching nothing is an error.  ``ship = '~x'`` and
``ship in (...)`` filters are pushed down too: other mounts are not read.  A **fleet
mount** (``bookfs mount --fleet``) is read the same way: ``load(MNT)`` is every ship under
it, named by the listing (no log is opened to plan); ``option("ships", "~zod,~nec")``
reads only those ships (on every Spark, pushdown or not), and a ship the fleet cannot
open is a one-line error unless ``option("skipDamaged", "true")``.  Small ships' planned
reads are packed into tasks of about ``maxPartitionBytes`` (``Packed``).

**Streaming**: offsets are event numbers, ``{"event": N}`` meaning "every event up to N
has been delivered"; a micro-batch from ``{"event": a}`` to ``{"event": b}`` holds events
``a+1..b``.  Only committed events are read: the newest offset comes from the mount's
event count (``events/``'s size, what a read-only mount has seen committed).  The batch
reader's planning and reading are reused as they are.  With a checkpoint and the file
sink, a query that is killed and restarted delivers every event exactly once (the offsets
are deterministic, so a batch that was planned but not committed is read again with the
same bounds).  ``maxEventsPerTrigger`` caps the events of one micro-batch;
``trigger(availableNow=True)`` reads what is committed when the query starts, in batches
of at most ``maxEventsPerTrigger``, and stops.  ``since`` and ``until`` bound the stream
too (a stream with ``until`` stops growing there).  A stream over several ships (a
fleet mount, a glob or a list) has one offset per ship, ``{"~zod": N, ...}``
(:class:`ShipsStreamReader`): ships added later join from their first event.
"""

from __future__ import annotations

import glob
import json
import os
import time

from pyspark.sql.datasource import (DataSource, DataSourceReader, DataSourceStreamReader,
                                    EqualTo, GreaterThan, GreaterThanOrEqual, In,
                                    LessThan, LessThanOrEqual)

from bookfs.formats.fleet import FLEET_MARKER
from bookfs.spark.columns import SHIP, option_columns, projection, spark_types
from bookfs.spark.partitions import (EVENTS_PER_PARTITION, MAX_PARTITION_BYTES, Mount,
                                     committed, pack_mounts, plan, read_partition)
from bookfs.spark.rows import SCHEMA

NAME = "bookfs"
#: Spark's setting that lets a Python data source take filters (off by default).
PUSHDOWN_KEY = "spark.sql.python.filterPushdown.enabled"
#: Whether a pushed filter may narrow the planned read: only where Spark keeps a pushdown's
#: planned read to its own scan.  Spark 4.3 shares it with every later query of the
#: DataFrame (module docstring); the Spark that scopes it also brought limit pushdown, so
#: a reader API with ``pushLimit`` is taken as the sign
#: (test_spark_source.test_pushdown_never_changes_a_later_query_of_the_same_dataframe
#: checks the outcome on the Spark installed, whichever it is).
PUSHDOWN_SAFE = hasattr(DataSourceReader, "pushLimit")
#: :data:`bookfs.spark.SCHEMA` with the :data:`SHIP` column (a load of several mounts).
SHIP_SCHEMA = f"{SCHEMA}, {SHIP} string"
#: How long a stream's planning waits for the mount to show events it already reported
#: committed (the kernel may hold ``events/``'s size for up to a second).
STALE_VIEW_WAIT = 5.0
_GLOB_CHARS = "*?["


def _int_option(options, key: str, what: str = "an event number") -> int | None:
    value = options.get(key)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"option {key} must be {what}, not {value!r}") from None


# --- mounts --------------------------------------------------------------------------------


def check_mount(path: str) -> str:
    """``path`` if it is a bookfs mount (it has ``events/``), else FileNotFoundError."""
    if not os.path.isdir(os.path.join(path, "events")):
        raise FileNotFoundError(f"{path} is not a bookfs mount (no events/ directory)")
    return path


def ship_of(path: str) -> str:
    """The @p of the ship whose log is mounted at ``path`` (its ``meta/who``)."""
    from bookfs.noun import patp

    try:
        with open(os.path.join(path, "meta", "who"), "rb") as f:
            who = f.read()
    except OSError as e:
        raise ValueError(f"{path}: no ship in its meta (meta/who: {e.strerror}); a "
                         "multi-ship read needs each log's meta.bin") from None
    return patp(int.from_bytes(who, "little"))


def named_paths(options) -> tuple[list[str], bool]:
    """The paths the load names and whether they make a multi-ship table: ``paths`` (a
    JSON list, as Spark passes ``load([...])``) or ``path`` (a mount, or a glob)."""
    raw = options.get("paths")
    if raw:
        try:
            paths = json.loads(raw)
        except ValueError:
            paths = None
        if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
            raise ValueError(f"option paths must be a JSON list of mount points, not {raw!r}")
        single = options.get("path")
        return ([single] if single else []) + paths, True
    path = options.get("path")
    if not path:
        raise ValueError('format("bookfs") needs a mount point: .load(MOUNTPOINT), '
                         '.load("/srv/ships/*") or .load([MOUNTPOINT, ...])')
    return [path], any(c in path for c in _GLOB_CHARS) or is_fleet(path)


def is_fleet(path: str) -> bool:
    """Whether ``path`` is a fleet mount (``bookfs mount --fleet``: it has the marker)."""
    return os.path.isfile(os.path.join(path, FLEET_MARKER))


def fleet_mounts(path: str, options) -> list[Mount]:
    """The ships of the fleet mounted at ``path``: ``MNT/<ship>`` each, its name the
    ``ship`` column (the @p, or the directory's name for a log whose meta says none),
    read from the listing alone, so no log is opened to plan which to read.  A ship
    shown as an error file (it cannot be opened) is a one-line error, or skipped with
    ``option("skipDamaged", "true")``; ``option("ships", "~zod,~nec")`` reads only those."""
    wanted = _ships_option(options)
    skip = str(options.get("skipDamaged", "false")).lower() == "true"
    mounts = []
    for name in sorted(os.listdir(path)):
        if wanted is not None and name not in wanted:
            continue
        where = os.path.join(path, name)
        if not os.path.isdir(where):
            if skip:
                continue
            with open(where) as f:
                said = f.read(4096).strip()
            raise ValueError(f"{where}: the fleet cannot read this ship ({said}); "
                             'option("skipDamaged", "true") reads the others')
        mounts.append(Mount(where, name))
    return mounts


def _ships_option(options) -> set[str] | None:
    raw = options.get("ships")
    if raw is None or not str(raw).strip():
        return None
    return {s.strip() for s in str(raw).split(",") if s.strip()}


def resolve_mounts(options) -> tuple[list[Mount], bool]:
    """The mounts a load names (globs expanded, sorted) and whether the table has a
    ``ship`` column.  One-line errors for a glob matching nothing, a path that is not a
    bookfs mount, a mount with no ship in its meta and a ship named twice."""
    paths, multi = named_paths(options)
    if len(paths) == 1 and is_fleet(paths[0]):
        return fleet_mounts(paths[0], options), True
    if not multi:
        return [Mount(check_mount(paths[0]))], False
    mounts: list[Mount] = []
    seen: dict[str, str] = {}
    for pattern in paths:
        found = ([pattern] if not any(c in pattern for c in _GLOB_CHARS)
                 else sorted(glob.glob(pattern)))
        if not found:
            raise FileNotFoundError(f"{pattern} matches no path; expected bookfs mount "
                                    "points")
        for path in found:
            ship = ship_of(check_mount(path))
            if ship in seen:
                raise ValueError(f"ship {ship} is mounted twice, at {seen[ship]} and {path}; "
                                 "expected one mount per ship")
            seen[ship] = path
            mounts.append(Mount(path, ship))
    wanted = _ships_option(options)
    if wanted is not None:
        mounts = [m for m in mounts if m.ship in wanted]
    return mounts, True


# --- batch ---------------------------------------------------------------------------------


class BookfsReader(DataSourceReader):
    """Plans partitions from the event range (options and pushed filters) and reads them
    through the mounts.  Picklable: it carries only the mounts and the bounds.  ``mnt``:
    one mount point (no ``ship`` column) or a list of :class:`Mount`."""

    def __init__(self, mnt: str | list[Mount], since: int | None, until: int | None,
                 per_partition: int, columns: list[str] | None = None,
                 max_bytes: int = MAX_PARTITION_BYTES):
        self.mounts = [Mount(mnt)] if isinstance(mnt, str) else list(mnt)
        self.since, self.until = since, until
        self.per_partition = per_partition
        self.columns = columns
        self.max_bytes = max_bytes

    def _narrow(self, lo: int | None = None, hi: int | None = None) -> None:
        if lo is not None:
            self.since = lo if self.since is None else max(self.since, lo)
        if hi is not None:
            self.until = hi if self.until is None else min(self.until, hi)

    def _only_ships(self, ships) -> None:
        self.mounts = [m for m in self.mounts if m.ship in ships]

    def pushFilters(self, filters):
        """Take comparisons of ``event`` with integers into the planned range, and
        ``ship = '~x'`` / ``ship in (...)`` into the mounts read; return the rest (and
        ``in``, whose values the range only bounds, and the ship filters) for Spark to
        apply.  Where a narrowed plan would outlive its query (not :data:`PUSHDOWN_SAFE`)
        every filter is returned and nothing changes."""
        if not PUSHDOWN_SAFE:
            yield from filters
            return
        for f in filters:
            value = getattr(f, "value", None)
            if f.attribute == (SHIP,) and self.mounts and self.mounts[0].ship is not None:
                if isinstance(f, EqualTo) and isinstance(value, str):
                    self._only_ships({value})
                elif isinstance(f, In) and all(isinstance(v, str) for v in value):
                    self._only_ships(set(value))
                yield f
            elif f.attribute != ("event",):
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
        parts = []
        for mount in self.mounts:
            parts += plan(mount, self.since, self.until, self.per_partition,
                          self.max_bytes, self.columns)[0]
        if len(self.mounts) > 1:  # many small ships: a task per max_bytes, not per ship
            parts = pack_mounts(parts, self.max_bytes, self.per_partition)
        return parts

    def read(self, partition):
        return read_partition(partition, self.columns)


# --- streaming -----------------------------------------------------------------------------


try:  # Spark 4.2+: admission control (maxEventsPerTrigger) and Trigger.AvailableNow
    from pyspark.sql.streaming.datasource import (ReadAllAvailable, ReadMaxRows,
                                                  SupportsTriggerAvailableNow)
except ImportError:  # pragma: no cover - older pyspark: plain latestOffset()
    ReadAllAvailable = ReadMaxRows = None
    SupportsTriggerAvailableNow = object


class BookfsStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches of the committed events of one mount (see the module docstring for
    offsets).  The driver-side state is the mount's first event (read once) and, under
    ``Trigger.AvailableNow``, the target event fixed when the query starts."""

    def __init__(self, mnt: str, since: int | None, until: int | None, per_partition: int,
                 max_events: int | None, columns: list[str] | None = None,
                 max_bytes: int = MAX_PARTITION_BYTES):
        self.mount = Mount(mnt)
        self.columns = columns
        self.max_bytes = max_bytes
        self.since, self.until = since, until
        self.per_partition = per_partition
        self.max_events = max_events
        self.first: int | None = None
        self.target: int | None = None

    def _last(self) -> int | None:
        """The mount's last committed event (None while it has none)."""
        view = committed(self.mount.path, self.first)
        if view is None:
            return None
        self.first = view[0]
        return view[1]

    def initialOffset(self) -> dict:
        """Before the first event to read: ``since - 1``, else the mount's first - 1 (0
        while the log is empty)."""
        if self.since is not None:
            return {"event": self.since - 1}
        self._last()
        return {"event": (self.first or 1) - 1}

    def getDefaultReadLimit(self):
        if self.max_events is None:
            return ReadAllAvailable()
        return ReadMaxRows(self.max_events)

    def prepareForTriggerAvailableNow(self) -> None:
        """Fix the target: the events committed now; later ones wait for the next run."""
        last = self._last()
        self.target = last if last is not None else 0

    def latestOffset(self, start: dict | None = None, limit=None) -> dict:
        """The newest committed event, capped by ``until``, the AvailableNow target and
        the read limit (``maxEventsPerTrigger`` events after ``start``); never before
        ``start``."""
        begin = start["event"] if start else None
        end = self._last()
        for cap in (self.until, self.target):
            if cap is not None and end is not None:
                end = min(end, cap)
        if begin is None:
            return {"event": end if end is not None else 0}
        if end is None:
            return {"event": begin}
        if ReadMaxRows is not None and isinstance(limit, ReadMaxRows):
            end = min(end, begin + limit.max_rows)
        return {"event": max(end, begin)}

    def reportLatestOffset(self):
        last = self._last()
        return None if last is None else {"event": last}

    def partitions(self, start: dict, end: dict):
        """The batch reader's partitions for events ``start+1..end``, all of which the
        mount has reported committed.  If the mount does not show them yet (a cached
        ``events/`` size), wait up to :data:`STALE_VIEW_WAIT` seconds, then fail: a
        batch never skips an event."""
        lo, hi = start["event"] + 1, end["event"]
        if lo > hi:
            return []
        deadline = time.monotonic() + STALE_VIEW_WAIT
        while True:
            parts, got = plan(self.mount, lo, hi, self.per_partition, self.max_bytes,
                              self.columns)
            if got >= hi:
                return parts
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{self.mount.path} shows events up to {got}, but {hi} was reported "
                    "committed: the log shrank or was replaced under the stream")
            time.sleep(0.1)

    def read(self, partition):
        return read_partition(partition, self.columns)

    def commit(self, end: dict) -> None:
        """Nothing to release: events are immutable once committed."""


class ShipsStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches of the committed events of many ships (a fleet mount, a glob or a
    list of mounts), with one offset per ship: ``{"~zod": N, ...}``, every event up to
    ``N`` of that ship delivered.  The ships are looked up again at every trigger, so a
    ship added to the fleet joins the stream (from its first event, or ``since``); a ship
    gone keeps its offset.  ``maxEventsPerTrigger`` bounds the events of one micro-batch
    over all ships (ships in name order).  As with one mount, offsets are deterministic
    and events immutable, so a batch planned but not committed is read again with the
    same bounds after a restart: exactly once with a checkpoint and the file sink."""

    def __init__(self, options: dict, since: int | None, until: int | None,
                 per_partition: int, max_events: int | None,
                 columns: list[str] | None = None, max_bytes: int = MAX_PARTITION_BYTES):
        self.options = options
        self.since, self.until = since, until
        self.per_partition, self.max_events = per_partition, max_events
        self.columns, self.max_bytes = columns, max_bytes
        self.first: dict[str, int] = {}
        self.target: dict[str, int] | None = None

    def _mounts(self) -> dict[str, Mount]:
        return {m.ship: m for m in resolve_mounts(self.options)[0]}

    def _begin(self) -> int:
        """The offset of a ship the stream has not seen yet."""
        return self.since - 1 if self.since is not None else 0

    def _lasts(self) -> dict[str, int]:
        """Each ship's last committed event (ships with none left out)."""
        out = {}
        for ship, m in self._mounts().items():
            view = committed(m.path, self.first.get(ship))
            if view is not None:
                self.first[ship] = view[0]
                out[ship] = view[1]
        return out

    def initialOffset(self) -> dict:
        return {ship: self._begin() for ship in self._mounts()}

    def getDefaultReadLimit(self):
        if self.max_events is None:
            return ReadAllAvailable()
        return ReadMaxRows(self.max_events)

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = self._lasts()

    def latestOffset(self, start: dict | None = None, limit=None) -> dict:
        out = dict(start or {})
        budget = None
        if ReadMaxRows is not None and isinstance(limit, ReadMaxRows):
            budget = limit.max_rows
        for ship, end in sorted(self._lasts().items()):
            begin = out.get(ship, self._begin())
            for cap in (self.until, None if self.target is None
                        else self.target.get(ship, begin)):
                if cap is not None:
                    end = min(end, cap)
            if budget is not None:
                end = min(end, begin + budget)
            end = max(end, begin)
            if budget is not None:
                budget -= end - begin
            out[ship] = end
        return out

    def reportLatestOffset(self):
        return self._lasts() or None

    def partitions(self, start: dict, end: dict):
        """The batch reader's partitions for each ship's events ``start+1..end``; waits
        for a stale view as :meth:`BookfsStreamReader.partitions` does."""
        mounts = None
        parts = []
        for ship in sorted(end):
            lo, hi = start.get(ship, self._begin()) + 1, end[ship]
            if lo > hi:
                continue
            if mounts is None:
                mounts = self._mounts()
            mount = mounts.get(ship)
            if mount is None:
                raise RuntimeError(f"ship {ship} has events {lo}..{hi} to read, but it "
                                   "is no longer mounted")
            deadline = time.monotonic() + STALE_VIEW_WAIT
            while True:
                got_parts, got = plan(mount, lo, hi, self.per_partition, self.max_bytes,
                                      self.columns)
                if got >= hi:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{mount.path} shows events up to {got}, but {hi} "
                                       "was reported committed")
                time.sleep(0.1)
            parts += got_parts
        return pack_mounts(parts, self.max_bytes, self.per_partition)

    def read(self, partition):
        return read_partition(partition, self.columns)

    def commit(self, end: dict) -> None:
        """Nothing to release: events are immutable once committed."""


# --- the data source -----------------------------------------------------------------------


class BookfsDataSource(DataSource):
    """``format("bookfs")``: the events of the bookfs mount(s) given to ``load()``."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self):
        multi = named_paths(self.options)[1]
        chosen = option_columns(self.options, multi)
        if chosen is None:
            return SHIP_SCHEMA if multi else SCHEMA
        types = spark_types()
        return ", ".join(f"{c} {types[c].simpleString()}" for c in chosen)

    def _bounds(self) -> tuple[int | None, int | None, int]:
        per = _int_option(self.options, "eventsPerPartition") or EVENTS_PER_PARTITION
        return _int_option(self.options, "since"), _int_option(self.options, "until"), per

    def _max_bytes(self) -> int:
        most = _int_option(self.options, "maxPartitionBytes", "a number of bytes")
        if most is not None and most < 1:
            raise ValueError(f"option maxPartitionBytes must be at least 1, not {most}")
        return most or MAX_PARTITION_BYTES

    def reader(self, schema):
        mounts, multi = resolve_mounts(self.options)
        since, until, per = self._bounds()
        return BookfsReader(mounts if multi else mounts[0].path, since, until, per,
                            projection(schema, multi), self._max_bytes())

    def streamReader(self, schema):
        paths, multi = named_paths(self.options)
        since, until, per = self._bounds()
        most = _int_option(self.options, "maxEventsPerTrigger")
        if most is not None and most < 1:
            raise ValueError(f"option maxEventsPerTrigger must be at least 1, not {most}")
        if multi:
            resolve_mounts(self.options)  # one-line errors now, not in the first batch
            return ShipsStreamReader(self.options, since, until, per, most,
                                     projection(schema, True), self._max_bytes())
        return BookfsStreamReader(check_mount(paths[0]), since, until, per, most,
                                  projection(schema, False), self._max_bytes())
